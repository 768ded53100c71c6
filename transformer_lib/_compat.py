"""The private PyTorch APIs the library calls, each in one place behind a function of its own.

PyTorch may change a private API in any release without notice, so none is called anywhere else,
and ``tests/test_compat.py`` tests each one here, also against the oldest PyTorch the package
accepts (``make test-floor``, which CI runs).
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Device types with a kernel for ``torch._assert_async``.
_ASSERT_ASYNC_DEVICES = ("cpu", "cuda")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware: AVX512-BF16 or AMX tiles.

    ``torch.cpu._is_avx512_bf16_supported`` and ``_is_amx_tile_supported``; False on a PyTorch without them.
    """
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in _CPU_BF16_PROBES)


_CPU_BF16_PROBES = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")


def assert_async(condition: Tensor, message: str) -> None:
    """Fail with ``message`` unless the one-element ``condition`` is true, without the host reading it.

    ``torch._assert_async``: on a GPU the check is queued with the device's work (no wait; a false
    condition ends the process with a device-side assert), on the CPU it checks at once and raises a
    ``RuntimeError``. On devices without that kernel (e.g. MPS) it checks nothing.
    """
    if condition.device.type in _ASSERT_ASYNC_DEVICES:
        torch._assert_async(condition, message)

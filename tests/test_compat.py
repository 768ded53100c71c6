"""transformer_lib._compat: the private PyTorch APIs the library calls, each tested on this PyTorch.

``make test-floor`` runs these against the oldest PyTorch the package accepts, so that a private API
that moved between it and the newest is caught here rather than in a reader's kernel.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from transformer_lib import _compat

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "transformer_lib"


def test_the_cpu_bf16_probes_exist_and_agree_with_the_kernel():
    for name in _compat._CPU_BF16_PROBES:
        assert callable(getattr(torch.cpu, name, None)), f"torch.cpu.{name} is gone: cpu_has_native_bf16 says False"
    native = _compat.cpu_has_native_bf16()
    assert isinstance(native, bool)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():  # Linux: the kernel's list of the processor's features
        flags = set(cpuinfo.read_text().split())
        assert native == bool({"avx512_bf16", "amx_tile"} & flags), sorted({"avx512_bf16", "amx_tile"} & flags)


def test_assert_async_passes_a_true_condition_and_on_the_cpu_raises_at_once_on_a_false_one():
    _compat.assert_async(torch.tensor(True), "never")
    _compat.assert_async(torch.tensor([True]), "never")
    with pytest.raises(RuntimeError, match="token id outside"):
        _compat.assert_async(torch.tensor(False), "a token id outside [0, 5)")


def test_assert_async_checks_nothing_on_a_device_without_its_kernel():
    _compat.assert_async(torch.tensor(False, device="meta"), "a meta tensor has no value to check")


# Names of PyTorch's private APIs: the only module allowed to use them is _compat.
PRIVATE = ("_assert_async", "_is_avx512_bf16_supported", "_is_amx_tile_supported", "_python_dispatch")


@pytest.mark.parametrize(
    "path", sorted(p for p in PACKAGE_DIR.rglob("*.py") if p.name != "_compat.py"), ids=lambda p: p.stem
)
def test_no_module_but_compat_names_these_private_apis(path: Path):
    nodes = list(ast.walk(ast.parse(path.read_text())))
    names = {n.attr for n in nodes if isinstance(n, ast.Attribute)}
    names |= {n.module or "" for n in nodes if isinstance(n, ast.ImportFrom)}
    names |= {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}  # getattr(x, "_...")
    used = sorted(p for p in PRIVATE if any(n == p or n.endswith("." + p) for n in names))
    assert not used, f"{path.name} calls PyTorch's private {used}: go through transformer_lib._compat"

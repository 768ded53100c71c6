"""What runs in reduced precision and what stays in fp32 (chapters 7 and 8).

Under autocast the projections and the feed-forward multiply in bf16 (fp16 on GPUs without it); the
weights, norms, residual stream, the CPU's attention core, the output head and the loss stay in fp32.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._compat import cpu_has_native_bf16

PRECISION_ENV = "TRANSFORMER_LIB_PRECISION"
PRECISIONS = {"auto": None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def precision_override() -> str:
    """The value of ``TRANSFORMER_LIB_PRECISION`` (``auto`` when unset), read at every call; ValueError for
    anything but auto, fp32, bf16 or fp16 (case and spaces ignored)."""
    value = os.environ.get(PRECISION_ENV, "auto").strip().lower() or "auto"
    if value not in PRECISIONS:
        raise ValueError(f"{PRECISION_ENV} must be one of {', '.join(PRECISIONS)}, got {os.environ[PRECISION_ENV]!r}")
    return value


# oneDNN multiplies bf16 on a CPU with bf16 instructions only from AVX512_CORE_BF16 up; capped below, it emulates.
_ONEDNN_ISAS_WITHOUT_BF16 = frozenset(
    {"sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2", "avx512_core", "avx512_core_vnni"}
)


def _onednn_capped_below_bf16() -> bool:
    """Whether ``ONEDNN_MAX_CPU_ISA`` (or ``DNNL_MAX_CPU_ISA``), read by oneDNN at its first product, keeps it
    from bf16 instructions."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    return isa.strip().lower() in _ONEDNN_ISAS_WITHOUT_BF16


def native_dtype(device: torch.device) -> torch.dtype | None:
    """The reduced precision that ``device`` multiplies natively, or None: what ``auto`` picks.

    CUDA: bf16 where the GPU has it, else fp16. CPU: bf16 only with AVX512-BF16 or AMX and oneDNN not
    capped below them. Other devices: None. It ignores ``TRANSFORMER_LIB_PRECISION``.
    """
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu":
        return torch.bfloat16 if cpu_has_native_bf16() and not _onednn_capped_below_bf16() else None
    return None


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The reduced precision the library trains in on ``device``, or None to stay in fp32.

    ``auto`` (the default): :func:`native_dtype`. ``TRANSFORMER_LIB_PRECISION`` overrides it for the whole
    process: ``fp32`` (None), ``bf16`` or ``fp16`` (that dtype on any device, even emulated).

    Defined in chapter 7, Decoder-only.
    """
    override = precision_override()
    if override == "auto":
        return native_dtype(device)
    dtype = PRECISIONS[override]
    return None if dtype == torch.float32 else dtype


def output_in_fp32(head: nn.Module, h: Tensor) -> Tensor:
    """``head(h)``, in fp32 even under autocast: every operand, the product and the logits.

    A head converted to bf16 (``model.to(torch.bfloat16)``) is multiplied with its weights cast to fp32.

    Shapes: h (..., d_model) -> logits (..., vocab_size).
    """
    if not torch.is_autocast_enabled(h.device.type):
        return head(h)
    with torch.autocast(h.device.type, enabled=False):
        weight = getattr(head, "weight", None)
        if isinstance(weight, Tensor) and weight.dtype != torch.float32:
            bias = getattr(head, "bias", None)
            return F.linear(h.float(), weight.float(), None if bias is None else bias.float())
        return head(h.float())


def fused_attention(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
    """``F.scaled_dot_product_attention``, in fp32 when bf16 inputs are on the CPU (where its bf16 kernels
    are slower than fp32), cast back to bf16.

    Shapes: q (B, n_heads, T_q, d_head), k/v (B, n_heads, T_k, d_head) -> (B, n_heads, T_q, d_head).
    """
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)

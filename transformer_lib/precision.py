"""What runs in reduced precision and what stays in fp32 (chapters 7 and 8).

Under autocast the matrix multiplies of the projections and the feed-forward run in bf16
(or fp16 on GPUs without bf16) with fp32 accumulation; the weights, the norms, the residual
stream, the attention core on the CPU, the output logits and the loss stay in fp32. On a CUDA
GPU under bf16 autocast the output head's product, too, takes bf16 operands, and writes its
fp32 accumulator out as the logits (:func:`output_in_fp32`).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _nn_module

PRECISION_ENV = "TRANSFORMER_LIB_PRECISION"
PRECISIONS = {"auto": None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def precision_override() -> str:
    """The value of ``TRANSFORMER_LIB_PRECISION`` (``auto`` when unset), checked.

    Read at every call, so a kernel started with the variable set runs the whole book that way.
    Raises ValueError for anything but auto, fp32, bf16 or fp16 (case and spaces ignored).
    """
    value = os.environ.get(PRECISION_ENV, "auto").strip().lower() or "auto"
    if value not in PRECISIONS:
        raise ValueError(f"{PRECISION_ENV} must be one of {', '.join(PRECISIONS)}, got {os.environ[PRECISION_ENV]!r}")
    return value


# oneDNN, which multiplies bf16 matrices on a CPU, uses bf16 instructions only from AVX512_CORE_BF16 up:
# capped below that (its variable, checked here on a Zen 4 EPYC) it emulates them, at 2-70 GFLOP/s against ~350
_ONEDNN_ISAS_WITHOUT_BF16 = frozenset(
    {"sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2", "avx512_core", "avx512_core_vnni"}
)


def onednn_capped_below_bf16() -> bool:
    """Whether ``ONEDNN_MAX_CPU_ISA`` (or its older name ``DNNL_MAX_CPU_ISA``) keeps oneDNN from bf16 instructions.

    Used to run a bf16 CPU as an AVX2-only one would (with ``ATEN_CPU_CAPABILITY=avx2``). oneDNN reads
    the variable once, at its first product, so it must be set before the process starts.
    """
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    return isa.strip().lower() in _ONEDNN_ISAS_WITHOUT_BF16


def native_dtype(device: torch.device) -> torch.dtype | None:
    """The reduced precision that ``device`` multiplies natively, or None: what ``auto`` picks.

    CUDA: bf16 where the GPU has it, else fp16 (with loss scaling). CPU: bf16 only on
    processors that multiply bf16 matrices in hardware (AVX512-BF16 or AMX, e.g. recent
    Xeon and EPYC) and only where oneDNN is not capped below them (:func:`onednn_capped_below_bf16`);
    elsewhere bf16 is emulated and slower. Other devices: None. Unlike :func:`autocast_dtype` it
    ignores ``TRANSFORMER_LIB_PRECISION``: it describes the hardware.
    """
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu":
        native = (
            getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
            or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
        )
        return torch.bfloat16 if native and not onednn_capped_below_bf16() else None
    return None


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The reduced precision the library trains in on ``device``, or None to stay in fp32.

    By default (``auto``) the one the hardware multiplies natively (:func:`native_dtype`): bf16
    on GPUs that have it and on CPUs with AVX512-BF16 or AMX, fp16 on older GPUs, None elsewhere.
    The environment variable ``TRANSFORMER_LIB_PRECISION`` overrides this choice for the whole
    process: ``fp32`` (None: no autocast anywhere), ``bf16`` or ``fp16`` (that dtype, on any
    device, even where it is emulated and slow).

    Defined in chapter 7, Decoder-only.
    """
    override = precision_override()
    if override == "auto":
        return native_dtype(device)
    dtype = PRECISIONS[override]
    return None if dtype == torch.float32 else dtype


def _has_cuda_kernel(op: str) -> bool:
    """Whether this PyTorch build has a CUDA kernel for the operator overload ``op`` (no GPU needed)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA")
    except RuntimeError:  # a PyTorch without this overload
        return False


# torch.mm(a, b, out_dtype=torch.float32): bf16 operands, the fp32 accumulator written out (CUDA builds; 2.11 has it)
_MM_FP32_OUT_ON_CUDA = _has_cuda_kernel("aten::mm.dtype")


class _Bf16ProductFp32Out(torch.autograd.Function):
    """``a @ b`` of bf16 operands with fp32 output, on CUDA; the backward's products in bf16, as autocast's.

    Shapes: a (N, d_model), b (d_model, vocab_size) -> (N, vocab_size) in fp32.
    """

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor) -> Tensor:
        ctx.save_for_backward(a, b)
        return torch.mm(a, b, out_dtype=torch.float32)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        a, b = ctx.saved_tensors
        grad = grad.to(a.dtype)  # (N, vocab_size) in bf16, as autocast's backward of a bf16 product takes it
        return grad @ b.T, a.T @ grad  # (N, d_model), (d_model, vocab_size)


def head_product_dtype(device: torch.device, amp_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype the output head multiplies in under autocast to ``amp_dtype`` on ``device`` (None: none).

    bf16 on a CUDA GPU under bf16 autocast (its logits still fp32, :func:`output_in_fp32`), else fp32.
    """
    if device.type == "cuda" and amp_dtype == torch.bfloat16 and _MM_FP32_OUT_ON_CUDA:
        return torch.bfloat16
    return torch.float32


def _hooked(module: nn.Module) -> bool:
    """Whether calling ``module`` would run forward hooks (its own or global ones) around its forward."""
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or _nn_module._global_forward_hooks
        or _nn_module._global_forward_pre_hooks
    )


def _head_bf16_products_fp32_logits(head: nn.Linear, h: Tensor) -> Tensor:
    """``head(h)`` with bf16 operands and fp32 logits (CUDA, bf16 autocast).

    Shapes: h (..., d_model) -> logits (..., vocab_size), fp32.
    """
    with torch.autocast("cuda", enabled=False):
        a = h.reshape(-1, h.shape[-1]).to(torch.bfloat16)  # (N, d_model), N = the product of h's leading dims
        logits = _Bf16ProductFp32Out.apply(a, head.weight.to(torch.bfloat16).T)  # (N, vocab_size), fp32
        if head.bias is not None:
            logits = logits + head.bias.float()
    return logits.view(*h.shape[:-1], logits.shape[-1])  # (..., vocab_size)


def output_in_fp32(head: nn.Linear, h: Tensor) -> Tensor:
    """``head(h)``, in fp32 even under autocast.

    bf16 logits keep about 3 significant digits; rounding every logit adds noise that raises
    the cross-entropy on average, so the logits stay fp32. On a CPU, and on a GPU under fp16,
    the whole product is fp32 (the head is small: d_model x vocab). On a CUDA GPU under bf16
    autocast the product takes bf16 operands, as every other projection does, and its fp32
    accumulator is the output: the logits keep their precision and the tensor cores do the work
    (GPT-2 small's head is about a quarter of the step's FLOPs; on an H200 the compiled step took
    29.0 ms this way against 30.2 ms with an fp32 head, ``benchmarks/mfu.py``). That path multiplies
    the head's weight without calling the module, so a head with forward hooks (its own or global
    ones) is called instead, in fp32, and its hooks run (chapter 8 records every module's output dtype).

    Shapes: h (..., d_model) -> logits (..., vocab_size).
    """
    if torch.is_autocast_enabled(h.device.type):
        weight = getattr(head, "weight", None)
        if (
            h.is_cuda
            and type(head) is nn.Linear
            and isinstance(weight, Tensor)
            and not _hooked(head)  # this path does not call the module: a head with hooks is called, in fp32
            and head_product_dtype(h.device, torch.get_autocast_dtype("cuda")) == torch.bfloat16
        ):
            return _head_bf16_products_fp32_logits(head, h)
        with torch.autocast(h.device.type, enabled=False):
            if isinstance(weight, Tensor) and weight.dtype != torch.float32:  # a model converted with .to(bf16)
                bias = head.bias.float() if head.bias is not None else None
                return F.linear(h.float(), weight.float(), bias)
            return head(h.float())
    return head(h)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, **kwargs: Any) -> Tensor:
    """``F.scaled_dot_product_attention``, in fp32 when bf16 inputs are on the CPU.

    PyTorch's CPU attention kernels are slower in bf16 than in fp32 (the backward about 4x
    at chapter 7's sizes), and attention is a small share of the matrix work, so under
    CPU autocast the attention itself runs in fp32 and only the projections in bf16.

    Shapes: q (B, n_heads, T_q, d_head), k/v (B, n_heads, T_k, d_head) -> (B, n_heads, T_q, d_head).
    """
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)

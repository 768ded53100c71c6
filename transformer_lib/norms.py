"""Layer normalization and RMS normalization, written out (chapter 5, Norms and residuals).

Both normalize each position's feature vector (the last axis of (B, T, d_model)),
never across the batch or across time, so they behave the same for any batch
size and sequence length. Tests prove them equal to ``nn.LayerNorm``/``nn.RMSNorm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validate import _validate_tensor


class LayerNorm(nn.Module):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis.

    ``var`` is the biased (population) variance, the mean squared deviation from the mean, and
    ``eps`` sits inside the square root, exactly as in ``nn.LayerNorm``. ``fused=True`` computes
    the same with PyTorch's fused kernel ``F.layer_norm`` (tests prove the two equal).

    Shapes: x (..., d) -> (..., d).

    Defined in chapter 5, Norms and residuals.
    """

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True, fused: bool = False) -> None:
        super().__init__()
        self.d, self.eps, self.fused = d, eps, fused
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        _validate_tensor("x", x, floating=True, last_dim=self.d)
        if self.fused:
            return F.layer_norm(x, (self.d,), self.weight, self.bias, self.eps)
        centred = x - x.mean(dim=-1, keepdim=True)  # (..., d)
        var = (centred * centred).mean(dim=-1, keepdim=True)  # (..., 1) the biased variance
        y = centred * torch.rsqrt(var + self.eps) * self.weight
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}, bias={self.bias is not None}, fused={self.fused}"


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis: no centring, no bias.

    ``fused=True`` uses PyTorch's ``F.rms_norm`` for the same computation.

    Shapes: x (..., d) -> (..., d).

    Defined in chapter 5, Norms and residuals.
    """

    def __init__(self, d: int, eps: float = 1e-6, fused: bool = False) -> None:
        super().__init__()
        self.d, self.eps, self.fused = d, eps, fused
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        _validate_tensor("x", x, floating=True, last_dim=self.d)
        if self.fused:
            return F.rms_norm(x, (self.d,), self.weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}, fused={self.fused}"


NORMS = ("layernorm", "rmsnorm")


def make_norm(kind: str, d: int, eps: float | None = None, bias: bool = True, fused: bool = False) -> nn.Module:
    """Build a norm by name: ``"layernorm"`` (with or without ``bias``) or ``"rmsnorm"`` (never a bias)."""
    if kind == "layernorm":
        return LayerNorm(d, eps=1e-5 if eps is None else eps, bias=bias, fused=fused)
    if kind == "rmsnorm":
        return RMSNorm(d, eps=1e-6 if eps is None else eps, fused=fused)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")

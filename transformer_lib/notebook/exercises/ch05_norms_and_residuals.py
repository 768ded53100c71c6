"""Chapter 5, norms and residuals: ``check_layer_norm``, ``check_rms_norm`` and ``check_pre_ln_block``."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ...layers import FeedForward
from ...norms import LayerNorm
from ._framework import Bug, Checker, checker

__all__ = ["check_layer_norm", "check_rms_norm", "check_pre_ln_block"]


_OVER_THE_BATCH_HINT = (
    "you normalize over the batch axis (x.mean(dim=0), x.var(dim=0)): those are BatchNorm's statistics, "
    "shared by the examples of a batch. LayerNorm normalizes each position over its own features, the last "
    "axis: x.mean(dim=-1, keepdim=True) and x.var(dim=-1, keepdim=True, unbiased=False)."
)


@checker
def check_layer_norm(c: Checker, layer_norm: Callable[..., Tensor]) -> None:
    """Check ``layer_norm(x, weight, bias, eps=1e-5)`` against ``F.layer_norm`` over the last axis.

    Shapes: x (..., d), weight (d,), bias (d,) -> (..., d).
    """
    g = torch.Generator().manual_seed(3)
    cases = (
        ("small feature size d=4 (where the variance estimate matters)", torch.randn(2, 3, 4, generator=g) * 3),
        ("d=32, with an affine weight and bias", torch.randn(5, 32, generator=g) + 2),
        ("nearly constant features (variance 1e-6, where eps matters)", torch.randn(3, 8, generator=g) * 1e-3),
    )
    for name, x in cases:
        d = x.shape[-1]
        w, b = torch.randn(d, generator=g), torch.randn(d, generator=g)
        mean = x.mean(-1, keepdim=True)

        def unbiased(x=x, w=w, b=b, mean=mean):
            return (x - mean) / torch.sqrt(x.var(-1, keepdim=True, unbiased=True) + 1e-5) * w + b

        def eps_outside(x=x, w=w, b=b, mean=mean):
            return (x - mean) / (x.std(-1, keepdim=True, unbiased=False) + 1e-5) * w + b

        def unbiased_eps_outside(x=x, w=w, b=b, mean=mean):
            return (x - mean) / (x.std(-1, keepdim=True) + 1e-5) * w + b

        def over_the_batch(x=x, w=w, b=b, unbiased=False):  # x.mean(dim=0): BatchNorm's statistics
            return (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=unbiased) + 1e-5) * w + b

        c.case(
            name,
            lambda x, weight, bias: layer_norm(x, weight, bias, eps=1e-5),
            F.layer_norm(x, (d,), w, b, 1e-5),
            bugs=(
                Bug(
                    unbiased,
                    "you use the unbiased variance (dividing by d - 1); LayerNorm divides by d: "
                    "x.var(dim=-1, unbiased=False).",
                ),
                Bug(
                    eps_outside,
                    "eps must go inside the square root: (x - mean) / sqrt(var + eps), not (x - mean) / (std + eps).",
                ),
                Bug(
                    unbiased_eps_outside,
                    "two classic bugs at once: torch.std is unbiased by default, and eps "
                    "belongs inside the square root: (x - mean) / sqrt(var + eps) with "
                    "var = x.var(dim=-1, unbiased=False).",
                ),
                Bug(
                    lambda x=x: F.layer_norm(x, x.shape[-1:], eps=1e-5),
                    "apply the learned weight and bias: normalized * weight + bias.",
                ),
                Bug(over_the_batch, _OVER_THE_BATCH_HINT),
                Bug(lambda f=over_the_batch: f(unbiased=True), _OVER_THE_BATCH_HINT),
            ),
            hint="normalize each position over its last axis: (x - mean) / sqrt(var + eps) * weight + bias.",
            inputs={"x": x, "weight": w, "bias": b},
        )


@checker
def check_rms_norm(c: Checker, rms_norm: Callable[..., Tensor]) -> None:
    """Check ``rms_norm(x, weight, eps=1e-6)``: ``x / sqrt(mean(x^2) + eps) * weight`` over the last axis.

    Shapes: x (..., d), weight (d,) -> (..., d).
    """
    g = torch.Generator().manual_seed(5)
    eps = 1e-6
    cases = (
        ("d=8, features with a non-zero mean (where centring matters)", torch.randn(2, 3, 8, generator=g) + 2),
        ("d=32, with a learned weight", torch.randn(5, 32, generator=g) * 3),
        ("tiny features (mean square 1e-6, where eps matters)", torch.randn(3, 16, generator=g) * 1e-3),
    )
    for name, x in cases:
        d = x.shape[-1]
        w = torch.randn(d, generator=g)
        ms = x.pow(2).mean(-1, keepdim=True)  # (..., 1) mean square
        c.case(
            name,
            lambda x, weight: rms_norm(x, weight, eps=eps),
            F.rms_norm(x, (d,), w, eps),
            bugs=(
                Bug(
                    lambda x=x, w=w: F.layer_norm(x, x.shape[-1:], w, None, eps),
                    "you subtract the mean: that is LayerNorm without a bias. RMSNorm does not centre; it "
                    "divides x itself by its root mean square.",
                ),
                Bug(
                    lambda x=x, w=w, ms=ms: x / (ms.sqrt() + eps) * w,
                    "eps must go inside the square root: x / sqrt(mean(x^2) + eps), not x / (rms + eps).",
                ),
                Bug(
                    lambda x=x, ms=ms: x * torch.rsqrt(ms + eps),
                    "apply the learned weight: the normalized x is multiplied by weight.",
                ),
                Bug(
                    lambda x=x, w=w: x / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps) * w,
                    "you divide by the standard deviation (the spread around the mean); RMSNorm divides by the "
                    "root mean square of x itself, sqrt(mean(x^2) + eps).",
                ),
                Bug(
                    lambda x=x, w=w, ms=ms, d=d: x * torch.rsqrt(ms * d + eps) * w,
                    "x.norm(dim=-1) is the root of the SUM of squares; the RMS is the root of the MEAN, "
                    "sqrt(d) times smaller: use x.pow(2).mean(dim=-1, keepdim=True).",
                ),
            ),
            hint="x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.",
            inputs={"x": x, "weight": w},
        )


@checker
def check_pre_ln_block(c: Checker, block: Callable[..., Tensor]) -> None:
    """Check ``block(x, sublayer, norm)``: one Pre-LN residual block, ``x + sublayer(norm(x))``.

    ``sublayer`` and ``norm`` are modules (a feed-forward network and a LayerNorm in the hidden cases).

    Shapes: x (B, T, d_model) -> (B, T, d_model).
    """
    torch.manual_seed(7)  # @checker restores the reader's random state afterwards
    for name, (B, T, d) in (("one sequence, d_model=8", (1, 4, 8)), ("a batch of 3, d_model=16", (3, 5, 16))):
        norm, sublayer = LayerNorm(d), FeedForward(d, 4 * d, activation="gelu")
        with torch.no_grad():
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.3)
        x = torch.randn(B, T, d) * 4 + 1  # far from normalized, so a normalized skip path shows
        with torch.no_grad():
            expected = x + sublayer(norm(x))
            h = norm(x)
            bugs = (
                Bug(
                    lambda x=x, sublayer=sublayer, norm=norm: norm(x + sublayer(x)),
                    "this is Post-LN, the paper's order norm(x + sublayer(x)); Pre-LN normalizes the "
                    "sublayer's input only: x + sublayer(norm(x)).",
                ),
                Bug(
                    lambda h=h, sublayer=sublayer: h + sublayer(h),
                    "you normalize x in place before the residual add (x = norm(x); x = x + sublayer(x)): "
                    "the skip path then carries norm(x) instead of x. Keep x and add sublayer(norm(x)) to it.",
                ),
                Bug(
                    lambda h=h, sublayer=sublayer: sublayer(h),
                    "the residual connection is missing: add the block's input x to sublayer(norm(x)).",
                ),
                Bug(
                    lambda x=x, sublayer=sublayer, norm=norm: x + norm(sublayer(x)),
                    "the norm is applied to the sublayer's output; Pre-LN normalizes its input: x + sublayer(norm(x)).",
                ),
            )
            c.case(
                name,
                lambda x, sublayer, norm: block(x, sublayer, norm),
                expected,
                bugs=bugs,
                hint="return x + sublayer(norm(x)).",
                atol=1e-4,
                inputs={"x": x, "sublayer": sublayer, "norm": norm},
            )

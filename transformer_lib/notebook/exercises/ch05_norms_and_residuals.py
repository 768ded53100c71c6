"""Chapter 5, norms and residuals: ``check_layer_norm_module`` (fix a video tutorial's LayerNorm class),
``check_pre_ln_block`` (fix a "Pre-LN" block whose skip path carries the normalized x), ``check_stream_growth``
(a prediction: the size of the residual stream after 48 Pre-LN blocks) and ``check_running_stats``
(BatchNorm's running statistics)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...attention import MultiHeadAttention
from ...layers import FeedForward
from ...norms import LayerNorm
from ._framework import Bug, Checker, bug_table, checker

__all__ = ["check_layer_norm_module", "check_pre_ln_block", "check_stream_growth", "check_running_stats"]


# ---------------------------------------------------------------- Spot the bug: a tutorial's LayerNorm module

_SCALAR_HINT = (
    "alpha and bias hold one number each (torch.ones(1)), so every feature gets the same gain and shift and an "
    "nn.LayerNorm's weight and bias, one per feature, cannot be loaded. Take the number of features in __init__ "
    "and make them nn.Parameter(torch.ones(features)) and nn.Parameter(torch.zeros(features))."
)


_LAYER_NORM_BUGS = {  # bug -> hint, for _wrong_layer_norm(..., bug=bug)
    "unbiased": "x.std(dim=-1) is the unbiased standard deviation, dividing by d - 1; LayerNorm divides by d: "
    "x.var(dim=-1, keepdim=True, unbiased=False).",
    "eps outside": "eps belongs inside the square root: (x - mean) / sqrt(var + eps), not (x - mean) / (std + eps). "
    "It matters where the features barely differ.",
    "both": "both classic bugs are still there: x.std is unbiased (it divides by d - 1, LayerNorm by d), and eps is "
    "added outside the square root. Use (x - mean) / sqrt(x.var(dim=-1, keepdim=True, unbiased=False) + eps).",
}


def _wrong_layer_norm(x: Tensor, w: Tensor, b: Tensor, eps: float, *, bug: str) -> Tensor:
    """LayerNorm with the unbiased variance, with eps outside the root, or "both" (the tutorial's forward)."""
    centred = x - x.mean(-1, keepdim=True)
    if bug == "unbiased":
        return w * centred / torch.sqrt(centred.var(-1, keepdim=True) + eps) + b
    return w * centred / (centred.std(-1, keepdim=True, unbiased=bug == "both") + eps) + b


def _build(make: Callable[..., Any], features: int, eps: float) -> Any:
    """``make(features, eps=eps)``; the tutorial's class, which takes no feature count, as ``make(eps=eps)``."""
    try:
        return make(features, eps=eps)
    except TypeError as first:
        try:
            return make(eps=eps)
        except Exception:
            raise first from None


def _layer_norm_output(make: Callable[..., Any], x: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """The answer's module built for ``x``'s width, with ``weight`` and ``bias`` loaded if given, applied to ``x``."""
    module = _build(make, x.shape[-1], eps=1e-5)
    if weight is not None:
        with torch.no_grad():
            module.alpha.copy_(weight)
            module.bias.copy_(bias)
    return module(x)


def _parameter_shapes(make: Callable[..., Any], features: int) -> str:
    module = _build(make, features, eps=1e-5)
    return f"alpha {tuple(module.alpha.shape)}, bias {tuple(module.bias.shape)}"


def _layer_norm_error_hint(e: Exception) -> str:
    text = str(e)
    if isinstance(e, AttributeError) and ("alpha" in text or "bias" in text):
        return "keep the tutorial's parameter names, alpha (the gain) and bias (the shift): the checker loads them."
    if isinstance(e, RuntimeError) and ("shape" in text or "size" in text):
        return _SCALAR_HINT
    if isinstance(e, TypeError) and "argument" in text:
        return "the checker builds LayerNormalization(features, eps=...): the number of features first, then eps."
    return ""


@checker
def check_layer_norm_module(c: Checker, layer_norm_class: Callable[..., nn.Module]) -> None:
    """Check ``layer_norm_class``, a LayerNorm module class: ``layer_norm_class(features, eps=...)`` must equal
    ``nn.LayerNorm(features, eps=eps)``, with its gain and shift named ``alpha`` and ``bias``.

    The cases build it with ``eps=1e-5``: at initialization on random and on nearly constant features, then with a
    learned gain and shift loaded into ``alpha`` and ``bias``. Shapes: x (..., features) -> (..., features).
    """
    torch.manual_seed(3)  # @checker restores the reader's random state afterwards
    eps = 1e-5
    cases = (  # (name, x, with a learned gain and shift)
        ("at initialization, d=4 random features (where the variance matters)", torch.randn(2, 3, 4) * 3, False),
        ("at initialization, nearly constant features (where eps matters)", torch.randn(3, 8) * 1e-3, False),
        ("d=32, a learned gain and shift loaded into alpha and bias", torch.randn(5, 32) + 2, True),
    )
    for name, x, loaded in cases:
        d = x.shape[-1]
        w, b = (torch.randn(d), torch.randn(d)) if loaded else (torch.ones(d), torch.zeros(d))
        if loaded:
            c.case(
                f"d={d}: alpha and bias, one gain and one shift per feature",
                lambda features: _parameter_shapes(layer_norm_class, features),
                f"alpha ({d},), bias ({d},)",
                bugs=(Bug(lambda: "alpha (1,), bias (1,)", _SCALAR_HINT),),
                hint="alpha = nn.Parameter(torch.ones(features)), bias = nn.Parameter(torch.zeros(features)).",
                error_hint=_layer_norm_error_hint,
                inputs={"features": d},
            )
        c.case(
            name,
            lambda x, weight, bias, loaded=loaded: _layer_norm_output(
                layer_norm_class, x, weight if loaded else None, bias if loaded else None
            ),
            F.layer_norm(x, (d,), w, b, eps),
            bugs=bug_table(_LAYER_NORM_BUGS, _wrong_layer_norm, x, w, b, eps),
            hint="normalize each position over its last axis: alpha * (x - mean) / sqrt(var + eps) + bias, with the "
            "biased variance.",
            error_hint=_layer_norm_error_hint,
            inputs={"x": x, "weight": w, "bias": b},
        )


# ---------------------------------------------------------------- Spot the bug: a "Pre-LN" block


class _CausalSelfAttention(nn.Module):
    """Causal self-attention of one input: ``attention(h) = mha(h, h, h, is_causal=True)``."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.mha = MultiHeadAttention(d_model, n_heads)

    def forward(self, h: Tensor) -> Tensor:
        return self.mha(h, h, h, is_causal=True)


def _pre_ln(x: Tensor, attention: nn.Module, ff: nn.Module, norm1: nn.Module, norm2: nn.Module, *, bug: str = ""):
    """Two Pre-LN blocks, x + attention(norm1(x)) then x + ff(norm2(x)), or one of their wrong versions
    (:data:`_PRE_LN_BUGS`). Shapes: x (B, T, d_model) -> (B, T, d_model)."""
    if bug == "Post-LN":
        h = norm1(x + attention(x))
        return norm2(h + ff(h))
    if bug == "no residual":
        return ff(norm2(attention(norm1(x))))
    if bug == "norm after":
        h = x + norm1(attention(x))
        return h + norm2(ff(h))

    def block(h: Tensor, f: nn.Module, norm: nn.Module, skip_normalized: bool) -> Tensor:
        n = norm(h)
        return (n if skip_normalized else h) + f(n)  # the bug: norm(h) + f(norm(h))

    h = block(x, attention, norm1, bug in ("both blocks", "attention block"))
    return block(h, ff, norm2, bug in ("both blocks", "feed-forward block"))


_PRE_LN_BUGS = {  # bug -> hint, for _pre_ln(..., bug=bug)
    "both blocks": "the skip path carries the normalized x: h = norm1(x) followed by h + attention(h) (or "
    "x = norm1(x); x = x + attention(x)) adds the sublayer's output to norm1(x), so the block forgets the "
    "residual stream it was given. Keep x and add to it: x = x + attention(norm1(x)), then x + ff(norm2(x)).",
    "feed-forward block": "the attention block is fixed, the feed-forward block is not: its skip path still carries "
    "norm2(x). Return x + ff(norm2(x)).",
    "attention block": "the feed-forward block is fixed, the attention block is not: its skip path still carries "
    "norm1(x). Use x = x + attention(norm1(x)).",
    "Post-LN": "this is Post-LN, the paper's order norm(x + sublayer(x)); Pre-LN normalizes the sublayer's input "
    "only: x + sublayer(norm(x)).",
    "no residual": "the residual connections are missing: each block adds its sublayer's output to its input x.",
    "norm after": "the norms are applied to the sublayers' outputs; Pre-LN normalizes their inputs: "
    "x + sublayer(norm(x)).",
}


@checker
def check_pre_ln_block(c: Checker, pre_ln_block: Callable[..., Tensor]) -> None:
    """Check ``pre_ln_block(x, attention, ff, norm1, norm2)``: two Pre-LN residual blocks,
    ``x = x + attention(norm1(x))`` then ``x + ff(norm2(x))``.

    ``attention`` (causal self-attention), ``ff`` (a feed-forward network), ``norm1`` and ``norm2`` (LayerNorms)
    are modules mapping (B, T, d_model) to the same shape. Shapes: x (B, T, d_model) -> (B, T, d_model).
    """
    torch.manual_seed(7)  # @checker restores the reader's random state afterwards
    for name, (B, T, d) in (("one sequence, d_model=8", (1, 4, 8)), ("a batch of 3, d_model=16", (3, 5, 16))):
        attention, ff = _CausalSelfAttention(d, 2), FeedForward(d, 4 * d, activation="gelu")
        norm1, norm2 = LayerNorm(d), LayerNorm(d)
        with torch.no_grad():
            for norm in (norm1, norm2):
                norm.weight.normal_(1.0, 0.3)
                norm.bias.normal_(0.0, 0.3)
        x = torch.randn(B, T, d) * 4 + 1  # far from normalized, so a normalized skip path shows
        with torch.no_grad():
            expected = _pre_ln(x, attention, ff, norm1, norm2)
        c.case(
            name,
            lambda x, attention, ff, norm1, norm2: pre_ln_block(x, attention, ff, norm1, norm2),
            expected,
            bugs=bug_table(_PRE_LN_BUGS, _pre_ln, x, attention, ff, norm1, norm2),
            hint="x = x + attention(norm1(x)), then return x + ff(norm2(x)): the norm sits on the branch only.",
            atol=1e-4,
            inputs={"x": x, "attention": attention, "ff": ff, "norm1": norm1, "norm2": norm2},
        )


# ---------------------------------------------------------------- Predict, then run: the residual stream's growth

STREAM_SETUP = {"n_tokens": 256, "d_model": 64, "n_blocks": 48, "seed": 0}
"""The exercise's stack: ``n_tokens`` inputs x_0 with N(0, 1) entries, then ``n_blocks`` Pre-LN blocks
x <- x + LN(x) Q_l, each Q_l a random orthogonal (d_model, d_model) matrix, LN without gain or shift."""


def stream_norm(n_tokens: int, d_model: int, n_blocks: int, seed: int = 0) -> list[float]:
    """The mean norm of the residual stream of :data:`STREAM_SETUP`'s stack: of x_0, then after each block.

    Each block adds LN(x) Q_l, a vector of norm sqrt(d_model) (LN's output has mean 0 and variance 1 over the
    d_model features, Q_l keeps norms) pointing in a direction independent of x (Q_l is random): the squared
    norms add up, ||x_L||² ≈ ||x_0||² + L d_model.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_tokens, d_model, generator=g)
    norms = [x.norm(dim=-1).mean().item()]
    for _ in range(n_blocks):
        q, r = torch.linalg.qr(torch.randn(d_model, d_model, generator=g))
        q = q * torch.sign(torch.diagonal(r))  # uniformly random among the orthogonal matrices
        x = x + F.layer_norm(x, (d_model,)) @ q
        norms.append(x.norm(dim=-1).mean().item())
    return norms


@checker(answer="value")
def check_stream_growth(c: Checker, prediction: float) -> None:
    """Check ``prediction``, the mean norm of the residual stream after 48 Pre-LN blocks x <- x + LN(x) Q_l
    (Q_l random orthogonal, LN without gain or shift), from 256 tokens x_0 of d_model = 64 N(0, 1) features."""
    d, L = STREAM_SETUP["d_model"], STREAM_SETUP["n_blocks"]
    norms = stream_norm(**STREAM_SETUP)
    start, expected = norms[0], norms[-1]
    c.case(
        f"mean ||x|| after {L} blocks, d_model={d}, ||x_0|| about {start:.1f}",
        lambda: prediction,
        expected,
        bugs=(
            Bug(
                lambda: start,
                "that is the size of the input. Nothing in a Pre-LN stack rescales the residual stream: the norm "
                "sits on the branch, and every block adds its output to the stream.",
            ),
            Bug(
                lambda: start + L * d**0.5,
                f"you added the norms: {L} vectors of norm sqrt({d}) in a row would give that only if they all "
                "pointed the same way. Each one points in a direction independent of the stream, so it is the "
                "SQUARES of the norms that add up (Pythagoras).",
            ),
        ),
        hint=f"each block adds LN(x) Q_l. LN's output has mean 0 and variance 1 over its {d} features, so its norm "
        f"is sqrt({d}) = {d**0.5:g}, and the orthogonal Q_l keeps it. Q_l is random, so the added vector is nearly "
        f"orthogonal to x: ||x + v||² ≈ ||x||² + ||v||². After L blocks, ||x||² ≈ ||x_0||² + L · {d}.",
        atol=5.0,
    )


# ---------------------------------------------------------------- Extend: BatchNorm's running statistics


def _running_stats(x: Tensor, mean0: Tensor, var0: Tensor, momentum: float, *, bug: str = "") -> tuple[Tensor, Tensor]:
    """BatchNorm's running statistics after one training step on ``x``, or with a bug of :data:`_RUNNING_STATS_BUGS`.
    Shapes: x (B, T, d_model), mean0 and var0 (d_model,) -> (d_model,), (d_model,)."""
    mean, var = x.mean(dim=(0, 1)), x.var(dim=(0, 1), unbiased=bug != "biased")
    if bug == "batch stats":
        return mean, var
    m = 1 - momentum if bug == "momentum swapped" else momentum
    return (1 - m) * mean0 + m * mean, (1 - m) * var0 + m * var


_RUNNING_STATS_CASES = (  # (name, x's shape (B, T, d_model), statistics from earlier batches, momentum)
    ("B=4, T=5, d_model=8, fresh statistics (mean 0, variance 1), momentum 0.1", (4, 5, 8), False, 0.1),
    ("B=2, T=3, d_model=16, statistics from earlier batches, momentum 0.3", (2, 3, 16), True, 0.3),
    ("a single sequence, B=1, T=6, d_model=4, momentum 0.1", (1, 6, 4), True, 0.1),
)
_RUNNING_STATS_BUGS = {  # bug -> hint, for _running_stats(..., bug=bug)
    "biased": "running_var keeps the UNBIASED variance of the batch (dividing by n - 1, n = B·T values per "
    "feature), although BatchNorm normalizes the batch itself with the biased one: x.var(dim=(0, 1)).",
    "momentum swapped": "BatchNorm's momentum is the weight of the NEW batch, the opposite of an optimizer's "
    "momentum: new = (1 - momentum) * running + momentum * batch.",
    "batch stats": "these are the batch's own statistics: the running ones only move towards them, "
    "new = (1 - momentum) * running + momentum * batch.",
}
_PER_FEATURE_HINT = (
    "the running statistics hold one number per feature, shape (d_model,): BatchNorm averages each feature over "
    "the batch AND the positions, x.mean(dim=(0, 1)), not over the features (LayerNorm's axis) nor over B alone."
)


def _batch_norm_stats(x: Tensor, mean0: Tensor, var0: Tensor, momentum: float) -> tuple[Tensor, Tensor]:
    """The running statistics of an ``nn.BatchNorm1d`` that starts from ``mean0``, ``var0`` after a step on ``x``."""
    bn = nn.BatchNorm1d(x.shape[-1], momentum=momentum)
    with torch.no_grad():
        bn.running_mean.copy_(mean0)
        bn.running_var.copy_(var0)
        bn.train()(x.transpose(1, 2))  # (B, d_model, T): BatchNorm1d's layout
    return bn.running_mean.clone(), bn.running_var.clone()


@checker
def check_running_stats(c: Checker, update_running_stats: Callable[..., tuple[Tensor, Tensor]]) -> None:
    """Check ``update_running_stats(x, running_mean, running_var, momentum) -> (new_mean, new_var)``: the running
    statistics after one training step of ``nn.BatchNorm1d`` on a batch of sequences.

    Shapes: x (B, T, d_model), running_mean and running_var (d_model,) -> (d_model,), (d_model,).
    """
    g = torch.Generator().manual_seed(11)
    for name, shape, earlier, momentum in _RUNNING_STATS_CASES:
        d = shape[-1]
        x = torch.randn(*shape, generator=g) * 2 + 1
        if earlier:
            mean0, var0 = torch.randn(d, generator=g), torch.rand(d, generator=g) + 0.5
        else:
            mean0, var0 = torch.zeros(d), torch.ones(d)
        c.case(
            name,
            lambda x, running_mean, running_var, momentum: update_running_stats(x, running_mean, running_var, momentum),
            _batch_norm_stats(x, mean0, var0, momentum),
            bugs=bug_table(_RUNNING_STATS_BUGS, _running_stats, x, mean0, var0, momentum),
            hint="one statistic per feature, over B and T: new_mean = (1 - momentum) * running_mean + momentum * "
            "x.mean(dim=(0, 1)), and the same for the variance with the unbiased x.var(dim=(0, 1)).",
            error_hint=lambda e: _PER_FEATURE_HINT if "size" in str(e) or "shape" in str(e) else "",
            inputs={"x": x, "running_mean": mean0, "running_var": var0, "momentum": momentum},
        )

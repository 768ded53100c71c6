"""Chapter 5, norms and residuals: ``check_layer_norm_module`` (fix a video tutorial's LayerNorm class),
``check_pre_ln_block`` (fix a Pre-LN layer whose residual dropout drops the residual stream itself),
``check_stream_growth`` (a prediction: the size of the residual stream after 48 Pre-LN blocks) and
``check_running_stats`` (BatchNorm's running statistics)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...attention import MultiHeadAttention
from ...layers import FeedForward
from ...norms import LayerNorm
from ._framework import Checker, Hint, bug_table, checker

ANSWER_MARKERS: dict[str, tuple[str, ...]] = {  # exercise label -> what gives its answer away
    "ex-fix-layer-norm": ("torch.ones(features)", "torch.zeros(features)", "one number each"),
    "ex-pre-ln-block": ("x + dropout(attention(norm1(x)))", "dropout(attention(norm1(x)))", "dropout(ff(norm2(x)))"),
    "ex-stream-growth": ("= 56", "8 \\sqrt{49}", "8 sqrt(", "64 + 48 \\cdot 64"),
    "ex-running-stats": ("(1 - momentum) * running_mean", "momentum * batch_mean", "weight of the new batch"),
    "ex-final-norm": ("nothing rescales that sum", "already normalized", "the logits' scale"),
}


# ---------------------------------------------------------------- Spot the bug: a tutorial's LayerNorm module

LAYER_NORM_STARTER = """\
class LayerNormalization(nn.Module):  # find and fix the bugs

    def __init__(self, eps: float = 10**-6) -> None:
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1))  # alpha is a learnable parameter
        self.bias = nn.Parameter(torch.zeros(1))  # bias is a learnable parameter

    def forward(self, x):  # x: (batch, seq_len, hidden_size)
        mean = x.mean(dim=-1, keepdim=True)  # (batch, seq_len, 1)
        std = x.std(dim=-1, keepdim=True)  # (batch, seq_len, 1)
        return self.alpha * (x - mean) / (std + self.eps) + self.bias
"""

_LN_SECTION = "reread 'LayerNorm and RMSNorm by hand' and the warning after it"
_SCALAR_HINT = Hint(
    "alpha and bias hold one number each, so every feature gets the same gain and shift, and an nn.LayerNorm's "
    "weight and bias, one per feature, cannot be loaded into them: the gain and shift of 'Three norms, three sets "
    "of axes' are per feature.",
    "take the number of features in __init__ and make them nn.Parameter(torch.ones(features)) and "
    "nn.Parameter(torch.zeros(features)).",
)
_UNBIASED = Hint(
    f"x.std divides by d - 1 (the unbiased standard deviation), LayerNorm by d; {_LN_SECTION}.",
    "x.var(dim=-1, keepdim=True, unbiased=False).",
)
_OUTSIDE = Hint(
    f"eps is added outside the square root, which matters where the features barely differ; {_LN_SECTION}.",
    "(x - mean) / sqrt(var + eps), not (x - mean) / (std + eps).",
)
_LAYER_NORM_BUGS = {  # bug -> hint, for _wrong_layer_norm(..., bug=bug)
    "unbiased": _UNBIASED,
    "eps outside": _OUTSIDE,
    "both": Hint(
        "both of the tutorial's forward bugs are still there: the standard deviation divides by d - 1, LayerNorm "
        f"by d, and eps sits outside the square root; {_LN_SECTION}.",
        "(x - mean) / sqrt(x.var(dim=-1, keepdim=True, unbiased=False) + eps).",
    ),
}


def _wrong_layer_norm(x: Tensor, w: Tensor, b: Tensor, eps: float, *, bug: str) -> Tensor:
    centred = x - x.mean(-1, keepdim=True)
    if bug == "unbiased":
        return w * centred / torch.sqrt(centred.var(-1, keepdim=True) + eps) + b
    return w * centred / (centred.std(-1, keepdim=True, unbiased=bug == "both") + eps) + b


def _build(make: Callable[..., Any], features: int, eps: float) -> Any:
    """``make(features, eps=eps)``, or ``make(eps=eps)`` for the tutorial's class, which takes no feature count."""
    try:
        return make(features, eps=eps)
    except TypeError as first:
        try:
            return make(eps=eps)
        except Exception:
            raise first from None


def _layer_norm_output(make: Callable[..., Any], x: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    module = _build(make, x.shape[-1], eps=1e-5)
    if weight is not None:
        with torch.no_grad():
            module.alpha.copy_(weight)
            module.bias.copy_(bias)
    return module(x)


def _parameter_shapes_case(c: Checker, make: Callable[..., Any], d: int) -> None:
    def shapes(features: int) -> str:
        module = _build(make, features, eps=1e-5)
        return f"alpha {tuple(module.alpha.shape)}, bias {tuple(module.bias.shape)}"

    c.case(
        f"d={d}: alpha and bias, one gain and one shift per feature",
        shapes,
        f"alpha ({d},), bias ({d},)",
        bugs={"alpha (1,), bias (1,)": _SCALAR_HINT},
        hint=_SCALAR_HINT,
        error_hint=_layer_norm_error_hint,
        inputs={"features": d},
    )


def _layer_norm_error_hint(e: BaseException) -> Hint | str:
    text = str(e)
    if isinstance(e, AttributeError) and ("alpha" in text or "bias" in text):
        return "keep the tutorial's parameter names, alpha (the gain) and bias (the shift): the checker loads them."
    if isinstance(e, RuntimeError) and ("shape" in text or "size" in text):
        return _SCALAR_HINT
    if isinstance(e, TypeError) and "argument" in text:
        return Hint(
            "the checker builds your class with the number of features first, then eps.",
            "def __init__(self, features: int, eps: float = 10**-6).",
        )
    return ""


class _LayerNormByHand(nn.Module):  # the tutorial's class fixed (the checker refuses the library's norms)
    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps, self.alpha, self.bias = eps, nn.Parameter(torch.ones(features)), nn.Parameter(torch.zeros(features))

    def forward(self, x: Tensor) -> Tensor:
        centred = x - x.mean(-1, keepdim=True)
        return self.alpha * centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps) + self.bias


@checker(starter=LAYER_NORM_STARTER, reference=_LayerNormByHand)
def check_layer_norm_module(c: Checker, layer_norm_class: Callable[..., nn.Module]) -> None:
    """Check ``layer_norm_class``: ``layer_norm_class(features, eps=...)`` must equal ``nn.LayerNorm(features,
    eps=eps)``, its gain and shift named ``alpha`` and ``bias``, without the library's norms (no subclass of them,
    no ``F.layer_norm``). Shapes: x (..., features) -> (..., features)."""
    torch.manual_seed(3)  # @checker restores the reader's random state afterwards
    with c.refuse_library_calls(
        nn.LayerNorm,
        LayerNorm,
        F.layer_norm,
        torch.layer_norm,
        name="fixed by hand, without nn.LayerNorm, tl.LayerNorm or F.layer_norm",
        hint="the exercise asks you to fix the tutorial's class: PyTorch's LayerNorm (and the library's) is what "
        "the checker compares it with, so a subclass of it, or a call of F.layer_norm, fixes nothing.",
    ):
        _layer_norm_cases(c, layer_norm_class)


def _layer_norm_cases(c: Checker, layer_norm_class: Callable[..., nn.Module]) -> None:
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
            _parameter_shapes_case(c, layer_norm_class, d)
        c.case(
            name,
            lambda x, weight, bias, loaded=loaded: _layer_norm_output(
                layer_norm_class, x, weight if loaded else None, bias if loaded else None
            ),
            F.layer_norm(x, (d,), w, b, eps),
            bugs=bug_table(_LAYER_NORM_BUGS, _wrong_layer_norm, x, w, b, eps),
            hint=Hint(
                f"each position is normalized over its own features, the last axis; {_LN_SECTION}.",
                "alpha * (x - mean) / sqrt(var + eps) + bias, with the biased variance.",
            ),
            error_hint=_layer_norm_error_hint,
            inputs={"x": x, "weight": w, "bias": b},
        )


# ---------------------------------------------------------------- Spot the bug: residual dropout in a Pre-LN layer

PRE_LN_STARTER = """\
def pre_ln_block(x, attention, ff, norm1, norm2, dropout):  # find and fix the bug
    x = dropout(x + attention(norm1(x)))  # residual dropout
    return dropout(x + ff(norm2(x)))
"""


class _CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.mha = MultiHeadAttention(d_model, n_heads)

    def forward(self, h: Tensor) -> Tensor:
        return self.mha(h, h, h, is_causal=True)


class _FixedDropout(nn.Module):
    """``nn.Dropout(p)`` in training mode, but dropping the same entries at every call, so that results compare."""

    mask: Tensor  # a buffer

    def __init__(self, shape: tuple[int, ...], p: float, generator: torch.Generator) -> None:
        super().__init__()
        self.p = p
        self.register_buffer("mask", (torch.rand(shape, generator=generator) >= p).float() / (1 - p))

    def forward(self, h: Tensor) -> Tensor:
        return h * self.mask

    def extra_repr(self) -> str:
        return f"p={self.p}, the same entries dropped at every call"


def _pre_ln(x: Tensor, attention: nn.Module, ff: nn.Module, norm1: nn.Module, norm2: nn.Module, dropout: nn.Module,
            *, bug: str = "") -> Tensor:  # fmt: skip
    """Two Pre-LN blocks with residual dropout, or a wrong version of :data:`_PRE_LN_BUGS`."""
    if bug == "Post-LN":
        h = norm1(x + dropout(attention(x)))
        return norm2(h + dropout(ff(h)))

    def block(h: Tensor, f: nn.Module, norm: nn.Module, on_the_stream: bool) -> Tensor:
        if on_the_stream:
            return dropout(h + f(norm(h)))  # the bug: the sum, the stream h included, is dropped
        if bug == "no dropout":
            return h + f(norm(h))
        if bug == "before the sublayer":
            return h + f(dropout(norm(h)))
        return h + dropout(f(norm(h)))

    h = block(x, attention, norm1, bug in ("on the stream", "feed-forward block"))
    return block(h, ff, norm2, bug in ("on the stream", "attention block"))


_PRE_LN_SECTION = "reread 'Post-LN and Pre-LN': in Pre-LN the skip path is a clean sum"
_PRE_LN_FIX = "x = x + dropout(attention(norm1(x))), then return x + dropout(ff(norm2(x)))"
_PRE_LN_BUGS = {  # bug -> hint, for _pre_ln(..., bug=bug)
    "on the stream": Hint(
        "in training, your dropout zeroes entries of the residual stream itself, x included: the skip path no "
        "longer carries x untouched, and each block throws away part of what every earlier block wrote (in "
        f"evaluation mode, where dropout does nothing, the layer is right); {_PRE_LN_SECTION}.",
        "drop only what the sublayer adds, before adding it: " + _PRE_LN_FIX + ".",
    ),
    "attention block": Hint(
        "the attention block is fixed; the feed-forward block still drops the residual stream itself.",
        "return x + dropout(ff(norm2(x))).",
    ),
    "feed-forward block": Hint(
        "the feed-forward block is fixed; the attention block still drops the residual stream itself.",
        "x = x + dropout(attention(norm1(x))).",
    ),
    "no dropout": Hint(
        "your layer applies no dropout: it equals the layer in evaluation mode, but in training each sublayer's "
        "output must be dropped.",
        _PRE_LN_FIX + ".",
    ),
    "before the sublayer": Hint(
        "you drop the sublayer's input; residual dropout drops its output, what the block adds to the stream.",
        _PRE_LN_FIX + ".",
    ),
    "Post-LN": Hint(
        "this is Post-LN, with the norm after the addition; Pre-LN normalizes the sublayer's input only; "
        f"{_PRE_LN_SECTION}.",
        _PRE_LN_FIX + ".",
    ),
}


@checker(
    starter=PRE_LN_STARTER,
    reference=lambda x, attention, ff, norm1, norm2, dropout: (lambda h: h + dropout(ff(norm2(h))))(
        x + dropout(attention(norm1(x)))
    ),
)
def check_pre_ln_block(c: Checker, pre_ln_block: Callable[..., Tensor]) -> None:
    """Check ``pre_ln_block(x, attention, ff, norm1, norm2, dropout)``: two Pre-LN residual blocks with residual
    dropout. The modules map (B, T, d_model) to the same shape."""
    torch.manual_seed(7)  # @checker restores the reader's random state afterwards
    g = torch.Generator().manual_seed(7)
    cases = (
        ("dropout off (nn.Dropout in evaluation mode), one sequence, d_model=8", (1, 4, 8), 0.0),
        ("dropout p=0.25 in training, one sequence, d_model=8", (1, 4, 8), 0.25),
        ("dropout p=0.1 in training, a batch of 3, d_model=16", (3, 5, 16), 0.1),
    )
    c.cases(
        pre_ln_block,
        [(name, _pre_ln_inputs(shape, p, g)) for name, shape, p in cases],
        _pre_ln,
        _PRE_LN_BUGS,
        hint=Hint(
            "each block adds its sublayer's output, dropped in training, to the stream it was given, which "
            f"passes through untouched; {_PRE_LN_SECTION}.",
            _PRE_LN_FIX + ".",
        ),
        atol=1e-4,
    )


def _pre_ln_inputs(shape: tuple[int, int, int], p: float, g: torch.Generator) -> dict[str, Any]:
    B, T, d = shape
    attention, ff = _CausalSelfAttention(d, 2), FeedForward(d, 4 * d, activation="gelu")
    norm1, norm2 = LayerNorm(d), LayerNorm(d)
    with torch.no_grad():
        for norm in (norm1, norm2):
            norm.weight.normal_(1.0, 0.3)
            if norm.bias is not None:  # LayerNorm(d) has one
                norm.bias.normal_(0.0, 0.3)
    dropout = _FixedDropout((B, T, d), p, g) if p else nn.Dropout(0.1).eval()
    x = torch.randn(B, T, d) * 4 + 1
    return {"x": x, "attention": attention, "ff": ff, "norm1": norm1, "norm2": norm2, "dropout": dropout}


# ---------------------------------------------------------------- Predict, then run: the residual stream's growth

STREAM_SETUP = {"n_tokens": 256, "d_model": 64, "n_blocks": 48, "seed": 0}
"""The exercise's stack: ``n_tokens`` inputs x_0 with N(0, 1) entries, then ``n_blocks`` Pre-LN blocks
x <- x + LN(x) Q_l, each Q_l a random orthogonal (d_model, d_model) matrix, LN without gain or shift."""


def stream_norm(n_tokens: int, d_model: int, n_blocks: int, seed: int = 0) -> list[float]:
    """The mean norm of the residual stream of :data:`STREAM_SETUP`'s stack: of x_0, then after each block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_tokens, d_model, generator=g)
    norms = [x.norm(dim=-1).mean().item()]
    for _ in range(n_blocks):
        q, r = torch.linalg.qr(torch.randn(d_model, d_model, generator=g))
        q = q * torch.sign(torch.diagonal(r))  # uniformly random among the orthogonal matrices
        x = x + F.layer_norm(x, (d_model,)) @ q
        norms.append(x.norm(dim=-1).mean().item())
    return norms


@checker(answer="value", reference=math.sqrt((STREAM_SETUP["n_blocks"] + 1) * STREAM_SETUP["d_model"]))  # Pythagoras
def check_stream_growth(c: Checker, prediction: float) -> None:
    """Check ``prediction``, the mean norm of the residual stream after 48 blocks x <- x + LN(x) Q_l (Q_l random
    orthogonal), from 256 tokens x_0 of d_model = 64 N(0, 1) features."""
    d, L = STREAM_SETUP["d_model"], STREAM_SETUP["n_blocks"]
    norms = stream_norm(**STREAM_SETUP)
    start, expected = norms[0], norms[-1]
    bugs = {
        start: "that is the size of the input. Nothing in a Pre-LN stack rescales the residual stream: the norm "
        "sits on the branch, and every block adds its output to the stream.",
        start + L * d**0.5: Hint(
            f"you added the norms: {L} vectors of norm sqrt({d}) in a row would give that only if they all pointed "
            "the same way. Each one points in a direction independent of the stream, so it is the SQUARES of the "
            "norms that add up (Pythagoras).",
            f"||x_L||² ≈ ||x_0||² + L · {d}.",
        ),
    }
    c.case(
        f"mean ||x|| after {L} blocks, d_model={d}, ||x_0|| about {start:.1f}",
        lambda: prediction,
        expected,
        bugs=bugs,
        hint=Hint(
            f"each block adds LN(x) Q_l. What is the norm of a vector of {d} features with mean 0 and variance 1, "
            "and how does the norm of a sum grow when the added vector points in a direction independent of x? "
            "Reread 'The residual stream: growing or renormalized'.",
            f"LN(x) Q_l has norm sqrt({d}) = {d**0.5:g} and is nearly orthogonal to x: ||x + v||² ≈ ||x||² + ||v||², "
            f"so after L blocks ||x||² ≈ ||x_0||² + L · {d}.",
        ),
        atol=5.0,
    )


# ---------------------------------------------------------------- Extend: BatchNorm's running statistics


def _running_stats(x: Tensor, mean0: Tensor, var0: Tensor, momentum: float, *, bug: str = "") -> tuple[Tensor, Tensor]:
    """BatchNorm's running statistics after a training step on ``x``, or with a bug of :data:`_RUNNING_STATS_BUGS`."""
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
_RUNNING_STATS_FORMULA = "new = (1 - momentum) * running + momentum * batch"
_RUNNING_STATS_BUGS = {  # bug -> hint, for _running_stats(..., bug=bug)
    "biased": Hint(
        "your running variance is the variance BatchNorm normalizes the batch with; the running average keeps "
        "another one, an estimate of the variance of all the data, which a batch's own variance underestimates. "
        "Compare with an nn.BatchNorm1d's running_var.",
        "the unbiased x.var(dim=(0, 1)), dividing by n - 1 with n = B·T values per feature.",
    ),
    "momentum swapped": Hint(
        "your average weighs the old and the new statistics the other way round: BatchNorm's momentum is not an "
        "optimizer's. Try momentum=1.0 on an nn.BatchNorm1d and see what its running_mean becomes.",
        "momentum is the weight of the NEW batch: " + _RUNNING_STATS_FORMULA + ".",
    ),
    "batch stats": Hint(
        "these are the batch's own statistics: the running ones only move towards them, by a share that momentum sets.",
        _RUNNING_STATS_FORMULA + ".",
    ),
}
_PER_FEATURE_HINT = Hint(
    "the running statistics hold one number per feature, shape (d_model,): BatchNorm averages each feature over the "
    "batch AND the positions, not over the features (LayerNorm's axis) nor over B alone; reread 'Three norms, three "
    "sets of axes'.",
    "x.mean(dim=(0, 1)) and x.var(dim=(0, 1)).",
)


def _batch_norm_stats(x: Tensor, mean0: Tensor, var0: Tensor, momentum: float) -> tuple[Tensor, Tensor]:
    bn = nn.BatchNorm1d(x.shape[-1], momentum=momentum)
    mean, var = bn.running_mean, bn.running_var
    assert mean is not None and var is not None  # track_running_stats=True, the default, keeps them
    with torch.no_grad():
        mean.copy_(mean0)
        var.copy_(var0)
        bn.train()(x.transpose(1, 2))  # (B, d_model, T): BatchNorm1d's layout
    return mean.clone(), var.clone()


@checker(
    reference=lambda x, mean, var, momentum: (
        (1 - momentum) * mean + momentum * x.mean(dim=(0, 1)),
        (1 - momentum) * var + momentum * x.var(dim=(0, 1)),
    )
)  # compared with nn.BatchNorm1d's buffers
def check_running_stats(c: Checker, update_running_stats: Callable[..., tuple[Tensor, Tensor]]) -> None:
    """Check ``update_running_stats(x, running_mean, running_var, momentum)``: ``nn.BatchNorm1d``'s running
    statistics after a training step. Shapes: x (B, T, d_model), the statistics (d_model,) -> two (d_model,)."""
    g = torch.Generator().manual_seed(11)
    cases = []
    for name, shape, earlier, momentum in _RUNNING_STATS_CASES:
        d = shape[-1]
        x = torch.randn(*shape, generator=g) * 2 + 1
        fresh = torch.zeros(d), torch.ones(d)
        mean0, var0 = (torch.randn(d, generator=g), torch.rand(d, generator=g) + 0.5) if earlier else fresh
        cases.append((name, {"x": x, "running_mean": mean0, "running_var": var0, "momentum": momentum}))
    c.cases(
        update_running_stats,
        cases,
        _batch_norm_stats,
        _RUNNING_STATS_BUGS,
        _running_stats,
        hint=Hint(
            "one statistic per feature, over B and T, moved towards the batch's own by a share that momentum "
            "sets; find out on an nn.BatchNorm1d which variance it keeps.",
            "new_mean = (1 - momentum) * running_mean + momentum * x.mean(dim=(0, 1)), and the same for the "
            "variance with the unbiased x.var(dim=(0, 1)).",
        ),
        error_hint=lambda e: _PER_FEATURE_HINT if "size" in str(e) or "shape" in str(e) else "",
    )

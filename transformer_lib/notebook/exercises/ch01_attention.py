"""Chapter 1, attention: ``check_softmax`` (fix a much-copied softmax for rows of scores), ``check_score_std`` (a
prediction: the spread of the scores of unscaled random projections) and ``check_distance_attention`` (attention
that scores keys by their distance to the query)."""

from __future__ import annotations

import math
import re
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from ...attention import scaled_dot_product_attention
from ._framework import Checker, Hint, checker, two_bugs

ANSWER_MARKERS: dict[str, tuple[str, ...]] = {  # exercise label -> what gives its answer away
    "ex-softmax": ("max(dim=-1, keepdim=True)", "max(-1, keepdim=True)", "sum(dim=-1, keepdim=True)"),
    "ex-score-spread": ("standard deviation of 64", "standard deviation of d_model", "variance is d_model"),
    "ex-distance-attention": ("q[..., :, None, :] - k[..., None, :, :]", "temperature $\\tau / 2$", "scale=2.0"),
    "ex-convex": ("non-negative and sum to one", "convex combination of the values, which"),
}


# ---------------------------------------------------------------- Spot the bug: a much-copied softmax

SOFTMAX_STARTER = """\
def softmax(scores):
    # find and fix the bugs
    e = torch.exp(scores - scores.max())  # subtract the max: exp never overflows
    return e / e.sum(dim=0)
"""


def _softmax(x: Tensor, *, bug: str = "") -> Tensor:
    """The softmax by hand, or the snippet's with a bug of :data:`_SOFTMAX_BUGS`, NaN read as 0 (as the case runner
    does)."""
    if bug == "no max":
        e = x.exp()
    elif bug.startswith("whole max"):
        e = (x - x.max()).exp()
    else:
        e = (x - x.max(dim=-1, keepdim=True).values).exp()
    if bug == "no keepdim":
        return e / e.sum(dim=-1)
    if bug.endswith("axis 0"):
        e = e / e.sum(dim=0, keepdim=True)
    else:
        e = e / (e.sum() if bug.endswith("all") else e.sum(dim=-1, keepdim=True))
    return e.nan_to_num(0.0, posinf=float("inf"), neginf=float("-inf"))


_SCALED = "reread 'Scaled dot-product attention': the softmax runs over each row"
_AXIS = Hint(
    "the sum runs over axis 0, which fits scores stored one example per column: each COLUMN sums to 1, while "
    f"each query's weights over the keys, the last axis, must sum to 1 ({_SCALED}).",
    "sum over the last axis, keeping it: e.sum(dim=-1, keepdim=True)",
)
_EVERYTHING = Hint(
    f"the sum adds every entry of the tensor, so all the weights together sum to 1; each row must ({_SCALED}).",
    "e.sum(dim=-1, keepdim=True)",
)
_MAXIMUM = Hint(
    "the maximum you subtract is the maximum of the WHOLE tensor: a row far below it underflows to exp(...) = 0 "
    "everywhere, and 0 / 0 is NaN. Each row needs a constant of its own (reread 'The dot product as similarity': "
    "a softmax is unchanged by a constant added to a whole row).",
    "subtract each row's own maximum, scores.max(dim=-1, keepdim=True).values",
)
_SOFTMAX_BUGS = {  # bug -> hint, for _softmax(..., bug=bug): the snippet's two bugs, alone and together
    "no max": Hint(
        "exp of a large score overflows to inf, and inf / inf is NaN. A softmax is unchanged by adding the same "
        "constant to every score of a row: reread 'The dot product as similarity'.",
        "subtract each row's maximum first: scores - scores.max(dim=-1, keepdim=True).values",
    ),
    "whole max, axis 0": two_bugs(_AXIS, _MAXIMUM),
    "whole max": _MAXIMUM,
    "whole max, all": two_bugs(_EVERYTHING, _MAXIMUM),
    "axis 0": _AXIS,
    "all": _EVERYTHING,
    "no keepdim": Hint(
        "the row sums lost their axis: of shape (..., T_q), they broadcast along the LAST axis, so key j is "
        "divided by row j's sum instead of its own row's.",
        "keep the summed axis: e.sum(dim=-1, keepdim=True)",
    ),
}


def _softmax_error_hint(error: BaseException) -> Hint | str:
    if "must match the size" in str(error):
        return Hint(
            "the row sums do not broadcast against the scores: each row's sum must keep its place as an axis of "
            "size 1.",
            "sum with keepdim=True, e.sum(dim=-1, keepdim=True), and take the maximum with keepdim=True too.",
        )
    return ""


@checker(starter=SOFTMAX_STARTER, reference=_softmax)
def check_softmax(c: Checker, softmax: Callable[[Tensor], Tensor]) -> None:
    """Check ``softmax(scores) -> weights`` over the last axis, numerically stable for every row, without torch's
    softmax. Shapes: scores (..., T_k) -> (..., T_k), with any number of axes in front (or none)."""
    g = torch.Generator().manual_seed(0)
    cases = (
        ("the snippet's own example: one row (3.0, 1.0, 0.2)", torch.tensor([3.0, 1.0, 0.2])),
        ("3 queries over 4 keys: scores (3, 4)", torch.randn(3, 4, generator=g)),
        ("4 queries over 4 keys: scores (4, 4)", torch.randn(4, 4, generator=g)),
        ("batch and heads: scores (2, 3, 4, 5)", torch.randn(2, 3, 4, 5, generator=g)),
        (
            "large scores, (1000, 1001, 1002) and (1000, 1003, 1001), do not overflow",
            torch.tensor([[1000.0, 1001.0, 1002.0], [1000.0, 1003.0, 1001.0]]),
        ),
        (
            "two queries with scores far apart (unscaled at d_k=1024: std 32)",
            torch.tensor([[60.0, 70.0, 65.0], [-95.0, -45.0, -85.0]]),
        ),
    )
    softmaxes = (
        torch.softmax,
        torch.Tensor.softmax,
        torch.special.softmax,
        torch.log_softmax,
        torch.Tensor.log_softmax,
    )
    with c.refuse_library_calls(
        *softmaxes,
        name="fixed by hand, without torch's softmax",
        hint="the exercise asks you to fix the snippet: torch's softmax (torch.softmax, F.softmax, nn.Softmax, "
        "Tensor.softmax) is what the checker compares it with.",
    ):
        c.cases(
            softmax,
            [(name, {"scores": scores}) for name, scores in cases],
            lambda scores: torch.softmax(scores, dim=-1),
            _SOFTMAX_BUGS,
            _softmax,
            hint=Hint(
                f"each query's weights over the keys must be positive and sum to 1, without overflow ({_SCALED}).",
                "e = (scores - scores.max(dim=-1, keepdim=True).values).exp(), then e / e.sum(dim=-1, keepdim=True).",
            ),
            error_hint=_softmax_error_hint,
        )


# ---------------------------------------------------------------- Predict, then run: the spread of the scores

SCORE_STD_SETUP = {"d_model": 64, "d_k": 16}
"""The exercise's sizes: X (T, d_model) and W_q, W_k (d_model, d_k), every entry drawn from N(0, 1)."""


def score_std(d_model: int, d_k: int, x_std: float = 1.0, w_std: float = 1.0) -> float:
    """The standard deviation of the scaled score (x W_q)·(x' W_k) / sqrt(d_k) of two independent inputs."""
    entry_variance = d_model * x_std**2 * w_std**2  # of one entry of q (and of k): a sum of d_model products
    return math.sqrt(d_k * entry_variance**2 / d_k)  # d_k independent products q_i k_i, then the scale


@checker(answer="value", reference=score_std(**SCORE_STD_SETUP))  # measured in test_exercises_ch01.py
def check_score_std(c: Checker, prediction: float) -> None:
    """Check ``prediction``, the standard deviation of the scaled scores q·k / sqrt(d_k) when q = x W_q and
    k = x' W_k with x, x' of d_model = 64 and W_q, W_k of shape (64, 16), every entry drawn from N(0, 1)."""
    d_model, d_k = SCORE_STD_SETUP["d_model"], SCORE_STD_SETUP["d_k"]
    expected = score_std(d_model, d_k)
    bugs = {
        1.0: "1 is the chapter's answer for q and k whose entries have variance 1. Here they do not: each entry of "
        "q = x W_q is itself a sum of d_model products.",
        math.sqrt(d_model): f"sqrt(d_model) = {math.sqrt(d_model):g} is the std of one entry of q (or k). A score "
        "multiplies an entry of q by one of k and sums d_k such products, then divides by sqrt(d_k).",
        expected * math.sqrt(d_k): "that is the std before the division by sqrt(d_k): the scaled scores are "
        "sqrt(d_k) times smaller.",
        expected**2: "that is the variance; the question asks for the standard deviation.",
    }
    c.case(
        f"std of q·k / sqrt(d_k), d_model={d_model}, d_k={d_k}, unit-variance x and W",
        lambda: prediction,
        expected,
        bugs=bugs,
        hint=Hint(
            "apply the argument of 'Why divide by √d_k? Measure it' twice: first to one entry of q = x W_q, a sum "
            "of d_model products, then to the score, a sum of d_k products q_i k_i.",
            "an entry of q is a sum of d_model products of independent unit-variance numbers, so its variance is "
            "d_model; the same for k. A score sums d_k products q_i k_i, each of variance d_model · d_model, so its "
            "variance is d_k · d_model²; dividing by sqrt(d_k) leaves d_model², a standard deviation of d_model.",
        ),
        atol=0.1 * expected,
    )


# ---------------------------------------------------------------- Extend: attention by distance


def _squared_distances(q: Tensor, k: Tensor) -> Tensor:
    """||q_i - k_j||² for every query and key: (..., T_q, d), (..., T_k, d) -> (..., T_q, T_k)."""
    return (q[..., :, None, :] - k[..., None, :, :]).pow(2).sum(-1)


def reference_distance_attention(q: Tensor, k: Tensor, v: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """Attention with scores -||q_i - k_j||² / temperature: the nearest key gets the most weight."""
    weights = torch.softmax(-_squared_distances(q, k) / temperature, dim=-1)
    return weights @ v, weights


def _wrong_distance_attention(
    q: Tensor, k: Tensor, v: Tensor, temperature: float, *, bug: str
) -> tuple[Tensor, Tensor]:
    d2 = _squared_distances(q, k)
    scores = {
        "farthest": lambda: d2 / temperature,
        "distance": lambda: -d2.sqrt() / temperature,
        "times temperature": lambda: -d2 * temperature,
        "dot product": lambda: q @ k.transpose(-2, -1) / temperature,
        "over queries": lambda: -d2 / temperature,
    }[bug]()
    weights = torch.softmax(scores, dim=-2 if bug == "over queries" else -1)
    return weights @ v, weights


_DISTANCE_SCORE = "-||q_i - k_j||² / temperature"
_DISTANCE_BUGS = {  # bug -> hint, for _wrong_distance_attention(..., bug=bug)
    "farthest": Hint(
        "the score grows with the distance, so the FARTHEST key wins; the nearest key must score highest.",
        f"use minus the squared distance, {_DISTANCE_SCORE}.",
    ),
    "distance": Hint(
        "that is minus the distance; the exercise scores with minus the SQUARED distance (as a Gaussian kernel "
        "does), which is what ties it to the dot product.",
        "square the distances: -(q[..., :, None, :] - k[..., None, :, :]).pow(2).sum(-1) / temperature.",
    ),
    "times temperature": Hint(
        "your temperature multiplies the scores; a temperature divides them (reread 'From a hard lookup to a soft "
        "one').",
        "divide the scores by the temperature, don't multiply.",
    ),
    "dot product": Hint(
        "those are dot-product scores q·k; this exercise scores a key by its distance to the query.",
        f"{_DISTANCE_SCORE}, from the differences q[..., :, None, :] - k[..., None, :, :].",
    ),
    "over queries": Hint(
        "the softmax runs over the queries; each query's weights must sum to 1 over the keys (reread 'Scaled "
        "dot-product attention').",
        "softmax over the last axis, dim=-1.",
    ),
}


def _distance_by_dot_products(q: Tensor, k: Tensor, v: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """The library's attention: -||q - k||² = 2 q·k - ||k||² - ||q||², and a softmax ignores ||q||², one per row."""
    bias = -(k * k).sum(-1)[..., None, :] / temperature
    return scaled_dot_product_attention(q, k, v, scale=2 / temperature, bias=bias)


_PACKAGE_DIRS = (Path(torch.__file__).resolve().parent, Path(__file__).resolve().parent)


def _raised_on_dot_T(error: BaseException) -> bool:
    """Whether the answer's line that raised ``error`` (its last frame outside torch and the checkers) uses ``.T``."""
    frames = traceback.extract_tb(error.__traceback__)
    answer = (f for f in reversed(frames) if not any(d in Path(f.filename).resolve().parents for d in _PACKAGE_DIRS))
    line = next((f.line or "" for f in answer), "")
    return re.search(r"\.T\b", line) is not None


def _distance_error_hint(error: BaseException) -> Hint:
    if _raised_on_dot_T(error) or re.search(r"`?x\.T`? on tensors", str(error)):
        return Hint(
            "k.T reverses ALL the axes of a batched k, not only the last two (reread 'Build it by hand, then check').",
            "use k.transpose(-2, -1) (or k.mT), which swaps only the last two.",
        )
    return Hint(
        "check each step's shapes: q (..., T_q, d), k (..., T_k, d), v (..., T_k, d_v), with any leading axes. "
        "Every query meets every key, so the pairwise differences are (..., T_q, T_k, d).",
        "give each side a new axis: q[..., :, None, :] - k[..., None, :, :] is (..., T_q, T_k, d).",
    )


@checker(reference=_distance_by_dot_products)
def check_distance_attention(c: Checker, distance_attention: Callable[..., tuple[Tensor, Tensor]]) -> None:
    """Check ``distance_attention(q, k, v, temperature) -> (out, weights)``, attention whose score for query i and
    key j is -||q_i - k_j||² / temperature.
    Shapes: q (..., T_q, d), k (..., T_k, d), v (..., T_k, d_v) -> out (..., T_q, d_v), weights (..., T_q, T_k)."""
    g = torch.Generator().manual_seed(1)
    keys = torch.tensor([[1.0, 0.1], [0.7, 0.7], [-0.7, 0.6], [-0.8, -0.4]])  # the chapter's four keys

    def draw(*shapes: tuple[int, ...]) -> tuple[Tensor, Tensor, Tensor]:  # q, k, v
        q, k, v = (torch.randn(*shape, generator=g) for shape in shapes)
        return q, k, v

    cases = [  # name, q, k, v, temperature
        ("one query, the chapter's four keys, temperature 1", torch.tensor([[1.0, 0.3]]), keys, keys, 1.0),
        ("3 queries, 5 keys, temperature 0.5", *draw((3, 4), (5, 4), (5, 2)), 0.5),
        (
            "a batch of 2: q (2, 4, 8), k (2, 6, 8), v (2, 6, 3), temperature 4",
            *draw((2, 4, 8), (2, 6, 8), (2, 6, 3)),
            4.0,
        ),
        ("batch and heads: (2, 3, 5, 4), temperature 2", *draw((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 4)), 2.0),
    ]
    c.cases(
        distance_attention,
        [(name, {"q": q, "k": k, "v": v, "temperature": t}) for name, q, k, v, t in cases],
        reference_distance_attention,
        _DISTANCE_BUGS,
        _wrong_distance_attention,
        hint=Hint(
            f"score every query against every key with {_DISTANCE_SCORE}, turn each query's scores into "
            "weights over the keys, and return the output and the weights.",
            f"weights = softmax({_DISTANCE_SCORE}) over the keys (dim=-1); return (weights @ v, weights).",
        ),
        error_hint=_distance_error_hint,
        atol=1e-4,  # ||q||² - 2 q·k + ||k||² and the direct differences round differently
    )

"""Chapter 1, attention: ``check_attention`` (scaled dot-product attention) and ``check_softmax``."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch
from torch import Tensor

from ...attention import scaled_dot_product_attention
from ...masks import causal_mask
from ._framework import Bug, Checker, checker, line_that_raised, uses_dot_T

__all__ = ["check_attention", "check_softmax"]


def _attention_bugs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Bug, ...]:
    d_k = q.shape[-1]

    def no_scale():
        return scaled_dot_product_attention(q, k, v, mask, scale=1.0)

    def wrong_axis():
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, dim=-2)
        return w @ v, w

    bugs = [
        Bug(no_scale, "the scores are not scaled: divide q @ k^T by sqrt(d_k) before the softmax."),
        Bug(
            lambda: scaled_dot_product_attention(q, k, v, mask, scale=1.0 / d_k),
            "you divide by d_k; the scale is 1 / sqrt(d_k).",
        ),
        Bug(
            wrong_axis,
            "the softmax runs over the queries (dim=-2); each query's weights over the keys must sum to 1: use dim=-1.",
        ),
    ]
    if mask is not None:
        bugs.append(
            Bug(
                lambda: scaled_dot_product_attention(q, k, v, ~mask),
                "the mask polarity is inverted: True means 'may attend', so fill -inf where the mask is False "
                "(scores.masked_fill(~mask, float('-inf'))).",
            )
        )
    return tuple(bugs)


_DOT_T_HINT = "use k.transpose(-2, -1) (not k.T) so that batch and head axes stay in front."


def _attention_error_hint(error: Exception) -> str:
    """The ``k.T`` hint only for the error ``k.T`` causes: the line that raised uses ``.T``, which on a
    batched k reverses every axis and breaks the broadcast of q @ k.T (or, in later PyTorch, raises)."""
    if uses_dot_T(line_that_raised(error)) or re.search(r"`?x\.T`? on tensors", str(error)):
        return _DOT_T_HINT
    return (
        "the error comes from inside your function: check each step's shapes against q (..., T_q, d_k), "
        "k (..., T_k, d_k), v (..., T_k, d_v) and mask (T_q, T_k), broadcast over the leading axes."
    )


@checker
def check_attention(c: Checker, attention: Callable[..., tuple[Tensor, Tensor]]) -> None:
    """Check ``attention(q, k, v, mask=None) -> (out, weights)``, scaled dot-product attention.

    Shapes: q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v), mask (True = may attend)
        -> out (..., T_q, d_v), weights (..., T_q, T_k).
    """
    g = torch.Generator().manual_seed(0)
    cases = [
        ("one query, three keys (T_q=1, T_k=3, d_k=4)", (1, 3, 4, 4), None),
        ("self-attention, batched with heads (2, 3, T=5, d_k=8)", (5, 5, 8, 8), None),
        ("cross-attention: T_q=3 queries, T_k=7 keys, d_v=6", (3, 7, 16, 6), None),
        ("large d_k=64, where the scale matters most", (4, 4, 64, 64), None),
        ("with a causal mask (True = may attend)", (5, 5, 8, 8), causal_mask(5)),
    ]
    for name, (T_q, T_k, d_k, d_v), mask in cases:
        lead = () if T_q == 1 else (2, 3)
        q = torch.randn(*lead, T_q, d_k, generator=g)
        k = torch.randn(*lead, T_k, d_k, generator=g)
        v = torch.randn(*lead, T_k, d_v, generator=g)
        expected = scaled_dot_product_attention(q, k, v, mask)
        c.case(
            name,
            lambda q, k, v, mask=None: attention(q, k, v) if mask is None else attention(q, k, v, mask=mask),
            expected,
            bugs=_attention_bugs(q, k, v, mask),
            hint="return (weights @ v, weights) with weights = softmax(q @ k.transpose(-2, -1) / sqrt(d_k), dim=-1).",
            error_hint=_attention_error_hint,
            inputs={"q": q, "k": k, "v": v} | ({} if mask is None else {"mask": mask}),
        )


@checker
def check_softmax(c: Checker, softmax: Callable[[Tensor, float], Tensor]) -> None:
    """Check ``softmax(scores, temperature) -> weights`` over the last axis, numerically stable.

    Shapes: scores (..., n) -> (..., n).
    """
    x = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, -1.0]])
    c.case(
        "temperature 1",
        lambda scores: softmax(scores, 1.0),
        torch.softmax(x, -1),
        bugs=(Bug(lambda: torch.softmax(x, 0), "normalize over the last axis (dim=-1): each row must sum to 1."),),
        hint="exp(x) / exp(x).sum(dim=-1, keepdim=True).",
        inputs={"scores": x},
    )
    c.case(
        "temperature 0.5 sharpens",
        lambda scores: softmax(scores, 0.5),
        torch.softmax(x / 0.5, -1),
        bugs=(Bug(lambda: torch.softmax(x * 0.5, -1), "divide the scores by the temperature, don't multiply."),),
        hint="divide the scores by the temperature before the exponential.",
        inputs={"scores": x},
    )
    c.case(
        "temperature 10 flattens",
        lambda scores: softmax(scores, 10.0),
        torch.softmax(x / 10.0, -1),
        hint="divide the scores by the temperature before the exponential.",
        inputs={"scores": x},
    )
    big = torch.tensor([[1000.0, 1001.0, 1002.0]])
    c.case(
        "large scores (1000, 1001, 1002) do not overflow",
        lambda scores: softmax(scores, 1.0),
        torch.softmax(big, -1),
        hint="exp(1000) overflows to inf and inf/inf is NaN: subtract the row's maximum first "
        "(softmax is unchanged by adding a constant to every score).",
        inputs={"scores": big},
    )

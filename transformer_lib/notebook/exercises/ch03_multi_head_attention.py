"""Chapter 3, multi-head attention: ``check_split_heads`` (fix a head split ported from sequence-first code),
``check_multi_head_attention`` (fix a forward pass that reshapes keys and values with the query's length) and
``check_attention_crossover`` (a prediction: the length from which attention outweighs the rest of a layer)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ...attention import MultiHeadAttention, scaled_dot_product_attention
from ._framework import Bug, Checker, bug_table, checker

__all__ = ["check_split_heads", "check_multi_head_attention", "check_attention_crossover"]


# ---------------------------------------------------------------- Spot the bug: heads folded into the batch


def _fold(x: Tensor, n_heads: int, *, bug: str = "") -> Tensor:
    """The right fold: (B, T, d_model) -> (B * n_heads, T, d_head), row b * n_heads + h = head h of example b; or a
    wrong one of :data:`_SPLIT_BUGS`: "sequence-first" is PyTorch's F.multi_head_attention_forward line, written
    for (T, B, d_model), applied to (B, T, d_model) (right for B = 1, it mixes the examples' positions beyond);
    "straight" x.view(B * n_heads, T, d_head), each "head" a run of T * d_head consecutive numbers of one example;
    "head-major" the heads in the order (n_heads, B), row h * B + b; "not folded" (B, n_heads, T, d_head)."""
    B, T, d_model = x.shape
    d_head = d_model // n_heads
    if bug == "sequence-first":
        return x.reshape(T, B * n_heads, d_head).transpose(0, 1)
    if bug == "straight":
        return x.reshape(B * n_heads, T, d_head)
    heads = x.view(B, T, n_heads, d_head).transpose(1, 2)  # (B, n_heads, T, d_head)
    if bug == "not folded":
        return heads
    if bug == "head-major":
        return heads.transpose(0, 1).reshape(n_heads * B, T, d_head)
    return heads.reshape(B * n_heads, T, d_head)


_SPLIT_BUGS = {  # bug -> hint, for _fold(..., bug=bug)
    "sequence-first": "right for a batch of one, wrong beyond: view(T, B * n_heads, d_head).transpose(0, 1) is the "
    "line for sequence-first input (T, B, d_model). On batch-first x it cuts the memory of the whole batch into T "
    "rows, so a 'head' holds positions of different examples. Split with B as its own axis first, "
    "x.view(B, T, n_heads, d_head).transpose(1, 2), then fold: .reshape(B * n_heads, T, d_head).",
    "straight": "the straight reshape with the batch folded in: x.view(B * n_heads, T, d_head) (or a reshape without "
    "transpose(1, 2)) makes each 'head' a run of T * d_head consecutive numbers, pieces of several positions with "
    "the features of every head, wrong even for one example. View as (B, T, n_heads, d_head), transpose(1, 2), "
    "then fold.",
    "head-major": "the heads are folded in the order (n_heads, B), row h * B + b. The layout is example-major, "
    "row b * n_heads + h, like PyTorch's: the unfold .view(B, n_heads, T, d_head) and a mask "
    "repeated per head (mask.repeat_interleave(n_heads, 0)) expect it. After transpose(1, 2) the "
    "axes are already (B, n_heads, T, d_head): reshape them as they are.",
    "not folded": "you return (B, n_heads, T, d_head), the library's layout; torch.bmm takes 3-D tensors: fold "
    "the two leading axes with .reshape(B * n_heads, T, d_head).",
}


@checker
def check_split_heads(c: Checker, split_heads: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``split_heads(x, n_heads)``, which folds the heads into the batch for ``torch.bmm``: row
    ``b * n_heads + h`` of the result is head h of example b, the features h * d_head to (h + 1) * d_head - 1 of
    every position.

    Shapes: x (B, T, d_model) -> (B * n_heads, T, d_head).
    """
    g = torch.Generator().manual_seed(1)
    for B, T, d_model, n_heads in ((1, 4, 8, 2), (3, 5, 12, 3), (2, 7, 16, 4)):
        x = torch.randn(B, T, d_model, generator=g)
        c.case(
            f"B={B}, T={T}, d_model={d_model}, n_heads={n_heads}",
            lambda x, n_heads: split_heads(x, n_heads),
            _fold(x, n_heads),
            bugs=bug_table(_SPLIT_BUGS, _fold, x, n_heads),
            hint="x.view(B, T, n_heads, d_head).transpose(1, 2).reshape(B * n_heads, T, d_head).",
            inputs={"x": x, "n_heads": n_heads},
        )


# ---------------------------------------------------------------- Spot the bug: keys reshaped with the query's length


def _split_batch_first(x: Tensor, n_heads: int) -> Tensor:
    B, T, d_model = x.shape
    return x.view(B, T, n_heads, d_model // n_heads).transpose(1, 2)


def _split_seq_first(x: Tensor, n_heads: int) -> Tensor:
    # Seq-first code applied to batch-first data: right for B = 1, mixes examples for B > 1.
    B, T, d_model = x.shape
    return x.reshape(T, B * n_heads, d_model // n_heads).transpose(0, 1).reshape(B, n_heads, T, d_model // n_heads)


def _split_straight(x: Tensor, n_heads: int) -> Tensor:
    B, T, d_model = x.shape
    return x.reshape(B, n_heads, T, d_model // n_heads)


_SHAPE_ERROR_WORDS = ("is invalid for input of size", "must match the size", "Expected size", "size mismatch")


def _query_length_hint(error: Exception) -> str:
    """For a shape error only with more keys than queries: the query's length used for the keys' view or reshape."""
    if any(words in str(error) for words in _SHAPE_ERROR_WORDS):
        return (
            "this fails when the keys are not as many as the queries: do you split k and v with the query's "
            "length (a T or seq_len taken from query.shape)? Read each length from the tensor being split: "
            "t.view(B, t.shape[1], n_heads, d_head), or -1 for it."
        )
    return ""


def _mha_by_hand(mha: MultiHeadAttention, query: Tensor, key: Tensor, *, bug: str) -> Tensor:
    """``mha(query, key, key)`` computed by hand with one of the bugs of :data:`_MHA_BUGS`."""
    split = {"sequence-first": _split_seq_first, "plain reshape": _split_straight}.get(bug, _split_batch_first)
    q, k, v = (split(t, mha.n_heads) for t in (mha.q_proj(query), mha.k_proj(key), mha.v_proj(key)))
    scale = 1.0 if bug == "unscaled" else None  # None: 1 / sqrt(d_head)
    out, _ = scaled_dot_product_attention(q, k, v, scale=scale)  # (B, n_heads, T_q, d_head)
    if bug not in ("no transpose", "plain reshape"):
        out = out.transpose(1, 2)
    return mha.out_proj(out.reshape(query.shape))


_MHA_BUGS = {  # bug -> hint, for _mha_by_hand(..., bug=bug)
    "sequence-first": "right for a batch of one, wrong beyond: the batch axis got mixed into the head split. "
    "Keep B as its own axis: x.view(B, T, n_heads, d_head).transpose(1, 2).",
    "unscaled": "the scores are not scaled by 1 / sqrt(d_head).",
    "no transpose": "merging heads needs transpose(1, 2) before the reshape to (B, T, d_model); "
    "a plain reshape interleaves positions and heads.",
    "plain reshape": "you split and merge the heads with a plain reshape (or a view(B * n_heads, T, d_head)): "
    "each 'head' gets pieces of several positions. Split with x.view(B, T, n_heads, d_head)"
    ".transpose(1, 2); merge with transpose(1, 2) then reshape(B, T, d_model).",
}


@checker
def check_multi_head_attention(c: Checker, mha_forward: Callable[..., Tensor]) -> None:
    """Check ``mha_forward(mha, query, key, value)`` computing multi-head attention by hand.

    It must use the projections of ``mha`` (a :class:`MultiHeadAttention`) and equal ``mha(query, key, value)``,
    for self-attention, for cross-attention (more keys than queries) and for one new query against a cache of keys.

    Shapes: query (B, T_q, d_model), key/value (B, T_k, d_model) -> (B, T_q, d_model).
    """
    torch.manual_seed(2)  # @checker restores the reader's random state afterwards
    cases = (
        ("self-attention, batch of 1", 1, 5, 5),
        ("self-attention, batch of 3", 3, 5, 5),
        ("cross-attention, T_q=4 queries, T_k=9 keys", 2, 4, 9),
        ("decoding with a cache: 1 new query, T_k=6 keys", 2, 1, 6),
    )
    for name, B, T_q, T_k in cases:
        mha = MultiHeadAttention(16, 4).eval()
        query = torch.randn(B, T_q, 16)
        key = query if T_q == T_k else torch.randn(B, T_k, 16)
        with torch.no_grad():
            c.case(
                name,
                lambda mha, query, key, value: mha_forward(mha, query, key, value),
                mha(query, key, key),
                bugs=bug_table(_MHA_BUGS, _mha_by_hand, mha, query, key),
                hint="project with mha.q_proj/k_proj/v_proj, split into heads (each tensor with its own length), "
                "attend with scale 1/sqrt(d_head), merge heads (transpose(1, 2) then reshape), then mha.out_proj.",
                error_hint="" if T_q == T_k else _query_length_hint,
                inputs={"mha": mha, "query": query, "key": key, "value": key},
            )


# ---------------------------------------------------------------- Predict, then run: where attention starts to dominate

CROSSOVER_SETUP = {"d_model": 384, "n_heads": 12, "d_ff": 1536}
"""all-MiniLM-L6-v2's encoder layer: d_model 384, 12 heads, a feed-forward layer of width 1536."""


def attention_crossover(d_model: int, d_ff: int) -> float:
    """The length T at which an encoder layer's attention products cost as many multiply-adds as the rest of it.

    The scores Q K^T and the weighted sum of the values cost T² d_model each (summed over the heads, whatever
    their number); the four projections 4 T d_model², the feed-forward layer's two products 2 T d_model d_ff.
    2 T² d_model = 4 T d_model² + 2 T d_model d_ff at T = 2 d_model + d_ff.
    """
    return float(2 * d_model + d_ff)


@checker(answer="value")
def check_attention_crossover(c: Checker, prediction: float) -> None:
    """Check ``prediction``, the sequence length T at which the attention products (scores and weighted sum of the
    values) of all-MiniLM-L6-v2's encoder layer (d_model 384, 12 heads, d_ff 1536) cost as many multiply-adds as
    the four projections and the feed-forward layer together."""
    d_model, n_heads, d_ff = (CROSSOVER_SETUP[k] for k in ("d_model", "n_heads", "d_ff"))
    expected = attention_crossover(d_model, d_ff)
    c.case(
        f"T where attention costs as much as the rest, d_model={d_model}, {n_heads} heads, d_ff={d_ff}",
        lambda: prediction,
        expected,
        bugs=(
            Bug(
                lambda: float(2 * d_model),
                f"{2 * d_model} = 2 d_model is where attention overtakes the four projections alone (the chapter's "
                "table). The feed-forward layer belongs to the rest too: it adds 2 T d_model d_ff.",
            ),
            Bug(
                lambda: float(d_ff),
                f"{d_ff}: count the feed-forward layer as two products, (T, d_model) x (d_model, d_ff) and back, "
                "2 T d_model d_ff in all, and the four projections as well.",
            ),
            Bug(
                lambda: 2 * expected,
                "attention has two products of T² d_model each, the scores Q K^T and the weights times V: "
                "2 T² d_model, not T² d_model.",
            ),
            Bug(
                lambda: expected * n_heads,
                "the heads do not change the count: n_heads heads of size d_head = d_model / n_heads do "
                "n_heads T² d_head = T² d_model multiply-adds per product.",
            ),
        ),
        hint="attention costs 2 T² d_model (scores and weighted sum), the rest 4 T d_model² (projections) plus "
        "2 T d_model d_ff (feed-forward). Divide both sides by 2 T d_model and solve for T.",
        atol=50.0,
    )

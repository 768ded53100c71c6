"""Chapter 3, multi-head attention: ``check_split_heads`` and ``check_multi_head_attention``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ...attention import MultiHeadAttention, scaled_dot_product_attention
from ._framework import Bug, Checker, checker

__all__ = ["check_split_heads", "check_multi_head_attention"]


def _split_batch_first(x: Tensor, n_heads: int) -> Tensor:
    B, T, d_model = x.shape
    return x.view(B, T, n_heads, d_model // n_heads).transpose(1, 2)


def _split_seq_first_bug(x: Tensor, n_heads: int) -> Tensor:
    # Seq-first code applied to batch-first data: right for B = 1, mixes examples for B > 1.
    B, T, d_model = x.shape
    return x.reshape(T, B * n_heads, d_model // n_heads).transpose(0, 1).reshape(B, n_heads, T, d_model // n_heads)


def _split_flattened_bug(x: Tensor, n_heads: int) -> Tensor:
    # x.view(B * n_heads, T, d_head), or reshape(-1, T, d_head): the batch flattened into the heads, and
    # each (T, d_model) block cut into n_heads pieces along the sequence instead of the features.
    B, T, d_model = x.shape
    return x.reshape(B * n_heads, T, d_model // n_heads)


_FLATTENED_HINT = (
    "you flattened the batch into the heads: x.view(B * n_heads, T, d_head) (or reshape(-1, T, d_head)) "
    "mixes examples and cuts each sequence along the positions, not the features. Keep B and n_heads as "
    "their own axes: x.view(B, T, n_heads, d_head).transpose(1, 2), shape (B, n_heads, T, d_head)."
)

_BATCH_HINT = (
    "right for a batch of one, wrong beyond: the batch axis got mixed into the head split. "
    "Keep B as its own axis: x.view(B, T, n_heads, d_head).transpose(1, 2)."
)


@checker
def check_split_heads(c: Checker, split_heads: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``split_heads(x, n_heads)``. Shapes: x (B, T, d_model) -> (B, n_heads, T, d_head)."""
    g = torch.Generator().manual_seed(1)
    for B, T, d_model, n_heads in ((1, 4, 8, 2), (3, 5, 12, 3), (2, 7, 16, 4)):
        x = torch.randn(B, T, d_model, generator=g)
        c.case(
            f"B={B}, T={T}, d_model={d_model}, n_heads={n_heads}",
            lambda x, n_heads: split_heads(x, n_heads),
            _split_batch_first(x, n_heads),
            bugs=(
                Bug(lambda x=x, h=n_heads: _split_seq_first_bug(x, h), _BATCH_HINT),
                Bug(lambda x=x, h=n_heads: _split_flattened_bug(x, h), _FLATTENED_HINT),
                Bug(
                    lambda x=x, h=n_heads: x.reshape(x.shape[0], h, x.shape[1], -1),
                    "right shape, wrong values: reshaping straight to (B, n_heads, T, d_head) cuts the sequence, "
                    "not the features. View as (B, T, n_heads, d_head) first, then transpose(1, 2).",
                ),
            ),
            hint="x.view(B, T, n_heads, d_head).transpose(1, 2).",
            inputs={"x": x, "n_heads": n_heads},
        )


def _query_length_hint(error: Exception) -> str:
    """For an error only with more keys than queries: the query's length used for the keys' view or reshape."""
    if "is invalid for input of size" in str(error) or "must match the size" in str(error):
        return (
            "this fails when there are more keys than queries: do you reshape k and v with the query's "
            "length? Use key.shape[1] (T_k) for them."
        )
    return ""


@checker
def check_multi_head_attention(c: Checker, mha_forward: Callable[..., Tensor]) -> None:
    """Check ``mha_forward(mha, query, key, value)`` computing multi-head attention by hand.

    It must use the projections of ``mha`` (a :class:`MultiHeadAttention`) and equal ``mha(query, key, value)``.

    Shapes: query (B, T_q, d_model), key/value (B, T_k, d_model) -> (B, T_q, d_model).
    """
    torch.manual_seed(2)  # @checker restores the reader's random state afterwards
    cases = (
        ("self-attention, batch of 1", 1, 5, 5),
        ("self-attention, batch of 3", 3, 5, 5),
        ("cross-attention, T_q=4 queries, T_k=9 keys", 2, 4, 9),
    )
    for name, B, T_q, T_k in cases:
        mha = MultiHeadAttention(16, 4).eval()
        query = torch.randn(B, T_q, 16)
        key = query if T_q == T_k else torch.randn(B, T_k, 16)

        def variant(split=_split_batch_first, scale=None, transpose_back=True, mha=mha, query=query, key=key):
            q = split(mha.q_proj(query), 4)
            k, v = split(mha.k_proj(key), 4), split(mha.v_proj(key), 4)
            out, _ = scaled_dot_product_attention(q, k, v, scale=scale)  # (B, n_heads, T_q, d_head)
            out = out.transpose(1, 2) if transpose_back else out
            return mha.out_proj(out.reshape(query.shape))

        with torch.no_grad():
            c.case(
                name,
                lambda mha, query, key, value: mha_forward(mha, query, key, value),
                mha(query, key, key),
                bugs=(
                    Bug(lambda v=variant: v(split=_split_seq_first_bug), _BATCH_HINT),
                    Bug(lambda v=variant: v(scale=1.0), "the scores are not scaled by 1 / sqrt(d_head)."),
                    Bug(
                        lambda v=variant: v(transpose_back=False),
                        "merging heads needs transpose(1, 2) before the reshape to (B, T, d_model); "
                        "a plain reshape interleaves positions and heads.",
                    ),
                    Bug(lambda v=variant: v(split=_split_flattened_bug, transpose_back=False), _FLATTENED_HINT),
                    Bug(lambda v=variant: v(split=_split_flattened_bug), _FLATTENED_HINT),
                ),
                hint="project with mha.q_proj/k_proj/v_proj, split into heads, attend with scale 1/sqrt(d_head), "
                "merge heads (transpose(1, 2) then reshape), then mha.out_proj.",
                error_hint="" if T_q == T_k else _query_length_hint,
                inputs={"mha": mha, "query": query, "key": key, "value": key},
            )

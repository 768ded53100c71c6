"""Chapter 2, masking: ``check_causal_mask``, ``check_padding_mask`` and ``check_prefix_lm_mask``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ...masks import causal_mask, padding_mask, prefix_lm_mask
from ._framework import Bug, Checker, checker

__all__ = ["check_causal_mask", "check_padding_mask", "check_prefix_lm_mask"]


@checker
def check_causal_mask(c: Checker, make_mask: Callable[[int], Tensor]) -> None:
    """Check ``make_mask(T) -> (T, T)`` boolean, True where query i may attend to key j (j <= i)."""
    for T in (1, 4, 9):
        expected = causal_mask(T)
        ones = torch.ones(T, T, dtype=torch.bool)
        c.case(
            f"T={T}",
            lambda T=T: make_mask(T),
            expected,
            bugs=(
                Bug(
                    lambda e=expected, T=T: ~e | torch.eye(T, dtype=torch.bool),
                    "this mask lets each position see the future and hides the past: True means 'may attend', "
                    "so keep the lower triangle (torch.tril).",
                ),
                Bug(  # before the polarity: for T=1 the masked diagonal is all of ~expected
                    lambda ones=ones: torch.tril(ones, diagonal=-1),
                    "the diagonal is masked: a position must be allowed to attend to itself; "
                    "use torch.tril(...) with diagonal=0.",
                ),
                Bug(lambda e=expected: ~e, "the polarity is inverted: True must mean 'may attend'."),
            ),
            hint="torch.tril(torch.ones(T, T, dtype=torch.bool)).",
        )


@checker
def check_padding_mask(c: Checker, make_mask: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``make_mask(tokens, pad_id) -> (B, 1, 1, T)`` boolean, True for real tokens."""
    for pad_id, tokens in (
        (0, torch.tensor([[5, 6, 7, 0, 0], [8, 9, 0, 0, 0]])),
        (3, torch.tensor([[1, 2, 3, 3], [4, 5, 6, 7], [3, 3, 3, 3]])),
    ):
        expected = padding_mask(tokens, pad_id)
        c.case(
            f"pad_id={pad_id}, batch of {tokens.shape[0]}",
            lambda tokens, pad_id: make_mask(tokens, pad_id),
            expected,
            bugs=(
                Bug(
                    lambda e=expected: ~e,
                    "the polarity is inverted: True marks real tokens (may attend), False marks padding.",
                ),
                Bug(
                    lambda e=expected: e[:, 0, 0],
                    "right values, but shape (B, T) does not broadcast over heads "
                    "and queries: add two axes, mask[:, None, None, :].",
                ),
            ),
            hint="(tokens != pad_id)[:, None, None, :].",
            inputs={"tokens": tokens, "pad_id": pad_id},
        )


@checker
def check_prefix_lm_mask(c: Checker, make_mask: Callable[[int, int], Tensor]) -> None:
    """Check ``make_mask(T, prefix_len) -> (T, T)`` boolean: the first ``prefix_len`` keys are visible to
    every query, the rest causally (True = may attend)."""
    for T, p in ((5, 2), (7, 3), (4, 0), (4, 4)):
        expected = prefix_lm_mask(T, p)
        causal = causal_mask(T)
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        name = f"T={T}, prefix_len={p}" + {0: " (no prefix: causal)", T: " (all prefix: bidirectional)"}.get(p, "")
        c.case(
            name,
            lambda T=T, p=p: make_mask(T, p),
            expected,
            bugs=(
                Bug(lambda e=expected: ~e, "the polarity is inverted: True must mean 'may attend'."),
                Bug(
                    lambda causal=causal, i=i, p=p: causal | (i < p),
                    "the prefix queries see the whole sequence, targets included: the prefix is bidirectional "
                    "only inside itself. Add the prefix as columns (keys j < prefix_len), not as rows.",
                ),
                Bug(
                    lambda causal=causal, j=j, p=p: causal | (j <= p),
                    "off by one: the prefix holds positions 0 .. prefix_len - 1, so use j < prefix_len.",
                ),
                Bug(
                    lambda causal=causal, j=j, p=p: causal & (j < p),
                    "combine with OR (|), not AND: a key is visible when it is in the past OR in the prefix.",
                ),
                Bug(
                    lambda i=i, j=j, p=p: (i < p) & (j < p),
                    "only the prefix block is allowed: the positions after the prefix must still attend "
                    "causally (OR the prefix block with the causal mask).",
                ),
            ),
            hint="causal | in_prefix, with causal = torch.tril(torch.ones(T, T, dtype=torch.bool)) and "
            "in_prefix = (torch.arange(T) < prefix_len)[None, :].",
        )

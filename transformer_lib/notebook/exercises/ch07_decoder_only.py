"""Chapter 7, decoder-only models and sampling: ``check_top_k_filter`` and ``check_top_p_filter``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ... import sampling
from ._framework import Bug, Checker, checker

__all__ = ["check_top_k_filter", "check_top_p_filter"]


def _k_beyond_the_vocabulary_hint(error: Exception) -> str:
    """The min(k, V) hint only for the error topk raises when k exceeds the vocabulary."""
    if "out of range" in str(error):
        return "k may be larger than the vocabulary: use min(k, logits.shape[-1])."
    return ""


@checker
def check_top_k_filter(c: Checker, top_k_filter: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``top_k_filter(logits, k)``: keep the ``k`` largest logits of each row, set the rest to -inf.

    Shapes: logits (B, V) -> (B, V).
    """
    g = torch.Generator().manual_seed(4)
    cases = (
        ("one row, k=2", torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2),
        ("a batch of 3 rows, k=5 of 10", torch.randn(3, 10, generator=g), 5),
        ("k=1 is greedy", torch.randn(2, 6, generator=g), 1),
        ("k larger than the vocabulary keeps everything", torch.randn(2, 4, generator=g), 10),
    )
    for name, logits, k in cases:
        kth = logits.topk(min(k, logits.shape[-1]), dim=-1).values[..., -1:]
        c.case(
            name,
            lambda logits, k: top_k_filter(logits, k),
            sampling.top_k_filter(logits, k),
            bugs=(
                Bug(
                    lambda logits=logits, kth=kth: logits.masked_fill(logits < kth, 0.0),
                    "masked logits must become -inf, not 0: a logit of 0 still has probability e^0 / Z.",
                ),
                Bug(
                    lambda logits=logits, kth=kth: logits.masked_fill(logits >= kth, float("-inf")),
                    "the comparison is flipped: you removed the k best tokens and kept the rest.",
                ),
                Bug(
                    lambda logits=logits, k=k: logits.masked_fill(
                        logits < logits.flatten().topk(min(k, logits.numel())).values[-1], float("-inf")
                    ),
                    "the k-th largest value must be found per row (topk(..., dim=-1)), not over the whole batch.",
                ),
            ),
            hint="kth = logits.topk(k, dim=-1).values[..., -1:]; logits.masked_fill(logits < kth, float('-inf')).",
            error_hint=_k_beyond_the_vocabulary_hint,
            inputs={"logits": logits, "k": k},
        )


@checker
def check_top_p_filter(c: Checker, top_p_filter: Callable[[Tensor, float], Tensor]) -> None:
    """Check ``top_p_filter(logits, p)``: keep the smallest set of most likely tokens whose probability reaches ``p``.

    Shapes: logits (B, V) -> (B, V), dropped tokens set to -inf; the most likely token is always kept.
    """
    g = torch.Generator().manual_seed(5)
    logits1 = torch.log(torch.tensor([[0.05, 0.5, 0.3, 0.15]]))
    cases = (
        ("probabilities (0.05, 0.5, 0.3, 0.15), p=0.7", logits1, 0.7),
        ("same, p=0.5: the top token alone reaches p", logits1, 0.5),
        ("same, p=0.3: the top token is kept even beyond p", logits1, 0.3),
        ("a batch of 3 rows of 12, p=0.9", torch.randn(3, 12, generator=g) * 2, 0.9),
        ("p=1.0 keeps everything", torch.randn(2, 5, generator=g), 1.0),
    )

    def exclusive_bug(logits: Tensor, p: float) -> Tensor:  # drops the token that crosses p
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        drop_sorted = sorted_logits.softmax(-1).cumsum(-1) > p
        return logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))

    def unsorted_bug(logits: Tensor, p: float) -> Tensor:  # cumulative sum in vocabulary order
        probs = logits.softmax(-1)
        return logits.masked_fill(probs.cumsum(-1) - probs >= p, float("-inf"))

    for name, logits, p in cases:
        c.case(
            name,
            lambda logits, p: top_p_filter(logits, p),
            sampling.top_p_filter(logits, p),
            bugs=(
                Bug(
                    lambda logits=logits, p=p: exclusive_bug(logits, p),
                    "you drop the token that makes the total cross p; nucleus sampling keeps it (keep a token "
                    "when the probability of the tokens ranked above it is still below p).",
                ),
                Bug(
                    lambda logits=logits, p=p: unsorted_bug(logits, p),
                    "sort the probabilities in descending order before the cumulative sum; in vocabulary "
                    "order the 'nucleus' is arbitrary tokens.",
                ),
            ),
            hint="sort descending, cumulative probabilities, drop a token when the mass ranked above it is >= p, "
            "then scatter the drop mask back to vocabulary order.",
            inputs={"logits": logits, "p": p},
        )

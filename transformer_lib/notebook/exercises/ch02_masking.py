"""Chapter 2, masking: ``check_decoder_mask`` (fix a causal + padding mask ported from PyTorch code),
``check_cheating_positions`` (a prediction: how many positions copy their target under a prefix-LM mask) and
``check_packed_mask`` (a mask for several documents packed into one row)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ...masks import causal_mask, combine_masks, padding_mask, prefix_lm_mask
from ._framework import Bug, Checker, bug_table, checker

__all__ = ["check_decoder_mask", "check_cheating_positions", "check_packed_mask"]


# ---------------------------------------------------------------- Spot the bug: a decoder mask ported from PyTorch


def _decoder_mask_bugs(tokens: Tensor, pad_id: int) -> tuple[Bug, ...]:
    """The wrong combinations of a causal part and a padding part, each with a hint naming what is wrong."""
    T = tokens.shape[1]
    ones = torch.ones(T, T, dtype=torch.bool)
    real = tokens != pad_id  # (B, T)
    causal_parts = {  # (T, T), and what is wrong with it (None: right)
        "right": (torch.tril(ones), None),
        "future": (
            torch.triu(ones, diagonal=1),
            "triu(..., diagonal=1) is True on the FUTURE keys, the convention of nn.MultiheadAttention and "
            "nn.Transformer (True = blocked); here True means 'may attend': the lower triangle, torch.tril",
        ),
        "strict": (
            torch.tril(ones, diagonal=-1),
            "the diagonal is masked: a position may attend to itself (torch.tril with diagonal=0)",
        ),
    }
    padding_parts = {  # broadcastable to (B, 1, T, T), and what is wrong with it (None: right)
        "keys": (real[:, None, None, :], None),
        "queries": (
            real[:, None, :, None],
            "the padding is on the QUERY axis, (B, 1, T, 1): that empties the rows of the padding positions, which "
            "nobody needs; the padding must be hidden from every query as KEYS, (B, 1, 1, T), and only as keys",
        ),
        "both": (
            real[:, None, :, None] & real[:, None, None, :],
            "you hide the padding queries as well as the padding keys; hide only the keys: emptied rows are NaN "
            "with a plain softmax",
        ),
        "inverted": (
            (~real)[:, None, None, :],
            "the padding part is inverted: tokens != pad_id marks the real tokens, which may be attended to",
        ),
        "none": (torch.ones_like(real)[:, None, None, :], "the padding keys are not hidden"),
    }
    bugs = []
    for causal, causal_hint in causal_parts.values():
        for padding, padding_hint in padding_parts.values():
            if causal_hint is None and padding_hint is None:
                continue
            both = "Two bugs: " if causal_hint and padding_hint else ""
            hint = both + "; and ".join(h for h in (causal_hint, padding_hint) if h) + "."
            bugs.append(Bug(lambda causal=causal, padding=padding: causal & padding, hint))
    expected = combine_masks(causal_mask(T), padding_mask(tokens, pad_id))
    bugs.append(
        Bug(
            lambda: expected[:, 0],
            "right values, but shape (B, T, T) does not broadcast over the heads: keep the head axis, (B, 1, T, T).",
        )
    )
    return tuple(bugs)


@checker
def check_decoder_mask(c: Checker, decoder_mask: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``decoder_mask(tokens, pad_id) -> (B, 1, T, T)`` boolean: True where query i may attend to key j,
    that is j <= i and token j is not padding.

    Shapes: tokens (B, T) -> (B, 1, T, T).
    """
    cases = (
        ("no padding: one sequence of 4 tokens", torch.tensor([[5, 6, 7, 8]]), 0),
        ("right padding, pad_id=0", torch.tensor([[5, 6, 7, 0, 0], [8, 9, 3, 4, 1]]), 0),
        ("left padding, as for batched generation, pad_id=0", torch.tensor([[0, 0, 4, 6, 1], [0, 5, 3, 8, 2]]), 0),
        ("left and right padding, pad_id=3", torch.tensor([[3, 1, 2, 3], [4, 5, 6, 7], [3, 3, 8, 9]]), 3),
    )
    for name, tokens, pad_id in cases:
        c.case(
            name,
            lambda tokens, pad_id: decoder_mask(tokens, pad_id),
            combine_masks(causal_mask(tokens.shape[1]), padding_mask(tokens, pad_id)),
            bugs=_decoder_mask_bugs(tokens, pad_id),
            hint="causal & not_padding, with causal = torch.tril(torch.ones(T, T, dtype=torch.bool)) and the "
            "padding keys hidden: not_padding = (tokens != pad_id)[:, None, None, :].",
            inputs={"tokens": tokens, "pad_id": pad_id},
        )


# ---------------------------------------------------------------- Predict, then run: positions that cheat

CHEATING_SETUP = {"T_in": 7, "prefix_len": 4}
"""The exercise's model: chapter 2's TinyLM on T_in = 7 input tokens (targets shifted by one), with
prefix_lm_mask(7, 4) instead of the causal mask."""


def cheating_positions(T_in: int, prefix_len: int) -> int:
    """The positions t whose target, input token t + 1, the prefix-LM mask lets query t attend to."""
    mask = prefix_lm_mask(T_in, prefix_len)
    return sum(bool(mask[t, t + 1]) for t in range(T_in - 1))  # the last target is not among the inputs


@checker(answer="value")
def check_cheating_positions(c: Checker, prediction: int) -> None:
    """Check ``prediction``, the number of positions (of 7) at which chapter 2's TinyLM, trained on random tokens
    with ``prefix_lm_mask(7, prefix_len=4)`` instead of the causal mask, learns to copy its target."""
    T_in, prefix_len = CHEATING_SETUP["T_in"], CHEATING_SETUP["prefix_len"]
    expected = float(cheating_positions(T_in, prefix_len))
    c.case(
        f"positions that can see their target, {T_in} inputs, prefix_len={prefix_len}",
        lambda: prediction,
        expected,
        bugs=(
            Bug(
                lambda: 0.0,
                "the prefix is bidirectional: a query inside it sees the LATER prefix tokens too, and the next "
                "token is one of them.",
            ),
            Bug(
                lambda: float(prefix_len),
                f"off by one: the last prefix position, {prefix_len - 1}, has its target at position {prefix_len}, "
                "after the prefix, where it cannot look.",
            ),
            Bug(
                lambda: float(T_in - 1),
                "that is the unmasked model's count: after the prefix the mask is causal, and a causal query cannot "
                "see the next token.",
            ),
        ),
        hint="the target of position t is input token t + 1, so position t can copy it exactly when the mask lets "
        "query t attend to key t + 1. Under the prefix-LM mask that happens when t + 1 is inside the prefix: "
        "t + 1 < prefix_len.",
        atol=0.4,
    )


# ---------------------------------------------------------------- Extend: packed documents


def reference_packed_mask(doc_ids: Tensor) -> Tensor:
    """Causal within each document, nothing across documents. doc_ids (B, T) -> (B, 1, T, T)."""
    same = doc_ids[:, :, None] == doc_ids[:, None, :]  # (B, T_q, T_k)
    return (same & causal_mask(doc_ids.shape[1], device=doc_ids.device))[:, None]


def _wrong_packed_mask(doc_ids: Tensor, *, bug: str) -> Tensor:
    """A packed mask with one of the bugs of :data:`_PACKED_BUGS`. Shapes: doc_ids (B, T) -> (B, 1, T, T) or
    (B, T, T)."""
    if bug == "inverted":
        return ~reference_packed_mask(doc_ids)
    if bug == "no head axis":
        return reference_packed_mask(doc_ids)[:, 0]
    if bug == "not causal":
        return (doc_ids[:, :, None] == doc_ids[:, None, :])[:, None]
    causal = causal_mask(doc_ids.shape[1])  # "one document"
    return causal.expand(doc_ids.shape[0], 1, *causal.shape)


_PACKED_BUGS = {  # bug -> hint, for _wrong_packed_mask(..., bug=bug)
    "inverted": "the polarity is inverted: True must mean 'may attend'.",
    "not causal": "a document's tokens see their own future: AND the same-document mask with the causal mask.",
    "one document": "the documents see each other: the causal mask lets a token attend to the documents before "
    "its own. AND it with a same-document mask, doc_ids[:, :, None] == doc_ids[:, None, :].",
    "no head axis": "right values, but shape (B, T, T) does not broadcast over the heads: add the head axis, "
    "mask[:, None].",
}


@checker
def check_packed_mask(c: Checker, packed_mask: Callable[[Tensor], Tensor]) -> None:
    """Check ``packed_mask(doc_ids) -> (B, 1, T, T)`` boolean: True where query i may attend to key j, that is
    j <= i and positions i and j belong to the same document (``doc_ids[b, i] == doc_ids[b, j]``).

    Shapes: doc_ids (B, T) integer ids, each document a contiguous run -> (B, 1, T, T).
    """
    cases = (
        ("one row, documents of lengths 3, 2, 3", torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]])),
        ("a batch of 2 rows, any ids", torch.tensor([[7, 7, 3, 3, 3, 3, 9, 9], [1, 1, 1, 1, 1, 2, 2, 2]])),
        ("one document: the causal mask", torch.tensor([[4, 4, 4, 4, 4]])),
        ("every token its own document", torch.tensor([[0, 1, 2, 3]])),
    )
    for name, doc_ids in cases:
        c.case(
            name,
            lambda doc_ids: packed_mask(doc_ids),
            reference_packed_mask(doc_ids),
            bugs=bug_table(_PACKED_BUGS, _wrong_packed_mask, doc_ids),
            hint="compare every query's document with every key's, doc_ids[:, :, None] == doc_ids[:, None, :] "
            "(B, T_q, T_k), AND it with the causal mask, and add the head axis: (B, 1, T, T).",
            inputs={"doc_ids": doc_ids},
        )

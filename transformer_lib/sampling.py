"""Turning next-token logits into a token: greedy, temperature, top-k, top-p (chapter 7)."""

from __future__ import annotations

import torch
from torch import Tensor

from ._validate import _validate_int, _validate_real, _validate_tensor


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest logits of each row, set the others to -inf.

    Shapes: logits (B, V) -> (B, V).

    Defined in chapter 7, Decoder-only.
    """
    k = min(_validate_int("top_k", k), logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1) the k-th largest value
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering: keep the smallest set of most likely tokens whose probability reaches ``p``.

    The most likely token is always kept; ``p = 1`` keeps every token.

    Shapes: logits (B, V) -> (B, V).

    Defined in chapter 7, Decoder-only.
    """
    p = _validate_real("top_p", p, "a number in (0, 1]", lambda x: 0.0 < x <= 1.0)
    if p == 1.0:  # the float cumulative sum can reach 1 before the tail: keep everything explicitly
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    probs = torch.softmax(sorted_logits.double(), dim=-1)
    before = probs.cumsum(dim=-1) - probs  # probability mass of the tokens ranked above each one
    drop_sorted = before >= p  # a token is dropped once the tokens above it already reach p
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def sample_next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick the next token id of each row. ``temperature=0`` means greedy (argmax).

    Shapes: logits (B, V) -> (B,) long.
    """
    _validate_tensor("logits", logits, ndim=2, floating=True)
    _validate_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def _validate_sampling(temperature: object, top_k: object, top_p: object) -> None:
    """Check the sampling settings, also when greedy decoding (temperature 0) would not use them."""
    _validate_real("temperature", temperature, "a finite number >= 0 (0 = greedy)", lambda t: t >= 0)
    if top_k is not None:
        _validate_int("top_k", top_k)
    if top_p is not None:
        _validate_real("top_p", top_p, "a number in (0, 1]", lambda x: 0.0 < x <= 1.0)

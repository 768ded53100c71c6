"""Boolean attention masks (chapter 2, Masking).

Convention everywhere in this library, as in
``torch.nn.functional.scaled_dot_product_attention``: a mask is a boolean tensor,
``True`` means "may attend", and it broadcasts to ``(B, n_heads, T_q, T_k)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._validate import _validate_mask


def causal_mask(T_q: int, T_k: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Lower-triangular mask: position i may attend to j <= i.

    With ``T_k > T_q`` (decoding with a key/value cache holding ``T_k - T_q``
    earlier positions) the triangle is aligned to the bottom right, so query i
    sits at absolute position ``T_k - T_q + i``.

    Shapes: returns (T_q, T_k) bool.

    Defined in chapter 2, Masking.
    """
    T_k = T_q if T_k is None else T_k
    if T_q < 1 or T_k < T_q:
        raise ValueError(f"causal_mask needs 1 <= T_q <= T_k, got T_q={T_q}, T_k={T_k}")
    i = torch.arange(T_q, device=device)[:, None] + (T_k - T_q)  # (T_q, 1) absolute query positions
    j = torch.arange(T_k, device=device)[None, :]  # (1, T_k)
    return j <= i


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """True for real tokens, False for padding, ready to broadcast over heads and queries.

    Shapes: tokens (B, T) -> (B, 1, 1, T) bool.

    Defined in chapter 2, Masking.
    """
    if not isinstance(tokens, Tensor) or tokens.dim() != 2:
        got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"padding_mask expects token ids of shape (B, T), got {got}")
    return (tokens != pad_id)[:, None, None, :]


def prefix_lm_mask(T: int, prefix_len: int | Tensor, device: torch.device | str | None = None) -> Tensor:
    """Prefix-LM mask: the first ``prefix_len`` positions see each other (bidirectional), the rest are causal.

    ``prefix_len`` is an int, or a (B,) tensor of per-example prefix lengths.

    Shapes: returns (T, T) for an int prefix, (B, 1, T, T) for a tensor of prefixes.

    Defined in chapter 2, Masking.
    """
    j = torch.arange(T, device=device)
    if isinstance(prefix_len, Tensor):
        if prefix_len.dim() != 1:
            raise ValueError(f"prefix_len must be an int or a (B,) tensor, got shape {tuple(prefix_len.shape)}")
        if prefix_len.numel() and not (0 <= int(prefix_len.min()) and int(prefix_len.max()) <= T):
            raise ValueError(f"every prefix_len must be between 0 and T={T}, got {prefix_len.tolist()}")
        in_prefix = j[None, :] < prefix_len.to(j.device)[:, None]  # (B, T) key j is in the prefix
        return causal_mask(T, device=device)[None, None] | in_prefix[:, None, None, :]
    if not 0 <= prefix_len <= T:
        raise ValueError(f"prefix_len must be between 0 and T={T}, got {prefix_len}")
    return causal_mask(T, device=device) | (j < prefix_len)[None, :]


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Allowed only where every mask allows: a broadcasting logical AND; ``None`` entries are skipped.

    Shapes: masks broadcastable to each other -> their broadcast shape.

    Defined in chapter 2, Masking.
    """
    result: Tensor | None = None
    for m in masks:
        if m is None:
            continue
        _validate_mask(m)
        if result is not None:
            try:
                torch.broadcast_shapes(result.shape, m.shape)
            except RuntimeError:
                raise ValueError(
                    f"masks of shapes {tuple(result.shape)} and {tuple(m.shape)} cannot broadcast to a common shape"
                ) from None
        result = m if result is None else result & m
    return result

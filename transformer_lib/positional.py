"""Position information: sinusoidal, learned and rotary (chapter 4, Positional encoding).

Self-attention alone is permutation-equivariant; these modules give it order.
``SinusoidalPositionalEncoding`` and ``LearnedPositionalEmbedding`` add a vector
per position to the token embeddings; ``RotaryEmbedding`` (RoPE) instead rotates
queries and keys inside attention, so scores depend only on the offset m - n.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._validate import _validate_tensor


def sinusoidal_encoding(max_len: int, d_model: int, base: float = 10000.0) -> Tensor:
    """The encoding of Vaswani et al.: PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(same).

    Shapes: returns (max_len, d_model), sin on even and cos on odd dimensions.

    Defined in chapter 4, Positional encoding.
    """
    if max_len < 1 or d_model < 1:
        raise ValueError(f"max_len and d_model must be positive, got max_len={max_len}, d_model={d_model}")
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (ceil(d/2),)
    angles = pos * inv_freq  # (max_len, ceil(d/2))
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.float()


def _position_ids(T: int, offset: int, positions: Tensor | None, max_len: int, owner: str) -> Tensor | slice:
    """Which rows of a (max_len, ...) table the T tokens read: ``offset .. offset + T - 1``, or ``positions``.

    Shapes: positions (T,) or (B, T) integer -> the same; without positions, a slice of length T.
    """
    if positions is None:
        if offset + T > max_len:
            raise ValueError(f"sequence positions up to {offset + T} exceed max_len={max_len} of {owner}")
        return slice(offset, offset + T)
    _validate_tensor("positions", positions, ndim=(1, 2))
    if positions.is_floating_point() or positions.dtype == torch.bool or positions.shape[-1] != T:
        raise ValueError(
            f"positions must be integer positions of shape (T,) or (B, T) with T={T}, "
            f"got dtype {positions.dtype}, shape {tuple(positions.shape)}"
        )
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= max_len):
        raise ValueError(
            f"positions must lie in [0, {max_len}) for {owner}, "
            f"got values from {int(positions.min())} to {int(positions.max())}"
        )
    return positions


class _AddPositions(nn.Module):
    """Shared forward: x + P[offset : offset + T] (or P[positions]), with a clear error past ``max_len``."""

    max_len: int
    d_model: int

    def table(self) -> Tensor:
        """The (max_len, d_model) table of position vectors."""
        raise NotImplementedError

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Add each token's position vector. ``positions`` (T,) or (B, T) overrides the contiguous ``offset``.

        Shapes: x (B, T, d_model) -> (B, T, d_model).
        """
        _validate_tensor("x", x, ndim=3, floating=True, last_dim=self.d_model)
        rows = _position_ids(x.shape[1], offset, positions, self.max_len, type(self).__name__)
        return x + self.table()[rows]  # (T, d_model) or (B, T, d_model), broadcast over B


class SinusoidalPositionalEncoding(_AddPositions):
    """Adds the fixed sinusoidal encoding; no parameters. Shapes: (B, T, d_model) -> same.

    Defined in chapter 4, Positional encoding.
    """

    def __init__(self, d_model: int, max_len: int = 5000, base: float = 10000.0) -> None:
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model, base), persistent=False)

    def table(self) -> Tensor:
        return self.pe


class LearnedPositionalEmbedding(_AddPositions):
    """Adds a learned vector per absolute position (GPT, BERT). Shapes: (B, T, d_model) -> same.

    Defined in chapter 4, Positional encoding.
    """

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * 0.02)

    def table(self) -> Tensor:
        return self.weight


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each pair (x[2i], x[2i+1]) by the angle whose cosine and sine are given.

    As complex numbers, (x[2i] + i x[2i+1]) * e^{i theta}.

    Shapes: x (..., T, d_head), cos/sin broadcastable to (..., T, d_head / 2) -> (..., T, d_head).
    """
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., T, d_head/2) each
    rotated = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (..., T, d_head/2, 2)
    return rotated.flatten(-2).type_as(x)  # (..., T, d_head)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE, Su et al.): rotates queries and keys by position.

    Pair i of a head's vector at position m turns by the angle ``m * base^(-2i/d_head)``,
    so ``rot(q, m) . rot(k, n)`` depends on m - n only.

    Shapes: x (B, n_heads, T, d_head) -> (B, n_heads, T, d_head).

    Defined in chapter 4, Positional encoding.
    """

    def __init__(self, d_head: int, max_len: int = 4096, base: float = 10000.0) -> None:
        super().__init__()
        if d_head % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions, so d_head must be even, got {d_head}")
        self.d_head, self.max_len = d_head, max_len
        inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (d_head/2,)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # (max_len, d_head/2)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Rotate by positions ``offset .. offset + T - 1``, or by ``positions`` (T,) or (B, T) when given.

        Shapes: x (B, n_heads, T, d_head) -> (B, n_heads, T, d_head).
        """
        _validate_tensor("x", x, floating=True, last_dim=self.d_head)
        rows = _position_ids(x.shape[-2], offset, positions, self.max_len, "RotaryEmbedding")
        cos, sin = self.cos[rows], self.sin[rows]  # (T, d_head/2) or (B, T, d_head/2)
        if cos.dim() == 3:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d_head/2): the same angle in every head
        return apply_rotary(x, cos, sin)

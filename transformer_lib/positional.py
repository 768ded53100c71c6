"""Position information: sinusoidal, learned and rotary (chapter 4, Positional encoding).

Self-attention alone is permutation-equivariant; these modules give it order.
``SinusoidalPositionalEncoding`` and ``LearnedPositionalEmbedding`` add a vector
per position to the token embeddings; ``RotaryEmbedding`` (RoPE) instead rotates
queries and keys inside attention, so scores depend only on the offset m - n.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._checks import check_tensor


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


class _AddPositions(nn.Module):
    """Shared forward: x + P[offset : offset + T], with a clear error past ``max_len``."""

    max_len: int
    d_model: int

    def positions(self, T: int, offset: int) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Shapes: x (B, T, d_model) -> (B, T, d_model)."""
        check_tensor("x", x, ndim=3, floating=True, last_dim=self.d_model)
        T = x.shape[1]
        if offset + T > self.max_len:
            raise ValueError(f"sequence positions up to {offset + T} exceed max_len={self.max_len} "
                             f"of {type(self).__name__}")
        return x + self.positions(T, offset)


class SinusoidalPositionalEncoding(_AddPositions):
    """Adds the fixed sinusoidal encoding; no parameters. Shapes: (B, T, d_model) -> same."""

    def __init__(self, d_model: int, max_len: int = 5000, base: float = 10000.0) -> None:
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model, base), persistent=False)

    def positions(self, T: int, offset: int) -> Tensor:
        return self.pe[offset: offset + T]  # (T, d_model)


class LearnedPositionalEmbedding(_AddPositions):
    """Adds a learned vector per absolute position (GPT, BERT). Shapes: (B, T, d_model) -> same."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * 0.02)

    def positions(self, T: int, offset: int) -> Tensor:
        return self.weight[offset: offset + T]  # (T, d_model)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each pair (x[2i], x[2i+1]) by the angle whose cosine and sine are given.

    As complex numbers, (x[2i] + i x[2i+1]) * e^{i theta}.

    Shapes: x (..., T, d_head), cos/sin (T, d_head / 2) -> (..., T, d_head).
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

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        check_tensor("x", x, floating=True, last_dim=self.d_head)
        T = x.shape[-2]
        if offset + T > self.max_len:
            raise ValueError(f"sequence positions up to {offset + T} exceed max_len={self.max_len} of RotaryEmbedding")
        return apply_rotary(x, self.cos[offset: offset + T], self.sin[offset: offset + T])

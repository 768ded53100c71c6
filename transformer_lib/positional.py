"""Position information: sinusoidal, learned, rotary and ALiBi (chapter 4, Positional encoding).

Self-attention alone is permutation-equivariant; these modules give it order.
``SinusoidalPositionalEncoding`` and ``LearnedPositionalEmbedding`` add a vector
per position to the token embeddings; ``RotaryEmbedding`` (RoPE) instead rotates
queries and keys inside attention, so scores depend only on the offset m - n;
``ALiBi`` adds a fixed penalty proportional to the distance i - j to the scores.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ._validate import _validate_int, _validate_real, _validate_tensor


def sinusoidal_encoding(max_len: int, d_model: int, base: float = 10000.0) -> Tensor:
    """The encoding of Vaswani et al.: PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(same).

    Shapes: returns (max_len, d_model), sin on even and cos on odd dimensions.

    Defined in chapter 4, Positional encoding.
    """
    max_len, d_model = _validate_int("max_len", max_len), _validate_int("d_model", d_model)
    # base <= 0 has no real powers, base = 1 gives every pair the same frequency, base < 1 reverses them
    angles = _angles(max_len, d_model, _validate_real("base", base, "a finite number > 1", lambda b: b > 1))
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.float()


def _angles(max_len: int, d: int, base: float) -> Tensor:
    """``pos * base^(-2i/d)`` for every position and pair of dimensions, in float64.

    Shapes: returns (max_len, ceil(d / 2)).
    """
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (ceil(d/2),)
    return torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq


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

    pe: Tensor  # a buffer: (max_len, d_model)

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
    if _rotate_as_complex_here(x, cos):
        return _rotate_as_complex(x, cos, sin)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., T, d_head/2) each
    rotated = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (..., T, d_head/2, 2)
    return rotated.flatten(-2).type_as(x)  # (..., T, d_head)


def _rotate_as_complex_here(x: Tensor, cos: Tensor) -> bool:
    """Whether :func:`_rotate_as_complex` may stand in for the written-out rotation: float32 on a CPU,
    in eager mode (compilers and exporters get real arithmetic; bf16 keeps the written-out roundings)."""
    return (
        x.device.type == "cpu"
        and x.dtype == cos.dtype == torch.float32
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
    )


def _rotate_as_complex(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """:func:`apply_rotary` as one complex product per pair, ``(x[2i] + i x[2i+1]) * (cos + i sin)``: the
    same outputs (tested), in one kernel on contiguous pairs instead of four on strided halves.

    Shapes: x (..., T, d_head), cos/sin broadcastable to (..., T, d_head / 2) -> (..., T, d_head).
    """
    pairs = x.reshape(*x.shape[:-1], -1, 2)  # (..., T, d_head/2, 2): (x[2i], x[2i+1]), copied if strided
    rotated = torch.view_as_complex(pairs) * torch.complex(cos, sin)  # (..., T, d_head/2) complex
    return torch.view_as_real(rotated).flatten(-2)  # (..., T, d_head)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE, Su et al.): rotates queries and keys by position.

    Pair i of a head's vector at position m turns by the angle ``m * base^(-2i/d_head)``,
    so ``rot(q, m) . rot(k, n)`` depends on m - n only.

    Shapes: x (B, n_heads, T, d_head) -> (B, n_heads, T, d_head).

    Defined in chapter 4, Positional encoding.
    """

    cos: Tensor  # buffers: (max_len, d_head/2) each
    sin: Tensor

    def __init__(self, d_head: int, max_len: int = 4096, base: float = 10000.0) -> None:
        super().__init__()
        if d_head % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions, so d_head must be even, got {d_head}")
        self.d_head, self.max_len = d_head, max_len
        angles = _angles(max_len, d_head, base)  # (max_len, d_head/2)
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


def alibi_slopes(n_heads: int) -> Tensor:
    """The fixed per-head slopes of ALiBi (Press et al. 2022), as in the paper's code.

    For n_heads a power of two: the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8)
    (8 heads: 1/2, 1/4, ..., 1/256). Otherwise the slopes of the closest smaller power of
    two n', followed by every other slope of the sequence for 2n', for the n_heads - n' heads left.

    Shapes: returns (n_heads,).

    Defined in chapter 4, Positional encoding.
    """
    n_heads = _validate_int("n_heads", n_heads)

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: Tensor, T_q: int, T_k: int, offset: int = 0) -> Tensor:
    """The additive ALiBi bias ``-m_h * (i - j)`` for query position ``i = offset + t`` and key position ``j``.

    Causal attention only uses j <= i, where the bias is <= 0 and falls linearly with the distance;
    the entries with j > i are positive and must be hidden by the causal mask. ``offset`` is the
    number of cached earlier positions, so a new query at the end of the cache gets the right distances.

    Shapes: slopes (n_heads,) -> bias (n_heads, T_q, T_k).

    Defined in chapter 4, Positional encoding.
    """
    _validate_tensor("slopes", slopes, ndim=1, floating=True)
    T_q, T_k = _validate_int("T_q", T_q), _validate_int("T_k", T_k)
    offset = _validate_int("offset", offset, minimum=0)
    i = torch.arange(offset, offset + T_q, device=slopes.device)[:, None]  # (T_q, 1) query positions
    j = torch.arange(T_k, device=slopes.device)[None, :]  # (1, T_k) key positions
    return -slopes[:, None, None] * (i - j).to(slopes.dtype)  # (n_heads, T_q, T_k)


class ALiBi(nn.Module):
    """Attention with linear biases (Press et al. 2022): no position vectors, no parameters.

    Head h adds ``-m_h * (i - j)`` to the score of query i for key j, a penalty that grows
    linearly with the distance, with the fixed slopes of :func:`alibi_slopes`. Give it to
    ``MultiHeadAttention(..., alibi=ALiBi(n_heads))`` (causal self-attention), or use
    ``GPTConfig(positional="alibi")``.

    Shapes: forward(T_q, T_k, offset) -> bias (n_heads, T_q, T_k).

    Defined in chapter 4, Positional encoding.
    """

    slopes: Tensor  # a buffer: (n_heads,)

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def forward(self, T_q: int, T_k: int, offset: int = 0) -> Tensor:
        return alibi_bias(self.slopes, T_q, T_k, offset)

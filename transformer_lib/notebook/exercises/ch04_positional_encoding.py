"""Chapter 4, positional encoding: ``check_sinusoidal_encoding`` and ``check_rope``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ...positional import RotaryEmbedding, sinusoidal_encoding
from ._framework import Bug, Checker, checker

__all__ = ["check_sinusoidal_encoding", "check_rope"]


def _sinusoidal_variant(
    max_len: int,
    d_model: int,
    base: float = 10000.0,
    swap: bool = False,
    exponent: str = "2i/d",
    concat: bool = False,
    start: int = 0,
    multiply: bool = False,
) -> Tensor:
    """The sinusoidal encoding and its classic wrong versions (for the checker's bug list)."""
    pos = torch.arange(start, start + max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    pair = torch.arange(d_model // 2, dtype=torch.float64)  # i = 0 .. d/2 - 1
    power = {"2i/d": 2 * pair / d_model, "i/d": pair / d_model, "4i/d": 4 * pair / d_model}[exponent]
    angles = pos * base**power if multiply else pos / base**power  # (max_len, d/2)
    first, second = (torch.cos(angles), torch.sin(angles)) if swap else (torch.sin(angles), torch.cos(angles))
    if concat:
        return torch.cat([first, second], dim=-1).float()
    return torch.stack([first, second], dim=-1).flatten(-2).float()  # interleaved: sin, cos, sin, cos, ...


@checker
def check_sinusoidal_encoding(c: Checker, encoding: Callable[[int, int], Tensor]) -> None:
    """Check ``encoding(max_len, d_model) -> PE`` of Vaswani et al.: PE[pos, 2i] = sin(pos / 10000^(2i/d_model)),
    PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model)).

    Shapes: returns (max_len, d_model).
    """
    v = _sinusoidal_variant
    for max_len, d_model in ((10, 8), (50, 16), (100, 64)):
        c.case(
            f"max_len={max_len}, d_model={d_model}",
            lambda n=max_len, d=d_model: encoding(n, d),
            sinusoidal_encoding(max_len, d_model),
            bugs=(
                Bug(
                    lambda n=max_len, d=d_model: v(n, d, swap=True),
                    "sin and cos are swapped: the even dimensions 2i hold the sine, the odd ones 2i+1 the cosine.",
                ),
                Bug(
                    lambda n=max_len, d=d_model: v(n, d, concat=True),
                    "sin and cos in halves: the sines fill the first d_model/2 columns and the cosines the last "
                    "d_model/2 (pe[:, :d_model//2] = sin, pe[:, d_model//2:] = cos, or torch.cat([sin, cos], -1)); "
                    "the encoding interleaves them: dimension 2i is a sine and dimension 2i+1 the cosine of the "
                    "same angle, pe[:, 0::2] = sin and pe[:, 1::2] = cos.",
                ),
                Bug(
                    lambda n=max_len, d=d_model: v(n, d, concat=True, swap=True),
                    "cos and sin in halves: the cosines fill the first d_model/2 columns and the sines the last; "
                    "the encoding interleaves them, the sine first: pe[:, 0::2] = sin and pe[:, 1::2] = cos.",
                ),
                Bug(
                    lambda n=max_len, d=d_model: v(n, d, exponent="i/d"),
                    "the exponent is i/d_model; it is 2i/d_model, with i the index of the (sin, cos) pair "
                    "(equivalently j/d_model with j = 0, 2, 4, ... the even dimension).",
                ),
                Bug(
                    lambda n=max_len, d=d_model: v(n, d, exponent="4i/d"),
                    "the exponent counts each pair twice: with j = 0, 2, 4, ... already even, use j/d_model, "
                    "not 2j/d_model.",
                ),
                Bug(
                    lambda n=max_len, d=d_model: v(n, d, multiply=True),
                    "the angle is pos DIVIDED by 10000^(2i/d_model): the wavelengths grow with i.",
                ),
                Bug(
                    lambda n=max_len, d=d_model: v(n, d, start=1),
                    "positions start at 0, not 1: the first row is sin(0) = 0, cos(0) = 1.",
                ),
                Bug(lambda n=max_len, d=d_model: v(n, d, base=1000.0), "the base is 10000, not 1000."),
            ),
            hint="angles = pos / 10000 ** (2i / d_model) for pos = 0 .. max_len-1 and i = 0 .. d_model/2 - 1; "
            "pe[:, 0::2] = sin(angles), pe[:, 1::2] = cos(angles).",
        )


def _rope_variant(
    x: Tensor,
    offset: int,
    sign: float = 1.0,
    halves: bool = False,
    concat: bool = False,
    exponent: str = "2i/d",
    base: float = 10000.0,
) -> Tensor:
    """RoPE and its classic wrong versions (for the checker's bug list). Shapes: x (..., T, d_head) -> same."""
    T, d_head = x.shape[-2], x.shape[-1]
    pair = torch.arange(d_head // 2, dtype=torch.float64)
    power = {"2i/d": 2 * pair / d_head, "i/d": pair / d_head}[exponent]
    angles = torch.arange(offset, offset + T, dtype=torch.float64)[:, None] / base**power  # (T, d_head/2)
    cos, sin = angles.cos().float(), sign * angles.sin().float()
    if halves:
        x1, x2 = x[..., : d_head // 2], x[..., d_head // 2 :]
    else:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    a, b = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    if halves or concat:
        return torch.cat([a, b], dim=-1)
    return torch.stack([a, b], dim=-1).flatten(-2)


@checker
def check_rope(c: Checker, rope: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``rope(x, offset) -> x rotated``: rotary position embedding with base 10000.

    The row t of ``x`` is at position m = offset + t; each pair (x[2i], x[2i+1]) turns by the angle
    m * 10000^(-2i/d_head), as :class:`~transformer_lib.positional.RotaryEmbedding` does.

    Shapes: x (..., T, d_head) -> (..., T, d_head).
    """
    g = torch.Generator().manual_seed(4)
    cases = (
        ("one head, T=6, d_head=8", (1, 1, 6, 8), 0),
        ("batch 2 x 3 heads, T=5, d_head=16", (2, 3, 5, 16), 0),
        ("d_head=64, T=12 (slow and fast pairs)", (1, 2, 12, 64), 0),
        ("offset=7: rows at positions 7, 8, 9, 10 (decoding with a cache)", (2, 2, 4, 8), 7),
    )
    v = _rope_variant
    for name, shape, offset in cases:
        x = torch.randn(*shape, generator=g)
        expected = RotaryEmbedding(shape[-1], max_len=64)(x, offset)
        c.case(
            name,
            lambda x, offset: rope(x, offset),
            expected,
            bugs=(
                Bug(
                    lambda x=x, o=offset: v(x, o, sign=-1.0),
                    "you rotate by -theta: the pair becomes (x1 cos + x2 sin, -x1 sin + x2 cos). Multiply by "
                    "e^{+i m theta}: (x1 cos - x2 sin, x1 sin + x2 cos).",
                ),
                Bug(
                    lambda x=x, o=offset: v(x, o, halves=True),
                    "you pair dimension i with i + d_head/2 (the 'rotate_half' layout of GPT-NeoX and Hugging "
                    "Face Llama); this library pairs neighbours (2i, 2i+1), as in the RoFormer paper.",
                ),
                Bug(
                    lambda x=x, o=offset: v(x, o, concat=True),
                    "right pairs, wrong output layout: the rotated pair i must go back to dimensions 2i and "
                    "2i+1 (stack on a new last axis, then flatten), not first halves then second halves.",
                ),
                Bug(
                    lambda x=x, o=offset: v(x, o, exponent="i/d"),
                    "the frequency of pair i is 10000^(-2i/d_head), not 10000^(-i/d_head).",
                ),
                Bug(lambda x=x: v(x, 0), "the offset is ignored: row t is at position offset + t."),
            ),
            hint="theta_i = 10000 ** (-2i / d_head); angle = (offset + t) * theta_i; with x1, x2 = x[..., 0::2], "
            "x[..., 1::2], the result interleaves x1 cos - x2 sin and x1 sin + x2 cos.",
            inputs={"x": x, "offset": offset},
        )

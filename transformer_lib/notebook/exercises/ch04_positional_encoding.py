"""Chapter 4, positional encoding: ``check_sinusoidal_encoding`` (fix a NumPy table with the ``2 * i`` typo),
``check_rope_permutation`` (convert RoPE weights from the half-split layout to the interleaved one),
``check_alibi_share`` (a prediction: how much weight ALiBi's steepest and flattest heads keep nearby) and
``check_alibi`` (ALiBi's bias for any number of heads, with a cache)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ...positional import RotaryEmbedding, alibi_bias, alibi_slopes, sinusoidal_encoding
from ._framework import Bug, Checker, bug_table, checker

__all__ = ["check_sinusoidal_encoding", "check_rope_permutation", "check_alibi_share", "check_alibi"]


# ---------------------------------------------------------------- Spot the bug: the NumPy table's `2 * i`


def _sinusoidal(max_len: int, d_model: int, *, bug: str = "") -> Tensor:
    """The sinusoidal encoding, or one of its classic wrong versions (:data:`_SINUSOIDAL_BUGS`).

    "chapter loop" is the chapter's loop: sine with exponent 2j/d, cosine with 2(j+1)/d, j = 0, 2, 4, ... the
    even dimension. Shapes: -> (max_len, d_model).
    """
    start = 1 if bug == "from 1" else 0
    pos = torch.arange(start, start + max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    i = torch.arange(d_model // 2, dtype=torch.float64)  # the pairs, 0 .. d/2 - 1
    power = {"4i/d": 4 * i, "chapter loop": 4 * i, "i/d": i}.get(bug, 2 * i) / d_model
    base = 1000.0 if bug == "base 1000" else 10000.0
    angles = pos * base**power if bug == "multiplied" else pos / base**power  # (max_len, d/2)
    sin, cos = torch.sin(angles), torch.cos(angles)
    if bug == "chapter loop":
        cos = torch.cos(pos / base ** ((4 * i + 2) / d_model))
    first, second = (cos, sin) if bug in ("swapped", "halves, cos first") else (sin, cos)
    if bug in ("halves", "halves, cos first"):
        return torch.cat([first, second], dim=-1).float()
    return torch.stack([first, second], dim=-1).flatten(-2).float()  # interleaved: sin, cos, sin, cos, ...


def _as_tensor(table: Any) -> Any:
    """A NumPy array as a tensor (the exercise's table is NumPy); anything else unchanged, for the feedback."""
    return torch.from_numpy(np.ascontiguousarray(table)) if isinstance(table, np.ndarray) else table


_TYPO_HINT = (
    "the exponent is doubled: `2 * i` where i already steps through the even dimensions 0, 2, 4, ... (it IS the 2i "
    "of the formula). That is the encoding with base 10000² = 10⁸: pairs still on the unit circle, dot products "
    "still a function of the offset, but the slow half of the dimensions barely move. Use i / d_model when i is the "
    "even dimension (or 2 * i / d_model when i counts the pairs 0, 1, 2, ...)."
)


_SINUSOIDAL_BUGS = {  # bug -> hint, for _sinusoidal(..., bug=bug)
    "4i/d": _TYPO_HINT,
    "chapter loop": "the chapter's loop: `2 * i` doubles the exponent (i already steps by 2), and the cosine uses "
    "2 * (i + 1), another frequency than its sine. Sine and cosine of a pair share one angle, "
    "pos / 10000^(i / d_model) with i = 0, 2, 4, ...",
    "swapped": "sin and cos are swapped: the even dimensions 2i hold the sine, the odd ones 2i+1 the cosine.",
    "halves": "sin and cos in halves: the sines fill the first d_model/2 columns and the cosines the last "
    "d_model/2; the encoding interleaves them: dimension 2i is a sine and dimension 2i+1 the cosine "
    "of the same angle, pe[:, 0::2] = sin and pe[:, 1::2] = cos.",
    "halves, cos first": "cos and sin in halves: the cosines fill the first d_model/2 columns and the sines the "
    "last; the encoding interleaves them, the sine first: pe[:, 0::2] = sin and pe[:, 1::2] = cos.",
    "i/d": "the exponent is i/d_model with i the index of the pair; it is 2i/d_model (equivalently "
    "j/d_model with j = 0, 2, 4, ... the even dimension).",
    "multiplied": "the angle is pos DIVIDED by 10000^(2i/d_model): the wavelengths grow with i.",
    "from 1": "positions start at 0, not 1: the first row is sin(0) = 0, cos(0) = 1.",
    "base 1000": "the base is 10000, not 1000.",
}


@checker
def check_sinusoidal_encoding(c: Checker, encoding: Callable[[int, int], Any]) -> None:
    """Check ``encoding(max_len, d_model) -> PE`` of Vaswani et al.: PE[pos, 2i] = sin(pos / 10000^(2i/d_model)),
    PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model)), as a NumPy array or a tensor.

    Shapes: returns (max_len, d_model).
    """
    for max_len, d_model in ((10, 8), (50, 16), (100, 64)):
        c.case(
            f"max_len={max_len}, d_model={d_model}",
            lambda n=max_len, d=d_model: _as_tensor(encoding(n, d)),
            sinusoidal_encoding(max_len, d_model),
            bugs=bug_table(_SINUSOIDAL_BUGS, _sinusoidal, max_len, d_model),
            hint="angles = pos / 10000 ** (j / d_model) for pos = 0 .. max_len-1 and the even dimensions "
            "j = 0, 2, ..., d_model-2; pe[:, 0::2] = sin(angles), pe[:, 1::2] = cos(angles).",
        )


# ---------------------------------------------------------------- Extend: RoPE weights from the half-split layout


def _convert(w: Tensor, n_heads: int, *, bug: str = "") -> Tensor:
    """Half-split rows to interleaved ones: per head, rows (i, i + d_head/2) become rows (2i, 2i + 1); or a wrong
    conversion of :data:`_ROPE_BUGS`: "the other way" (Hugging Face's `permute` in convert_llama_weights_to_hf.py),
    "whole matrix" (all d_model rows as one head), "columns" (the input dimensions; a bias has none), "unchanged".
    """
    if bug == "unchanged":
        return w
    if bug == "columns":
        if w.dim() != 2 or w.shape[1] % (2 * n_heads):
            raise ValueError("no columns to permute")
        return _convert(w.T, n_heads).T
    n = 1 if bug == "whole matrix" else n_heads
    d_head = w.shape[0] // n
    split = (n, d_head // 2, 2) if bug == "the other way" else (n, 2, d_head // 2)
    return w.reshape(*split, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _rope_half_split(x: Tensor, base: float = 10000.0) -> Tensor:
    """RoPE in the GPT-NeoX / Hugging Face Llama layout: dimension i turns with i + d_head/2.
    Shapes: x (..., T, d_head) -> same."""
    T, d_head = x.shape[-2:]
    theta = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta  # (T, d_head/2)
    cos, sin = angle.cos().repeat(1, 2).to(x.dtype), angle.sin().repeat(1, 2).to(x.dtype)  # (T, d_head)
    x1, x2 = x[..., : d_head // 2], x[..., d_head // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _rope_scores(x: Tensor, q: tuple[Tensor, Tensor], k: tuple[Tensor, Tensor], n_heads: int, rope: Callable) -> Tensor:
    """Scores rope(q_h) . rope(k_h) of every head. Shapes: x (B, T, d_model) -> (B, n_heads, T, T)."""
    B, T, _ = x.shape
    q_heads = F.linear(x, *q).view(B, T, n_heads, -1).transpose(1, 2)  # (B, n_heads, T, d_head)
    k_heads = F.linear(x, *k).view(B, T, n_heads, -1).transpose(1, 2)
    return rope(q_heads) @ rope(k_heads).transpose(-2, -1)


_ROPE_BUGS = {  # bug -> hint, for _convert(..., bug=bug)
    "the other way": "that is the conversion the other way, interleaved to halves (Hugging Face's `permute` for "
    "Meta's checkpoints). Here row i of a head's first half and row i of its second half must become rows 2i and "
    "2i + 1: view each head's rows as (2, d_head/2), transpose to (d_head/2, 2), flatten.",
    "whole matrix": "you interleave the two halves of all d_model rows at once. Each head has its own pairs (i, i + "
    "d_head/2): reorder the rows inside every head, with a leading n_heads axis.",
    "columns": "you reorder the columns. nn.Linear stores its weight as (out, in): the output dimensions, which "
    "RoPE rotates, are the rows (the first axis).",
    "unchanged": "the weights are unchanged: the two layouts pair different dimensions, so the same weights give "
    "different scores (the chapter measured it).",
}


@checker
def check_rope_permutation(c: Checker, to_interleaved: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``to_interleaved(w, n_heads)``: the weight (d_model, d_in) or bias (d_model,) of a query or key
    projection trained with the half-split RoPE layout (dimension i of a head turns with i + d_head/2), its rows
    reordered so that the interleaved layout (2i with 2i + 1, :class:`~transformer_lib.positional.RotaryEmbedding`)
    gives the same attention scores.

    Shapes: w (d_model, ...) -> (d_model, ...).
    """
    g = torch.Generator().manual_seed(4)
    for name, shape, n_heads in (
        ("weight (8, 8), 1 head of d_head=8", (8, 8), 1),
        ("weight (16, 12), 2 heads of d_head=8", (16, 12), 2),
        ("bias (24,), 3 heads of d_head=8", (24,), 3),
    ):
        w = torch.randn(*shape, generator=g)
        c.case(
            name,
            lambda w, n_heads: to_interleaved(w, n_heads),
            _convert(w, n_heads),
            bugs=bug_table(_ROPE_BUGS, _convert, w, n_heads),
            hint="per head, the half-split rows are (x_0 .. x_{d/2-1}, y_0 .. y_{d/2-1}) and the interleaved ones "
            "(x_0, y_0, x_1, y_1, ...): w.reshape(n_heads, 2, d_head // 2, ...).transpose(1, 2).reshape(w.shape).",
            inputs={"w": w, "n_heads": n_heads},
        )
    # The end-to-end case: a half-split model's scores, and the library's RoPE on the converted projections.
    d_model, n_heads, T = 24, 4, 7
    d_head = d_model // n_heads
    wq, bq, wk, bk = (torch.randn(*s, generator=g) / 4 for s in ((d_model, d_model), (d_model,)) * 2)
    x = torch.randn(2, T, d_model, generator=g)
    rotary = RotaryEmbedding(d_head, max_len=T)

    def interleaved_scores(convert: Callable[[Tensor, int], Tensor], wq=wq, bq=bq, wk=wk, bk=bk) -> Tensor:
        q = (convert(wq, n_heads), convert(bq, n_heads))
        k = (convert(wk, n_heads), convert(bk, n_heads))
        return _rope_scores(x, q, k, n_heads, rotary)

    def wrong_scores(*, bug: str) -> Tensor:
        return interleaved_scores(functools.partial(_convert, bug=bug))

    c.case(
        f"scores of {n_heads} heads (d_head={d_head}) with the library's RotaryEmbedding == the half-split model's",
        lambda wq, bq, wk, bk: interleaved_scores(to_interleaved, wq, bq, wk, bk),
        _rope_scores(x, (wq, bq), (wk, bk), n_heads, _rope_half_split),
        bugs=bug_table(_ROPE_BUGS, wrong_scores),
        hint="convert the weights AND the biases of both projections, each head's rows separately.",
        atol=1e-4,
        inputs={"wq": wq, "bq": bq, "wk": wk, "bk": bk},
    )


# ---------------------------------------------------------------- Predict, then run: how far ALiBi's heads look

ALIBI_SHARE_SETUP = {"n_heads": 8, "T": 64, "last": 5}
"""8 heads (slopes 1/2 .. 1/256), a query at the last of 64 positions, the share of its weight on the last 5 keys."""


def alibi_recent_share(n_heads: int, T: int, last: int) -> tuple[float, float]:
    """With every raw score equal, the share of the weight that the query at position T - 1 puts on the ``last``
    most recent keys (itself included), in the steepest and in the flattest head, from the library's bias."""
    bias = alibi_bias(alibi_slopes(n_heads).double(), 1, T, offset=T - 1)[:, 0]  # (n_heads, T)
    share = torch.softmax(bias, dim=-1)[:, -last:].sum(dim=-1)  # (n_heads,)
    return share[0].item(), share[-1].item()


@checker(answer="value")
def check_alibi_share(c: Checker, prediction: tuple[float, float]) -> None:
    """Check ``prediction = (steepest, flattest)``: with ALiBi's 8 heads and every raw score equal, the share of
    its attention that the query at position 63 puts on the 5 most recent keys (positions 59 to 63), in head 0
    (slope 1/2) and in head 7 (slope 1/256)."""
    n_heads, T, last = (ALIBI_SHARE_SETUP[k] for k in ("n_heads", "T", "last"))
    steep, flat = alibi_recent_share(n_heads, T, last)
    slopes = alibi_slopes(n_heads).tolist()
    two_numbers = "give two numbers, prediction = (share in head 0, share in head 7)."
    atol = 0.03
    for i, (head, expected) in enumerate(((0, steep), (n_heads - 1, flat))):
        s = slopes[head]
        r = math.exp(-s)
        mistakes = (
            (
                last / T,
                f"{last}/{T} is a head with no penalty at all. The bias is added to the scores before the "
                "softmax: it multiplies the weight of a key d positions back by e^(-s d).",
            ),
            (
                1 - r**last,
                f"1 - e^(-{last} s) assumes endlessly many keys; there are {T}, so divide by the sum over "
                f"them, 1 - e^(-{T} s), which matters when the slope is small.",
            ),
            (
                1 - r,
                f"that is the newest key alone, 1 - e^(-s). The {last} newest keys hold 1 - e^(-{last} s) of an "
                "endless sequence of keys.",
            ),
        )
        c.case(
            f"head {head}, slope 1/{round(1 / s)}: share on the last {last} of {T} keys",
            lambda i=i: prediction[i],
            expected,
            bugs=tuple(Bug(lambda value=value: value, why) for value, why in mistakes),
            hint=f"the weights are proportional to e^(-s d) for the key d = 0 .. {T - 1} positions back, a "
            f"geometric series with ratio r = e^(-s): the last {last} keys hold (1 - r^{last}) / (1 - r^{T}).",
            error_hint=two_numbers,
            atol=atol,
        )


# ---------------------------------------------------------------- Extend: ALiBi for any number of heads, with a cache


def _powers(n: int) -> list[float]:
    return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]


def _alibi(n_heads: int, T_q: int, T_k: int, *, bug: str = "") -> Tensor:
    """ALiBi's bias, or one of its wrong versions (:data:`_ALIBI_BUGS`). Shapes: -> (n_heads, T_q, T_k)."""
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = n_heads - closest
    slopes = {
        "geometric": lambda: _powers(n_heads),
        "first": lambda: _powers(closest) + _powers(2 * closest)[:extra],
        "odd": lambda: _powers(closest) + _powers(2 * closest)[1::2][:extra],
        "eight": lambda: [2.0 ** -(h + 1) for h in range(n_heads)],
    }.get(bug, lambda: _powers(closest) + _powers(2 * closest)[0::2][:extra])()  # the paper's
    offset = 0 if bug == "no offset" else T_k - T_q
    i = torch.arange(offset, offset + T_q)[:, None]  # query positions
    j = torch.arange(T_k)[None, :]  # key positions
    bias = (1.0 if bug == "sign" else -1.0) * torch.tensor(slopes)[:, None, None] * (i - j)
    return bias.masked_fill(j > i, -math.inf) if bug == "causal" else bias


_ALIBI_BUGS = {  # bug -> hint, for _alibi(..., bug=bug)
    "geometric": "2^(-8 (h+1) / n) for every n is the rule for a power of two only. For other head counts the "
    "paper takes the slopes of the closest smaller power of two n', then every other slope of the "
    "sequence for 2 n' for the heads left.",
    "first": "the heads beyond n' take EVERY OTHER slope of the 2 n' sequence ([0::2]), the ones that fall "
    "between the first n' slopes, not its first n - n' slopes.",
    "odd": "[1::2] of the 2 n' sequence are the n' slopes again (duplicates); the new ones are [0::2].",
    "eight": "2^-(h+1) are the slopes of 8 heads; for n heads the ratio between slopes is 2^(-8/n).",
    "no offset": "the queries are the newest T_q positions, i = T_k - T_q + t, not 0 .. T_q - 1: with a cache "
    "the new query comes after every cached key.",
    "sign": "the bias is a penalty: -s_h (i - j), negative for keys in the past.",
    "causal": "return the bias alone: the entries with j > i stay -s_h (i - j) (positive); the causal mask "
    "hides them separately.",
}


@checker
def check_alibi(c: Checker, alibi: Callable[[int, int, int], Tensor]) -> None:
    """Check ``alibi(n_heads, T_q, T_k) -> bias``: ALiBi's bias -s_h (i - j) for the T_q newest queries of a
    sequence of T_k positions (query t at position i = T_k - T_q + t, key j = 0 .. T_k - 1), with the slopes s_h of
    Press et al. for any number of heads; the entries j > i are left as they are (the causal mask hides them).

    Shapes: returns (n_heads, T_q, T_k).
    """
    for name, n_heads, T_q, T_k in (
        ("8 heads, T_q = T_k = 5 (the chapter's table)", 8, 5, 5),
        ("6 heads: not a power of two", 6, 4, 4),
        ("12 heads, 1 new query after 6 cached keys", 12, 1, 7),
        ("3 heads, 3 new queries, 8 keys", 3, 3, 8),
    ):
        c.case(
            name,
            lambda h=n_heads, q=T_q, k=T_k: alibi(h, q, k),
            alibi_bias(alibi_slopes(n_heads), T_q, T_k, offset=T_k - T_q),
            bugs=bug_table(_ALIBI_BUGS, _alibi, n_heads, T_q, T_k),
            hint="slopes: for n' = 2^floor(log2 n), [2^(-8 (h+1) / n') for h < n'] plus [2^(-8 (h+1) / (2 n'))] "
            "[0::2][: n - n']; i = arange(T_k - T_q, T_k)[:, None], j = arange(T_k)[None, :]; "
            "bias = -slopes[:, None, None] * (i - j).",
        )

"""Chapter 4, positional encoding: ``check_sinusoidal_encoding`` (fix a NumPy table whose frequencies lost the
minus sign of their exponent), ``check_rope_permutation`` (convert RoPE weights from the half-split layout to the
interleaved one), ``check_alibi_share`` (a prediction: how much weight ALiBi's steepest and flattest heads keep
nearby) and ``check_alibi`` (ALiBi's bias for any number of heads, with a cache, built with torch alone)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ...positional import ALiBi, RotaryEmbedding, alibi_bias, alibi_slopes, sinusoidal_encoding
from ._framework import Checker, Hint, bug_table, checker

ANSWER_MARKERS: dict[str, tuple[str, ...]] = {  # exercise label -> what gives its answer away
    "ex-sinusoidal": ("-(np.log(10000.0) / d_model)", "-np.log(10000", "np.exp(-np.arange", "the minus sign"),
    "ex-direction": ("w^q (w^k)^t", "= m_1", "pe(n + 1)"),
    "ex-rope": ("(n_heads, 2, d_head // 2", "view(n_heads, 2, -1)"),
    "ex-alibi-share": ("(0.92, 0.087)", "1 - e^{-2.5}", "(1 - r^5)/(1 - r^{64})"),  # not bare 0.92: a run may read that
    "ex-alibi": ("[0::2][: n_heads - n]", "arange(t_k - t_q, t_k)"),
}


# ---------------------------------------------------------------- Spot the bug: frequencies through a logarithm

SINUSOIDAL_STARTER = """\
import numpy as np


def positional_encoding(max_len, d_model):  # find and fix the bug
    position = np.arange(max_len)[:, None]  # (max_len, 1)
    frequencies = np.exp(np.arange(0, d_model, 2) * (np.log(10000.0) / d_model))  # (d_model/2,) one per pair
    angles = position * frequencies  # (max_len, d_model/2): position times frequency
    return np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(max_len, d_model)  # sin, cos, sin, ...
"""


def _sinusoidal(max_len: int, d_model: int, *, bug: str = "") -> Tensor:
    """The sinusoidal encoding (max_len, d_model), or a classic wrong one of :data:`_SINUSOIDAL_BUGS`."""
    start = 1 if bug == "from 1" else 0
    pos = torch.arange(start, start + max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    i = torch.arange(d_model // 2, dtype=torch.float64)  # the pairs, 0 .. d/2 - 1
    power = {"4i/d": 4 * i, "chapter loop": 4 * i, "i/d": i}.get(bug, 2 * i) / d_model
    base = 1000.0 if bug == "base 1000" else 10000.0
    angles = pos * base**power if bug == "no minus" else pos / base**power  # (max_len, d/2)
    sin, cos = torch.sin(angles), torch.cos(angles)
    if bug == "chapter loop":
        cos = torch.cos(pos / base ** ((4 * i + 2) / d_model))
    first, second = (cos, sin) if bug in ("swapped", "halves, cos first") else (sin, cos)
    if bug in ("halves", "halves, cos first"):
        return torch.cat([first, second], dim=-1).float()
    return torch.stack([first, second], dim=-1).flatten(-2).float()  # interleaved: sin, cos, sin, cos, ...


def _as_tensor(table: Any) -> Any:  # the exercise's table is NumPy
    return torch.from_numpy(np.ascontiguousarray(table)) if isinstance(table, np.ndarray) else table


_THE_FORMULA = "the formula of 'The sinusoidal encoding'"
_FORMULA = f"reread {_THE_FORMULA}"
_INTERLEAVED = "pe[:, 0::2] = sin(angles) and pe[:, 1::2] = cos(angles): dimension 2i is a sine, 2i+1 its cosine"
_SINUSOIDAL_BUGS = {  # bug -> hint, for _sinusoidal(..., bug=bug)
    "no minus": Hint(
        "your frequencies GROW across the dimensions: the first pair turns by one radian per position and the "
        "last by thousands, where each pair should turn more slowly than the one before it, the slowest once in "
        f"about 2π · 10000 positions. Both of the chapter's tests hold for any frequencies; {_FORMULA} (the angle "
        "of pair i, and its wavelength).",
        "the exponent lost its minus sign: frequencies = np.exp(np.arange(0, d_model, 2) * -(np.log(10000.0) / "
        "d_model)), which is 1 / 10000 ** (i / d_model) for the even dimensions i.",
    ),
    "4i/d": Hint(
        "your table is the sinusoidal encoding with the base squared, 10000² = 10⁸: pairs still on the unit "
        "circle, dot products still a function of the offset, but the frequencies fall twice as fast across the "
        "dimensions, and the slow half of them barely move. It is the chapter's 'Spot the bug' slip: which "
        "dimensions does your index step through?",
        "use i / d_model when i is the even dimension 0, 2, 4, ... (it IS the 2i of the formula), or 2 * i / "
        "d_model when i counts the pairs 0, 1, 2, ...",
    ),
    "chapter loop": Hint(  # sine with exponent 2j/d, cosine with 2(j+1)/d, j even
        "this is the loop of the chapter's 'Spot the bug' section: its exponent is doubled, and its sine and cosine "
        f"of one pair turn at different frequencies. A pair is the sine and the cosine of ONE angle; {_FORMULA}.",
        "sine and cosine share one angle, pos / 10000 ** (i / d_model) with i = 0, 2, 4, ... the even dimension.",
    ),
    "swapped": Hint(
        f"sine and cosine are in each other's place: {_FORMULA} (which dimension of a pair holds the sine).",
        _INTERLEAVED + ".",
    ),
    **{
        bug: Hint(
            f"your {first}s fill the first half of the columns and the {second}s the second; the encoding "
            f"interleaves them, sine first, a pair being two neighbouring dimensions ({_FORMULA}).",
            _INTERLEAVED + ".",
        )
        for bug, first, second in (("halves", "sine", "cosine"), ("halves, cos first", "cosine", "sine"))
    },
    "i/d": Hint(
        "your frequencies fall half as fast across the dimensions as they should (the encoding with base 100): "
        f"the exponent of pair i is 2i/d_model; {_FORMULA}.",
        "with i the index of the pair use 2 * i / d_model; with i the even dimension 0, 2, 4, ..., i / d_model.",
    ),
    "from 1": Hint(
        "your first row is position 1: the positions start at 0, whose row is sin 0 = 0, cos 0 = 1.",
        "pos = np.arange(max_len), from 0.",
    ),
    "base 1000": Hint(
        f"your longest wavelength is ten times too short: check the base against {_THE_FORMULA}.",
        "the base is 10000, not 1000.",
    ),
}


@checker(starter=SINUSOIDAL_STARTER, reference=_sinusoidal)
def check_sinusoidal_encoding(c: Checker, encoding: Callable[[int, int], Any]) -> None:
    """Check ``encoding(max_len, d_model)``, the sinusoidal encoding of Vaswani et al. as a NumPy array or a tensor,
    without the library's. Shapes: -> (max_len, d_model)."""
    with c.refuse_library_calls(
        sinusoidal_encoding,
        name="fixed by hand, without tl.sinusoidal_encoding",
        hint="the exercise asks you to fix the snippet: the library's table is what the checker compares it with.",
    ):
        c.cases(
            lambda max_len, d_model: _as_tensor(encoding(max_len, d_model)),
            [(f"max_len={n}, d_model={d}", {"max_len": n, "d_model": d}) for n, d in ((10, 8), (50, 16), (100, 64))],
            sinusoidal_encoding,
            _SINUSOIDAL_BUGS,
            _sinusoidal,
            hint=Hint(
                "compare your table with tl.sinusoidal_encoding(max_len, d_model), row by row, and "
                f"{_THE_FORMULA}: each pair holds the sine and the cosine of one angle.",
                "angles = pos / 10000 ** (j / d_model) for pos = 0 .. max_len-1 and the even dimensions "
                "j = 0, 2, ..., d_model-2; pe[:, 0::2] = sin(angles), pe[:, 1::2] = cos(angles).",
            ),
        )


# ---------------------------------------------------------------- Extend: RoPE weights from the half-split layout


def _convert(w: Tensor, n_heads: int, *, bug: str = "") -> Tensor:
    """Per head, rows (i, i + d_head/2) become rows (2i, 2i + 1); or a wrong conversion of :data:`_ROPE_BUGS`."""
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
    """RoPE in the GPT-NeoX / Hugging Face Llama layout, dimension i turning with i + d_head/2."""
    T, d_head = x.shape[-2:]
    theta = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta  # (T, d_head/2)
    cos, sin = angle.cos().repeat(1, 2).to(x.dtype), angle.sin().repeat(1, 2).to(x.dtype)  # (T, d_head)
    x1, x2 = x[..., : d_head // 2], x[..., d_head // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _rope_scores(x: Tensor, q: tuple[Tensor, Tensor], k: tuple[Tensor, Tensor], n_heads: int, rope: Callable) -> Tensor:
    """Scores rope(q_h) . rope(k_h) of every head: (B, n_heads, T, T)."""
    B, T, _ = x.shape
    q_heads = F.linear(x, *q).view(B, T, n_heads, -1).transpose(1, 2)  # (B, n_heads, T, d_head)
    k_heads = F.linear(x, *k).view(B, T, n_heads, -1).transpose(1, 2)
    return rope(q_heads) @ rope(k_heads).transpose(-2, -1)


_ROPE_SECTION = "reread the end of 'Rotary position embedding (RoPE)', where `halves` lines the two layouts up"
_ROPE_FIX = (
    "per head, rows i and i + d_head/2 become rows 2i and 2i + 1: view each head's rows as (2, d_head/2), "
    "transpose to (d_head/2, 2), flatten: w.reshape(n_heads, 2, d_head // 2, *w.shape[1:]).transpose(1, 2)"
    ".reshape(w.shape)."
)
_ROPE_BUGS = {  # bug -> hint, for _convert(..., bug=bug)
    "the other way": Hint(
        "that is the conversion the other way, from neighbouring pairs to halves (Hugging Face's `permute` for "
        "Meta's checkpoints): the rows that must end up side by side are a head's row i and its row "
        f"i + d_head/2; {_ROPE_SECTION}.",
        _ROPE_FIX,
    ),
    "whole matrix": Hint(
        "you paired the two halves of all d_model rows at once. Each head has its own pairs, its dimension i with "
        "its dimension i + d_head/2: the reordering happens inside every head.",
        "give the rows a leading n_heads axis first: " + _ROPE_FIX,
    ),
    "columns": Hint(
        "you reordered the columns, the projection's inputs. RoPE rotates its OUTPUTS, and nn.Linear stores its "
        "weight as (out, in).",
        "reorder the rows, the first axis: " + _ROPE_FIX,
    ),
    "unchanged": Hint(
        "the weights are unchanged: the two layouts pair different dimensions, so the same weights give different "
        f"scores (the chapter measured the difference); {_ROPE_SECTION}.",
        _ROPE_FIX,
    ),
}


@checker(reference=lambda w, n_heads: w[torch.arange(w.shape[0]).view(n_heads, 2, -1).mT.flatten()])
def check_rope_permutation(c: Checker, to_interleaved: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``to_interleaved(w, n_heads)``: a query or key projection's weight or bias trained with the half-split
    RoPE layout, its rows reordered so that the interleaved layout (``RotaryEmbedding``) gives the same scores.
    Shapes: w (d_model, ...) -> (d_model, ...)."""
    g = torch.Generator().manual_seed(4)
    cases = (
        ("weight (8, 8), 1 head of d_head=8", (8, 8), 1),
        ("weight (16, 12), 2 heads of d_head=8", (16, 12), 2),
        ("bias (24,), 3 heads of d_head=8", (24,), 3),
    )
    c.cases(
        to_interleaved,
        [(name, {"w": torch.randn(*shape, generator=g), "n_heads": n_heads}) for name, shape, n_heads in cases],
        _convert,
        _ROPE_BUGS,
        hint=Hint(
            "per head, the half-split rows are (x_0 .. x_{d/2-1}, y_0 .. y_{d/2-1}) and the interleaved ones "
            f"must be (x_0, y_0, x_1, y_1, ...); {_ROPE_SECTION}.",
            _ROPE_FIX,
        ),
    )
    _rope_scores_case(c, to_interleaved, g)


def _rope_scores_case(c: Checker, to_interleaved: Callable[[Tensor, int], Tensor], g: torch.Generator) -> None:
    d_model, n_heads, T = 24, 4, 7
    d_head = d_model // n_heads
    wq, bq, wk, bk = (torch.randn(*s, generator=g) / 4 for s in ((d_model, d_model), (d_model,)) * 2)
    x = torch.randn(2, T, d_model, generator=g)
    rotary = RotaryEmbedding(d_head, max_len=T)

    def interleaved_scores(
        convert: Callable[[Tensor, int], Tensor], wq: Tensor, bq: Tensor, wk: Tensor, bk: Tensor
    ) -> Tensor:
        q, k = (convert(wq, n_heads), convert(bq, n_heads)), (convert(wk, n_heads), convert(bk, n_heads))
        return _rope_scores(x, q, k, n_heads, rotary)

    def wrong_scores(*, bug: str) -> Tensor:
        return interleaved_scores(functools.partial(_convert, bug=bug), wq, bq, wk, bk)

    c.case(
        f"{n_heads} heads (d_head={d_head}): RotaryEmbedding gives the half-split model's scores",
        functools.partial(interleaved_scores, to_interleaved),
        _rope_scores(x, (wq, bq), (wk, bk), n_heads, _rope_half_split),
        bugs=bug_table(_ROPE_BUGS, wrong_scores),
        hint="convert the weights AND the biases of both projections, each head's rows separately.",
        atol=1e-4,
        inputs={"wq": wq, "bq": bq, "wk": wk, "bk": bk},
    )


# ---------------------------------------------------------------- Predict, then run: how far ALiBi's heads look

_SHARE_SECTION = "reread 'Relative biases, briefly', where the bias is added to the scores"
ALIBI_SHARE_SETUP = {"n_heads": 8, "T": 64, "last": 5}
"""8 heads (slopes 1/2 .. 1/256), a query at the last of 64 positions, the share of its weight on the last 5 keys."""


def alibi_recent_share(n_heads: int, T: int, last: int) -> tuple[float, float]:
    """With every raw score equal, the share of the weight that the last query puts on the ``last`` most recent
    keys, in the steepest and in the flattest head."""
    bias = alibi_bias(alibi_slopes(n_heads).double(), 1, T, offset=T - 1)[:, 0]  # (n_heads, T)
    share = torch.softmax(bias, dim=-1)[:, -last:].sum(dim=-1)  # (n_heads,)
    return share[0].item(), share[-1].item()


@checker(answer="value", reference=alibi_recent_share(**ALIBI_SHARE_SETUP))  # closed form: test_exercises_ch04
def check_alibi_share(c: Checker, prediction: tuple[float, float]) -> None:
    """Check ``prediction = (steepest, flattest)``: with ALiBi's 8 heads and every raw score equal, the share of its
    attention that the query at position 63 puts on keys 59 to 63, in head 0 (slope 1/2) and head 7 (1/256)."""
    n_heads, T, last = (ALIBI_SHARE_SETUP[k] for k in ("n_heads", "T", "last"))
    slopes = alibi_slopes(n_heads).tolist()
    series = f"the last {last} keys hold (1 - r^{last}) / (1 - r^{T}) of the weight, r = e^(-s)"
    for head, expected in zip((0, n_heads - 1), alibi_recent_share(n_heads, T, last), strict=True):
        r = math.exp(-slopes[head])
        bugs = {
            last / T: Hint(
                f"{last}/{T} is a head with no penalty at all. The bias is added to the scores before the softmax, "
                f"so it multiplies the weight of a key d positions back by e^(-s d): {_SHARE_SECTION}.",
                series + ".",
            ),
            1 - r**last: Hint(
                f"that share assumes endlessly many keys; there are {T}, which matters when the slope is small.",
                f"divide 1 - e^(-{last} s) by the sum over the {T} keys, 1 - e^(-{T} s): {series}.",
            ),
            1 - r: Hint(
                f"that is the share of the newest key alone; the question asks for the {last} newest.",
                f"the {last} newest keys of an endless sequence hold 1 - e^(-{last} s); with {T} keys, {series}.",
            ),
        }
        c.case(
            f"head {head}, slope 1/{round(1 / slopes[head])}: share on the last {last} of {T} keys",
            lambda i=int(head > 0): prediction[i],
            expected,
            bugs=bugs,
            hint=Hint(
                f"the weight of the key d = 0 .. {T - 1} positions back is proportional to e^(-s d): the weights "
                f"form a geometric series; {_SHARE_SECTION}.",
                series + ".",
            ),
            error_hint="give two numbers, prediction = (share in head 0, share in head 7).",
            atol=0.03,
        )


# ---------------------------------------------------------------- Extend: ALiBi for any number of heads, with a cache


def _powers(n: int) -> list[float]:
    return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]


def _alibi(n_heads: int, T_q: int, T_k: int, *, bug: str = "") -> Tensor:
    """ALiBi's bias (n_heads, T_q, T_k), or with a bug of :data:`_ALIBI_BUGS`."""
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


_ALIBI_SECTION = "reread 'Relative biases, briefly'"
_ALIBI_SLOPES_FIX = (
    "for n' = 2^floor(log2 n): [2^(-8 (h+1) / n') for h < n'] + [2^(-8 (h+1) / (2 n')) for h < 2 n'][0::2][: n - n']"
)
_ALIBI_BUGS = {  # bug -> hint, for _alibi(..., bug=bug)
    "geometric": Hint(
        "your slopes follow the rule for a power of two, which this number of heads is not. For other head counts "
        f"the paper starts from the closest smaller power of two; {_ALIBI_SECTION}.",
        _ALIBI_SLOPES_FIX + ".",
    ),
    "first": Hint(
        "the heads beyond n' take slopes that fall BETWEEN the first n' slopes, every other one of the 2 n' "
        "sequence, starting with its first: not that sequence's first n - n' slopes.",
        _ALIBI_SLOPES_FIX + ".",
    ),
    "odd": Hint(
        "your extra slopes are some of the first n' slopes again (duplicates): every other slope of the 2 n' "
        "sequence starting with its SECOND is the n' sequence itself.",
        "take [0::2] of the 2 n' sequence, not [1::2]: " + _ALIBI_SLOPES_FIX + ".",
    ),
    "eight": Hint(
        f"those are the slopes of 8 heads; for n heads the ratio between neighbouring slopes is 2^(-8/n) "
        f"({_ALIBI_SECTION}).",
        _ALIBI_SLOPES_FIX + ".",
    ),
    "no offset": Hint(
        "your queries sit at positions 0 .. T_q - 1. With a cache, the T_q new queries are the newest positions, "
        "after every cached key.",
        "the query positions are i = torch.arange(T_k - T_q, T_k)[:, None].",
    ),
    "sign": Hint("your bias is a bonus: it must be a penalty, negative for the keys in the past.", "-s_h (i - j)."),
    "causal": Hint(
        "you hid the future keys yourself; return the bias alone, the causal mask hides them separately.",
        "leave the entries j > i as -s_h (i - j), positive.",
    ),
}


_ALIBI_CASES = (  # (name, n_heads, T_q, T_k)
    ("8 heads, T_q = T_k = 5 (the chapter's table)", 8, 5, 5),
    ("6 heads: not a power of two", 6, 4, 4),
    ("12 heads, 1 new query after 6 cached keys", 12, 1, 7),
    ("3 heads, 3 new queries, 8 keys", 3, 3, 8),
)
_ALIBI_HINT = Hint(
    "compare your slopes with the ones the chapter printed for 6 heads, and your table for 8 heads with "
    f"the chapter's; {_ALIBI_SECTION}.",
    _ALIBI_SLOPES_FIX + "; i = arange(T_k - T_q, T_k)[:, None], j = arange(T_k)[None, :]; "
    "bias = -slopes[:, None, None] * (i - j).",
)


@checker(reference=_alibi)
def check_alibi(c: Checker, alibi: Callable[[int, int, int], Tensor]) -> None:
    """Check ``alibi(n_heads, T_q, T_k)``: ALiBi's bias -s_h (i - j) for the T_q newest queries of T_k positions,
    with Press et al.'s slopes for any number of heads, built with torch alone; the entries j > i left as they are.
    Shapes: -> (n_heads, T_q, T_k)."""
    with c.refuse_library_calls(
        alibi_bias,
        alibi_slopes,
        ALiBi,
        name="built with torch alone, without the library's ALiBi",
        hint="the exercise asks you to build the bias yourself: the library's functions are what the checker "
        "compares your bias with.",
    ):
        c.cases(
            alibi,
            [(name, {"n_heads": n, "T_q": T_q, "T_k": T_k}) for name, n, T_q, T_k in _ALIBI_CASES],
            lambda n_heads, T_q, T_k: alibi_bias(alibi_slopes(n_heads), T_q, T_k, offset=T_k - T_q),
            _ALIBI_BUGS,
            _alibi,
            hint=_ALIBI_HINT,
        )

"""Automatic checkers for the chapters' exercises.

Each ``check_<name>(student_answer)`` runs hidden cases (shapes, equality with the
library, leak checks), prints friendly feedback (which case failed, expected vs got,
a hint) and returns a :class:`CheckResult`. A wrong answer never crashes a checker.
When a case fails, the checker compares the answer with the classic bugs that popular
tutorials ship (a missing 1/sqrt(d_k), softmax over the wrong axis, an inverted mask,
the batch mixed into the head split, keys reshaped with the query's length, sine and
cosine swapped, RoPE rotating dimension i with i + d/2 instead of its neighbour, a
LayerNorm with the unbiased variance or eps outside the square root) and names the
one it recognises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import MultiHeadAttention, scaled_dot_product_attention
from .masks import causal_mask, padding_mask, prefix_lm_mask
from .positional import RotaryEmbedding, sinusoidal_encoding


@dataclass
class CheckResult:
    """Outcome of a checker: ``passed`` and one line per case."""

    title: str
    passed: bool
    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join([self.title, *self.lines])

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:  # the feedback was printed already; show nothing more
        pass


@dataclass
class Bug:
    """A known wrong implementation: if the answer equals ``fn(*args)``, show ``hint``."""

    fn: Callable[..., Any]
    hint: str


def _describe(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"tensor of shape {tuple(x.shape)}, dtype {x.dtype}"
    if isinstance(x, tuple):
        return "tuple of (" + ", ".join(_describe(t) for t in x) + ")"
    return f"{type(x).__name__}"


def _difference(got: Any, expected: Any, atol: float = 1e-5) -> str | None:
    """None when ``got`` equals ``expected`` (tensors or tuples of tensors); else what differs."""
    if isinstance(expected, tuple):
        if not isinstance(got, tuple) or len(got) != len(expected):
            return f"expected a tuple of {len(expected)} ({_describe(expected)}), got {_describe(got)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            problem = _difference(g, e, atol)
            if problem:
                return f"item {i} of the tuple: {problem}"
        return None
    if not isinstance(got, Tensor):
        return f"expected {_describe(expected)}, got {_describe(got)}"
    if got.shape != expected.shape:
        return f"expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}"
    if expected.dtype == torch.bool:
        if got.dtype != torch.bool:
            return f"expected a boolean tensor, got dtype {got.dtype}"
        if not torch.equal(got, expected):
            return f"{int((got != expected).sum())} entries differ from the expected mask"
        return None
    if not expected.is_floating_point():  # integer tensors, e.g. token ids: exact equality
        if got.is_floating_point() or got.dtype == torch.bool:
            return f"expected an integer tensor (token ids, {expected.dtype}), got dtype {got.dtype}"
        if not torch.equal(got.long(), expected.long()):
            return f"{int((got.long() != expected.long()).sum())} of {expected.numel()} entries differ"
        return None
    if not got.is_floating_point():
        return f"expected a floating-point tensor, got dtype {got.dtype}"
    got, expected = got.detach().double(), expected.detach().double()
    if torch.isnan(got).any() and not torch.isnan(expected).any():
        return "the result contains NaN"
    if not torch.equal(torch.isinf(got), torch.isinf(expected)):
        return f"{int((torch.isinf(got) != torch.isinf(expected)).sum())} entries are infinite where they should " \
               f"not be, or finite where they should be -inf"
    if not torch.allclose(got, expected, atol=atol, rtol=1e-4):
        return f"values differ: largest |got - expected| = {(got - expected).abs().max().item():.3g}"
    return None


def _nan_to_zero(x: Any) -> Any:
    if isinstance(x, tuple):
        return tuple(_nan_to_zero(t) for t in x)
    if isinstance(x, Tensor) and x.is_floating_point():
        return x.nan_to_num(0.0, posinf=float("inf"), neginf=float("-inf"))
    return x


class _Checker:
    def __init__(self, title: str) -> None:
        self.title, self.lines, self.failures = title, [], 0

    def case(self, name: str, answer: Callable[[], Any], expected: Any, bugs: tuple[Bug, ...] = (),
             hint: str = "", error_hint: str = "", atol: float = 1e-5) -> None:
        try:
            got = answer()
        except Exception as e:  # a wrong answer must never crash the checker
            self._fail(name, f"raised {type(e).__name__}: {e}", error_hint or hint)
            return
        problem = _difference(got, expected, atol)
        if problem is None:
            self.lines.append(f"  ✅ {name}")
            return
        for bug in bugs:  # NaN rows (e.g. softmax over all -inf) still identify the bug that made them
            try:
                if _difference(_nan_to_zero(got), bug.fn(), atol) is None:
                    self._fail(name, problem, bug.hint)
                    return
            except Exception:
                continue
        self._fail(name, problem, hint)

    def _fail(self, name: str, problem: str, hint: str) -> None:
        self.failures += 1
        self.lines.append(f"  ❌ {name}: {problem}")
        if hint:
            self.lines.append(f"     Hint: {hint}")

    def done(self) -> CheckResult:
        n = sum(1 for line in self.lines if line.startswith("  ✅") or line.startswith("  ❌"))
        passed = self.failures == 0
        summary = (f"All {n} checks passed." if passed else f"{self.failures} of {n} checks failed.")
        result = CheckResult(f"{self.title}: {summary}", passed, self.lines)
        print(result.text)
        return result


def _not_callable(title: str, answer: Any) -> CheckResult | None:
    if callable(answer):
        return None
    result = CheckResult(f"{title}: expected a function, got {type(answer).__name__}", False)
    print(result.text)
    return result


# --------------------------------------------------------------------------- chapter 1: attention


def _attention_bugs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Bug, ...]:
    d_k = q.shape[-1]

    def no_scale():
        return scaled_dot_product_attention(q, k, v, mask, scale=1.0)

    def wrong_axis():
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, dim=-2)
        return w @ v, w

    bugs = [Bug(no_scale, "the scores are not scaled: divide q @ k^T by sqrt(d_k) before the softmax."),
            Bug(lambda: scaled_dot_product_attention(q, k, v, mask, scale=1.0 / d_k),
                "you divide by d_k; the scale is 1 / sqrt(d_k)."),
            Bug(wrong_axis, "the softmax runs over the queries (dim=-2); each query's weights over the keys "
                            "must sum to 1: use dim=-1.")]
    if mask is not None:
        bugs.append(Bug(lambda: scaled_dot_product_attention(q, k, v, ~mask),
                        "the mask polarity is inverted: True means 'may attend', so fill -inf where the mask is False "
                        "(scores.masked_fill(~mask, float('-inf')))."))
    return tuple(bugs)


def check_attention(attention: Callable[..., tuple[Tensor, Tensor]]) -> CheckResult:
    """Check ``attention(q, k, v, mask=None) -> (out, weights)``, scaled dot-product attention.

    Shapes: q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v), mask (True = may attend)
        -> out (..., T_q, d_v), weights (..., T_q, T_k).
    """
    title = "check_attention"
    if (r := _not_callable(title, attention)) is not None:
        return r
    c = _Checker(title)
    g = torch.Generator().manual_seed(0)
    cases = [
        ("one query, three keys (T_q=1, T_k=3, d_k=4)", (1, 3, 4, 4), None),
        ("self-attention, batched with heads (2, 3, T=5, d_k=8)", (5, 5, 8, 8), None),
        ("cross-attention: T_q=3 queries, T_k=7 keys, d_v=6", (3, 7, 16, 6), None),
        ("large d_k=64, where the scale matters most", (4, 4, 64, 64), None),
        ("with a causal mask (True = may attend)", (5, 5, 8, 8), causal_mask(5)),
    ]
    for name, (T_q, T_k, d_k, d_v), mask in cases:
        lead = () if T_q == 1 else (2, 3)
        q = torch.randn(*lead, T_q, d_k, generator=g)
        k = torch.randn(*lead, T_k, d_k, generator=g)
        v = torch.randn(*lead, T_k, d_v, generator=g)
        expected = scaled_dot_product_attention(q, k, v, mask)
        answer = (lambda q=q, k=k, v=v, m=mask: attention(q, k, v, mask=m)) if mask is not None else \
            (lambda q=q, k=k, v=v: attention(q, k, v))
        c.case(name, answer, expected, bugs=_attention_bugs(q, k, v, mask),
               hint="return (weights @ v, weights) with weights = softmax(q @ k.transpose(-2, -1) / sqrt(d_k), dim=-1).",
               error_hint="use k.transpose(-2, -1) (not k.T) so that batch and head axes stay in front.")
    return c.done()


def check_softmax(softmax: Callable[[Tensor, float], Tensor]) -> CheckResult:
    """Check ``softmax(scores, temperature) -> weights`` over the last axis, numerically stable.

    Shapes: scores (..., n) -> (..., n).
    """
    title = "check_softmax"
    if (r := _not_callable(title, softmax)) is not None:
        return r
    c = _Checker(title)
    x = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, -1.0]])
    c.case("temperature 1", lambda: softmax(x, 1.0), torch.softmax(x, -1),
           bugs=(Bug(lambda: torch.softmax(x, 0), "normalize over the last axis (dim=-1): each row must sum to 1."),),
           hint="exp(x) / exp(x).sum(dim=-1, keepdim=True).")
    c.case("temperature 0.5 sharpens", lambda: softmax(x, 0.5), torch.softmax(x / 0.5, -1),
           bugs=(Bug(lambda: torch.softmax(x * 0.5, -1), "divide the scores by the temperature, don't multiply."),),
           hint="divide the scores by the temperature before the exponential.")
    c.case("temperature 10 flattens", lambda: softmax(x, 10.0), torch.softmax(x / 10.0, -1),
           hint="divide the scores by the temperature before the exponential.")
    big = torch.tensor([[1000.0, 1001.0, 1002.0]])
    c.case("large scores (1000, 1001, 1002) do not overflow", lambda: softmax(big, 1.0), torch.softmax(big, -1),
           hint="exp(1000) overflows to inf and inf/inf is NaN: subtract the row's maximum first "
                "(softmax is unchanged by adding a constant to every score).")
    return c.done()


# --------------------------------------------------------------------------- chapter 2: masking


def check_causal_mask(make_mask: Callable[[int], Tensor]) -> CheckResult:
    """Check ``make_mask(T) -> (T, T)`` boolean, True where query i may attend to key j (j <= i)."""
    title = "check_causal_mask"
    if (r := _not_callable(title, make_mask)) is not None:
        return r
    c = _Checker(title)
    for T in (1, 4, 9):
        expected = causal_mask(T)
        ones = torch.ones(T, T, dtype=torch.bool)
        c.case(f"T={T}", lambda T=T: make_mask(T), expected,
               bugs=(Bug(lambda: ~expected | torch.eye(T, dtype=torch.bool),
                         "this mask lets each position see the future and hides the past: True means 'may attend', "
                         "so keep the lower triangle (torch.tril)."),
                     Bug(lambda: ~expected, "the polarity is inverted: True must mean 'may attend'."),
                     Bug(lambda: torch.tril(ones, diagonal=-1),
                         "the diagonal is missing: a position may attend to itself.")),
               hint="torch.tril(torch.ones(T, T, dtype=torch.bool)).")
    return c.done()


def check_padding_mask(make_mask: Callable[[Tensor, int], Tensor]) -> CheckResult:
    """Check ``make_mask(tokens, pad_id) -> (B, 1, 1, T)`` boolean, True for real tokens."""
    title = "check_padding_mask"
    if (r := _not_callable(title, make_mask)) is not None:
        return r
    c = _Checker(title)
    for pad_id, tokens in ((0, torch.tensor([[5, 6, 7, 0, 0], [8, 9, 0, 0, 0]])),
                           (3, torch.tensor([[1, 2, 3, 3], [4, 5, 6, 7], [3, 3, 3, 3]]))):
        expected = padding_mask(tokens, pad_id)
        c.case(f"pad_id={pad_id}, batch of {tokens.shape[0]}", lambda t=tokens, p=pad_id: make_mask(t, p), expected,
               bugs=(Bug(lambda: ~expected, "the polarity is inverted: True marks real tokens (may attend), "
                                            "False marks padding."),
                     Bug(lambda: expected[:, 0, 0], "right values, but shape (B, T) does not broadcast over heads and "
                                                    "queries: add two axes, mask[:, None, None, :]."),),
               hint="(tokens != pad_id)[:, None, None, :].")
    return c.done()


def check_prefix_lm_mask(make_mask: Callable[[int, int], Tensor]) -> CheckResult:
    """Check ``make_mask(T, prefix_len) -> (T, T)`` boolean: the first ``prefix_len`` keys are visible to
    every query, the rest causally (True = may attend)."""
    title = "check_prefix_lm_mask"
    if (r := _not_callable(title, make_mask)) is not None:
        return r
    c = _Checker(title)
    for T, p in ((5, 2), (7, 3), (4, 0), (4, 4)):
        expected = prefix_lm_mask(T, p)
        causal = causal_mask(T)
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        name = f"T={T}, prefix_len={p}" + {0: " (no prefix: causal)", T: " (all prefix: bidirectional)"}.get(p, "")
        c.case(name, lambda T=T, p=p: make_mask(T, p), expected,
               bugs=(Bug(lambda e=expected: ~e, "the polarity is inverted: True must mean 'may attend'."),
                     Bug(lambda causal=causal, i=i, p=p: causal | (i < p),
                         "the prefix queries see the whole sequence, targets included: the prefix is bidirectional "
                         "only inside itself. Add the prefix as columns (keys j < prefix_len), not as rows."),
                     Bug(lambda causal=causal, j=j, p=p: causal | (j <= p),
                         "off by one: the prefix holds positions 0 .. prefix_len - 1, so use j < prefix_len."),
                     Bug(lambda causal=causal, j=j, p=p: causal & (j < p),
                         "combine with OR (|), not AND: a key is visible when it is in the past OR in the prefix."),
                     Bug(lambda i=i, j=j, p=p: (i < p) & (j < p),
                         "only the prefix block is allowed: the positions after the prefix must still attend "
                         "causally (OR the prefix block with the causal mask).")),
               hint="causal | in_prefix, with causal = torch.tril(torch.ones(T, T, dtype=torch.bool)) and "
                    "in_prefix = (torch.arange(T) < prefix_len)[None, :].")
    return c.done()


# --------------------------------------------------------------------------- chapter 3: multi-head attention


def _split_batch_first(x: Tensor, n_heads: int) -> Tensor:
    B, T, d_model = x.shape
    return x.view(B, T, n_heads, d_model // n_heads).transpose(1, 2)


def _split_seq_first_bug(x: Tensor, n_heads: int) -> Tensor:
    # Seq-first code applied to batch-first data: right for B = 1, mixes examples for B > 1.
    B, T, d_model = x.shape
    return x.reshape(T, B * n_heads, d_model // n_heads).transpose(0, 1).reshape(B, n_heads, T, d_model // n_heads)


_BATCH_HINT = ("right for a batch of one, wrong beyond: the batch axis got mixed into the head split. "
               "Keep B as its own axis: x.view(B, T, n_heads, d_head).transpose(1, 2).")


def check_split_heads(split_heads: Callable[[Tensor, int], Tensor]) -> CheckResult:
    """Check ``split_heads(x, n_heads)``. Shapes: x (B, T, d_model) -> (B, n_heads, T, d_head)."""
    title = "check_split_heads"
    if (r := _not_callable(title, split_heads)) is not None:
        return r
    c = _Checker(title)
    g = torch.Generator().manual_seed(1)
    for B, T, d_model, n_heads in ((1, 4, 8, 2), (3, 5, 12, 3), (2, 7, 16, 4)):
        x = torch.randn(B, T, d_model, generator=g)
        c.case(f"B={B}, T={T}, d_model={d_model}, n_heads={n_heads}", lambda x=x, h=n_heads: split_heads(x, h),
               _split_batch_first(x, n_heads),
               bugs=(Bug(lambda x=x, h=n_heads: _split_seq_first_bug(x, h), _BATCH_HINT),
                     Bug(lambda x=x, h=n_heads: x.reshape(B, h, T, d_model // h),
                         "right shape, wrong values: reshaping straight to (B, n_heads, T, d_head) cuts the sequence, "
                         "not the features. View as (B, T, n_heads, d_head) first, then transpose(1, 2).")),
               hint="x.view(B, T, n_heads, d_head).transpose(1, 2).")
    return c.done()


def check_multi_head_attention(mha_forward: Callable[..., Tensor]) -> CheckResult:
    """Check ``mha_forward(mha, query, key, value)`` computing multi-head attention by hand.

    It must use the projections of ``mha`` (a :class:`MultiHeadAttention`) and equal ``mha(query, key, value)``.

    Shapes: query (B, T_q, d_model), key/value (B, T_k, d_model) -> (B, T_q, d_model).
    """
    title = "check_multi_head_attention"
    if (r := _not_callable(title, mha_forward)) is not None:
        return r
    c = _Checker(title)
    with torch.random.fork_rng():  # the hidden cases must not disturb the reader's random stream
        torch.manual_seed(2)
        _mha_cases(c, mha_forward)
    return c.done()


def _mha_cases(c: _Checker, mha_forward: Callable[..., Tensor]) -> None:
    cases = (("self-attention, batch of 1", 1, 5, 5), ("self-attention, batch of 3", 3, 5, 5),
             ("cross-attention, T_q=4 queries, T_k=9 keys", 2, 4, 9))
    for name, B, T_q, T_k in cases:
        mha = MultiHeadAttention(16, 4).eval()
        query = torch.randn(B, T_q, 16)
        key = query if T_q == T_k else torch.randn(B, T_k, 16)

        def variant(split=_split_batch_first, scale=None, transpose_back=True, mha=mha, query=query, key=key):
            q = split(mha.q_proj(query), 4)
            k, v = split(mha.k_proj(key), 4), split(mha.v_proj(key), 4)
            out, _ = scaled_dot_product_attention(q, k, v, scale=scale)  # (B, n_heads, T_q, d_head)
            out = out.transpose(1, 2) if transpose_back else out
            return mha.out_proj(out.reshape(query.shape))

        with torch.no_grad():
            c.case(name, lambda mha=mha, query=query, key=key: mha_forward(mha, query, key, key),
                   mha(query, key, key),
                   bugs=(Bug(lambda v=variant: v(split=_split_seq_first_bug), _BATCH_HINT),
                         Bug(lambda v=variant: v(scale=1.0), "the scores are not scaled by 1 / sqrt(d_head)."),
                         Bug(lambda v=variant: v(transpose_back=False),
                             "merging heads needs transpose(1, 2) before the reshape to (B, T, d_model); "
                             "a plain reshape interleaves positions and heads.")),
                   hint="project with mha.q_proj/k_proj/v_proj, split into heads, attend with scale 1/sqrt(d_head), "
                        "merge heads (transpose(1, 2) then reshape), then mha.out_proj.",
                   error_hint="" if T_q == T_k else
                   "this fails when there are more keys than queries: do you reshape k and v with the query's "
                   "length? Use key.shape[1] (T_k) for them.")


# --------------------------------------------------------------------------- chapter 4: positional encoding


def _sinusoidal_variant(max_len: int, d_model: int, base: float = 10000.0, swap: bool = False,
                        exponent: str = "2i/d", concat: bool = False, start: int = 0,
                        multiply: bool = False) -> Tensor:
    """The sinusoidal encoding and its classic wrong versions (for the checker's bug list)."""
    pos = torch.arange(start, start + max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    pair = torch.arange(d_model // 2, dtype=torch.float64)  # i = 0 .. d/2 - 1
    power = {"2i/d": 2 * pair / d_model, "i/d": pair / d_model, "4i/d": 4 * pair / d_model}[exponent]
    angles = pos * base ** power if multiply else pos / base ** power  # (max_len, d/2)
    first, second = (torch.cos(angles), torch.sin(angles)) if swap else (torch.sin(angles), torch.cos(angles))
    if concat:
        return torch.cat([first, second], dim=-1).float()
    return torch.stack([first, second], dim=-1).flatten(-2).float()  # interleaved: sin, cos, sin, cos, ...


def check_sinusoidal_encoding(encoding: Callable[[int, int], Tensor]) -> CheckResult:
    """Check ``encoding(max_len, d_model) -> PE`` of Vaswani et al.: PE[pos, 2i] = sin(pos / 10000^(2i/d_model)),
    PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model)).

    Shapes: returns (max_len, d_model).
    """
    title = "check_sinusoidal_encoding"
    if (r := _not_callable(title, encoding)) is not None:
        return r
    c = _Checker(title)
    for max_len, d_model in ((10, 8), (50, 16), (100, 64)):
        v = _sinusoidal_variant
        c.case(f"max_len={max_len}, d_model={d_model}", lambda n=max_len, d=d_model: encoding(n, d),
               sinusoidal_encoding(max_len, d_model),
               bugs=(Bug(lambda n=max_len, d=d_model: v(n, d, swap=True),
                         "sin and cos are swapped: the even dimensions 2i hold the sine, the odd ones 2i+1 the cosine."),
                     Bug(lambda n=max_len, d=d_model: v(n, d, concat=True),
                         "you concatenate all the sines, then all the cosines; the encoding interleaves them: "
                         "dimension 2i is a sine and dimension 2i+1 the cosine of the same angle."),
                     Bug(lambda n=max_len, d=d_model: v(n, d, exponent="i/d"),
                         "the exponent is i/d_model; it is 2i/d_model, with i the index of the (sin, cos) pair "
                         "(equivalently j/d_model with j = 0, 2, 4, ... the even dimension)."),
                     Bug(lambda n=max_len, d=d_model: v(n, d, exponent="4i/d"),
                         "the exponent counts each pair twice: with j = 0, 2, 4, ... already even, use j/d_model, "
                         "not 2j/d_model."),
                     Bug(lambda n=max_len, d=d_model: v(n, d, multiply=True),
                         "the angle is pos DIVIDED by 10000^(2i/d_model): the wavelengths grow with i."),
                     Bug(lambda n=max_len, d=d_model: v(n, d, start=1),
                         "positions start at 0, not 1: the first row is sin(0) = 0, cos(0) = 1."),
                     Bug(lambda n=max_len, d=d_model: v(n, d, base=1000.0),
                         "the base is 10000, not 1000.")),
               hint="angles = pos / 10000 ** (2i / d_model) for pos = 0 .. max_len-1 and i = 0 .. d_model/2 - 1; "
                    "pe[:, 0::2] = sin(angles), pe[:, 1::2] = cos(angles).")
    return c.done()


def _rope_variant(x: Tensor, offset: int, sign: float = 1.0, halves: bool = False, concat: bool = False,
                  exponent: str = "2i/d", base: float = 10000.0) -> Tensor:
    """RoPE and its classic wrong versions (for the checker's bug list). Shapes: x (..., T, d_head) -> same."""
    T, d_head = x.shape[-2], x.shape[-1]
    pair = torch.arange(d_head // 2, dtype=torch.float64)
    power = {"2i/d": 2 * pair / d_head, "i/d": pair / d_head}[exponent]
    angles = torch.arange(offset, offset + T, dtype=torch.float64)[:, None] / base ** power  # (T, d_head/2)
    cos, sin = angles.cos().float(), sign * angles.sin().float()
    if halves:
        x1, x2 = x[..., : d_head // 2], x[..., d_head // 2:]
    else:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    a, b = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    if halves or concat:
        return torch.cat([a, b], dim=-1)
    return torch.stack([a, b], dim=-1).flatten(-2)


def check_rope(rope: Callable[[Tensor, int], Tensor]) -> CheckResult:
    """Check ``rope(x, offset) -> x rotated``: rotary position embedding with base 10000.

    The row t of ``x`` is at position m = offset + t; each pair (x[2i], x[2i+1]) turns by the angle
    m * 10000^(-2i/d_head), as :class:`~transformer_lib.positional.RotaryEmbedding` does.

    Shapes: x (..., T, d_head) -> (..., T, d_head).
    """
    title = "check_rope"
    if (r := _not_callable(title, rope)) is not None:
        return r
    c = _Checker(title)
    g = torch.Generator().manual_seed(4)
    cases = (("one head, T=6, d_head=8", (1, 1, 6, 8), 0), ("batch 2 x 3 heads, T=5, d_head=16", (2, 3, 5, 16), 0),
             ("d_head=64, T=12 (slow and fast pairs)", (1, 2, 12, 64), 0),
             ("offset=7: rows at positions 7, 8, 9, 10 (decoding with a cache)", (2, 2, 4, 8), 7))
    for name, shape, offset in cases:
        x = torch.randn(*shape, generator=g)
        expected = RotaryEmbedding(shape[-1], max_len=64)(x, offset)
        v = _rope_variant
        c.case(name, lambda x=x, o=offset: rope(x.clone(), o), expected,
               bugs=(Bug(lambda x=x, o=offset: v(x, o, sign=-1.0),
                         "you rotate by -theta: the pair becomes (x1 cos + x2 sin, -x1 sin + x2 cos). Multiply by "
                         "e^{+i m theta}: (x1 cos - x2 sin, x1 sin + x2 cos)."),
                     Bug(lambda x=x, o=offset: v(x, o, halves=True),
                         "you pair dimension i with i + d_head/2 (the 'rotate_half' layout of GPT-NeoX and Hugging "
                         "Face Llama); this library pairs neighbours (2i, 2i+1), as in the RoFormer paper."),
                     Bug(lambda x=x, o=offset: v(x, o, concat=True),
                         "right pairs, wrong output layout: the rotated pair i must go back to dimensions 2i and "
                         "2i+1 (stack on a new last axis, then flatten), not first halves then second halves."),
                     Bug(lambda x=x, o=offset: v(x, o, exponent="i/d"),
                         "the frequency of pair i is 10000^(-2i/d_head), not 10000^(-i/d_head)."),
                     Bug(lambda x=x: v(x, 0),
                         "the offset is ignored: row t is at position offset + t.")),
               hint="theta_i = 10000 ** (-2i / d_head); angle = (offset + t) * theta_i; with x1, x2 = x[..., 0::2], "
                    "x[..., 1::2], the result interleaves x1 cos - x2 sin and x1 sin + x2 cos.")
    return c.done()


# --------------------------------------------------------------------------- chapter 5: norms


def check_layer_norm(layer_norm: Callable[..., Tensor]) -> CheckResult:
    """Check ``layer_norm(x, weight, bias, eps=1e-5)`` against ``F.layer_norm`` over the last axis.

    Shapes: x (..., d), weight (d,), bias (d,) -> (..., d).
    """
    title = "check_layer_norm"
    if (r := _not_callable(title, layer_norm)) is not None:
        return r
    c = _Checker(title)
    g = torch.Generator().manual_seed(3)
    cases = (("small feature size d=4 (where the variance estimate matters)", torch.randn(2, 3, 4, generator=g) * 3),
             ("d=32, with an affine weight and bias", torch.randn(5, 32, generator=g) + 2),
             ("nearly constant features (variance 1e-6, where eps matters)", torch.randn(3, 8, generator=g) * 1e-3))
    for name, x in cases:
        d = x.shape[-1]
        w, b = torch.randn(d, generator=g), torch.randn(d, generator=g)
        mean = x.mean(-1, keepdim=True)

        def unbiased(x=x, w=w, b=b, mean=mean):
            return (x - mean) / torch.sqrt(x.var(-1, keepdim=True, unbiased=True) + 1e-5) * w + b

        def eps_outside(x=x, w=w, b=b, mean=mean):
            return (x - mean) / (x.std(-1, keepdim=True, unbiased=False) + 1e-5) * w + b

        def unbiased_eps_outside(x=x, w=w, b=b, mean=mean):
            return (x - mean) / (x.std(-1, keepdim=True) + 1e-5) * w + b

        c.case(name, lambda x=x, w=w, b=b: layer_norm(x, w, b, eps=1e-5), F.layer_norm(x, (d,), w, b, 1e-5),
               bugs=(Bug(unbiased, "you use the unbiased variance (dividing by d - 1); LayerNorm divides by d: "
                                   "x.var(dim=-1, unbiased=False)."),
                     Bug(eps_outside, "eps must go inside the square root: (x - mean) / sqrt(var + eps), "
                                      "not (x - mean) / (std + eps)."),
                     Bug(unbiased_eps_outside, "two classic bugs at once: torch.std is unbiased by default, and eps "
                                               "belongs inside the square root: (x - mean) / sqrt(var + eps) with "
                                               "var = x.var(dim=-1, unbiased=False)."),
                     Bug(lambda x=x: F.layer_norm(x, (d,), eps=1e-5), "apply the learned weight and bias: "
                                                                       "normalized * weight + bias.")),
               hint="normalize each position over its last axis: (x - mean) / sqrt(var + eps) * weight + bias.")
    return c.done()


def check_rms_norm(rms_norm: Callable[..., Tensor]) -> CheckResult:
    """Check ``rms_norm(x, weight, eps=1e-6)``: ``x / sqrt(mean(x^2) + eps) * weight`` over the last axis.

    Shapes: x (..., d), weight (d,) -> (..., d).
    """
    title = "check_rms_norm"
    if (r := _not_callable(title, rms_norm)) is not None:
        return r
    c = _Checker(title)
    g = torch.Generator().manual_seed(5)
    eps = 1e-6
    cases = (("d=8, features with a non-zero mean (where centring matters)", torch.randn(2, 3, 8, generator=g) + 2),
             ("d=32, with a learned weight", torch.randn(5, 32, generator=g) * 3),
             ("tiny features (mean square 1e-6, where eps matters)", torch.randn(3, 16, generator=g) * 1e-3))
    for name, x in cases:
        d = x.shape[-1]
        w = torch.randn(d, generator=g)
        ms = x.pow(2).mean(-1, keepdim=True)  # (..., 1) mean square
        c.case(name, lambda x=x, w=w: rms_norm(x, w, eps=eps), F.rms_norm(x, (d,), w, eps),
               bugs=(Bug(lambda x=x, w=w: F.layer_norm(x, (d,), w, None, eps),
                         "you subtract the mean: that is LayerNorm without a bias. RMSNorm does not centre; it "
                         "divides x itself by its root mean square."),
                     Bug(lambda x=x, w=w, ms=ms: x / (ms.sqrt() + eps) * w,
                         "eps must go inside the square root: x / sqrt(mean(x^2) + eps), not x / (rms + eps)."),
                     Bug(lambda x=x, ms=ms: x * torch.rsqrt(ms + eps),
                         "apply the learned weight: the normalized x is multiplied by weight."),
                     Bug(lambda x=x, w=w: x / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps) * w,
                         "you divide by the standard deviation (the spread around the mean); RMSNorm divides by the "
                         "root mean square of x itself, sqrt(mean(x^2) + eps)."),
                     Bug(lambda x=x, w=w, ms=ms: x * torch.rsqrt(ms * d + eps) * w,
                         "x.norm(dim=-1) is the root of the SUM of squares; the RMS is the root of the MEAN, "
                         "sqrt(d) times smaller: use x.pow(2).mean(dim=-1, keepdim=True).")),
               hint="x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.")
    return c.done()


def check_pre_ln_block(block: Callable[..., Tensor]) -> CheckResult:
    """Check ``block(x, sublayer, norm)``: one Pre-LN residual block, ``x + sublayer(norm(x))``.

    ``sublayer`` and ``norm`` are modules (a feed-forward network and a LayerNorm in the hidden cases).

    Shapes: x (B, T, d_model) -> (B, T, d_model).
    """
    from .layers import FeedForward
    from .norms import LayerNorm

    title = "check_pre_ln_block"
    if (r := _not_callable(title, block)) is not None:
        return r
    c = _Checker(title)
    with torch.random.fork_rng():  # the hidden cases must not disturb the reader's random stream
        torch.manual_seed(7)
        for name, (B, T, d) in (("one sequence, d_model=8", (1, 4, 8)), ("a batch of 3, d_model=16", (3, 5, 16))):
            norm, sublayer = LayerNorm(d), FeedForward(d, 4 * d, activation="gelu")
            with torch.no_grad():
                norm.weight.normal_(1.0, 0.3)
                norm.bias.normal_(0.0, 0.3)
            x = torch.randn(B, T, d) * 4 + 1  # far from normalized, so a normalized skip path shows
            with torch.no_grad():
                expected = x + sublayer(norm(x))
                h = norm(x)
                bugs = (Bug(lambda: norm(x + sublayer(x)),
                            "this is Post-LN, the paper's order norm(x + sublayer(x)); Pre-LN normalizes the "
                            "sublayer's input only: x + sublayer(norm(x))."),
                        Bug(lambda h=h: h + sublayer(h),
                            "you normalize x in place before the residual add (x = norm(x); x = x + sublayer(x)): "
                            "the skip path then carries norm(x) instead of x. Keep x and add sublayer(norm(x)) to it."),
                        Bug(lambda h=h: sublayer(h),
                            "the residual connection is missing: add the block's input x to sublayer(norm(x))."),
                        Bug(lambda: x + norm(sublayer(x)),
                            "the norm is applied to the sublayer's output; Pre-LN normalizes its input: "
                            "x + sublayer(norm(x))."))
                c.case(name, lambda x=x, sublayer=sublayer, norm=norm: block(x, sublayer, norm), expected, bugs=bugs,
                       hint="return x + sublayer(norm(x)).", atol=1e-4)
    return c.done()


# --------------------------------------------------------------------------- chapter 6: encoder-decoder


def check_shift_right(shift_right: Callable[[Tensor], tuple[Tensor, Tensor]]) -> CheckResult:
    """Check ``shift_right(tgt) -> (decoder_input, labels)`` for teacher forcing.

    ``tgt`` holds ``<bos>`` (1), the target tokens, ``<eos>`` (2) and padding (0). The decoder
    reads ``tgt[:, :-1]`` and is trained to predict ``tgt[:, 1:]``.

    Shapes: tgt (B, T + 1) -> decoder_input (B, T), labels (B, T).
    """
    title = "check_shift_right"
    if (r := _not_callable(title, shift_right)) is not None:
        return r
    c = _Checker(title)
    cases = (("one target, <bos> a b c <eos>", torch.tensor([[1, 5, 6, 7, 2]])),
             ("a padded batch of two", torch.tensor([[1, 5, 6, 7, 8, 2], [1, 9, 10, 2, 0, 0]])),
             ("a batch of three, one of them empty (<bos> <eos>)",
              torch.tensor([[1, 4, 2, 0], [1, 2, 0, 0], [1, 7, 7, 2]])))
    for name, tgt in cases:
        bos = torch.full_like(tgt[:, :1], 1)
        bugs = (Bug(lambda tgt=tgt: (tgt, tgt),
                    "no shift: the decoder would read the very token it has to predict and learn to copy it. "
                    "Feed tgt[:, :-1] and predict tgt[:, 1:]."),
                Bug(lambda tgt=tgt: (tgt[:, 1:], tgt[:, :-1]),
                    "shifted the wrong way: the decoder input must start with <bos> (tgt[:, :-1]) and the labels "
                    "are the same sequence one step ahead (tgt[:, 1:])."),
                Bug(lambda tgt=tgt, bos=bos: (torch.cat([bos, tgt[:, :-1]], dim=1), tgt),
                    "the labels start with <bos>: you prepended another <bos> to a target that already has one, so "
                    "the model is trained to predict <bos> first. The targets here already start with <bos>: "
                    "just drop the last token for the input and the first for the labels."),
                Bug(lambda tgt=tgt: (tgt[:, :-1], tgt[:, :-1]),
                    "the labels equal the decoder input: position t must predict the NEXT token, tgt[:, 1:]."),
                Bug(lambda tgt=tgt: (tgt[:, :-2], tgt[:, 1:-1]),
                    "you dropped a token too many: the labels must keep the last column, with <eos>, "
                    "or the model never learns when to stop."))
        c.case(name, lambda tgt=tgt: shift_right(tgt.clone()), (tgt[:, :-1], tgt[:, 1:]), bugs=bugs,
               hint="return tgt[:, :-1], tgt[:, 1:].")
    return c.done()


def _decoder_variant(layer: Any, x: Tensor, memory: Tensor, memory_mask: Tensor | None, causal: bool = True,
                     self_on_memory: bool = False, cross_on_x: bool = False, norm_first: bool | None = None,
                     use_memory_mask: bool = True) -> Tensor:
    """A decoder layer computed from ``layer``'s parts, optionally with one of the classic mistakes."""
    norm_first = layer.norm_first if norm_first is None else norm_first
    mask = memory_mask if use_memory_mask else None

    def self_attend(h: Tensor) -> Tensor:
        if self_on_memory:
            return layer.self_attn(h, memory, memory, mask=mask)
        return layer.self_attn(h, h, h, is_causal=causal)

    def cross_attend(h: Tensor) -> Tensor:
        if cross_on_x:
            return layer.cross_attn(h, h, h)
        return layer.cross_attn(h, memory, memory, mask=mask)

    for sublayer, norm in ((self_attend, layer.norm1), (cross_attend, layer.norm2), (layer.ff, layer.norm3)):
        x = x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))
    return x


def check_decoder_layer(decoder_layer: Callable[..., Tensor]) -> CheckResult:
    """Check ``decoder_layer(layer, x, memory, memory_mask)``, a decoder layer's forward pass by hand.

    ``layer`` is a :class:`~transformer_lib.layers.DecoderLayer` (no dropout); the answer must use its
    parts (``self_attn``, ``cross_attn``, ``ff``, ``norm1..3``), honour ``layer.norm_first`` and equal
    ``layer(x, memory, memory_mask=memory_mask, tgt_is_causal=True)``. A leak check changes the last
    target position and requires every earlier output to stay the same.

    Shapes: x (B, T, d_model), memory (B, S, d_model), memory_mask (B, 1, 1, S) or None -> (B, T, d_model).
    """
    from .layers import DecoderLayer

    title = "check_decoder_layer"
    if (r := _not_callable(title, decoder_layer)) is not None:
        return r
    c = _Checker(title)
    with torch.random.fork_rng():  # the hidden cases must not disturb the reader's random stream
        torch.manual_seed(6)
        cases = (("Post-LN, B=2, T=5 target positions, S=7 source positions", False, False),
                 ("Post-LN, the second source padded (memory_mask)", False, True),
                 ("Pre-LN (layer.norm_first=True), with padding", True, True))
        for name, norm_first, padded in cases:
            layer = DecoderLayer(16, 4, 32, dropout=0.0, norm_first=norm_first).eval()
            x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
            memory_mask = padding_mask(torch.tensor([[3] * 7, [3] * 4 + [0] * 3]), 0) if padded else None
            with torch.no_grad():
                expected = layer(x, memory, memory_mask=memory_mask, tgt_is_causal=True)
                args = (layer, x, memory, memory_mask)
                bugs = [Bug(lambda a=args: _decoder_variant(*a, causal=False),
                            "the self-attention is not causal: position t sees the target tokens after it, which at "
                            "generation time do not exist yet. Pass is_causal=True (or a causal mask)."),
                        Bug(lambda a=args: _decoder_variant(*a, self_on_memory=True),
                            "the first attention reads the encoder output: self-attention takes its keys and values "
                            "from x (the target so far); only cross-attention reads memory."),
                        Bug(lambda a=args: _decoder_variant(*a, cross_on_x=True),
                            "cross-attention attends to x: its queries come from x, but its keys and values come "
                            "from the encoder output, memory."),
                        Bug(lambda a=args, nf=norm_first: _decoder_variant(*a, norm_first=not nf),
                            f"you wrote {'Post-LN' if norm_first else 'Pre-LN'}, but this layer has "
                            f"norm_first={norm_first}: Post-LN is x = norm(x + f(x)), Pre-LN x = x + f(norm(x)).")]
                if padded:
                    bugs.append(Bug(lambda a=args: _decoder_variant(*a, use_memory_mask=False),
                                    "cross-attention ignores memory_mask, so the target attends to the source's "
                                    "padding: pass mask=memory_mask to layer.cross_attn."))
                c.case(name, lambda a=args: decoder_layer(*a), expected, bugs=tuple(bugs),
                       hint="three residual blocks in order: causal self-attention on x, cross-attention from x to "
                            "memory (with memory_mask), the feed-forward network; each with its norm, placed as "
                            "layer.norm_first says.", atol=1e-4)
        layer = DecoderLayer(16, 4, 32, dropout=0.0).eval()
        x, memory = torch.randn(2, 6, 16), torch.randn(2, 7, 16)
        changed = x.clone()
        changed[:, -1] = torch.randn(2, 16) * 3  # a different last target token
        with torch.no_grad():
            expected = layer(x, memory, tgt_is_causal=True)[:, :-1]
            c.case("leak check: changing the last target position leaves the earlier outputs unchanged",
                   lambda: decoder_layer(layer, changed, memory, None)[:, :-1], expected,
                   hint="an earlier position's output changed when a later target token changed: the decoder can see "
                        "the future. Use a causal mask in the self-attention.", atol=1e-4)
    return c.done()


def check_label_smoothing(smooth: Callable[[Tensor, int, float], Tensor]) -> CheckResult:
    """Check ``smooth(targets, vocab_size, eps) -> (N, vocab_size)``, the label-smoothed target distribution.

    As in ``F.cross_entropy(..., label_smoothing=eps)`` (Szegedy et al. 2016): ``(1 - eps)`` on the true
    class plus ``eps / vocab_size`` on every class, so each row sums to 1.

    Shapes: targets (N,) class ids -> (N, vocab_size).
    """
    title = "check_label_smoothing"
    if (r := _not_callable(title, smooth)) is not None:
        return r
    c = _Checker(title)
    for targets, V, eps in ((torch.tensor([0, 3]), 5, 0.1), (torch.tensor([2, 2, 7, 11]), 12, 0.2),
                            (torch.tensor([1, 4]), 6, 0.0)):
        one_hot = F.one_hot(targets, V).float()
        name = f"{len(targets)} targets, vocab_size={V}, eps={eps}" + (" (no smoothing: one-hot)" if eps == 0 else "")
        c.case(name, lambda t=targets, V=V, eps=eps: smooth(t.clone(), V, eps), (1 - eps) * one_hot + eps / V,
               bugs=(Bug(lambda o=one_hot, V=V, eps=eps: o + eps / V,
                         "the rows sum to more than 1: take eps away from the true class, (1 - eps) * one_hot."),
                     Bug(lambda o=one_hot, eps=eps: (1 - eps) * o,
                         "the rows sum to less than 1: spread the eps you took away evenly, + eps / vocab_size."),
                     Bug(lambda o=one_hot, V=V, eps=eps: (1 - eps) * o + eps / (V - 1) * (1 - o),
                         "you spread eps over the other vocab_size - 1 classes; PyTorch's label_smoothing (and "
                         "Szegedy et al.) spread it over all vocab_size classes, the true one included."),
                     Bug(lambda o=one_hot, V=V, eps=eps: eps * o + (1 - eps) / V,
                         "eps and 1 - eps are swapped: the true class keeps most of the mass, 1 - eps.")),
               hint="(1 - eps) * F.one_hot(targets, vocab_size) + eps / vocab_size, as a float tensor.")
    return c.done()


# --------------------------------------------------------------------------- chapter 7: sampling


def check_top_k_filter(top_k_filter: Callable[[Tensor, int], Tensor]) -> CheckResult:
    """Check ``top_k_filter(logits, k)``: keep the ``k`` largest logits of each row, set the rest to -inf.

    Shapes: logits (B, V) -> (B, V).
    """
    from .sampling import top_k_filter as reference

    title = "check_top_k_filter"
    if (r := _not_callable(title, top_k_filter)) is not None:
        return r
    c = _Checker(title)
    g = torch.Generator().manual_seed(4)
    cases = (("one row, k=2", torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2),
             ("a batch of 3 rows, k=5 of 10", torch.randn(3, 10, generator=g), 5),
             ("k=1 is greedy", torch.randn(2, 6, generator=g), 1),
             ("k larger than the vocabulary keeps everything", torch.randn(2, 4, generator=g), 10))
    for name, logits, k in cases:
        kth = logits.topk(min(k, logits.shape[-1]), dim=-1).values[..., -1:]
        c.case(name, lambda logits=logits, k=k: top_k_filter(logits.clone(), k), reference(logits, k),
               bugs=(Bug(lambda logits=logits, kth=kth: logits.masked_fill(logits < kth, 0.0),
                         "masked logits must become -inf, not 0: a logit of 0 still has probability e^0 / Z."),
                     Bug(lambda logits=logits, kth=kth: logits.masked_fill(logits >= kth, float("-inf")),
                         "the comparison is flipped: you removed the k best tokens and kept the rest."),
                     Bug(lambda logits=logits, k=k: logits.masked_fill(
                         logits < logits.flatten().topk(min(k, logits.numel())).values[-1], float("-inf")),
                         "the k-th largest value must be found per row (topk(..., dim=-1)), not over the whole batch.")),
               hint="kth = logits.topk(k, dim=-1).values[..., -1:]; logits.masked_fill(logits < kth, float('-inf')).",
               error_hint="k may be larger than the vocabulary: use min(k, logits.shape[-1]).")
    return c.done()


def check_top_p_filter(top_p_filter: Callable[[Tensor, float], Tensor]) -> CheckResult:
    """Check ``top_p_filter(logits, p)``: keep the smallest set of most likely tokens whose probability reaches ``p``.

    Shapes: logits (B, V) -> (B, V), dropped tokens set to -inf; the most likely token is always kept.
    """
    from .sampling import top_p_filter as reference

    title = "check_top_p_filter"
    if (r := _not_callable(title, top_p_filter)) is not None:
        return r
    c = _Checker(title)
    g = torch.Generator().manual_seed(5)
    logits1 = torch.log(torch.tensor([[0.05, 0.5, 0.3, 0.15]]))
    cases = (("probabilities (0.05, 0.5, 0.3, 0.15), p=0.7", logits1, 0.7),
             ("same, p=0.5: the top token alone reaches p", logits1, 0.5),
             ("same, p=0.3: the top token is kept even beyond p", logits1, 0.3),
             ("a batch of 3 rows of 12, p=0.9", torch.randn(3, 12, generator=g) * 2, 0.9),
             ("p=1.0 keeps everything", torch.randn(2, 5, generator=g), 1.0))

    def exclusive_bug(logits: Tensor, p: float) -> Tensor:  # drops the token that crosses p
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        drop_sorted = sorted_logits.softmax(-1).cumsum(-1) > p
        return logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))

    def unsorted_bug(logits: Tensor, p: float) -> Tensor:  # cumulative sum in vocabulary order
        probs = logits.softmax(-1)
        return logits.masked_fill(probs.cumsum(-1) - probs >= p, float("-inf"))

    for name, logits, p in cases:
        c.case(name, lambda logits=logits, p=p: top_p_filter(logits.clone(), p), reference(logits, p),
               bugs=(Bug(lambda logits=logits, p=p: exclusive_bug(logits, p),
                         "you drop the token that makes the total cross p; nucleus sampling keeps it (keep a token "
                         "when the probability of the tokens ranked above it is still below p)."),
                     Bug(lambda logits=logits, p=p: unsorted_bug(logits, p),
                         "sort the probabilities in descending order before the cumulative sum; in vocabulary "
                         "order the 'nucleus' is arbitrary tokens.")),
               hint="sort descending, cumulative probabilities, drop a token when the mass ranked above it is >= p, "
                    "then scatter the drop mask back to vocabulary order.")
    return c.done()

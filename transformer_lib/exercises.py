"""Automatic checkers for the chapters' exercises.

Each ``check_<name>(student_answer)`` runs hidden cases (shapes, equality with the
library, leak checks), prints friendly feedback (which case failed, expected vs got,
a hint) and returns a :class:`CheckResult`. A wrong answer never crashes a checker.
When a case fails, the checker compares the answer with the classic bugs that popular
tutorials ship (a missing 1/sqrt(d_k), softmax over the wrong axis, an inverted mask,
the batch mixed into the head split, keys reshaped with the query's length, a
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
from .masks import causal_mask, padding_mask


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
    if not got.is_floating_point():
        return f"expected a floating-point tensor, got dtype {got.dtype}"
    got, expected = got.detach().double(), expected.detach().double()
    if torch.isnan(got).any() and not torch.isnan(expected).any():
        return "the result contains NaN"
    if not torch.allclose(got, expected, atol=atol, rtol=1e-4):
        return f"values differ: largest |got - expected| = {(got - expected).abs().max().item():.3g}"
    return None


def _nan_to_zero(x: Any) -> Any:
    if isinstance(x, tuple):
        return tuple(_nan_to_zero(t) for t in x)
    return x.nan_to_num(0.0) if isinstance(x, Tensor) and x.is_floating_point() else x


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

"""The checkers accept right answers and name the classic bugs in wrong ones, without crashing."""

import inspect
import json
import math
import random
import threading
import time
import typing

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_lib import (
    RotaryEmbedding,
    causal_mask,
    padding_mask,
    prefix_lm_mask,
    sampling,
    scaled_dot_product_attention,
    sinusoidal_encoding,
)
from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import (
    _framework,
    ch01_attention,
    ch02_masking,
    ch03_multi_head_attention,
    ch04_positional_encoding,
    ch05_norms_and_residuals,
    ch06_encoder_decoder,
    ch07_decoder_only,
)


def hf_encode_word(word: str, merges: list[tuple[str, str]]) -> list[str]:
    """An independent BPE encoder: Hugging Face tokenizers' BPE model with the given merges."""
    tokenizers = pytest.importorskip("tokenizers")
    symbols = set(word) | {s for a, b in merges for s in (a, b, a + b)}
    vocab = {s: i for i, s in enumerate(sorted(symbols))}
    return [t.value for t in tokenizers.models.BPE(vocab, list(merges)).tokenize(word)]


def good_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return w @ v, w


@pytest.mark.filterwarnings("ignore:The use of `x.T`")
def test_attention_checker(capsys):
    assert ex.check_attention(good_attention).passed
    assert "All 5 checks passed" in capsys.readouterr().out

    def no_scale(q, k, v, mask=None):
        w = torch.softmax(
            (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
            if mask is not None
            else q @ k.transpose(-2, -1),
            dim=-1,
        )
        return w @ v, w

    def wrong_axis(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        w = torch.softmax(s if mask is None else s.masked_fill(~mask, float("-inf")), dim=-2)
        return w @ v, w

    def inverted(q, k, v, mask=None):
        return good_attention(q, k, v, None if mask is None else ~mask)

    def uses_dot_T(q, k, v, mask=None):
        w = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)
        return w @ v, w

    for wrong, words in (
        (no_scale, "sqrt(d_k)"),
        (wrong_axis, "dim=-1"),
        (inverted, "polarity is inverted"),
        (uses_dot_T, "k.transpose(-2, -1)"),
    ):
        result = ex.check_attention(wrong)
        assert not result.passed
        assert words in result.text, (wrong.__name__, result.text)
    assert not ex.check_attention(lambda q, k, v, mask=None: None).passed
    assert not ex.check_attention("not a function").passed


def test_softmax_checker():
    def stable(x, t):
        z = x / t
        z = z - z.max(-1, keepdim=True).values
        return z.exp() / z.exp().sum(-1, keepdim=True)

    def naive(x, t):
        return (x / t).exp() / (x / t).exp().sum(-1, keepdim=True)

    assert ex.check_softmax(stable).passed
    result = ex.check_softmax(naive)
    assert not result.passed and "subtract the row's maximum" in result.text
    assert "multiply" in ex.check_softmax(lambda x, t: stable(x * t, 1.0)).text


def test_mask_checkers():
    assert ex.check_causal_mask(lambda T: torch.tril(torch.ones(T, T, dtype=torch.bool))).passed
    upper = ex.check_causal_mask(lambda T: torch.triu(torch.ones(T, T, dtype=torch.bool)))
    assert not upper.passed and "see the future" in upper.text
    strict = ex.check_causal_mask(lambda T: torch.tril(torch.ones(T, T, dtype=torch.bool), -1))
    assert strict.text.count("the diagonal is masked") == 3, strict.text  # T=1 too, where it equals ~mask
    assert "polarity" not in strict.text
    assert (
        "polarity is inverted" in ex.check_causal_mask(lambda T: ~torch.tril(torch.ones(T, T, dtype=torch.bool))).text
    )
    assert "boolean" in ex.check_causal_mask(lambda T: torch.tril(torch.ones(T, T))).text
    assert ex.check_padding_mask(lambda t, p: (t != p)[:, None, None, :]).passed
    assert "polarity is inverted" in ex.check_padding_mask(lambda t, p: (t == p)[:, None, None, :]).text
    assert "does not broadcast" in ex.check_padding_mask(lambda t, p: t != p).text


def test_prefix_lm_mask_checker():
    def good(T, p):
        return torch.tril(torch.ones(T, T, dtype=torch.bool)) | (torch.arange(T) < p)[None, :]

    def prefix_rows(T, p):  # the prefix queries see everything, targets included
        return torch.tril(torch.ones(T, T, dtype=torch.bool)) | (torch.arange(T) < p)[:, None]

    def off_by_one(T, p):
        return torch.tril(torch.ones(T, T, dtype=torch.bool)) | (torch.arange(T) <= p)[None, :]

    def and_not_or(T, p):
        return torch.tril(torch.ones(T, T, dtype=torch.bool)) & (torch.arange(T) < p)[None, :]

    def block_only(T, p):
        in_prefix = torch.arange(T) < p
        return in_prefix[:, None] & in_prefix[None, :]

    assert ex.check_prefix_lm_mask(good).passed
    for wrong, words in (
        (lambda T, p: ~good(T, p), "polarity is inverted"),
        (prefix_rows, "not as rows"),
        (off_by_one, "off by one"),
        (and_not_or, "OR (|), not AND"),
        (block_only, "still attend causally"),
    ):
        result = ex.check_prefix_lm_mask(wrong)
        assert not result.passed and words in result.text, result.text
    assert "boolean" in ex.check_prefix_lm_mask(lambda T, p: good(T, p).float()).text
    assert not ex.check_prefix_lm_mask(lambda T, p: None).passed  # a stub does not crash the checker
    assert not ex.check_prefix_lm_mask(42).passed


def test_split_heads_checker_catches_batch_mixing():
    def good(x, n_heads):
        B, T, d = x.shape
        return x.view(B, T, n_heads, d // n_heads).transpose(1, 2)

    def seq_first(x, n_heads):
        B, T, d = x.shape
        return x.reshape(T, B * n_heads, d // n_heads).transpose(0, 1).reshape(B, n_heads, T, d // n_heads)

    assert ex.check_split_heads(good).passed
    result = ex.check_split_heads(seq_first)
    assert not result.passed
    assert "✅ B=1" in result.text  # right for a batch of one ...
    assert "batch axis got mixed" in result.text  # ... and named when B > 1


def test_multi_head_attention_checker():
    def good(mha, query, key, value):
        B, T_q, d = query.shape
        T_k, h = key.shape[1], mha.n_heads
        q = mha.q_proj(query).view(B, T_q, h, d // h).transpose(1, 2)
        k = mha.k_proj(key).view(B, T_k, h, d // h).transpose(1, 2)
        v = mha.v_proj(value).view(B, T_k, h, d // h).transpose(1, 2)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h), dim=-1)
        return mha.out_proj((w @ v).transpose(1, 2).reshape(B, T_q, d))

    def query_length_bug(mha, query, key, value):
        B, T, d = query.shape  # the classic: T taken from the query, used for keys and values too
        h = mha.n_heads
        q = mha.q_proj(query).view(B, T, h, d // h).transpose(1, 2)
        k = mha.k_proj(key).view(B, T, h, d // h).transpose(1, 2)
        v = mha.v_proj(value).view(B, T, h, d // h).transpose(1, 2)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h), dim=-1)
        return mha.out_proj((w @ v).transpose(1, 2).reshape(B, T, d))

    before = torch.get_rng_state()
    assert ex.check_multi_head_attention(good).passed
    assert torch.equal(before, torch.get_rng_state())  # the checker leaves the reader's RNG alone
    result = ex.check_multi_head_attention(query_length_bug)
    assert not result.passed and "more keys than queries" in result.text
    assert result.text.count("✅") == 2  # self-attention cases pass


def test_layer_norm_checker():
    def good(x, w, b, eps=1e-5):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + eps) * w + b

    def unbiased(x, w, b, eps=1e-5):
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + eps) * w + b

    def eps_outside(x, w, b, eps=1e-5):
        return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True, unbiased=False) + eps) * w + b

    def annotated_transformer(x, w, b, eps=1e-5):  # torch.std (unbiased) + eps outside the root
        return w * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + eps) + b

    assert ex.check_layer_norm(good).passed
    assert "unbiased variance" in ex.check_layer_norm(unbiased).text
    assert "inside the square root" in ex.check_layer_norm(eps_outside).text
    assert "two classic bugs" in ex.check_layer_norm(annotated_transformer).text
    assert "weight and bias" in ex.check_layer_norm(lambda x, w, b, eps=1e-5: good(x, 1, 0, eps)).text


# ---------------------------------------------------------------- chapter 4: positional encoding


def _sinusoidal(max_len, d_model, swap=False, concat=False, power=2, start=0, multiply=False, base=10000.0):
    pos = torch.arange(start, start + max_len, dtype=torch.float32)[:, None]
    i = torch.arange(d_model // 2, dtype=torch.float32)
    scale = base ** (power * i / d_model)
    angles = pos * scale if multiply else pos / scale
    a, b = (angles.cos(), angles.sin()) if swap else (angles.sin(), angles.cos())
    if concat:
        return torch.cat([a, b], dim=-1)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2], pe[:, 1::2] = a, b
    return pe


def test_sinusoidal_encoding_checker():
    assert ex.check_sinusoidal_encoding(_sinusoidal).passed
    for kw, words in (
        (dict(swap=True), "swapped"),
        (dict(concat=True), "interleaves"),
        (dict(power=1), "2i/d_model, with i the index"),
        (dict(power=4), "counts each pair twice"),
        (dict(multiply=True), "DIVIDED"),
        (dict(start=1), "start at 0"),
        (dict(base=1000.0), "not 1000"),
    ):
        result = ex.check_sinusoidal_encoding(lambda n, d, kw=kw: _sinusoidal(n, d, **kw))
        assert not result.passed and words in result.text, (kw, result.text)
    assert not ex.check_sinusoidal_encoding(lambda n, d: None).passed  # a stub does not crash the checker
    assert not ex.check_sinusoidal_encoding("not a function").passed


def _rope(x, offset, sign=1.0, halves=False, concat=False, power=2, ignore_offset=False):
    T, d = x.shape[-2:]
    theta = 10000.0 ** (-power * torch.arange(d // 2) / d)  # (d/2,)
    m = torch.arange(T) + (0 if ignore_offset else offset)
    angle = m[:, None] * theta  # (T, d/2)
    cos, sin = angle.cos(), sign * angle.sin()
    x1, x2 = (x[..., : d // 2], x[..., d // 2 :]) if halves else (x[..., 0::2], x[..., 1::2])
    a, b = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    if halves or concat:
        return torch.cat([a, b], dim=-1)
    out = torch.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a, b
    return out


def test_rope_checker():
    assert ex.check_rope(_rope).passed

    def by_complex(x, offset):  # an independent right answer: multiply by e^{i m theta}
        T, d = x.shape[-2:]
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
        angle = torch.arange(offset, offset + T)[:, None] * 10000.0 ** (-torch.arange(0, d, 2) / d)
        return torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle)).flatten(-2)

    assert ex.check_rope(by_complex).passed
    for kw, words in (
        (dict(sign=-1.0), "-theta"),
        (dict(halves=True), "rotate_half"),
        (dict(concat=True), "wrong output layout"),
        (dict(power=1), "not 10000^(-i/d_head)"),
        (dict(ignore_offset=True), "offset is ignored"),
    ):
        result = ex.check_rope(lambda x, o, kw=kw: _rope(x, o, **kw))
        assert not result.passed and words in result.text, (kw, result.text)
    assert ex.check_rope(lambda x, o: _rope(x, o, ignore_offset=True)).text.count("✅") == 3  # only offset=7 fails
    assert not ex.check_rope(lambda x, o: None).passed
    assert not ex.check_rope(None).passed


def test_rms_norm_checker():
    def good(x, w, eps=1e-6):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def centred(x, w, eps=1e-6):
        return good(x - x.mean(-1, keepdim=True), w, eps)

    def eps_outside(x, w, eps=1e-6):
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w

    def no_weight(x, w, eps=1e-6):
        return good(x, 1.0, eps)

    def std(x, w, eps=1e-6):
        return x / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps) * w

    def vector_norm(x, w, eps=1e-6):
        return x / torch.sqrt(x.norm(dim=-1, keepdim=True) ** 2 + eps) * w

    assert ex.check_rms_norm(good).passed
    assert ex.check_rms_norm(lambda x, w, eps=1e-6: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)).passed
    for wrong, words in (
        (centred, "you subtract the mean"),
        (eps_outside, "inside the square root"),
        (no_weight, "apply the learned weight"),
        (std, "standard deviation"),
        (vector_norm, "SUM of squares"),
    ):
        result = ex.check_rms_norm(wrong)
        assert not result.passed
        assert words in result.text, (wrong.__name__, result.text)
    assert not ex.check_rms_norm(lambda x, w, eps=1e-6: None).passed
    assert not ex.check_rms_norm(42).passed


def test_pre_ln_block_checker():
    def good(x, sublayer, norm):
        return x + sublayer(norm(x))

    def post_ln(x, sublayer, norm):
        return norm(x + sublayer(x))

    def norm_in_place(x, sublayer, norm):  # the tutorial bug: x = norm(x); x = x + sublayer(x)
        x = norm(x)
        return x + sublayer(x)

    def no_residual(x, sublayer, norm):
        return sublayer(norm(x))

    def norm_after(x, sublayer, norm):
        return x + norm(sublayer(x))

    before = torch.get_rng_state()
    assert ex.check_pre_ln_block(good).passed
    assert torch.equal(before, torch.get_rng_state())  # the checker leaves the reader's RNG alone
    for wrong, words in (
        (post_ln, "this is Post-LN"),
        (norm_in_place, "normalize x in place"),
        (no_residual, "residual connection is missing"),
        (norm_after, "sublayer's output"),
    ):
        result = ex.check_pre_ln_block(wrong)
        assert not result.passed
        assert words in result.text, (wrong.__name__, result.text)
    assert not ex.check_pre_ln_block(lambda x, sublayer, norm: x[..., :1]).passed
    assert not ex.check_pre_ln_block(None).passed


def test_shift_right_checker():
    assert ex.check_shift_right(lambda tgt: (tgt[:, :-1], tgt[:, 1:])).passed
    for wrong, words in (
        (lambda t: (t, t), "no shift"),
        (lambda t: (t[:, 1:], t[:, :-1]), "the wrong way"),
        (lambda t: (torch.cat([torch.ones_like(t[:, :1]), t[:, :-1]], 1), t), "predict <bos>"),
        (lambda t: (t[:, :-1], t[:, :-1]), "the NEXT token"),
        (lambda t: (t[:, :-2], t[:, 1:-1]), "never learns when to stop"),
        (lambda t: (t[:, :-1].float(), t[:, 1:]), "integer tensor"),
    ):
        result = ex.check_shift_right(wrong)
        assert not result.passed and words in result.text, result.text


def _decoder_by_hand(layer, x, memory, memory_mask, **bug):
    return ch06_encoder_decoder._decoder_variant(layer, x, memory, memory_mask, **bug)


def test_decoder_layer_checker():
    def good(layer, x, memory, memory_mask):
        for f, norm in (
            (lambda h: layer.self_attn(h, h, h, mask=torch.ones(h.shape[1], h.shape[1]).tril().bool()), layer.norm1),
            (lambda h: layer.cross_attn(h, memory, memory, mask=memory_mask), layer.norm2),
            (layer.ff, layer.norm3),
        ):
            x = x + f(norm(x)) if layer.norm_first else norm(x + f(x))
        return x

    assert ex.check_decoder_layer(good).passed
    for bug, words in (
        (dict(causal=False), "not causal"),
        (dict(self_on_memory=True), "reads the encoder output"),
        (dict(cross_on_x=True), "cross-attention attends to x"),
        (dict(use_memory_mask=False), "ignores memory_mask"),
    ):
        result = ex.check_decoder_layer(lambda *a, bug=bug: _decoder_by_hand(*a, **bug))
        assert not result.passed and words in result.text, (bug, result.text)
    no_causal = ex.check_decoder_layer(lambda *a: _decoder_by_hand(*a, causal=False))
    assert "❌ leak check" in no_causal.text
    post_only = ex.check_decoder_layer(lambda *a: _decoder_by_hand(*a, norm_first=False))
    assert not post_only.passed and "norm_first=True" in post_only.text
    assert "1 of 4 checks failed" in post_only.text


def test_label_smoothing_checker():
    def good(t, V, eps):
        return (1 - eps) * torch.nn.functional.one_hot(t, V).float() + eps / V

    assert ex.check_label_smoothing(good).passed
    one_hot = torch.nn.functional.one_hot
    for wrong, words in (
        (lambda t, V, e: one_hot(t, V) + e / V, "sum to more than 1"),
        (lambda t, V, e: (1 - e) * one_hot(t, V), "sum to less than 1"),
        (lambda t, V, e: (1 - e) * one_hot(t, V) + e / (V - 1) * (1 - one_hot(t, V)), "all vocab_size"),
        (lambda t, V, e: e * one_hot(t, V) + (1 - e) / V, "swapped"),
    ):
        result = ex.check_label_smoothing(wrong)
        assert not result.passed and words in result.text, result.text
    # PyTorch's own smoothed loss is the cross-entropy against this distribution
    logits, t = torch.randn(4, 7), torch.tensor([0, 3, 6, 2])
    manual = -(good(t, 7, 0.1) * logits.log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(manual, torch.nn.functional.cross_entropy(logits, t, label_smoothing=0.1))


# ---------------------------------------------------------------- the framework: @checker and the package layout

CHAPTER_CHECKERS = {
    ch01_attention: {"check_attention", "check_softmax"},
    ch02_masking: {"check_causal_mask", "check_padding_mask", "check_prefix_lm_mask"},
    ch03_multi_head_attention: {"check_split_heads", "check_multi_head_attention"},
    ch04_positional_encoding: {"check_sinusoidal_encoding", "check_rope"},
    ch05_norms_and_residuals: {"check_layer_norm", "check_rms_norm", "check_pre_ln_block"},
    ch06_encoder_decoder: {"check_shift_right", "check_decoder_layer", "check_label_smoothing"},
    ch07_decoder_only: {
        "check_top_k_filter",
        "check_top_p_filter",
        "check_generate_cached",
        "check_swiglu_hidden",
        "check_encode_word",
    },
}

# The library's own implementation of each exercise: every checker must accept it.
REFERENCE_ANSWERS = {
    "check_attention": scaled_dot_product_attention,
    "check_softmax": lambda x, t: torch.softmax(x / t, dim=-1),
    "check_causal_mask": causal_mask,
    "check_padding_mask": padding_mask,
    "check_prefix_lm_mask": prefix_lm_mask,
    "check_split_heads": lambda x, h: x.view(*x.shape[:2], h, -1).transpose(1, 2),
    "check_multi_head_attention": lambda mha, query, key, value: mha(query, key, value),
    "check_sinusoidal_encoding": sinusoidal_encoding,
    "check_rope": lambda x, offset: RotaryEmbedding(x.shape[-1], max_len=64)(x, offset),
    "check_layer_norm": lambda x, w, b, eps=1e-5: F.layer_norm(x, (x.shape[-1],), w, b, eps),
    "check_rms_norm": lambda x, w, eps=1e-6: F.rms_norm(x, (x.shape[-1],), w, eps),
    "check_pre_ln_block": lambda x, sublayer, norm: x + sublayer(norm(x)),
    "check_shift_right": lambda tgt: (tgt[:, :-1], tgt[:, 1:]),
    "check_decoder_layer": lambda layer, x, memory, memory_mask: layer(
        x, memory, memory_mask=memory_mask, tgt_is_causal=True
    ),
    "check_label_smoothing": lambda t, V, eps: (1 - eps) * F.one_hot(t, V).float() + eps / V,
    "check_top_k_filter": sampling.top_k_filter,
    "check_top_p_filter": sampling.top_p_filter,
    "check_generate_cached": lambda model, idx, n_new: model.generate(idx, n_new, temperature=0, use_cache=True),
    "check_swiglu_hidden": lambda d_model, multiple_of: multiple_of * -(-int(8 * d_model / 3) // multiple_of),
    "check_encode_word": lambda word, merges: hf_encode_word(word, merges),
}
# The checkers of a value (``@checker(answer="value")``, "predict, then run"): a right prediction each.
VALUE_ANSWERS: dict[str, object] = {}
CHECKERS = sorted(REFERENCE_ANSWERS)
VALUE_CHECKERS = sorted(VALUE_ANSWERS)


def test_package_exports_every_chapter_checker():
    public = set().union(*CHAPTER_CHECKERS.values())
    assert public == set(REFERENCE_ANSWERS) | set(VALUE_ANSWERS)
    assert not set(REFERENCE_ANSWERS) & set(VALUE_ANSWERS)
    for name in REFERENCE_ANSWERS:
        assert getattr(ex, name).answer_kind == "function", name
    for name in VALUE_ANSWERS:
        assert getattr(ex, name).answer_kind == "value", name
    assert set(ex.__all__) == public | {"Bug", "Checker", "CheckResult", "checker"}
    for name in public:
        assert callable(getattr(ex, name)), name


@pytest.mark.parametrize("module", CHAPTER_CHECKERS, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_chapter_module_holds_only_its_chapter_checkers(module):
    defined = {name for name, value in vars(module).items() if name.startswith("check_") and callable(value)}
    assert defined == CHAPTER_CHECKERS[module]
    assert set(module.__all__) == CHAPTER_CHECKERS[module]
    for name in defined:
        assert getattr(module, name).__module__ == module.__name__, name  # defined there, not imported


@pytest.mark.parametrize("name", CHECKERS + VALUE_CHECKERS)
def test_checker_keeps_name_docstring_and_answer_signature(name):
    check = getattr(ex, name)
    assert check.__name__ == name
    assert check.__doc__ and check.__doc__.startswith("Check ``"), name
    (parameter,) = inspect.signature(check).parameters.values()  # the Checker argument is hidden
    assert parameter.kind is inspect.Parameter.POSITIONAL_ONLY
    assert parameter.name in check.__doc__, (name, parameter.name)  # the docstring talks about the answer
    assert typing.get_type_hints(check).keys() == {parameter.name, "return"}
    assert typing.get_type_hints(check)["return"] is ex.CheckResult


@pytest.mark.parametrize("name", CHECKERS + VALUE_CHECKERS)
def test_checker_accepts_the_library_answer(name, capsys):
    result = getattr(ex, name)({**REFERENCE_ANSWERS, **VALUE_ANSWERS}[name])
    assert result.passed, result.text
    assert result.text.startswith(f"{name}: All ") and result.text in capsys.readouterr().out


def _stub_answer(x, n_heads): ...  # your code here


@torch.no_grad()
def _decorated_stub_answer(model, idx, n_new):
    """A docstring, then nothing."""
    pass


@pytest.mark.parametrize("name", CHECKERS + VALUE_CHECKERS)
@pytest.mark.parametrize("answer", [..., _stub_answer, _decorated_stub_answer], ids=["...", "stub", "decorated stub"])
def test_an_unanswered_starter_is_reported_not_graded(name, answer, capsys):
    result = getattr(ex, name)(answer)
    assert not result.passed and result.status == "unanswered"
    assert result.text.startswith(f"{name}: not answered yet: ") and not result.lines
    assert capsys.readouterr().out == result.text + "\n"


def test_a_stub_is_told_apart_from_an_answer():
    def answered(x, n_heads):
        return None  # returns nothing, but was written: same bytecode as a stub, and that is fine

    def real(x, n_heads):
        return x

    assert _framework.is_unanswered(_stub_answer) and _framework.is_unanswered(answered)
    assert not _framework.is_unanswered(real) and not _framework.is_unanswered(0.0)
    assert not _framework.is_unanswered(torch.no_grad()(real))


@pytest.mark.parametrize("name", CHECKERS + VALUE_CHECKERS)
def test_every_call_is_recorded_for_the_grader(name, tmp_path, monkeypatch):
    log = tmp_path / "results.jsonl"
    monkeypatch.setenv(_framework.RESULTS_ENV, str(log))
    check = getattr(ex, name)
    right = check({**REFERENCE_ANSWERS, **VALUE_ANSWERS}[name])
    check(...)
    wrong = check("a wrong answer")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["status"] for r in records] == ["passed", "unanswered", "failed"]
    assert all(r["checker"] == name for r in records)
    assert records[0]["passed"] and records[0]["feedback"] == right.text
    assert records[2]["feedback"] == wrong.text and not records[2]["passed"]


def test_a_results_file_that_cannot_be_written_does_not_break_the_notebook(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(_framework.RESULTS_ENV, str(tmp_path / "missing-folder" / "results.jsonl"))
    assert ex.check_causal_mask(causal_mask).passed
    assert "could not record the result for the grader" in capsys.readouterr().out


def test_a_value_checker_compares_floats_within_its_tolerance(capsys):
    @ex.checker(answer="value")
    def check_loss_at_init(c: ex.Checker, predicted: float) -> None:
        """Check ``predicted``, the loss of a uniform guess over 65 characters."""
        c.case("the loss", lambda: predicted, math.log(65), atol=0.01, hint="a uniform guess: ln(vocabulary size).")

    assert check_loss_at_init.answer_kind == "value"
    assert check_loss_at_init(4.17).passed and check_loss_at_init(torch.tensor(4.175)).passed
    assert check_loss_at_init(np.float32(4.18)).passed
    wrong = check_loss_at_init(65)
    assert not wrong.passed and "expected 4.17439 (within 0.01), got 65" in wrong.text and "ln(vocabulary" in wrong.text
    assert not check_loss_at_init(True).passed and not check_loss_at_init("4.17").passed
    with pytest.raises(ValueError, match='answer must be "function" or "value", got \'number\''):
        ex.checker(answer="number")


@pytest.mark.parametrize("name", CHECKERS)  # the function checkers
def test_checker_refuses_a_non_callable_answer(name, capsys):
    result = getattr(ex, name)(42)
    assert not result.passed and not result
    assert result.text == f"{name}: expected a function, got int"
    assert capsys.readouterr().out == result.text + "\n"


def _draws() -> tuple[torch.Tensor, float, float]:
    """The next draw of torch's, Python's and NumPy's global random generators."""
    return torch.rand(3), random.random(), float(np.random.rand())


def _consuming(answer):
    """``answer`` preceded by draws from every global random generator, as a careless answer would do."""

    def wrapped(*args, **kwargs):
        _draws()
        torch.manual_seed(1234)  # reseeding is the worst case: it resets the stream instead of advancing it
        return answer(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize("right", [True, False], ids=["right answer", "wrong answer"])
@pytest.mark.parametrize("name", CHECKERS)
def test_checker_restores_every_global_random_state(name, right):
    answer = REFERENCE_ANSWERS[name] if right else lambda *args, **kwargs: 1 / 0
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()
    cuda_before = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    result = getattr(ex, name)(_consuming(answer))
    assert result.passed is right, result.text
    after = _draws()
    cuda_after = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    torch.set_rng_state(before[0])
    random.setstate(before[1])
    np.random.set_state(before[2])
    expected = _draws()
    assert torch.equal(after[0], expected[0]), "torch's global random state changed"
    assert after[1] == expected[1], "Python's random state changed"
    assert after[2] == expected[2], "NumPy's global random state changed"
    if cuda_before is not None:
        assert all(torch.equal(a, b) for a, b in zip(cuda_after, cuda_before, strict=True)), "a CUDA state changed"


def test_checker_decorator_builds_a_public_checker(capsys):
    calls = []

    @ex.checker
    def check_double(c: ex.Checker, double) -> None:
        """Check ``double(x) -> 2 x``."""
        calls.append(double)
        c.case(
            "x = 3",
            lambda: double(torch.tensor(3.0)),
            torch.tensor(6.0),
            bugs=(ex.Bug(lambda: torch.tensor(9.0), "you squared x."),),
            hint="return 2 * x.",
        )

    assert check_double.__name__ == "check_double" and check_double.__doc__ == "Check ``double(x) -> 2 x``."
    assert str(inspect.signature(check_double)) == "(double, /) -> 'CheckResult'"

    refused = check_double("2 * x")
    assert isinstance(refused, ex.CheckResult) and not refused.passed
    assert refused.text == "check_double: expected a function, got str" and not calls  # the cases never ran
    assert capsys.readouterr().out == "check_double: expected a function, got str\n"

    assert check_double(lambda x: 2 * x).text == "check_double: All 1 checks passed.\n  ✅ x = 3"
    squared = check_double(lambda x: x**2)
    assert not squared.passed and "Hint: you squared x." in squared.text and "1 of 1 checks failed" in squared.text
    crashed = check_double(lambda x: x.missing())
    assert "raised AttributeError" in crashed.text and "Hint: return 2 * x." in crashed.text
    assert len(calls) == 3


# ---------------------------------------------------------------- the framework: inputs the answer changes in place


def _good_split_heads(x, n_heads):
    B, T, d = x.shape
    return x.view(B, T, n_heads, d // n_heads).transpose(1, 2)


def test_split_heads_fails_an_answer_that_zeroes_its_input():
    def zeroing(x, n_heads):  # returns a view of its zeroed input: it used to equal an expected view of x
        x.zero_()
        return _good_split_heads(x, n_heads)

    result = ex.check_split_heads(zeroing)
    assert not result.passed
    assert result.text.count("your function changed its input in place (x)") == 3, result.text
    assert "x.zero_()" in result.text  # the hint names the culprits
    assert ex.check_split_heads(_good_split_heads).passed  # the checker's own inputs were left alone


def _then_changing_its_inputs(answer):
    """``answer`` that, after computing its result, writes into every tensor it was given."""

    def wrapped(*args, **kwargs):
        result = answer(*args, **kwargs)
        for t in (*args, *kwargs.values()):
            if isinstance(t, torch.Tensor):
                t.logical_not_() if t.dtype == torch.bool else t.add_(1)
        return result

    return wrapped


TENSOR_INPUT_CHECKERS = [name for name in CHECKERS if name not in {"check_causal_mask", "check_prefix_lm_mask"}]
TENSOR_INPUT_CHECKERS.remove("check_sinusoidal_encoding")  # these three are given integers only
TENSOR_INPUT_CHECKERS.remove("check_swiglu_hidden")  # integers
TENSOR_INPUT_CHECKERS.remove("check_encode_word")  # strings


@pytest.mark.parametrize("name", TENSOR_INPUT_CHECKERS)
def test_an_answer_that_changes_its_inputs_fails(name):
    result = getattr(ex, name)(_then_changing_its_inputs(REFERENCE_ANSWERS[name]))
    assert not result.passed and "✅" not in result.text, result.text
    assert "your function changed its input in place (" in result.text, result.text
    assert getattr(ex, name)(REFERENCE_ANSWERS[name]).passed  # and the next answer is checked on clean inputs


def test_an_answer_that_changes_a_module_it_is_given_fails():
    def zeroes_the_output_projection(mha, query, key, value):
        out = mha(query, key, value)
        mha.out_proj.weight.zero_()
        return out

    result = ex.check_multi_head_attention(zeroes_the_output_projection)
    assert result.text.count("changed its input in place (mha.out_proj.weight)") == 3, result.text
    assert ex.check_multi_head_attention(REFERENCE_ANSWERS["check_multi_head_attention"]).passed


def test_an_answer_that_keeps_its_inputs_passes_even_if_they_alias():
    seen = []

    def records_aliasing(mha, query, key, value):  # self-attention: the checker passes key as value too
        seen.append(key is value)
        return mha(query, key, value)

    assert ex.check_multi_head_attention(records_aliasing).passed
    assert seen == [True, True, True]


# ---------------------------------------------------------------- the framework: odd tensors never crash a checker


@pytest.mark.parametrize(
    "odd, words",
    [
        (lambda t: torch.empty(t.shape, device="meta"), "got a dense tensor on meta"),
        (lambda t: t.to_sparse(), "got a sparse_coo tensor on cpu"),
    ],
    ids=["meta device", "sparse"],
)
@pytest.mark.parametrize("name", ["check_split_heads", "check_attention", "check_layer_norm", "check_top_k_filter"])
def test_a_tensor_on_another_device_or_sparse_gets_feedback_not_a_crash(name, odd, words):
    reference = REFERENCE_ANSWERS[name]

    def answer(*args, **kwargs):
        got = reference(*args, **kwargs)
        return tuple(odd(t) for t in got) if isinstance(got, tuple) else odd(got)

    result = getattr(ex, name)(answer)
    assert not result.passed and "✅" not in result.text
    assert "expected a dense tensor on the CPU" in result.text and words in result.text, result.text


def test_the_comparison_is_guarded_too(monkeypatch):
    def broken_difference(got, expected, atol=1e-5):
        raise RuntimeError("an odd result")

    monkeypatch.setattr(_framework, "_difference", broken_difference)
    result = ex.check_split_heads(_good_split_heads)
    assert not result.passed
    assert "could not compare your result with the expected one: RuntimeError: an odd result" in result.text


# ---------------------------------------------------------------- the framework: a time limit per case


def _hangs_for_three_examples(x, n_heads):
    if x.shape[0] == 3:  # the second case only: B=3
        while True:
            pass
    return _good_split_heads(x, n_heads)


def test_a_case_that_never_returns_fails_and_the_others_still_run(monkeypatch):
    monkeypatch.setattr(_framework, "CASE_TIMEOUT_SECONDS", 0.2)
    start = time.monotonic()
    result = ex.check_split_heads(_hangs_for_three_examples)
    assert time.monotonic() - start < 5
    assert "1 of 3 checks failed" in result.text, result.text
    assert "❌ B=3, T=5, d_model=12, n_heads=3: took longer than 0.2 s: an infinite loop?" in result.text
    assert "✅ B=1" in result.text and "✅ B=2" in result.text  # the case after the hung one ran
    assert "background" not in result.text  # in the main thread, SIGALRM stopped the loop


def test_an_answer_cannot_swallow_its_time_limit():
    def swallows(x, n_heads):
        try:
            time.sleep(30)
        except BaseException:  # even a bare except: the time limit is reported, and interrupts again
            pass
        if x.shape[0] == 3:
            time.sleep(30)
        return _good_split_heads(x, n_heads)

    start = time.monotonic()
    c = ex.Checker("check_swallowing", timeout_seconds=0.2)
    for B in (1, 3):
        x = torch.randn(B, 4, 8)
        c.case(
            f"B={B}", lambda x, n_heads: swallows(x, n_heads), _good_split_heads(x, 2), inputs={"x": x, "n_heads": 2}
        )
    result = c.done()
    assert time.monotonic() - start < 5
    assert result.text.count("took longer than 0.2 s") == 2, result.text  # returning after the limit is no pass


def test_the_time_limit_falls_back_to_a_thread_outside_the_main_thread(monkeypatch):
    monkeypatch.setattr(_framework, "CASE_TIMEOUT_SECONDS", 0.2)
    release = threading.Event()

    def blocks_for_three_examples(x, n_heads):
        if x.shape[0] == 3:
            release.wait(30)
        return _good_split_heads(x, n_heads)

    results = []
    worker = threading.Thread(target=lambda: results.append(ex.check_split_heads(blocks_for_three_examples)))
    start = time.monotonic()
    worker.start()
    worker.join(10)
    release.set()  # let the abandoned answer finish
    assert time.monotonic() - start < 5 and results
    text = results[0].text
    assert "1 of 3 checks failed" in text, text
    assert "took longer than 0.2 s: an infinite loop? (it may still be running in the background)" in text
    assert "✅ B=1" in text and "✅ B=2" in text


def test_a_checker_carries_no_grad_into_the_thread_fallback():
    grad_modes = []

    def records_grad_mode(x):
        grad_modes.append(torch.is_grad_enabled())
        return x

    def run():
        c = ex.Checker("check_grad_mode")
        with torch.no_grad():
            c.case("x", lambda x: records_grad_mode(x), torch.ones(2), inputs={"x": torch.ones(2)})
        assert c.failures == 0

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(10)
    assert grad_modes == [False]


def test_a_timeout_leaves_no_alarm_behind():
    import signal

    c = ex.Checker("check_alarm", timeout_seconds=0.05)
    c.case("hangs", lambda: time.sleep(5), torch.tensor(1.0))
    assert c.failures == 1
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)


# ---------------------------------------------------------------- hints for the exception, and for three classic bugs


def test_attention_hints_at_k_T_only_when_k_T_raised():
    def raises(q, k, v, mask=None):
        raise ValueError("something else went wrong")

    result = ex.check_attention(raises)
    assert not result.passed and "raised ValueError: something else went wrong" in result.text
    assert "k.T" not in result.text and "check each step's shapes" in result.text

    def mask_of_the_wrong_shape(q, k, v, mask=None):  # a shape error that k.T did not cause
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        s = s if mask is None else s.masked_fill(~mask[:-1], float("-inf"))
        return torch.softmax(s, dim=-1) @ v, torch.softmax(s, dim=-1)

    wrong_mask = ex.check_attention(mask_of_the_wrong_shape)
    assert "❌ with a causal mask" in wrong_mask.text and "k.T" not in wrong_mask.text, wrong_mask.text


def test_multi_head_attention_blames_the_query_length_only_for_a_shape_error():
    def raises(mha, query, key, value):
        raise ValueError("not yet")

    result = ex.check_multi_head_attention(raises)
    assert "more keys than queries" not in result.text and result.text.count("Hint: project with") == 3


def test_split_heads_names_the_batch_flattened_into_the_heads():
    def flattened(x, n_heads):
        B, T, d = x.shape
        return x.view(B * n_heads, T, d // n_heads)

    def reshaped(x, n_heads):
        return x.reshape(-1, x.shape[1], x.shape[2] // n_heads)

    for wrong in (flattened, reshaped):
        result = ex.check_split_heads(wrong)
        assert result.text.count("you flattened the batch into the heads") == 3, result.text


def test_multi_head_attention_names_the_batch_flattened_into_the_heads():
    def flattened(mha, query, key, value):
        B, T_q, d = query.shape
        T_k, h = key.shape[1], mha.n_heads
        q = mha.q_proj(query).view(B * h, T_q, d // h)
        k = mha.k_proj(key).view(B * h, T_k, d // h)
        v = mha.v_proj(value).view(B * h, T_k, d // h)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h), dim=-1)
        return mha.out_proj((w @ v).view(B, T_q, d))

    result = ex.check_multi_head_attention(flattened)
    assert result.text.count("you flattened the batch into the heads") == 3, result.text


def test_layer_norm_names_the_batch_axis():
    def over_the_batch(x, w, b, eps=1e-5):
        return (x - x.mean(dim=0)) / torch.sqrt(x.var(dim=0, unbiased=False) + eps) * w + b

    def over_the_batch_unbiased(x, w, b, eps=1e-5):
        return (x - x.mean(dim=0, keepdim=True)) / torch.sqrt(x.var(dim=0, keepdim=True) + eps) * w + b

    for wrong in (over_the_batch, over_the_batch_unbiased):
        result = ex.check_layer_norm(wrong)
        assert result.text.count("you normalize over the batch axis") == 3, (wrong.__name__, result.text)


def test_sinusoidal_encoding_names_sin_and_cos_in_halves():
    def halves(max_len, d_model):  # the first d/2 columns sines, the last d/2 cosines
        pos = torch.arange(max_len)[:, None]
        omega = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, : d_model // 2] = torch.sin(pos * omega)
        pe[:, d_model // 2 :] = torch.cos(pos * omega)
        return pe

    result = ex.check_sinusoidal_encoding(halves)
    assert result.text.count("sin and cos in halves") == 3, result.text
    cos_first = ex.check_sinusoidal_encoding(lambda n, d: halves(n, d).roll(d // 2, dims=-1))
    assert cos_first.text.count("cos and sin in halves") == 3, cos_first.text

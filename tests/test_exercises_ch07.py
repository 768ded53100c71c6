"""Chapter 7's checkers: a KV-cache generator, SwiGLU's width and BPE encoding accept right answers and name
the classic mistakes (cache without the position offset, a causal mask aligned to the top left for the new
query, no cache at all, leftmost-pair merging)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import importorskip_unless_ci
from transformer_lib import causal_mask
from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import ch07_decoder_only


def learner_generate(model, idx, n_new, *, offset=True, is_causal=False, cache_kv=True, refeed=False):
    """A learner's greedy generator with a hand-written cache, and the ways it goes wrong."""
    cache = [None] * len(model.blocks)

    def step(new):
        B, T_new = new.shape
        T_past = 0 if cache[0] is None else cache[0][0].shape[2]
        start = T_past if offset else 0
        h = model.tok_emb(new) + model.pos.weight[start : start + T_new]
        for i, block in enumerate(model.blocks):
            attn = block.self_attn
            a = block.norm1(h)
            q, k, v = (
                p(a).view(B, T_new, attn.n_heads, attn.d_head).transpose(1, 2)
                for p in (attn.q_proj, attn.k_proj, attn.v_proj)
            )
            if cache_kv and cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
            if is_causal:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(T_new, k.shape[2]))
            h = h + attn.out_proj(out.transpose(1, 2).reshape(B, T_new, -1))
            h = h + block.ff(block.norm2(h))
        return model.lm_head(model.norm_f(h[:, -1]))

    with torch.no_grad():
        if refeed:  # the loop without a cache: the whole sequence every step
            for _ in range(n_new):
                idx = torch.cat([idx, model(idx)[0][:, -1].argmax(-1, keepdim=True)], 1)
            return idx
        logits = step(idx)
        for _ in range(n_new):
            idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], 1)
            logits = step(idx[:, -1:])
    return idx


def test_generate_cached_accepts_a_hand_written_cache():
    result = ex.check_generate_cached(learner_generate)
    assert result.passed, result.text
    assert result.text.count("✅") == 4


@pytest.mark.parametrize(
    "bug, words",
    [
        (dict(offset=False), "not 0: add model.pos.weight[T_past : T_past + T_new]"),
        (dict(is_causal=True), "aligns the triangle to the top left"),
        (dict(cache_kv=False), "the new token attends only to itself"),
    ],
    ids=["no position offset", "is_causal with one query", "no cached keys"],
)
def test_generate_cached_names_each_classic_bug(bug, words):
    result = ex.check_generate_cached(lambda model, idx, n_new: learner_generate(model, idx, n_new, **bug))
    assert not result.passed
    assert result.text.count(words) == 2, result.text  # in both cases of the token check


def test_generate_cached_counts_the_tokens_fed_per_step():
    result = ex.check_generate_cached(lambda model, idx, n_new: learner_generate(model, idx, n_new, refeed=True))
    # the tokens are right (it is the uncached loop) but the positions fed are not
    assert result.text.count("✅") == 2 and result.text.count("❌") == 2, result.text
    assert "that is the loop without a cache" in result.text


def test_generate_cached_does_not_crash_on_a_shape_error():
    result = ex.check_generate_cached(lambda model, idx, n_new: idx.view(-1, 3, 5))
    assert not result.passed and "raised RuntimeError" in result.text


def llama_width(d_model: int, multiple_of: int) -> int:
    hidden = int(2 * (4 * d_model) / 3)  # as in LLaMA's model.py
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def test_swiglu_hidden_matches_the_published_llama_widths():
    # LLaMA 1's four sizes: d_model -> the feed-forward width in its released configurations
    assert [llama_width(d, 256) for d in (4096, 5120, 6656, 8192)] == [11008, 13824, 17920, 22016]
    assert ex.check_swiglu_hidden(llama_width).passed


@pytest.mark.parametrize(
    "answer, words",
    [
        (lambda d, m: int(8 * d / 3), "round the width up to a multiple"),
        (lambda d, m: m * (int(8 * d / 3) // m), "round up (ceil), not down"),
        (lambda d, m: m * round(int(8 * d / 3) / m), "round up (ceil), not down or to the nearest"),
        (lambda d, m: 4 * d, "4 d_model is the GELU network's width"),
        (lambda d, m: float(llama_width(d, m)), "expected int"),
    ],
)
def test_swiglu_hidden_names_the_mistake(answer, words):
    result = ex.check_swiglu_hidden(answer)
    assert not result.passed and words in result.text, result.text


def rank_encode(word, merges):
    rank = {p: r for r, p in enumerate(merges)}
    symbols = list(word)
    while True:
        known = [p for p in zip(symbols, symbols[1:], strict=False) if p in rank]
        if not known:
            return symbols
        a, b = min(known, key=rank.__getitem__)
        out, i = [], 0
        while i < len(symbols):
            if symbols[i : i + 2] == [a, b]:
                out.append(a + b)
                i += 2
            else:
                out.append(symbols[i])
                i += 1
        symbols = out


def test_encode_word_reference_equals_the_library_tokenizer_on_real_words():
    importorskip_unless_ci("tokenizers")
    from transformer_lib.bpe import train_bpe
    from transformer_lib.text import load_shakespeare

    text = load_shakespeare(max_chars=30_000)
    bpe = train_bpe(text, vocab_size=400)
    split = bpe.backend.pre_tokenizer.pre_tokenize_str
    # words that GPT-2's split keeps whole (it cuts "stand'st" into " stand", "'s", "t": encode each piece alone)
    words = [piece for w in set(text.split()[:3000]) for piece, _ in split(" " + w)]
    assert len(words) > 1000
    for w in words:
        spelled = bpe.tokens(w.replace("Ġ", " ")) if w.isascii() or "Ġ" in w else bpe.tokens(w)
        assert "".join(spelled) == w
        assert rank_encode(w, bpe.merges()) == spelled, w
        assert ch07_decoder_only._encode_word(w, bpe.merges()) == spelled, w
    assert ex.check_encode_word(rank_encode).passed


def test_encode_word_names_leftmost_merging_and_single_passes():
    def leftmost(word, merges):
        symbols = list(word)
        while True:
            pairs = [i for i in range(len(symbols) - 1) if (symbols[i], symbols[i + 1]) in merges]
            if not pairs:
                return symbols
            i = pairs[0]
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]

    def one_pass(word, merges):
        symbols = list(word)
        for a, b in merges:
            for i in range(len(symbols) - 1):
                if symbols[i : i + 2] == [a, b]:
                    symbols[i : i + 2] = [a + b]
                    break
        return symbols

    first = ex.check_encode_word(leftmost)
    assert not first.passed and "not the leftmost pair" in first.text, first.text
    second = ex.check_encode_word(one_pass)
    assert not second.passed and "a merge applies to every occurrence" in second.text, second.text


def test_encode_word_gets_a_tuple_instead_of_a_list_explained():
    result = ex.check_encode_word(lambda word, merges: tuple(rank_encode(word, merges)))
    assert not result.passed and "expected list" in result.text


def test_plain_value_comparison_in_the_framework():
    from transformer_lib.notebook.exercises._framework import _difference

    assert _difference(3, 3) is None and _difference(["a", "b"], ["a", "b"]) is None
    assert "expected 4, got 3" in _difference(3, 4)
    assert "expected int" in _difference(torch.tensor(3), 3)
    assert _difference(("a", "b"), ("a", "b")) is None
    assert "item 1 of the tuple" in _difference(("a", "c"), ("a", "b"))
    assert math.isclose(llama_width(128, 1), 341)

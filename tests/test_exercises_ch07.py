"""Chapter 7's checkers: the BPE encoder (spot the bug: merging like training), SwiGLU's width, the predicted
size of a grouped-query KV cache and a hand-written grouped-query cache accept right answers, call an untouched
starter "not answered yet", and name the classic mistakes (the most frequent or leftmost pair instead of the
earliest-learned merge, heads tiled with repeat, a causal mask aligned to the top left, the repeated keys cached):
the concept by default, the fix in code only on request."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from conftest import diagnosis, importorskip_unless_ci
from transformer_lib import GPT, GPTConfig, KVCache, causal_mask
from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import ch07_decoder_only

# ---------------------------------------------------------------- BPE: encoding with learned merges (spot the bug)


def starter_encode(word, merges):
    """The exercise's buggy starter, as a learner might retype it: it merges the pair most frequent in the word."""
    symbols = list(word)
    while True:
        counts = Counter(pair for pair in zip(symbols, symbols[1:], strict=False) if pair in merges)
        if not counts:
            return symbols
        best = max(counts, key=counts.get)
        merged, i = [], 0
        while i < len(symbols):
            if tuple(symbols[i : i + 2]) == best:
                merged.append(best[0] + best[1])
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged


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
    wrong_by_the_starter = 0
    for w in words:
        spelled = bpe.tokens(w.replace("Ġ", " ")) if w.isascii() or "Ġ" in w else bpe.tokens(w)
        assert "".join(spelled) == w
        assert rank_encode(w, bpe.merges()) == spelled, w
        assert ch07_decoder_only._encode_word(w, bpe.merges()) == spelled, w
        wrong_by_the_starter += starter_encode(w, bpe.merges()) != spelled
    assert wrong_by_the_starter > 0  # the bug shows on real words, as the exercise says
    assert ex.check_encode_word(rank_encode).passed


def test_encode_word_names_the_starter_bug():
    result = ex.check_encode_word(starter_encode)
    assert not result.passed
    assert "you merge the pair that is most frequent in the word" in diagnosis(result)
    assert sum(d.startswith("you merge the pair that is most frequent in the word") for d in result.diagnoses) == 1
    assert (
        sum(d.startswith("one of 2 mistakes that give this same result here: (1) you merge") for d in result.diagnoses)
        == 1
    )
    assert "Byte-pair encoding, by hand" in diagnosis(result) and "rank.get" not in result.text  # no code of the fix
    assert result.fixes == [ch07_decoder_only._ENCODE_RULE_FIX] and "min(counts, key=rank.get)" in result.fixes[0]


def test_encode_word_calls_the_untouched_starter_not_answered_yet():
    def cell(source):  # the function a notebook cell of source defines, with the chapter's import of Counter
        namespace = {"Counter": Counter}
        exec(compile(source, "<cell>", "exec", dont_inherit=True), namespace)
        return namespace["encode_word"]

    assert ex.check_encode_word(cell(ch07_decoder_only._ENCODE_STARTER)).status == "unanswered"
    tried = ch07_decoder_only._ENCODE_STARTER.replace("max(counts, key=counts.get)", "min(counts, key=counts.get)")
    assert ex.check_encode_word(cell(tried)).status == "failed"  # changed, still wrong: graded


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
    assert not first.passed and "the position in the word is not what decides" in diagnosis(first), first.text
    assert not any(d.startswith("you merge the pair that is most frequent") for d in first.diagnoses)  # not alone
    second = ex.check_encode_word(one_pass)
    assert not second.passed and "a merge applies to every occurrence" in diagnosis(second), second.text


def test_encode_word_gets_a_tuple_instead_of_a_list_explained():
    result = ex.check_encode_word(lambda word, merges: tuple(rank_encode(word, merges)))
    assert not result.passed and "expected list" in result.text


# ---------------------------------------------------------------- SwiGLU's width


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
        (lambda d, m: int(8 * d / 3), "your width is not a multiple of multiple_of"),
        (lambda d, m: m * (int(8 * d / 3) // m), "you round in the wrong direction"),
        (lambda d, m: m * round(int(8 * d / 3) / m), "you round in the wrong direction"),
        (lambda d, m: 4 * d, "4 d_model is the GELU network's width"),
        (lambda d, m: float(llama_width(d, m)), "expected int"),
    ],
)
def test_swiglu_hidden_names_the_mistake(answer, words):
    result = ex.check_swiglu_hidden(answer)
    assert not result.passed and words in result.text, result.text
    assert "ceil" not in result.text and "int(2 * 4 * d_model / 3)" not in result.text  # the fix only on request


# ---------------------------------------------------------------- the size of a grouped-query cache (a prediction)


def measured_kv_cache_bytes_per_token(n_tokens: int = 7) -> float:
    """Build the exercise's model with the library, in bfloat16, run tokens through it and weigh its cache."""
    m = ch07_decoder_only.KV_MODEL
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=16, **m)).to(ch07_decoder_only.KV_DTYPE).eval()
    caches = model.new_caches()
    with torch.no_grad():
        model(torch.arange(n_tokens)[None], caches=caches)
    assert caches[0].k.shape == (1, m["n_kv_heads"], n_tokens, m["d_model"] // m["n_heads"])
    return sum(c.k.nbytes + c.v.nbytes for c in caches) / n_tokens


def test_kv_cache_bytes_formula_equals_a_measured_library_cache():
    measured = measured_kv_cache_bytes_per_token()
    m = ch07_decoder_only.KV_MODEL
    assert measured == ch07_decoder_only._kv_bytes(m["n_kv_heads"], ch07_decoder_only.KV_DTYPE) == 1024
    result = ex.check_kv_cache_bytes(measured)
    assert result.passed and result.status == "passed", result.text
    assert ex.check_kv_cache_bytes(int(measured)).passed  # an int prediction is fine too
    # the chapter's own cache, as measured in its KV-cache cell: 2 x 4 layers x 128 x 4 bytes
    chapter = ch07_decoder_only._kv_bytes(4, torch.float32)
    assert chapter == 4096


@pytest.mark.parametrize(
    "prediction, words",
    [
        (4096, "that is the chapter's own cache"),
        (2048, "you applied one of the exercise's two changes, not both"),
        (512, "you count half of what a layer caches"),
        (8192, "that is bits"),
        (65536, "a full window of 64 tokens"),
        (1000, "a key and a value for each key/value head"),
    ],
)
def test_kv_cache_bytes_names_the_mistake(prediction, words):
    result = ex.check_kv_cache_bytes(prediction)
    assert not result.passed and "expected 1024 (within 0.5)" in result.text
    assert words in result.text, result.text
    assert "2 bytes (bfloat16)" not in result.text and result.fixes == [
        "bytes per token = 2 (a key and a value) x 4 layers x 2 key/value heads x 32 numbers x 2 bytes (bfloat16) "
        "= 1024."
    ]


def test_kv_cache_bytes_unanswered_and_odd_values():
    assert ex.check_kv_cache_bytes(...).status == "unanswered"
    for odd in ("1024", None, [1024], torch.tensor([1024.0, 1.0]), float("nan"), True):
        result = ex.check_kv_cache_bytes(odd)
        assert not result.passed, odd


# ---------------------------------------------------------------- a KV cache for grouped-query attention


def learner_gqa_step(attn, x, cache, *, tile=False, is_causal=False, no_mask=False, no_cache=False, store=False):
    """A learner's grouped-query step with a hand-written cache, and the ways it goes wrong."""
    T_new, group = x.shape[1], attn.n_heads // attn.n_kv_heads
    q = attn.split_heads(attn.q_proj(x))
    k, v = attn.split_heads(attn.k_proj(x)), attn.split_heads(attn.v_proj(x))

    def per_query(t):
        return t.repeat(1, group, 1, 1) if tile else t.repeat_interleave(group, dim=1)

    if store:  # repeat first, then cache the copies
        k, v = per_query(k), per_query(v)
    if cache is not None and not no_cache:
        k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
    k_all, v_all = (k, v) if store else (per_query(k), per_query(v))
    if is_causal:
        out = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=True)
    elif no_mask:
        out = F.scaled_dot_product_attention(q, k_all, v_all)
    else:
        out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=causal_mask(T_new, k.shape[2]))
    return attn.out_proj(attn.merge_heads(out)), (k, v)


def by_the_library(attn, x, cache):
    kv_cache = KVCache() if cache is None else KVCache(*cache)
    return attn(x, cache=kv_cache, is_causal=True), (kv_cache.k, kv_cache.v)


def with_enable_gqa(attn, x, cache):
    """The fused kernel's own grouping (PyTorch 2.5+), with an explicit loop-free cache."""
    q, k, v = (attn.split_heads(p(x)) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    if cache is not None:
        k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
    mask = causal_mask(x.shape[1], k.shape[2])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return attn.out_proj(attn.merge_heads(out)), [k, v]  # a list is a pair too


@pytest.mark.parametrize("answer", [learner_gqa_step, by_the_library, with_enable_gqa])
def test_gqa_step_accepts_right_answers(answer):
    if answer is with_enable_gqa and "enable_gqa" not in (F.scaled_dot_product_attention.__doc__ or ""):
        pytest.skip("this PyTorch has no enable_gqa")
    result = ex.check_gqa_step(answer)
    assert result.passed, result.text
    assert result.text.count("✅") == 8


@pytest.mark.parametrize(
    "bug, words, n_cases",
    [
        (dict(tile=True), "while yours alternates them", 1),  # failed in the 2 cases with 2 query heads per kv head
        (dict(is_causal=True), "your causal triangle sits at the top left", 1),
        (dict(no_mask=True), "a prompt of several tokens needs the causal mask", 1),
        (dict(no_cache=True), "the new tokens attend only to themselves", 1),
        (dict(store=True), "not the 4 repeated ones", 1),
        (dict(store=True), "key/value head, not the 8 repeated ones", 1),  # multi-query: one head, singular
    ],
    ids=["repeat instead of repeat_interleave", "is_causal", "no mask", "no cached keys", "repeated keys cached",
         "repeated keys cached, multi-query"],
)  # fmt: skip
def test_gqa_step_names_each_classic_bug(bug, words, n_cases):
    result = ex.check_gqa_step(lambda attn, x, cache: learner_gqa_step(attn, x, cache, **bug))
    assert not result.passed
    assert result.text.count(words) == n_cases, result.text  # each concept once, however many cases failed
    assert "repeat_interleave" not in result.text and "causal_mask(" not in result.text  # no code of the fix
    assert result.fixes and "For the fix in code: check_gqa_step.hint()" in result.text


def test_gqa_step_caching_the_repeated_keys_passes_the_outputs_but_not_the_cache():
    result = ex.check_gqa_step(lambda attn, x, cache: learner_gqa_step(attn, x, cache, store=True))
    failed = [line for line in result.lines if line.startswith("  ❌")]
    assert len(failed) == 3 and all(": the cache: " in line for line in failed), result.text  # multi-head: no repeat


def test_gqa_step_does_not_crash_on_odd_answers():
    for answer, words in (
        (lambda attn, x, cache: attn(x), "gqa_step must return a pair (out, (k, v)), got Tensor"),
        (lambda attn, x, cache: (attn(x), None), "the cache must be a pair (k, v), got NoneType"),
        (lambda attn, x, cache: (x.view(-1, 7), (x, x)), "raised RuntimeError"),
    ):
        result = ex.check_gqa_step(answer)
        assert not result.passed and "✅" not in result.text and words in result.text, result.text
    assert ex.check_gqa_step(...).status == "unanswered"


def test_the_checker_reference_equals_the_library():
    attn = ch07_decoder_only.MultiHeadAttention(24, 6, n_kv_heads=2, bias=False).eval()
    x = torch.randn(3, 6, 24)
    with torch.no_grad():
        ours = ch07_decoder_only._feed(ch07_decoder_only._gqa_step, attn, x, (3, 1, 2))
        library = ch07_decoder_only._feed(by_the_library, attn, x, (3, 1, 2))
    torch.testing.assert_close(ours[0], library[0])
    torch.testing.assert_close(ours[1], library[1])


# ---------------------------------------------------------------- the framework's plain values


def test_plain_value_comparison_in_the_framework():
    from transformer_lib.notebook.exercises._framework import _difference

    assert _difference(3, 3) is None and _difference(["a", "b"], ["a", "b"]) is None
    assert "expected 4, got 3" in _difference(3, 4)
    assert "expected int" in _difference(torch.tensor(3), 3)
    assert _difference(("a", "b"), ("a", "b")) is None
    assert "item 1 of the tuple" in _difference(("a", "c"), ("a", "b"))
    assert math.isclose(llama_width(128, 1), 341)

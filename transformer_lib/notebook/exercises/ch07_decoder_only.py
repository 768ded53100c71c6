"""Chapter 7, decoder-only models: ``check_encode_word`` (BPE encoding), ``check_swiglu_hidden`` (SwiGLU's width),
``check_kv_cache_bytes`` (a prediction: the size of a KV cache), ``check_gqa_step`` (a grouped-query cache)."""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...attention import KVCache, MultiHeadAttention
from ...masks import causal_mask
from ...memory import kv_cache_bytes_per_token
from ._framework import Checker, Hint, bug_table, checker, same_fix

ANSWER_MARKERS: dict[str, tuple[str, ...]] = {  # exercise label -> strings that would give its answer away
    "ex-bpe-encode": ("rank.get", "key=rank", '["t", "he"]', "earliest-learned"),
    "ex-swiglu-width": ("ceil(hidden", "10922", "0.8% more"),
    "ex-kv-cost": ("1024", "1,024"),
    "ex-gqa-cache": ("repeat_interleave", "enable_gqa"),
    "ex-chat-cache": ("recompute the whole conversation", "only the new message", "invalidates"),
}


# --------------------------------------------------------------------------- BPE: encoding with learned merges


def _encode_word(word: str, merges: list[tuple[str, str]], *, bug: str = "") -> list[str]:
    """Split ``word`` into symbols and apply the merges, lowest rank first; or with a bug of :data:`_ENCODE_BUGS`."""
    rank = {pair: r for r, pair in enumerate(merges)}
    symbols = list(word)
    if bug == "once":
        for pair in merges:
            for i in range(len(symbols) - 1):
                if (symbols[i], symbols[i + 1]) == pair:
                    symbols[i : i + 2] = [pair[0] + pair[1]]
                    break
        return symbols
    while len(symbols) > 1:
        known = [p for p in zip(symbols, symbols[1:], strict=False) if p in rank]
        if not known:
            break
        if bug == "count":
            counts = Counter(known)
            best = max(counts, key=counts.__getitem__)
        else:
            best = known[0] if bug == "leftmost" else min(known, key=rank.__getitem__)
        merged, i = [], 0
        while i < len(symbols):
            if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                merged.append(best[0] + best[1])
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return symbols


_MERGES = [("h", "e"), ("t", "h"), ("Ġ", "t"), ("Ġt", "he"), ("l", "l"), ("i", "n"), ("in", "g"), ("e", "r"),
           ("Ġ", "s"), ("ll", "ll"), ("e", "e"), ("Ġs", "ee"), ("a", "n"), ("n", "a"), ("b", "an")]  # fmt: skip

_ENCODE_CASES = (  # (name, word)
    ("'the': 'h'+'e' was learned before 't'+'h'", "the"),
    ("'Ġthe': merged symbols merge again", "Ġthe"),
    ("'thethe': a pair that occurs twice", "thethe"),
    ("'heeer': the most frequent pair, 'e'+'e', was learned late", "heeer"),
    ("'banana': 'a'+'n' was learned before 'n'+'a'", "banana"),
    ("'llll': every occurrence of a pair merges", "llll"),
    ("'Ġseeing'", "Ġseeing"),
    ("'Ġsinger'", "Ġsinger"),
    ("'xyz': no merge applies", "xyz"),
    ("'a': a single symbol", "a"),
)
_ENCODE_RULE_FIX = (
    "among the word's adjacent pairs that have a merge, take the one that comes earliest in merges: "
    "rank = {pair: i for i, pair in enumerate(merges)}, then best = min(counts, key=rank.get)."
)
_ENCODE_BUGS = {  # bug -> hint, for _encode_word(..., bug=bug)
    "count": Hint(
        "you merge the pair that is most frequent in the word: that is the rule of *training*, applied to one "
        "word. Encoding must give the word the tokens that training would have given it: reread 'Byte-pair "
        "encoding, by hand' for what the order of bpe.merges() records.",
        _ENCODE_RULE_FIX,
    ),
    "leftmost": Hint(
        "you merge the leftmost pair that has a merge: the position in the word is not what decides which merge "
        "comes first (reread 'Byte-pair encoding, by hand').",
        _ENCODE_RULE_FIX,
    ),
    "once": Hint(
        "a merge applies to every occurrence of its pair, and a merged symbol can merge again: the loop goes on "
        "until no adjacent pair has a merge.",
        "while some adjacent pair is in merges: merge the earliest-learned one everywhere, left to right.",
    ),
}
_ENCODE_HINT = Hint(
    "encoding a word must give it the tokens that training would have produced: which merge did training make "
    "first? Reread 'Byte-pair encoding, by hand'.",
    "symbols = list(word); repeat: among the adjacent pairs that appear in merges, take the one with the smallest "
    "index in merges, join all its occurrences left to right; stop when none is left.",
)


_ENCODE_STARTER = """\
def encode_word(word, merges):  # find and fix the bug
    symbols = list(word)
    while True:
        counts = Counter(pair for pair in zip(symbols, symbols[1:]) if pair in merges)  # pairs that have a merge
        if not counts:
            return symbols
        best = max(counts, key=counts.get)  # the pair to merge next
        merged, i = [], 0
        while i < len(symbols):
            if tuple(symbols[i:i + 2]) == best:
                merged.append(best[0] + best[1]); i += 2
            else:
                merged.append(symbols[i]); i += 1
        symbols = merged
"""


def _hf_encode_word(word: str, merges: list[tuple[str, str]]) -> list[str]:
    """An independent BPE encoder: Hugging Face tokenizers' BPE model with the given merges."""
    from tokenizers.models import BPE

    symbols = set(word) | {s for a, b in merges for s in (a, b, a + b)}
    vocab = {s: i for i, s in enumerate(sorted(symbols))}
    return [t.value for t in BPE(vocab, list(merges)).tokenize(word)]


@checker(starter=_ENCODE_STARTER, reference=_hf_encode_word)
def check_encode_word(c: Checker, encode_word: Callable[[str, list[tuple[str, str]]], list[str]]) -> None:
    """Check ``encode_word(word, merges)``: a word's BPE tokens, merging the earliest-learned known pair first.
    Shapes: word str (byte-level spelling), merges a list of pairs in the order learned -> list of token strings."""
    cases = ((name, {"word": word, "merges": list(_MERGES)}) for name, word in _ENCODE_CASES)
    c.cases(encode_word, cases, _encode_word, _ENCODE_BUGS, hint=_ENCODE_HINT)


# --------------------------------------------------------------------------- SwiGLU's width


def _swiglu_hidden(d_model: int, multiple_of: int, *, bug: str = "") -> int:
    """LLaMA's SwiGLU width, or with a bug of :data:`_SWIGLU_BUGS`."""
    hidden = 4 * d_model if bug == "4 d_model" else int(2 * 4 * d_model / 3)
    if bug in ("no rounding", "4 d_model"):
        return hidden
    return multiple_of * (math.floor if bug == "rounded down" else math.ceil)(hidden / multiple_of)


_SWIGLU_CASES = (  # (name, d_model, multiple_of)
    ("d_model 4096, multiple_of 256 (LLaMA 7B)", 4096, 256),
    ("d_model 5120, multiple_of 256 (LLaMA 13B)", 5120, 256),
    ("d_model 6656, multiple_of 256 (LLaMA 33B)", 6656, 256),
    ("d_model 8192, multiple_of 256 (LLaMA 65B)", 8192, 256),
    ("d_model 128, multiple_of 1: no rounding", 128, 1),
    ("d_model 96, multiple_of 32", 96, 32),
)
_SWIGLU_BUGS = {  # bug -> hint, for _swiglu_hidden(..., bug=bug)
    "no rounding": Hint(
        "your width is not a multiple of multiple_of: LLaMA rounds it to one, so that the matrix shapes suit "
        "the hardware.",
        "multiple_of * math.ceil(hidden / multiple_of).",
    ),
    "rounded down": Hint(
        "you round in the wrong direction: rounding down would leave fewer parameters than the 4 d_model GELU "
        "network, and LLaMA 7B's 11008 is above two thirds of 4 x 4096.",
        "math.ceil, not math.floor or round.",
    ),
    "4 d_model": Hint(
        "4 d_model is the GELU network's width; SwiGLU has three matrices instead of two, so its width is "
        "smaller, to keep the parameter count (reread 'The feed-forward variants: GELU and SwiGLU').",
        "hidden = int(2 * 4 * d_model / 3), then round it up to a multiple of multiple_of.",
    ),
}
_SWIGLU_HINT = Hint(
    "three matrices of d_model x hidden hold as many parameters as two of d_model x 4 d_model when hidden is two "
    "thirds of 4 d_model; LLaMA rounds that down to an integer, then up to a multiple of multiple_of. Reread 'The "
    "feed-forward variants: GELU and SwiGLU'.",
    "int(2 * 4 * d_model / 3), then multiple_of * math.ceil(hidden / multiple_of).",
)


@checker(reference=lambda d_model, multiple_of: multiple_of * -(-int(8 * d_model / 3) // multiple_of))
def check_swiglu_hidden(c: Checker, swiglu_hidden: Callable[[int, int], int]) -> None:
    """Check ``swiglu_hidden(d_model, multiple_of)``: the hidden width of LLaMA's SwiGLU feed-forward network."""
    cases = ((name, {"d_model": d, "multiple_of": multiple}) for name, d, multiple in _SWIGLU_CASES)
    c.cases(swiglu_hidden, cases, _swiglu_hidden, _SWIGLU_BUGS, hint=_SWIGLU_HINT)


# --------------------------------------------------------------------------- the size of a KV cache (a prediction)

KV_MODEL = dict(n_layers=4, n_heads=4, d_model=128, n_kv_heads=2)
"""The model of the prediction: the chapter's CPU size, with grouped-query attention (2 key/value heads)."""
KV_DTYPE = torch.bfloat16
"""The cache's number format in the prediction."""


def _kv_bytes(n_kv_heads: int, dtype: torch.dtype) -> int:  # per token, for KV_MODEL
    m = KV_MODEL
    return kv_cache_bytes_per_token(m["n_layers"], n_kv_heads, m["d_model"] // m["n_heads"], dtype.itemsize)


@checker(answer="value", reference=_kv_bytes(KV_MODEL["n_kv_heads"], KV_DTYPE))  # measured: test_exercises_ch07.py
def check_kv_cache_bytes(c: Checker, prediction: float) -> None:
    """Check ``prediction``: the bytes per token of the bfloat16 KV cache of a 4-layer model with d_model 128, 4 query
    heads and 2 key/value heads."""
    m = KV_MODEL
    expected = _kv_bytes(m["n_kv_heads"], KV_DTYPE)
    fix = (
        f"bytes per token = 2 (a key and a value) x {m['n_layers']} layers x {m['n_kv_heads']} key/value heads x "
        f"{m['d_model'] // m['n_heads']} numbers x 2 bytes (bfloat16) = {expected}."
    )
    mistakes = {
        _kv_bytes(m["n_heads"], torch.float32): "that is the chapter's own cache, every head in float32: the exercise "
        "changes two things, how many heads keep keys and values, and how many bytes a number takes.",
        _kv_bytes(m["n_kv_heads"], torch.float32): "you applied one of the exercise's two changes, not both: fewer "
        "key/value heads, and bfloat16 numbers.",
        expected // 2: "you count half of what a layer caches for each token.",
        expected * 8: "that is bits, not bytes.",
        expected * 64: "that is a full window of 64 tokens; the question is per token.",
    }
    c.case(
        "bytes per token",
        lambda: prediction,
        float(expected),
        bugs=same_fix(fix, mistakes),
        hint=Hint(
            "per token, each layer caches a key and a value for each key/value head, not for each query head, in "
            "the cache's number format; reread 'The KV cache, by hand'.",
            fix,
        ),
        atol=0.5,
    )


# --------------------------------------------------------------------------- a KV cache for grouped-query attention


def _gqa_step(
    attn: MultiHeadAttention, x: Tensor, cache: tuple[Tensor, Tensor] | None, *, bug: str = ""
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One step of cached grouped-query self-attention, or with a bug of :data:`_GQA_BUGS` or :func:`_cache_bugs`."""
    n_rep = attn.n_heads // attn.n_kv_heads
    T_new, tiled, cache_repeated = x.shape[1], bug in ("tiled", "cache tiled"), bug.startswith("cache ")

    def expanded(t: Tensor) -> Tensor:  # query head h reads key/value head h // n_rep (h % n_kv_heads if tiled)
        return t.repeat(1, n_rep, 1, 1) if tiled else t.repeat_interleave(n_rep, dim=1)

    q = attn.split_heads(attn.q_proj(x))  # (B, n_heads, T_new, d_head)
    k, v = attn.split_heads(attn.k_proj(x)), attn.split_heads(attn.v_proj(x))  # (B, n_kv_heads, T_new, d_head)
    if cache_repeated:
        k, v = expanded(k), expanded(v)
    if cache is not None and bug != "no cache":
        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
    k_all, v_all = (k, v) if cache_repeated else (expanded(k), expanded(v))  # (B, n_heads, T_k, d_head)
    mask = None if bug in ("top left", "no mask") else causal_mask(T_new, k.shape[2])  # aligned bottom right
    out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, is_causal=bug == "top left")
    return attn.out_proj(attn.merge_heads(out)), (k, v)


_GQA_BUGS = {  # bug -> hint, for the outputs of _gqa_step(..., bug=bug)
    "tiled": Hint(
        "your query heads read the wrong key/value heads: each key/value head serves consecutive query heads "
        "(with 4 and 2, heads 0 and 1 read head 0), while yours alternates them (heads 0 and 2 read head 0).",
        "k.repeat_interleave(n_rep, dim=1), not k.repeat(1, n_rep, 1, 1) (nor expand + reshape in the wrong "
        "order), with n_rep = n_heads // n_kv_heads.",
    ),
    "top left": Hint(
        "with fewer new queries than keys, your causal triangle sits at the top left: the new tokens see only "
        "the first keys instead of every earlier one. Reread the mask in 'The KV cache, by hand'.",
        "attn_mask=causal_mask(T_new, T_past + T_new), aligned to the bottom right, not is_causal=True.",
    ),
    "no mask": Hint(
        "one new token may see every key, but a prompt of several tokens needs the causal mask: without it, its "
        "early tokens see the later ones.",
        "attn_mask=causal_mask(T_new, T_past + T_new).",
    ),
    "no cache": Hint(
        "the new tokens attend only to themselves: the keys and values of the earlier positions, from the "
        "cache, must come first.",
        "torch.cat([k_past, k_new], dim=2) (and the same for v) before attending.",
    ),
}
_GQA_HINT = Hint(
    "the new positions' queries have all n_heads heads; their keys and values, n_kv_heads heads, join the cache; "
    "each query head attends, causally, to every key and value of its key/value head so far. Reread 'The KV "
    "cache, by hand'.",
    "project q (n_heads heads) and k, v (n_kv_heads heads) with attn.split_heads; append k and v to the cache; "
    "repeat_interleave them n_heads // n_kv_heads times along the heads for the attention; "
    "causal_mask(T_new, T_past + T_new); merge the heads and apply attn.out_proj.",
)
_GQA_CACHE_HINT = Hint(
    "the cache holds every key and value so far, in order, with the key/value heads only: each of shape "
    "(B, n_kv_heads, T_past + T_new, d_head).",
    "return (k, v) after the concatenation with the cache and before any repeat.",
)


def _cache_bugs(n_heads: int, n_kv_heads: int) -> dict[str, Hint]:
    hint = Hint(
        f"the cache must hold the {n_kv_heads} key/value head{'s' * (n_kv_heads > 1)}, not the {n_heads} repeated "
        f"ones: that is what grouped-query attention saves ({n_heads // n_kv_heads} times less memory).",
        "append k and v to the cache first, and repeat them only for the attention.",
    )
    return {"cache repeated": hint, "cache tiled": hint}


def _feed(step: Callable[..., Any], attn: MultiHeadAttention, x: Tensor, chunks: tuple[int, ...]) -> tuple[Tensor, Any]:
    """``step(attn, x_new, cache)`` chunk by chunk, each call given the last cache: the outputs and the last cache."""
    cache: Any = None  # what the step returned: checked below, as the answer's may be anything
    outs, start = [], 0
    for size in chunks:
        result = step(attn, x[:, start : start + size], cache)
        if not isinstance(result, tuple | list) or len(result) != 2:
            raise TypeError(f"gqa_step must return a pair (out, (k, v)), got {type(result).__name__}")
        out, cache = result
        if not isinstance(cache, tuple | list) or len(cache) != 2:
            raise TypeError(f"the cache must be a pair (k, v), got {type(cache).__name__}")
        outs.append(out)
        start += size
    return torch.cat(outs, dim=1), tuple(cache)


def _fed_with_bug(attn: MultiHeadAttention, x: Tensor, chunks: tuple[int, ...], part: int, *, bug: str) -> Any:
    return _feed(functools.partial(_gqa_step, bug=bug), attn, x, chunks)[part]


def _library_gqa(
    attn: MultiHeadAttention, x: Tensor, chunks: tuple[int, ...]
) -> tuple[Tensor, tuple[Tensor | None, Tensor | None]]:
    """The library's outputs for the whole sequence at once, and its KVCache filled chunk by chunk."""
    cache, start = KVCache(), 0
    for size in chunks:
        attn(x[:, start : start + size], cache=cache, is_causal=True)
        start += size
    return attn(x, is_causal=True), (cache.k, cache.v)


def _library_gqa_step(attn: MultiHeadAttention, x: Tensor, cache: tuple[Tensor, Tensor] | None) -> Any:
    kv_cache = KVCache() if cache is None else KVCache(*cache)
    return attn(x, cache=kv_cache, is_causal=True), (kv_cache.k, kv_cache.v)


_GQA_CASES = (  # (name, n_heads, n_kv_heads, d_model, chunks: the prompt's length, then each step's)
    ("4 query heads, 2 key/value heads; chunks of 5, 1, 1, 1", 4, 2, 32, (5, 1, 1, 1)),
    ("6 query heads, 3 key/value heads; chunks of 4, 2, 1", 6, 3, 48, (4, 2, 1)),
    ("8 query heads share 1 key/value head; chunks of 3, 1, 1", 8, 1, 32, (3, 1, 1)),
    ("4 query heads, 4 key/value heads; chunks of 2, 1, 1", 4, 4, 16, (2, 1, 1)),
)


@checker(reference=_library_gqa_step)
def check_gqa_step(c: Checker, gqa_step: Callable[..., tuple[Tensor, tuple[Tensor, Tensor]]]) -> None:
    """Check ``gqa_step(attn, x, cache)``: causal self-attention of new positions with a key/value cache, for a
    grouped-query ``MultiHeadAttention``, fed a sequence in chunks. Shapes: x (B, T_new, d_model), cache None or
    (k, v) each (B, n_kv_heads, T_past, d_head) -> (out (B, T_new, d_model), the cache with T_past + T_new)."""
    torch.manual_seed(7)  # @checker restores the reader's random state afterwards
    layers = [  # (attention, x (B, T, d_model)), made before any answer runs: its random draws change no case
        (MultiHeadAttention(d, n_heads, n_kv_heads=n_kv, bias=False).eval(), torch.randn(2, sum(chunks), d))
        for _, n_heads, n_kv, d, chunks in _GQA_CASES
    ]
    for (name, n_heads, n_kv_heads, _, chunks), (attn, x) in zip(_GQA_CASES, layers, strict=True):
        parts = (
            ("the outputs", _GQA_BUGS, _GQA_HINT),
            ("the cache", _cache_bugs(n_heads, n_kv_heads), _GQA_CACHE_HINT),
        )
        with torch.no_grad():
            expected = _library_gqa(attn, x, chunks)
            for part, (what, bugs, hint) in enumerate(parts):  # part 0: the outputs, 1: the cache
                c.case(
                    f"{name}: {what}",
                    lambda attn, x, chunks=chunks, part=part: _feed(gqa_step, attn, x, chunks)[part],
                    expected[part],
                    bugs=bug_table(bugs, _fed_with_bug, attn, x, chunks, part),
                    hint=hint,
                    inputs={"attn": attn, "x": x},
                )

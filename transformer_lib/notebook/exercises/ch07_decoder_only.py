"""Chapter 7, decoder-only models: BPE encoding, SwiGLU's width, the size of a KV cache, a grouped-query cache.

``check_encode_word``, ``check_swiglu_hidden``, ``check_kv_cache_bytes`` (a prediction), ``check_gqa_step``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...attention import KVCache, MultiHeadAttention
from ...masks import causal_mask
from ._framework import Bug, Checker, checker

__all__ = ["check_encode_word", "check_swiglu_hidden", "check_kv_cache_bytes", "check_gqa_step"]


# --------------------------------------------------------------------------- BPE: encoding with learned merges


def _encode_word(word: str, merges: list[tuple[str, str]], *, rule: str = "rank") -> list[str]:
    """Split ``word`` into symbols and apply the merges, lowest rank first; or in one of three wrong ways.

    ``rule="count"`` merges the pair most frequent in the word (ties: the first seen), the rule of training;
    ``"leftmost"`` the leftmost pair that has any merge; ``"once"`` applies each merge in turn, to its first
    occurrence only.
    """
    rank = {pair: r for r, pair in enumerate(merges)}
    symbols = list(word)
    if rule == "once":
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
        if rule == "count":
            counts = Counter(known)
            best = max(counts, key=counts.__getitem__)
        else:
            best = min(known, key=rank.__getitem__) if rule == "rank" else known[0]
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


@checker
def check_encode_word(c: Checker, encode_word: Callable[[str, list[tuple[str, str]]], list[str]]) -> None:
    """Check ``encode_word(word, merges)``: a word's BPE tokens, merging the earliest-learned known pair first.

    Shapes: word str (byte-level spelling), merges a list of pairs in the order they were learned -> list of
    token strings.
    """
    cases = (
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
    by_count = (
        "you merge the pair that is most frequent in the word: that is the rule of *training*. Encoding replays "
        "the learned merges in the order they were learned: among the word's adjacent pairs that have a merge, "
        "take the one that comes earliest in merges."
    )
    leftmost = (
        "merge the pair with the lowest rank (learned first) among the word's adjacent pairs, not the leftmost "
        "pair that has a merge."
    )
    for name, word in cases:
        counted, left = _encode_word(word, _MERGES, rule="count"), _encode_word(word, _MERGES, rule="leftmost")
        order_bugs = (
            (Bug(lambda w=word: _encode_word(w, _MERGES, rule="count"), by_count),)
            + (Bug(lambda w=word: _encode_word(w, _MERGES, rule="leftmost"), leftmost),)
            if counted != left
            else (  # on this word the two wrong rules agree: name both
                Bug(
                    lambda w=word: _encode_word(w, _MERGES, rule="leftmost"),
                    "you merge the leftmost pair that has a merge, or the most frequent one (on this word they "
                    "coincide): the rule is the order the merges were learned. Among the word's adjacent pairs "
                    "that have a merge, take the one that comes earliest in merges.",
                ),
            )
        )
        c.case(
            name,
            lambda word, merges: encode_word(word, merges),
            _encode_word(word, _MERGES),
            bugs=(
                *order_bugs,
                Bug(
                    lambda w=word: _encode_word(w, _MERGES, rule="once"),
                    "a merge applies to every occurrence of its pair, and a merged symbol can merge again: repeat "
                    "until no adjacent pair has a merge.",
                ),
            ),
            hint="symbols = list(word); repeat: among the adjacent pairs that appear in merges, take the one with "
            "the smallest index in merges, join all its occurrences left to right; stop when none is left.",
            inputs={"word": word, "merges": list(_MERGES)},
        )


# --------------------------------------------------------------------------- SwiGLU's width


def _swiglu_hidden(d_model: int, multiple_of: int) -> int:
    """LLaMA's SwiGLU width: 2/3 of 4 d_model (rounded down), then up to a multiple of ``multiple_of``."""
    hidden = int(2 * 4 * d_model / 3)
    return multiple_of * math.ceil(hidden / multiple_of)


@checker
def check_swiglu_hidden(c: Checker, swiglu_hidden: Callable[[int, int], int]) -> None:
    """Check ``swiglu_hidden(d_model, multiple_of)``: the hidden width of LLaMA's SwiGLU feed-forward network."""
    cases = (
        ("d_model 4096, multiple_of 256 (LLaMA 7B)", 4096, 256),
        ("d_model 5120, multiple_of 256 (LLaMA 13B)", 5120, 256),
        ("d_model 6656, multiple_of 256 (LLaMA 33B)", 6656, 256),
        ("d_model 8192, multiple_of 256 (LLaMA 65B)", 8192, 256),
        ("d_model 128, multiple_of 1: no rounding", 128, 1),
        ("d_model 96, multiple_of 32", 96, 32),
    )
    for name, d_model, multiple_of in cases:
        c.case(
            name,
            lambda d_model, multiple_of: swiglu_hidden(d_model, multiple_of),
            _swiglu_hidden(d_model, multiple_of),
            bugs=(
                Bug(
                    lambda d=d_model: int(8 * d / 3),
                    "round the width up to a multiple of multiple_of (fast matrix shapes): "
                    "multiple_of * ceil(hidden / multiple_of).",
                ),
                Bug(
                    lambda d=d_model, m=multiple_of: m * (int(8 * d / 3) // m),
                    "round up (ceil), not down or to the nearest: rounding down would leave fewer parameters "
                    "than the 4 d_model GELU network.",
                ),
                Bug(
                    lambda d=d_model: 4 * d,
                    "4 d_model is the GELU network's width; SwiGLU has three matrices instead of two, so it "
                    "takes 2/3 of that to keep the parameter count.",
                ),
            ),
            hint="three matrices of d_model x hidden hold as many parameters as two of d_model x 4 d_model when "
            "hidden = 2/3 * 4 d_model; LLaMA takes int() of that, then rounds up to a multiple of multiple_of.",
            inputs={"d_model": d_model, "multiple_of": multiple_of},
        )


# --------------------------------------------------------------------------- the size of a KV cache (a prediction)

KV_MODEL = dict(n_layers=4, n_heads=4, d_model=128, n_kv_heads=2)
"""The model of the prediction: the chapter's CPU size, with grouped-query attention (2 key/value heads)."""
KV_DTYPE = torch.bfloat16
"""The cache's number format in the prediction."""


def kv_cache_bytes_per_token(n_layers: int, n_heads: int, d_model: int, n_kv_heads: int, dtype: torch.dtype) -> int:
    """Bytes one token adds to a decoder's KV cache: a key and a value of ``n_kv_heads * d_head`` numbers per layer."""
    d_head = d_model // n_heads
    return 2 * n_layers * n_kv_heads * d_head * torch.tensor([], dtype=dtype).element_size()


@checker(answer="value")
def check_kv_cache_bytes(c: Checker, prediction: float) -> None:
    """Check ``prediction``: the bytes per token of the KV cache of a 4-layer model with d_model 128, 4 query heads,
    2 key/value heads (grouped-query attention), stored in bfloat16."""
    m = KV_MODEL
    expected = kv_cache_bytes_per_token(**m, dtype=KV_DTYPE)
    full = kv_cache_bytes_per_token(m["n_layers"], m["n_heads"], m["d_model"], m["n_heads"], torch.float32)
    half = kv_cache_bytes_per_token(**m, dtype=torch.float32)
    c.case(
        "bytes per token",
        lambda: prediction,
        float(expected),
        bugs=(
            Bug(
                lambda: full,
                "that is the chapter's own cache: 4 key/value heads in float32. Here only 2 heads keep keys and "
                "values, and bfloat16 stores a number in 2 bytes instead of 4.",
            ),
            Bug(
                lambda: half,
                "you applied one of the two halvings, not both: 2 of the 4 heads keep keys and values "
                f"({m['n_kv_heads']} x {m['d_model'] // m['n_heads']} numbers per layer instead of {m['d_model']}), "
                "and bfloat16 takes 2 bytes per number, not float32's 4.",
            ),
            Bug(
                lambda: expected // 2,
                "a layer caches a key AND a value for each token: the factor 2.",
            ),
            Bug(
                lambda: expected * 8,
                "that is bits: a bfloat16 number takes 16 bits, 2 bytes.",
            ),
            Bug(
                lambda: expected * 64,
                "that is a full window of 64 tokens; the question is per token.",
            ),
        ),
        hint="bytes per token = 2 (a key and a value) x n_layers x n_kv_heads x d_head x bytes per number, with "
        "d_head = d_model / n_heads.",
        atol=0.5,
    )


# --------------------------------------------------------------------------- a KV cache for grouped-query attention


def _gqa_step(
    attn: MultiHeadAttention,
    x: Tensor,
    cache: tuple[Tensor, Tensor] | None,
    *,
    expand: str = "interleave",
    mask: str = "bottom_right",
    keep: bool = True,
    cache_expanded: bool = False,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One step of cached grouped-query self-attention, or one of its classic bugs.

    ``expand="repeat"`` pairs query head h with key/value head ``h % n_kv_heads``; ``mask="top_left"`` uses
    ``is_causal=True`` with more keys than queries, ``mask="none"`` no mask; ``keep=False`` drops the cached keys;
    ``cache_expanded=True`` caches the keys and values after repeating them.

    Shapes: x (B, T_new, d_model), cache (k, v) (B, n_kv_heads, T_past, d_head) -> out (B, T_new, d_model), cache.
    """
    n_rep = attn.n_heads // attn.n_kv_heads
    T_new = x.shape[1]

    def expanded(t: Tensor) -> Tensor:
        return t.repeat(1, n_rep, 1, 1) if expand == "repeat" else t.repeat_interleave(n_rep, dim=1)

    q = attn.split_heads(attn.q_proj(x))  # (B, n_heads, T_new, d_head)
    k, v = attn.split_heads(attn.k_proj(x)), attn.split_heads(attn.v_proj(x))  # (B, n_kv_heads, T_new, d_head)
    if cache_expanded:
        k, v = expanded(k), expanded(v)
    if keep and cache is not None:
        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
    k_all, v_all = (k, v) if cache_expanded else (expanded(k), expanded(v))  # (B, n_heads, T_k, d_head)
    if mask == "top_left":
        out = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=True)
    elif mask == "none":
        out = F.scaled_dot_product_attention(q, k_all, v_all)
    else:
        out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=causal_mask(T_new, k.shape[2]))
    return attn.out_proj(attn.merge_heads(out)), (k, v)


def _feed(step: Callable[..., Any], attn: MultiHeadAttention, x: Tensor, chunks: tuple[int, ...]) -> tuple[Tensor, Any]:
    """Run ``step(attn, x_new, cache)`` on ``x`` chunk by chunk, handing each call the cache the previous one
    returned; return the outputs, concatenated along T, and the last cache."""
    cache, outs, start = None, [], 0
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


def _buggy(attn: MultiHeadAttention, x: Tensor, chunks: tuple[int, ...], part: int, **kind: Any) -> Callable[[], Any]:
    """What a buggy ``gqa_step`` (see :func:`_gqa_step`) gives: its outputs (``part=0``) or its last cache (1)."""
    return lambda: _feed(lambda a, xs, cache: _gqa_step(a, xs, cache, **kind), attn, x, chunks)[part]


def _library_gqa(attn: MultiHeadAttention, x: Tensor, chunks: tuple[int, ...]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """The library's answer: the whole sequence at once (outputs), and its KVCache filled chunk by chunk."""
    cache, start = KVCache(), 0
    for size in chunks:
        attn(x[:, start : start + size], cache=cache, is_causal=True)
        start += size
    return attn(x, is_causal=True), (cache.k, cache.v)


@checker
def check_gqa_step(c: Checker, gqa_step: Callable[..., tuple[Tensor, tuple[Tensor, Tensor]]]) -> None:
    """Check ``gqa_step(attn, x, cache)``: causal self-attention of new positions with a key/value cache, for a
    grouped-query ``MultiHeadAttention`` (``attn.n_kv_heads`` key/value heads, each shared by
    ``attn.n_heads // attn.n_kv_heads`` query heads, head h reading key/value head ``h // (n_heads // n_kv_heads)``).

    The checker feeds a sequence in chunks (a prompt, then a few tokens), passing each call the cache the
    previous call returned (None at first), and compares the outputs with the whole sequence at once, and the
    cache with the library's.

    Shapes: x (B, T_new, d_model), cache None or (k, v) each (B, n_kv_heads, T_past, d_head)
    -> (out (B, T_new, d_model), (k, v) each (B, n_kv_heads, T_past + T_new, d_head)).
    """
    cases = (
        ("4 query heads, 2 key/value heads: a prompt of 5, then 3 tokens one at a time", 4, 2, 32, (5, 1, 1, 1)),
        ("6 query heads, 3 key/value heads: a prompt of 4, then 2 tokens at once, then 1", 6, 3, 48, (4, 2, 1)),
        ("8 query heads, 1 key/value head (multi-query): a prompt of 3, then 2 single tokens", 8, 1, 32, (3, 1, 1)),
        ("4 query heads, 4 key/value heads (plain multi-head): a prompt of 2, then 2 single tokens", 4, 4, 16,
         (2, 1, 1)),
    )  # fmt: skip
    torch.manual_seed(7)  # @checker restores the reader's random state afterwards
    layers = [  # made before any answer runs: an answer that draws random numbers changes no case
        (
            MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads, bias=False).eval(),
            torch.randn(2, sum(chunks), d_model),
        )
        for _, n_heads, n_kv_heads, d_model, chunks in cases
    ]  # (attention, x of shape (B, T, d_model))
    for (name, n_heads, n_kv_heads, _, chunks), (attn, x) in zip(cases, layers, strict=True):
        with torch.no_grad():
            expected_out, expected_cache = _library_gqa(attn, x, chunks)
            c.case(
                f"{name}: the outputs",
                lambda attn, x, chunks=chunks: _feed(gqa_step, attn, x, chunks)[0],
                expected_out,
                bugs=(
                    Bug(
                        _buggy(attn, x, chunks, 0, expand="repeat"),
                        "query head h shares key/value head h // (n_heads // n_kv_heads): heads 0 and 1 read key/value "
                        "head 0. k.repeat(1, n_rep, 1, 1) (or expand + reshape in the wrong order) pairs head h with "
                        "h % n_kv_heads; use k.repeat_interleave(n_rep, dim=1).",
                    ),
                    Bug(
                        _buggy(attn, x, chunks, 0, mask="top_left"),
                        "with fewer new queries than keys, is_causal=True aligns the triangle to the top left and the "
                        "new tokens see only the first keys. Use causal_mask(T_new, T_past + T_new), aligned to the "
                        "bottom right.",
                    ),
                    Bug(
                        _buggy(attn, x, chunks, 0, mask="none"),
                        "one new token may see every key, but a prompt of several tokens needs the causal mask: "
                        "without it, its early tokens see the later ones. Use causal_mask(T_new, T_past + T_new).",
                    ),
                    Bug(
                        _buggy(attn, x, chunks, 0, keep=False),
                        "the new tokens attend only to themselves: concatenate the cached keys and values in front of "
                        "the new ones (torch.cat([k_past, k_new], dim=2)) before attending.",
                    ),
                ),
                hint="project q (n_heads heads) and k, v (n_kv_heads heads) with attn.split_heads; append k and v to "
                "the cache; repeat_interleave them n_heads // n_kv_heads times along the heads for the attention; "
                "causal_mask(T_new, T_past + T_new); merge the heads and apply attn.out_proj.",
                inputs={"attn": attn, "x": x},
            )
            n_rep = n_heads // n_kv_heads
            c.case(
                f"{name}: the cache",
                lambda attn, x, chunks=chunks: _feed(gqa_step, attn, x, chunks)[1],
                expected_cache,
                bugs=tuple(
                    Bug(
                        _buggy(attn, x, chunks, 1, cache_expanded=True, expand=expand),
                        f"the cache must hold the {n_kv_heads} key/value head{'s' * (n_kv_heads > 1)}, not the "
                        f"{n_heads} repeated ones: that is what grouped-query attention saves ({n_rep} times less "
                        "memory). Append k and v to the cache first, and repeat them only for the attention.",
                    )
                    for expand in ("interleave", "repeat")
                )
                if n_rep > 1
                else (),
                hint="return the cache as (k, v), each of shape (B, n_kv_heads, T_past + T_new, d_head): every key and "
                "value so far, in order, before any repeat.",
                inputs={"attn": attn, "x": x},
            )

"""Chapter 7, decoder-only models: sampling filters, generation with a KV cache, SwiGLU's width, BPE encoding.

``check_top_k_filter``, ``check_top_p_filter``, ``check_generate_cached``, ``check_swiglu_hidden``,
``check_encode_word``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ... import sampling
from ...masks import causal_mask
from ...models import GPT, GPTConfig
from ._framework import Bug, Checker, checker

__all__ = [
    "check_top_k_filter",
    "check_top_p_filter",
    "check_generate_cached",
    "check_swiglu_hidden",
    "check_encode_word",
]


def _k_beyond_the_vocabulary_hint(error: Exception) -> str:
    """The min(k, V) hint only for the error topk raises when k exceeds the vocabulary."""
    if "out of range" in str(error):
        return "k may be larger than the vocabulary: use min(k, logits.shape[-1])."
    return ""


@checker
def check_top_k_filter(c: Checker, top_k_filter: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``top_k_filter(logits, k)``: keep the ``k`` largest logits of each row, set the rest to -inf.

    Shapes: logits (B, V) -> (B, V).
    """
    g = torch.Generator().manual_seed(4)
    cases = (
        ("one row, k=2", torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2),
        ("a batch of 3 rows, k=5 of 10", torch.randn(3, 10, generator=g), 5),
        ("k=1 is greedy", torch.randn(2, 6, generator=g), 1),
        ("k larger than the vocabulary keeps everything", torch.randn(2, 4, generator=g), 10),
    )
    for name, logits, k in cases:
        kth = logits.topk(min(k, logits.shape[-1]), dim=-1).values[..., -1:]
        c.case(
            name,
            lambda logits, k: top_k_filter(logits, k),
            sampling.top_k_filter(logits, k),
            bugs=(
                Bug(
                    lambda logits=logits, kth=kth: logits.masked_fill(logits < kth, 0.0),
                    "masked logits must become -inf, not 0: a logit of 0 still has probability e^0 / Z.",
                ),
                Bug(
                    lambda logits=logits, kth=kth: logits.masked_fill(logits >= kth, float("-inf")),
                    "the comparison is flipped: you removed the k best tokens and kept the rest.",
                ),
                Bug(
                    lambda logits=logits, k=k: logits.masked_fill(
                        logits < logits.flatten().topk(min(k, logits.numel())).values[-1], float("-inf")
                    ),
                    "the k-th largest value must be found per row (topk(..., dim=-1)), not over the whole batch.",
                ),
            ),
            hint="kth = logits.topk(k, dim=-1).values[..., -1:]; logits.masked_fill(logits < kth, float('-inf')).",
            error_hint=_k_beyond_the_vocabulary_hint,
            inputs={"logits": logits, "k": k},
        )


@checker
def check_top_p_filter(c: Checker, top_p_filter: Callable[[Tensor, float], Tensor]) -> None:
    """Check ``top_p_filter(logits, p)``: keep the smallest set of most likely tokens whose probability reaches ``p``.

    Shapes: logits (B, V) -> (B, V), dropped tokens set to -inf; the most likely token is always kept.
    """
    g = torch.Generator().manual_seed(5)
    logits1 = torch.log(torch.tensor([[0.05, 0.5, 0.3, 0.15]]))
    cases = (
        ("probabilities (0.05, 0.5, 0.3, 0.15), p=0.7", logits1, 0.7),
        ("same, p=0.5: the top token alone reaches p", logits1, 0.5),
        ("same, p=0.3: the top token is kept even beyond p", logits1, 0.3),
        ("a batch of 3 rows of 12, p=0.9", torch.randn(3, 12, generator=g) * 2, 0.9),
        ("p=1.0 keeps everything", torch.randn(2, 5, generator=g), 1.0),
    )

    def exclusive_bug(logits: Tensor, p: float) -> Tensor:  # drops the token that crosses p
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        drop_sorted = sorted_logits.softmax(-1).cumsum(-1) > p
        return logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))

    def unsorted_bug(logits: Tensor, p: float) -> Tensor:  # cumulative sum in vocabulary order
        probs = logits.softmax(-1)
        return logits.masked_fill(probs.cumsum(-1) - probs >= p, float("-inf"))

    for name, logits, p in cases:
        c.case(
            name,
            lambda logits, p: top_p_filter(logits, p),
            sampling.top_p_filter(logits, p),
            bugs=(
                Bug(
                    lambda logits=logits, p=p: exclusive_bug(logits, p),
                    "you drop the token that makes the total cross p; nucleus sampling keeps it (keep a token "
                    "when the probability of the tokens ranked above it is still below p).",
                ),
                Bug(
                    lambda logits=logits, p=p: unsorted_bug(logits, p),
                    "sort the probabilities in descending order before the cumulative sum; in vocabulary "
                    "order the 'nucleus' is arbitrary tokens.",
                ),
            ),
            hint="sort descending, cumulative probabilities, drop a token when the mass ranked above it is >= p, "
            "then scatter the drop mask back to vocabulary order.",
            inputs={"logits": logits, "p": p},
        )


# --------------------------------------------------------------------------- generation with a KV cache


def _cached_greedy(
    model: GPT, idx: Tensor, n_new: int, *, offset: bool = True, top_left: bool = False, keep: bool = True
) -> Tensor:
    """Greedy generation with a hand-written cache for a GPT with learned positions, and its classic bugs.

    ``offset=False``: the new token gets position 0's vector; ``top_left=True``: ``is_causal=True`` with one
    query, so it sees only the first key; ``keep=False``: only the new token, without the earlier keys.

    Shapes: idx (B, T0) -> (B, T0 + n_new).
    """
    cache: list[tuple[Tensor, Tensor] | None] = [None] * len(model.blocks)

    def step(new: Tensor) -> Tensor:
        B, T_new = new.shape
        T_past = 0 if cache[0] is None else cache[0][0].shape[2]
        start = T_past if offset else 0
        h = model.tok_emb(new) + model.pos.weight[start : start + T_new]  # (B, T_new, d_model)
        for i, block in enumerate(model.blocks):
            attn = block.self_attn
            a = block.norm1(h)
            q, k, v = (
                proj(a).view(B, T_new, attn.n_heads, attn.d_head).transpose(1, 2)  # (B, n_heads, T_new, d_head)
                for proj in (attn.q_proj, attn.k_proj, attn.v_proj)
            )
            if keep and cache[i] is not None:
                k = torch.cat([cache[i][0], k], dim=2)  # (B, n_heads, T_past + T_new, d_head)
                v = torch.cat([cache[i][1], v], dim=2)
            cache[i] = (k, v)
            if top_left:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(T_new, k.shape[2]))
            h = h + attn.out_proj(out.transpose(1, 2).reshape(B, T_new, -1))  # (B, T_new, d_model)
            h = h + block.ff(block.norm2(h))
        return model.lm_head(model.norm_f(h[:, -1]))  # (B, vocab_size)

    with torch.no_grad():
        logits = step(idx)
        for _ in range(n_new):
            next_id = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            idx = torch.cat([idx, next_id], dim=1)
            logits = step(next_id)
    return idx


def _small_gpt(seed: int, **sizes: int) -> GPT:
    """A small classic GPT (learned positions) with large random weights, so that greedy choices are sharp."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=20, positional="learned", **sizes)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
        model.pos.weight.mul_(4.0)  # positions that matter: a wrong position changes the greedy choice
    return model


@checker
def check_generate_cached(c: Checker, generate_cached: Callable[[GPT, Tensor, int], Tensor]) -> None:
    """Check ``generate_cached(model, idx, n_new)``: greedy generation feeding the prompt once, then one token
    per step, with a key/value cache written by hand, for a GPT with learned positions.

    Shapes: idx (B, T0) -> (B, T0 + n_new).
    """
    cases = (
        ("2 layers, 2 heads, a batch of 2 prompts of 4 tokens, 6 new", dict(n_layers=2, n_heads=2, d_model=16), 4, 6),
        ("1 layer, 4 heads, a batch of 2 prompts of 3 tokens, 8 new", dict(n_layers=1, n_heads=4, d_model=32), 3, 8),
    )
    fed: list[int] = []  # positions entering the first block at each call, counted by a hook

    def positions_fed(model: GPT, idx: Tensor, n_new: int) -> tuple[int, ...]:
        fed.clear()
        generate_cached(model, idx, n_new)
        return tuple(fed[:n_new])  # feeding the last new token too is harmless

    for i, (name, sizes, T0, n_new) in enumerate(cases):
        model = _small_gpt(i, block_size=T0 + n_new + 1, **sizes)
        idx = torch.randint(0, 20, (2, T0), generator=torch.Generator().manual_seed(10 + i))
        expected = model.generate(idx, n_new, temperature=0, use_cache=False)
        c.case(
            f"{name}: the tokens of the uncached loop",
            lambda model, idx, n_new: generate_cached(model, idx, n_new),
            expected,
            bugs=(
                Bug(
                    lambda m=model, x=idx, n=n_new: _cached_greedy(m, x, n, offset=False),
                    "the new token sits at position T_past (the number of cached positions), not 0: add "
                    "model.pos.weight[T_past : T_past + T_new], not the first rows of the table.",
                ),
                Bug(
                    lambda m=model, x=idx, n=n_new: _cached_greedy(m, x, n, top_left=True),
                    "with one query and T_past + 1 keys, is_causal=True (or a square causal mask) aligns the "
                    "triangle to the top left and the new token sees only the first key. The new query may see "
                    "every cached key: use causal_mask(T_new, T_past + T_new), aligned to the bottom right.",
                ),
                Bug(
                    lambda m=model, x=idx, n=n_new: _cached_greedy(m, x, n, keep=False),
                    "the new token attends only to itself: concatenate the cached keys and values in front of "
                    "its own (torch.cat([k_past, k_new], dim=2)) before attending.",
                ),
            ),
            hint="per layer, keep (k, v) of shape (B, n_heads, T_past, d_head); for new tokens, offset the "
            "positions by T_past, append their k and v, and let them attend to all T_past + T_new keys.",
            inputs={"model": model, "idx": idx, "n_new": n_new},
        )

        counting = _small_gpt(i, block_size=T0 + n_new + 1, **sizes)
        counting.blocks[0].norm1.register_forward_pre_hook(lambda module, args: fed.append(args[0].shape[1]))

        c.case(
            f"{name}: the prompt once, then one token per step",
            positions_fed,
            (T0,) + (1,) * (n_new - 1),
            bugs=(
                Bug(
                    lambda T0=T0, n=n_new: tuple(range(T0, T0 + n)),
                    "each step runs the model on the whole sequence again: that is the loop without a cache. "
                    "Feed only the newest token and let the cache supply the earlier keys and values.",
                ),
            ),
            hint="the checker counts the positions that reach model.blocks[0].norm1 at each step: the prompt's T0 "
            "positions once, then 1 per step. Run the blocks' own modules (block.norm1, block.self_attn's "
            "projections, block.ff) on the new positions only.",
            inputs={"model": counting, "idx": idx, "n_new": n_new},
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


# --------------------------------------------------------------------------- BPE: encoding with learned merges


def _encode_word(word: str, merges: list[tuple[str, str]], *, by_rank: bool = True, once: bool = False) -> list[str]:
    """Split ``word`` into symbols and apply the merges, lowest rank first; or two classic wrong ways.

    ``by_rank=False`` merges the leftmost pair that has any merge; ``once=True`` applies each merge in turn,
    to its first occurrence only.
    """
    rank = {pair: r for r, pair in enumerate(merges)}
    symbols = list(word)
    if once:
        for pair in merges:
            for i in range(len(symbols) - 1):
                if (symbols[i], symbols[i + 1]) == pair:
                    symbols[i : i + 2] = [pair[0] + pair[1]]
                    break
        return symbols
    while len(symbols) > 1:
        pairs = [(symbols[i], symbols[i + 1]) for i in range(len(symbols) - 1)]
        known = [p for p in pairs if p in rank]
        if not known:
            break
        best = min(known, key=rank.__getitem__) if by_rank else known[0]
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
           ("Ġ", "s"), ("ll", "ll"), ("e", "e"), ("Ġs", "ee")]  # fmt: skip


@checker
def check_encode_word(c: Checker, encode_word: Callable[[str, list[tuple[str, str]]], list[str]]) -> None:
    """Check ``encode_word(word, merges)``: a word's BPE tokens, merging the lowest-ranked known pair first.

    Shapes: word str (byte-level spelling), merges a list of pairs in rank order -> list of token strings.
    """
    cases = (
        ("'the': 'h'+'e' ranks before 't'+'h'", "the"),
        ("'Ġthe': merged symbols merge again", "Ġthe"),
        ("'llll': every occurrence of a pair merges", "llll"),
        ("'Ġseeing'", "Ġseeing"),
        ("'Ġsinger'", "Ġsinger"),
        ("'xyz': no merge applies", "xyz"),
        ("'a': a single symbol", "a"),
    )
    for name, word in cases:
        c.case(
            name,
            lambda word, merges: encode_word(word, merges),
            _encode_word(word, _MERGES),
            bugs=(
                Bug(
                    lambda w=word: _encode_word(w, _MERGES, by_rank=False),
                    "merge the pair with the lowest rank (learned first) among the word's adjacent pairs, not the "
                    "leftmost pair that has a merge.",
                ),
                Bug(
                    lambda w=word: _encode_word(w, _MERGES, once=True),
                    "a merge applies to every occurrence of its pair, and a merged symbol can merge again: repeat "
                    "until no adjacent pair has a merge.",
                ),
            ),
            hint="symbols = list(word); repeat: among the adjacent pairs that appear in merges, take the one with "
            "the smallest index in merges, join all its occurrences left to right; stop when none is left.",
            inputs={"word": word, "merges": list(_MERGES)},
        )

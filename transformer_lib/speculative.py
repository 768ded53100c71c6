"""Speculative decoding: a small draft model proposes tokens, the target model checks them all in one pass.

Greedy version (Leviathan et al., 2023; Chen et al., 2023, with temperature 0). Each round the
draft proposes ``k`` tokens one by one; the target runs once on all of them and gives its own
greedy choice after every prefix. The proposals are accepted up to the first one the target
disagrees with, and the target's token at that position is appended (when all ``k`` agree, the
target's choice after the last proposal comes for free: a bonus token). So a round yields between
1 and ``k + 1`` tokens for one target pass, and every token is the target's own greedy choice:
the output equals ``target.generate(idx, max_new_tokens, temperature=0)``.

Both models keep a key/value cache. A rejected proposal has its keys and values in the target's
(and the draft's) cache; rolling back is cutting the cache to the accepted length
(:func:`truncate_caches`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ._validate import _validate_int, _validate_token_ids
from .attention import KVCache
from .models import GPT
from .utils import eval_mode


@dataclass
class SpeculativeStats:
    """Counts from one :func:`speculative_generate` call.

    ``target_passes``/``draft_passes``: forward passes of each model; ``proposed``: draft tokens
    the target checked; ``accepted``: those it agreed with; ``generated``: new tokens in the output.
    """

    target_passes: int = 0
    draft_passes: int = 0
    proposed: int = 0
    accepted: int = 0
    generated: int = 0


def truncate_caches(caches: list[KVCache], length: int) -> None:
    """Roll every self-attention cache back to its first ``length`` positions, in place.

    Shapes: k, v (B, n_kv_heads, T_cache, d_head) -> (B, n_kv_heads, min(T_cache, length), d_head).
    """
    for cache in caches:
        if cache.k is not None and cache.v is not None and cache.k.shape[2] > length:
            cache.k, cache.v = cache.k[:, :, :length], cache.v[:, :, :length]


def _validate_pair(target: GPT, draft: GPT) -> None:
    for name, model in (("target", target), ("draft", draft)):
        if not isinstance(model, GPT):
            raise TypeError(f"{name} must be a transformer_lib.GPT, got {type(model).__name__}")
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(
            "target and draft must share one vocabulary, got vocab_size "
            f"{target.config.vocab_size} (target) and {draft.config.vocab_size} (draft)"
        )
    devices = (target.tok_emb.weight.device, draft.tok_emb.weight.device)
    if devices[0] != devices[1]:
        raise ValueError(f"target and draft must be on one device, got {devices[0]} (target) and {devices[1]} (draft)")


def _feed(model: GPT, tokens: Tensor, caches: list[KVCache] | None = None) -> Tensor:
    """Run ``model`` on the tokens its cache does not hold yet (all of them without a cache); their logits.

    The ids were validated once at the entry point, so each step takes the unchecked
    :meth:`GPT.logits <transformer_lib.models.GPT.logits>`.

    Shapes: tokens (1, T) with len(cache) < T <= block_size -> logits (1, T - len(cache), vocab_size).
    """
    new = tokens if caches is None else tokens[:, len(caches[0]) :]
    return model.logits(new, caches=caches)


class _Draft:
    """The draft model with its cache; past its own ``block_size`` it slides its window, uncached.

    Its proposals only need to be good guesses (the target checks each one), so the window rule
    here affects the acceptance rate, never the output.
    """

    def __init__(self, model: GPT, stats: SpeculativeStats) -> None:
        self.model, self.stats = model, stats
        self.block_size = model.config.block_size
        self.caches = model.new_caches()

    def propose(self, tokens: Tensor, k: int) -> Tensor:
        """``k`` greedy tokens after ``tokens``. Shapes: tokens (1, T) -> (1, k)."""
        proposals = []
        for _ in range(k):
            if tokens.shape[1] <= self.block_size:
                logits = _feed(self.model, tokens, self.caches)[:, -1]
            else:  # past the draft's context: the window slides, the cache no longer lines up
                self.caches = self.model.new_caches()
                logits = _feed(self.model, tokens[:, -self.block_size :])[:, -1]
            self.stats.draft_passes += 1
            next_id = logits.argmax(dim=-1, keepdim=True)  # (1, 1)
            proposals.append(next_id)
            tokens = torch.cat([tokens, next_id], dim=1)
        return torch.cat(proposals, dim=1)

    def rollback(self, length: int) -> None:
        truncate_caches(self.caches, length)


@torch.inference_mode()
def speculative_generate(
    target: GPT, draft: GPT, idx: Tensor, max_new_tokens: int, k: int = 4
) -> tuple[Tensor, SpeculativeStats]:
    """Greedy decoding of ``target``, sped up by ``k`` proposals per round from ``draft``; in eval mode.

    The output equals ``target.generate(idx, max_new_tokens, temperature=0)``: every token is the
    target's greedy choice, the draft only decides how many come out of one target pass. Both
    models are GPTs with the same ``vocab_size``; batch size 1. While the sequence fits in the
    target's ``block_size``, a round proposes at most ``block_size - T`` tokens, so the target
    sees its whole context as ``generate`` does. Once the context is full, ``generate`` slides
    its window and re-reads it for every token; each position then needs its own window, so
    speculation stops and the remaining tokens come from the target one pass each.

    "Equals" is exact arithmetic's promise: one pass over ``k + 1`` new tokens rounds differently
    from ``k + 1`` one-token passes (as ``generate`` with and without its cache do), so two logits
    tied to ~1e-6 could pick differently. ``stats.target_passes + stats.accepted == stats.generated``
    always holds.

    Shapes: idx (1, T0) -> (1, T0 + max_new_tokens).

    Defined in chapter 9, Inference and deployment.
    """
    _validate_pair(target, draft)
    idx = _validate_token_ids("idx", idx, target.config.vocab_size)
    if idx.shape[1] == 0:
        raise ValueError(f"idx must hold at least one token to continue from, got shape {tuple(idx.shape)}")
    if idx.shape[0] != 1:
        raise ValueError(
            f"speculative_generate decodes one sequence (batch size 1): rows accept different numbers "
            f"of proposals; got idx of shape {tuple(idx.shape)}"
        )
    _validate_int("max_new_tokens", max_new_tokens, minimum=0)
    _validate_int("k", k, allowed="a positive int (proposals per round)")

    stats = SpeculativeStats()
    block_size = target.config.block_size
    tokens = idx
    with eval_mode(target), eval_mode(draft):
        drafter = _Draft(draft, stats)
        caches = target.new_caches()  # holds every position but the last, between rounds
        while stats.generated < max_new_tokens and tokens.shape[1] < block_size:
            T = tokens.shape[1]
            remaining = max_new_tokens - stats.generated
            k_round = min(k, remaining - 1, block_size - T)  # the round yields at most k_round + 1 tokens
            proposals = drafter.propose(tokens, k_round) if k_round else tokens[:, :0]
            # One target pass: its greedy choice after the context and after each proposal.
            logits = _feed(target, torch.cat([tokens, proposals], dim=1), caches)  # (1, *, vocab_size)
            choices = logits[:, -(k_round + 1) :].argmax(dim=-1)  # (1, k_round + 1)
            stats.target_passes += 1
            agree = (proposals == choices[:, :k_round])[0].long()
            n_accepted = int(agree.cumprod(0).sum())  # length of the agreeing prefix
            new = choices[:, : n_accepted + 1]  # the accepted proposals, then the target's own token
            tokens = torch.cat([tokens, new], dim=1)
            stats.proposed += k_round
            stats.accepted += n_accepted
            stats.generated += n_accepted + 1
            truncate_caches(caches, tokens.shape[1] - 1)  # drop the rejected proposals' keys and values
            drafter.rollback(tokens.shape[1] - 1)
    remaining = max_new_tokens - stats.generated
    if remaining:  # the target's window slides: plain greedy decoding, one pass per token
        tokens = target.generate(tokens, remaining, temperature=0)
        stats.target_passes += remaining
        stats.generated += remaining
    return tokens, stats

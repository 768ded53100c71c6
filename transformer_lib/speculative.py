"""Speculative decoding: a small draft model proposes tokens, the target model checks them all in one pass.

Leviathan et al. (2023), Chen et al. (2023). Each round the draft samples ``k`` proposals from its
distributions q; one target pass gives the target's distributions p after every prefix. Proposal ``x`` is
accepted with probability ``min(1, p(x) / q(x))``; the first rejected one is replaced by a sample of
``max(0, p - q)`` (normalised), and when all are accepted a last token is sampled from p: 1 to ``k + 1``
tokens per target pass, distributed exactly as the target's own samples. At temperature 0, p and q are
one-hot at each model's greedy choice, and the same rule keeps the proposals up to the first
disagreement and then appends the target's choice: the target's greedy text. A rejected proposal's keys
and values are cut from the caches (:func:`truncate_caches`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Generator, Tensor

from ._validate import _validate_int, _validate_real, _validate_token_ids
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


def _feed(model: GPT, tokens: Tensor, caches: list[KVCache] | None = None) -> Tensor:
    """Unchecked logits of the tokens ``model``'s cache does not hold yet (all of them without a cache).

    Shapes: tokens (1, T) with len(cache) < T <= block_size -> logits (1, T - len(cache), vocab_size).
    """
    new = tokens if caches is None else tokens[:, len(caches[0]) :]
    return model.logits(new, caches=caches)


class _Draft:
    """The draft model with its cache; past its own ``block_size`` it slides its window, uncached (its
    proposals are only guesses: the window rule changes the acceptance rate, never the output)."""

    def __init__(self, model: GPT, stats: SpeculativeStats, temperature: float, generator: Generator | None) -> None:
        self.model, self.stats, self.temperature, self.generator = model, stats, temperature, generator
        self.block_size = model.config.block_size
        self.caches = model.new_caches()

    def propose(self, tokens: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """``k`` tokens sampled after ``tokens`` and the distributions they were drawn from.
        Shapes: tokens (1, T) -> proposals (1, k), q (k, vocab_size)."""
        proposals = [tokens[:, :0]]  # (1, 0): k may be 0
        q = [torch.zeros(0, self.model.config.vocab_size, device=tokens.device)]
        for _ in range(k):
            if tokens.shape[1] <= self.block_size:
                logits = _feed(self.model, tokens, self.caches)[:, -1]
            else:  # past the draft's context: the window slides, the cache no longer lines up
                self.caches = self.model.new_caches()
                logits = _feed(self.model, tokens[:, -self.block_size :])[:, -1]
            self.stats.draft_passes += 1
            q.append(probabilities(logits, self.temperature))  # (1, vocab_size)
            next_id = torch.multinomial(q[-1], 1, generator=self.generator)  # (1, 1)
            proposals.append(next_id)
            tokens = torch.cat([tokens, next_id], dim=1)
        return torch.cat(proposals, dim=1), torch.cat(q)

    def rollback(self, length: int) -> None:
        truncate_caches(self.caches, length)


@torch.inference_mode()
def speculative_generate(
    target: GPT,
    draft: GPT,
    idx: Tensor,
    max_new_tokens: int,
    k: int = 4,
    temperature: float = 0.0,
    generator: Generator | None = None,
) -> tuple[Tensor, SpeculativeStats]:
    """Decoding of ``target`` at ``temperature``, sped up by ``k`` proposals per round from ``draft``; in eval
    mode. At temperature 0 (the default) the output equals ``target.generate(idx, max_new_tokens,
    temperature=0)`` (up to rounding); above 0 it is distributed as ``target.generate(idx, max_new_tokens,
    temperature)``'s (no top-k or top-p). Both models are GPTs with one ``vocab_size``; batch size 1. Once
    the target's context is full, the remaining tokens come from ``target.generate``.
    ``stats.target_passes + stats.accepted == stats.generated`` always holds.

    Shapes: idx (1, T0) -> (1, T0 + max_new_tokens).

    Defined in chapter 9, Inference and deployment.
    """
    idx = _validate_speculative(target, draft, idx, max_new_tokens, k)
    _validate_real("temperature", temperature, "a finite number >= 0 (0 = greedy)", lambda t: t >= 0)
    stats = SpeculativeStats()
    tokens = idx
    with eval_mode(target), eval_mode(draft):
        drafter = _Draft(draft, stats, temperature, generator)
        caches = target.new_caches()  # holds every position but the last, between rounds
        while stats.generated < max_new_tokens and tokens.shape[1] < target.config.block_size:
            tokens = _round(target, drafter, tokens, caches, k, max_new_tokens - stats.generated)
    remaining = max_new_tokens - stats.generated
    if remaining:  # the target's window slides: plain decoding, one pass per token
        tokens = target.generate(tokens, remaining, temperature=temperature, generator=generator)
        stats.target_passes += remaining
        stats.generated += remaining
    return tokens, stats


def _round(target: GPT, drafter: _Draft, tokens: Tensor, caches: list[KVCache], k: int, remaining: int) -> Tensor:
    """One round: the draft proposes, one target pass checks; ``tokens`` with the accepted proposals and the
    target's own next token. Shapes: tokens (1, T) -> (1, T + n_accepted + 1)."""
    stats = drafter.stats
    k_round = min(k, remaining - 1, target.config.block_size - tokens.shape[1])  # yields at most k_round + 1
    proposals, q = drafter.propose(tokens, k_round)  # (1, k_round), (k_round, vocab_size)
    logits = _feed(target, torch.cat([tokens, proposals], dim=1), caches)  # (1, *, vocab_size)
    p = probabilities(logits[0, -(k_round + 1) :], drafter.temperature)  # (k_round + 1, vocab_size)
    x = proposals[0]  # (k_round,)
    steps = torch.arange(k_round)
    u = torch.rand(k_round, generator=drafter.generator, device=p.device)
    accept = u * q[steps, x] < p[steps, x]  # probability min(1, p(x) / q(x)); one-hot p, q: x is p's choice
    n_accepted = int(accept.long().cumprod(0).sum())  # the accepted prefix
    last = p[n_accepted]  # after all k_round accepted: the target's distribution, as is
    if n_accepted < k_round:  # after a rejection: what p has more of than q
        residual = (last - q[n_accepted]).clamp(min=0)
        last = residual if residual.sum() > 0 else last
    next_id = torch.multinomial(last[None], 1, generator=drafter.generator)  # (1, 1)
    tokens = torch.cat([tokens, proposals[:, :n_accepted], next_id], dim=1)
    stats.target_passes += 1
    stats.proposed += k_round
    stats.accepted += n_accepted
    stats.generated += n_accepted + 1
    truncate_caches(caches, tokens.shape[1] - 1)  # drop the rejected proposals' keys and values
    drafter.rollback(tokens.shape[1] - 1)
    return tokens


def probabilities(logits: Tensor, temperature: float) -> Tensor:
    """``softmax(logits / temperature)``, or one-hot at the argmax at temperature 0; rows in float32.

    Shapes: logits (N, vocab_size) -> (N, vocab_size).
    """
    if temperature == 0:
        return F.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    return torch.softmax(logits.float() / temperature, dim=-1)


def _validate_speculative(target: GPT, draft: GPT, idx: Tensor, max_new_tokens: int, k: int) -> Tensor:
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
    idx = _validate_token_ids("idx", idx, target.config.vocab_size)
    if idx.shape[1] == 0:
        raise ValueError(f"idx must hold at least one token to continue from, got shape {tuple(idx.shape)}")
    if idx.shape[0] != 1:
        raise ValueError(
            f"speculative_generate decodes one sequence (batch size 1), got idx of shape {tuple(idx.shape)}"
        )
    _validate_int("max_new_tokens", max_new_tokens, minimum=0)
    _validate_int("k", k, allowed="a positive int (proposals per round)")
    return idx

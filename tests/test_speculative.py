"""Speculative decoding gives exactly the target's greedy tokens, with fewer target passes when the draft agrees,
and samples distributed exactly as the target's own at a temperature above 0."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_lib import GPT, GPTConfig
from transformer_lib.speculative import SpeculativeStats, speculative_generate, truncate_caches

V = 37


# Untied output heads: a random GPT with tied embeddings mostly repeats its last token, which a random
# draft guesses easily; untied, the greedy text is varied and most proposals are rejected.
def make_target(seed: int, block_size: int = 48, tie_weights: bool = False, **kw) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(V, block_size, n_layers=2, n_heads=4, d_model=64, tie_weights=tie_weights, **kw)
    return GPT(config)


def make_draft(seed: int, block_size: int = 24, **kw) -> GPT:
    torch.manual_seed(1000 + seed)
    return GPT(GPTConfig(V, block_size, n_layers=1, n_heads=2, d_model=32, tie_weights=False, **kw))


def constant_draft(token: int) -> GPT:
    """A GPT whose greedy choice is always ``token``: the final norm outputs 1 in dimension 0, the head reads it."""
    draft = make_draft(0)
    with torch.no_grad():
        draft.norm_f.weight[0], draft.norm_f.bias[0] = 0.0, 1.0
        draft.lm_head.weight.zero_()
        draft.lm_head.weight[token, 0] = 1.0  # logit 1 for ``token``, 0 for every other
    return draft


def prompt(seed: int, T0: int = 5) -> torch.Tensor:
    return torch.randint(0, V, (1, T0), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("draft_kind", ["small", "target"])
def test_output_equals_target_greedy(seed, k, draft_kind):
    target = make_target(seed)
    draft = make_draft(seed) if draft_kind == "small" else target
    idx = prompt(seed)
    # 60 new tokens from 5: past the target's block of 48 (its window slides) and past the draft's 24.
    expected = target.generate(idx, 60, temperature=0)
    out, stats = speculative_generate(target, draft, idx, 60, k=k)
    assert torch.equal(out, expected)
    assert stats.generated == 60
    assert stats.target_passes + stats.accepted == stats.generated  # each pass: the accepted tokens + one
    assert stats.draft_passes == stats.proposed
    assert 0 <= stats.accepted <= stats.proposed
    if draft_kind == "target":
        assert stats.accepted == stats.proposed > 0


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_self_draft_accepts_everything_and_needs_one_target_pass_per_k_plus_1_tokens(k):
    target = make_target(3, block_size=64)
    idx = prompt(3)
    n = 40  # 5 + 40 tokens stay inside the block: no sliding
    out, stats = speculative_generate(target, target, idx, n, k=k)
    assert torch.equal(out, target.generate(idx, n, temperature=0))
    assert stats.accepted == stats.proposed
    assert stats.target_passes == math.ceil(n / (k + 1))


@pytest.mark.parametrize("positional", ["rope", "alibi", "sinusoidal"])
def test_equal_with_other_positions_and_grouped_query_attention(positional):
    target = make_target(4, positional=positional, n_kv_heads=2)
    draft = make_draft(4, positional=positional)
    idx = prompt(4)
    out, _ = speculative_generate(target, draft, idx, 50, k=3)
    assert torch.equal(out, target.generate(idx, 50, temperature=0))


def test_acceptance_counts_replayed_by_hand_with_a_draft_that_always_proposes_one_token():
    target = make_target(5, tie_weights=True)  # tied and random: long runs of one token, then another
    idx = prompt(5)
    expected = target.generate(idx, 30, temperature=0)
    new = expected[0, 5:].tolist()
    token = max(set(new), key=new.count)
    assert 0 < new.count(token) < len(new)  # some proposals accepted, some rejected
    out, stats = speculative_generate(target, constant_draft(token), idx, 30, k=4)
    assert torch.equal(out, expected)
    # Replay the rounds: a round accepts the target's next tokens while they equal ``token`` (at most k_round).
    passes = accepted = i = 0
    while i < len(new):
        k_round = min(4, len(new) - i - 1)
        run = 0
        while run < k_round and new[i + run] == token:
            run += 1
        passes, accepted, i = passes + 1, accepted + run, i + run + 1
    assert (stats.target_passes, stats.accepted) == (passes, accepted)
    assert accepted > 0


def test_rolled_back_cache_continues_like_a_fresh_model():
    model = make_target(6).eval()
    tokens = prompt(6, T0=12)
    with torch.no_grad():
        full, _ = model(tokens)
        caches = model.new_caches()
        model(tokens[:, :10], caches=caches)  # positions 0..9, as if 0..5 were accepted and 6..9 rejected
        truncate_caches(caches, 6)
        assert [len(c) for c in caches] == [6, 6]
        logits, _ = model(tokens[:, 6:12], caches=caches)
    torch.testing.assert_close(logits, full[:, 6:12], rtol=1e-4, atol=1e-5)


def test_prompt_at_or_past_the_block_and_zero_new_tokens():
    target, draft = make_target(7, block_size=16), make_draft(7, block_size=8)
    long_prompt = prompt(7, T0=20)
    out, stats = speculative_generate(target, draft, long_prompt, 6, k=4)
    assert torch.equal(out, target.generate(long_prompt, 6, temperature=0))
    assert (stats.target_passes, stats.proposed) == (6, 0)  # the window slides from the start: no speculation
    out, stats = speculative_generate(target, draft, long_prompt, 0)
    assert torch.equal(out, long_prompt)
    assert stats == SpeculativeStats()


def test_runs_in_eval_mode_and_restores_training_mode():
    target = make_target(8, dropout=0.2).train()
    draft = make_draft(8, dropout=0.2).train()
    idx = prompt(8)
    out, _ = speculative_generate(target, draft, idx, 20, k=3)
    assert target.training and draft.training
    assert torch.equal(out, target.generate(idx, 20, temperature=0))


def joint_distribution(model: GPT, idx: torch.Tensor, vocab_size: int, temperature: float) -> torch.Tensor:
    """Exact probability of every two-token continuation of ``idx``. Shapes: idx (1, T0) -> (vocab_size**2,)."""
    pairs = torch.cartesian_prod(torch.arange(vocab_size), torch.arange(vocab_size))  # (V*V, 2)
    with torch.no_grad():
        logits = model.eval()(torch.cat([idx.expand(len(pairs), -1), pairs], dim=1))[0] / temperature
    log_p = logits[:, -3:-1].log_softmax(dim=-1)  # (V*V, 2, V): before each of the two tokens
    return log_p.gather(-1, pairs[:, :, None]).sum(dim=(1, 2)).exp()


def test_sampling_keeps_the_targets_distribution_not_the_drafts():
    """min(1, p/q) acceptance and a resample from max(0, p - q): two sampled tokens (a proposal, accepted or
    replaced, then the bonus or a plain sample) follow the target's joint distribution, though the draft's
    differs from it by a total variation of more than 0.3; a round that accepted every proposal would not."""
    vocab_size, temperature, n = 4, 1.5, 3000
    torch.manual_seed(10)
    target = GPT(GPTConfig(vocab_size, 8, n_layers=1, n_heads=2, d_model=16, tie_weights=False))
    draft = GPT(GPTConfig(vocab_size, 8, n_layers=1, n_heads=2, d_model=16, tie_weights=False))
    with torch.no_grad():
        draft.lm_head.weight.mul_(40)  # a confident draft: far from the target's distribution
    idx = torch.tensor([[1, 3, 0]])
    p, q = (joint_distribution(m, idx, vocab_size, temperature) for m in (target, draft))
    assert 0.5 * (p - q).abs().sum() > 0.3
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(vocab_size**2)
    for _ in range(n):
        out, _ = speculative_generate(target, draft, idx, 2, k=1, temperature=temperature, generator=g)
        counts[out[0, -2] * vocab_size + out[0, -1]] += 1
    assert 0.5 * (counts / n - p).abs().sum() < 0.06  # sampling noise alone: about 0.03


def test_errors():
    target, draft = make_target(9), make_draft(9)
    idx = prompt(9)
    with pytest.raises(ValueError, match=r"batch size 1.*\(2, 5\)"):
        speculative_generate(target, draft, idx.repeat(2, 1), 5)
    for bad_k in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="k must be a positive int"):
            speculative_generate(target, draft, idx, 5, k=bad_k)
    other = GPT(GPTConfig(vocab_size=V + 1, block_size=16, n_layers=1, n_heads=2, d_model=32))
    with pytest.raises(ValueError, match=rf"vocab_size {V} \(target\) and {V + 1} \(draft\)"):
        speculative_generate(target, other, idx, 5)
    with pytest.raises(TypeError, match="draft must be a transformer_lib.GPT"):
        speculative_generate(target, torch.nn.Linear(2, 2), idx, 5)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0"):
        speculative_generate(target, draft, idx, -1)
    with pytest.raises(ValueError, match="at least one token"):
        speculative_generate(target, draft, idx[:, :0], 5)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        speculative_generate(target, draft, idx + V, 5)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        speculative_generate(target, draft, idx, 5, temperature=-1.0)

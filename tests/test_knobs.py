"""The settings real models need: grouped-query attention, norm eps, RoPE base and explicit positions,
untied heads, padding masks; and a GPTConfig that is checked when made and cannot drift after."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transformer_lib import GPT, GPTConfig, MultiHeadAttention, RotaryEmbedding, count_parameters
from transformer_lib.attention import repeat_kv
from transformer_lib.positional import LearnedPositionalEmbedding


def tiny(**kw) -> GPT:
    cfg = dict(vocab_size=17, block_size=24, n_layers=2, n_heads=4, d_model=32)
    return GPT(GPTConfig(**(cfg | kw))).eval()


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_grouped_query_attention_cache_holds_only_the_kv_heads(n_kv_heads):
    model = tiny(n_kv_heads=n_kv_heads, positional="rope")
    caches = model.new_caches()
    idx = torch.randint(17, (2, 10))
    model(idx, caches=caches)
    assert caches[0].k.shape == (2, n_kv_heads, 10, 8)
    assert model.blocks[0].self_attn.k_proj.weight.shape == (n_kv_heads * 8, 32)
    cached = model.generate(idx, 10, temperature=0, use_cache=True)
    uncached = model.generate(idx, 10, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)


def test_grouped_query_attention_equals_full_attention_with_repeated_kv_heads():
    torch.manual_seed(0)
    gqa = MultiHeadAttention(32, 4, n_kv_heads=2)
    full = MultiHeadAttention(32, 4)
    with torch.no_grad():
        full.q_proj.load_state_dict(gqa.q_proj.state_dict())
        full.out_proj.load_state_dict(gqa.out_proj.state_dict())
        for theirs, mine in ((full.k_proj, gqa.k_proj), (full.v_proj, gqa.v_proj)):
            # kv head j serves query heads 2j and 2j+1: repeat its 8 rows for each
            w = repeat_kv(mine.weight.view(1, 2, 8, 32), 2).reshape(32, 32)
            b = repeat_kv(mine.bias.view(1, 2, 8, 1), 2).reshape(32)
            theirs.weight.copy_(w)
            theirs.bias.copy_(b)
    x = torch.randn(2, 7, 32)
    out, w = gqa(x, need_weights=True, is_causal=True)
    out_full, w_full = full(x, need_weights=True, is_causal=True)
    torch.testing.assert_close(out, out_full)
    torch.testing.assert_close(w, w_full)
    torch.testing.assert_close(gqa(x, is_causal=True), out)  # fused path equals explicit path


def test_bad_kv_head_counts():
    with pytest.raises(ValueError, match=r"n_heads \(4\) must be a multiple of n_kv_heads \(3\)"):
        MultiHeadAttention(32, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match="n_kv_heads must be a positive int, got 0"):
        MultiHeadAttention(32, 4, n_kv_heads=0)
    with pytest.raises(ValueError, match=r"n_heads \(4\) must be a multiple of n_kv_heads \(3\)"):
        GPTConfig(vocab_size=5, block_size=8, n_kv_heads=3)


def test_norm_eps_and_rope_base_reach_the_modules():
    model = tiny(norm="rmsnorm", norm_eps=1e-5, positional="rope", rope_base=500000.0)
    assert {m.eps for m in model.modules() if type(m).__name__ == "RMSNorm"} == {1e-5}
    rope = model.blocks[0].self_attn.rotary
    assert torch.allclose(rope.cos, RotaryEmbedding(8, 24, base=500000.0).cos)
    assert not torch.allclose(rope.cos, RotaryEmbedding(8, 24).cos)
    assert tiny(norm="rmsnorm").config.norm_eps == 1e-6 and tiny().config.norm_eps == 1e-5


def test_untied_head_has_its_own_weights():
    tied, untied = tiny(), tiny(tie_weights=False)
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert count_parameters(untied) - count_parameters(tied) == 17 * 32


def test_explicit_positions_equal_the_offset_and_are_checked():
    x = torch.randn(2, 3, 5, 8)
    rope = RotaryEmbedding(8, 16)
    torch.testing.assert_close(rope(x, positions=torch.arange(4, 9)), rope(x, offset=4))
    per_row = torch.stack([torch.arange(0, 5), torch.arange(6, 11)])  # (B, T): each row its own start
    out = rope(x, positions=per_row)
    torch.testing.assert_close(out[0], rope(x[:1], offset=0)[0])
    torch.testing.assert_close(out[1], rope(x[1:], offset=6)[0])
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 16\)"):
        rope(x, positions=torch.arange(12, 17))
    with pytest.raises(ValueError, match="positions must be integer positions of shape"):
        rope(x, positions=torch.arange(4.0, 9.0))
    learned = LearnedPositionalEmbedding(8, 16)
    h = torch.randn(2, 5, 8)
    torch.testing.assert_close(learned(h, positions=per_row)[1], learned(h[1:], offset=6)[0])


def test_attention_mask_is_checked_at_the_boundary():
    model = tiny()
    idx = torch.randint(17, (2, 6))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, T\) = \(2, 6\)"):
        model(idx, attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="only 0 .* and 1"):
        model(idx, attention_mask=torch.full((2, 6), 2))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, T\) = \(2, 6\)"):
        model.generate(idx, 2, attention_mask=torch.ones(6, 2))


def test_config_is_immutable_and_every_field_is_checked():
    cfg = GPTConfig(vocab_size=17, block_size=24)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.n_heads = 3
    assert dataclasses.replace(cfg, activation="swiglu").d_ff == 4 * 128  # the derived d_ff is kept...
    assert dataclasses.replace(cfg, activation="swiglu", d_ff=None).d_ff == int(8 * 128 / 3)  # ...unless reset
    assert GPTConfig(vocab_size=17, block_size=24, activation="swiglu").d_ff == int(8 * 128 / 3)
    bad = {
        "d_ff": -5,
        "vocab_size": True,
        "n_layers": 0,
        "dropout": 1.5,
        "rope_base": float("nan"),
        "norm_eps": -1.0,
        "bias": "yes",
        "n_kv_heads": 0,
    }
    for field, value in bad.items():
        with pytest.raises(ValueError, match=f"GPTConfig.{field}"):
            GPTConfig(**({"vocab_size": 17, "block_size": 24} | {field: value}))
    with pytest.raises(TypeError, match="GPT expects a GPTConfig, got dict"):
        GPT({"vocab_size": 17})

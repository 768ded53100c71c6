"""ALiBi (Press et al. 2022): slopes, bias, attention with the bias, the GPT wiring and the KV cache."""

import math

import pytest
import torch

import transformer_lib as tl
from conftest import generate_with_logits
from transformer_lib.positional import ALiBi, alibi_bias, alibi_slopes


def test_slopes_power_of_two_by_hand():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([1 / 2**h for h in range(1, 9)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([1 / 4, 1 / 16, 1 / 64, 1 / 256]))
    torch.testing.assert_close(alibi_slopes(1), torch.tensor([1 / 256]))


def test_slopes_not_a_power_of_two_follow_the_paper():
    # n = 6: the 4 slopes of n' = 4, then every other slope of the 8-head sequence (1/2, 1/8, ...), the first 2.
    expected = [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    torch.testing.assert_close(alibi_slopes(6), torch.tensor(expected))
    # n = 12: the 8 slopes 2^-1 .. 2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 from the 16-head sequence.
    expected = [2.0**-h for h in range(1, 9)] + [2.0 ** -(h + 0.5) for h in range(4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected))


def test_bias_matrix_by_hand():
    slopes = torch.tensor([0.5, 0.25])
    bias = alibi_bias(slopes, 3, 3)  # (2, 3, 3)
    distance = torch.tensor([[0.0, -1, -2], [1, 0, -1], [2, 1, 0]])  # i - j
    torch.testing.assert_close(bias, torch.stack([-0.5 * distance, -0.25 * distance]))
    # one new query after 4 cached keys: it sits at position 4, distances 4, 3, 2, 1, 0
    torch.testing.assert_close(alibi_bias(slopes, 1, 5, offset=4)[0, 0], torch.tensor([-2.0, -1.5, -1.0, -0.5, 0.0]))
    torch.testing.assert_close(ALiBi(2)(3, 3), alibi_bias(alibi_slopes(2), 3, 3))


def _mha_by_hand(mha: tl.MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """Explicit softmax(q k^T / sqrt(d_head) + bias) v with a causal mask, from the module's own weights."""
    B, T, _ = x.shape
    H, d = mha.n_heads, mha.d_head
    q = mha.q_proj(x).view(B, T, H, d).transpose(1, 2)  # (B, H, T, d)
    k = mha.k_proj(x).view(B, T, H, d).transpose(1, 2)
    v = mha.v_proj(x).view(B, T, H, d).transpose(1, 2)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)])  # H is a power of two here
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    bias = -slopes[:, None, None] * (i - j)  # (H, T, T)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d) + bias
    scores = scores.masked_fill(j > i, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # (B, H, T, d)
    return mha.out_proj(out.transpose(1, 2).reshape(B, T, H * d))


@pytest.mark.parametrize("need_weights", [False, True])
def test_attention_with_alibi_equals_explicit_softmax(need_weights):
    torch.manual_seed(0)
    mha = tl.MultiHeadAttention(32, n_heads=4, alibi=ALiBi(4)).eval()
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        out = mha(x, is_causal=True, need_weights=need_weights)
        out = out[0] if need_weights else out
        torch.testing.assert_close(out, _mha_by_hand(mha, x), atol=1e-5, rtol=1e-5)
        plain = tl.MultiHeadAttention(32, n_heads=4).eval()
        plain.load_state_dict(mha.state_dict())  # ALiBi has no parameters: the same weights load
        assert not torch.allclose(plain(x, is_causal=True), out, atol=1e-3)  # and the bias changes the output


def test_sdpa_bias_argument():
    q, k, v = torch.randn(3, 4, 8), torch.randn(3, 5, 8), torch.randn(3, 5, 8)
    bias = torch.randn(4, 5)
    out, w = tl.scaled_dot_product_attention(q, k, v, bias=bias)
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8) + bias, dim=-1)
    torch.testing.assert_close(w, expected)
    torch.testing.assert_close(out, expected @ v)


def test_gpt_alibi_cache_equals_no_cache_and_full_forward():
    torch.manual_seed(0)
    config = tl.GPTConfig(vocab_size=20, block_size=16, n_layers=2, n_heads=4, d_model=32, positional="alibi")
    model = tl.GPT(config).eval()
    assert model.pos is None and all(block.self_attn.alibi is not None for block in model.blocks)
    prompt = torch.randint(0, 20, (2, 3))
    cached, logits_cached = generate_with_logits(model, prompt, 6, temperature=0, use_cache=True)
    plain, logits_plain = generate_with_logits(model, prompt, 6, temperature=0, use_cache=False)
    assert torch.equal(cached, plain)
    torch.testing.assert_close(logits_cached, logits_plain, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        full, _ = model(cached[:, :-1])  # every position at once, the fused path
    torch.testing.assert_close(full[:, 2:], logits_cached, atol=1e-5, rtol=1e-5)


def test_gpt_alibi_left_padding_matches_unpadded():
    torch.manual_seed(0)
    config = tl.GPTConfig(vocab_size=20, block_size=16, n_layers=2, n_heads=4, d_model=32, positional="alibi")
    model = tl.GPT(config).eval()
    ids = torch.randint(0, 20, (1, 5))
    padded = torch.cat([torch.zeros(1, 2, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        torch.testing.assert_close(model(padded, attention_mask=mask)[0][:, 2:], model(ids)[0], atol=1e-5, rtol=1e-5)


def test_fully_masked_rows_give_zeros_not_nan():
    torch.manual_seed(0)
    mha = tl.MultiHeadAttention(16, n_heads=2, alibi=ALiBi(2)).eval()
    x = torch.randn(2, 4, 16)
    key_padding = torch.tensor([[True, True, True, True], [False, False, True, True]])
    with torch.no_grad():
        for need_weights in (False, True):
            out = mha(x, is_causal=True, key_padding_mask=key_padding, need_weights=need_weights)
            out = out[0] if need_weights else out
            assert not out.isnan().any()
            # rows 0 and 1 of example 1 see only padding: the attention output is 0, so the block returns the bias
            torch.testing.assert_close(out[1, :2], mha.out_proj.bias.expand(2, 16))


def test_errors():
    with pytest.raises(ValueError, match="n_heads must be a positive int, got 0"):
        alibi_slopes(0)
    with pytest.raises(ValueError, match="n_heads must be a positive int, got 4.0"):
        alibi_slopes(4.0)
    with pytest.raises(TypeError, match="slopes must be a torch.Tensor, got list"):
        alibi_bias([0.5], 3, 3)
    with pytest.raises(ValueError, match=r"slopes must have rank 1, .* shape \(1, 1\)"):
        alibi_bias(torch.tensor([[0.5]]), 3, 3)
    with pytest.raises(ValueError, match="T_q must be a positive int, got 0"):
        alibi_bias(torch.tensor([0.5]), 0, 3)
    with pytest.raises(ValueError, match="offset must be an int >= 0, got -1"):
        alibi_bias(torch.tensor([0.5]), 2, 3, offset=-1)
    with pytest.raises(ValueError, match="T_q must be a positive int, got 2.0"):
        alibi_bias(torch.tensor([0.5]), 2.0, 3)
    mha = tl.MultiHeadAttention(16, n_heads=2, alibi=ALiBi(2))
    with pytest.raises(ValueError, match="causal"):
        mha(torch.randn(1, 3, 16))  # ALiBi without the causal mask
    with pytest.raises(ValueError):
        tl.GPTConfig(vocab_size=10, block_size=8, positional="alibi ")


def test_alibi_runs_under_bf16_autocast():
    torch.manual_seed(0)
    config = tl.GPTConfig(vocab_size=20, block_size=16, n_layers=1, n_heads=4, d_model=32, positional="alibi")
    model = tl.GPT(config).eval()
    ids = torch.randint(0, 20, (2, 8))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fused, _ = model(ids)  # the fused path: a float32 bias next to bf16 queries
        maps = model.attention_maps(ids)  # the explicit path
    reference, _ = model(ids)
    assert fused.dtype == torch.float32 and not fused.isnan().any()
    torch.testing.assert_close(fused, reference, atol=0.1, rtol=0.05)
    assert torch.allclose(maps[0].float().sum(-1), torch.ones(2, 4, 8), atol=1e-2)

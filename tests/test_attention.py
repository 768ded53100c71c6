import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib import KVCache, MultiHeadAttention, causal_mask, padding_mask, scaled_dot_product_attention
from transformer_lib.interop import copy_from_torch


def qkv(B=2, H=3, T_q=5, T_k=7, d=8, dtype=torch.float32):
    return (
        torch.randn(B, H, T_q, d, dtype=dtype),
        torch.randn(B, H, T_k, d, dtype=dtype),
        torch.randn(B, H, T_k, d, dtype=dtype),
    )


@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding", "random"])
def test_explicit_attention_equals_pytorch(mask_kind):
    q, k, v = qkv(T_q=6, T_k=6)
    mask = {
        "none": None,
        "causal": causal_mask(6),
        "padding": padding_mask(torch.tensor([[1, 2, 3, 4, 0, 0], [1, 2, 3, 4, 5, 6]]), 0),
        "random": torch.rand(2, 3, 6, 6) > 0.3,
    }[mask_kind]
    if mask is not None and mask_kind == "random":
        mask[..., 0] = True  # keep every row attending somewhere; fully masked rows are tested separately
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 6))
    assert (w >= 0).all()
    if mask is not None:
        assert (w.masked_select(~mask.expand_as(w)) == 0).all()


def test_scale_is_one_over_sqrt_dk_and_can_be_overridden():
    q, k, v = qkv(d=16)
    _, w = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(w, torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1))
    _, w1 = scaled_dot_product_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(w1, torch.softmax(q @ k.transpose(-2, -1), dim=-1))


def test_fully_masked_row_gives_zeros_not_nan_in_both_paths():
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 4, 16)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False  # query 2 may attend to nothing
    q, k, v = qkv(T_q=4, T_k=4)
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert not out.isnan().any() and not w.isnan().any()
    assert (out[..., 2, :] == 0).all() and (w[..., 2, :] == 0).all()
    fast = mha(x, x, x, mask=mask)
    slow, weights = mha(x, x, x, mask=mask, need_weights=True)
    assert not fast.isnan().any()
    torch.testing.assert_close(fast, slow)
    assert (weights[:, :, 2] == 0).all()
    # Gradients stay finite too.
    x.requires_grad_(True)
    mha(x, x, x, mask=mask).sum().backward()
    assert torch.isfinite(x.grad).all()


def test_gradcheck_float64():
    q, k, v = (t.requires_grad_(True) for t in qkv(B=1, H=2, T_q=3, T_k=4, d=5, dtype=torch.float64))
    mask = torch.tensor([[True, True, False, True], [True, False, False, False], [False, False, False, False]])
    assert torch.autograd.gradcheck(lambda a, b, c: scaled_dot_product_attention(a, b, c, mask=mask)[0], (q, k, v))


@pytest.mark.parametrize("bias", [True, False])
def test_mha_equals_torch_self_and_cross(bias):
    d, h = 32, 4
    ours, theirs = (
        MultiHeadAttention(d, h, bias=bias).eval(),
        nn.MultiheadAttention(d, h, bias=bias, batch_first=True).eval(),
    )
    copy_from_torch(ours, theirs)
    x, mem = torch.randn(3, 5, d), torch.randn(3, 9, d)  # different lengths catch T_q/T_k mix-ups
    torch.testing.assert_close(ours(x, x, x), theirs(x, x, x, need_weights=False)[0])
    out, w = ours(x, mem, mem, need_weights=True)
    ref_out, ref_w = theirs(x, mem, mem, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)
    # causal mask: PyTorch's bool mask means "blocked", ours "may attend"
    cm = causal_mask(5)
    torch.testing.assert_close(ours(x, x, x, mask=cm), theirs(x, x, x, attn_mask=~cm, need_weights=False)[0])
    torch.testing.assert_close(ours(x, x, x, is_causal=True), ours(x, x, x, mask=cm, need_weights=True)[0])
    # key padding
    src = torch.tensor([[4, 5, 6, 0, 0, 0, 0, 0, 0], [4, 5, 6, 7, 8, 9, 1, 2, 3], [1, 0, 0, 0, 0, 0, 0, 0, 0]])
    pm = padding_mask(src, 0)
    torch.testing.assert_close(
        ours(x, mem, mem, mask=pm), theirs(x, mem, mem, key_padding_mask=(src == 0), need_weights=False)[0]
    )


def test_fast_path_equals_explicit_path_with_masks():
    mha = MultiHeadAttention(24, 3).eval()
    x = torch.randn(2, 6, 24)
    for mask in (None, causal_mask(6), padding_mask(torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]]), 0)):
        torch.testing.assert_close(mha(x, x, x, mask=mask), mha(x, x, x, mask=mask, need_weights=True)[0])


def test_split_heads_keeps_examples_apart():
    # The classic bug is .view(n_heads, -1, d_head) that mixes the batch into the heads.
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(3, 4, 8)
    heads = mha.split_heads(x)
    assert heads.shape == (3, 2, 4, 4)
    torch.testing.assert_close(heads[1, 1], x[1, :, 4:])
    torch.testing.assert_close(mha.merge_heads(heads), x)


def test_batch_items_are_independent():
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(3, 5, 16)
    full = mha(x, x, x)
    torch.testing.assert_close(full[1:2], mha(x[1:2], x[1:2], x[1:2]))


def test_incremental_decoding_with_cache_equals_full_causal():
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 7, 16)
    full = mha(x, is_causal=True)
    cache = KVCache()
    steps = [mha(x[:, :3], is_causal=True, cache=cache)]  # prefill 3 tokens
    for t in range(3, 7):
        steps.append(mha(x[:, t : t + 1], is_causal=True, cache=cache))
    assert len(cache) == 7
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_static_cache_reuses_memory_projection():
    mha = MultiHeadAttention(16, 4).eval()
    x, mem = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    cache = KVCache(static=True)
    first = mha(x[:, :1], mem, mem, cache=cache)
    k_before = cache.k
    second = mha(x[:, 1:2], mem, mem, cache=cache)
    assert cache.k is k_before  # not recomputed
    torch.testing.assert_close(torch.cat([first, second], 1), mha(x[:, :2], mem, mem))


def test_dropout_only_in_training():
    mha = MultiHeadAttention(16, 2, dropout=0.5)
    x = torch.randn(2, 5, 16)
    mha.eval()
    torch.testing.assert_close(mha(x), mha(x))
    mha.train()
    assert not torch.allclose(mha(x), mha(x))


@pytest.mark.parametrize("d_k", [16, 64, 256])
def test_one_over_sqrt_dk_brings_the_score_variance_from_dk_to_one(d_k):
    # Chapter 1's reason for the scale: for q and k with unit-variance entries, q.k has variance d_k,
    # and scaled_dot_product_attention's 1/sqrt(d_k) brings its scores back to variance about 1.
    # Measured on the library's own weights: log(softmax(s)) = s - logsumexp(s) differs from the
    # scores s by one constant per query, so each row of log(weights) has the variance of the scores.
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 2000, d_k, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 500, d_k, generator=g, dtype=torch.float64)
    v = torch.zeros(1, 1, 500, 1, dtype=torch.float64)

    def score_variance(**kw):
        _, w = scaled_dot_product_attention(q, k, v, **kw)
        assert w.min() > 0  # float64: no weight underflows, so the logs are exact
        return w.log().var(dim=-1).mean().item()

    assert math.isclose(score_variance(scale=1.0), d_k, rel_tol=0.1)  # the raw dot products
    assert math.isclose(score_variance(), 1.0, rel_tol=0.1)  # the default scale: a missing one gives d_k


def test_cpu_autocast_runs_attention_in_fp32(monkeypatch):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4)
    x = torch.randn(2, 10, 32)
    expected = mha(x, is_causal=True)
    dtypes = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda q, k, v, **kw: dtypes.append(q.dtype) or real(q, k, v, **kw)
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mha(x, is_causal=True)
        masked = mha(x, mask=torch.ones(10, 10, dtype=torch.bool).tril())
    assert dtypes == [torch.float32, torch.float32]  # the projections were bf16, the attention core fp32
    assert out.dtype == masked.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(masked.float(), expected, atol=2e-2, rtol=2e-2)


def test_a_padding_mask_passed_as_mask_is_refused_with_a_pointer_to_key_padding_mask():
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(3, 5, 8)
    real = torch.ones(3, 5, dtype=torch.bool)
    real[0, -2:] = False  # example 0 ends with two pads
    with pytest.raises(ValueError, match=r"\(B, T_k\): a 2-D mask means \(T_q, T_k\) = \(5, 5\).*key_padding_mask="):
        mha(x, mask=real)
    _, w = mha(x, key_padding_mask=real, need_weights=True)
    assert (w[0, ..., -2:] == 0).all() and (w[1:] > 0).all()


def test_a_2d_mask_means_T_q_by_T_k_even_when_B_equals_T_q():
    """Review F15: with B == T_q a (B, T_k) padding mask has the shape of a (T_q, T_k) mask, and is read as one."""
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 2, 8)
    m = torch.tensor([[True, False], [True, True]])
    _, w = mha(x, mask=m, need_weights=True)
    assert (w[..., 0, 1] == 0).all() and (w[..., 1, 1] > 0).all()  # row i of m is query i, in both examples
    _, w = mha(x, key_padding_mask=m, need_weights=True)
    assert (w[0, ..., 1] == 0).all() and (w[1] > 0).all()  # row b of m is example b

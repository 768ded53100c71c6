"""The checkers accept right answers and name the classic bugs in wrong ones, without crashing."""

import math

import pytest
import torch

from transformer_lib import exercises as ex


def good_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return w @ v, w


@pytest.mark.filterwarnings("ignore:The use of `x.T`")
def test_attention_checker(capsys):
    assert ex.check_attention(good_attention).passed
    assert "All 5 checks passed" in capsys.readouterr().out

    def no_scale(q, k, v, mask=None):
        w = torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf")) if mask is not None
                          else q @ k.transpose(-2, -1), dim=-1)
        return w @ v, w

    def wrong_axis(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        w = torch.softmax(s if mask is None else s.masked_fill(~mask, float("-inf")), dim=-2)
        return w @ v, w

    def inverted(q, k, v, mask=None):
        return good_attention(q, k, v, None if mask is None else ~mask)

    def uses_dot_T(q, k, v, mask=None):
        w = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)
        return w @ v, w

    for wrong, words in ((no_scale, "sqrt(d_k)"), (wrong_axis, "dim=-1"), (inverted, "polarity is inverted"),
                         (uses_dot_T, "k.transpose(-2, -1)")):
        result = ex.check_attention(wrong)
        assert not result.passed
        assert words in result.text, (wrong.__name__, result.text)
    assert not ex.check_attention(lambda q, k, v, mask=None: None).passed
    assert not ex.check_attention("not a function").passed


def test_softmax_checker():
    def stable(x, t):
        z = x / t
        z = z - z.max(-1, keepdim=True).values
        return z.exp() / z.exp().sum(-1, keepdim=True)

    def naive(x, t):
        return (x / t).exp() / (x / t).exp().sum(-1, keepdim=True)

    assert ex.check_softmax(stable).passed
    result = ex.check_softmax(naive)
    assert not result.passed and "subtract the row's maximum" in result.text
    assert "multiply" in ex.check_softmax(lambda x, t: stable(x * t, 1.0)).text


def test_mask_checkers():
    assert ex.check_causal_mask(lambda T: torch.tril(torch.ones(T, T, dtype=torch.bool))).passed
    upper = ex.check_causal_mask(lambda T: torch.triu(torch.ones(T, T, dtype=torch.bool)))
    assert not upper.passed and "see the future" in upper.text
    strict = ex.check_causal_mask(lambda T: torch.tril(torch.ones(T, T, dtype=torch.bool), -1))
    assert "diagonal is missing" in strict.text
    assert "boolean" in ex.check_causal_mask(lambda T: torch.tril(torch.ones(T, T))).text
    assert ex.check_padding_mask(lambda t, p: (t != p)[:, None, None, :]).passed
    assert "polarity is inverted" in ex.check_padding_mask(lambda t, p: (t == p)[:, None, None, :]).text
    assert "does not broadcast" in ex.check_padding_mask(lambda t, p: t != p).text


def test_split_heads_checker_catches_batch_mixing():
    def good(x, n_heads):
        B, T, d = x.shape
        return x.view(B, T, n_heads, d // n_heads).transpose(1, 2)

    def seq_first(x, n_heads):
        B, T, d = x.shape
        return x.reshape(T, B * n_heads, d // n_heads).transpose(0, 1).reshape(B, n_heads, T, d // n_heads)

    assert ex.check_split_heads(good).passed
    result = ex.check_split_heads(seq_first)
    assert not result.passed
    assert "✅ B=1" in result.text  # right for a batch of one ...
    assert "batch axis got mixed" in result.text  # ... and named when B > 1


def test_multi_head_attention_checker():
    def good(mha, query, key, value):
        B, T_q, d = query.shape
        T_k, h = key.shape[1], mha.n_heads
        q = mha.q_proj(query).view(B, T_q, h, d // h).transpose(1, 2)
        k = mha.k_proj(key).view(B, T_k, h, d // h).transpose(1, 2)
        v = mha.v_proj(value).view(B, T_k, h, d // h).transpose(1, 2)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h), dim=-1)
        return mha.out_proj((w @ v).transpose(1, 2).reshape(B, T_q, d))

    def query_length_bug(mha, query, key, value):
        B, T, d = query.shape  # the classic: T taken from the query, used for keys and values too
        h = mha.n_heads
        q = mha.q_proj(query).view(B, T, h, d // h).transpose(1, 2)
        k = mha.k_proj(key).view(B, T, h, d // h).transpose(1, 2)
        v = mha.v_proj(value).view(B, T, h, d // h).transpose(1, 2)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h), dim=-1)
        return mha.out_proj((w @ v).transpose(1, 2).reshape(B, T, d))

    before = torch.get_rng_state()
    assert ex.check_multi_head_attention(good).passed
    assert torch.equal(before, torch.get_rng_state())  # the checker leaves the reader's RNG alone
    result = ex.check_multi_head_attention(query_length_bug)
    assert not result.passed and "more keys than queries" in result.text
    assert result.text.count("✅") == 2  # self-attention cases pass


def test_layer_norm_checker():
    def good(x, w, b, eps=1e-5):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + eps) * w + b

    def unbiased(x, w, b, eps=1e-5):
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + eps) * w + b

    def eps_outside(x, w, b, eps=1e-5):
        return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True, unbiased=False) + eps) * w + b

    def annotated_transformer(x, w, b, eps=1e-5):  # torch.std (unbiased) + eps outside the root
        return w * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + eps) + b

    assert ex.check_layer_norm(good).passed
    assert "unbiased variance" in ex.check_layer_norm(unbiased).text
    assert "inside the square root" in ex.check_layer_norm(eps_outside).text
    assert "two classic bugs" in ex.check_layer_norm(annotated_transformer).text
    assert "weight and bias" in ex.check_layer_norm(lambda x, w, b, eps=1e-5: good(x, 1, 0, eps)).text

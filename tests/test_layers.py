import pytest
import torch
from torch import nn

from transformer_lib import (
    ALiBi,
    DecoderLayer,
    DecoderOnlyLayer,
    EncoderLayer,
    FeedForward,
    KVCache,
    RotaryEmbedding,
    causal_mask,
    padding_mask,
)
from transformer_lib.interop import copy_from_torch

D, H, FF = 32, 4, 64


def randomize(module: nn.Module) -> nn.Module:
    with torch.no_grad():  # norms start at weight 1, bias 0: make them non-trivial so a mix-up shows
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return module


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_equals_torch(norm_first, activation):
    theirs = randomize(
        nn.TransformerEncoderLayer(
            D, H, FF, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
        )
    ).eval()
    ours = copy_from_torch(EncoderLayer(D, H, FF, activation=activation, norm_first=norm_first), theirs).eval()
    x = torch.randn(3, 6, D)
    torch.testing.assert_close(ours(x), theirs(x))
    cm = causal_mask(6)
    torch.testing.assert_close(ours(x, mask=cm), theirs(x, src_mask=~cm))
    src = torch.tensor([[1, 2, 3, 0, 0, 0], [1, 2, 3, 4, 5, 6], [1, 2, 0, 0, 0, 0]])
    torch.testing.assert_close(ours(x, mask=padding_mask(src, 0)), theirs(x, src_key_padding_mask=src == 0))
    out, w = ours(x, mask=cm, need_weights=True)
    torch.testing.assert_close(out, ours(x, mask=cm))
    assert w.shape == (3, H, 6, 6) and (w.triu(1) == 0).all()


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_torch(norm_first):
    theirs = randomize(
        nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    ).eval()
    ours = copy_from_torch(DecoderLayer(D, H, FF, norm_first=norm_first), theirs).eval()
    x, memory = torch.randn(2, 5, D), torch.randn(2, 8, D)  # T != S catches cross-attention reshape bugs
    src = torch.tensor([[1, 2, 3, 4, 5, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 8]])
    cm = causal_mask(5)
    expected = theirs(x, memory, tgt_mask=~cm, memory_key_padding_mask=src == 0)
    torch.testing.assert_close(ours(x, memory, tgt_mask=cm, memory_mask=padding_mask(src, 0)), expected)
    torch.testing.assert_close(ours(x, memory, tgt_is_causal=True, memory_mask=padding_mask(src, 0)), expected)
    out, self_w, cross_w = ours(x, memory, tgt_mask=cm, memory_mask=padding_mask(src, 0), need_weights=True)
    torch.testing.assert_close(out, expected)
    assert self_w.shape == (2, H, 5, 5) and cross_w.shape == (2, H, 5, 8)
    assert (cross_w[0, :, :, 5:] == 0).all()  # padded source positions get no attention


def test_decoder_layer_has_no_causal_leak():
    layer = DecoderLayer(D, H, FF).eval()
    x, memory = torch.randn(1, 6, D), torch.randn(1, 4, D)
    changed = x.clone()
    changed[:, 4:] = torch.randn(1, 2, D)
    a = layer(x, memory, tgt_is_causal=True)
    b = layer(changed, memory, tgt_is_causal=True)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_decoder_layer_incremental_equals_full():
    layer = DecoderLayer(D, H, FF, norm_first=True).eval()
    x, memory = torch.randn(2, 5, D), torch.randn(2, 7, D)
    full = layer(x, memory, tgt_is_causal=True)
    self_cache, cross_cache = KVCache(), KVCache(static=True)
    steps = [
        layer(x[:, t : t + 1], memory, tgt_is_causal=True, self_cache=self_cache, cross_cache=cross_cache)
        for t in range(5)
    ]
    torch.testing.assert_close(torch.cat(steps, 1), full)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu"])
def test_feedforward_shapes_and_swiglu(activation):
    ff = FeedForward(D, FF, activation=activation)
    x = torch.randn(2, 3, D)
    assert ff(x).shape == x.shape
    if activation == "swiglu":
        assert ff.linear1.out_features == 2 * FF
        gate, value = ff.linear1(x).chunk(2, -1)
        torch.testing.assert_close(ff(x), ff.linear2(torch.nn.functional.silu(gate) * value))


def test_residual_gives_identity_gradient_path():
    # With the sublayers' outputs zeroed, a Pre-LN layer is the identity: d out / d x = I.
    layer = EncoderLayer(D, H, FF, norm_first=True)
    with torch.no_grad():
        layer.self_attn.out_proj.weight.zero_()
        layer.self_attn.out_proj.bias.zero_()
        layer.ff.linear2.weight.zero_()
        layer.ff.linear2.bias.zero_()
    x = torch.randn(1, 3, D, requires_grad=True)
    torch.testing.assert_close(layer(x), x)
    (g,) = torch.autograd.grad(layer(x).sum(), x)
    torch.testing.assert_close(g, torch.ones_like(x))


@pytest.mark.parametrize("norm_first", [False, True])
def test_layers_without_bias_equal_torch(norm_first):
    theirs = randomize(
        nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first, bias=False)
    ).eval()
    ours = copy_from_torch(EncoderLayer(D, H, FF, norm_first=norm_first, bias=False), theirs).eval()
    assert ours.norm1.bias is None and ours.ff.linear1.bias is None
    x = torch.randn(2, 5, D)
    torch.testing.assert_close(ours(x), theirs(x))


def test_the_positional_scheme_is_chosen_when_the_layer_is_built():
    torch.manual_seed(0)
    x = torch.randn(2, 6, D)
    alibi = randomize(DecoderOnlyLayer(D, H, FF, alibi=ALiBi(H))).eval()
    rope = DecoderOnlyLayer(D, H, FF, rotary=RotaryEmbedding(D // H, 16)).eval()
    plain = DecoderOnlyLayer(D, H, FF).eval()
    assert isinstance(alibi.self_attn.alibi, ALiBi) and alibi.state_dict().keys() == plain.state_dict().keys()
    for layer in (rope, plain):
        layer.load_state_dict(alibi.state_dict())
    outs = [alibi(x), rope(x), plain(x)]
    assert not torch.allclose(outs[0], outs[2]) and not torch.allclose(outs[1], outs[2])
    plain.self_attn.alibi = ALiBi(H)  # the old way, attached after construction: the same numbers
    torch.testing.assert_close(plain(x), outs[0])

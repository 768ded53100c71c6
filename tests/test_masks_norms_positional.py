import math

import pytest
import torch
from torch import nn

from transformer_lib import (
    LayerNorm,
    MultiHeadAttention,
    RMSNorm,
    RotaryEmbedding,
    causal_mask,
    combine_masks,
    padding_mask,
    prefix_lm_mask,
    sinusoidal_encoding,
)
from transformer_lib.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

# ---------------------------------------------------------------- masks


def test_causal_mask_is_lower_triangular_and_bottom_right_aligned():
    assert torch.equal(causal_mask(4), torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    m = causal_mask(2, 5)  # two new queries after three cached positions
    assert torch.equal(m, torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool))


def test_padding_mask_shape_and_polarity():
    m = padding_mask(torch.tensor([[5, 6, 0], [7, 0, 0]]), pad_id=0)
    assert m.shape == (2, 1, 1, 3) and m.dtype == torch.bool
    assert m[0, 0, 0].tolist() == [True, True, False] and m[1, 0, 0].tolist() == [True, False, False]


def test_prefix_lm_mask():
    m = prefix_lm_mask(5, 2)
    assert m[0].tolist() == [True, True, False, False, False]  # prefix sees the whole prefix
    assert m[3].tolist() == [True, True, True, True, False]  # the rest is causal
    per_example = prefix_lm_mask(4, torch.tensor([1, 3]))
    assert per_example.shape == (2, 1, 4, 4)
    assert torch.equal(per_example[0, 0], prefix_lm_mask(4, 1)) and torch.equal(per_example[1, 0], prefix_lm_mask(4, 3))


def test_combine_masks_is_and_with_broadcasting():
    pad = padding_mask(torch.tensor([[1, 1, 0]]), 0)
    both = combine_masks(causal_mask(3), pad, None)
    assert both.shape == (1, 1, 3, 3)
    assert both[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert combine_masks(None) is None


# ---------------------------------------------------------------- norms


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_equals_torch(bias):
    ours, theirs = LayerNorm(12, eps=1e-5, bias=bias), nn.LayerNorm(12, eps=1e-5, bias=bias)
    with torch.no_grad():
        theirs.weight.normal_()
        if bias:
            theirs.bias.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 5, 12) * 4 + 2
    torch.testing.assert_close(ours(x), theirs(x))
    x.requires_grad_(True)
    (g1,) = torch.autograd.grad(ours(x).square().sum(), x)
    (g2,) = torch.autograd.grad(theirs(x).square().sum(), x)
    torch.testing.assert_close(g1, g2)


def test_layernorm_uses_biased_variance_and_eps_inside_sqrt():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    y = LayerNorm(4, eps=0.5)(x)
    expected = (x - 2.5) / math.sqrt(1.25 + 0.5)  # biased variance of 1..4 is 1.25
    torch.testing.assert_close(y, expected)


def test_rmsnorm_equals_torch():
    ours, theirs = RMSNorm(10, eps=1e-6), nn.RMSNorm(10, eps=1e-6)
    with torch.no_grad():
        theirs.weight.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(4, 3, 10) * 3 + 1
    torch.testing.assert_close(ours(x), theirs(x))


def test_norms_act_on_each_position_alone():
    x = torch.randn(2, 6, 8)
    for norm in (LayerNorm(8), RMSNorm(8)):
        torch.testing.assert_close(norm(x)[1, 3], norm(x[1:2, 3:4])[0, 0])


# ---------------------------------------------------------------- positions


def test_sinusoidal_formula_sin_even_cos_odd():
    pe = sinusoidal_encoding(50, 16)
    assert pe.shape == (50, 16)
    pos, i = 7, 3
    angle = pos / 10000 ** (2 * i / 16)
    assert math.isclose(pe[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
    assert math.isclose(pe[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)
    assert sinusoidal_encoding(3, 5).shape == (3, 5)  # odd d_model works


def test_sinusoidal_relative_offset_property():
    pe = sinusoidal_encoding(200, 32).double()
    dots_from_10 = pe[10] @ pe[10:60].T
    dots_from_100 = pe[100] @ pe[100:150].T
    torch.testing.assert_close(dots_from_10, dots_from_100)  # depends on the offset only


def test_positional_modules_add_and_respect_offset():
    x = torch.zeros(2, 4, 8)
    sin = SinusoidalPositionalEncoding(8, max_len=10)
    torch.testing.assert_close(sin(x, offset=3)[0], sinusoidal_encoding(10, 8)[3:7])
    learned = LearnedPositionalEmbedding(8, 10)
    torch.testing.assert_close(learned(x)[1], learned.weight[:4])
    with pytest.raises(ValueError, match="max_len=10"):
        sin(torch.zeros(1, 11, 8))


def test_rope_scores_depend_only_on_offset():
    rope = RotaryEmbedding(16, max_len=64)
    q, k = torch.randn(16), torch.randn(16)

    def score(m, n):
        qm = rope(q.expand(1, 1, m + 1, 16).clone())[0, 0, m]
        kn = rope(k.expand(1, 1, n + 1, 16).clone())[0, 0, n]
        return (qm @ kn).item()

    assert math.isclose(score(5, 2), score(40, 37), rel_tol=1e-4)
    assert math.isclose(score(3, 10), score(20, 27), rel_tol=1e-4)
    assert not math.isclose(score(5, 2), score(5, 4), rel_tol=1e-3)


def test_rope_equals_complex_multiplication_and_preserves_norm():
    rope = RotaryEmbedding(8, max_len=20, base=100.0)
    x = torch.randn(2, 3, 20, 8)
    y = rope(x)
    xc = torch.view_as_complex(x.reshape(2, 3, 20, 4, 2))
    theta = torch.arange(20)[:, None] * 100.0 ** (-torch.arange(0, 8, 2) / 8)  # (20, 4)
    ref = torch.view_as_real(xc * torch.polar(torch.ones_like(theta), theta)).flatten(-2)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("layout", ["contiguous", "heads transposed", "positions per example"])
def test_rope_as_one_complex_product_equals_the_written_out_rotation(layout):
    """The CPU's fast path (one complex product per pair) against the four products on strided halves:
    the same outputs and gradients, for the layouts attention passes (a view of (B, T, n_heads, d_head))."""
    from transformer_lib import positional

    rope = RotaryEmbedding(16, max_len=40)
    x = torch.randn(2, 3, 24, 16)
    positions = None
    if layout == "heads transposed":
        x = torch.randn(2, 24, 3, 16).transpose(1, 2)  # (B, n_heads, T, d_head), not contiguous
    elif layout == "positions per example":
        positions = torch.tensor([list(range(5, 29)), list(range(24))])  # (B, T): e.g. left padding
    x.requires_grad_(True)
    rows = slice(3, 27) if positions is None else positions  # offset 3: after three cached positions
    cos, sin = rope.cos[rows], rope.sin[rows]
    if positions is not None:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d_head/2)
    assert positional._rotate_as_complex_here(x, cos)
    fast = positional._rotate_as_complex(x, cos, sin)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    plain = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).type_as(x)
    assert fast.dtype == plain.dtype == x.dtype and fast.shape == plain.shape
    torch.testing.assert_close(fast, plain, rtol=1e-6, atol=1e-6)
    g = torch.randn_like(plain)
    torch.testing.assert_close(torch.autograd.grad(fast, x, g)[0], torch.autograd.grad(plain, x, g)[0])
    torch.testing.assert_close(rope(x, offset=3, positions=positions), plain)


def test_rope_keeps_the_written_out_rotation_for_compilers_and_bf16(monkeypatch):
    """Compilers and exporters get real arithmetic (complex numbers are not theirs to lower everywhere)."""
    from transformer_lib import positional

    def complex_path(*args):
        raise AssertionError("the complex fast path ran while compiling")

    rope, x = RotaryEmbedding(8, max_len=10), torch.randn(1, 2, 10, 8)
    expected = rope(x)
    monkeypatch.setattr(positional, "_rotate_as_complex", complex_path)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    torch.testing.assert_close(rope(x), expected)
    monkeypatch.undo()
    assert not positional._rotate_as_complex_here(x.bfloat16(), rope.cos)  # bf16 keeps its own roundings
    assert not positional._rotate_as_complex_here(x.to("meta"), rope.cos)  # a CPU's path only


def test_self_attention_without_positions_is_permutation_equivariant():
    mha = MultiHeadAttention(16, 2).eval()
    x = torch.randn(1, 6, 16)
    perm = torch.randperm(6)
    torch.testing.assert_close(mha(x[:, perm]), mha(x)[:, perm])


@pytest.mark.parametrize("norm_cls", [LayerNorm, RMSNorm])
def test_fused_norms_equal_the_written_out_ones(norm_cls):
    written, fused = norm_cls(16), norm_cls(16, fused=True)
    with torch.no_grad():
        written.weight.normal_()
    fused.load_state_dict(written.state_dict())
    x = (torch.randn(3, 4, 16) * 3 + 1).requires_grad_(True)
    torch.testing.assert_close(fused(x), written(x))
    (g1,) = torch.autograd.grad(written(x).square().sum(), x)
    (g2,) = torch.autograd.grad(fused(x).square().sum(), x)
    torch.testing.assert_close(g1, g2)


def test_sinusoidal_refuses_a_degenerate_base_and_non_integer_sizes():
    for base in (0, -2.0, 1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"base must be a finite number > 1"):
            sinusoidal_encoding(4, 8, base=base)
    with pytest.raises(ValueError, match=r"max_len must be a positive int, got 4.5"):
        sinusoidal_encoding(4.5, 8)
    with pytest.raises(ValueError, match=r"d_model must be a positive int, got '8'"):
        sinusoidal_encoding(4, "8")
    assert torch.isfinite(sinusoidal_encoding(4, 8, base=2)).all()

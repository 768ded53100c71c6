"""int8 quantization: the per-channel rounding bound, Int8Linear equal to its dequantized F.linear, a GPT
quantized by hand and by PyTorch's dynamic int8 (logits close to fp32, a quarter of the linear bytes,
the tied head kept tied, the original untouched), and clear errors."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib import GPT, GPTConfig
from transformer_lib.quantization import (
    Int8Linear,
    dequantize,
    dynamic_int8,
    quantize_per_channel,
    quantize_weights,
    state_dict_bytes,
)

CONFIG = dict(vocab_size=65, block_size=32, n_layers=2, n_heads=4, d_model=64)
#: Relative error of the logits, ||logits_int8 - logits_fp32|| / ||logits_fp32||, on the seeded model below.
#: Measured: about 0.006 by hand (per-channel weights, fp32 activations), about 0.015 dynamic
#: (per-tensor weights, activations quantized to 8 bits too). Bounds about 3x the measurement.
HAND_TOL, DYNAMIC_TOL = 0.02, 0.05


def gpt(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**(CONFIG | kw))).eval()


def idx(B: int = 4, T: int = 32) -> torch.Tensor:
    return torch.randint(CONFIG["vocab_size"], (B, T), generator=torch.Generator().manual_seed(1))


def relative_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a - ref).norm() / ref.norm()).item()


def linear_weights(model: nn.Module, tied: bool = False) -> dict[str, torch.Tensor]:
    """The weights of the model's nn.Linear layers, the tied head excluded unless asked."""
    emb = getattr(model, "tok_emb", None)
    return {
        name: m.weight
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and (tied or emb is None or m.weight is not emb.weight)
    }


# ------------------------------------------------------------------ quantize_per_channel / dequantize


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rounding_error_is_at_most_half_a_scale_per_entry(dtype):
    g = torch.Generator().manual_seed(0)
    row_sizes = torch.logspace(-4, 2, 48, dtype=torch.float64)[:, None]  # rows of very different magnitudes
    w = (torch.randn(48, 96, generator=g, dtype=torch.float64) * row_sizes).to(dtype)
    q, scale = quantize_per_channel(w)
    assert q.dtype == torch.int8 and q.shape == w.shape
    assert scale.dtype == torch.float32 and scale.shape == (48,)
    assert int(q.abs().max()) <= 127 and (q.abs().amax(dim=1) == 127).all()  # each row uses its full range
    err = (q.double() * scale.double()[:, None] - w.double()).abs()
    bound = scale.double()[:, None] / 2
    assert (err <= bound * (1 + 1e-5)).all(), float((err / bound).max())  # float32 division may round by an ulp
    assert float((err / bound).max()) > 0.9  # the bound is tight: some entry lands near a half step
    assert torch.equal(dequantize(q, scale), q.float() * scale[:, None])


def test_an_all_zero_row_does_not_divide_by_zero():
    w = torch.randn(3, 8)
    w[1] = 0.0
    q, scale = quantize_per_channel(w)
    assert scale[1] == 0 and (q[1] == 0).all()
    deq = dequantize(q, scale)
    assert torch.isfinite(deq).all() and (deq[1] == 0).all()
    q_alone, scale_alone = quantize_per_channel(w[[0, 2]])  # the other rows are quantized as if alone
    assert torch.equal(q[[0, 2]], q_alone) and torch.equal(scale[[0, 2]], scale_alone)


def test_quantize_and_dequantize_reject_bad_inputs():
    with pytest.raises(ValueError, match=r"weight must have rank 2, got rank 3"):
        quantize_per_channel(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match=r"weight must have rank 2, got rank 1"):
        quantize_per_channel(torch.randn(4))
    with pytest.raises(TypeError, match=r"weight must be a floating-point tensor, got dtype torch.int64"):
        quantize_per_channel(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"weight must be a torch.Tensor, got list"):
        quantize_per_channel([[1.0, 2.0]])
    with pytest.raises(ValueError, match=r"finite"):
        quantize_per_channel(torch.tensor([[1.0, float("nan")]]))
    q, scale = quantize_per_channel(torch.randn(3, 4))
    with pytest.raises(TypeError, match=r"q must be an int8 tensor"):
        dequantize(q.long(), scale)
    with pytest.raises(ValueError, match=r"one entry per row of q: q has shape \(3, 4\), scale \(2,\)"):
        dequantize(q, scale[:2])


# ------------------------------------------------------------------ Int8Linear


@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_equals_f_linear_with_the_dequantized_weight(bias):
    torch.manual_seed(0)
    linear = nn.Linear(24, 40, bias=bias)
    layer = Int8Linear.from_linear(linear)
    q, scale = quantize_per_channel(linear.weight)
    assert torch.equal(layer.weight_int8, q) and torch.equal(layer.weight_scale, scale)
    x = torch.randn(2, 5, 24)
    expected = F.linear(x, dequantize(q, scale), linear.bias)
    assert torch.equal(layer(x), expected)
    assert torch.equal(layer.weight, dequantize(q, scale))
    assert 0 < (layer(x) - linear(x)).abs().max() < 0.02  # quantized: close to the float layer, not equal
    assert list(layer.parameters()) == []  # an inference layer: int8 weight, scales and bias are buffers
    assert set(layer.state_dict()) == {"weight_int8", "weight_scale"} | ({"bias"} if bias else set())
    assert layer.weight_int8.dtype == torch.int8
    assert layer.bias is None or layer.bias.data_ptr() != linear.bias.data_ptr()  # a copy, not the float layer's


def test_int8_linear_rejects_bad_inputs():
    with pytest.raises(TypeError, match=r"expects an nn.Linear, got Conv1d"):
        Int8Linear.from_linear(nn.Conv1d(3, 4, 1))
    layer = Int8Linear.from_linear(nn.Linear(8, 4))
    with pytest.raises(ValueError, match=r"x must have last dimension 8, got shape \(2, 7\)"):
        layer(torch.randn(2, 7))


# ------------------------------------------------------------------ a GPT, quantized both ways


def test_hand_int8_gpt_equals_the_gpt_with_dequantized_weights():
    """Every Linear (the fused q/k/v projection included) computes with exactly the dequantized weight."""
    model = gpt()
    quantized = quantize_weights(model)
    reference = gpt()
    with torch.no_grad():
        for w in linear_weights(reference).values():
            w.copy_(dequantize(*quantize_per_channel(w)))
        assert torch.allclose(quantized(idx())[0], reference(idx())[0], rtol=0, atol=1e-6)


def test_gpt_quantized_both_ways_gives_logits_close_to_fp32():
    model = gpt()
    with torch.no_grad():
        ref = model(idx())[0]
        hand = quantize_weights(model)(idx())[0]
        dynamic = dynamic_int8(model)(idx())[0]
    e_hand, e_dyn = relative_error(hand, ref), relative_error(dynamic, ref)
    assert 0 < e_hand < HAND_TOL, e_hand
    assert 0 < e_dyn < DYNAMIC_TOL, e_dyn
    assert (hand.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    assert (dynamic.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


@pytest.mark.parametrize("quantize", [quantize_weights, dynamic_int8])
def test_the_original_model_is_unchanged(quantize):
    model = gpt()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    types = [type(m) for m in model.modules()]
    quantized = quantize(model)
    assert quantized is not model
    assert [type(m) for m in model.modules()] == types
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert model.lm_head.weight is model.tok_emb.weight
    assert not any(isinstance(m, Int8Linear) for m in model.modules())


@pytest.mark.parametrize("quantize", [quantize_weights, dynamic_int8])
def test_the_tied_head_stays_a_tied_float_linear(quantize):
    """An int8 head next to the fp32 embedding would add bytes, not save them: a tied Linear is kept, still tied."""
    quantized = quantize(gpt())
    assert type(quantized.lm_head) is nn.Linear
    assert quantized.lm_head.weight is quantized.tok_emb.weight
    assert type(quantized.blocks[0].ff.linear1) is not nn.Linear
    untied = quantize(gpt(tie_weights=False))
    assert type(untied.lm_head) is not nn.Linear  # an untied head is quantized like any Linear


def test_hand_int8_state_is_a_quarter_of_the_linear_weights_plus_the_scales():
    model = gpt()
    quantized = quantize_weights(model)
    weights = linear_weights(model)
    fp32_bytes = sum(4 * w.numel() for w in weights.values())
    int8_bytes = sum(w.numel() + 4 * w.shape[0] for w in weights.values())  # int8 entries + a float32 scale a row
    assert state_dict_bytes(quantized) == state_dict_bytes(model) - fp32_bytes + int8_bytes
    assert 0.25 < int8_bytes / fp32_bytes < 0.27


def test_dynamic_int8_state_is_about_a_quarter_of_the_linear_weights():
    model = gpt()
    fp32_bytes = sum(4 * w.numel() for w in linear_weights(model).values())
    saved = state_dict_bytes(model) - state_dict_bytes(dynamic_int8(model))
    assert 0.74 < saved / fp32_bytes <= 0.75  # 3 of every 4 bytes, less a per-tensor scale and zero point


def test_state_dict_bytes_counts_tied_weights_once():
    tied, untied = gpt(), gpt(tie_weights=False)
    V, d = CONFIG["vocab_size"], CONFIG["d_model"]
    assert state_dict_bytes(untied) - state_dict_bytes(tied) == V * d * 4
    assert state_dict_bytes(tied) == sum(p.numel() * 4 for p in tied.parameters())  # no buffers in the state
    assert state_dict_bytes(nn.Linear(3, 2, bias=False).to(torch.bfloat16)) == 12


def test_dynamic_int8_gpt_decodes_the_same_with_and_without_the_kv_cache():
    """The copy's attention calls the quantized q/k/v projections one by one, cached or not."""
    model = dynamic_int8(gpt())
    prompt = idx(2, 5)
    cached = model.generate(prompt, 8, temperature=0, use_cache=True)
    uncached = model.generate(prompt, 8, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)


def test_dynamic_int8_emits_no_deprecation_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = dynamic_int8(gpt())
        model(idx())
        state_dict_bytes(model)
    assert [str(w.message)[:80] for w in caught] == []


# ------------------------------------------------------------------ skip and bad models


@pytest.mark.parametrize("quantize", [quantize_weights, dynamic_int8])
def test_skip_keeps_the_named_linears_in_floating_point(quantize):
    quantized = quantize(gpt(), skip="blocks.1.ff.linear2")
    assert type(quantized.blocks[1].ff.linear2) is nn.Linear
    assert type(quantized.blocks[0].ff.linear2) is not nn.Linear
    quantized = quantize(gpt(), skip=["blocks.0.ff.linear1", "blocks.1.self_attn.q_proj"])
    assert type(quantized.blocks[0].ff.linear1) is nn.Linear and type(quantized.blocks[1].self_attn.q_proj) is nn.Linear
    with pytest.raises(ValueError, match=r"not nn.Linear layers of the model: \['blocks.0.ff'\]"):
        quantize(gpt(), skip=["blocks.0.ff"])
    with pytest.raises(TypeError, match=r"skip must be a module name or an iterable of names, got int"):
        quantize(gpt(), skip=3)


@pytest.mark.parametrize("quantize", [quantize_weights, dynamic_int8])
def test_models_without_a_linear_to_quantize_are_rejected(quantize):
    with pytest.raises(ValueError, match=r"model has no nn.Linear layer to quantize"):
        quantize(nn.Sequential(nn.ReLU(), nn.LayerNorm(4)))
    with pytest.raises(ValueError, match=r"skipped: \['0'\]"):
        quantize(nn.Sequential(nn.Linear(4, 4)), skip="0")
    emb, head = nn.Embedding(5, 4), nn.Linear(4, 5, bias=False)
    head.weight = emb.weight
    with pytest.raises(ValueError, match=r"tied: \['1'\]"):
        quantize(nn.Sequential(emb, head))
    with pytest.raises(TypeError, match=r"model must be an nn.Module, got dict"):
        quantize({"weight": torch.zeros(2, 2)})


def test_dynamic_int8_wants_float32_weights():
    with pytest.raises(TypeError, match=r"expects float32 weights, 0.weight is torch.bfloat16"):
        dynamic_int8(nn.Sequential(nn.Linear(4, 4)).to(torch.bfloat16))

"""Training memory measured from the tensors, and activation checkpointing: same numbers, fewer saved bytes."""

from __future__ import annotations

import pytest
import torch

from transformer_lib import GPT, GPTConfig
from transformer_lib.memory import (
    adamw_bytes_per_parameter,
    saved_activation_bytes,
    state_bytes,
    tensor_bytes,
)
from transformer_lib.training import make_optimizer

CONFIG = GPTConfig(vocab_size=65, block_size=32, n_layers=4, n_heads=4, d_model=64, dropout=0.0)


def batch(B: int = 4, T: int = 32):
    x = torch.randint(0, 65, (B, T), generator=torch.Generator().manual_seed(0))
    return x, torch.roll(x, -1, 1)


def test_adamw_state_is_16_bytes_per_parameter_in_fp32_measured():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    n = sum(p.numel() for p in model.parameters())  # the tied head counted once, as parameters() does
    optimizer = make_optimizer(model, 1e-3, 0.1)
    x, y = batch()
    model(x, y)[1].backward()
    optimizer.step()
    sizes = state_bytes(model, optimizer)
    assert sizes["parameters"] == sizes["gradients"] == 4 * n
    assert sizes["optimizer"] == 8 * n  # two fp32 moments; the scalar step counters are not counted
    assert sizes["total"] == adamw_bytes_per_parameter() * n == 16 * n
    assert adamw_bytes_per_parameter(2, 2, 4) == 12


def test_a_tied_weight_and_a_view_count_once():
    w = torch.zeros(10, 10)
    assert tensor_bytes([w, w, w[:2], w.T]) == 400
    assert tensor_bytes([w, torch.zeros(3)]) == 412


def test_saved_activations_grow_with_the_batch_and_the_depth():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    sizes = {B: saved_activation_bytes(lambda B=B: model(*batch(B))[1]) for B in (1, 2, 4)}
    per_example = sizes[2] - sizes[1]
    assert sizes[4] - sizes[2] == pytest.approx(2 * per_example, rel=0.01)  # linear in the batch
    deeper = GPT(GPTConfig(**{**CONFIG.__dict__, "n_layers": 8}))
    two = sizes[4]
    assert saved_activation_bytes(lambda: deeper(*batch(4))[1]) > 1.7 * two
    with torch.no_grad():
        assert saved_activation_bytes(lambda: model(*batch(4))[1]) == 0


def test_checkpointing_gives_the_same_loss_and_gradients_and_saves_memory():
    torch.manual_seed(0)
    plain = GPT(CONFIG)
    ckpt = GPT(CONFIG)
    ckpt.load_state_dict(plain.state_dict())
    keys = list(ckpt.state_dict())
    ckpt.activation_checkpointing = True
    assert list(ckpt.state_dict()) == keys  # the weights keep their names
    x, y = batch()
    loss_plain, loss_ckpt = plain(x, y)[1], ckpt(x, y)[1]
    loss_plain.backward()
    loss_ckpt.backward()
    torch.testing.assert_close(loss_ckpt, loss_plain, rtol=0, atol=0)
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-8, msg=name)
    full = saved_activation_bytes(lambda: plain(x, y)[1])
    kept = saved_activation_bytes(lambda: ckpt(x, y)[1])
    assert kept < full / 3, (kept, full)
    ckpt.activation_checkpointing = False
    assert saved_activation_bytes(lambda: ckpt(x, y)[1]) == full
    ckpt.activation_checkpointing = True
    with torch.no_grad():  # nothing to recompute without gradients
        torch.testing.assert_close(ckpt(x, y)[1], loss_plain, rtol=0, atol=0)


def test_checkpointed_blocks_still_generate_with_a_cache():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    prompt = batch(1, 5)[0]
    expected = model.generate(prompt, 10, temperature=0)
    model.activation_checkpointing = True
    assert torch.equal(model.generate(prompt, 10, temperature=0), expected)


def test_bad_inputs_are_named():
    with pytest.raises(TypeError, match="model must be an nn.Module, got str"):
        state_bytes("gpt")
    with pytest.raises(TypeError, match="fn must be a function computing a loss, got int"):
        saved_activation_bytes(3)
    with pytest.raises(ValueError, match="param_bytes must be"):
        adamw_bytes_per_parameter(0)


@pytest.mark.parametrize(("n_kv_heads", "dtype"), [(4, torch.float32), (2, torch.float32), (1, torch.bfloat16)])
def test_the_kv_cache_formula_matches_the_caches_a_model_fills(n_kv_heads, dtype):
    from transformer_lib.memory import cache_bytes, kv_cache_bytes_per_token

    torch.manual_seed(0)
    config = GPTConfig(**{**CONFIG.__dict__, "n_kv_heads": n_kv_heads})
    model = GPT(config).to(dtype)
    caches = model.new_caches()
    with torch.no_grad():
        model(batch(1, 20)[0], caches=caches)
    d_head = config.d_model // config.n_heads
    per_token = kv_cache_bytes_per_token(config.n_layers, n_kv_heads, d_head, torch.finfo(dtype).bits // 8)
    assert cache_bytes(caches) == 20 * per_token
    assert kv_cache_bytes_per_token(4, 4, 32) == 4096  # chapter 7's model: 2 x 4 layers x 128 x 4 bytes
    with pytest.raises(ValueError, match="n_kv_heads must be"):
        kv_cache_bytes_per_token(4, 0, 32)

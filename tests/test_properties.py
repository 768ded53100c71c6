"""Property-based tests (Hypothesis) over random shapes, masks, lengths and cache split points.

Each property is one the library promises for every input, not just the handful of examples
written by hand elsewhere: the explicit attention equals PyTorch's kernel, cached equals
uncached computation, a key-padding mask equals running each example alone, a checkpoint resumes
exactly, the byte-level BPE gives back any text, a batch holds the ids of its data or is refused.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import importorskip_unless_ci
from transformer_lib import GPT, GPTConfig, MultiHeadAttention, scaled_dot_product_attention
from transformer_lib.text import random_blocks
from transformer_lib.training import TrainConfig, Trainer

importorskip_unless_ci("hypothesis")

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


@SETTINGS
@given(
    B=st.integers(1, 3),
    H=st.integers(1, 3),
    T_q=st.integers(1, 7),
    T_k=st.integers(1, 7),
    d=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    masked=st.booleans(),
)
def test_explicit_attention_equals_pytorchs_kernel(B, H, T_q, T_k, d, seed, masked):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, d, generator=g, dtype=torch.float64) for T in (T_q, T_k, T_k))
    mask = torch.rand(B, 1, T_q, T_k, generator=g) < 0.7 if masked else None
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if mask is not None:  # PyTorch's kernel leaves fully masked rows undefined; the library makes them zero
        empty = ~mask.any(-1, keepdim=True)
        expected = expected.masked_fill(empty, 0.0)
        assert torch.equal(out.masked_select(empty.expand_as(out)), torch.zeros_like(out.masked_select(empty)))
    torch.testing.assert_close(out, expected)
    assert not torch.isnan(weights).any()


@SETTINGS
@given(
    positional=st.sampled_from(["learned", "sinusoidal", "rope", "none"]),
    n_kv_heads=st.sampled_from([1, 2, 4]),
    T=st.integers(2, 12),
    split=st.integers(1, 11),
    seed=st.integers(0, 2**16),
)
def test_cached_forward_equals_uncached_at_any_split(positional, n_kv_heads, T, split, seed):
    split = min(split, T - 1)
    torch.manual_seed(seed)
    model = GPT(
        GPTConfig(
            vocab_size=11,
            block_size=12,
            n_layers=2,
            n_heads=4,
            n_kv_heads=n_kv_heads,
            d_model=16,
            positional=positional,
        )
    ).eval()
    idx = torch.randint(11, (2, T))
    full, _ = model(idx)
    caches = model.new_caches()
    first, _ = model(idx[:, :split], caches=caches)
    rest, _ = model(idx[:, split:], caches=caches)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    T_q=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_key_padding_equals_each_example_alone(lengths, T_q, seed):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    mha = MultiHeadAttention(8, 2).eval()
    B, T_k = len(lengths), max(lengths)
    query, memory = torch.randn(B, T_q, 8, generator=g), torch.randn(B, T_k, 8, generator=g)
    keep = torch.arange(T_k)[None, :] < torch.tensor(lengths)[:, None]  # (B, T_k)
    batched = mha(query, memory, memory, key_padding_mask=keep)
    for b, n in enumerate(lengths):
        alone = mha(query[b : b + 1], memory[b : b + 1, :n], memory[b : b + 1, :n])
        torch.testing.assert_close(batched[b], alone[0], atol=1e-6, rtol=1e-5)


@SETTINGS
@given(
    lengths=st.lists(st.integers(1, 6), min_size=2, max_size=3),
    positional=st.sampled_from(["learned", "rope"]),
    seed=st.integers(0, 2**16),
)
def test_left_padded_generation_equals_each_prompt_alone(lengths, positional, seed):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=11, block_size=12, n_layers=1, n_heads=2, d_model=16, positional=positional))
    T0 = max(lengths)
    idx = torch.zeros(len(lengths), T0, dtype=torch.long)
    attention_mask = torch.zeros_like(idx)
    prompts = [torch.randint(1, 11, (n,)) for n in lengths]
    for row, p in enumerate(prompts):
        idx[row, T0 - len(p) :], attention_mask[row, T0 - len(p) :] = p, 1
    batched = model.generate(idx, 5, temperature=0, attention_mask=attention_mask)
    for row, p in enumerate(prompts):
        assert torch.equal(batched[row, T0 - len(p) :], model.generate(p[None], 5, temperature=0)[0])


@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    positional=st.sampled_from(["learned", "sinusoidal", "rope", "none"]),
    norm=st.sampled_from(["layernorm", "rmsnorm"]),
    steps=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_checkpoint_round_trip_resumes_exactly(tmp_path_factory, positional, norm, steps, seed):
    data = torch.randint(11, (300,), generator=torch.Generator().manual_seed(seed))

    def batches(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(data) - 9, (4,), generator=g)
        windows = data[starts[:, None] + torch.arange(9)]  # (4, 9)
        return windows[:, :-1], windows[:, 1:]

    def trainer() -> Trainer:
        torch.manual_seed(seed)
        model = GPT(
            GPTConfig(
                vocab_size=11,
                block_size=8,
                n_layers=1,
                n_heads=2,
                d_model=8,
                positional=positional,
                norm=norm,
                dropout=0.1,
            )
        )
        config = TrainConfig(
            max_steps=steps + 2,
            warmup_steps=1,
            seed=seed,
            log_interval=1,
            eval_interval=100,
            eval_steps=1,
            amp=False,
        )
        return Trainer(model, config, batches, device="cpu")

    straight = trainer()
    straight.fit(progress=False)
    first = trainer()
    first.fit(steps, progress=False)
    path = first.save(tmp_path_factory.mktemp("ckpt") / "ckpt.pt")
    resumed = trainer()
    resumed.load(path)
    resumed.fit(progress=False)
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert straight.history.train_loss == resumed.history.train_loss  # logged every step: the same losses


@lru_cache
def _bpe():
    importorskip_unless_ci("tokenizers")
    from transformer_lib.bpe import train_bpe

    return train_bpe("the king and the queen, thou art naïve: 東京 42\n" * 20, vocab_size=280)


@SETTINGS
@given(text=st.text())  # any Unicode text: st.text() leaves out the surrogates, which are not text
def test_bpe_round_trip_gives_back_any_text(text):
    tok = _bpe()
    assert tok.decode(tok.encode(text)) == text


@SETTINGS
@given(text=st.text(), surrogate=st.integers(0xD800, 0xDFFF), data=st.data())
def test_bpe_refuses_a_surrogate_where_it_is(text, surrogate, data):
    i = data.draw(st.integers(0, len(text)))
    with pytest.raises(ValueError, match=rf"surrogate U\+{surrogate:04X} at position {i}\b"):
        _bpe().encode(text[:i] + chr(surrogate) + text[i:])


INTEGER_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]


@SETTINGS
@given(dtype=st.sampled_from(INTEGER_DTYPES), data=st.data())
def test_random_blocks_holds_the_data_ids(dtype, data):
    ids = data.draw(st.lists(st.integers(0, torch.iinfo(dtype).max), min_size=5, max_size=5))
    x, y = random_blocks(torch.tensor(ids, dtype=dtype), 1, 4)  # one window: the whole stream
    assert x[0].tolist() == ids[:-1] and y[0].tolist() == ids[1:]

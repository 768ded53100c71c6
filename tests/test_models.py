from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import transformer_lib
from conftest import generate_with_logits
from transformer_lib import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer, count_parameters
from transformer_lib.precision import output_in_fp32
from transformer_lib.sampling import sample_next_token, top_k_filter, top_p_filter

VARIANTS = [
    dict(positional="learned", norm="layernorm", activation="gelu"),
    dict(positional="sinusoidal", norm="layernorm", activation="relu"),
    dict(positional="rope", norm="rmsnorm", activation="swiglu", bias=False),
    dict(positional="learned", norm="layernorm", activation="gelu", norm_first=False),
]


def small_gpt(**kw):
    cfg = dict(vocab_size=23, block_size=32, n_layers=2, n_heads=2, d_model=16)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg)).eval()


@pytest.mark.parametrize("variant", VARIANTS)
def test_gpt_has_no_causal_leak(variant):
    model = small_gpt(**variant)
    idx = torch.randint(0, 23, (2, 12))
    changed = idx.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 23
    a, _ = model(idx)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpt_kv_cache_gives_same_tokens_and_logits(variant):
    model = small_gpt(**variant)
    prompt = torch.randint(0, 23, (2, 5))
    # 40 new tokens with block_size 32: the window also slides past the context length.
    greedy_c, logits_c = generate_with_logits(model, prompt, 40, temperature=0, use_cache=True)
    greedy_n, logits_n = generate_with_logits(model, prompt, 40, temperature=0, use_cache=False)
    assert torch.equal(greedy_c, greedy_n)
    torch.testing.assert_close(logits_c, logits_n, atol=1e-5, rtol=1e-5)
    sampled_c = model.generate(prompt, 20, top_k=5, top_p=0.9, generator=torch.Generator().manual_seed(1))
    sampled_n = model.generate(
        prompt, 20, top_k=5, top_p=0.9, use_cache=False, generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(sampled_c, sampled_n)


def test_logits_is_forward_without_the_checks_and_the_loss():
    model = small_gpt(positional="rope")
    idx = torch.randint(0, 23, (2, 12))
    full, _ = model(idx)
    assert torch.equal(model.logits(idx), full)
    caches = model.new_caches()  # in two pieces through the cache
    pieces = [model.logits(idx[:, :8], caches=caches), model.logits(idx[:, 8:], caches=caches)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)
    padded = torch.cat([torch.zeros(2, 3, dtype=torch.long), idx], dim=1)  # three pads on the left
    mask = torch.arange(15) >= 3
    torch.testing.assert_close(model.logits(padded, attention_mask=mask.expand(2, 15))[:, 3:], full)


def test_only_models_py_runs_the_private_hidden_pass():
    users = [p.name for p in Path(transformer_lib.__file__).parent.rglob("*.py") if "._hidden(" in p.read_text()]
    assert users == ["models.py"], users


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ([1, 1, 1, 0, 0], r"has padding \(0\) after a token \(1\)"),  # right padding
        ([0, 1, 1, 0, 1], r"has padding \(0\) after a token \(1\)"),
        ([0, 0, 0, 0, 0], r"has no token \(all 0\)"),
    ],
)
def test_generate_refuses_a_mask_that_is_not_left_padding(row, problem):
    """Review 2026-11-25, N4: [1, 1, 1, 0, 0] continued from the padding, an all-0 row from nothing."""
    model = small_gpt()
    mask = torch.ones(3, 5, dtype=torch.long)
    mask[1] = torch.tensor(row)
    with pytest.raises(ValueError, match=rf"attention_mask row 1 {problem}: .* left padding, 0\.\.\.0 then 1\.\.\.1"):
        model.generate(torch.randint(0, 23, (3, 5)), 2, attention_mask=mask)


def test_generate_takes_left_padding_as_the_prompt_alone():
    model = small_gpt()
    prompt = torch.randint(0, 23, (1, 3))
    padded = torch.cat([torch.zeros(1, 2, dtype=torch.long), prompt], dim=1)
    mask = torch.tensor([[False, False, True, True, True]])
    out = model.generate(padded, 4, temperature=0, attention_mask=mask)
    assert torch.equal(out[:, 2:], model.generate(prompt, 4, temperature=0))


def test_gpt_loss_and_weight_tying():
    model = small_gpt()
    idx = torch.randint(0, 23, (3, 10))
    logits, loss = model(idx, idx)
    assert logits.shape == (3, 10, 23)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, 23), idx.reshape(-1)))
    assert abs(loss.item() - torch.log(torch.tensor(23.0)).item()) < 0.3  # near uniform at init
    assert model.lm_head.weight is model.tok_emb.weight
    untied = small_gpt(tie_weights=False)
    assert count_parameters(untied) - count_parameters(model) == 23 * 16


def test_gpt_sinusoidal_scales_token_embeddings_like_vaswani():
    """Fixed sinusoids (entries ~1) must not drown embeddings initialized at std 0.02: x = emb * sqrt(d) + PE."""
    from transformer_lib import sinusoidal_encoding

    idx = torch.randint(0, 23, (2, 9))
    for positional, scale in (("sinusoidal", 4.0), ("learned", 1.0), ("rope", 1.0), ("none", 1.0)):
        model = small_gpt(positional=positional)
        seen = []
        model.blocks[0].register_forward_pre_hook(lambda module, args, seen=seen: seen.append(args[0]))
        model(idx)
        expected = model.tok_emb(idx) * scale  # d_model = 16
        if positional == "sinusoidal":
            expected = expected + sinusoidal_encoding(9, 16)
        elif positional == "learned":
            expected = expected + model.pos.weight[:9]
        torch.testing.assert_close(seen[0], expected)


@pytest.mark.slow  # 150 training steps
def test_gpt_learns_a_copy_pattern():
    torch.manual_seed(0)
    model = small_gpt(vocab_size=8, n_layers=2, d_model=32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        half = torch.randint(0, 8, (16, 8))
        seq = torch.cat([half, half], 1)  # the second half repeats the first: needs attention to look back
        _, loss = model(seq[:, :-1], seq[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    half = torch.randint(0, 8, (64, 8))
    seq = torch.cat([half, half], 1)
    logits, _ = model(seq[:, :-1])
    acc = (logits[:, 8:].argmax(-1) == seq[:, 9:]).float().mean().item()
    assert acc > 0.9, acc


def test_gpt_attention_maps_are_causal_distributions():
    model = small_gpt(n_layers=3)
    maps = model.attention_maps(torch.randint(0, 23, (2, 7)))
    assert len(maps) == 3 and maps[0].shape == (2, 2, 7, 7)
    for w in maps:
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 7))
        assert (w.triu(1) == 0).all()


def test_sampling_filters():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert torch.isinf(top_k_filter(logits, 2)).tolist() == [[True, False, False, True]]
    probs = torch.softmax(logits, -1)[0]  # about [0.09, 0.64, 0.24, 0.03]
    kept = ~torch.isinf(top_p_filter(logits, 0.7))
    assert kept.tolist() == [[False, True, True, False]], probs
    assert (~torch.isinf(top_p_filter(logits, 0.5))).sum() == 1  # the top token alone already covers 0.5
    assert sample_next_token(logits, temperature=0).item() == 1
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_next_token(logits, top_k=1, generator=g) for _ in range(20)])
    assert (draws == 1).all()


def test_seq2seq_shapes_leak_and_cached_decoding():
    config = Seq2SeqConfig(11, 13, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, dropout=0.0)
    model = Seq2SeqTransformer(config).eval()
    src = torch.tensor([[3, 4, 5, 6, 0, 0], [7, 8, 9, 10, 2, 1]])
    tgt = torch.tensor([[1, 5, 6, 7, 8], [1, 2, 3, 4, 5]])
    logits = model(src, tgt)
    assert logits.shape == (2, 5, 13)
    changed = tgt.clone()
    changed[:, 3:] = 9
    torch.testing.assert_close(model(src, changed)[:, :3], logits[:, :3])  # no causal leak
    # padding in the source does not matter: pad with more zeros, same result
    longer = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], 1)
    torch.testing.assert_close(model(longer, tgt), logits, atol=1e-5, rtol=1e-5)
    memory = model.encode(src)
    caches = model.new_caches()
    steps = [model.decode(tgt[:, t : t + 1], memory, src, caches=caches) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), logits, atol=1e-5, rtol=1e-5)
    maps = model.attention_maps(src, tgt)
    assert [len(maps[k]) for k in ("encoder", "decoder", "cross")] == [2, 2, 2]
    assert maps["cross"][0].shape == (2, 4, 5, 6) and (maps["cross"][0][0, ..., 4:] == 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("norm_first", [False, True])
def test_seq2seq_learns_to_reverse(norm_first):
    torch.manual_seed(0)
    V, BOS = 10, 1
    config = Seq2SeqConfig(V, V, 32, 4, 1, 1, d_ff=64, dropout=0.0, norm_first=norm_first)
    model = Seq2SeqTransformer(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def batch(n):
        src = torch.randint(2, V, (n, 6))
        tgt = torch.cat([torch.full((n, 1), BOS), src.flip(1)], 1)
        return src, tgt

    for _ in range(250):
        src, tgt = batch(32)
        loss = F.cross_entropy(model(src, tgt[:, :-1]).reshape(-1, V), tgt[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    src, tgt = batch(100)
    acc = (model(src, tgt[:, :-1]).argmax(-1) == tgt[:, 1:]).float().mean().item()
    assert acc > 0.9, acc


def test_a_model_converted_to_bf16_runs_under_autocast_with_fp32_logits():
    # output_in_fp32 once called head(h.float()) against bf16 head weights: a dtype mismatch error
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, d_model=16, n_layers=1, n_heads=2)).to(torch.bfloat16)
    idx = torch.randint(0, 11, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, idx)
    assert logits.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert model.lm_head.weight.grad.dtype == torch.bfloat16


def test_the_head_multiplies_in_fp32_under_autocast_and_runs_its_hooks():
    torch.manual_seed(0)
    head, seen = torch.nn.Linear(8, 5), []
    head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    h = torch.randn(2, 3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = output_in_fp32(head, h)
    assert seen == [torch.float32] and logits.dtype == torch.float32
    torch.testing.assert_close(logits, head(h), rtol=0, atol=0)


def test_a_new_encoder_is_initialised_as_bert_is():
    """Word, position and segment embeddings on one scale (N(0, 0.02), HF's initializer_range), biases zero: with
    PyTorch's default N(0, 1) word embeddings, positions 50 times weaker are lost in the embedding norm, and a
    model trained from scratch with the masked-LM loss stays at the unigram loss."""
    torch.manual_seed(0)
    config = transformer_lib.EncoderOnlyConfig(500, max_len=64, d_model=64, n_heads=4, n_layers=2, d_ff=128)
    model = transformer_lib.EncoderOnlyTransformer(config)
    for table in (model.word_embed.weight, model.pos.weight, model.type_embed.weight):
        assert abs(table.std().item() - 0.02) < 0.002
    for name, p in model.named_parameters():
        if name.endswith("bias") and "norm" not in name:
            assert not p.any(), name
        if p.dim() == 2:
            assert abs(p.std().item() - 0.02) < 0.003, name
    assert all(torch.equal(p, torch.ones_like(p)) for n, p in model.named_parameters() if n.endswith("norm1.weight"))

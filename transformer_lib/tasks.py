"""Synthetic sequence-to-sequence tasks, generated in code (chapter 6, Encoder-decoder).

``copy`` and ``reverse`` and ``sort`` have attention patterns you can read (a diagonal, an
anti-diagonal, a permutation); ``dates`` is a small translation task with real structure:
dates written in words in several formats, to ISO dates.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ._validate import _validate_int

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<eos>")

MONTHS = tuple("january february march april may june july august september october november december".split())
ONES = (
    "",
    *"one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split(),
)
ORDINALS = (
    "",
    *"first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth "
    "fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth".split(),
)
DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


class Seq2SeqTokenizer:
    """Characters to ids for the sequence-to-sequence tasks, with ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2
    before the characters. (:class:`transformer_lib.text.CharTokenizer` is the plain one, without specials.)

    Defined in chapter 6, Encoder-decoder.
    """

    def __init__(self, alphabet: str) -> None:
        self.itos = [*SPECIALS, *sorted(set(alphabet))]
        self.stoi = {c: i for i, c in enumerate(self.itos)}

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        unknown = set(text) - self.stoi.keys()
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {''.join(sorted(unknown))!r}")
        return [BOS] * bos + [self.stoi[c] for c in text] + [EOS] * eos

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """Ids to text; stops at ``<eos>`` and skips ``<pad>``/``<bos>``."""
        out = []
        for i in ids.tolist() if isinstance(ids, Tensor) else ids:
            if i == EOS:
                break
            if i > EOS:
                out.append(self.itos[i])
        return "".join(out)


def _ordinal(n: int) -> str:
    if n <= 20:
        return ORDINALS[n]
    tens = "twenty" if n < 30 else "thirty"
    return tens[:-1] + "ieth" if n % 10 == 0 else f"{tens}-{ORDINALS[n % 10]}"


def _cardinal(n: int) -> str:
    if n < 20:
        return ONES[n]
    tens = "twenty" if n < 30 else "thirty"
    return tens if n % 10 == 0 else f"{tens}-{ONES[n % 10]}"


def random_date_pair(rng: random.Random) -> tuple[str, str]:
    """A date in words, in one of several formats, and its ISO form, e.g. ('the fifth of march 1998', '1998-03-05')."""
    year = rng.randint(1900, 2099)
    month = rng.randint(1, 12)
    day = rng.randint(1, DAYS_IN_MONTH[month - 1])
    name = MONTHS[month - 1]
    formats = (
        f"{name} {day}, {year}",
        f"{day} {name} {year}",
        f"the {_ordinal(day)} of {name} {year}",
        f"{name} {_ordinal(day)}, {year}",
        f"{name} {_cardinal(day)} {year}",
        f"{day} {name[:3]} {year}",
    )
    return rng.choice(formats), f"{year:04d}-{month:02d}-{day:02d}"


def _string_task(fn: Callable[[str], str]) -> Callable[[random.Random, int, int], tuple[str, str]]:
    def make(rng: random.Random, min_len: int = 3, max_len: int = 10) -> tuple[str, str]:
        s = "".join(rng.choice("abcdefghij") for _ in range(rng.randint(min_len, max_len)))
        return s, fn(s)

    return make


TASKS: dict[str, Callable[..., tuple[str, str]]] = {
    "copy": _string_task(lambda s: s),
    "reverse": _string_task(lambda s: s[::-1]),
    "sort": _string_task(lambda s: "".join(sorted(s))),
    "dates": lambda rng, *args: random_date_pair(rng),
}
ALPHABETS = {
    "copy": "abcdefghij",
    "reverse": "abcdefghij",
    "sort": "abcdefghij",
    "dates": "abcdefghijklmnopqrstuvwxyz0123456789 ,-",
}


def make_pairs(
    task: str, n: int, seed: int = 0, exclude: set[str] | None = None, **kwargs: Any
) -> list[tuple[str, str]]:
    """``n`` distinct (source, target) pairs of ``task``, none whose source is in ``exclude``.

    Defined in chapter 6, Encoder-decoder.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}, got {task!r}")
    n = _validate_int("n", n)
    rng, seen, pairs = random.Random(seed), set(exclude or ()), []
    for _ in range(100 * n):
        src, tgt = TASKS[task](rng, **kwargs)
        if src not in seen:
            seen.add(src)
            pairs.append((src, tgt))
            if len(pairs) == n:
                return pairs
    raise ValueError(f"could not make {n} distinct pairs of {task!r} with {kwargs}; ask for fewer")


@dataclass
class Seq2SeqData:
    """Pairs of strings, tokenized and padded on demand.

    ``batch(pairs)`` gives ``src`` (B, S) and ``tgt`` (B, T) with ``<bos>`` in front and
    ``<eos>`` at the end of every target; both padded with ``<pad>`` = 0. Teacher forcing
    feeds ``tgt[:, :-1]`` (shifted right) and predicts ``tgt[:, 1:]``.

    Defined in chapter 6, Encoder-decoder.
    """

    pairs: list[tuple[str, str]]
    tokenizer: Seq2SeqTokenizer

    def batch(self, pairs: Sequence[tuple[str, str]]) -> tuple[Tensor, Tensor]:
        """Shapes: -> src (B, S), tgt (B, T + 2)."""
        src = [torch.tensor(self.tokenizer.encode(s), dtype=torch.long) for s, _ in pairs]  # "" -> (0,) long
        tgt = [torch.tensor(self.tokenizer.encode(t, bos=True, eos=True), dtype=torch.long) for _, t in pairs]
        pad = torch.nn.utils.rnn.pad_sequence
        return pad(src, batch_first=True, padding_value=PAD), pad(tgt, batch_first=True, padding_value=PAD)

    def sampler(self, batch_size: int) -> Callable[[torch.Generator], tuple[Tensor, Tensor]]:
        """A function ``generator -> (src, tgt)`` drawing random batches, as the Trainer wants."""

        def draw(generator: torch.Generator) -> tuple[Tensor, Tensor]:
            idx = torch.randint(len(self.pairs), (batch_size,), generator=generator)
            return self.batch([self.pairs[i] for i in idx.tolist()])

        return draw


def seq2seq_loss(model: nn.Module, batch: tuple[Tensor, Tensor], label_smoothing: float = 0.0) -> Tensor:
    """Teacher-forced cross-entropy: feed ``tgt[:, :-1]``, predict ``tgt[:, 1:]``, ignore padding.

    Defined in chapter 6, Encoder-decoder.
    """
    src, tgt = batch
    logits = model(src, tgt[:, :-1])  # (B, T, V)
    return torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD, label_smoothing=label_smoothing
    )

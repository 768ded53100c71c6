"""Byte-level byte-pair encoding (BPE), set up exactly as GPT-2's tokenizer (chapter 7, Decoder-only).

:class:`BPETokenizer` wraps a Hugging Face ``tokenizers.Tokenizer`` (``pip install tokenizers``,
imported only when a tokenizer is built) with GPT-2's pipeline: the text is split by GPT-2's
regular expression (contractions, runs of letters, of digits, of other symbols, whitespace),
each piece is written as bytes mapped to printable characters (a space becomes ``Ġ``, a
newline ``Ċ``), then merged by the learned pairs in order. No normalization and no prefix
space, so decoding gives back the text exactly. Special tokens such as ``<|endoftext|>`` are
matched in the text first and never split nor merged.

Two ways to get one:

* :func:`train_bpe` learns the merges from a text, starting from the 256 byte symbols;
* :meth:`BPETokenizer.from_files` loads GPT-2-format ``vocab.json`` / ``merges.txt``
  (GPT-2's own, or those written by :meth:`BPETokenizer.save`).
"""

from __future__ import annotations

import itertools
import json
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from ._validate import _validate_int, _validate_token_id

INSTALL_HINT = "pip install tokenizers"
N_BYTES = 256
_CHUNK_LINES = 200  # lines per training chunk: lets tokenizers count pieces in parallel
_SURROGATE = re.compile("[\ud800-\udfff]")


def _tokenizers() -> Any:
    """The ``tokenizers`` package, or an ``ImportError`` saying how to install it."""
    try:
        import tokenizers
    except ImportError as e:
        raise ImportError(f"the BPE tokenizer is built on Hugging Face tokenizers: {INSTALL_HINT}") from e
    return tokenizers


def _gpt2_pipeline(tok: Any) -> Any:
    """Give a ``tokenizers.Tokenizer`` GPT-2's byte-level pre-tokenizer and decoder (in place)."""
    tk = _tokenizers()
    # use_regex=True is GPT-2's split pattern; no prefix space (GPT-2's default).
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = tk.decoders.ByteLevel()
    return tok


def _validate_text(text: object) -> str:
    """A str that UTF-8 can write: a surrogate code point (half of a UTF-16 pair) is refused."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    bad = _SURROGATE.search(text)
    if bad:
        raise ValueError(
            f"text holds a lone surrogate U+{ord(bad.group()):04X} at position {bad.start()}: "
            "not a character, it has no UTF-8 bytes"
        )
    return text


def _read_vocab(path: str | Path) -> dict[str, int]:
    """``vocab_json``'s mapping token string -> id, each id a plain int >= 0 (not a bool, a float, a string)."""
    try:
        vocab = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as e:  # not UTF-8, or not JSON
        raise ValueError(f"vocab_json {str(path)!r} is not a UTF-8 JSON file: {e}") from None
    if not isinstance(vocab, dict):
        raise ValueError(f"vocab_json {str(path)!r} must hold a JSON object (token -> id), got {type(vocab).__name__}")
    for token, i in vocab.items():
        if type(i) is not int or i < 0:
            raise ValueError(f"vocab_json {str(path)!r} gives the token {token!r} the id {i!r}: ids are ints >= 0")
    return vocab


def _validate_vocab(vocab: dict[str, int], alphabet: list[str]) -> None:
    """A byte-level vocabulary: every one of the 256 byte symbols, and ids 0 .. N-1 each given once."""
    missing = [c for c in alphabet if c not in vocab]
    if missing:
        raise ValueError(
            f"vocab_json lacks {len(missing)} of the 256 byte symbols of a byte-level BPE "
            f"({' '.join(sorted(missing)[:8])} ...): text with those bytes could not be encoded"
        )
    i, count = Counter(vocab.values()).most_common(1)[0]
    if count > 1:
        raise ValueError(f"vocab_json gives id {i} to several tokens: {[t for t, j in vocab.items() if j == i]}")
    if max(vocab.values()) >= len(vocab):
        raise ValueError(
            f"vocab_json must number its {len(vocab)} tokens with ids 0 .. {len(vocab) - 1}, "
            f"got id {max(vocab.values())}"
        )


def _validate_special_tokens(special_tokens: Iterable[str]) -> list[str]:
    if isinstance(special_tokens, str):
        raise TypeError(f"special_tokens must be a list of strings, got the string {special_tokens!r}")
    specials = list(special_tokens)
    for s in specials:
        if not isinstance(s, str) or not s:
            raise TypeError(f"each special token must be a non-empty str, got {s!r}")
    if len(set(specials)) != len(specials):
        raise ValueError(f"special_tokens contains duplicates: {specials}")
    return specials


class BPETokenizer:
    """A GPT-2-style byte-level BPE tokenizer over a Hugging Face ``tokenizers.Tokenizer``.

    Build it with :func:`train_bpe` or :meth:`from_files` rather than from a backend directly.

    Shapes:
        encode: str -> list of T ids (T = 0 for ``""``).
        decode: list of T ids or a (T,) integer tensor/array -> str.
        tokens: str -> list of T token strings (byte-level spelling: ``Ġ`` is a space).
    """

    def __init__(self, backend: Any, special_tokens: Iterable[str] = ()) -> None:
        specials = _validate_special_tokens(special_tokens)
        if specials:
            backend.add_special_tokens(specials)  # already-known tokens keep their ids
        self._tok = backend
        self._special = {s: backend.token_to_id(s) for s in specials}
        self._size = backend.get_vocab_size(with_added_tokens=True)

    # --- construction -------------------------------------------------------------------
    @classmethod
    def from_files(
        cls, vocab_json: str | Path, merges_txt: str | Path, special_tokens: Iterable[str] = ()
    ) -> BPETokenizer:
        """Load GPT-2-format files: ``vocab.json`` (token string -> id) and ``merges.txt``
        (a ``#version`` header line, then one merge ``"a b"`` per line, in priority order).

        ``special_tokens`` are matched in the text before splitting; one already in the
        vocabulary keeps its id (GPT-2's ``<|endoftext|>`` is 50256), a new one is appended.
        """
        tk = _tokenizers()
        for name, path in (("vocab_json", vocab_json), ("merges_txt", merges_txt)):
            if not Path(path).is_file():
                raise FileNotFoundError(f"{name}: no file at {str(path)!r}")
        _validate_vocab(_read_vocab(vocab_json), tk.pre_tokenizers.ByteLevel.alphabet())
        try:  # the vocabulary is sound: what the backend refuses now is in the merges
            model = tk.models.BPE.from_file(str(vocab_json), str(merges_txt))
        except Exception as e:  # the backend raises a bare Exception
            raise ValueError(
                f"merges_txt {str(merges_txt)!r} is not a list of merges of vocab_json's tokens "
                f"('#version' line, then one 'a b' per line, a, b and ab in vocab_json): {e}"
            ) from None
        return cls(_gpt2_pipeline(tk.Tokenizer(model)), special_tokens)

    # --- the vocabulary -----------------------------------------------------------------
    @property
    def backend(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included: ids are ``0 .. vocab_size - 1``."""
        return self._size

    @property
    def special_tokens(self) -> dict[str, int]:
        """Special token string -> id."""
        return dict(self._special)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token string (byte-level spelling, e.g. ``"Ġking"``), ``None`` if unknown."""
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str:
        """The token string of an id; a ``ValueError`` outside ``[0, vocab_size)``."""
        return self._tok.id_to_token(_validate_token_id(i, self._size))

    def merges(self) -> list[tuple[str, str]]:
        """The learned merges in priority order (the order they were learned): pairs of token strings.

        Merge ``r`` turns the adjacent pair ``(a, b)`` into the token ``a + b``; encoding applies the
        merges by this rank. Special tokens take no part in merges.
        """
        merges = json.loads(self._tok.to_str())["model"]["merges"]
        # tokenizers >= 0.20 writes each merge as a pair, older versions as one "a b" string
        return [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in merges]

    # --- text <-> ids -------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Shapes: str -> list of T ids. Special tokens in the text become their single id."""
        return self._tok.encode(_validate_text(text), add_special_tokens=False).ids

    def tokens(self, text: str) -> list[str]:
        """Shapes: str -> list of T token strings, as stored in the vocabulary (``Ġ`` = space,
        ``Ċ`` = newline; a token may hold part of a multi-byte character)."""
        return self._tok.encode(_validate_text(text), add_special_tokens=False).tokens

    def decode(self, ids: Sequence[int] | Tensor | np.ndarray) -> str:
        """Shapes: list of T ids or a (T,) integer tensor/array -> str.

        ``decode(encode(s)) == s`` for every string. Special tokens come back as their text.
        """
        if isinstance(ids, (Tensor, np.ndarray)):
            if ids.ndim != 1:
                raise ValueError(f"decode expects a 1-D sequence of ids, got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        ids = [_validate_token_id(i, self._size) for i in ids]
        # Special tokens verbatim, the runs between them through the byte-level decoder
        # (the decoder would read a special token's characters as bytes).
        by_id = {i: s for s, i in self._special.items()}
        parts = []
        for special, group in itertools.groupby(ids, key=by_id.__contains__):
            run = list(group)
            parts.append(
                "".join(by_id[i] for i in run) if special else self._tok.decode(run, skip_special_tokens=False)
            )
        return "".join(parts)

    # --- files --------------------------------------------------------------------------
    def save(self, folder: str | Path) -> tuple[Path, Path]:
        """Write ``vocab.json`` and ``merges.txt`` (GPT-2 format) to ``folder`` (created if needed).

        :meth:`from_files` reads them back; pass it the same ``special_tokens``
        (see :attr:`special_tokens`), which the GPT-2 format does not record.
        Returns the two paths.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._tok.model.save(str(folder))  # vocab.json and merges.txt of the BPE model
        vocab_path, merges_path = folder / "vocab.json", folder / "merges.txt"
        # The full vocabulary, with special tokens appended after loading (not in the model's).
        vocab = dict(sorted(self._tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1]))
        vocab_path.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        return vocab_path, merges_path

    def __repr__(self) -> str:
        specials = f", special_tokens={list(self._special)}" if self._special else ""
        return f"BPETokenizer(vocab_size={self._size}{specials})"


def train_bpe(text: str, vocab_size: int = 512, special_tokens: Iterable[str] = ()) -> BPETokenizer:
    """A GPT-2-style byte-level BPE tokenizer trained on ``text``.

    Starts from the 256 byte symbols (all of them, whether or not they occur in ``text``) and
    adds the most frequent adjacent pair of symbols as a new token until the vocabulary holds
    ``vocab_size`` ids, special tokens included. Special tokens get ids ``0 .. k-1``, are cut
    out of the training text and are never split nor merged. A ``UserWarning`` if ``text`` is
    too short to supply enough merges (the vocabulary is then smaller).

    Shapes: str -> a tokenizer with ``vocab_size`` ids.

    Defined in chapter 7, Decoder-only.
    """
    tk = _tokenizers()
    _validate_text(text)
    specials = _validate_special_tokens(special_tokens)
    minimum = N_BYTES + len(specials)
    allowed = f"an int >= 256 bytes + {len(specials)} special tokens = {minimum} (a byte-level BPE)"
    vocab_size = _validate_int("vocab_size", vocab_size, minimum, allowed)
    tok = _gpt2_pipeline(tk.Tokenizer(tk.models.BPE()))
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = text.splitlines(keepends=True)
    chunks = ("".join(lines[i : i + _CHUNK_LINES]) for i in range(0, len(lines), _CHUNK_LINES))
    if specials:  # special tokens are not text to learn merges from
        pattern = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
        chunks = (piece for chunk in chunks for piece in pattern.split(chunk) if piece)
    tok.train_from_iterator(chunks, trainer)
    bpe = BPETokenizer(tok, specials)
    if bpe.vocab_size < vocab_size:
        warnings.warn(
            f"the text supplied only {bpe.vocab_size - minimum} merges: vocabulary of "
            f"{bpe.vocab_size} ids instead of the {vocab_size} requested",
            stacklevel=2,
        )
    return bpe

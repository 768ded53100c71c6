"""transformer_lib.bpe: a byte-level BPE trained here gives GPT-2's ids under three implementations.

The ids of :class:`BPETokenizer` are compared with
* ``tokenizers``' own ``Tokenizer(models.BPE.from_file(vocab, merges))`` set up as GPT-2's,
* ``transformers.GPT2Tokenizer`` loaded from the same files (pure Python before transformers 5,
  built on ``tokenizers`` since), and
* GPT-2's original algorithm (OpenAI's ``encoder.py``: byte-to-unicode table, regex split,
  merge by rank), written out below in pure Python: an implementation sharing no code with ours.

Without ``tokenizers``/``transformers`` these tests are skipped, except with CI=true where that fails.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import importorskip_unless_ci

SPECIAL = "<|endoftext|>"
STRINGS = [
    "",
    "hello world",
    "Hello, World! How's it going? I'm fine; they'll see: we've (maybe) done it.",
    "  leading and trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand\r\nwindows line ends\n",
    "digits 0 12 345 6789 3.14159 1,000,000 2024-06-01",
    "punctuation!!! ... ??? --- ;;; \"quoted\" 'single' [brackets] {braces} <angle> @#$%^&*_+=|\\/~`",
    "café naïve — 東京 🙂 Ünïcödé ß ﬁ",
    "ROMEO.\nBut soft, what light through yonder window breaks?\n",
    f"before{SPECIAL}after",
    f"First part.{SPECIAL}\n\nSecond part, with {SPECIAL}{SPECIAL} twice.",
    f"{SPECIAL}",
    "<|endoftext| almost special |>",
]


# --- GPT-2's original algorithm (OpenAI gpt-2/src/encoder.py), independent of tokenizers ------------


@lru_cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from the 256 bytes to printable characters (a space becomes 'Ġ')."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


class ReferenceGPT2:
    """GPT-2's encoder.py, plus splitting out special tokens first (as transformers does)."""

    PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    def __init__(self, vocab_json: Path, merges_txt: Path, special_tokens: tuple[str, ...] = ()) -> None:
        regex = importorskip_unless_ci("regex")
        self.encoder = json.loads(Path(vocab_json).read_text(encoding="utf-8"))
        self.decoder = {i: s for s, i in self.encoder.items()}
        lines = Path(merges_txt).read_text(encoding="utf-8").split("\n")
        assert lines[0].startswith("#version"), lines[0]
        merges = [tuple(line.split()) for line in lines[1:] if line]
        self.ranks = {pair: r for r, pair in enumerate(merges)}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self.pat = regex.compile(self.PATTERN)
        self.special = list(special_tokens)
        alternatives = "|".join(map(regex.escape, self.special))
        self.special_pat = regex.compile(f"({alternatives})") if self.special else None

    def bpe(self, token: str) -> list[str]:
        word = list(token)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return word

    def encode(self, text: str) -> list[int]:
        pieces = self.special_pat.split(text) if self.special_pat else [text]
        ids = []
        for piece in pieces:
            if piece in self.special:
                ids.append(self.encoder[piece])
                continue
            for chunk in self.pat.findall(piece):
                chunk = "".join(self.byte_encoder[b] for b in chunk.encode("utf-8"))
                ids.extend(self.encoder[t] for t in self.bpe(chunk))
        return ids

    def decode(self, ids: list[int]) -> str:
        text = "".join(self.decoder[i] for i in ids)
        return bytearray(self.byte_decoder[c] for c in text).decode("utf-8", errors="replace")


# --- fixtures ---------------------------------------------------------------------------------------


def _training_text() -> str:
    """About 40 KB: Shakespeare if installed, plus generated lines with digits, unicode and a special token."""
    rng = np.random.default_rng(0)
    words = [
        "the",
        "king",
        "queen",
        "love",
        "thou",
        "art",
        "café",
        "naïve",
        "東京",
        "über",
        "42",
        "2024",
        "don't",
        "we'll",
        "hello",
        "world",
        "—",
        "...",
        "?!",
        "x1",
        "α",
        "β",
    ]
    lines = [
        " ".join(rng.choice(words, size=rng.integers(3, 12))) + rng.choice([".", ",", "!", "?", ";"])
        for _ in range(600)
    ]
    generated = "\n".join(lines)
    try:
        from transformer_lib.text import load_shakespeare

        shakespeare = load_shakespeare(max_chars=20_000)
    except ImportError:
        shakespeare = ""
    return f"{shakespeare}\n{SPECIAL}\n{generated}\n"


@pytest.fixture(scope="module")
def trained():
    importorskip_unless_ci("tokenizers")
    from transformer_lib.bpe import train_bpe

    return train_bpe(_training_text(), vocab_size=600, special_tokens=[SPECIAL])


@pytest.fixture(scope="module")
def saved(trained, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe")
    vocab, merges = trained.save(folder)
    return vocab, merges


@pytest.fixture(scope="module")
def loaded(saved):
    from transformer_lib.bpe import BPETokenizer

    return BPETokenizer.from_files(*saved, special_tokens=[SPECIAL])


def _tokenizers_gpt2(vocab: Path, merges: Path):
    tk = importorskip_unless_ci("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE.from_file(str(vocab), str(merges)))
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    tok.add_special_tokens([SPECIAL])
    return tok


def _transformers_gpt2(folder: Path):
    transformers = importorskip_unless_ci("transformers")
    # Its unk/bos/eos token is "<|endoftext|>": matched as a whole before BPE, like ours.
    return transformers.GPT2Tokenizer.from_pretrained(str(folder))


# --- tests ------------------------------------------------------------------------------------------


def test_vocabulary_size_is_the_request(trained, loaded):
    assert trained.vocab_size == 600
    assert loaded.vocab_size == 600
    assert trained.backend.get_vocab_size() == 600
    # all 256 byte symbols are in, whatever the text
    assert all(trained.token_to_id(c) is not None for c in bytes_to_unicode().values())


def test_saved_files_are_gpt2_format(saved, trained):
    vocab_path, merges_path = saved
    assert vocab_path.name == "vocab.json" and merges_path.name == "merges.txt"
    vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
    assert sorted(vocab.values()) == list(range(600))
    assert vocab[SPECIAL] == trained.special_tokens[SPECIAL]
    lines = merges_path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("#version")
    assert len([m for m in lines[1:] if m]) == 600 - 256 - 1  # one merge per token beyond bytes and special


@pytest.mark.parametrize("s", STRINGS)
def test_ids_match_three_gpt2_implementations(s, trained, loaded, saved):
    vocab, merges = saved
    ours = loaded.encode(s)
    assert ours == trained.encode(s)
    assert ours == _tokenizers_gpt2(vocab, merges).encode(s).ids
    assert ours == ReferenceGPT2(vocab, merges, (SPECIAL,)).encode(s)
    assert ours == _transformers_gpt2(vocab.parent).encode(s, add_special_tokens=False)
    assert trained.tokens(s) == [trained.id_to_token(i) for i in ours]


def test_merges_are_used(loaded, saved):
    """The comparison above means something only if the text is really merged into fewer tokens."""
    s = "the king and the queen love thou art\n"
    assert len(loaded.encode(s)) < len(s.encode("utf-8")) / 2
    assert loaded.tokens(" king")[0].startswith("Ġ")


def test_merges_in_priority_order(trained, loaded, saved):
    """merges() lists the learned pairs in the order of merges.txt, and each pair's join is a token."""
    _, merges_path = saved
    lines = [tuple(m.split(" ")) for m in merges_path.read_text(encoding="utf-8").splitlines()[1:] if m]
    assert trained.merges() == lines == loaded.merges()
    assert len(lines) == 600 - 256 - 1
    assert all(trained.token_to_id(a + b) is not None for a, b in lines)
    # the first merge is the most frequent adjacent pair inside the pre-tokenized words (the special
    # token cut out), ties going to the pair of smaller byte-symbol ids (code-point order)
    text = _training_text().replace(SPECIAL, "")
    words = Counter(w for w, _ in trained.backend.pre_tokenizer.pre_tokenize_str(text))
    pairs = Counter()
    for w, n in words.items():
        for pair in zip(w, w[1:], strict=False):
            pairs[pair] += n
    top = max(pairs.values())
    assert trained.merges()[0] == min(p for p, n in pairs.items() if n == top)


@pytest.mark.parametrize("s", STRINGS)
def test_round_trip(s, trained, loaded, saved):
    for tok in (trained, loaded):
        ids = tok.encode(s)
        assert tok.decode(ids) == s
        assert tok.decode(torch.tensor(ids, dtype=torch.long)) == s
        assert tok.decode(np.asarray(ids, dtype=np.int64)) == s
    assert ReferenceGPT2(*saved, (SPECIAL,)).decode(loaded.encode(s)) == s


def test_special_token_is_one_id_and_never_merged(trained, loaded):
    sid = trained.special_tokens[SPECIAL]
    assert loaded.special_tokens == {SPECIAL: sid}
    assert trained.encode(SPECIAL) == [sid]
    ids = trained.encode(f"a{SPECIAL}b")
    assert ids.count(sid) == 1 and len(ids) == 3
    assert trained.decode(ids) == f"a{SPECIAL}b"
    # a near miss is ordinary text
    assert sid not in trained.encode("<|endoftext| >")


def test_special_tokens_are_cut_out_of_the_training_text():
    importorskip_unless_ci("tokenizers")
    from transformer_lib.bpe import train_bpe

    tok = train_bpe(f"hello world{SPECIAL}" * 300, vocab_size=266, special_tokens=[SPECIAL])
    learned = [t for t in tok.backend.get_vocab() if t != SPECIAL and len(t) > 1]
    assert "Ġworld" in learned or "world" in learned
    assert not [t for t in learned if "endoftext" in t or "<|" in t or "|>" in t], learned
    assert tok.encode(f"hello world{SPECIAL}")[-1] == tok.special_tokens[SPECIAL] == 0


def test_special_token_not_in_vocabulary_is_appended(saved):
    from transformer_lib.bpe import BPETokenizer

    tok = BPETokenizer.from_files(*saved, special_tokens=[SPECIAL, "<|pad|>"])
    assert tok.vocab_size == 601 and tok.special_tokens["<|pad|>"] == 600
    s = f"x<|pad|>y{SPECIAL}"
    assert tok.decode(tok.encode(s)) == s and 600 in tok.encode(s)


def test_special_token_with_non_ascii_text_round_trips(tmp_path):
    importorskip_unless_ci("tokenizers")
    from transformer_lib.bpe import BPETokenizer, train_bpe

    tok = train_bpe("some text, some more text\n" * 50, vocab_size=269, special_tokens=["<|fin—é|>"])
    s = "text<|fin—é|>more"
    assert tok.decode(tok.encode(s)) == s
    tok2 = BPETokenizer.from_files(*tok.save(tmp_path), special_tokens=["<|fin—é|>"])
    assert tok2.encode(s) == tok.encode(s) and tok2.decode(tok2.encode(s)) == s


def test_bad_ids_raise(trained):
    for bad in (-1, 600, 10_000):
        with pytest.raises(ValueError, match=rf"token id {bad} .*\[0, 600\)"):
            trained.decode([5, bad])
        with pytest.raises(ValueError, match=str(bad)):
            trained.id_to_token(bad)
    with pytest.raises(ValueError, match="600"):
        trained.decode(torch.tensor([600]))
    with pytest.raises(TypeError, match="integers"):
        trained.decode([1.5])
    with pytest.raises(ValueError, match="1-D"):
        trained.decode(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="str"):
        trained.encode(b"bytes")


def test_lookups(trained):
    i = trained.token_to_id("Ġthe")
    assert isinstance(i, int) and trained.id_to_token(i) == "Ġthe"
    assert trained.token_to_id("no such token") is None
    assert trained.decode(trained.encode(" the")) == " the"


def test_train_errors_and_warning():
    importorskip_unless_ci("tokenizers")
    from transformer_lib.bpe import train_bpe

    with pytest.raises(ValueError, match=r"vocab_size must be an int >= .* = 257 \(a byte-level BPE\), got 256"):
        train_bpe("abc", vocab_size=256, special_tokens=[SPECIAL])
    with pytest.raises(ValueError, match="vocab_size must be an int"):
        train_bpe("abc", vocab_size=300.0)
    with pytest.raises(TypeError, match="list of strings"):
        train_bpe("abc", vocab_size=300, special_tokens=SPECIAL)
    with pytest.raises(TypeError, match="text must be a str"):
        train_bpe(["abc"], vocab_size=300)
    with pytest.warns(UserWarning, match="instead of the 5000 requested"):
        tok = train_bpe("tiny text", vocab_size=5000)
    assert 256 < tok.vocab_size < 5000


def test_from_files_missing_file(tmp_path):
    importorskip_unless_ci("tokenizers")
    from transformer_lib.bpe import BPETokenizer

    with pytest.raises(FileNotFoundError, match="vocab_json"):
        BPETokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt")


def test_missing_tokenizers_gives_install_hint(monkeypatch):
    import builtins

    from transformer_lib import bpe

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "tokenizers" or name.startswith("tokenizers."):
            raise ImportError("No module named 'tokenizers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match="pip install tokenizers"):
        bpe.train_bpe("abc", vocab_size=300)


def test_train_bpe_moved_out_of_text():
    import transformer_lib.text as text

    assert not hasattr(text, "train_bpe")


def _write_vocab(folder: Path, vocab: dict[str, int]) -> tuple[Path, Path]:
    vocab_path, merges_path = folder / "vocab.json", folder / "merges.txt"
    vocab_path.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges_path.write_text("#version: 0.2\n", encoding="utf-8")
    return vocab_path, merges_path


def test_from_files_refuses_a_vocabulary_that_would_lose_text(tmp_path):
    tk = importorskip_unless_ci("tokenizers")
    from transformer_lib.bpe import BPETokenizer

    # without the 256 byte symbols, "abc" would encode as [0, 1] and decode as "ab"
    with pytest.raises(ValueError, match=r"vocab_json lacks 254 of the 256 byte symbols .* \(! \" # \$"):
        BPETokenizer.from_files(*_write_vocab(tmp_path, {"a": 0, "b": 1}))
    alphabet = sorted(tk.pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    # two tokens with one id: "ab" would decode as "bb"
    with pytest.raises(ValueError, match=r"id 5 to several tokens: \['.', '.'\]"):
        BPETokenizer.from_files(*_write_vocab(tmp_path, {**vocab, alphabet[0]: 5}))
    # a gap: the ids would run past vocab_size
    with pytest.raises(ValueError, match=r"with ids 0 \.\. 255, got id 300"):
        BPETokenizer.from_files(*_write_vocab(tmp_path, {**vocab, alphabet[0]: 300}))
    tok = BPETokenizer.from_files(*_write_vocab(tmp_path, vocab))  # the alphabet alone is a (merge-free) BPE
    assert tok.vocab_size == 256 and tok.decode(tok.encode("abc é")) == "abc é"


def test_lone_surrogate_is_refused_clearly(trained):
    for method in (trained.encode, trained.tokens):
        with pytest.raises(ValueError, match=r"surrogate U\+D800 at position 2"):
            method("ab\ud800c")
    assert trained.decode(trained.encode("ab\U0001f642c")) == "ab\U0001f642c"  # a real pair is one character


def test_from_files_refuses_ids_that_are_not_plain_ints_and_names_the_file(tmp_path):
    """A boolean id passed as 0 or 1 and silently dropped a byte symbol; other bad ids and files got the
    backend's bare Exception. Each is a ValueError naming vocab_json or merges_txt, before the backend reads."""
    tk = importorskip_unless_ci("tokenizers")
    from transformer_lib.bpe import BPETokenizer

    alphabet = sorted(tk.pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    for bad in (False, True, 3.0, "3", -1, [3], None):
        with pytest.raises(ValueError, match=rf"vocab_json .* gives the token '!' the id {re.escape(repr(bad))}: ids"):
            BPETokenizer.from_files(*_write_vocab(tmp_path, {**vocab, "!": bad}))
    vocab_path, merges_path = _write_vocab(tmp_path, vocab)
    vocab_path.write_text("{0: 1}", encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab_json .*vocab\.json' is not a UTF-8 JSON file"):
        BPETokenizer.from_files(vocab_path, merges_path)
    vocab_path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ValueError, match=r"must hold a JSON object \(token -> id\), got list"):
        BPETokenizer.from_files(vocab_path, merges_path)
    vocab_path, merges_path = _write_vocab(tmp_path, vocab)
    for merges in ("#version: 0.2\nz z\n", "#version: 0.2\na  b\n"):  # "zz" not in the vocabulary; two spaces
        merges_path.write_text(merges, encoding="utf-8")
        with pytest.raises(ValueError, match=r"merges_txt .*merges\.txt' is not a list of merges of vocab_json"):
            BPETokenizer.from_files(vocab_path, merges_path)

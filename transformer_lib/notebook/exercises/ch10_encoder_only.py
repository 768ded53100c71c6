"""Chapter 10, encoder-only models: ``check_empty_windows`` (a prediction: the windows the masked-LM loss skips),
``check_pseudo_log_likelihood`` (a sentence's), ``check_last_vectors`` (a GPT read as a classifier)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import torch
from torch import Tensor, nn

from ...models import EncoderOnlyConfig, EncoderOnlyTransformer
from ._framework import Checker, Hint, checker, same_fix

ANSWER_MARKERS: dict[str, tuple[str, ...]] = {  # exercise label -> strings that would give its answer away
    "ex-empty-windows": ("0.85**15", "0.85 ** 15", "0.087", "8.7%"),
    "ex-pseudo-log-likelihood": ("ids.repeat(", "copies[positions - 1, positions]", "one copy per position"),
    "ex-last-vectors": ("lengths - 1", "sum(1) - 1", "sum(dim=1) - 1", "sum(-1) - 1", "sum(dim=-1) - 1"),
    "ex-cls-vector": ("next sentence prediction", "next-sentence prediction"),
}


# --------------------------------------------------------------------------- windows with nothing to predict


class _EmptySetup(TypedDict):
    p: float
    n_positions: int


EMPTY_SETUP: _EmptySetup = {"p": 0.15, "n_positions": 15}
"""The prediction's setting: the chapter's windows, 15 characters behind a [CLS], each selected with p = 0.15."""


def empty_share(p: float, n_positions: int) -> float:
    """The share of windows in which none of the ``n_positions`` ordinary positions is selected."""
    return (1 - p) ** n_positions


@checker(answer="value", reference=empty_share(**EMPTY_SETUP))  # windows masked by the library: test_exercises_ch10
def check_empty_windows(c: Checker, prediction: float) -> None:
    """Check ``prediction``: the share of the chapter's windows (15 characters behind a [CLS], each character
    selected with probability 0.15) in which no position is selected, so that the window adds nothing to the loss."""
    p, n = EMPTY_SETUP["p"], EMPTY_SETUP["n_positions"]
    expected = empty_share(p, n)
    fix = f"each of the {n} characters escapes selection with probability 1 - {p}, independently: (1 - {p})**{n}."
    mistakes = {
        empty_share(p, n + 1): f"[CLS] is never selected: only the {n} characters can be.",
        1 - p * n: "the selections are independent draws, not exclusive events: probabilities of 'not selected' "
        "multiply.",
        p**n: "that is the share of windows in which *every* character is selected.",
        1 - expected: "that is the share of windows with at least one selected position.",
        1 - p: "that is one position's chance to escape selection, not the whole window's.",
    }
    c.case(
        "the share of windows with no selected position",
        lambda: prediction,
        expected,
        bugs=same_fix(fix, mistakes),
        hint=Hint(
            "a window adds nothing to the loss when none of its characters is selected; each one is selected on its "
            "own, with probability 0.15 (reread 'The masking recipe, by hand').",
            fix,
        ),
        atol=0.002,
    )


# --------------------------------------------------------------------------- pseudo-log-likelihood


def _pseudo_log_likelihood(
    logits_fn: Callable[[Tensor], Tensor], ids: Tensor, mask_id: int, *, bug: str = ""
) -> Tensor:
    """The pseudo-log-likelihood, one masked copy per position, or with a bug of :data:`_PLL_BUGS`."""
    T = ids.shape[0]
    positions = torch.arange(0 if bug == "with cls" else 1, T)  # (n,)
    copies = ids.repeat(len(positions), 1)  # (n, T): copy i asks for position positions[i]
    if bug == "all masked":
        copies[:, 1:] = mask_id
    elif bug != "no mask":
        copies[torch.arange(len(positions)), positions] = mask_id
    logp = logits_fn(copies).log_softmax(-1)  # (n, T, vocab_size)
    picked = logp[torch.arange(len(positions)), positions, ids[positions]]  # (n,)
    if bug == "probabilities":
        return picked.exp().sum()
    return picked.mean() if bug == "mean" else picked.sum()


class _TinyMaskedLM(nn.Module):
    """A small random encoder and head: the logits of every position, (B, T, vocab_size)."""

    def __init__(self, vocab_size: int, T: int) -> None:
        super().__init__()
        config = EncoderOnlyConfig(vocab_size, max_len=T, d_model=16, n_heads=2, n_layers=1, d_ff=32)
        self.encoder = EncoderOnlyTransformer(config)
        self.head = nn.Linear(16, vocab_size)
        with torch.no_grad():  # larger than BERT's 0.02, so that a token's probability depends on its context
            for p in self.parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.5)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.encoder(ids))


_PLL_CASES = (  # (name, vocab_size, T, seed)
    ("a sequence of 6 tokens behind [CLS]", 12, 7, 0),
    ("a sequence of 10 tokens behind [CLS]", 20, 11, 1),
    ("one token behind [CLS]", 12, 2, 2),
)
_PLL_FIX = (
    "make T - 1 copies of ids; in copy i put mask_id at position i + 1; logp = logits_fn(copies).log_softmax(-1); "
    "sum logp[i, i + 1, ids[i + 1]] over i."
)
_PLL_BUGS = same_fix(  # bug -> hint, for _pseudo_log_likelihood(..., bug=bug)
    _PLL_FIX,
    {
        "no mask": "the model sees the token it is asked about: an encoder reads every position, its own included, "
        "so the token must be hidden behind mask_id first.",
        "all masked": "every position is masked at once, so each token is scored without the others as context: "
        "mask one position per copy.",
        "with cls": "position 0 holds [CLS], which is not part of the text and is never predicted.",
        "mean": "that is the mean over the positions; the log-likelihood of a sequence is a sum.",
        "probabilities": "you add probabilities; a log-likelihood adds their logarithms.",
    },
)
_PLL_HINT = Hint(
    "an encoder can score a sequence by asking for each token in turn with that token hidden, the rest visible, "
    "and adding the log-probabilities (reread 'The masking recipe, by hand').",
    _PLL_FIX,
)


def _pll_cases() -> Iterator[tuple[str, dict[str, Any]]]:
    """A small random masked LM, a sequence behind [CLS] (id 1), the mask id 2."""
    for name, vocab_size, T, seed in _PLL_CASES:
        torch.manual_seed(seed)
        model = _TinyMaskedLM(vocab_size, T).eval()
        ids = torch.cat([torch.tensor([1]), torch.randint(3, vocab_size, (T - 1,))])
        yield name, {"model": model, "ids": ids, "mask_id": 2}


def _one_pass_per_position(logits_fn: Callable, ids: Tensor, mask_id: int) -> Tensor:
    masked = (ids.where(torch.arange(len(ids)) != t, mask_id) for t in range(1, len(ids)))
    return sum(logits_fn(m[None])[0, t].log_softmax(-1)[ids[t]] for t, m in enumerate(masked, start=1))


@checker(reference=_one_pass_per_position)
def check_pseudo_log_likelihood(c: Checker, pseudo_log_likelihood: Callable[[Callable, Tensor, int], Tensor]) -> None:
    """Check ``pseudo_log_likelihood(logits_fn, ids, mask_id)``: the sum over t = 1..T-1 of log p(ids[t]) with
    position t alone masked. Shapes: ids (T,), [CLS] first; logits_fn (B, T) -> (B, T, vocab_size) -> a scalar."""
    with torch.no_grad():
        c.cases(pseudo_log_likelihood, _pll_cases(), _pseudo_log_likelihood, _PLL_BUGS, hint=_PLL_HINT, atol=1e-4)


# --------------------------------------------------------------------------- a GPT as a classifier


def _last_vectors(hidden: Tensor, attention_mask: Tensor, *, bug: str = "") -> Tensor:
    """Each sequence's vector at its last real position (right padding), or with a bug of :data:`_LAST_BUGS`."""
    if bug == "last position":
        return hidden[:, -1]
    if bug == "first position":
        return hidden[:, 0]
    if bug == "mean":
        return hidden.mean(1)
    lengths = attention_mask.sum(1).long()  # (B,)
    return hidden[torch.arange(hidden.shape[0]), lengths - 1]


_LAST_STARTER = """\
def last_vectors(hidden, attention_mask):  # find and fix the bug
    return hidden[:, -1]  # (B, d_model): the last position has read the whole sequence
"""
_LAST_CASES = (  # (name, lengths, T, d_model)
    ("a batch of 3, right-padded to T=6", (6, 3, 4), 6, 5),
    ("a batch of 2 of full length", (4, 4), 4, 3),
    ("a batch of 4, right-padded to T=8", (1, 8, 2, 5), 8, 4),
)
_LAST_FIX = (
    "lengths = attention_mask.sum(dim=1); take hidden[torch.arange(B), lengths - 1], the last real position of "
    "each row."
)
_LAST_BUGS = same_fix(  # bug -> hint, for _last_vectors(..., bug=bug)
    _LAST_FIX,
    {
        "last position": "the shorter sequences end in padding: their last column is a padding position, not the "
        "end of the text (reread chapter 2 on padding, and 'Decoder-only, encoder-only, prefix-LM').",
        "first position": "under a causal mask the first position has read only the first token: it is the last "
        "real position that has read the whole sequence.",
        "mean": "the mean counts the padding positions, and the early positions, which have read only the start of "
        "the text: take the one position that has read all of it.",
    },
)
_LAST_HINT = Hint(
    "under a causal mask only the last real token of a sequence has read all of it, and with right padding each "
    "sequence ends at its own length.",
    _LAST_FIX,
)


def _last_cases() -> Iterator[tuple[str, dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    for name, lengths, T, d_model in _LAST_CASES:
        hidden = torch.randn(len(lengths), T, d_model, generator=g)
        yield name, {"hidden": hidden, "attention_mask": (torch.arange(T) < torch.tensor(lengths)[:, None]).long()}


@checker(
    starter=_LAST_STARTER,
    reference=lambda hidden, attention_mask: torch.stack(
        [hidden[b, attention_mask[b].nonzero().max()] for b in range(hidden.shape[0])]
    ),  # the largest index of a real token, row by row
)
def check_last_vectors(c: Checker, last_vectors: Callable[[Tensor, Tensor], Tensor]) -> None:
    """Check ``last_vectors(hidden, attention_mask)``: each sequence's vector at its last real token, for a
    decoder-only model's right-padded batch. Shapes: hidden (B, T, d_model), attention_mask (B, T) -> (B, d_model)."""
    c.cases(last_vectors, _last_cases(), _last_vectors, _LAST_BUGS, hint=_LAST_HINT)

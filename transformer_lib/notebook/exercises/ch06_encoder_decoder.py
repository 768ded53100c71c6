"""Chapter 6, encoder-decoder: ``check_greedy_batch`` (fix a greedy decoder that stops a whole batch at the first
``<eos>``), ``check_smoothed_loss`` (a prediction: the label-smoothed loss of a sure, right prediction), and
``check_beam_step`` (one step of beam search for a whole batch)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ... import decoding
from ...tasks import ALPHABETS, BOS, EOS, PAD, Seq2SeqTokenizer
from ._framework import Checker, Hint, checker

ANSWER_MARKERS: dict[str, tuple[str, ...]] = {  # exercise label -> what gives its answer away
    "ex-greedy-batch": ("masked_fill(finished", "finished.all()", "masked_fill(done", "done.all()", "cut short"),
    "ex-label-smoothing": ("1.95", "= 2.0", "(v - 1) / v * 20", "\\frac{v-1}{v} \\cdot 20"),
    "ex-beam-step": ("view(b, n * v)", "* n + index // v", "row b * n + j"),
    "ex-longer": ("random offset", "keep the long formats", "train on the lengths you need"),
}


# ---------------------------------------------------------------- Spot the bug: greedy decoding for a batch

GREEDY_STARTER = """\
@torch.no_grad()
def greedy_batch(model, src, max_len):  # find and fix the bug
    B = src.shape[0]
    memory = model.encode(src)  # (B, S, d_model), once
    out = src.new_full((B, 1), BOS)  # (B, 1): every row starts with <bos>
    for _ in range(max_len):
        next_id = model.decode(out, memory, src)[:, -1].argmax(-1)  # (B,) each row's most likely next token
        out = torch.cat((out, next_id.unsqueeze(1)), 1)
        if (next_id == EOS).any():  # stop at <eos>
            break
    return out
"""

_AFTER = 3  # what the stand-in model writes once it has written its <eos>


class _CopyModel(nn.Module):
    """A stand-in for a trained ``Seq2SeqTransformer`` that writes its source back, then ``<eos>``, then
    :data:`_AFTER` (which greedy decoding must replace by padding)."""

    pad_id = PAD

    def __init__(self, vocab_size: int = 12) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def encode(self, src: Tensor) -> Tensor:
        return F.one_hot(src, self.vocab_size).float()  # (B, S, vocab_size): the "memory"

    def decode(self, tgt: Tensor, memory: Tensor, src: Tensor, caches: list[dict[str, int]] | None = None) -> Tensor:
        offset = caches[0]["length"] if caches else 0
        if caches:
            caches[0]["length"] += tgt.shape[1]
        t = torch.arange(offset, offset + tgt.shape[1], device=tgt.device)  # (T,) the target positions
        copied = src.gather(1, t.clamp(max=src.shape[1] - 1).expand(src.shape[0], -1))  # (B, T) source's t-th
        n = (src != PAD).sum(1, keepdim=True)  # (B, 1) each source's length
        after = torch.where(t == n, EOS, _AFTER)  # (B, T)
        return 10.0 * F.one_hot(torch.where(t < n, copied, after), self.vocab_size).float()

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        return self.decode(tgt, self.encode(src), src)

    def new_caches(self) -> list[dict[str, int]]:
        return [{"length": 0}]


@torch.no_grad()
def _greedy_batch(model: Any, src: Tensor, max_len: int, *, bug: str = "") -> Tensor:
    """Greedy decoding of a batch, or with a bug of :data:`_GREEDY_BUGS`."""
    memory = model.encode(src)
    ys = torch.full((src.shape[0], 1), BOS, device=src.device)
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        next_id = model.decode(ys, memory, src)[:, -1].argmax(-1)  # (B,)
        if bug == "eos padded":
            done |= next_id == EOS
        if bug not in ("no padding", "this step", "first eos"):
            next_id = next_id.masked_fill(done, PAD)
        ys = torch.cat([ys, next_id[:, None]], dim=1)
        done |= next_id == EOS
        stop = {"first eos": (next_id == EOS).any(), "this step": (next_id == EOS).all(), "never stops": False}
        if stop.get(bug, done.all()):
            break
    return ys


_DECODING = "reread 'Decoding' and the output convention of greedy_decode: <pad> after a row's <eos>"
_GREEDY_FIX = (
    "keep a mask of the finished rows, done = torch.zeros(B, dtype=torch.bool); at each step next_id = "
    "next_id.masked_fill(done, PAD), append it, done |= next_id == EOS, and stop when done.all()."
)
_GREEDY_BUGS = {  # bug -> hint, for _greedy_batch(..., bug=bug)
    "first eos": Hint(
        "your loop stops the whole batch as soon as ONE row writes its <eos>: the rows that need more steps are "
        "cut short. It is right only when every row of the batch ends at the same step.",
        _GREEDY_FIX,
    ),
    "this step": Hint(
        "your loop stops only when every row writes <eos> at the same step; a row that finished earlier has moved "
        f"on to other tokens, so the loop runs to max_len, and the finished rows keep writing; {_DECODING}.",
        _GREEDY_FIX,
    ),
    "no padding": Hint(
        f"a finished row keeps writing after its <eos>: each row must remember that it is done; {_DECODING}.",
        "next_id = next_id.masked_fill(done, PAD) before appending it, with done the rows that wrote <eos> earlier.",
    ),
    "eos padded": Hint(
        "a row's <eos> itself became <pad>: a row is done only AFTER the step that writes its <eos>.",
        "pad with the rows done before this step (next_id.masked_fill(done, PAD)), then done |= next_id == EOS.",
    ),
    "never stops": Hint(
        "your loop always runs max_len steps, adding columns of <pad> once every row is done: stop as soon as "
        "every row has written its <eos>.",
        "if done.all(): break, after done |= next_id == EOS.",
    ),
}
_GREEDY_HINT = Hint(
    f"each row ends at its own <eos>: after it the row holds <pad>, and the loop stops once every row has ended; "
    f"{_DECODING}.",
    _GREEDY_FIX,
)
_GREEDY_CASES = (  # (name, sources (B, S) padded with PAD, max_len)
    ("a batch of one source", [[5, 6, 7, 8]], 8),
    ("3 sources of one length: every row ends at the same step, as dates do", [[5, 6, 7], [8, 9, 10], [4, 4, 11]], 8),
    ("3 sources of lengths 5, 2, 4: rows end at different steps",
     [[5, 6, 7, 8, 9], [10, 4, 0, 0, 0], [7, 7, 8, 11, 0]], 8),
    ("a row that does not end within max_len = 5", [[5, 6, 7, 8, 9, 10, 11], [9, 4, 0, 0, 0, 0, 0]], 5),
)  # fmt: skip


@checker(
    starter=GREEDY_STARTER,
    reference=lambda model, src, max_len: decoding._greedy(model, src, max_len, BOS, EOS, PAD, True),
)
def check_greedy_batch(c: Checker, greedy_batch: Callable[[nn.Module, Tensor, int], Tensor]) -> None:
    """Check ``greedy_batch(model, src, max_len)``, a loop of the answer's own, against ``decoding.greedy_decode``:
    ``<pad>`` after each row's ``<eos>``, stopping once every row has ended. Shapes: src (B, S) -> (B, <= max_len + 1).
    """
    model = _CopyModel()
    with c.refuse_library_calls(
        decoding.greedy_decode,
        decoding.beam_search,
        name="a loop of your own, without the library's decoders",
        hint="the exercise asks you to fix the loop: the library's decoder is what the checker compares it with.",
    ):
        c.cases(
            greedy_batch,
            ((name, {"model": model, "src": torch.tensor(src), "max_len": n}) for name, src, n in _GREEDY_CASES),
            _greedy_batch,
            _GREEDY_BUGS,
            hint=_GREEDY_HINT,
            error_hint="the model is called as in the chapter: memory = model.encode(src), then "
            "model.decode(ys, memory, src), whose logits have shape (B, T, V).",
        )


# ---------------------------------------------------------------- Predict, then run: a sure prediction, smoothed

_SMOOTHING = "Reread 'Label smoothing, an option'"


class _SmoothedSetup(TypedDict):
    margin: float
    eps: float
    vocab_size: int


SMOOTHED_SETUP: _SmoothedSetup = {
    "margin": 20.0,
    "eps": 0.1,
    "vocab_size": Seq2SeqTokenizer(ALPHABETS["dates"]).vocab_size,
}
"""The exercise's prediction: the right token's logit ``margin`` above all the others (every other logit
equal), label smoothing ``eps``, over the vocabulary of the dates task (42 tokens)."""


def smoothed_loss(margin: float, eps: float, vocab_size: int) -> float:
    """``F.cross_entropy(..., label_smoothing=eps)`` for logits whose right token is ``margin`` above the others."""
    logits = torch.zeros(1, vocab_size, dtype=torch.float64)
    logits[0, 0] = margin
    return F.cross_entropy(logits, torch.tensor([0]), label_smoothing=eps).item()


@checker(
    answer="value",
    reference=(lambda s: s["eps"] * (s["vocab_size"] - 1) / s["vocab_size"] * s["margin"])(SMOOTHED_SETUP),
)
def check_smoothed_loss(c: Checker, prediction: float) -> None:
    """Check ``prediction``, the label-smoothed loss (eps = 0.1) of a prediction that is sure and right: the
    right token's logit 20 above every other, over the 42-token vocabulary of chapter 6's dates task."""
    margin, eps, V = SMOOTHED_SETUP["margin"], SMOOTHED_SETUP["eps"], SMOOTHED_SETUP["vocab_size"]
    q_right = 1 - eps + eps / V
    entropy = -(q_right * math.log(q_right) + (V - 1) * eps / V * math.log(eps / V))  # the loss at its minimum
    mistakes = {
        0.0: "that is the loss without smoothing (the right token's probability is 1 - 8e-8). The smoothed target "
        f"is not one-hot: which tokens does it give weight to, and what is the model's log-probability of them at "
        f"a margin of {margin:g}? {_SMOOTHING}.",
        entropy: "that is the LOWEST smoothed loss, the entropy of the target q, reached when the prediction "
        f"equals q (a margin of about 5.9). At a margin of {margin:g} the model is far surer than q, and pays for "
        "it.",
        (V - 1) * margin * eps: "each wrong token's weight in the smoothed target is eps / V, not eps: together "
        "the wrong tokens hold less than eps.",
    }
    fix = (
        f"q puts eps / V on each of the {V - 1} wrong tokens, whose log-probability is about -{margin:g}, and the "
        f"right token's log-probability is about 0: the loss is about eps · (V - 1) / V · {margin:g}."
    )
    c.case(
        f"margin {margin:g}, eps={eps}, V={V}",
        lambda: prediction,
        smoothed_loss(margin, eps, V),
        bugs={value: Hint(concept, fix) for value, concept in mistakes.items()},
        hint=Hint(
            "the loss is -sum_i q_i log p_i: which q_i are not 0, and what are their log p_i when the right token "
            f"takes almost all the probability? {_SMOOTHING}.",
            fix,
        ),
        atol=0.15,
    )


# ---------------------------------------------------------------- Extend: one beam-search step for a batch


def _beam_step(scores: Tensor, logp: Tensor, k: int, *, bug: str = "") -> tuple[Tensor, Tensor, Tensor]:
    """One beam-search step for a batch, or with a bug of :data:`_BEAM_BUGS`."""
    B, n = scores.shape
    V = logp.shape[-1]
    scores = torch.zeros_like(scores) if bug == "no scores" else scores
    total = (scores[:, :, None] + logp.view(B, n, V)).view(B, n * V)  # every (beam, token) of an example
    new_scores, flat = total.topk(k, dim=-1)  # (B, k), best first
    beam, token = (flat % V, flat // V) if bug == "swapped" else (flat // V, flat % V)
    rows_per_example = {"no offset": 0, "offset k": k}.get(bug, n)
    return new_scores, torch.arange(B)[:, None] * rows_per_example + beam, token


_BEAM_CASES = (  # (name, B, n beams, k new beams, V, the beams' scores: "zero", "random" or "dead" but the first)
    ("the first step: one beam per example (n=1), B=2, k=3, V=7", 2, 1, 3, 7, "zero"),
    ("a later step: n=3 beams with their scores, B=2, k=3, V=7", 2, 3, 3, 7, "random"),
    ("the library's first step: k=3 beams, all but the first at -inf, B=2", 2, 3, 3, 7, "dead"),
    ("B=3 examples, n=2 beams, k=4 new beams, V=9", 3, 2, 4, 9, "random"),
)
_ROWS_FIX = "beam j of example b is row b * n + j: rows = torch.arange(B)[:, None] * n + index // V"
_BEAM_BUGS = {  # bug -> hint, for _beam_step(..., bug=bug)
    "no scores": Hint(
        "you ranked the extensions by the new token's log-probability alone: a beam's score is the sum over its "
        "whole prefix (reread 'Beam search').",
        "add the beams' scores to their rows: scores[:, :, None] + logp.view(B, n, V).",
    ),
    "no offset": Hint(
        "your rows number each example's beams from 0, but rows index the B·n rows of logp (and of the caches "
        "reordered with them): example after example.",
        _ROWS_FIX + ".",
    ),
    "swapped": Hint(
        "beam and token are swapped: an example's n·V candidates are the V tokens of its beam 0, then the V tokens "
        "of its beam 1, and so on.",
        "entry f of an example's row of n * V candidates is beam f // V and token f % V.",
    ),
    "offset k": Hint(
        "example b's rows come after those of the examples before it, as many per example as there are beams at "
        "this step (scores.shape[1]), which need not be k.",
        _ROWS_FIX + ", with n = scores.shape[1].",
    ),
}
_BEAM_HINT = Hint(
    "add each beam's score to its row of logp, then rank all the n·V candidates of an example together "
    "(reread 'Beam search').",
    f"view the sums as (B, n * V) and take topk(k) per example; entry f is beam f // V and token f % V, and "
    f"{_ROWS_FIX}.",
)


def _beam_cases() -> Iterator[tuple[str, dict[str, Any]]]:
    g = torch.Generator().manual_seed(8)
    for name, B, n, k, V, kind in _BEAM_CASES:
        logp = torch.randn(B * n, V, generator=g).mul(2).log_softmax(-1)
        scores = -torch.rand(B, n, generator=g).mul(3).sort(dim=-1).values if kind == "random" else torch.zeros(B, n)
        if kind == "dead":
            scores[:, 1:] = float("-inf")
        yield name, {"scores": scores, "logp": logp, "k": k}


def _beam_step_by_topk(scores: Tensor, logp: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Another way: the top k of each example's (beam, token) sums, rows numbered example after example."""
    n, V = scores.shape[1], logp.shape[-1]
    top = (scores[..., None] + logp.view(*scores.shape, -1)).flatten(1).topk(k)
    return top.values, torch.arange(len(scores))[:, None] * n + top.indices // V, top.indices % V


@checker(reference=_beam_step_by_topk)
def check_beam_step(c: Checker, beam_step: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> None:
    """Check ``beam_step(scores, logp, k) -> (new_scores, rows, tokens)``, one step of beam search for a batch:
    each example's k best one-token extensions, best first, the row of ``logp`` each extends and its token.
    Shapes: scores (B, n), logp (B n, V), rows b n ... b n + n - 1 for example b -> three (B, k)."""
    c.cases(beam_step, _beam_cases(), _beam_step, _BEAM_BUGS, hint=_BEAM_HINT)

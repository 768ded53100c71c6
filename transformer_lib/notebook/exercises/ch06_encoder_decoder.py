"""Chapter 6, encoder-decoder: ``check_teacher_forcing_loss`` (fix a training loss whose decoder reads the
source), ``check_smoothed_loss`` (a prediction: the label-smoothed loss of a sure, right prediction),
and ``check_beam_step`` (one step of beam search for a whole batch)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ...models import Seq2SeqTransformer
from ...tasks import ALPHABETS, BOS, EOS, PAD, Seq2SeqTokenizer, seq2seq_loss
from ._framework import Bug, Checker, bug_table, checker

__all__ = ["check_teacher_forcing_loss", "check_smoothed_loss", "check_beam_step"]


# ---------------------------------------------------------------- Spot the bug: a decoder that reads the source

_SOURCE_FED_FIX = "The decoder reads the target shifted right: model.decode(tgt[:, :-1], memory, src)."
_SOURCE_FED_HINT = (
    "the decoder reads the source: model.decode(src, ...) embeds the source tokens on the decoder side, so the "
    "target never enters the model and nothing is teacher-forced (its output is then cut to T positions 'so that "
    "the shapes fit'). " + _SOURCE_FED_FIX
)


def _wrong_loss(model: Seq2SeqTransformer, src: Tensor, tgt: Tensor, *, bug: str) -> Tensor:
    """The teacher-forced loss with one of the mistakes of :data:`_TEACHER_FORCING_BUGS`."""
    labels = tgt[:, 1:]
    if bug == "source fed":  # its output cut to the labels' length "so that the shapes fit"
        logits = model.decode(src, model.encode(src), src)[:, : labels.shape[1]]
    else:
        decoder_input, labels = {
            "no shift": (tgt, tgt),
            "wrong way": (tgt[:, 1:], tgt[:, :-1]),
            "labels = input": (tgt[:, :-1], tgt[:, :-1]),
            "padding counted": (tgt[:, :-1], tgt[:, 1:]),
        }[bug]
        logits = model(src, decoder_input)
    ignore_index = -100 if bug == "padding counted" else PAD
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=ignore_index)


_TEACHER_FORCING_BUGS = {  # bug -> hint, for _wrong_loss(..., bug=bug)
    "source fed": _SOURCE_FED_HINT,
    "no shift": "no shift: the decoder reads the very token it has to predict and learns to copy it. Feed "
    "tgt[:, :-1] and predict tgt[:, 1:].",
    "wrong way": "shifted the wrong way: the decoder's input starts with <bos> (tgt[:, :-1]) and the labels are "
    "the same sequence one step ahead (tgt[:, 1:]).",
    "labels = input": "the labels equal the decoder's input: position t must predict the NEXT token, tgt[:, 1:].",
    "padding counted": "the padding labels count in the loss: pass ignore_index=PAD to the cross-entropy.",
}
_TEACHER_FORCING_CASES = (  # (name, src (B, S), tgt (B, T + 1))
    (
        "sources longer than their targets (as in the dates task), padded",
        [[5, 6, 7, 8, 9, 10, 11, 3, 4], [4, 4, 9, 3, 5, 0, 0, 0, 0], [7, 8, 9, 10, 0, 0, 0, 0, 0]],
        [[BOS, 3, 4, 5, EOS], [BOS, 6, 7, 8, EOS], [BOS, 9, 10, 11, EOS]],
    ),
    (
        "targets of different lengths: their padding must not count in the loss",
        [[5, 6, 7, 8, 9, 10, 11, 3], [4, 4, 9, 3, 5, 6, 7, 0]],
        [[BOS, 3, 4, 5, 6, 7, EOS], [BOS, 8, EOS, PAD, PAD, PAD, PAD]],
    ),
    ("targets longer than their sources", [[5, 6, 7, 8], [9, 10, 0, 0]],
     [[BOS, 3, 4, 5, 6, 7, 8, EOS], [BOS, 9, 10, 11, 3, 4, 5, EOS]]),
)  # fmt: skip


def _teacher_forcing_error_hint(e: Exception) -> str:
    text = str(e)
    if "size" in text or "shape" in text or "match" in text:
        return (
            "the decoder gave fewer positions than there are labels: here the targets are longer than the sources, "
            "and a decoder fed the source, decode(src, ...), has one position per SOURCE token. " + _SOURCE_FED_FIX
        )
    return ""


@checker
def check_teacher_forcing_loss(c: Checker, teacher_forcing_loss: Callable[..., Tensor]) -> None:
    """Check ``teacher_forcing_loss(model, src, tgt)``, the teacher-forced cross-entropy of a
    :class:`~transformer_lib.Seq2SeqTransformer`: equal to ``transformer_lib.tasks.seq2seq_loss(model, (src, tgt))``.

    ``tgt`` holds ``<bos>`` (1), the target tokens, ``<eos>`` (2) and padding (0). Shapes: src (B, S),
    tgt (B, T + 1) -> a scalar.
    """
    torch.manual_seed(6)  # @checker restores the reader's random state afterwards
    V = 12
    model = Seq2SeqTransformer(V, V, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32,
                               dropout=0.0, max_len=32).eval()  # fmt: skip
    for name, src, tgt in _TEACHER_FORCING_CASES:
        src, tgt = torch.tensor(src), torch.tensor(tgt)
        with torch.no_grad():
            expected = seq2seq_loss(model, (src, tgt))
        c.case(
            name,
            lambda model, src, tgt: teacher_forcing_loss(model, src, tgt),
            expected,
            bugs=bug_table(_TEACHER_FORCING_BUGS, _wrong_loss, model, src, tgt),
            hint="encode the source once, decode the target shifted right, tgt[:, :-1], and compare the logits "
            "with tgt[:, 1:], ignoring padding: F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), "
            "ignore_index=PAD).",
            error_hint=_teacher_forcing_error_hint,
            atol=1e-4,
            inputs={"model": model, "src": src, "tgt": tgt},
        )


# ---------------------------------------------------------------- Predict, then run: a sure prediction, smoothed

SMOOTHED_SETUP = {"margin": 20.0, "eps": 0.1, "vocab_size": Seq2SeqTokenizer(ALPHABETS["dates"]).vocab_size}
"""The exercise's prediction: the right token's logit ``margin`` above all the others (every other logit
equal), label smoothing ``eps``, over the vocabulary of the dates task (42 tokens)."""


def smoothed_loss(margin: float, eps: float, vocab_size: int) -> float:
    """``F.cross_entropy(..., label_smoothing=eps)`` for logits whose right token is ``margin`` above the others.

    About eps (V - 1) / V · margin for a large margin: each of the V - 1 wrong tokens gets eps / V of the target
    and a log-probability of about -margin.
    """
    logits = torch.zeros(1, vocab_size, dtype=torch.float64)
    logits[0, 0] = margin
    return F.cross_entropy(logits, torch.tensor([0]), label_smoothing=eps).item()


@checker(answer="value")
def check_smoothed_loss(c: Checker, prediction: float) -> None:
    """Check ``prediction``, the label-smoothed loss (eps = 0.1) of a prediction that is sure and right: the
    right token's logit 20 above every other, over the 42-token vocabulary of chapter 6's dates task."""
    margin, eps, V = SMOOTHED_SETUP["margin"], SMOOTHED_SETUP["eps"], SMOOTHED_SETUP["vocab_size"]
    expected = smoothed_loss(margin, eps, V)
    q_right = 1 - eps + eps / V
    entropy = -(q_right * math.log(q_right) + (V - 1) * eps / V * math.log(eps / V))  # the loss at its minimum
    c.case(
        f"margin {margin:g}, eps={eps}, V={V}",
        lambda: prediction,
        expected,
        bugs=(
            Bug(
                lambda: 0.0,
                "that is the loss without smoothing (the right token's probability is 1 - 8e-8). The smoothed "
                f"target also puts eps / V on each of the {V - 1} wrong tokens, whose log-probability here is "
                f"about -{margin:g}.",
            ),
            Bug(
                lambda: entropy,
                "that is the LOWEST smoothed loss, the entropy of the target q, reached when the prediction equals q "
                "(a margin of about 5.9). At a margin of 20 the model is far surer than q, and pays for it.",
            ),
            Bug(
                lambda: (V - 1) * margin * eps,
                f"each wrong token costs its target weight times {margin:g}, and that weight is eps / V, not eps: "
                "together the wrong tokens hold eps (V - 1) / V of the target.",
            ),
        ),
        hint=f"the loss is -sum_i q_i log p_i with q_i = eps / V for the {V - 1} wrong tokens. Their log-probability "
        f"is about -{margin:g} (the right token takes almost all the probability), and the right token's is about "
        f"0: the loss is about eps · (V - 1) / V · {margin:g}.",
        atol=0.15,
    )


# ---------------------------------------------------------------- Extend: one beam-search step for a batch


def _beam_step(scores: Tensor, logp: Tensor, k: int, *, bug: str = "") -> tuple[Tensor, Tensor, Tensor]:
    """One beam-search step for a batch, or with a classic bug: "no scores" ranks by the new token's
    log-probability alone, "no offset" numbers the rows j instead of b n + j, "offset k" b k + j, and "swapped"
    swaps beam and token. Shapes: scores (B, n), logp (B n, V) -> three (B, k)."""
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
    ("the library's first step: k=3 beams, only the first alive (the others -inf), B=2", 2, 3, 3, 7, "dead"),
    ("B=3 examples, n=2 beams, k=4 new beams, V=9", 3, 2, 4, 9, "random"),
)
_BEAM_BUGS = {  # bug -> hint, for _beam_step(..., bug=bug)
    "no scores": "you ranked the extensions by the new token's log-probability alone: a beam's score is the sum "
    "over its whole prefix, scores[b, j] + logp[row, token].",
    "no offset": "rows index the B n rows of logp (and of the caches, reordered with index_select): beam j of "
    "example b is row b * n + j, not j.",
    "swapped": "beam and token are swapped: in the row of n * V candidates of an example, entry f is beam f // V "
    "and token f % V.",
}


@checker
def check_beam_step(c: Checker, beam_step: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> None:
    """Check ``beam_step(scores, logp, k) -> (new_scores, rows, tokens)``, one step of beam search for a batch.

    ``scores`` (B, n) are the cumulative log-probabilities of the n live beams of each example (-inf for a dead
    one); ``logp`` (B n, V) the next-token log-probabilities the decoder gave for them, the rows of example b
    being b n ... b n + n - 1. For each example, the ``k`` best one-token extensions, best first:
    ``new_scores`` (B, k), ``rows`` (B, k) the row of ``logp`` each one extends, ``tokens`` (B, k) its token.
    """
    g = torch.Generator().manual_seed(8)
    for name, B, n, k, V, kind in _BEAM_CASES:
        logp = torch.randn(B * n, V, generator=g).mul(2).log_softmax(-1)
        if kind == "zero":
            scores = torch.zeros(B, n)
        elif kind == "dead":
            scores = torch.full((B, n), float("-inf"))
            scores[:, 0] = 0.0
        else:
            scores = -torch.rand(B, n, generator=g).mul(3).sort(dim=-1).values  # best beam first
        offset_k = (
            f"example b's beams are the rows b * n ... of logp, with n = {n} beams per example at this step "
            f"(scores.shape[1]), not k = {k}."
        )
        c.case(
            name,
            lambda scores, logp, k: beam_step(scores, logp, k),
            _beam_step(scores, logp, k),
            bugs=bug_table({**_BEAM_BUGS, "offset k": offset_k}, _beam_step, scores, logp, k),
            hint="add each beam's score to its row of logp, view the result as (B, n * V), take topk(k) per example; "
            "entry f is beam f // V and token f % V, and beam j of example b is row b * n + j.",
            inputs={"scores": scores, "logp": logp, "k": k},
        )

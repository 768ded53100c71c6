"""Chapter 6's checkers: a teacher-forced loss, the label-smoothed loss of a sure prediction and one beam-search
step accept right answers and name the classic mistakes (the decoder fed the source, the shift missing or the
wrong way, padding counted, smoothing forgotten, scores not accumulated, beam and token swapped, rows without
the example's offset)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import ch06_encoder_decoder as ch06
from transformer_lib.tasks import ALPHABETS, PAD, Seq2SeqTokenizer, seq2seq_loss

# ---------------------------------------------------------------- Spot the bug: a decoder that reads the source


def learner_loss(model, src, tgt, *, bug: str = ""):
    """A learner's teacher-forced loss, right or with one of the classic mistakes."""
    memory = model.encode(src)
    T = tgt.shape[1] - 1
    decoder_input, labels = {
        "source fed": (src, tgt[:, 1:]),  # the starter cell
        "no shift": (tgt, tgt),
        "wrong way": (tgt[:, 1:], tgt[:, :-1]),
        "labels = input": (tgt[:, :-1], tgt[:, :-1]),
    }.get(bug, (tgt[:, :-1], tgt[:, 1:]))
    logits = model.decode(decoder_input, memory, src)
    if bug == "source fed":
        logits = logits[:, :T]  # "so that the shapes fit"
    ignore = -100 if bug == "padding counted" else PAD
    return F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=ignore)


def test_teacher_forcing_loss_accepts_the_fix_and_the_library():
    for answer in (learner_loss, lambda model, src, tgt: seq2seq_loss(model, (src, tgt))):
        result = ex.check_teacher_forcing_loss(answer)
        assert result.passed and result.text.count("✅") == 3, result.text


def test_teacher_forcing_loss_names_the_source_fed_decoder():
    result = ex.check_teacher_forcing_loss(lambda *args: learner_loss(*args, bug="source fed"))
    assert not result.passed and "3 of 3 checks failed" in result.text
    assert result.text.count("the decoder reads the source: model.decode(src, ...)") == 2, result.text
    assert "raised RuntimeError" in result.text and "one position per SOURCE token" in result.text  # T > S: a crash


@pytest.mark.parametrize(
    "bug, words, count",
    [
        ("no shift", "no shift: the decoder reads the very token", 3),
        ("wrong way", "shifted the wrong way", 3),
        ("labels = input", "the labels equal the decoder's input", 3),
        ("padding counted", "the padding labels count in the loss", 1),  # only the case with padded targets
    ],
)
def test_teacher_forcing_loss_names_each_shift_mistake(bug, words, count):
    result = ex.check_teacher_forcing_loss(lambda *args: learner_loss(*args, bug=bug))
    assert not result.passed and result.text.count(words) == count, result.text


def test_teacher_forcing_loss_survives_odd_answers():
    def stub(model, src, tgt): ...  # your code here

    assert ex.check_teacher_forcing_loss(stub).status == "unanswered"
    for answer in (lambda *a: None, lambda *a: 1 / 0, lambda model, src, tgt: model(src, tgt), 3.0):
        assert not ex.check_teacher_forcing_loss(answer).passed


def test_teacher_forcing_loss_fails_an_answer_that_changes_the_target():
    def shifting_in_place(model, src, tgt):
        loss = seq2seq_loss(model, (src, tgt))
        tgt[:, 0] = PAD
        return loss

    result = ex.check_teacher_forcing_loss(shifting_in_place)
    assert result.text.count("your function changed its input in place (tgt)") == 3, result.text


# ---------------------------------------------------------------- Predict, then run: a sure prediction, smoothed


def test_smoothed_loss_is_eps_times_the_margin_over_the_wrong_tokens():
    margin, eps, V = (ch06.SMOOTHED_SETUP[k] for k in ("margin", "eps", "vocab_size"))
    assert V == Seq2SeqTokenizer(ALPHABETS["dates"]).vocab_size == 42
    assert math.isclose(ch06.smoothed_loss(margin, eps, V), eps * (V - 1) / V * margin, rel_tol=1e-6)


def test_smoothed_loss_checker():
    assert ex.check_smoothed_loss(2.0).passed and ex.check_smoothed_loss(torch.tensor(1.9)).passed
    unsmoothed = ex.check_smoothed_loss(0)
    assert not unsmoothed.passed and "that is the loss without smoothing" in unsmoothed.text
    minimum = ex.check_smoothed_loss(0.68)
    assert not minimum.passed and "that is the LOWEST smoothed loss" in minimum.text
    eps_per_token = ex.check_smoothed_loss(41 * 20 * 0.1)
    assert not eps_per_token.passed and "that weight is eps / V, not eps" in eps_per_token.text
    other = ex.check_smoothed_loss(5.0)
    assert not other.passed and "the loss is about eps · (V - 1) / V · 20" in other.text
    assert ex.check_smoothed_loss(...).status == "unanswered"
    assert not ex.check_smoothed_loss("2").passed


# ---------------------------------------------------------------- Extend: one beam-search step for a batch


def learner_beam_step(scores, logp, k, *, bug: str = ""):
    """A learner's beam step, right or with one of the classic mistakes."""
    B, n = scores.shape
    V = logp.shape[-1]
    prefix = torch.zeros_like(scores) if bug == "no scores" else scores
    candidates = (prefix[:, :, None] + logp.view(B, n, V)).reshape(B, n * V)
    new_scores, index = candidates.topk(k, dim=-1)
    beam, token = (index % V, index // V) if bug == "swapped" else (index // V, index % V)
    offset = {"no offset": 0, "offset k": k}.get(bug, n)
    return new_scores, torch.arange(B)[:, None] * offset + beam, token


def reference_beam_step(scores, logp, k):
    """One step for each example and each beam in Python loops, as beam_by_hand does it for one source."""
    B, n = scores.shape
    V = logp.shape[-1]
    out = []
    for b in range(B):
        candidates = [
            (scores[b, j].item() + logp[b * n + j, t].item(), b * n + j, t) for j in range(n) for t in range(V)
        ]
        out.append(sorted(candidates, key=lambda c: -c[0])[:k])
    return (
        torch.tensor([[c[0] for c in row] for row in out]),
        torch.tensor([[c[1] for c in row] for row in out]),
        torch.tensor([[c[2] for c in row] for row in out]),
    )


def test_beam_step_accepts_a_vectorized_and_a_looped_answer():
    for answer in (learner_beam_step, reference_beam_step):
        result = ex.check_beam_step(answer)
        assert result.passed and result.text.count("✅") == 4, result.text


@pytest.mark.parametrize(
    "bug, words, count",
    [
        ("no scores", "you ranked the extensions by the new token's log-probability alone", 3),  # not at n=1
        ("swapped", "beam and token are swapped", 4),
        ("no offset", "beam j of example b is row b * n + j, not j", 4),
        ("offset k", "with n = ", 2),  # only where n != k
    ],
)
def test_beam_step_names_each_bug(bug, words, count):
    result = ex.check_beam_step(lambda *args: learner_beam_step(*args, bug=bug))
    assert not result.passed and result.text.count(words) == count, result.text


def test_beam_step_survives_odd_answers():
    def stub(scores, logp, k): ...  # your code here

    assert ex.check_beam_step(stub).status == "unanswered"
    for answer in (lambda *a: None, lambda *a: 1 / 0, lambda scores, logp, k: scores.topk(k), "beam"):
        assert not ex.check_beam_step(answer).passed

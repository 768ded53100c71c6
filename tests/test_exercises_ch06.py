"""Chapter 6's checkers: greedy decoding for a batch, the label-smoothed loss of a sure prediction and one
beam-search step accept right answers and name the classic mistakes (the batch stopped at its first <eos>, no
padding after a row's <eos>, smoothing forgotten, scores not accumulated, beam and token swapped, rows without
the example's offset), in two levels: the concept in the feedback, the fix only from ``check_x.hint()``."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import diagnosis
from transformer_lib import decoding
from transformer_lib.decoding import greedy_decode
from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import ch06_encoder_decoder as ch06
from transformer_lib.tasks import ALPHABETS, BOS, EOS, PAD, Seq2SeqTokenizer

# ---------------------------------------------------------------- Spot the bug: greedy decoding for a batch


def the_starter():
    """The exercise's starter function, as the notebook defines it."""
    namespace = {"torch": torch, "BOS": BOS, "EOS": EOS, "PAD": PAD}
    exec(ch06.GREEDY_STARTER, namespace)
    return namespace["greedy_batch"]


@torch.no_grad()
def learner_greedy(model, src, max_len, *, bug: str = ""):
    """A learner's batched greedy decoding with a cache, right or with one of the classic mistakes."""
    memory = model.encode(src)
    caches = model.new_caches()
    ys = torch.full((src.shape[0], 1), BOS)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        next_id = model.decode(ys[:, -1:], memory, src, caches=caches)[:, -1].argmax(-1)
        if bug != "no padding":
            next_id = next_id.masked_fill(done, PAD)
        ys = torch.cat([ys, next_id[:, None]], dim=1)
        done |= next_id == EOS
        if bug != "never stops" and done.all():
            break
    return ys


def test_greedy_batch_accepts_the_fix_and_the_librarys_loop():
    for answer in (
        learner_greedy,
        lambda model, src, max_len: decoding._greedy(model, src, max_len, BOS, EOS, PAD, False),
    ):
        result = ex.check_greedy_batch(answer)
        assert result.passed and result.text.count("✅") == 4, result.text


def test_the_stand_in_model_decodes_like_a_seq2seq_model_with_and_without_a_cache():
    model, src = ch06._CopyModel(), torch.tensor([[5, 6, 7], [8, 0, 0]])
    out = decoding._greedy(model, src, 6, BOS, EOS, PAD, False)
    assert out.tolist() == [[BOS, 5, 6, 7, EOS], [BOS, 8, EOS, PAD, PAD]]
    torch.testing.assert_close(decoding._greedy(model, src, 6, BOS, EOS, PAD, True), out)
    assert ch06._greedy_batch(model, src, 6).tolist() == out.tolist()


def test_greedy_batch_an_untouched_starter_is_not_answered_yet():
    assert ex.check_greedy_batch(the_starter()).status == "unanswered"


def test_greedy_batch_the_starter_is_right_when_every_row_ends_at_the_same_step(capsys):
    starter = the_starter()
    result = ex.check_greedy_batch(lambda *args: starter(*args))
    assert "✅ a batch of one source" in result.text and "✅ 3 sources of one length" in result.text, result.text
    hint = ch06._GREEDY_BUGS["first eos"]
    assert result.text.count("❌") == 2 and diagnosis(result).count(hint.concept) == 1, result.text
    assert "masked_fill" not in result.text and result.fixes == [hint.fix]
    capsys.readouterr()
    ex.check_greedy_batch.hint()
    assert "done.all()" in capsys.readouterr().out


@pytest.mark.parametrize(
    "bug, words",
    [
        ("no padding", "a finished row keeps writing after its <eos>"),
        ("never stops", "your loop always runs max_len steps"),
    ],
)
def test_greedy_batch_names_each_bug(bug, words):
    result = ex.check_greedy_batch(lambda *args: learner_greedy(*args, bug=bug))
    assert not result.passed and diagnosis(result).count(words) == 1, result.text
    assert "masked_fill" not in result.text and "done.all()" not in result.text  # the fix is level 2


def test_greedy_batch_refuses_the_librarys_decoder():
    result = ex.check_greedy_batch(
        lambda model, src, max_len: greedy_decode(model, src, max_len, bos_id=BOS, eos_id=EOS)
    )
    assert not result.passed and "your answer calls greedy_decode" in result.text, result.text


def test_greedy_batch_survives_odd_answers():
    def stub(model, src, max_len): ...  # your code here

    assert ex.check_greedy_batch(stub).status == "unanswered"
    for answer in (lambda *a: None, lambda *a: 1 / 0, lambda model, src, max_len: src, "greedy"):
        assert not ex.check_greedy_batch(answer).passed


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
    assert not eps_per_token.passed and "weight in the smoothed target is eps / V, not eps" in eps_per_token.text
    other = ex.check_smoothed_loss(5.0)
    assert not other.passed and "which q_i are not 0" in other.text
    for result in (unsmoothed, minimum, eps_per_token, other):  # the formula only from check_smoothed_loss.hint()
        assert "(V - 1) / V · 20" not in result.text and "(V - 1) / V · 20" in result.fixes[0], result.text
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
        ("no offset", "your rows number each example's beams from 0", 4),
        ("offset k", "which need not be k", 2),  # only where n != k
    ],
)
def test_beam_step_names_each_bug(bug, words, count):
    result = ex.check_beam_step(lambda *args: learner_beam_step(*args, bug=bug))
    assert not result.passed and result.text.count("❌") == count and result.text.count(words) == 1, result.text
    assert "b * n + j" not in result.text and "f // V" not in result.text  # the fixes are level 2


def test_beam_step_survives_odd_answers():
    def stub(scores, logp, k): ...  # your code here

    assert ex.check_beam_step(stub).status == "unanswered"
    for answer in (lambda *a: None, lambda *a: 1 / 0, lambda scores, logp, k: scores.topk(k), "beam"):
        assert not ex.check_beam_step(answer).passed

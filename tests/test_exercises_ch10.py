"""Chapter 10's checkers: the predicted share of windows with no selected position (compared with windows masked by
the library), an encoder's pseudo-log-likelihood of a sequence and a decoder-only model's last real vectors accept
right answers, call an untouched starter "not answered yet", and name the classic mistakes ([CLS] counted, the
token left visible, every position masked at once, the padding read as the last token): the concept by default, the
fix in code only on request."""

from __future__ import annotations

import functools

import pytest
import torch

from conftest import diagnosis
from transformer_lib import GPT, GPTConfig
from transformer_lib.mlm import IGNORE_INDEX, mask_tokens
from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import ch10_encoder_only as ch10

# ---------------------------------------------------------------- windows with nothing to predict (a prediction)


def test_empty_share_equals_windows_masked_by_the_library():
    n = ch10.EMPTY_SETUP["n_positions"]
    ids = torch.cat([torch.ones(40_000, 1, dtype=torch.long), torch.randint(3, 31, (40_000, n))], dim=1)  # [CLS] = 1
    _, labels = mask_tokens(ids, 2, 31, p=ch10.EMPTY_SETUP["p"], special_ids=(0, 1), generator=torch.Generator())
    measured = (labels == IGNORE_INDEX).all(dim=1).float().mean().item()
    expected = ch10.empty_share(**ch10.EMPTY_SETUP)
    assert abs(measured - expected) < 0.006  # 4 standard deviations of a share near 0.087 over 40,000 windows
    assert abs(measured - ch10.empty_share(ch10.EMPTY_SETUP["p"], n + 1)) > 0.01  # [CLS] counted: told apart


@pytest.mark.parametrize(
    "answer, says",
    [(0.85**16, "[CLS] is never selected"), (1 - 0.15 * 15, "not exclusive"), (1 - 0.85**15, "at least one")],
)
def test_empty_windows_names_the_classic_mistakes(answer, says):
    result = ex.check_empty_windows(answer)
    assert not result.passed and says in result.text and "0.85" not in result.text.split("Hint:")[1]
    assert ex.check_empty_windows(0.087).passed


# ---------------------------------------------------------------- pseudo-log-likelihood


def pll_by_loop(logits_fn, ids, mask_id):
    """One forward pass per position, each with that position masked."""
    total = 0.0
    for t in range(1, len(ids)):
        masked = ids.clone()
        masked[t] = mask_id
        total = total + logits_fn(masked[None])[0, t].log_softmax(-1)[ids[t]]
    return total


def test_pll_reference_equals_a_loop_and_each_bug_differs():
    torch.manual_seed(0)
    model = ch10._TinyMaskedLM(12, 7).eval()
    ids = torch.tensor([1, 5, 7, 3, 11, 4, 9])
    with torch.no_grad():
        right = ch10._pseudo_log_likelihood(model, ids, 2)
        torch.testing.assert_close(right, pll_by_loop(model, ids, 2))
        for bug in ch10._PLL_BUGS:
            assert abs(ch10._pseudo_log_likelihood(model, ids, 2, bug=bug) - right) > 0.05, bug


@pytest.mark.parametrize("bug", list(ch10._PLL_BUGS))
def test_pll_checker_names_each_bug_without_its_fix(bug):
    result = ex.check_pseudo_log_likelihood(functools.partial(ch10._pseudo_log_likelihood, bug=bug))
    hint = ch10._PLL_BUGS[bug]
    assert not result.passed and hint.concept in result.text and hint.fix not in result.text
    assert result.fixes == [hint.fix]


def test_pll_checker_accepts_a_loop_and_refuses_the_starter():
    assert ex.check_pseudo_log_likelihood(pll_by_loop).passed
    assert ex.check_pseudo_log_likelihood(...).status == "unanswered"


# ---------------------------------------------------------------- a GPT as a classifier (spot the bug)


def starter_last_vectors(hidden, attention_mask):  # find and fix the bug
    return hidden[:, -1]  # (B, d_model): the last position has read the whole sequence


def test_the_starter_as_given_is_not_answered_and_a_retyped_one_is_named():
    namespace: dict = {}
    exec(ch10._LAST_STARTER, namespace)
    assert ex.check_last_vectors(namespace["last_vectors"]).status == "unanswered"
    result = ex.check_last_vectors(starter_last_vectors)  # another function object with the same code
    assert result.status == "unanswered" or ch10._LAST_BUGS["last position"].concept in result.text


@pytest.mark.parametrize("bug", list(ch10._LAST_BUGS))
def test_last_vectors_checker_names_each_bug_without_its_fix(bug):
    result = ex.check_last_vectors(functools.partial(ch10._last_vectors, bug=bug))
    hint = ch10._LAST_BUGS[bug]
    assert not result.passed and hint.concept in diagnosis(result) and hint.fix not in result.text


def test_the_last_real_vector_is_what_a_gpt_computes_for_the_unpadded_text():
    """The reason for the exercise: under a causal mask, a row's output at its last real token equals the one the
    model gives the text alone, while the last column of a right-padded row (the starter's pick) does not."""
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=20, block_size=8, n_layers=2, n_heads=2, d_model=16)).eval()
    ids = torch.tensor([[3, 4, 5, 6, 7, 8], [3, 4, 5, 0, 0, 0]])
    attention_mask = (torch.arange(6) < torch.tensor([6, 3])[:, None]).long()
    with torch.no_grad():
        out = gpt.logits(ids, attention_mask=attention_mask.bool())  # (B, T, vocab_size)
        alone = gpt.logits(ids[1:, :3])  # the short text without padding
    torch.testing.assert_close(ch10._last_vectors(out, attention_mask)[1], alone[0, -1])
    assert not torch.allclose(out[1, -1], alone[0, -1], atol=1e-3)

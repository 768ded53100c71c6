"""Chapter 1's checkers: the much-copied softmax (global maximum, sum over axis 0), the spread of the scores of
unscaled random projections, and attention by distance accept right answers and name the classic mistakes."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_lib as tl
from conftest import diagnosis
from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import ch01_attention

# ---------------------------------------------------------------- Spot the bug: the much-copied softmax


def snippet(scores):  # the exercise's starter: the StackOverflow softmax, ported to PyTorch
    e = torch.exp(scores - scores.max())
    return e / e.sum(dim=0)


def fixed_but_renamed(scores):  # a changed answer with both bugs still in it
    exps = torch.exp(scores - scores.max())
    return exps / exps.sum(dim=0)


def fixed(scores):
    e = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


@pytest.mark.parametrize(
    "shortcut",
    [
        lambda s: torch.softmax(s, dim=-1),
        lambda s: s.softmax(-1),
        lambda s: torch.nn.functional.softmax(s, -1),
        lambda s: torch.nn.Softmax(-1)(s),
        lambda s: torch.special.softmax(s, -1),
        lambda s: torch.log_softmax(s, -1).exp(),
    ],
)
def test_softmax_accepts_the_fix_and_refuses_torchs_softmax(shortcut):
    assert ex.check_softmax(fixed).passed
    result = ex.check_softmax(shortcut)
    assert not result.passed and result.text.count("✅") == 6, result.text  # right values, but not the exercise
    assert "❌ fixed by hand, without torch's softmax: your answer calls " in result.text


def test_softmax_names_both_bugs_of_the_snippet():
    result = ex.check_softmax(fixed_but_renamed)
    assert not result.passed and "✅ the snippet's own example" in result.text  # right on one row ...
    assert result.text.count("❌") == 5  # ...
    assert diagnosis(result).count("Two bugs: the sum runs over axis 0") == 1  # ... both bugs named, once, when asked
    assert 'Hint: "3 queries over 4 keys: scores (3, 4)" fails where "the snippet\'s own example' in result.text
    assert result.fixes == [
        "sum over the last axis, keeping it: e.sum(dim=-1, keepdim=True); and subtract each "
        "row's own maximum, scores.max(dim=-1, keepdim=True).values."
    ]
    assert "keepdim" not in result.text  # the fix in code only when asked for


def cell(source):
    """The function a notebook cell of ``source`` defines (compiled as a cell is, without this file's imports)."""
    namespace = {"torch": torch}
    exec(compile(source, "<cell>", "exec", dont_inherit=True), namespace)
    return next(v for k, v in namespace.items() if callable(v) and k != "torch")


def test_softmax_calls_the_untouched_starter_not_answered_yet():
    starter = ch01_attention.SOFTMAX_STARTER
    assert ex.check_softmax(cell(starter)).status == "unanswered"
    assert ex.check_softmax(cell(starter.replace("# find and fix the bugs", "# TODO"))).status == "unanswered"
    assert ex.check_softmax(cell(starter.replace("dim=0", "dim=-1"))).status == "failed"  # tried: graded


@pytest.mark.parametrize(
    "answer, words, count",
    [
        (  # the axis fixed, the global maximum kept: only rows far below the maximum break
            lambda s: torch.exp(s - s.max()) / torch.exp(s - s.max()).sum(dim=-1, keepdim=True),
            "the maximum you subtract is the maximum of the WHOLE tensor",
            1,
        ),
        (  # the maximum fixed, the axis kept
            lambda s: (e := torch.exp(s - s.max(-1, keepdim=True).values)) / e.sum(dim=0, keepdim=True),
            "the sum runs over axis 0",
            5,
        ),
        (lambda s: s.exp() / s.exp().sum(-1, keepdim=True), "overflows to inf", 1),  # no maximum subtracted
        (lambda s: torch.exp(s - s.max()) / torch.exp(s - s.max()).sum(), "Two bugs: the sum adds every entry", 5),
        (lambda s: fixed(s).transpose(-2, -1) if s.dim() > 1 else fixed(s), "", 5),  # no hint needed, must fail
    ],
    ids=["global max", "axis 0", "no max", "sum of everything", "transposed"],
)
def test_softmax_names_each_bug(answer, words, count):
    result = ex.check_softmax(answer)
    assert not result.passed
    assert result.text.count("❌") == count, result.text
    assert words in diagnosis(result), result.text


def test_softmax_without_keepdim_gets_a_hint_whether_it_raises_or_not():
    def no_keepdim(scores):
        e = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
        return e / e.sum(dim=-1)

    result = ex.check_softmax(no_keepdim)
    assert "raised RuntimeError" in result.text and "the row sums do not broadcast" in diagnosis(result)  # (3, 4)
    assert "the row sums lost their axis" in diagnosis(result)  # the square (4, 4) case runs, silently wrong
    assert "keep the summed axis: e.sum(dim=-1, keepdim=True)" in result.fixes and "keepdim" not in result.text


def test_softmax_survives_a_stub_and_a_crash():
    assert ex.check_softmax(lambda scores: None).status == "unanswered"  # compiles like a stub
    assert ex.check_softmax(lambda scores: "weights").text.count("❌") == 6  # a wrong type
    crashed = ex.check_softmax(lambda scores: 1 / 0)
    assert not crashed.passed and "raised ZeroDivisionError" in crashed.text
    assert ex.check_softmax(...).status == "unanswered"


# ---------------------------------------------------------------- Predict, then run: the spread of the scores


def test_score_std_matches_a_measurement():
    setup = ch01_attention.SCORE_STD_SETUP
    expected = ch01_attention.score_std(**setup)
    g = torch.Generator().manual_seed(0)
    d_model, d_k = setup["d_model"], setup["d_k"]
    stds = []
    for _ in range(10):  # the spread depends on the draw of W: average a few
        x, x_other = torch.randn(1000, d_model, generator=g), torch.randn(1000, d_model, generator=g)
        W_q, W_k = torch.randn(d_model, d_k, generator=g), torch.randn(d_model, d_k, generator=g)
        stds.append(((x @ W_q) @ (x_other @ W_k).T / math.sqrt(d_k)).std().item())
    assert expected == d_model
    assert sum(stds) / len(stds) == pytest.approx(expected, rel=0.03)


@pytest.mark.parametrize("prediction", [64, 64.0, 60, torch.tensor(66.0)])
def test_score_std_accepts_a_reasoned_prediction(prediction):
    assert ex.check_score_std(prediction).passed


@pytest.mark.parametrize(
    "prediction, words",
    [
        (1, "1 is the chapter's answer"),
        (8, "sqrt(d_model) = 8 is the std of one entry"),
        (256, "before the division by sqrt(d_k)"),
        (4096, "that is the variance"),
        (20, "apply the argument of 'Why divide by √d_k? Measure it' twice"),
    ],
)
def test_score_std_explains_a_wrong_prediction(prediction, words):
    result = ex.check_score_std(prediction)
    assert not result.passed and words in result.text, result.text
    assert "expected 64 (within 6.4)" in result.text
    assert "standard deviation of d_model" not in result.text  # the derivation only when asked for


def test_score_std_refuses_odd_answers_without_raising():
    assert ex.check_score_std(...).status == "unanswered"
    assert not ex.check_score_std("64").passed
    assert not ex.check_score_std(True).passed
    assert not ex.check_score_std(lambda: 64).passed


# ---------------------------------------------------------------- Extend: attention by distance


def expanded(q, k, v, temperature=1.0):
    """||q||² - 2 q·k + ||k||², a matrix product: rounds differently from the direct differences."""
    d2 = (q * q).sum(-1, keepdim=True) - 2 * q @ k.transpose(-2, -1) + (k * k).sum(-1)[..., None, :]
    w = torch.softmax(-d2 / temperature, dim=-1)
    return w @ v, w


def test_distance_attention_accepts_right_answers():
    assert ex.check_distance_attention(expanded).passed
    assert ex.check_distance_attention(ch01_attention.reference_distance_attention).passed


def test_distance_attention_is_dot_product_attention_for_keys_of_one_length():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 3, 8, generator=g), torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 4, generator=g)
    k = k / k.norm(dim=-1, keepdim=True)
    out, w = ch01_attention.reference_distance_attention(q, k, v, temperature=0.5)
    lib_out, lib_w = tl.scaled_dot_product_attention(q, k, v, scale=2 / 0.5)  # temperature tau / 2
    torch.testing.assert_close((out, w), (lib_out, lib_w))


def _with_scores(scores_of, dim=-1):
    def answer(q, k, v, temperature=1.0):
        w = torch.softmax(scores_of(q, k, temperature), dim=dim)
        return w @ v, w

    return answer


@pytest.mark.parametrize(
    "answer, words",
    [
        (_with_scores(lambda q, k, t: torch.cdist(q, k) ** 2 / t), "the FARTHEST key wins"),
        (_with_scores(lambda q, k, t: -torch.cdist(q, k) / t), "minus the SQUARED distance"),
        (_with_scores(lambda q, k, t: -(torch.cdist(q, k) ** 2) * t), "your temperature multiplies the scores"),
        (_with_scores(lambda q, k, t: q @ k.transpose(-2, -1) / t), "those are dot-product scores"),
        (_with_scores(lambda q, k, t: -(torch.cdist(q, k) ** 2) / t, dim=-2), "runs over the queries"),
    ],
    ids=["plus", "not squared", "times temperature", "dot product", "wrong axis"],
)
def test_distance_attention_names_each_bug(answer, words):
    result = ex.check_distance_attention(answer)
    assert not result.passed and result.text.count("❌") >= 3  # at least every case where it differs
    assert result.text.count(words) == 1, result.text  # named once
    assert "q[..., :, None, :]" not in result.text and "dim=-1" not in result.text  # no code of the fix


@pytest.mark.filterwarnings("ignore:The use of `x.T`")
def test_distance_attention_hints_at_k_T_only_when_k_T_raised():
    def uses_dot_T(q, k, v, temperature=1.0):
        d2 = (q * q).sum(-1, keepdim=True) - 2 * q @ k.T + (k * k).sum(-1)
        w = torch.softmax(-d2 / temperature, dim=-1)
        return w @ v, w

    result = ex.check_distance_attention(uses_dot_T)
    assert "✅ one query" in result.text and "✅ 3 queries" in result.text  # right without a batch
    assert result.text.count("❌") == 2 and result.text.count("k.T reverses ALL the axes") == 1, result.text
    assert result.fixes == ["use k.transpose(-2, -1) (or k.mT), which swaps only the last two."]

    def raises(q, k, v, temperature=1.0):
        raise ValueError("something else went wrong")

    other = ex.check_distance_attention(raises)
    assert "raised ValueError: something else went wrong" in other.text
    assert "k.T" not in other.text and other.text.count("check each step's shapes") == 1

    def no_new_axes(q, k, v, temperature=1.0):  # a shape error that k.T did not cause
        w = torch.softmax(-(q - k).pow(2).sum(-1) / temperature, dim=-1)
        return w @ v, w

    shapes = ex.check_distance_attention(no_new_axes)
    assert not shapes.passed and "k.T" not in shapes.text and "q[..., :, None, :]" not in shapes.text
    assert any("q[..., :, None, :] - k[..., None, :, :]" in fix for fix in shapes.fixes)


def test_distance_attention_survives_a_stub():
    assert ex.check_distance_attention(lambda q, k, v, temperature=1.0: None).status == "unanswered"
    assert ex.check_distance_attention(lambda q, k, v, temperature=1.0: (q, None)).text.count("❌") == 4
    assert "raised" in ex.check_distance_attention(lambda q, k, v, temperature=1.0: q @ v).text
    assert ex.check_distance_attention(...).status == "unanswered"

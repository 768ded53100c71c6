"""Chapter 5's checkers: a tutorial's LayerNorm module, a Pre-LN layer with residual dropout, the residual stream's
growth and BatchNorm's running statistics accept right answers and name the classic mistakes (unbiased std, eps
outside the root, one gain for all features, dropout on the residual stream itself, Post-LN, norms added instead of
squares, BatchNorm's momentum backwards, the biased running variance), in two levels: the concept in the feedback,
the fix only from ``check_x.hint()``. An untouched Spot the bug starter is not answered yet."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import diagnosis
from transformer_lib.norms import LayerNorm
from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import ch05_norms_and_residuals as ch05

# ---------------------------------------------------------------- Spot the bug: a tutorial's LayerNorm module


def tutorial_layer_norm(
    features: int | None = None, *, scalar: bool = True, unbiased: bool = True, outside: bool = True
):
    """The video tutorial's LayerNormalization class (``scalar``: one gain and shift; ``unbiased`` std; eps
    ``outside`` the root), with any of its three bugs fixed."""

    class LayerNormalization(nn.Module):
        def __init__(self, *args, eps: float = 10**-6) -> None:
            super().__init__()
            if scalar and args:
                raise TypeError("__init__() takes 1 positional argument but 2 were given")
            size = 1 if scalar else args[0]
            self.eps = eps
            self.alpha = nn.Parameter(torch.ones(size))
            self.bias = nn.Parameter(torch.zeros(size))

        def forward(self, x):
            centred = x - x.mean(dim=-1, keepdim=True)
            var = centred.var(dim=-1, keepdim=True, unbiased=unbiased)
            scale = var.sqrt() + self.eps if outside else torch.sqrt(var + self.eps)
            return self.alpha * centred / scale + self.bias

    return LayerNormalization


class LibraryLayerNorm(LayerNorm):
    """The library's LayerNorm, with the tutorial's name for its gain."""

    @property
    def alpha(self) -> nn.Parameter:
        return self.weight


class TorchLayerNorm(nn.LayerNorm):
    """PyTorch's LayerNorm, with the tutorial's name for its gain."""

    alpha = LibraryLayerNorm.alpha


class FusedLayerNorm(tutorial_layer_norm(scalar=False)):
    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.alpha, self.bias, self.eps)


def test_layer_norm_module_accepts_a_fixed_class():
    result = ex.check_layer_norm_module(tutorial_layer_norm(scalar=False, unbiased=False, outside=False))
    assert result.passed, result.text
    assert result.text.count("✅") == 4


@pytest.mark.parametrize("shortcut", [LibraryLayerNorm, TorchLayerNorm, FusedLayerNorm])
def test_layer_norm_module_refuses_the_library_norms(shortcut):
    result = ex.check_layer_norm_module(shortcut)
    assert not result.passed and result.text.count("✅") == 4, result.text  # right values, but not the exercise
    assert "❌ fixed by hand, without nn.LayerNorm, tl.LayerNorm or F.layer_norm: your answer calls " in result.text


def test_layer_norm_module_an_untouched_starter_is_not_answered_yet():
    namespace = {"nn": nn, "torch": torch}
    exec(ch05.LAYER_NORM_STARTER, namespace)
    result = ex.check_layer_norm_module(namespace["LayerNormalization"])
    assert result.status == "unanswered" and "not answered yet" in result.text, result.text


def test_layer_norm_module_names_all_three_bugs_of_the_tutorial():
    result = ex.check_layer_norm_module(tutorial_layer_norm())
    assert not result.passed and "4 of 4 checks failed" in result.text, result.text
    for hint in (ch05._LAYER_NORM_BUGS["unbiased"], ch05._LAYER_NORM_BUGS["both"], ch05._SCALAR_HINT):
        assert diagnosis(result).count(hint.concept) == 1, result.text  # each concept once, when asked for
        assert hint.fix not in result.text and hint.fix in result.fixes


@pytest.mark.parametrize(
    "bugs_left, words",
    [
        (dict(scalar=False, outside=False), "x.std divides by d - 1"),
        (dict(scalar=False, unbiased=False), "eps is added outside the square root"),
        (dict(scalar=False), "both of the tutorial's forward bugs are still there"),
        (dict(unbiased=False, outside=False), "alpha and bias hold one number each"),
    ],
    ids=["unbiased std", "eps outside", "both forward bugs", "one gain for all features"],
)
def test_layer_norm_module_names_each_bug_left(bugs_left, words):
    result = ex.check_layer_norm_module(tutorial_layer_norm(**bugs_left))
    assert not result.passed
    assert diagnosis(result).count(words) == 1, result.text
    assert "unbiased=False" not in result.text and "torch.ones(features)" not in result.text  # the fixes: level 2


def test_layer_norm_module_asks_for_the_parameter_names():
    class Renamed(nn.Module):
        def __init__(self, features, eps=1e-5):
            super().__init__()
            self.gain, self.eps = nn.Parameter(torch.ones(features)), eps

        def forward(self, x):
            return (
                self.gain * (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True, correction=0) + self.eps).sqrt()
            )

    result = ex.check_layer_norm_module(Renamed)
    assert "keep the tutorial's parameter names" in result.text and "2 of 4 checks failed" in result.text


def test_layer_norm_module_survives_odd_answers():
    for answer in (lambda *a, **k: None, lambda *a, **k: 1 / 0, nn.Linear, "LayerNormalization"):
        result = ex.check_layer_norm_module(answer)
        assert not result.passed


def test_layer_norm_module_fails_a_forward_that_changes_its_input():
    good = tutorial_layer_norm(scalar=False, unbiased=False, outside=False)

    class Subtracting(good):
        def forward(self, x):
            out = super().forward(x)
            x -= 1
            return out

    result = ex.check_layer_norm_module(Subtracting)
    assert result.text.count("your function changed its input in place (x)") == 3, result.text


# ---------------------------------------------------------------- Spot the bug: residual dropout in a Pre-LN layer


def learner_block(x, attention, ff, norm1, norm2, dropout, *, bug: str = ""):
    """A learner's Pre-LN layer with residual dropout, right or with one of the classic mistakes."""
    if bug == "starter":
        x = dropout(x + attention(norm1(x)))
        return dropout(x + ff(norm2(x)))
    if bug == "second block":
        x = x + dropout(attention(norm1(x)))
        return dropout(x + ff(norm2(x)))
    if bug == "no dropout":
        x = x + attention(norm1(x))
        return x + ff(norm2(x))
    if bug == "before":
        x = x + attention(dropout(norm1(x)))
        return x + ff(dropout(norm2(x)))
    if bug == "Post-LN":
        x = norm1(x + dropout(attention(x)))
        return norm2(x + dropout(ff(x)))
    if bug == "normalized skip":  # the normalized x on the skip path: a bug no row of the table names
        h = norm1(x)
        x = h + dropout(attention(h))
        h = norm2(x)
        return h + dropout(ff(h))
    x = x + dropout(attention(norm1(x)))
    return x + dropout(ff(norm2(x)))


def test_pre_ln_block_accepts_the_fix():
    result = ex.check_pre_ln_block(learner_block)
    assert result.passed and result.text.count("✅") == 3, result.text


def test_pre_ln_block_an_untouched_starter_is_not_answered_yet():
    namespace = {}
    exec(ch05.PRE_LN_STARTER, namespace)
    assert ex.check_pre_ln_block(namespace["pre_ln_block"]).status == "unanswered"


def test_pre_ln_block_the_starter_is_right_in_evaluation_mode_only():
    result = ex.check_pre_ln_block(lambda *args: learner_block(*args, bug="starter"))
    assert "✅ dropout off (nn.Dropout in evaluation mode)" in result.text and result.text.count("❌") == 2, result.text
    hint = ch05._PRE_LN_BUGS["on the stream"]
    assert diagnosis(result).count(hint.concept) == 1 and hint.fix not in result.text and result.fixes == [hint.fix]


@pytest.mark.parametrize(
    "bug, words",
    [
        ("second block", "the attention block is fixed; the feed-forward block still drops"),
        ("no dropout", "your layer applies no dropout"),
        ("before", "you drop the sublayer's input"),
        ("Post-LN", "this is Post-LN"),
        ("normalized skip", "each block adds its sublayer's output"),
    ],
)
def test_pre_ln_block_names_each_bug(bug, words):
    result = ex.check_pre_ln_block(lambda *args: learner_block(*args, bug=bug))
    assert not result.passed and diagnosis(result).count(words) == 1, result.text
    assert "dropout(attention(norm1(x)))" not in result.text  # the fix is level 2


def test_the_fixed_dropout_drops_like_nn_dropout_in_training():
    drop = ch05._FixedDropout((200, 500), 0.1, torch.Generator().manual_seed(0))
    h = torch.randn(200, 500)
    out = drop(h)
    kept = out != 0
    assert abs(1 - kept.float().mean().item() - 0.1) < 0.01  # a share p of the entries dropped
    torch.testing.assert_close(out[kept], h[kept] / 0.9)  # the others scaled by 1 / (1 - p)
    torch.testing.assert_close(drop(h), out)  # the same entries at every call


def test_pre_ln_block_survives_odd_answers():
    def stub(x, attention, ff, norm1, norm2, dropout): ...  # your code here

    assert "not answered yet" in ex.check_pre_ln_block(stub).text
    for answer in (lambda x, *rest: x[..., :1], lambda *a: 1 / 0, lambda x, attention: x, 42):
        assert not ex.check_pre_ln_block(answer).passed


# ---------------------------------------------------------------- Predict, then run: the residual stream's growth


def test_stream_growth_is_the_square_root_law():
    norms = ch05.stream_norm(**ch05.STREAM_SETUP)
    d = ch05.STREAM_SETUP["d_model"]
    assert len(norms) == ch05.STREAM_SETUP["n_blocks"] + 1
    for blocks in (8, 24, 48):
        assert abs(norms[blocks] / math.sqrt((blocks + 1) * d) - 1) < 0.05, (blocks, norms[blocks])


def test_stream_growth_checker():
    reasoned = math.sqrt((ch05.STREAM_SETUP["n_blocks"] + 1) * ch05.STREAM_SETUP["d_model"])  # 56
    assert ex.check_stream_growth(reasoned).passed
    assert ex.check_stream_growth(torch.tensor(57.5)).passed
    no_growth = ex.check_stream_growth(8)
    assert not no_growth.passed and "that is the size of the input" in no_growth.text
    linear = ex.check_stream_growth(8 + 48 * 8)
    assert not linear.passed and "you added the norms" in linear.text
    other = ex.check_stream_growth(30)
    assert not other.passed and "the SQUARES" not in other.text and "||x||² ≈ ||x_0||² + L · 64" not in other.text
    assert "||x||² ≈ ||x_0||² + L · 64" in other.fixes[0]  # the formula only from check_stream_growth.hint()
    assert ex.check_stream_growth(...).status == "unanswered"
    assert not ex.check_stream_growth("56").passed and not ex.check_stream_growth(lambda: 56).passed


# ---------------------------------------------------------------- Extend: BatchNorm's running statistics


def learner_running_stats(x, running_mean, running_var, momentum=0.1, *, bug: str = ""):
    dims = (0,) if bug == "batch axis" else (-1,) if bug == "feature axis" else (0, 1)
    mean, var = x.mean(dim=dims), x.var(dim=dims, unbiased=bug not in ("biased", "batch axis"))
    if bug == "batch only":
        return mean, var
    if bug == "momentum":
        return momentum * running_mean + (1 - momentum) * mean, momentum * running_var + (1 - momentum) * var
    return (1 - momentum) * running_mean + momentum * mean, (1 - momentum) * running_var + momentum * var


def test_running_stats_accepts_a_right_answer():
    result = ex.check_running_stats(learner_running_stats)
    assert result.passed and result.text.count("✅") == 3, result.text


@pytest.mark.parametrize(
    "bug, words",
    [
        ("biased", "your running variance is the variance BatchNorm normalizes the batch with"),
        ("momentum", "weighs the old and the new statistics the other way round"),
        ("batch only", "these are the batch's own statistics"),
    ],
)
def test_running_stats_names_each_bug(bug, words):
    result = ex.check_running_stats(lambda *args: learner_running_stats(*args, bug=bug))
    assert not result.passed and result.text.count(words) == 1, result.text
    assert result.fixes and not any(fix in result.text for fix in result.fixes)


def test_running_stats_wants_one_statistic_per_feature():
    over_features = ex.check_running_stats(lambda *args: learner_running_stats(*args, bug="feature axis"))
    assert over_features.text.count("one number per feature, shape (d_model,)") == 1, over_features.text
    over_the_batch = ex.check_running_stats(lambda *args: learner_running_stats(*args, bug="batch axis"))
    assert not over_the_batch.passed and "expected shape (8,), got shape (5, 8)" in over_the_batch.text


def test_running_stats_survives_odd_answers():
    def stub(x, running_mean, running_var, momentum=0.1): ...

    assert ex.check_running_stats(stub).status == "unanswered"
    for answer in (lambda *a: None, lambda *a: 1 / 0, lambda *a: torch.zeros(3), "stats"):
        assert not ex.check_running_stats(answer).passed

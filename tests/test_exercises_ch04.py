"""Chapter 4's checkers: the NumPy sinusoidal table, the RoPE layout conversion, the predicted ALiBi weight shares
and ALiBi's bias accept right answers and name the classic mistakes (the exponent without its minus sign, the
`2 * i` typo, the conversion the other way, slopes for a power of two only, the cache offset forgotten), in two
levels: the concept in the feedback, the fix only from ``check_x.hint()``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import diagnosis
from transformer_lib import (
    ALiBi,
    MultiHeadAttention,
    RotaryEmbedding,
    alibi_bias,
    alibi_slopes,
    sinusoidal_encoding,
)
from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import ch04_positional_encoding as ch04

# ---------------------------------------------------------------- Spot the bug: the NumPy table's `2 * i`


def numpy_table(max_len, d_model, typo=False):
    """The exercise's vectorised NumPy table, fixed or with the starter's typo."""
    i = np.arange(0, d_model, 2)
    frequencies = 1 / 10000 ** ((2 * i if typo else i) / d_model)
    angles = np.outer(np.arange(max_len), frequencies)
    return np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(max_len, d_model)


def numpy_table_with_slices(max_len, d_model):
    pe = np.zeros((max_len, d_model))
    angles = np.arange(max_len)[:, None] / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
    return pe


def the_chapters_loop(max_len, d_model):  # the chapter's own buggy loop: 2 * i, and 2 * (i + 1) for the cosine
    pe = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for i in range(0, d_model, 2):
            pe[pos, i] = np.sin(pos / (10000 ** ((2 * i) / d_model)))
            pe[pos, i + 1] = np.cos(pos / (10000 ** ((2 * (i + 1)) / d_model)))
    return pe


def torch_table(max_len, d_model, swap=False, concat=False, power=2, start=0, multiply=False, base=10000.0):
    pos = torch.arange(start, start + max_len, dtype=torch.float32)[:, None]
    i = torch.arange(d_model // 2, dtype=torch.float32)
    scale = base ** (power * i / d_model)
    angles = pos * scale if multiply else pos / scale
    a, b = (angles.cos(), angles.sin()) if swap else (angles.sin(), angles.cos())
    if concat:
        return torch.cat([a, b], dim=-1)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2], pe[:, 1::2] = a, b
    return pe


@pytest.mark.parametrize(
    "answer",
    [numpy_table, numpy_table_with_slices, torch_table],
    ids=["numpy", "slices", "torch"],
)
def test_sinusoidal_encoding_accepts_a_numpy_or_a_torch_table(answer):
    result = ex.check_sinusoidal_encoding(answer)
    assert result.passed, result.text


def test_sinusoidal_encoding_refuses_the_librarys_table():
    result = ex.check_sinusoidal_encoding(lambda max_len, d_model: sinusoidal_encoding(max_len, d_model).numpy())
    assert not result.passed and result.text.count("✅") == 3, result.text  # right values, but not the exercise
    assert "❌ fixed by hand, without tl.sinusoidal_encoding: your answer calls sinusoidal_encoding" in result.text


def the_starter():
    """The exercise's starter function, as the notebook defines it."""
    namespace = {}
    exec(ch04.SINUSOIDAL_STARTER, namespace)
    return namespace["positional_encoding"]


def test_the_starters_table_passes_the_chapters_two_tests_and_is_still_wrong():
    """What the exercise claims: pairs on the unit circle, dot products a function of the offset only, not the
    formula's table; and near and far positions look alike."""
    table = torch.from_numpy(the_starter()(200, 64))
    assert (table[:, 0::2] ** 2 + table[:, 1::2] ** 2 - 1).abs().max() < 1e-12
    dots = table @ table.T
    assert max((torch.diagonal(dots, o).max() - torch.diagonal(dots, o).min()).item() for o in range(1, 100)) < 1e-6
    assert (table - sinusoidal_encoding(200, 64).double()).abs().max() > 1
    by_offset = dots[0]
    assert all(abs(by_offset[a:b].mean()) < 3 for a, b in ((1, 10), (10, 50), (50, 200)))


def test_sinusoidal_encoding_an_untouched_starter_is_not_answered_yet():
    assert ex.check_sinusoidal_encoding(the_starter()).status == "unanswered"


def test_sinusoidal_encoding_names_the_starters_bug_without_giving_the_fix(capsys):
    starter = the_starter()
    result = ex.check_sinusoidal_encoding(lambda n, d: starter(n, d))  # changed just enough to be graded
    hint = ch04._SINUSOIDAL_BUGS["no minus"]
    assert not result.passed and diagnosis(result).count(hint.concept) == 1, result.text  # once, when asked for
    assert hint.fix not in result.text and "-(np.log(10000.0)" not in result.text
    assert "dtype" not in result.text  # a float64 NumPy table is not a second problem
    assert result.fixes == [hint.fix]
    capsys.readouterr()
    ex.check_sinusoidal_encoding.hint()
    assert "-(np.log(10000.0) / d_model)" in capsys.readouterr().out


def test_sinusoidal_encoding_names_the_2i_typo_and_the_chapters_loop():
    result = ex.check_sinusoidal_encoding(lambda n, d: numpy_table(n, d, typo=True))
    assert not result.passed and "with the base squared" in diagnosis(result), result.text
    loop = ex.check_sinusoidal_encoding(the_chapters_loop)
    assert "the loop of the chapter's 'Spot the bug' section" in diagnosis(loop), loop.text
    assert "i / d_model" not in result.text + loop.text  # the fix is level 2


def test_sinusoidal_encoding_survives_a_stub_and_odd_results():
    def stub(max_len, d_model): ...  # your code here

    assert ex.check_sinusoidal_encoding(stub).status == "unanswered"
    assert not ex.check_sinusoidal_encoding(lambda n, d: None).passed
    assert not ex.check_sinusoidal_encoding(lambda n, d: numpy_table(n, d).tolist()).passed
    assert not ex.check_sinusoidal_encoding(lambda n, d: numpy_table(n, d)[:, ::-1]).passed  # a negative stride
    assert not ex.check_sinusoidal_encoding("not a function").passed


# ---------------------------------------------------------------- Extend: RoPE weights from the half-split layout


def to_interleaved_by_index(w, n_heads):
    """An independent right answer: gather the rows, per head i and i + d_head/2 side by side."""
    d_head = w.shape[0] // n_heads
    order = [h * d_head + half * d_head // 2 + i for h in range(n_heads) for i in range(d_head // 2) for half in (0, 1)]
    return w[order]


def to_half_split(w, n_heads):  # Hugging Face's permute: the other way
    d_head = w.shape[0] // n_heads
    return w.view(n_heads, d_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def whole_matrix(w, n_heads):
    return w.reshape(2, w.shape[0] // 2, *w.shape[1:]).transpose(0, 1).reshape(w.shape)


def columns(w, n_heads):
    return to_interleaved_by_index(w.T, n_heads).T if w.dim() == 2 else w


def test_rope_permutation_accepts_right_answers():
    assert ex.check_rope_permutation(to_interleaved_by_index).passed
    assert ex.check_rope_permutation(ch04._convert).passed


def test_the_converted_weights_give_a_half_split_models_scores_in_the_library():
    """What the exercise claims: a model trained with the half-split layout, converted, scores the same with
    the library's MultiHeadAttention and RotaryEmbedding (its weights given to it, nothing else changed)."""
    d_model, n_heads, T = 32, 4, 9
    half = MultiHeadAttention(d_model, n_heads).eval()
    x = torch.randn(2, T, d_model)
    with torch.no_grad():
        q = half.q_proj(x).view(2, T, n_heads, -1).transpose(1, 2)
        k = half.k_proj(x).view(2, T, n_heads, -1).transpose(1, 2)
        expected = torch.softmax(ch04._rope_half_split(q) @ ch04._rope_half_split(k).transpose(-2, -1) / 8**0.5, -1)
        library = MultiHeadAttention(d_model, n_heads, rotary=RotaryEmbedding(d_model // n_heads)).eval()
        library.load_state_dict(half.state_dict())
        for proj in (library.q_proj, library.k_proj):
            proj.weight.copy_(to_interleaved_by_index(proj.weight, n_heads))
            proj.bias.copy_(to_interleaved_by_index(proj.bias, n_heads))
        _, weights = library(x, need_weights=True)
    torch.testing.assert_close(weights, expected)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (to_half_split, "the conversion the other way"),
        (whole_matrix, "all d_model rows at once"),
        (columns, "you reordered the columns"),
        (lambda w, n_heads: w.clone(), "the weights are unchanged"),
    ],
)
def test_rope_permutation_names_each_mistake(wrong, words):
    result = ex.check_rope_permutation(wrong)
    assert not result.passed and words in result.text, result.text
    assert ch04._ROPE_FIX in result.fixes[0] and "transpose(1, 2)" not in result.text


def test_rope_permutation_survives_a_stub_and_a_crash():
    def stub(w, n_heads): ...  # your code here

    assert ex.check_rope_permutation(stub).status == "unanswered"
    crashed = ex.check_rope_permutation(lambda w, n_heads: w.view(n_heads, 3, -1))
    assert not crashed.passed and "raised RuntimeError" in crashed.text


# ---------------------------------------------------------------- Predict, then run: ALiBi's weight near the query


def test_alibi_share_equals_the_closed_form_and_an_attention_layer():
    setup = ch04.ALIBI_SHARE_SETUP
    steep, flat = ch04.alibi_recent_share(**setup)
    T, last = setup["T"], setup["last"]
    for got, s in ((steep, 1 / 2), (flat, 1 / 256)):
        assert got == pytest.approx((1 - math.exp(-s * last)) / (1 - math.exp(-s * T)), rel=1e-9)
    # the same numbers from a causal MultiHeadAttention whose queries are zero: every raw score equal
    mha = MultiHeadAttention(32, n_heads=8, alibi=ALiBi(8)).eval()
    with torch.no_grad():
        mha.q_proj.weight.zero_()
        mha.q_proj.bias.zero_()
        _, weights = mha(torch.randn(1, T, 32), is_causal=True, need_weights=True)  # (1, 8, T, T)
    share = weights[0, :, -1, -last:].sum(-1)
    assert share[0].item() == pytest.approx(steep, abs=1e-5) and share[-1].item() == pytest.approx(flat, abs=1e-5)


def test_alibi_share_accepts_reasoned_predictions():
    assert ex.check_alibi_share((0.92, 0.08)).passed
    assert ex.check_alibi_share([1 - math.exp(-2.5), 5 / 64]).passed  # endless keys, and a uniform guess: close
    assert ex.check_alibi_share(np.array([0.9, 0.1])).passed


@pytest.mark.parametrize(
    "prediction, words",
    [
        ((1 - math.exp(-0.5), 0.08), "the share of the newest key alone"),
        ((5 / 64, 0.08), "a head with no penalty at all"),
        ((0.92, 1 - math.exp(-5 / 256)), "assumes endlessly many keys"),
        ((0.5, 0.5), "a geometric series"),
    ],
)
def test_alibi_share_names_the_mistake(prediction, words):
    result = ex.check_alibi_share(prediction)
    assert not result.passed and words in result.text, result.text
    assert "(1 - r^5) / (1 - r^64)" not in result.text and "(1 - r^5) / (1 - r^64)" in result.fixes[0]


def test_alibi_share_asks_for_two_numbers():
    result = ex.check_alibi_share(0.92)
    assert not result.passed and result.text.count("give two numbers") == 1, result.text  # once per exercise
    assert ex.check_alibi_share(...).status == "unanswered"
    assert not ex.check_alibi_share("0.9, 0.1").passed


# ---------------------------------------------------------------- Extend: ALiBi for any number of heads, with a cache


def alibi_right(n_heads, T_q, T_k):
    def geometric(n):
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]

    n = 2 ** math.floor(math.log2(n_heads))
    slopes = torch.tensor(geometric(n) + geometric(2 * n)[0::2][: n_heads - n])
    i = torch.arange(T_k - T_q, T_k)[:, None]
    j = torch.arange(T_k)[None, :]
    return -slopes[:, None, None] * (i - j)


def test_alibi_accepts_a_right_answer_and_refuses_the_library():
    right = ex.check_alibi(alibi_right)
    assert right.passed and "torch alone" not in right.text, right.text
    library = ex.check_alibi(lambda n, T_q, T_k: alibi_bias(alibi_slopes(n), T_q, T_k, offset=T_k - T_q))
    assert not library.passed and "your answer calls alibi_bias, alibi_slopes" in library.text, library.text


def test_alibi_refuses_the_library_called_from_a_nested_function():
    import transformer_lib as tl

    def answer(n_heads, T_q, T_k):
        def slopes(n):
            return tl.alibi_slopes(n)

        return tl.alibi_bias(slopes(n_heads), T_q, T_k, offset=T_k - T_q)

    result = ex.check_alibi(answer)
    assert not result.passed and "❌ built with torch alone, without the library's ALiBi" in result.text, result.text


@pytest.mark.parametrize(
    "bug, words",
    [
        ("geometric", "the rule for a power of two"),
        ("first", "BETWEEN the first n' slopes"),
        ("odd", "(duplicates)"),
        ("eight", "those are the slopes of 8 heads"),
        ("no offset", "your queries sit at positions 0 .. T_q - 1"),
        ("sign", "your bias is a bonus"),
        ("causal", "you hid the future keys yourself"),
    ],
)
def test_alibi_names_each_mistake(bug, words):
    result = ex.check_alibi(lambda n, T_q, T_k: ch04._alibi(n, T_q, T_k, bug=bug))
    assert not result.passed and words in result.text, result.text
    assert result.fixes == [ch04._ALIBI_BUGS[bug].fix] and "[0::2]" not in result.text


def test_alibi_without_the_offset_passes_only_the_square_cases():
    result = ex.check_alibi(lambda n, T_q, T_k: ch04._alibi(n, T_q, T_k, bug="no offset"))
    assert result.text.count("✅") == 2, result.text


def test_alibi_survives_a_stub_and_a_wrong_type():
    def stub(n_heads, T_q, T_k): ...  # your code here

    assert ex.check_alibi(stub).status == "unanswered"
    assert not ex.check_alibi(lambda n, T_q, T_k: alibi_right(n, T_q, T_k).tolist()).passed
    assert not ex.check_alibi(lambda n, T_q, T_k: alibi_right(n, T_q, T_k).transpose(0, 2)).passed

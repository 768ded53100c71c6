"""Chapter 2's checkers: the decoder mask put together from PyTorch code (the polarity of nn.MultiheadAttention, the
padding on the query axis), the positions that copy their target under a prefix-LM mask, and the mask of packed
documents accept right answers and name the classic mistakes."""

from __future__ import annotations

import pytest
import torch

import transformer_lib as tl
from conftest import diagnosis
from transformer_lib import masks
from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import ch02_masking

# ---------------------------------------------------------------- Spot the bug: a decoder mask ported from PyTorch


def decoder_mask(tokens, pad_id, future=False, axis="keys"):
    """A learner's decoder mask: right by default; ``future`` keeps the tutorial's triu, ``axis`` moves the padding."""
    T = tokens.shape[1]
    ones = torch.ones(T, T, dtype=torch.bool)
    causal = torch.triu(ones, diagonal=1) if future else torch.tril(ones)
    real = tokens != pad_id
    padding = {
        "keys": real[:, None, None, :],
        "queries": real[:, None, :, None],
        "both": real[:, None, :, None] & real[:, None, None, :],
    }[axis]
    return causal & padding


def test_decoder_mask_accepts_the_fix():
    result = ex.check_decoder_mask(decoder_mask)
    assert result.passed and result.text.count("✅") == 4 and "transformer_lib's mask functions" not in result.text


@pytest.mark.parametrize(
    "answer",
    [
        lambda t, p: tl.combine_masks(tl.causal_mask(t.shape[1]), tl.padding_mask(t, p)),
        lambda t, p: masks.causal_mask(t.shape[1]) & (t != p)[:, None, None, :],  # one of them, imported otherwise
    ],
    ids=["all three", "causal_mask only"],
)
def test_decoder_mask_refuses_the_librarys_own_masks(answer):
    result = ex.check_decoder_mask(answer)
    assert not result.passed and result.text.count("✅") == 4, result.text  # right values ...
    assert "❌ fixed by hand, without transformer_lib's mask functions" in result.text  # ... but not a fix
    assert "already hold the answer" in result.text


def test_decoder_mask_calls_the_untouched_starter_not_answered_yet():
    starter = ch02_masking.DECODER_MASK_STARTER
    assert ex.check_decoder_mask(cell(starter)).status == "unanswered"
    assert ex.check_decoder_mask(cell(starter.replace("diagonal=1", "diagonal=0"))).status == "failed"


def test_decoder_mask_names_both_bugs_of_the_starter_once_and_keeps_the_fix_for_later():
    result = ex.check_decoder_mask(lambda t, p: decoder_mask(t, p, future=True, axis="queries"))
    assert result.text.count("❌") == 4
    assert "True on the FUTURE keys" in diagnosis(result) and diagnosis(result).count("Two bugs") == 1  # no padding
    assert "tril" not in result.text and "[:, None, None, :]" not in result.text  # the fixes only when asked for
    assert any("torch.tril" in fix and "(tokens != pad_id)[:, None, None, :]" in fix for fix in result.fixes)


def test_decoder_mask_names_the_query_axis_and_passes_when_nothing_is_padded():
    result = ex.check_decoder_mask(lambda t, p: decoder_mask(t, p, axis="queries"))
    assert "✅ no padding" in result.text
    assert result.text.count("❌") == 3 and diagnosis(result).count("the padding is on the QUERY axis") == 1
    assert "FUTURE" not in diagnosis(result)
    assert 'Hint: "right padding, pad_id=0" fails where "no padding: one sequence of 4 tokens" passes' in result.text


@pytest.mark.parametrize(
    "answer, words, count",
    [
        (lambda t, p: decoder_mask(t, p, future=True), "True on the FUTURE keys", 4),
        (
            lambda t, p: decoder_mask(t, p, axis="both"),
            "you hide the padding queries as well",
            2,  # left padding gives the right mask; right padding the query-axis bug's, and its hint
        ),
        (lambda t, p: decoder_mask(t, p) & ~torch.eye(t.shape[1], dtype=torch.bool), "the diagonal is masked", 4),
        (
            lambda t, p: torch.tril(torch.ones(t.shape[1], t.shape[1], dtype=torch.bool)) & (t == p)[:, None, None, :],
            "the padding part is inverted",
            4,
        ),
        (
            lambda t, p: torch.tril(torch.ones(t.shape[1], t.shape[1], dtype=torch.bool)).expand(t.shape[0], 1, -1, -1),
            "the padding keys are not hidden",
            3,
        ),
        (lambda t, p: decoder_mask(t, p)[:, 0], "does not broadcast over the heads", 4),
        (lambda t, p: decoder_mask(t, p).float(), "expected a boolean tensor", 4),
    ],
    ids=["future", "both axes", "diagonal", "inverted padding", "no padding mask", "no head axis", "float"],
)
def test_decoder_mask_names_each_bug(answer, words, count):
    result = ex.check_decoder_mask(answer)
    assert result.text.count("❌") == count, result.text
    assert words in diagnosis(result) + result.text, result.text  # the bug when asked for, a wrong dtype at once


def cell(source):
    """The function a notebook cell of ``source`` defines (compiled as a cell is, without this file's imports)."""
    namespace = {"torch": torch}
    exec(compile(source, "<cell>", "exec", dont_inherit=True), namespace)
    return next(v for k, v in namespace.items() if callable(v) and k != "torch")


def test_decoder_mask_survives_a_stub():
    assert ex.check_decoder_mask(lambda t, p: None).status == "unanswered"  # compiles like a stub
    assert ex.check_decoder_mask(lambda t, p: t.tolist()).text.count("❌") == 4  # a wrong type
    assert "raised" in ex.check_decoder_mask(lambda t, p: t.view(3, -1, 7)).text
    assert ex.check_decoder_mask(...).status == "unanswered"


# ---------------------------------------------------------------- Predict, then run: the positions that cheat


def test_cheating_positions_is_what_attention_lets_through():
    """Independently of the mask's formula: query t depends on key t + 1 exactly for the cheating positions."""
    setup = ch02_masking.CHEATING_SETUP
    T_in, prefix_len = setup["T_in"], setup["prefix_len"]
    mask = tl.prefix_lm_mask(T_in, prefix_len)
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(T_in, 8, generator=g), torch.randn(T_in, 8, generator=g), torch.randn(T_in, 8, generator=g)
    base, _ = tl.scaled_dot_product_attention(q, k, v, mask=mask)
    sees_next = []
    for t in range(T_in - 1):  # the last position's target is not among the inputs
        k2, v2 = k.clone(), v.clone()
        k2[t + 1], v2[t + 1] = torch.randn(8, generator=g), torch.randn(8, generator=g)  # change input t + 1
        out, _ = tl.scaled_dot_product_attention(q, k2, v2, mask=mask)
        sees_next.append(not torch.equal(out[t], base[t]))
    assert sees_next == [True, True, True, False, False, False]
    assert ch02_masking.cheating_positions(T_in, prefix_len) == sum(sees_next) == prefix_len - 1


@pytest.mark.parametrize("prediction", [3, 3.0, torch.tensor(3)])
def test_cheating_positions_accepts_the_count(prediction):
    assert ex.check_cheating_positions(prediction).passed


@pytest.mark.parametrize(
    "prediction, words",
    [
        (0, "the prefix is bidirectional"),
        (4, "off by one"),
        (6, "the unmasked model's count"),
        (2, "just above its diagonal"),
    ],
)
def test_cheating_positions_explains_a_wrong_count(prediction, words):
    result = ex.check_cheating_positions(prediction)
    assert not result.passed and words in result.text, result.text
    assert "prefix_len" not in result.text.split("\n", 2)[2]  # the inequality only when asked for (not in the hint)


def test_cheating_positions_refuses_odd_answers_without_raising():
    assert ex.check_cheating_positions(...).status == "unanswered"
    for odd in ("3", True, [3], lambda: 3):
        assert not ex.check_cheating_positions(odd).passed


# ---------------------------------------------------------------- Extend: packed documents


def packed(doc_ids):
    """A learner's answer: the same-document mask by a loop over the documents, AND the causal mask."""
    B, T = doc_ids.shape
    mask = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b in range(B):
        for doc in doc_ids[b].unique():
            where = doc_ids[b] == doc
            mask[b, 0] |= where[:, None] & where[None, :]
    return mask & tl.causal_mask(T)


def test_packed_mask_accepts_right_answers():
    assert ex.check_packed_mask(packed).passed
    assert ex.check_packed_mask(ch02_masking.reference_packed_mask).passed


def test_packed_mask_runs_each_document_alone():
    """The reference mask really isolates the documents: a packed row encodes each document as if alone."""
    tl.set_seed(0)
    layer = tl.EncoderLayer(d_model=16, n_heads=2, d_ff=32).eval()
    x = torch.randn(1, 6, 16)
    docs = torch.tensor([[0, 0, 0, 1, 1, 2]])
    with torch.no_grad():
        together = layer(x, mask=ch02_masking.reference_packed_mask(docs))
        for start, end in ((0, 3), (3, 5), (5, 6)):
            alone = layer(x[:, start:end], mask=tl.causal_mask(end - start))
            torch.testing.assert_close(together[:, start:end], alone)


@pytest.mark.parametrize(
    "answer, words, count",
    [
        (lambda d: (d[:, :, None] == d[:, None, :])[:, None], "see their own future", 3),
        (lambda d: tl.causal_mask(d.shape[1]).expand(d.shape[0], 1, -1, -1), "the documents see each other", 3),
        (lambda d: ~packed(d), "polarity is inverted", 4),
        (lambda d: packed(d)[:, 0], "needs a head axis", 4),
    ],
    ids=["no causal", "causal only", "inverted", "no head axis"],
)
def test_packed_mask_names_each_bug(answer, words, count):
    result = ex.check_packed_mask(answer)
    assert result.text.count("❌") == count, result.text
    assert result.text.count(words) == 1, result.text  # once, however many cases it failed
    assert "doc_ids[:, :, None]" not in result.text and "mask[:, None]" not in result.text  # no code of the fix


def test_packed_mask_survives_a_stub():
    assert ex.check_packed_mask(lambda d: None).status == "unanswered"
    assert ex.check_packed_mask(lambda d: d > 0).text.count("❌") == 4
    assert "raised" in ex.check_packed_mask(lambda d: d.view(3, -1, 7)).text
    assert ex.check_packed_mask(...).status == "unanswered"

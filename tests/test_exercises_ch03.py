"""Chapter 3's checkers: a head split folded for torch.bmm, a multi-head attention forward pass and the predicted
crossover length accept right answers and name the classic mistakes (sequence-first code on batch-first data,
the straight reshape, keys and values split with the query's length, a missing scale or transpose)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from conftest import diagnosis
from transformer_lib import EncoderLayer, MultiHeadAttention
from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import ch03_multi_head_attention as ch03

# ---------------------------------------------------------------- Spot the bug: heads folded into the batch


def fold_right(x, n_heads):
    B, T, d = x.shape
    return x.view(B, T, n_heads, d // n_heads).transpose(1, 2).reshape(B * n_heads, T, d // n_heads)


def fold_seq_first_fixed(x, n_heads):  # the starter's line, given the sequence-first tensor it was written for
    B, T, d = x.shape
    return x.transpose(0, 1).reshape(T, B * n_heads, d // n_heads).transpose(0, 1)


def fold_sequence_first(x, n_heads):  # PyTorch's sequence-first line on batch-first x
    B, T, d_model = x.shape
    return x.view(T, B * n_heads, d_model // n_heads).transpose(0, 1)


def fold_chunks(x, n_heads):  # the starter's bug as a PyTorch port of Kyubyong/transformer writes it
    return torch.cat(torch.chunk(x, n_heads, dim=-1), dim=0)


def cell(source):
    """The function a notebook cell of ``source`` defines (compiled as a cell is, without this file's imports)."""
    namespace = {"torch": torch, "math": math}
    exec(compile(source, "<cell>", "exec", dont_inherit=True), namespace)
    return next(v for k, v in namespace.items() if callable(v) and k not in ("torch", "math"))


def fold_straight(x, n_heads):
    B, T, d = x.shape
    return x.view(B * n_heads, T, d // n_heads)


def fold_without_transpose(x, n_heads):
    B, T, d = x.shape
    return x.view(B, T, n_heads, d // n_heads).reshape(B * n_heads, T, d // n_heads)


def fold_head_major(x, n_heads):
    B, T, d = x.shape
    return x.view(B, T, n_heads, d // n_heads).permute(2, 0, 1, 3).reshape(B * n_heads, T, d // n_heads)


def not_folded(x, n_heads):
    B, T, d = x.shape
    return x.view(B, T, n_heads, d // n_heads).transpose(1, 2)


@pytest.mark.parametrize("answer", [fold_right, fold_seq_first_fixed])
def test_split_heads_accepts_right_folds(answer):
    result = ex.check_split_heads(answer)
    assert result.passed, result.text


def test_split_heads_refuses_the_chapters_split_folded():
    result = ex.check_split_heads(
        lambda x, n_heads: MultiHeadAttention(x.shape[-1], n_heads).split_heads(x).flatten(0, 1)
    )
    assert not result.passed and result.text.count("✅") == 3, result.text  # right values, but not the exercise
    assert "❌ fixed by hand, without the chapter's split_heads: your answer calls split_heads" in result.text


def test_split_heads_calls_the_untouched_starter_not_answered_yet():
    starter = ch03.SPLIT_HEADS_STARTER
    assert ex.check_split_heads(cell(starter)).status == "unanswered"
    assert ex.check_split_heads(cell(starter.replace("dim=0)", "dim=1)"))).status == "failed"


@pytest.mark.parametrize("answer", [fold_chunks, lambda x, n_heads: cell(ch03.SPLIT_HEADS_STARTER)(x, n_heads)])
def test_split_heads_names_the_starters_bug_which_passes_a_batch_of_one(answer):
    result = ex.check_split_heads(answer)
    assert not result.passed
    assert "✅ B=1" in result.text and result.text.count("❌") == 2  # right for a batch of one, wrong beyond ...
    assert diagnosis(result).count("your rows come in the order (head, example)") == 1  # ... named once, when asked
    assert 'Hint: "B=3, T=5, d_model=12, n_heads=3" fails where "B=1, T=4, d_model=8, n_heads=2" passes' in result.text
    assert "torch.stack" not in result.text and any("torch.stack" in fix for fix in result.fixes)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (fold_sequence_first, "that is the line for sequence-first input (T, B, d_model)"),
        (fold_straight, "each 'head' is a run of T * d_head consecutive numbers"),
        (fold_without_transpose, "each 'head' is a run of T * d_head consecutive numbers"),
        (fold_head_major, "your rows come in the order (head, example)"),
        (not_folded, "you return (B, n_heads, T, d_head)"),
    ],
)
def test_split_heads_names_each_classic_bug(wrong, words):
    result = ex.check_split_heads(wrong)
    assert not result.passed and words in diagnosis(result), result.text
    assert "reshape(B * n_heads" not in result.text and "transpose(1, 2)" not in result.text  # no code of the fix


def test_split_heads_survives_a_stub_a_crash_and_a_wrong_type(capsys):
    def stub(x, n_heads): ...  # your code here

    assert ex.check_split_heads(stub).status == "unanswered"
    assert "not answered yet" in ex.check_split_heads(stub).text
    crashed = ex.check_split_heads(lambda x, n_heads: x.view(-1, 7, 5))
    assert not crashed.passed and crashed.text.count("raised RuntimeError") == 3
    assert not ex.check_split_heads(lambda x, n_heads: x.tolist()).passed


# ---------------------------------------------------------------- Spot the bug: keys reshaped with the query's length


def mha_right(mha, query, key, value):
    B, T_q, d = query.shape
    h = mha.n_heads

    def heads(t):
        return t.view(B, t.shape[1], h, d // h).transpose(1, 2)

    q, k, v = heads(mha.q_proj(query)), heads(mha.k_proj(key)), heads(mha.v_proj(value))
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h), dim=-1)
    return mha.out_proj((w @ v).transpose(1, 2).reshape(B, T_q, d))


def mha_query_length(mha, query, key, value):  # the starter's bug: every split uses the query's length
    batch_size, seq_len, d_model = query.shape
    n_heads, d_head = mha.n_heads, d_model // mha.n_heads

    def heads(t):
        return t.view(batch_size, seq_len, n_heads, d_head).transpose(1, 2)

    q, k, v = heads(mha.q_proj(query)), heads(mha.k_proj(key)), heads(mha.v_proj(value))
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_head), dim=-1)
    return mha.out_proj((weights @ v).transpose(1, 2).reshape(batch_size, seq_len, d_model))


def mha_query_length_inferred_head_size(mha, query, key, value):  # the same bug, with -1 for d_head
    B, T, d = query.shape
    h = mha.n_heads
    q, k, v = (
        p(t).view(B, T, h, -1).transpose(1, 2) for p, t in ((mha.q_proj, query), (mha.k_proj, key), (mha.v_proj, value))
    )
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h), dim=-1)
    return mha.out_proj((w @ v).transpose(1, 2).reshape(B, T, d))


def mha_variant(split="right", scale=True, transpose_back=True):
    def forward(mha, query, key, value):
        B, T_q, d = query.shape
        h = mha.n_heads

        def heads(t):
            T = t.shape[1]
            if split == "seq_first":
                return t.reshape(T, B * h, d // h).transpose(0, 1).reshape(B, h, T, d // h)
            if split == "straight":
                return t.view(B * h, T, d // h)
            return t.view(B, T, h, d // h).transpose(1, 2)

        q, k, v = heads(mha.q_proj(query)), heads(mha.k_proj(key)), heads(mha.v_proj(value))
        w = torch.softmax(q @ k.transpose(-2, -1) / (math.sqrt(d // h) if scale else 1.0), dim=-1)
        out = w @ v
        out = out.transpose(1, 2) if transpose_back and split != "straight" else out
        return mha.out_proj(out.reshape(B, T_q, d))

    return forward


def test_multi_head_attention_accepts_a_right_answer_and_leaves_the_random_state_alone():
    before = torch.get_rng_state()
    result = ex.check_multi_head_attention(mha_right)
    assert result.passed, result.text
    assert torch.equal(before, torch.get_rng_state())


def test_multi_head_attention_calls_the_untouched_starter_not_answered_yet():
    starter = ch03.MHA_FORWARD_STARTER
    assert ex.check_multi_head_attention(cell(starter)).status == "unanswered"
    assert ex.check_multi_head_attention(cell(starter.replace("# find and fix the bug", ""))).status == "unanswered"
    assert ex.check_multi_head_attention(cell(starter.replace("seq_len, n_heads", "-1, n_heads"))).passed


@pytest.mark.parametrize("answer", [mha_query_length, mha_query_length_inferred_head_size])
def test_multi_head_attention_names_the_query_length_bug(answer):
    result = ex.check_multi_head_attention(answer)
    assert not result.passed
    assert result.text.count("✅") == 2 and result.text.count("❌") == 2, result.text  # self-attention passes
    assert diagnosis(result).count("comes only when the keys are not as many as the queries") == 1, result.text
    assert "t.shape[1]" not in result.text and any("t.shape[1]" in fix for fix in result.fixes)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(split="seq_first"), "batch axis got mixed"),
        (dict(scale=False), "the scores are not scaled"),
        (dict(transpose_back=False), "merging the heads must bring the positions back"),
        (dict(split="straight"), "split and merge the heads with a plain reshape"),
    ],
)
def test_multi_head_attention_names_each_classic_bug(kw, words):
    result = ex.check_multi_head_attention(mha_variant(**kw))
    assert not result.passed and words in diagnosis(result), result.text


def test_multi_head_attention_blames_the_query_length_only_for_a_shape_error():
    def raises(mha, query, key, value):
        raise ValueError("not yet")

    result = ex.check_multi_head_attention(raises)
    assert "not as many as the queries" not in diagnosis(result) and result.text.count("❌") == 4
    assert diagnosis(result).count("the steps of MultiHeadAttention.forward") == 1


def test_multi_head_attention_survives_a_stub_and_a_wrong_type():
    def stub(mha, query, key, value): ...  # your code here

    assert ex.check_multi_head_attention(stub).status == "unanswered"
    assert not ex.check_multi_head_attention(lambda mha, query, key, value: "attention").passed


# ---------------------------------------------------------------- Predict, then run: the crossover length


def counted_crossover(d_model, n_heads, d_ff, T=512):
    """The crossover as the notebook measures it: the library's encoder layer, its products counted on meta."""
    layer = EncoderLayer(d_model, n_heads, d_ff).to("meta")
    with FlopCounterMode(display=False) as counter:
        layer(torch.empty(1, T, d_model, device="meta"))
    flops = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    linear = sum(n for op, n in flops.items() if op in ("aten.addmm", "aten.mm"))
    attention = sum(flops.values()) - linear
    return T * linear / attention  # attention grows as T², the rest as T: equal at T * rest / attention


def test_the_crossover_formula_equals_the_library_layers_counted_products():
    setup = ch03.CROSSOVER_SETUP
    expected = ch03.attention_crossover(setup["d_model"], setup["d_ff"])
    assert counted_crossover(**setup) == expected == 2304.0
    assert counted_crossover(64, 4, 256, T=100) == ch03.attention_crossover(64, 256)


def test_attention_crossover_accepts_a_reasoned_prediction():
    assert ex.check_attention_crossover(2304).passed
    assert ex.check_attention_crossover(2300.0).passed  # within the tolerance
    assert ex.check_attention_crossover(torch.tensor(2310.0)).passed


@pytest.mark.parametrize(
    "prediction, words",
    [
        (768, "the four projections alone"),
        (1536, "is the feed-forward layer's width"),
        (4608, "attention has two products"),
        (27648, "the heads do not change the count"),
        (1000, "the crossover is where the two counts are equal"),
    ],
)
def test_attention_crossover_names_the_mistake(prediction, words):
    result = ex.check_attention_crossover(prediction)
    assert not result.passed and words in result.text, result.text
    assert "d_model d_ff" not in result.text  # the equation only when asked for


def test_attention_crossover_survives_an_unanswered_starter_and_a_wrong_type():
    assert ex.check_attention_crossover(...).status == "unanswered"
    assert not ex.check_attention_crossover("2304").passed
    assert not ex.check_attention_crossover([2304]).passed

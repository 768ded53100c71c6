"""Chapter 8's checkers: the predicted training state of a model converted to bf16 (measured here), gradient
accumulation over padded micro-batches (spot the bug: each loss divided by k), a loss-scaled step (spot the bug:
clipping the scaled gradients) and attention split over processes by heads accept right answers, call an untouched
starter "not answered yet", and name the classic mistakes (the concept by default, the fix in code on request)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from conftest import diagnosis
from transformer_lib import GPT, GPTConfig, MultiHeadAttention
from transformer_lib.memory import state_bytes
from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import ch08_training_at_scale as ch08
from transformer_lib.training import make_optimizer

# ---------------------------------------------------------------- the training state of a bf16 model (a prediction)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_predicted_bytes_per_parameter_are_measured_after_a_step_of_the_converted_model(dtype):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layers=2, n_heads=2, d_model=16)).to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 11, (2, 8))
    model(x, torch.roll(x, -1, 1))[1].backward()
    optimizer.step()
    n = sum(p.numel() for p in model.parameters())
    sizes = state_bytes(model, optimizer)
    assert all(p.grad.dtype == dtype for p in model.parameters())
    assert sizes["total"] / n == ch08.AMP_STATE_BYTES == 8
    assert ex.check_amp_state_bytes(sizes["total"] / n).passed


def test_mixed_precision_keeps_16_bytes_which_the_checker_explains():
    """The body's count, under autocast with fp32 weights, is the checker's first classic wrong answer."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layers=2, n_heads=2, d_model=16))
    optimizer = make_optimizer(model, 1e-3, 0.1, device=torch.device("cpu"))
    x = torch.randint(0, 11, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x, torch.roll(x, -1, 1))[1]
    loss.backward()
    optimizer.step()
    sizes = state_bytes(model, optimizer)
    assert sizes["total"] / sum(p.numel() for p in model.parameters()) == 16
    result = ex.check_amp_state_bytes(16)
    assert not result.passed and "whose weights stay fp32" in result.text, result.text


@pytest.mark.parametrize(
    ("wrong", "words"),
    [
        (12, "you count AdamW's moments in fp32"),
        (14, "you count the gradients in fp32"),
        (4, "count their gradients and AdamW's two moments"),
        (6, "AdamW keeps two moments"),
        (2, "that is the weights alone"),
        (7, "count four numbers per parameter"),
    ],
)
def test_amp_state_bytes_names_the_wrong_counts_and_keeps_the_sum_for_hint(wrong, words):
    result = ex.check_amp_state_bytes(wrong)
    assert not result.passed and words in result.text, result.text
    assert "2 + 2 + 2 x 2" not in result.text and any("2 + 2 + 2 x 2 = 8" in fix for fix in result.fixes)


# ---------------------------------------------------------------- gradient accumulation over padded micro-batches


def cell(source: str, **names):
    """The function that a notebook cell of ``source`` defines, compiled as a cell is (``names``: its imports)."""
    namespace = dict(names)
    exec(compile(source, "<cell>", "exec", dont_inherit=True), namespace)
    return next(v for k, v in namespace.items() if callable(v) and k not in names and not k.startswith("__"))


def starter_accumulate(model, micro_batches):  # the exercise's starter, changed: the loss named differently
    k = len(micro_batches)
    for x, y in micro_batches:
        mean_loss = model(x, y)[1]
        (mean_loss / k).backward()


def summed_accumulate(model, micro_batches):
    """Right, written another way: sums of token losses over the batch's number of targets."""
    n_targets = sum(int((y != -100).sum()) for _, y in micro_batches)
    for x, y in micro_batches:
        logits = model(x)[0]
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")
        (loss / n_targets).backward()


def test_the_expected_gradient_is_the_mean_over_every_target_token():
    """Independent of the model's loss: the mean of the per-token losses of the targets that are not ignored."""
    micro = ch08._micro_batches((2, 2, 2), (0, 3, 7), seed=0)
    model = ch08._tiny_gpt(0)
    x, y = torch.cat([m[0] for m in micro]), torch.cat([m[1] for m in micro])
    per_token = F.cross_entropy(model(x)[0].flatten(0, 1), y.flatten().clamp(min=0), reduction="none")
    keep = y.flatten() != -100
    (per_token[keep].sum() / keep.sum()).backward()
    torch.testing.assert_close(ch08._whole_batch_grads(ch08._tiny_gpt(0), micro), ch08._flat_grads(model))
    accumulated = ch08._tiny_gpt(0)
    ch08._accumulate(accumulated, micro)
    torch.testing.assert_close(ch08._flat_grads(accumulated), ch08._flat_grads(model), rtol=1e-5, atol=1e-7)


def test_accumulate_accepts_right_answers_and_names_the_starter_bug():
    assert ex.check_accumulate(summed_accumulate).passed
    result = ex.check_accumulate(starter_accumulate)
    assert not result.passed and "4 of 5 checks failed" in result.text, result.text
    assert "✅ 2 micro-batches of 2 sequences, no ignored targets" in result.text  # dividing by k is right there
    assert diagnosis(result).count("gives every micro-batch the same weight") == 1  # the concept, once, when asked
    assert "Gradient accumulation" in diagnosis(result) and "y != -100" not in result.text  # ... no code of the fix
    assert result.fixes == [ch08._ACCUMULATE_BUGS["k"].fix] and "n_i / N" in result.fixes[0]


def test_accumulate_calls_the_untouched_starter_not_answered_yet():
    assert ex.check_accumulate(cell(ch08._ACCUMULATE_STARTER)).status == "unanswered"
    changed = ch08._ACCUMULATE_STARTER.replace("(loss / k)", "(loss / len(micro_batches))")
    assert ex.check_accumulate(cell(changed)).status == "failed"  # tried: graded


@pytest.mark.parametrize(
    ("bug", "words", "fix"),
    [
        ("none", "the sum of k means", "n_i / N"),
        ("positions", "count only the targets that enter the loss", "not y.numel()"),
        ("last", "keeps only the last one's", "zero_grad()"),
    ],
)
def test_accumulate_names_the_other_bugs(bug, words, fix):
    result = ex.check_accumulate(lambda model, micro_batches: ch08._accumulate(model, micro_batches, bug=bug))
    assert not result.passed and words in diagnosis(result), result.text
    assert fix not in result.text and any(fix in f for f in result.fixes)


def test_accumulate_fails_an_answer_that_rewrites_the_targets_in_place():
    def fills_padding(model, micro_batches):
        for _, y in micro_batches:
            y[y == -100] = 0  # "no more ignored targets": writes into the caller's tensors
        summed_accumulate(model, micro_batches)

    result = ex.check_accumulate(fills_padding)
    assert not result.passed and "changed its input in place (micro_batches[1][1])" in result.text, result.text


# ---------------------------------------------------------------- a loss-scaled step with clipping


def starter_step(model, optimizer, scaler, x, y, max_norm):  # the starter, changed: max_norm passed by name
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x, y)[1]
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
    scaler.step(optimizer)
    scaler.update()


def test_the_right_step_skips_an_overflow_and_halves_the_scale():
    """What the expected answer does, checked against GradScaler's documented rule independently."""
    model = ch08._tiny_gpt(0)
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    weights, scale = ch08._run_steps(ch08._scaled_step, 2.0**40, 1, 0.1)
    assert torch.equal(weights, before) and scale == 2.0**39  # skipped, backed off by half
    weights, scale = ch08._run_steps(ch08._scaled_step, 2.0**8, 2, 5.0)
    assert not torch.equal(weights, before) and scale == 2.0**9  # two good steps (growth_interval=2): doubled


def test_scaled_step_names_clipping_before_unscaling():
    result = ex.check_scaled_step(starter_step)
    assert not result.passed and "3 of 4 checks failed" in result.text, result.text
    assert diagnosis(result).count("you clip the *scaled* gradients") == 1 and "unscale_" not in result.text
    assert result.fixes == [ch08._SCALED_STEP_BUGS["clip_scaled"].fix] and "unscale_" in result.fixes[0]


@pytest.mark.parametrize("factor", [1.0, 1 + 1e-5], ids=["max_norm", "max_norm (1 + 1e-5)"])
def test_scaled_step_accepts_clipping_the_scaled_gradients_at_the_scaled_norm(factor):
    def clip_scaled_at_scaled_norm(model, optimizer, scaler, x, y, max_norm):  # equivalent: clip's epsilon moves
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x, y)[1]
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm * factor * scaler.get_scale())
        scaler.step(optimizer)
        scaler.update()

    # the weights move by 2e-6 here, 4e-6 on a reviewer's machine; a bound 1e-5 higher moves them as much
    assert ex.check_scaled_step(clip_scaled_at_scaled_norm).passed


def test_scaled_step_calls_the_untouched_starter_not_answered_yet():
    names = {"torch": torch}
    assert ex.check_scaled_step(cell(ch08._SCALED_STEP_STARTER, **names)).status == "unanswered"
    moved = ch08._SCALED_STEP_STARTER.replace("max_norm)  #", "max_norm * 1.0)  #")
    assert ex.check_scaled_step(cell(moved, **names)).status == "failed"


@pytest.mark.parametrize(
    ("bug", "words", "fix"),
    [
        ("no_clip", "your step never clips", "clip_grad_norm_"),
        ("twice", "the gradients end up divided twice", "scaler.unscale_(optimizer) unscales once"),
        ("plain_step", "your step writes NaN into the weights", "not optimizer.step()"),
        ("no_update", "the scaler must update the scale", "call scaler.update() after scaler.step(optimizer)"),
    ],
)
def test_scaled_step_names_the_other_bugs(bug, words, fix):
    result = ex.check_scaled_step(lambda *args: ch08._scaled_step(*args, bug=bug))
    assert not result.passed and words in diagnosis(result), result.text
    assert fix not in result.text and any(fix in f for f in result.fixes), result.fixes


# ---------------------------------------------------------------- attention split over processes by heads


@pytest.mark.parametrize(("n_heads", "world_size"), [(4, 1), (4, 2), (4, 4), (6, 3), (8, 2)])
def test_the_shares_sum_to_the_library_attention(n_heads, world_size):
    torch.manual_seed(0)
    attn = MultiHeadAttention(4 * n_heads, n_heads, bias=True)
    x = torch.randn(2, 7, 4 * n_heads)
    shares = ch08._all_shards(ch08._attention_shard, attn, x, world_size)
    torch.testing.assert_close(shares.sum(0) + attn.out_proj.bias, attn(x, is_causal=True), rtol=1e-5, atol=1e-6)
    for rank in range(world_size):  # each share: the layer with the other processes' heads silenced
        silenced = copy.deepcopy(attn)
        per = n_heads // world_size
        rows = torch.ones(n_heads, dtype=torch.bool)
        rows[rank * per : (rank + 1) * per] = False
        with torch.no_grad():
            silenced.v_proj.weight[rows.repeat_interleave(attn.d_head)] = 0
            silenced.v_proj.bias[rows.repeat_interleave(attn.d_head)] = 0
            silenced.out_proj.bias.zero_()
        torch.testing.assert_close(shares[rank], silenced(x, is_causal=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("bug", "words", "failures", "fix"),
    [
        ("bias", "adds it world_size times", 4, "leave the bias out"),
        ("no_mask", "must not attend to the later ones", 4, "is_causal=True"),
        ("interleaved", "contiguous block of heads", 2, "heads = range(rank * n_heads // world_size"),
        ("d_model", "not of the whole model", 4, "not 1/sqrt(d_model)"),
    ],
)
def test_attention_shard_names_the_bugs(bug, words, failures, fix):
    result = ex.check_attention_shard(lambda *args: ch08._attention_shard(*args, bug=bug))
    assert not result.passed and f"{failures} of 4 checks failed" in result.text, result.text
    assert result.text.count(words) == 1, result.text  # the concept once, however many cases failed
    assert fix not in result.text and any(fix in f for f in result.fixes), result.fixes


# ---------------------------------------------------------------- the 1F1B pipeline schedule (extend)


def gpipe(p, m):
    """The chapter's schedule: every forward, then every backward."""
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]


@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 4), (3, 5), (4, 2), (4, 8)])
def test_the_paper_timeline_of_gpipe_follows_the_bubble_formula(p, m):
    """A stage works m (t_F + t_B) of (m + p - 1)(t_F + t_B): idle (p - 1) / (m + p - 1), as the chapter measures."""
    problem, peaks, finish = ch08.pipeline_timeline(gpipe(p, m), p, m)
    t = ch08.PIPELINE_T_FORWARD + ch08.PIPELINE_T_BACKWARD
    assert problem == "ok" and peaks == [m] * p and finish == (m + p - 1) * t
    assert 1 - m * t / finish == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (3, 5), (4, 2), (5, 3)])
def test_1f1b_finishes_with_gpipe_and_holds_at_most_p_minus_s_micro_batches(p, m):
    problem, peaks, finish = ch08.pipeline_timeline(ch08._one_f_one_b(p, m), p, m)
    assert problem == "ok" and finish == ch08.pipeline_timeline(gpipe(p, m), p, m)[2]
    assert peaks == [min(p - s, m) for s in range(p)]


def test_the_timeline_names_a_missing_step_and_a_deadlock():
    assert "must run ('F', i) and ('B', i) once each" in ch08.pipeline_timeline([[("F", 0)], gpipe(2, 1)[1]], 2, 1)[0]
    swapped = [[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]]  # stage 1's backward before its own forward
    problem = ch08.pipeline_timeline(swapped, 2, 1)[0]
    assert problem.startswith("the schedule deadlocks: ") and "stage 1 at ('B', 0)" in problem
    assert "every step must be a pair" in ch08.pipeline_timeline([[0, 1], [0, 1]], 2, 1)[0]


def warm_up_p_minus_s(p, m):
    """1F1B with one forward too many ahead: min(p - s, m)."""
    schedule = []
    for s in range(p):
        ahead = min(p - s, m)
        steady = [op for i in range(ahead, m) for op in (("F", i), ("B", i - ahead))]
        schedule.append([("F", i) for i in range(ahead)] + steady + [("B", i) for i in range(m - ahead, m)])
    return schedule


def test_one_f_one_b_blames_the_time_of_a_schedule_within_the_memory_bound():
    one_at_a_time = ex.check_one_f_one_b(lambda p, m: [[op for i in range(m) for op in (("F", i), ("B", i))]] * p)
    assert not one_at_a_time.passed and one_at_a_time.text.count("❌") == 4, one_at_a_time.text
    assert 'got "ends at 24, after GPipe\'s 15"' in one_at_a_time.text and "holds" not in one_at_a_time.text
    too_many = ex.check_one_f_one_b(warm_up_p_minus_s)  # ends with GPipe, holding one more than needed
    assert "got 'stage 0 holds 3 (at most 2), stage 1 holds 2 (at most 1)'" in too_many.text, too_many.text


def test_one_f_one_b_accepts_any_valid_1f1b_and_names_the_classic_mistakes():
    assert ex.check_one_f_one_b(lambda p, m: ch08._one_f_one_b(p, m)).passed
    as_lists = ex.check_one_f_one_b(lambda p, m: [[[k, i] for k, i in ops] for ops in ch08._one_f_one_b(p, m)])
    assert as_lists.passed  # lists instead of tuples are fine
    for bug, words in [
        ("gpipe", "that is GPipe's order"),
        ("same", "every stage runs as many forwards ahead as the first one"),
        ("reversed", "the first stage must run the most forwards ahead"),
        ("uncapped", "fewer micro-batches than stages"),
    ]:
        result = ex.check_one_f_one_b(lambda p, m, bug=bug: ch08._one_f_one_b(p, m, bug=bug))
        assert not result.passed and words in result.text, result.text
        assert "p - s - 1" not in result.text and any("min(p - s - 1, m)" in fix for fix in result.fixes)
    assert "GPipe's order" not in ex.check_one_f_one_b(warm_up_p_minus_s).text  # not GPipe, even where m < p
    starter = cell("def one_f_one_b(p, m):\n    ...  # your code here\n")
    assert ex.check_one_f_one_b(starter).status == "unanswered"

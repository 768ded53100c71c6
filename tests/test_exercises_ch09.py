"""Chapter 9's checkers: the predicted size of a padded batch's KV cache (compared with caches measured on the meta
device), int8 quantization per group, the soft term of a distillation loss and the verify step of speculative
decoding accept right answers, call an untouched starter "not answered yet", and name the classic mistakes (the
real tokens counted without the padding, one scale per row, truncation instead of rounding, dividing by 128,
F.kl_div's default reduction, KL the wrong way round, counting agreements after the first disagreement): the
concept by default, the fix in code only on request."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import diagnosis
from transformer_lib import GPT, GPTConfig, KVCache, MultiHeadAttention
from transformer_lib.distillation import distillation_loss
from transformer_lib.memory import cache_bytes
from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import ch09_inference_and_deployment as ch09
from transformer_lib.quantization import dequantize, quantize_per_channel

# ---------------------------------------------------------------- the KV cache of a padded batch (a prediction)


def measured_long_cache_gib() -> float:
    """The setup's caches, measured: one grouped-query attention layer on the meta device (shapes, no memory) fed
    the whole batch, padded to its longest prompt, its cache weighed, times the number of layers."""
    s = ch09.LONG_CACHE_SETUP
    assert s["n_tokens"] == max(ch09.LONG_CACHE_PROMPTS) and s["batch"] == len(ch09.LONG_CACHE_PROMPTS)
    d_model = s["n_heads"] * s["d_head"]
    with torch.device("meta"):
        attn = MultiHeadAttention(d_model, s["n_heads"], n_kv_heads=s["n_kv_heads"], bias=False).to(torch.bfloat16)
        x = torch.empty(s["batch"], s["n_tokens"], d_model, dtype=torch.bfloat16)
        cache = KVCache()
        attn(x, cache=cache, is_causal=True)
    assert cache.k.shape == (s["batch"], s["n_kv_heads"], s["n_tokens"], s["d_head"])
    assert cache.k.element_size() == s["bytes_per_number"]
    return s["n_layers"] * cache_bytes([cache]) / 2**30


def test_long_cache_formula_equals_a_measured_cache():
    measured = measured_long_cache_gib()
    assert measured == ch09.kv_cache_gib(**ch09.LONG_CACHE_SETUP) == 16.0
    result = ex.check_kv_cache_gib(measured)
    assert result.passed and result.status == "passed", result.text
    assert ex.check_kv_cache_gib(16).passed and ex.check_kv_cache_gib(16.03).passed  # within 0.05 GiB


@pytest.mark.parametrize(
    "prediction, words",
    [
        (6.75, "that is the cache of the real tokens alone"),  # 55,296 tokens x 128 KiB: the padding forgotten
        (64, "every query head keeping keys and values"),
        (32, "a bfloat16 number takes 2 bytes"),
        (4, "that is one sequence"),
        (8, "you count half of what a layer caches"),
        (17.18, "that is in GB"),
        (0.5, "that is one layer"),
        (2, "that is for 4,096 positions"),
        (15, "then count the positions that the batch's cache tensor holds"),
    ],
)
def test_long_cache_names_the_mistake(prediction, words):
    result = ex.check_kv_cache_gib(prediction)
    assert not result.passed and "expected 16 (within 0.05)" in result.text
    assert words in result.text, result.text
    assert "padding included" not in result.text and any("padding included: 16 GiB" in f for f in result.fixes)


def test_the_real_tokens_of_the_padded_batch_fill_less_than_half_of_its_cache():
    real = ch09.kv_cache_gib(**{**ch09.LONG_CACHE_SETUP, "n_tokens": sum(ch09.LONG_CACHE_PROMPTS), "batch": 1})
    assert real == 6.75 and ch09.kv_cache_gib(**ch09.LONG_CACHE_SETUP) - real == 9.25  # the solution's numbers


def test_long_cache_unanswered_and_odd_values():
    assert ex.check_kv_cache_gib(...).status == "unanswered"
    for odd in ("16", None, [16], torch.tensor([16.0, 1.0]), float("nan"), True):
        assert not ex.check_kv_cache_gib(odd).passed, odd


def test_the_chapter_meta_model_has_llama_3_8b_parameters_and_the_same_cache():
    """The chapter builds the whole model on the meta device: 8.03 billion parameters, 16 GiB of caches."""
    config = GPTConfig(vocab_size=128256, block_size=32768, n_layers=32, n_heads=32, d_model=4096, n_kv_heads=8,
                       d_ff=14336, tie_weights=False, norm="rmsnorm", activation="swiglu", positional="rope",
                       bias=False)  # fmt: skip
    with torch.device("meta"):
        big = GPT(config).to(torch.bfloat16)
        h = torch.empty(4, 32768, 4096, dtype=torch.bfloat16)
        caches = [KVCache() for _ in big.blocks]
        for block, cache in zip(big.blocks, caches, strict=True):
            block.self_attn(block.norm1(h), cache=cache, is_causal=True)
    assert round(sum(p.numel() for p in big.parameters()) / 1e9, 2) == 8.03
    assert cache_bytes(caches) / 2**30 == ch09.kv_cache_gib(**ch09.LONG_CACHE_SETUP)


# ---------------------------------------------------------------- int8 with a scale per group


def via_the_library(weight, group_size):
    """Per-group quantization is per-channel quantization of the weight with each group as a row."""
    q, scale = quantize_per_channel(weight.reshape(-1, group_size))
    return q.view(weight.shape), scale.view(weight.shape[0], -1)


def with_a_loop(weight, group_size):
    """A learner's loop over groups, with an explicit zero test."""
    q = torch.zeros(weight.shape, dtype=torch.int8)
    scale = torch.zeros(weight.shape[0], weight.shape[1] // group_size)
    for i in range(weight.shape[0]):
        for g in range(weight.shape[1] // group_size):
            group = weight[i, g * group_size : (g + 1) * group_size]
            s = group.abs().max() / 127
            scale[i, g] = s
            if s > 0:
                q[i, g * group_size : (g + 1) * group_size] = torch.round(group / s).to(torch.int8)
    return q, scale


def test_group_reference_equals_the_library_per_channel_and_errs_by_half_a_step():
    for _, weight, group_size in ch09._group_weights():
        q, scale = ch09._quantize_per_group(weight, group_size)
        q_lib, scale_lib = via_the_library(weight, group_size)
        assert torch.equal(q, q_lib) and torch.equal(scale, scale_lib)
        groups = q.float().view(weight.shape[0], -1, group_size) * scale[..., None]
        error = (weight.view_as(groups) - groups).abs()
        assert (error <= scale[..., None] / 2 + 1e-7).all()
        if group_size == weight.shape[1]:  # one group per row: per-channel quantization
            q_channel, scale_channel = quantize_per_channel(weight)
            assert torch.equal(q, q_channel) and torch.equal(scale[:, 0], scale_channel)
            assert torch.equal(dequantize(q_channel, scale_channel), groups.view_as(weight))


@pytest.mark.parametrize("answer", [via_the_library, with_a_loop])
def test_group_quantization_accepts_right_answers(answer):
    result = ex.check_quantize_per_group(answer)
    assert result.passed, result.text
    assert result.text.count("✅") == 6


def _groups(weight, group_size):
    return weight.reshape(weight.shape[0], -1, group_size)


def truncating(weight, group_size):
    scale = _groups(weight, group_size).abs().amax(-1) / 127
    q = (_groups(weight, group_size) / torch.where(scale > 0, scale, 1)[..., None]).to(torch.int8)
    return q.view(weight.shape), scale


def by_128(weight, group_size):
    scale = _groups(weight, group_size).abs().amax(-1) / 128
    q = torch.round(_groups(weight, group_size) / torch.where(scale > 0, scale, 1)[..., None]).to(torch.int8)
    return q.view(weight.shape), scale


def by_128_clamped(weight, group_size):
    q, scale = by_128(weight, group_size)
    ratio = _groups(weight, group_size) / torch.where(scale > 0, scale, 1)[..., None]
    return torch.round(ratio).clamp(-128, 127).to(torch.int8).view(weight.shape), scale


def per_row_repeated(weight, group_size):
    q, scale = quantize_per_channel(weight)
    return q, scale[:, None].repeat(1, weight.shape[1] // group_size)


def along_columns(weight, group_size):
    groups = weight.reshape(weight.shape[0] // group_size, group_size, weight.shape[1])
    scale = groups.abs().amax(1) / 127
    q = torch.round(groups / scale[:, None, :]).clamp(-127, 127).to(torch.int8)
    return q.reshape(weight.shape), scale


@pytest.mark.parametrize(
    "answer, words, n_cases",
    [
        (truncating, "the cast to int8 truncates towards zero", 4),
        (by_128, "the largest weight of each group lands on 128", 4),
        (by_128_clamped, "the largest weight of each group lands on 128", 4),
        (per_row_repeated, "that is one scale per row (the chapter's per-channel quantization)", 3),
        (along_columns, "a group is group_size consecutive weights of one ROW", 1),
    ],
    ids=["truncation", "128", "128 clamped", "one scale per row", "groups along a column"],
)
def test_group_quantization_names_each_classic_bug(answer, words, n_cases):
    result = ex.check_quantize_per_group(answer)
    assert not result.passed and result.text.count("❌") >= n_cases, result.text  # (groups along a column raise)
    assert result.text.count(words) == 1, result.text  # the concept once, however many cases failed
    assert "torch.round" not in result.text and "/ 127" not in result.text and result.fixes  # the fix on request


def test_group_quantization_without_the_zero_guard_fails_whatever_the_cast_makes_of_nan():
    """0 / 0 is NaN, and casting NaN to int8 is up to the machine (0 on some): the checker sees the NaN before."""

    def unguarded(weight, group_size, guard_after=False):
        scale = _groups(weight, group_size).abs().amax(-1) / 127
        q = torch.round(_groups(weight, group_size) / scale[..., None]).clamp(-127, 127)
        q = torch.where(scale[..., None] > 0, q, 0) if guard_after else q
        return q.to(torch.int8).view(weight.shape), scale

    result = ex.check_quantize_per_group(unguarded)
    assert not result.passed and "❌ the group of zeros: no NaN or inf on its way to int8" in result.text, result.text
    assert "a group of zeros has a scale of 0" in result.text
    assert ex.check_quantize_per_group(lambda w, g: unguarded(w, g, guard_after=True)).passed  # NaN replaced in time


def test_group_quantization_wants_int8_and_the_right_scale_shape():
    as_float = ex.check_quantize_per_group(lambda w, g: (via_the_library(w, g)[0].float(), via_the_library(w, g)[1]))
    assert not as_float.passed and "expected an integer tensor" in as_float.text
    wide = ex.check_quantize_per_group(lambda w, g: (via_the_library(w, g)[0].long(), via_the_library(w, g)[1]))
    assert not wide.passed and "expected 'torch.int8', got 'torch.int64'" in wide.text, wide.text
    flat = ex.check_quantize_per_group(lambda w, g: (via_the_library(w, g)[0], via_the_library(w, g)[1].flatten()))
    assert not flat.passed and "item 1 of the tuple: expected shape" in flat.text


# ---------------------------------------------------------------- the soft term of distillation (spot the bug)


def cell(source: str):
    """The function that a notebook cell of ``source`` defines, run with the chapter's imports (torch, F)."""
    namespace = {"torch": torch, "F": F}
    exec(compile(source, "<cell>", "exec", dont_inherit=True), namespace)
    return next(v for k, v in namespace.items() if k not in ("torch", "F", "__builtins__"))


def starter_soft_loss(student_logits, teacher_logits, T):
    """The exercise's starter, changed only by this docstring: F.kl_div with its default reduction."""
    log_p_student = F.log_softmax(student_logits / T, dim=-1)
    p_teacher = F.softmax(teacher_logits / T, dim=-1)
    return F.kl_div(log_p_student, p_teacher) * T**2


def fixed_soft_loss(student_logits, teacher_logits, T):
    log_p_student = F.log_softmax(student_logits / T, dim=-1)
    return F.kl_div(log_p_student, F.softmax(teacher_logits / T, dim=-1), reduction="batchmean") * T**2


def by_formula(student_logits, teacher_logits, T):
    p = F.softmax(teacher_logits / T, -1)
    return T**2 * (p * (p.log() - F.log_softmax(student_logits / T, -1))).sum(-1).mean()


def test_soft_loss_reference_equals_the_library_soft_term():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(7, 30, generator=g), torch.randn(7, 30, generator=g)
    y = torch.randint(0, 30, (7,), generator=g)
    for T in (0.5, 1.0, 3.0):
        torch.testing.assert_close(ch09._soft_loss(s, t, T), distillation_loss(s, t, y, T, alpha=1.0))


@pytest.mark.parametrize("answer", [fixed_soft_loss, by_formula])
def test_soft_loss_accepts_right_answers(answer):
    result = ex.check_soft_loss(answer)
    assert result.passed, result.text


def test_soft_loss_names_the_starter_bug():
    with pytest.warns(UserWarning, match="batchmean"):  # PyTorch's own warning about reduction="mean"
        result = ex.check_soft_loss(starter_soft_loss)
    assert not result.passed and result.text.count("❌") == 3
    assert diagnosis(result).count("your loss is smaller than T² times the KL by a constant factor") == 1
    assert "batchmean" not in result.text and result.fixes == [ch09._SOFT_LOSS_BUGS["mean"].fix]
    # the factor the exercise asks about: vocab_size
    s, t = torch.randn(5, 78), torch.randn(5, 78)
    with pytest.warns(UserWarning):
        ratio = fixed_soft_loss(s, t, 2.0) / starter_soft_loss(s, t, 2.0)
    assert abs(ratio.item() - 78) < 1e-3


def test_soft_loss_calls_the_untouched_starter_not_answered_yet():
    assert ex.check_soft_loss(cell(ch09._SOFT_LOSS_STARTER)).status == "unanswered"
    with pytest.warns(UserWarning):
        tried = ex.check_soft_loss(cell(ch09._SOFT_LOSS_STARTER.replace("* T**2", "* T**2.0")))
    assert tried.status == "failed"  # changed, still wrong: graded


@pytest.mark.parametrize(
    "answer, words, n_cases",
    [
        (
            lambda s, t, T: F.kl_div(F.log_softmax(s / T, -1), F.softmax(t / T, -1), reduction="sum") * T**2,
            "your loss adds the KL of every position",
            3,
        ),
        (lambda s, t, T: fixed_soft_loss(t, s, T), "that is KL(student || teacher)", 3),
        (lambda s, t, T: fixed_soft_loss(s, t, T) / T**2, "the softened KL's gradients shrink like 1 / T²", 2),
        (lambda s, t, T: fixed_soft_loss(s, t, T) / T, "the factor that restores the gradients' size is T², not T", 2),
    ],
    ids=["sum", "swapped", "no T^2", "T"],
)
def test_soft_loss_names_each_classic_bug(answer, words, n_cases):
    result = ex.check_soft_loss(answer)
    assert not result.passed and result.text.count("❌") == n_cases  # at T = 1 the T and T^2 bugs are right answers
    assert diagnosis(result).count(words) == 1, result.text
    assert "T**2" not in result.text and "batchmean" not in result.text and result.fixes


# ---------------------------------------------------------------- the verify step of speculative decoding


def starter_accepted_tokens(proposals, choices):  # the starter's bug, retyped: the agreements summed anywhere
    agree = proposals == choices[:-1]
    n_accepted = int(torch.sum(agree))
    return torch.cat([proposals[:n_accepted], choices[n_accepted : n_accepted + 1]])


def fixed_accepted_tokens(proposals, choices):
    agree = proposals == choices[:-1]
    n_accepted = int(agree.long().cumprod(dim=0).sum())
    return torch.cat([proposals[:n_accepted], choices[n_accepted : n_accepted + 1]])


def loop_accepted_tokens(proposals, choices):
    n = 0
    while n < len(proposals) and proposals[n] == choices[n]:
        n += 1
    return choices[: n + 1]


@pytest.mark.parametrize("answer", [fixed_accepted_tokens, loop_accepted_tokens])
def test_accepted_tokens_accepts_right_answers(answer):
    result = ex.check_accepted_tokens(answer)
    assert result.passed, result.text
    assert result.text.count("✅") == 6


def test_accepted_tokens_names_the_starter_bug():
    result = ex.check_accepted_tokens(starter_accepted_tokens)
    assert not result.passed and result.text.count("❌") == 4  # the cases with a match after a mismatch
    assert diagnosis(result).count("you keep every agreeing proposal") == 1, result.text
    assert "cumprod" not in result.text and result.fixes == [ch09._ACCEPTED_BUGS["count"].fix]


def test_accepted_tokens_calls_the_untouched_starter_not_answered_yet():
    assert ex.check_accepted_tokens(cell(ch09._ACCEPTED_STARTER)).status == "unanswered"
    tried = ch09._ACCEPTED_STARTER.replace("int(agree.sum())", "int(agree.sum()) if agree.any() else 0")
    assert ex.check_accepted_tokens(cell(tried)).status == "failed"


def draft_token_at_the_mismatch(proposals, choices):
    n = len(fixed_accepted_tokens(proposals, choices)) - 1
    return proposals[: n + 1] if n < len(proposals) else choices


@pytest.mark.parametrize(
    "answer, words, n_cases",
    [
        (lambda p, c: fixed_accepted_tokens(p, c)[:-1], "every round yields at least one token", 4),
        (lambda p, c: fixed_accepted_tokens(p, c)[:-1], "comes for free", 2),  # all agree: the bonus is missing
        (draft_token_at_the_mismatch, "not the draft's rejected proposal", 4),
        (lambda p, c: fixed_accepted_tokens(p, c)[: len(p)], "comes for free", 2),
    ],
    ids=["no target token", "no target token when all agree", "the draft's token at the mismatch", "no bonus token"],
)
def test_accepted_tokens_names_each_classic_bug(answer, words, n_cases):
    result = ex.check_accepted_tokens(answer)
    assert not result.passed and result.text.count("❌") >= n_cases
    assert diagnosis(result).count(words) == 1, result.text  # the concept once
    assert "choices[" not in result.text and result.fixes  # the fix in code on request


def speculative_with(verify, target: GPT, draft: GPT, idx: torch.Tensor, n_new: int, k: int) -> torch.Tensor:
    """Greedy speculative decoding (no caches) with ``verify(proposals, choices)`` as the verify step."""
    end = idx.shape[1] + n_new
    with torch.no_grad():
        while idx.shape[1] < end:
            T = idx.shape[1]
            k_round = min(k, end - T - 1)
            guess = idx
            for _ in range(k_round):
                guess = torch.cat([guess, draft(guess)[0][:, -1:].argmax(-1)], dim=1)
            choices = target(guess)[0][0, T - 1 :].argmax(-1)
            idx = torch.cat([idx, verify(guess[0, T:], choices)[None]], dim=1)
    return idx[:, :end]


def test_the_verify_step_drives_speculative_decoding_to_the_target_greedy_text_and_the_bug_does_not():
    """The checker's reference, as the verify step of a whole speculative loop, writes the target's greedy text;
    the starter's count writes another text for some prompt (a draft close to the target agrees, disagrees, agrees)."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=11, block_size=48, n_layers=2, n_heads=2, d_model=32, tie_weights=False)
    target = GPT(config).eval()
    draft = GPT(config).eval()
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():  # a draft close to the target: it agrees often, not always
        for p in draft.parameters():
            p.add_(0.3 * p.std() * torch.randn_like(p))
    differs = 0
    for seed in range(6):
        idx = torch.randint(0, 11, (1, 4), generator=torch.Generator().manual_seed(seed))
        expected = target.generate(idx, 40, temperature=0)
        assert torch.equal(speculative_with(ch09._accepted_tokens, target, draft, idx, 40, k=4), expected)
        differs += not torch.equal(speculative_with(starter_accepted_tokens, target, draft, idx, 40, k=4), expected)
    assert differs > 0


# ---------------------------------------------------------------- how far batching goes (a prediction)


def test_batch_ceiling_is_the_per_sequence_flops_over_the_per_sequence_cache():
    s = ch09.BATCH_CEILING_SETUP
    cache_per_position = 2 * s["n_layers"] * s["n_kv_heads"] * s["d_head"] * s["bytes_per_number"]
    assert cache_per_position == 327_680  # 320 KiB: the 70B shape's 8 key/value heads in 16 bits
    per_sequence_flops = 2 * 68.98e9 + 4 * 80 * 8192 * 4096  # every weight, then 64 query heads over the cache
    limit = ch09.batched_decode_intensity(float("inf"), **s)
    assert limit == pytest.approx(per_sequence_flops / (cache_per_position * 4096)) == pytest.approx(110.788, abs=1e-3)
    intensities = [ch09.batched_decode_intensity(b, **s) for b in (1, 8, 64, 512, 10**6)]
    assert intensities == sorted(intensities) and intensities[-1] == pytest.approx(limit, rel=1e-3)  # rising to it
    assert ch09.batched_decode_intensity(1, **s) == pytest.approx(1.0674, abs=1e-4)  # one sequence: memory-bound
    assert limit < ch09.RIDGE_H100 / 2  # even an unbounded batch stays below an H100's ridge at this context


def test_batch_ceiling_accepts_the_answer():
    assert ex.check_batched_intensity(110.8).passed and ex.check_batched_intensity(111).passed
    assert ex.check_batched_intensity(...).status == "unanswered"
    for odd in ("110.8", None, [110.8], float("nan"), True):
        assert not ex.check_batched_intensity(odd).passed, odd


@pytest.mark.parametrize(
    "prediction, words",
    [
        (295.2, "that is the ridge of an H100"),
        (1.07, "that is one sequence at a time"),
        (102.8, "you left out the attention's own FLOPs"),
        (103.8, "count every query head"),
        (13.85, "only the 8 key/value heads are cached"),
        (221.6, "a key AND a value"),
        (55.4, "2 bytes per number"),
        (8.0, "that is the attention alone"),
        (50.0, "then let B grow"),
    ],
)
def test_batch_ceiling_names_the_mistake(prediction, words):
    result = ex.check_batched_intensity(prediction)
    assert not result.passed and "expected 110.788 (within 0.5)" in result.text
    assert words in result.text, result.text
    assert "1.487e11" not in result.text and any("about 110.8 FLOPs per byte" in f for f in result.fixes)

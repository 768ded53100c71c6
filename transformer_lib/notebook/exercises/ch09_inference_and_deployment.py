"""Chapter 9, inference and deployment: ``check_kv_cache_gib`` (a prediction: the KV cache of a padded batch),
``check_quantize_per_group`` (int8 weights per group), ``check_soft_loss`` (distillation's soft term),
``check_accepted_tokens`` (speculative decoding's verify step), ``check_batched_intensity`` (a prediction)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from ...distillation import distillation_loss
from ...quantization import QMAX, quantize_per_channel
from ._framework import Checker, Hint, checker, same_fix

ANSWER_MARKERS: dict[str, tuple[str, ...]] = {  # exercise label -> strings that would give its answer away
    "ex-long-cache": ("16 gib", "9.25 gib", "padding positions"),
    "ex-group-int8": ("// group_size, group_size", "amax(dim=-1) / 127"),
    "ex-soft-loss": ("batchmean",),
    "ex-accept": ("cumprod", "agreeing prefix"),
    "ex-batch-ceiling": ("110.8", "110.79", "111 flops"),
}


# --------------------------------------------------------------------------- the KV cache of a padded batch


LONG_CACHE_SETUP = dict(n_layers=32, n_heads=32, n_kv_heads=8, d_head=128, bytes_per_number=2, n_tokens=32768, batch=4)
"""The prediction's server: a LLaMA-3-8B-shaped model (grouped-query attention, 8 key/value heads), a bfloat16
cache, a batch of 4 prompts padded to the longest, 32,768 tokens."""
LONG_CACHE_PROMPTS = (32768, 16384, 4096, 2048)
"""The lengths of the batch's 4 prompts: the shorter ones are padded to the longest."""

GIB = 2**30


def kv_cache_gib(
    n_layers: int, n_heads: int, n_kv_heads: int, d_head: int, bytes_per_number: int, n_tokens: int, batch: int
) -> float:
    """GiB of the KV caches of ``batch`` sequences of ``n_tokens`` (``n_heads``, the query heads, do not count)."""
    return 2 * n_layers * n_kv_heads * d_head * bytes_per_number * n_tokens * batch / GIB


_LONG_CACHE_FIX = (
    "2 (a key and a value) x 32 layers x 8 key/value heads x 128 x 2 bytes = 128 KiB per position; the "
    "batch's cache holds 4 x 32,768 positions, padding included: 16 GiB."
)


@checker(answer="value", reference=kv_cache_gib(**LONG_CACHE_SETUP))  # a meta-device model's: test_exercises_ch09
def check_kv_cache_gib(c: Checker, prediction: float) -> None:
    """Check ``prediction``: the GiB of the bfloat16 KV caches of a batch of 4 prompts of 32,768, 16,384, 4,096 and
    2,048 tokens, padded to the longest, for 32 layers with 32 query heads of 128 and 8 key/value heads."""
    s = LONG_CACHE_SETUP
    expected = kv_cache_gib(**s)

    def gib(**changed: int) -> float:  # the setup's GiB with some numbers changed
        return kv_cache_gib(**{**s, **changed})

    mistakes = {
        gib(n_tokens=sum(LONG_CACHE_PROMPTS), batch=1): "that is the cache of the real tokens alone. But the 4 "
        "prompts are served as one batch, padded to the longest (chapter 2): which positions does the batch's "
        "cache tensor hold?",
        gib(n_kv_heads=s["n_heads"]): "that is the cache with every query head keeping keys and values; with "
        "grouped-query attention only the key/value heads are cached (reread 'Fewer key/value heads').",
        gib(bytes_per_number=4): "a bfloat16 number takes 2 bytes, not 4 (or: did you count all 32 heads and forget "
        "the factor 2?).",
        gib(batch=1): "that is one sequence: each of the 4 sequences of the batch has its own cache.",
        expected / 2: "you count half of what a layer caches for each position.",
        expected * GIB / 1e9: "that is in GB (10^9 bytes); a GiB is 2^30 = 1,073,741,824 bytes.",
        expected / s["n_layers"]: "that is one layer: each layer caches its own.",
        gib(n_tokens=4096): "that is for 4,096 positions per sequence; the batch is longer.",
    }
    c.case(
        "GiB of the caches",
        lambda: prediction,
        float(expected),
        bugs=same_fix(_LONG_CACHE_FIX, mistakes),
        hint=Hint(
            "per position, every layer caches a key and a value for each key/value head; reread the formula of "
            "'The KV cache at scale', then count the positions that the batch's cache tensor holds.",
            _LONG_CACHE_FIX,
        ),
        atol=0.05,
    )


# --------------------------------------------------------------------------- int8 with a scale per group


def _quantize_per_group(weight: Tensor, group_size: int, *, bug: str = "") -> tuple[Tensor, Tensor]:
    """Symmetric int8 with one scale per group of a row, or with a bug of :data:`_QUANTIZE_BUGS` ("128 wrap": the cast
    wraps or saturates as this machine does it)."""
    w = weight.detach().float()
    out_features, in_features = w.shape
    if bug == "columns":
        groups = w.reshape(out_features // group_size, group_size, in_features)
        scale = groups.abs().amax(dim=1) / QMAX  # (out // g, in)
        q = torch.round(groups / scale.clamp_min(1e-30)[:, None, :]).clamp(-QMAX, QMAX).to(torch.int8)
        return q.reshape(out_features, in_features), scale
    groups = w.reshape(out_features, in_features // group_size, group_size)
    if bug == "row":  # the row's scale, repeated for each group
        scale = (w.abs().amax(dim=1, keepdim=True) / QMAX).expand(out_features, in_features // group_size).clone()
    else:
        scale = groups.abs().amax(dim=-1) / (128 if bug.startswith("128") else QMAX)  # (out, n_groups)
    divisor = scale if bug == "zero" else torch.where(scale > 0, scale, torch.ones_like(scale))
    ratio = groups / divisor[..., None]
    q = ratio if bug == "truncate" else torch.round(ratio)
    if bug != "128 wrap":
        q = q.clamp(-128 if bug == "128" else -QMAX, QMAX)
    return q.to(torch.int8).reshape(out_features, in_features), scale


def _group_weights() -> list[tuple[str, Tensor, int]]:
    g = torch.Generator().manual_seed(9)
    plain = torch.randn(8, 64, generator=g) * 0.02
    outliers = torch.randn(32, 128, generator=g) * 0.02
    outliers[:, 5] *= 40.0  # one outlier feature, as in real large models: it coarsens only its own groups
    outliers[:, 70] *= 15.0
    zeros = torch.randn(6, 48, generator=g)
    zeros[2, 8:16] = 0.0  # a whole group of zeros: its scale is 0
    return [
        ("(8, 64) weight, groups of 16", plain, 16),
        ("(32, 128) weight with two outlier columns, groups of 32", outliers, 32),
        ("(6, 48) weight with a group of zeros, groups of 8", zeros, 8),
        ("(8, 64) weight, one group per row (= per-channel quantization)", plain, 64),
    ]


_128 = (
    "int8's symmetric range is [-127, 127]: with your step, the largest weight of each group lands on 128, which "
    "int8 cannot hold"
)
_128_FIX = "scale = the group's largest |w| / 127, not / 128."
_QUANTIZE_BUGS = {  # bug -> hint, for _quantize_per_group(..., bug=bug)
    "truncate": Hint(
        "your integers are off by up to a whole step: the cast to int8 truncates towards zero, where the "
        "nearest point of the grid is wanted (reread 'Quantization: int8 weights').",
        "torch.round(w / scale) before .to(torch.int8).",
    ),
    "128": Hint(_128 + ".", _128_FIX),
    "128 wrap": Hint(_128 + ", and the cast wraps it to -128.", _128_FIX),
    "row": Hint(
        "that is one scale per row (the chapter's per-channel quantization), repeated for each group: each group "
        "of group_size weights needs the largest magnitude of its own weights.",
        "reshape to (out_features, in_features // group_size, group_size) and take the largest |w| over the "
        "last dimension.",
    ),
    "zero": Hint(
        "a group of zeros has a scale of 0, and 0 / 0 is NaN, which no int8 can hold: such a group's q must be 0.",
        "divide by torch.where(scale > 0, scale, 1) so that the group's q is 0.",
    ),
    "columns": Hint(
        "a group is group_size consecutive weights of one ROW (one output channel, along the input features), "
        "not of a column.",
        "reshape to (out_features, in_features // group_size, group_size).",
    ),
}
_QUANTIZE_HINT = Hint(
    "each group of group_size consecutive weights of a row is quantized as the chapter quantizes a row: its own "
    "scale from its own largest magnitude, then each weight rounded to the nearest step. Reread 'Quantization: "
    "int8 weights'.",
    "reshape the weight to (out_features, in_features // group_size, group_size): scale = the largest |w| of each "
    "group / 127, shape (out_features, n_groups); q = round(w / scale), clamped to [-127, 127] and cast to int8 "
    "(where scale is 0, divide by 1 instead); reshape q back to the weight's shape.",
)


class _NonFiniteCast(TorchFunctionMode):
    """Notes a tensor holding NaN or inf cast to an integer dtype: the cast hides it (NaN may become 0)."""

    seen = False

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if isinstance(out, Tensor) and not (out.is_floating_point() or out.dtype == torch.bool):
            self.seen |= any(isinstance(a, Tensor) and a.is_floating_point() and not a.isfinite().all() for a in args)
        return out


_NAN_CAST = "NaN or inf cast to an integer"


def _cast(quantize: Callable[[Tensor, int], Any], weight: Tensor, group_size: int) -> str:
    with _NonFiniteCast() as mode:
        quantize(weight, group_size)
    return _NAN_CAST if mode.seen else "no " + _NAN_CAST


def _per_channel_groups(weight: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    q, scale = quantize_per_channel(weight.reshape(-1, group_size))
    return q.view(weight.shape), scale.view(weight.shape[0], -1)


@checker(reference=_per_channel_groups)
def check_quantize_per_group(c: Checker, quantize_per_group: Callable[[Tensor, int], tuple[Tensor, Tensor]]) -> None:
    """Check ``quantize_per_group(weight, group_size)``: symmetric int8, one scale per group of ``group_size``
    weights of a row. Shapes: weight (out, in) -> q (out, in) int8, scale (out, in // group_size) float32."""
    cases = [(name, {"weight": weight, "group_size": size}) for name, weight, size in _group_weights()]
    c.cases(quantize_per_group, cases, _quantize_per_group, _QUANTIZE_BUGS, hint=_QUANTIZE_HINT)
    c.case(
        "q is stored in int8 (1 byte per weight)",
        lambda weight, group_size: str(quantize_per_group(weight, group_size)[0].dtype),
        str(torch.int8),
        hint=Hint(
            "q must take one byte per weight: an int64 or float tensor takes 8 or 4.",
            "cast the rounded integers with .to(torch.int8).",
        ),
        inputs=cases[0][1],
    )
    c.case(
        "the group of zeros: no NaN or inf on its way to int8",
        lambda weight, group_size: _cast(quantize_per_group, weight, group_size),
        "no " + _NAN_CAST,
        bugs={_NAN_CAST: _QUANTIZE_BUGS["zero"]},
        inputs=cases[2][1],
    )


# --------------------------------------------------------------------------- the soft term of distillation


def _soft_loss(student_logits: Tensor, teacher_logits: Tensor, T: float, *, bug: str = "") -> Tensor:
    """``T**2 * KL(teacher || student)`` at temperature T, averaged over the rows, or with a bug of
    :data:`_SOFT_LOSS_BUGS`."""
    log_p_s, log_p_t = (F.log_softmax(logits.double() / T, dim=-1) for logits in (student_logits, teacher_logits))
    if bug == "swapped":
        log_p_s, log_p_t = log_p_t, log_p_s
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)  # (N,)
    value = {"mean": kl.mean() / student_logits.shape[-1], "sum": kl.sum()}.get(bug, kl.mean())
    factor = {"no T2": 1.0, "T": T}.get(bug, T**2)
    return (factor * value).to(student_logits.dtype)


_SOFT_LOSS_CASES = (  # (name, N positions, vocab_size, T)
    ("N=6 positions, vocabulary 78, T=2", 6, 78, 2.0),
    ("N=10, vocabulary 20, T=1", 10, 20, 1.0),
    ("N=4, vocabulary 50, T=4", 4, 50, 4.0),
)
_SOFT_LOSS_BUGS = {  # bug -> hint, for _soft_loss(..., bug=bug)
    "mean": Hint(
        "your loss is smaller than T² times the KL by a constant factor: the KL of a position is a sum over the "
        "vocabulary, then averaged over the positions (the formula of 'Distillation: a student taught by the "
        "target'). What does F.kl_div's reduction divide by?",
        "F.kl_div's default reduction='mean' divides by every entry of the (N, vocab_size) tensor: pass "
        "reduction='batchmean', the sum divided by N.",
    ),
    "sum": Hint(
        "your loss adds the KL of every position, so it grows with the number of positions: it must be their mean.",
        "reduction='batchmean' (the sum divided by N), not 'sum'.",
    ),
    "swapped": Hint(
        "that is KL(student || teacher), the divergence the wrong way round: the chapter's soft term is "
        "KL(teacher || student).",
        "F.kl_div(input, target) computes KL(target || input): pass the student's log-probabilities as input and "
        "the teacher's probabilities as target.",
    ),
    "no T2": Hint(
        "the softened KL's gradients shrink like 1 / T², and the chapter's loss restores their size (reread "
        "'Distillation: a student taught by the target').",
        "multiply the KL by T**2.",
    ),
    "T": Hint("the factor that restores the gradients' size is T², not T.", "multiply by T**2, not T."),
}
_SOFT_LOSS_STARTER = """\
def soft_loss(student_logits, teacher_logits, T):  # find and fix the bug
    log_p_student = F.log_softmax(student_logits / T, dim=-1)  # (N, vocab_size)
    p_teacher = F.softmax(teacher_logits / T, dim=-1)
    return F.kl_div(log_p_student, p_teacher) * T**2
"""
_SOFT_LOSS_HINT = Hint(
    "the soft term is T² times KL(teacher || student) of the two softened distributions, summed over the "
    "vocabulary and averaged over the positions; compare yours with the chapter's kl, computed by hand.",
    "log_p_student = log_softmax(student / T), p_teacher = softmax(teacher / T); "
    "F.kl_div(log_p_student, p_teacher, reduction='batchmean') * T**2.",
)


def _soft_loss_cases() -> Iterator[tuple[str, dict[str, Any]]]:
    g = torch.Generator().manual_seed(3)
    for name, N, V, T in _SOFT_LOSS_CASES:
        student, teacher = torch.randn(N, V, generator=g) * 2, torch.randn(N, V, generator=g) * 3
        yield name, {"student_logits": student, "teacher_logits": teacher, "T": T}


def _library_soft_loss(student_logits: Tensor, teacher_logits: Tensor, T: float) -> Tensor:
    hard = torch.zeros(student_logits.shape[0], dtype=torch.long)
    return distillation_loss(student_logits, teacher_logits, hard, T, alpha=1.0)


@checker(starter=_SOFT_LOSS_STARTER, reference=_library_soft_loss)
def check_soft_loss(c: Checker, soft_loss: Callable[[Tensor, Tensor, float], Tensor]) -> None:
    """Check ``soft_loss(student_logits, teacher_logits, T)``: ``T**2 * KL(softmax(teacher / T) || softmax(student /
    T))``, averaged over the rows. Shapes: student_logits, teacher_logits (N, vocab_size); T > 0 -> a scalar."""
    c.cases(soft_loss, _soft_loss_cases(), _soft_loss, _SOFT_LOSS_BUGS, hint=_SOFT_LOSS_HINT)


# --------------------------------------------------------------------------- the verify step of speculative decoding


def _accepted_tokens(proposals: Tensor, choices: Tensor, *, bug: str = "") -> Tensor:
    """The tokens a round appends, or with a bug of :data:`_ACCEPTED_BUGS`."""
    k = proposals.shape[0]
    agree = proposals == choices[:k]
    n = int(agree.sum()) if bug == "count" else int(agree.long().cumprod(dim=0).sum())
    kept = proposals[:n]
    if bug == "no extra" or (bug == "no bonus" and n == k):
        return kept.clone()
    if bug == "draft extra" and n < k:
        return proposals[: n + 1].clone()
    return torch.cat([kept, choices[n : n + 1]])


_ACCEPTED_CASES = (  # (name, proposals, choices)
    ("all agree", [5, 6, 7, 8], [5, 6, 7, 8, 1]),
    ("the first disagrees", [3, 6, 7, 8], [5, 6, 7, 8, 1]),
    ("the third disagrees", [5, 6, 9, 8], [5, 6, 7, 8, 1]),
    ("k = 3, the first disagrees", [2, 6, 7], [4, 6, 7, 0]),
    ("k = 1, agreeing", [11], [11, 12]),
    ("k = 6", [1, 2, 3, 9, 5, 9], [1, 2, 3, 4, 5, 6, 7]),
)
_ACCEPTED_BUGS = {  # bug -> hint, for _accepted_tokens(..., bug=bug)
    "count": Hint(
        "you keep every agreeing proposal, also those after the first disagreement: a proposal after a rejected "
        "one was checked against a context the output does not have. Reread 'Speculative decoding': up to where "
        "are proposals accepted?",
        "count the agreeing prefix: agree.long().cumprod(0).sum().",
    ),
    "no bonus": Hint(
        "when all k proposals agree, the target's choice after the last one comes for free: the round yields "
        "k + 1 tokens.",
        "append choices[k] too.",
    ),
    "draft extra": Hint(
        "at the first disagreement the token is the target's choice, not the draft's rejected proposal.",
        "append choices[n], not proposals[n].",
    ),
    "no extra": Hint(
        "every round yields at least one token: the target's own choice after the accepted proposals (at the "
        "first disagreement, or after the last proposal).",
        "append choices[n] after proposals[:n] (choices[:n + 1] in all).",
    ),
}
_ACCEPTED_STARTER = """\
def accepted_tokens(proposals, choices):  # find and fix the bug
    agree = proposals == choices[:-1]  # (k,): did the draft guess the target's token?
    n_accepted = int(agree.sum())
    return torch.cat([proposals[:n_accepted], choices[n_accepted:n_accepted + 1]])
"""
_ACCEPTED_HINT = Hint(
    "a round appends the proposals up to the first disagreement, then the target's own choice at that position; "
    "compare with the hand-written rounds of 'Speculative decoding'.",
    "n = the number of leading proposals equal to the target's choices; return proposals[:n] followed by "
    "choices[n] (equivalently choices[:n + 1]).",
)


@checker(
    starter=_ACCEPTED_STARTER,
    reference=lambda proposals, choices: choices[: int((proposals == choices[:-1]).long().cumprod(0).sum()) + 1],
)  # the accepted proposals equal the target's choices: the agreeing prefix of choices, plus one
def check_accepted_tokens(c: Checker, accepted_tokens: Callable[[Tensor, Tensor], Tensor]) -> None:
    """Check ``accepted_tokens(proposals, choices)``, the verify step of greedy speculative decoding: the draft's
    proposals up to the first disagreement with the target's choices, then the target's choice at that position.
    Shapes: proposals (k,), choices (k + 1,) -> (n_accepted + 1,) int64."""
    cases = (
        (f"{name}: proposals {p}, choices {t}", {"proposals": torch.tensor(p), "choices": torch.tensor(t)})
        for name, p, t in _ACCEPTED_CASES
    )
    c.cases(accepted_tokens, cases, _accepted_tokens, _ACCEPTED_BUGS, hint=_ACCEPTED_HINT)


# --------------------------------------------------------------------------- how far batching goes


BATCH_CEILING_SETUP = dict(
    n_params=68.98e9, n_layers=80, d_model=8192, n_kv_heads=8, d_head=128, bytes_per_number=2, context=4096
)
"""The prediction's server: the LLaMA 2 70B shape (80 layers, 64 query heads and 8 key/value heads of 128, so
d_model 8192), weights and cache in 16 bits, every sequence of the batch at a context of 4,096 tokens."""


def batched_decode_intensity(
    batch: float,
    n_params: float,
    n_layers: float,
    d_model: float,
    n_kv_heads: float,
    d_head: float,
    bytes_per_number: float,
    context: float,
) -> float:
    """FLOPs per byte read of one decoding step for ``batch`` sequences (``float("inf")``: the limit) at ``context``
    cached positions each."""
    flops = 2 * n_params + 4 * n_layers * d_model * context  # per sequence: weights, then q . k and p . v
    cache = 2 * n_layers * n_kv_heads * d_head * bytes_per_number * context  # per sequence; the weights are shared
    if batch == float("inf"):
        return flops / cache
    return batch * flops / (n_params * bytes_per_number + batch * cache)


RIDGE_H100 = 989e12 / 3.35e12
"""An H100 SXM's published dense bf16 multiply rate over its memory bandwidth: about 295 FLOPs per byte."""


_INTENSITY_FIX = (
    "per sequence: 2 x 68.98e9 + 4 x 80 x 8192 x 4096 = 1.487e11 FLOPs, and 2 x 80 x 8 x 128 x 2 x 4096 = 1.342e9 "
    "bytes of cache; the weights' 1.38e11 bytes are shared by the batch, so the ratio tends to "
    "1.487e11 / 1.342e9, about 110.8 FLOPs per byte."
)


@checker(answer="value", reference=batched_decode_intensity(float("inf"), **BATCH_CEILING_SETUP))
def check_batched_intensity(c: Checker, prediction: float) -> None:
    """Check ``prediction``: the FLOPs per byte read that a decoding step of the LLaMA 2 70B shape approaches as the
    batch grows, with 16-bit weights and cache and every sequence at 4,096 cached positions."""
    s = BATCH_CEILING_SETUP
    expected = batched_decode_intensity(float("inf"), **s)

    def intensity(batch: float = float("inf"), **changed: float) -> float:  # with some of the setup's numbers changed
        return batched_decode_intensity(batch, **{**s, **changed})

    mistakes = {
        RIDGE_H100: "that is the ridge of an H100, where the multipliers would become the limit. Does the batch get "
        "there? Count what each sequence reads on its own at every step.",
        intensity(1): "that is one sequence at a time (or the weights read once for every sequence): as the batch "
        "grows, the weight reads are shared; what is left per sequence?",
        intensity(d_model=0): "you left out the attention's own FLOPs over the 4,096 cached positions.",
        intensity(d_model=s["n_kv_heads"] * s["d_head"]): "the attention's FLOPs count every query head (64 of them, "
        "d_model = 8192 numbers per position), not only the 8 key/value heads: each key/value head serves a group "
        "of 8.",
        intensity(n_kv_heads=64): "with grouped-query attention only the 8 key/value heads are cached, not all 64.",
        2 * expected: "each position caches a key AND a value, in every layer.",
        intensity(bytes_per_number=4): "the cache is kept in 16 bits: 2 bytes per number.",
        intensity(n_params=0): "that is the attention alone; each sequence's token also multiplies every weight.",
    }
    c.case(
        "FLOPs per byte as the batch grows",
        lambda: prediction,
        float(expected),
        bugs=same_fix(_INTENSITY_FIX, mistakes),
        hint=Hint(
            "write the step's FLOPs and bytes for a batch of B sequences (the weights are read once per step, each "
            "sequence's cache once), then let B grow: which terms are left?",
            _INTENSITY_FIX,
        ),
        atol=0.5,
    )

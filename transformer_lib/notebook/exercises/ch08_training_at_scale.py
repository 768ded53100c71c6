"""Chapter 8, training at scale: ``check_amp_state_bytes`` (a prediction: the training state of a model converted
to bf16), ``check_accumulate`` (gradient accumulation over padded micro-batches), ``check_scaled_step`` (a
loss-scaled step with clipping), ``check_attention_shard`` (attention split by heads), ``check_one_f_one_b``."""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...attention import MultiHeadAttention
from ...memory import adamw_bytes_per_parameter
from ...models import GPT, GPTConfig
from ._framework import Checker, Hint, _short, bug_table, checker, same_fix

ANSWER_MARKERS: dict[str, tuple[str, ...]] = {  # exercise label -> strings that would give its answer away
    "ex-bf16-state": ("2 + 2 + 2 x 2", "2 + 2 + 2 \\times 2", "zeros_like(p)"),
    "ex-accumulate-padding": ("(y != -100).sum()", "n_i / n", "same number of target tokens", 'reduction="sum"'),
    "ex-clip-scaled": ("unscale_", "clip only after", "after unscaling"),
    "ex-attention-shard": ("out_proj.weight[:,",),
    "ex-one-f-one-b": ("p - s - 1", "p - 1 - s", "n_stages - stage - 1", "warm-up of p - s"),
}

IGNORE = -100
"""The target id that ``GPT``'s loss (``F.cross_entropy``'s ``ignore_index``) leaves out: padding, prompts."""

_TINY = GPTConfig(vocab_size=11, block_size=8, n_layers=1, n_heads=2, d_model=16, bias=False)


def _tiny_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(_TINY)


def _flat_grads(model: nn.Module) -> Tensor:
    """Every parameter's gradient (zeros where there is none), flattened into one vector."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()])


# --------------------------------------------------------------------------- the training state of a bf16 model


AMP_STATE_BYTES = adamw_bytes_per_parameter(param_bytes=2, moment_bytes=2)
"""Bytes of training state per parameter of a model converted to bf16 and trained with PyTorch's AdamW: weights,
gradients and both moments in bf16."""
_STATE_FIX = (
    "model.to(torch.bfloat16) converts every parameter; a gradient has its parameter's dtype; torch.optim.AdamW "
    "creates its moments with torch.zeros_like(p): 2 + 2 + 2 x 2 = 8 bytes."
)


@checker(answer="value", reference=AMP_STATE_BYTES)  # measured: test_exercises_ch08.py
def check_amp_state_bytes(c: Checker, prediction: float) -> None:
    """Check ``prediction``: the bytes per parameter of a model's training state after a step of PyTorch's AdamW on
    the model converted to bf16 (``model.to(torch.bfloat16)``)."""
    mistakes = {
        16: "16 is the state of fp32 training and of mixed precision, whose weights stay fp32 (reread 'What stays in "
        "fp32'). Here the model itself was converted: in which dtype are its weights now, and in which do their "
        "gradients and AdamW's moments follow?",
        12: "you count AdamW's moments in fp32, as the mixed-precision recipes of 'Sharding the state: ZeRO and FSDP' "
        "keep them. PyTorch's AdamW has no such rule: in which dtype does it create the state of a bf16 parameter?",
        14: "you count the gradients in fp32: a gradient always has its parameter's dtype, and so do AdamW's moments.",
        4: "the weights are only part of it: count their gradients and AdamW's two moments (reread 'Where the memory "
        "goes').",
        6: "AdamW keeps two moments per parameter, the mean and the mean square of the gradient.",
        2: "that is the weights alone: training also keeps their gradients and AdamW's two moments (reread 'Where the "
        "memory goes').",
    }
    c.case(
        "bytes per parameter",
        lambda: prediction,
        float(AMP_STATE_BYTES),
        bugs=same_fix(_STATE_FIX, mistakes),
        hint=Hint(
            "count four numbers per parameter after the step (the weight, its gradient, AdamW's two moments), "
            "each in the dtype it has once the model itself is bf16; reread 'Where the memory goes' for the "
            "four and 'What stays in fp32' for what converting the model changes that autocast does not.",
            _STATE_FIX,
        ),
        atol=0.01,
    )


# --------------------------------------------------------------------------- gradient accumulation with ignored targets


def _accumulate(model: nn.Module, micro_batches: list[tuple[Tensor, Tensor]], *, bug: str = "") -> None:
    """The gradient of the batch's mean loss, micro-batch by micro-batch, or with a bug of :data:`_ACCUMULATE_BUGS`."""
    n_targets = sum(int((y != IGNORE).sum()) for _, y in micro_batches)
    n_positions = sum(y.numel() for _, y in micro_batches)
    for x, y in micro_batches:
        if bug == "last":
            model.zero_grad()
        shares = {"": int((y != IGNORE).sum()) / n_targets, "none": 1.0, "positions": y.numel() / n_positions}
        (model(x, y)[1] * shares.get(bug, 1 / len(micro_batches))).backward()  # "k", "last": 1 / k


def _whole_batch_grads(model: nn.Module, micro_batches: list[tuple[Tensor, Tensor]]) -> Tensor:
    x = torch.cat([x for x, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    model.zero_grad()
    model(x, y)[1].backward()
    return _flat_grads(model)


def _micro_batches(sizes: tuple[int, ...], ignored: tuple[int, ...], seed: int) -> list[tuple[Tensor, Tensor]]:
    """Micro-batches of ``sizes[i]`` sequences whose last ``ignored[i]`` targets are ``IGNORE``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for size, n_ignored in zip(sizes, ignored, strict=True):
        x = torch.randint(0, _TINY.vocab_size, (size, _TINY.block_size), generator=g)
        y = torch.roll(x, -1, dims=1)
        if n_ignored:
            y[:, -n_ignored:] = IGNORE  # padding at the end of each sequence
        out.append((x, y))
    return out


def _grads_after(accumulate: Callable[..., Any], model: nn.Module, micro_batches: list) -> Tensor:
    accumulate(model, micro_batches)
    return _flat_grads(model)


def _grads_with_bug(seed: int, micro_batches: list, *, bug: str) -> Tensor:
    return _grads_after(functools.partial(_accumulate, bug=bug), _tiny_gpt(seed), micro_batches)


_ACCUMULATE_CASES = (  # (name, the micro-batches' numbers of sequences, their numbers of ignored targets)
    ("2 micro-batches of 2 sequences, no ignored targets", (2, 2), (0, 0)),
    ("2 micro-batches, the second one's last 6 targets ignored (padding)", (2, 2), (0, 6)),
    ("3 micro-batches with 0, 3 and 7 ignored targets per sequence", (2, 2, 2), (0, 3, 7)),
    ("micro-batches of 3 and 1 sequences, no ignored targets", (3, 1), (0, 0)),
    ("micro-batches of 3 and 1 sequences, the first one's last 4 targets ignored", (3, 1), (4, 0)),
)
_ACCUMULATE_BUGS = {  # bug -> hint, for _accumulate(..., bug=bug)
    "k": Hint(
        "dividing each micro-batch's mean loss by k gives every micro-batch the same weight, whatever its number "
        "of target tokens, while the whole batch's mean gives every target token the same weight. The two agree "
        "only for some batches: reread the derivation of the division by k in 'Gradient accumulation'.",
        "weight micro-batch i's mean loss by n_i / N, with n_i = (y != -100).sum() its target tokens and N those "
        "of the whole batch (or sum its token losses, reduction='sum', and divide by N).",
    ),
    "none": Hint(
        "the gradients add up over the micro-batches: without scaling each loss you get the sum of k means, "
        "about k times the gradient of the batch's mean ('Gradient accumulation' measures that factor).",
        "scale micro-batch i's mean loss by n_i / N, its share of the batch's target tokens, before backward().",
    ),
    "positions": Hint(
        "you weight by positions, the ignored ones included, but an ignored target contributes nothing to the "
        "mean: count only the targets that enter the loss.",
        "n_i = (y != -100).sum(), not y.numel().",
    ),
    "last": Hint(
        "the gradients of the micro-batches must add up in the parameters' gradients: zeroing them between "
        "micro-batches keeps only the last one's (reread 'Gradient accumulation').",
        "don't call model.zero_grad() inside the loop (the checker hands you zeroed gradients).",
    ),
}
_ACCUMULATE_HINT = Hint(
    "the batch's mean loss is the sum of every target token's loss divided by N, the number of targets that are "
    "not ignored in the whole batch: each token must weigh 1 / N, in whichever micro-batch it sits.",
    "backpropagate loss_i * n_i / N for micro-batch i, n_i = (y_i != -100).sum() its own count.",
)


_ACCUMULATE_STARTER = """\
def accumulate(model, micro_batches):  # find and fix the bug
    k = len(micro_batches)
    for x, y in micro_batches:
        loss = model(x, y)[1]  # the mean over this micro-batch's targets that are not -100
        (loss / k).backward()
"""


def _accumulate_by_share(model: nn.Module, micro_batches: list[tuple[Tensor, Tensor]]) -> None:
    n = sum((y != IGNORE).sum() for _, y in micro_batches)
    for x, y in micro_batches:
        (model(x, y)[1] * (y != IGNORE).sum() / n).backward()


@checker(starter=_ACCUMULATE_STARTER, reference=_accumulate_by_share)
def check_accumulate(c: Checker, accumulate: Callable[[nn.Module, list], Any]) -> None:
    """Check ``accumulate(model, micro_batches)``: after it, the gradients of ``model`` (a ``GPT``) are those of one
    pass on the concatenated micro-batches. Shapes: a list of (x, y), each (B_i, T); y is -100 where ignored."""
    for i, (name, sizes, ignored) in enumerate(_ACCUMULATE_CASES):
        micro = _micro_batches(sizes, ignored, seed=i)
        c.case(
            name,
            lambda model, micro_batches: _grads_after(accumulate, model, micro_batches),
            _whole_batch_grads(_tiny_gpt(seed=i), micro),
            bugs=bug_table(_ACCUMULATE_BUGS, _grads_with_bug, i, micro),
            hint=_ACCUMULATE_HINT,
            inputs={"model": _tiny_gpt(seed=i), "micro_batches": micro},
        )


# --------------------------------------------------------------------------- a loss-scaled step with clipping


def _scaled_step(
    model: nn.Module, optimizer: Any, scaler: Any, x: Tensor, y: Tensor, max_norm: float, *, bug: str = ""
) -> None:
    """One fp16 step with loss scaling and clipping, as PyTorch's AMP recipe writes it, or with a bug of
    :data:`_SCALED_STEP_BUGS`."""
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x, y)[1]
    scaler.scale(loss).backward()
    if bug == "twice":
        for p in model.parameters():
            if p.grad is not None:
                p.grad /= scaler.get_scale()
    elif bug != "clip_scaled":
        scaler.unscale_(optimizer)
    if bug != "no_clip":
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if bug == "plain_step":
        optimizer.step()
    else:
        scaler.step(optimizer)
    if bug != "no_update":
        scaler.update()


SCALED_STEP_LR = 1e-2


def _scaler_error_hint(error: BaseException) -> Hint | str:
    text = str(error)
    if "unscale_() is being called after step()" in text:
        return Hint(
            "GradScaler refuses to go on: after its step, the scaler must update the scale (halve it after an "
            "overflow, grow it after a run of good steps) before the next step; reread 'The loss scaler'.",
            "call scaler.update() after scaler.step(optimizer), at every step.",
        )
    if "unscale_() has already been called" in text:
        return Hint(
            "the gradients are unscaled twice in one step: GradScaler allows it once per step, before its step.",
            "call scaler.unscale_(optimizer) once, before clipping; scaler.step does not unscale again.",
        )
    return ""


def _run_steps(step: Callable[..., Any], init_scale: float, n_steps: int, max_norm: float) -> tuple[Tensor, float]:
    """The weights and the scale after ``n_steps`` calls of ``step`` on a fresh model, AdamW and GradScaler."""
    model = _tiny_gpt(seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=SCALED_STEP_LR)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=2)
    g = torch.Generator().manual_seed(1)
    for _ in range(n_steps):
        x = torch.randint(0, _TINY.vocab_size, (4, _TINY.block_size), generator=g)
        step(model, optimizer, scaler, x, torch.roll(x, -1, dims=1), max_norm)
    return torch.cat([p.detach().flatten() for p in model.parameters()]), float(scaler.get_scale())


def _steps_with_bug(init_scale: float, n_steps: int, max_norm: float, *, bug: str) -> tuple[Tensor, float]:
    weights, scale = _run_steps(functools.partial(_scaled_step, bug=bug), init_scale, n_steps, max_norm)
    return weights.nan_to_num(0.0), scale  # as the checker compares it with the answer's: NaN read as 0


_SCALED_STEP_CASES = (  # (name, the scaler's initial scale, the number of steps, max_norm)
    ("1 step at scale 2**12, max_norm 5 (above the gradient's norm: no clipping)", 2.0**12, 1, 5.0),
    ("3 steps at scale 2**12, max_norm 0.1 (clipping)", 2.0**12, 3, 0.1),
    ("3 steps at scale 2**8, max_norm 5", 2.0**8, 3, 5.0),
    ("2 steps from scale 2**40: the first overflows and is skipped", 2.0**40, 2, 0.1),
)
_SCALED_STEP_BUGS = {  # bug -> hint, for _scaled_step(..., bug=bug)
    "clip_scaled": Hint(
        "you clip the *scaled* gradients: their norm is the true norm times the scale, so clipping cuts them far "
        "too much, and the scaler's step then divides them by the scale as well. Reread 'The loss scaler': at "
        "which point of a step are the gradients the true ones?",
        "call scaler.unscale_(optimizer) before clip_grad_norm_, so that max_norm applies to the true gradients "
        "(scaler.step then does not divide again).",
    ),
    "no_clip": Hint(
        "your step never clips: the true gradients must be clipped to a norm of at most max_norm.",
        "scaler.unscale_(optimizer), then torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm), then "
        "scaler.step(optimizer).",
    ),
    "twice": Hint(
        "you divide the gradients by the scale yourself, and the scaler, which does not know it, divides them "
        "again in its step: the gradients end up divided twice (reread 'The loss scaler').",
        "scaler.unscale_(optimizer) unscales once and records it, so that scaler.step does not divide again.",
    ),
    "plain_step": Hint(
        "your step writes NaN into the weights after an overflow: a step whose gradients hold inf or NaN must be "
        "skipped, and only the scaler checks for that (reread 'The loss scaler').",
        "step with scaler.step(optimizer), not optimizer.step().",
    ),
}
_SCALED_STEP_HINT = Hint(
    "follow the gradients through your step: which operations see them scaled, and which see the true ones? "
    "max_norm bounds the true gradients' norm; reread 'The loss scaler'.",
    "zero the gradients; the forward pass under autocast; scaler.scale(loss).backward(); "
    "scaler.unscale_(optimizer); clip; scaler.step(optimizer); scaler.update().",
)


_SCALED_STEP_STARTER = """\
def scaled_step(model, optimizer, scaler, x, y, max_norm):  # find and fix the bug
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x, y)[1]
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # the gradient's norm <= max_norm
    scaler.step(optimizer)  # divides the gradients by the scale; skips the step after an overflow
    scaler.update()
"""


@checker(starter=_SCALED_STEP_STARTER, reference=_scaled_step)
def check_scaled_step(c: Checker, scaled_step: Callable[..., Any]) -> None:
    """Check ``scaled_step(model, optimizer, scaler, x, y, max_norm)``: one fp16 training step of ``model`` with the
    loss scaled by ``scaler`` (a ``torch.amp.GradScaler``), the *true* gradients clipped to ``max_norm``, the step
    skipped after an overflow and the scale updated. Shapes: x, y (B, T) token ids."""
    for name, init_scale, n_steps, max_norm in _SCALED_STEP_CASES:
        c.case(
            name,
            lambda s=init_scale, n=n_steps, m=max_norm: _run_steps(scaled_step, s, n, m),
            _run_steps(_scaled_step, init_scale, n_steps, max_norm),
            bugs=bug_table(_SCALED_STEP_BUGS, _steps_with_bug, init_scale, n_steps, max_norm),
            hint=_SCALED_STEP_HINT,
            error_hint=_scaler_error_hint,
            atol=1e-4,  # clipping the scaled gradients at max_norm * scale moves clip's epsilon: a few 1e-6
        )


# --------------------------------------------------------------------------- attention split over processes by heads


def _attention_shard(attn: MultiHeadAttention, x: Tensor, rank: int, world_size: int, *, bug: str = "") -> Tensor:
    """Process ``rank``'s share of causal self-attention with the heads split over ``world_size`` processes, or with
    a bug of :data:`_SHARD_BUGS`."""
    B, T, _ = x.shape
    per_process = attn.n_heads // world_size
    if bug == "interleaved":
        heads = torch.arange(rank, attn.n_heads, world_size)
    else:
        heads = torch.arange(rank * per_process, (rank + 1) * per_process)
    features = (heads[:, None] * attn.d_head + torch.arange(attn.d_head)).flatten()  # the heads' columns

    def project(linear: nn.Linear) -> Tensor:  # (B, per_process, T, d_head)
        bias = None if linear.bias is None else linear.bias[features]
        return F.linear(x, linear.weight[features], bias).view(B, T, per_process, attn.d_head).transpose(1, 2)

    q, k, v = project(attn.q_proj), project(attn.k_proj), project(attn.v_proj)
    scale = 1 / math.sqrt(attn.d_model) if bug == "d_model" else None
    out = F.scaled_dot_product_attention(q, k, v, is_causal=bug != "no_mask", scale=scale)  # (B, n, T, d_head)
    out = out.transpose(1, 2).reshape(B, T, per_process * attn.d_head)
    partial = out @ attn.out_proj.weight[:, features].T  # (B, T, d_model): W_o's rows for these heads
    if bug == "bias" and attn.out_proj.bias is not None:
        partial = partial + attn.out_proj.bias
    return partial


def _all_shards(shard: Callable[..., Tensor], attn: MultiHeadAttention, x: Tensor, world_size: int) -> Tensor:
    return torch.stack([shard(attn, x, rank, world_size) for rank in range(world_size)])


def _shards(attn: MultiHeadAttention, x: Tensor, world_size: int, *, bug: str = "") -> Tensor:
    return _all_shards(functools.partial(_attention_shard, bug=bug), attn, x, world_size)


def _shard_cases() -> Iterator[tuple[str, dict[str, Any]]]:
    for i, (name, n_heads, world_size) in enumerate(_SHARD_CASES):
        torch.manual_seed(i)
        attn = MultiHeadAttention(4 * n_heads, n_heads, bias=True)
        x = torch.randn(1 if "B=1" in name else 2, 5, 4 * n_heads)
        yield name, {"attn": attn, "x": x, "world_size": world_size}


_SHARD_CASES = (  # (name, n_heads, world_size)
    ("4 heads over 1 process", 4, 1),
    ("4 heads over 2 processes", 4, 2),
    ("4 heads over 4 processes: one head each", 4, 4),
    ("6 heads over 3 processes, B=1", 6, 3),
)
_SHARD_BUGS = {  # bug -> hint, for _attention_shard(..., bug=bug)
    "bias": Hint(
        "out_proj's bias belongs to the sum, not to each share: in every share, the all-reduce adds it "
        "world_size times (reread the table of 'Attention, split by heads').",
        "leave the bias out of the share; it is added once after the sum.",
    ),
    "no_mask": Hint(
        "this is causal self-attention: a position must not attend to the later ones.",
        "pass is_causal=True (or a causal mask) to the attention.",
    ),
    "interleaved": Hint(
        "process r holds a contiguous block of heads, from r * n_heads / world_size on, not every world_size-th "
        "head: the sum is the same, but each process's slices are the wrong weights.",
        "heads = range(rank * n_heads // world_size, (rank + 1) * n_heads // world_size).",
    ),
    "d_model": Hint(
        "each head scales its scores by the size of one head, not of the whole model (chapter 1's scaling).",
        "scale by 1/sqrt(d_head), F.scaled_dot_product_attention's default, not 1/sqrt(d_model).",
    ),
}
_SHARD_HINT = Hint(
    "a process computes only its own heads, from the matching slices of the four projections, and returns a "
    "partial output without the bias; reread 'Tensor parallelism by hand', where the feed-forward network is "
    "split the same way (columns, then rows).",
    "take the rows h * d_head ... (h + 1) * d_head - 1 of q_proj/k_proj/v_proj's weight and bias for each of your "
    "heads h, attend causally within those heads, merge them, and multiply by the same columns of "
    "out_proj.weight (out_proj.weight[:, features].T), without the bias.",
)


def _silenced_heads(attn: MultiHeadAttention, x: Tensor, rank: int, world_size: int) -> Tensor:
    """The library's layer with the other processes' heads silenced (their values zeroed) and no output bias."""
    mine = copy.deepcopy(attn)
    per_process = attn.n_heads // world_size
    others = torch.ones(attn.n_heads, dtype=torch.bool)
    others[rank * per_process : (rank + 1) * per_process] = False
    rows = others.repeat_interleave(attn.d_head)  # the value features of the other processes' heads
    with torch.no_grad():
        mine.v_proj.weight[rows] = 0
        mine.v_proj.bias[rows] = 0
        mine.out_proj.bias.zero_()
    return mine(x, is_causal=True)


@checker(reference=_silenced_heads)
def check_attention_shard(
    c: Checker, attention_shard: Callable[[MultiHeadAttention, Tensor, int, int], Tensor]
) -> None:
    """Check ``attention_shard(attn, x, rank, world_size)``: process ``rank``'s share of ``attn(x, is_causal=True)``
    with its heads split over ``world_size`` processes, Megatron-style, a contiguous block each; the shares sum to
    ``attn(x, is_causal=True) - attn.out_proj.bias``. Shapes: x (B, T, d_model) -> (B, T, d_model)."""
    answer = functools.partial(_all_shards, attention_shard)
    c.cases(answer, _shard_cases(), _shards, _SHARD_BUGS, hint=_SHARD_HINT)


# --------------------------------------------------------------------------- the 1F1B pipeline schedule

PIPELINE_T_FORWARD, PIPELINE_T_BACKWARD = 1, 2
"""The time units of :func:`pipeline_timeline`: a backward pass costs about two forward passes."""


def pipeline_timeline(schedule: Any, p: int, m: int) -> tuple[str, list[int], int]:
    """Run a pipeline schedule on paper: ``(problem, peaks, finish)``.

    ``schedule[s]`` is stage ``s``'s order of work, ``("F", i)`` and ``("B", i)`` for ``i`` in ``range(m)``; each
    step starts as early as its stage is free and its inputs exist. ``problem`` is ``"ok"`` or what is wrong (a
    missing step, a deadlock); ``peaks[s]``: the most micro-batches whose activations stage ``s`` holds at once;
    ``finish``: when the last step ends.
    """
    orders = _stage_orders(schedule, p, m)
    if isinstance(orders, str):
        return orders, [], 0
    position, free = _run_on_paper(orders)
    if any(n < 2 * m for n in position):
        stuck = ", ".join(f"stage {s} at {orders[s][n]}" for s, n in enumerate(position) if n < 2 * m)
        return f"the schedule deadlocks: {stuck} wait for work that never comes", [], 0
    held = ([0, *itertools.accumulate(1 if kind == "F" else -1 for kind, _ in ops)] for ops in orders)
    return "ok", [max(h) for h in held], max(free)


def _stage_orders(schedule: Any, p: int, m: int) -> list[list[tuple[str, int]]] | str:
    """Each stage's order of work as ``("F" or "B", i)`` pairs, or what is wrong with ``schedule``."""
    if not isinstance(schedule, (list, tuple)) or len(schedule) != p:
        return f"expected a list of {p} lists, one per stage, got {_short(schedule, 80)}"
    everything = sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
    orders = []
    for s, ops in enumerate(schedule):
        try:
            ops = [(str(kind), int(i)) for kind, i in ops]
        except (TypeError, ValueError):
            return f"stage {s}: every step must be a pair, ('F', i) or ('B', i), got {_short(ops, 80)}"
        if sorted(ops) != everything:
            return f"stage {s} must run ('F', i) and ('B', i) once each for i = 0 to {m - 1}"
        orders.append(ops)
    return orders


def _run_on_paper(orders: list[list[tuple[str, int]]]) -> tuple[list[int], list[int]]:
    """(How many steps each stage ran before it waited for good, when each stage is free)."""
    p = len(orders)
    done: dict[tuple[str, int, int], int] = {}  # (kind, stage, micro-batch) -> when it ended
    free, position = [0] * p, [0] * p
    progress = True
    while progress:
        progress = False
        for s, ops in enumerate(orders):
            while position[s] < len(ops):
                kind, i = ops[position[s]]
                if kind == "F":
                    needs = [("F", s - 1, i)] if s > 0 else []
                else:  # its own forward, and the next stage's backward
                    needs = [("F", s, i)] + ([("B", s + 1, i)] if s < p - 1 else [])
                if not all(n in done for n in needs):
                    break
                start = max([free[s]] + [done[n] for n in needs])
                free[s] = done[(kind, s, i)] = start + (PIPELINE_T_FORWARD if kind == "F" else PIPELINE_T_BACKWARD)
                position[s] += 1
                progress = True
    return position, free


def _one_f_one_b(p: int, m: int, *, bug: str = "") -> list[list[tuple[str, int]]]:
    """The 1F1B schedule (PipeDream-Flush), or with a bug of :data:`_ONE_F_ONE_B_BUGS`."""
    schedule = []
    for s in range(p):
        ahead = {"gpipe": m, "same": min(p - 1, m), "reversed": min(s, m), "uncapped": p - s - 1}.get(bug, None)
        ahead = min(p - s - 1, m) if ahead is None else ahead
        ops = [("F", i) for i in range(ahead)]
        f, b = ahead, 0  # the next forward, the oldest backward not run yet
        while f < m:  # the steady state: one forward, one backward
            ops += [("F", f), ("B", b)]
            f, b = f + 1, b + 1
        ops += [("B", i) for i in range(b, m)]  # the last backwards
        schedule.append(ops)
    return schedule


def _timeline(p: int, m: int, *, bug: str = "") -> tuple[str, str, str]:
    return _judged(pipeline_timeline(_one_f_one_b(p, m, bug=bug), p, m), p, m)


def _on_paper(one_f_one_b: Callable[[int, int], Any]) -> Callable[[int, int], tuple[str, str, str]]:
    return lambda p, m: _judged(pipeline_timeline(one_f_one_b(p, m), p, m), p, m)


def _judged(timeline: tuple[str, list[int], int], p: int, m: int) -> tuple[str, str, str]:
    """A timeline against what is asked, in words: (problem, memory: at most min(p - s, m), time: GPipe's)."""
    problem, peaks, finish = timeline
    if problem != "ok":
        return problem, "", ""
    over = [f"stage {s} holds {n} (at most {min(p - s, m)})" for s, n in enumerate(peaks) if n > min(p - s, m)]
    gpipe = (m + p - 1) * (PIPELINE_T_FORWARD + PIPELINE_T_BACKWARD)  # every forward, then every backward
    time = f"ends at {gpipe}, with GPipe" if finish <= gpipe else f"ends at {finish}, after GPipe's {gpipe}"
    return problem, ", ".join(over) or "each stage s holds at most min(p - s, m)", time


_ONE_F_ONE_B_CASES = ((2, 4), (4, 8), (3, 5), (4, 2))  # (p, m): m < p in the last
_ONE_F_ONE_B_FIX = (
    "stage s runs min(p - s - 1, m) forwards ahead, then alternates ('F', next) and ('B', oldest) until every "
    "forward is done, then runs the remaining backwards: the last stage alternates from the start."
)
_ONE_F_ONE_B_BUGS = same_fix(  # bug -> hint, for _one_f_one_b(..., bug=bug)
    _ONE_F_ONE_B_FIX,
    {
        "gpipe": "that is GPipe's order, every forward before the first backward: each stage holds the activations "
        "of all m micro-batches at its peak. A stage can run a micro-batch's backward as soon as the next stage has "
        "sent that micro-batch's gradient back; it need not finish its forwards first.",
        "same": "every stage runs as many forwards ahead as the first one. The last stage computes the loss itself, "
        "so it can run each backward right after its forward; a later stage gets its first gradient sooner and "
        "needs fewer forwards in flight to stay busy, and the extra ones also delay the gradients the earlier "
        "stages wait for.",
        "reversed": "the first stage must run the most forwards ahead, not the fewest: its first gradient comes back "
        "only after micro-batch 0 has gone through every later stage and back.",
        "uncapped": "with fewer micro-batches than stages, a stage cannot run more forwards ahead than there are "
        "micro-batches.",
    },
)
_ONE_F_ONE_B_HINT = Hint(
    "count how many forwards stage s can run before the gradient of micro-batch 0 comes back to it (it travels "
    "forward through the later stages and back), keep that many micro-batches in flight, then alternate one "
    "forward with one backward. Reread 'Pipeline parallelism by hand' for the order of the messages.",
    _ONE_F_ONE_B_FIX,
)


def _one_f_one_b_as_a_sort(p: int, m: int) -> list[list[tuple[str, int]]]:
    """1F1B as a sort: stage s's backward of i comes after its forward of i + p - s - 1 (or its last forward)."""
    ops = [("F", i) for i in range(m)] + [("B", i) for i in range(m)]

    def stage(s: int) -> list[tuple[str, int]]:
        return sorted(ops, key=lambda op: op[1] + (p - s - 0.5 if op[0] == "B" else 0))

    return [stage(s) for s in range(p)]


@checker(reference=_one_f_one_b_as_a_sort)
def check_one_f_one_b(c: Checker, one_f_one_b: Callable[[int, int], Any]) -> None:
    """Check ``one_f_one_b(p, m)``: each of ``p`` stages' order of work on ``m`` micro-batches, ``[("F", 0), ...,
    ("B", 0), ...]``, stage ``s`` holding at most ``min(p - s, m)`` micro-batches and ending as early as GPipe,
    compared on paper by :func:`pipeline_timeline`."""
    cases = [
        (f"{p} stages, {m} micro-batches: (problem, memory, time)", {"p": p, "m": m}) for p, m in _ONE_F_ONE_B_CASES
    ]
    c.cases(_on_paper(one_f_one_b), cases[:3], _timeline, _ONE_F_ONE_B_BUGS, hint=_ONE_F_ONE_B_HINT)
    uncapped = {"uncapped": _ONE_F_ONE_B_BUGS["uncapped"]}  # with m < p, GPipe's and other orders coincide
    c.cases(_on_paper(one_f_one_b), cases[3:], _timeline, uncapped, hint=_ONE_F_ONE_B_HINT)

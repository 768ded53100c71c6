"""Training speed against a well-known minimal GPT, measured side by side (chapter 8).

:class:`ReferenceGPT` has the architecture of nanoGPT's ``model.py`` (Pre-LN blocks with one
fused ``c_attn`` projection, ``F.scaled_dot_product_attention(is_causal=True)``, exact-GELU
MLP, learned positions, tied output head, ``bias`` on or off for linears and norms), written
here from its description, and is trained with nanoGPT's ``train.py`` loop: AdamW with decay
on matrices (fused on CUDA only), gradient clipping, the loss read back every step, in the
library's precision of each run (fp32, or under the same autocast), so that a comparison is
between engines, not precisions. :func:`train_side_by_side` trains it and the library's model (through
:class:`~transformer_lib.training.Trainer`) with the same schedule, alternating step by step on
the same batches so that both see the same machine load, then evaluates both on the same
validation batches; :func:`races_in_turn` runs several such races (one per precision, say) in one
rotation.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from .._validate import _validate_int
from ..models import GPT
from ..precision import head_product_dtype
from ..training import TrainConfig, Trainer, clip_gradients, lr_at, make_optimizer
from ..utils import best_time


class Norm(nn.Module):
    def __init__(self, d: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class SelfAttention(nn.Module):
    def __init__(self, d: int, n_heads: int, bias: bool) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)
        self.c_proj = nn.Linear(d, d, bias=bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int, bias: bool) -> None:
        super().__init__()
        self.ln_1, self.attn = Norm(d, bias), SelfAttention(d, n_heads, bias)
        self.ln_2 = Norm(d, bias)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=bias), nn.GELU(), nn.Linear(4 * d, d, bias=bias))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class ReferenceGPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layers: int, n_heads: int, d: int, bias: bool) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, d), nn.Embedding(block_size, d)
        self.blocks = nn.ModuleList(Block(d, n_heads, bias) for _ in range(n_layers))
        self.ln_f = Norm(d, bias)
        self.lm_head = nn.Linear(d, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for block in self.blocks:
            for p in (block.attn.c_proj.weight, block.mlp[2].weight):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layers))

    @torch.no_grad()
    def copy_from(self, gpt: nn.Module) -> ReferenceGPT:
        """Take the weights of a library :class:`~transformer_lib.models.GPT` of the same shape (``bias=False``,
        learned positions), so that both models start from the same point. ``c_attn`` is q, k, v stacked."""
        c = gpt.config
        mine = (
            self.wte.num_embeddings,
            self.wpe.num_embeddings,
            len(self.blocks),
            self.blocks[0].attn.n_heads,
            self.wte.embedding_dim,
        )
        theirs = (c.vocab_size, c.block_size, c.n_layers, c.n_heads, c.d_model)
        if c.bias or c.positional != "learned" or c.activation != "gelu" or c.norm != "layernorm" or mine != theirs:
            raise ValueError(
                f"need a GPT with bias=False, learned positions, gelu, layernorm and (vocab_size, "
                f"block_size, n_layers, n_heads, d_model) = {mine}; got {c}"
            )
        self.wte.weight.copy_(gpt.tok_emb.weight)
        self.wpe.weight.copy_(gpt.pos.weight)
        for mine, theirs in zip(self.blocks, gpt.blocks, strict=True):
            a = theirs.self_attn
            mine.attn.c_attn.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            mine.attn.c_proj.weight.copy_(a.out_proj.weight)
            mine.ln_1.weight.copy_(theirs.norm1.weight)
            mine.ln_2.weight.copy_(theirs.norm2.weight)
            mine.mlp[0].weight.copy_(theirs.ff.linear1.weight)
            mine.mlp[2].weight.copy_(theirs.ff.linear2.weight)
        self.ln_f.weight.copy_(gpt.norm_f.weight)
        return self

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def reference_optimizer(
    model: nn.Module, lr: float = 1e-3, weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.99)
) -> torch.optim.AdamW:
    """nanoGPT's optimizer: AdamW, decay on parameters with 2+ dimensions, fused on CUDA only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    fused = next(model.parameters()).device.type == "cuda"
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=betas,
        fused=fused,
    )


@dataclass
class SideBySide:
    """Median seconds per training step and final validation loss of each model, and the seconds of
    each one's first step (which includes any compilation)."""

    ours_step: float
    reference_step: float
    ours_val_loss: float
    reference_val_loss: float
    steps: int
    tokens_per_step: int
    ours_first_step: float
    reference_first_step: float
    alongside_step: float | None = None  # median seconds of train_side_by_side's ``alongside``, if given

    @property
    def speedup(self) -> float:
        return self.reference_step / self.ours_step

    def tokens_per_second(self, which: str = "ours") -> float:
        if which not in ("ours", "reference"):
            raise ValueError(f"which must be 'ours' or 'reference', got {which!r}")
        return self.tokens_per_step / (self.ours_step if which == "ours" else self.reference_step)


@dataclass
class Race:
    """One pair of :func:`races_in_turn`: the library's ``trainer``, the ``reference`` it races (nanoGPT's
    loop in the trainer's recipe and precision), and what is timed beside them (see :func:`train_side_by_side`)."""

    trainer: Trainer
    reference: nn.Module
    alongside: Callable[[], object] | None = None
    compile_reference: bool = False


@torch.no_grad()
def mean_loss(model: nn.Module, batches: Sequence[tuple[Tensor, Tensor]]) -> float:
    """Mean loss of ``model(x, y)[1]`` over ``batches``, in eval mode and fp32, and eagerly: a model compiled
    in place (chapter 8 compiles each block, ``block.compile()``) is not compiled again for evaluation, as
    the :class:`Trainer` evaluates its model uncompiled."""
    was_training = model.training
    model.eval()
    try:
        with torch.compiler.set_stance("force_eager"):
            loss = sum(model(x, y)[1].item() for x, y in batches) / len(batches)
    finally:
        model.train(was_training)
    return loss


def reference_train_step(
    reference: nn.Module, trainer: Trainer, compile_reference: bool = False
) -> Callable[[Tensor, Tensor, int], None]:
    """nanoGPT's training step for ``reference`` in ``trainer``'s recipe: ``step(x, y, i)`` trains on one batch.

    The trainer's learning-rate schedule (``i`` is the step number), weight decay, betas and
    clipping, in the trainer's precision (under autocast where the trainer autocasts, in fp32
    where it does not), with the per-tensor AdamW on the CPU and a fused one on CUDA, and the
    loss read back every step, as nanoGPT's loop does; ``compile_reference=True`` runs the model
    through ``torch.compile``, as nanoGPT's ``--compile=True`` does. Each call of this function
    makes a new optimizer: its state starts empty.
    """
    cfg, device = trainer.config, trainer.device
    optimizer = reference_optimizer(reference, cfg.lr, cfg.weight_decay, cfg.betas)
    amp = trainer.amp_dtype  # the trainer's precision, so that a row compares engines, not precisions
    ctx = torch.autocast(device.type, dtype=amp) if amp is not None else nullcontext()
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
    forward = torch.compile(reference) if compile_reference else reference

    def reference_step(x: Tensor, y: Tensor, step: int) -> None:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.max_steps)
        with ctx:
            _, loss = forward(x, y)
        scaler.scale(loss).backward()
        if cfg.grad_clip is not None:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(reference.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        loss.item()

    return reference_step


def train_side_by_side(
    trainer: Trainer,
    reference: nn.Module,
    batches: Callable[[], tuple[Tensor, Tensor]],
    val_batches: Sequence[tuple[Tensor, Tensor]],
    steps: int | None = None,
    warmup: int = 5,
    compile_reference: bool = False,
    alongside: Callable[[], object] | None = None,
) -> SideBySide:
    """Train ``trainer``'s model and ``reference`` with one recipe, alternating step by step.

    Both take the trainer's learning-rate schedule, weight decay, betas and clipping, and
    the same batch at every step (``batches()`` draws it, on the trainer's device). The
    reference runs nanoGPT's loop (:func:`reference_train_step`) in the trainer's precision;
    ``compile_reference=True`` trains it through ``torch.compile``. Which model steps first
    alternates, and the first ``warmup`` steps (with any compilation) are left out of the
    medians. At the end both are evaluated on the same ``val_batches``. ``alongside()``, if given,
    is timed in the same rotation at every step, under the same load (e.g. the step's products
    alone, :func:`step_products`): its median is ``alongside_step``. :func:`races_in_turn` runs
    several such races in one rotation.
    """
    race = Race(trainer, reference, alongside, compile_reference)
    return races_in_turn({"race": race}, batches, val_batches, steps, warmup)["race"]


def races_in_turn(
    races: Mapping[str, Race],
    batches: Callable[[], tuple[Tensor, Tensor]],
    val_batches: Sequence[tuple[Tensor, Tensor]],
    steps: int | None = None,
    warmup: int = 5,
) -> dict[str, SideBySide]:
    """Several :func:`train_side_by_side` races at once, in one rotation: at every step, every race's two
    engines and its ``alongside`` run once each, all on the same batch, and each takes every place in the
    order in turn. So a comparison across races (the same engine in fp32 and in bf16, chapter 8) sees the
    same machine load as one within a race; run one race after another instead, a shared machine's drift
    between them can be larger than the difference measured. Each race keeps its own schedule and
    optimizer; its result is what :func:`train_side_by_side` would return for it, under this load.
    """
    if not races:
        raise ValueError("races must name at least one Race")
    remaining = {name: r.trainer.config.max_steps - r.trainer.step for name, r in races.items()}
    if steps is None and len(set(remaining.values())) > 1:
        raise ValueError(f"the trainers have different numbers of steps left ({remaining}): pass steps=")
    steps = next(iter(remaining.values())) if steps is None else steps
    if steps <= warmup:
        raise ValueError(f"steps must exceed warmup={warmup} to time anything, got {steps}")
    devices = {name: str(r.trainer.device) for name, r in races.items()}
    if len(set(devices.values())) > 1:  # every engine steps on the one batch drawn per step
        raise ValueError(f"the races must train on one device, to share each step's batch, got {devices}")
    device = next(iter(races.values())).trainer.device
    engines: dict[tuple[str, str], Callable[[Tensor, Tensor, int], object]] = {}
    for name, r in races.items():
        r.reference.to(device).train()
        r.trainer.model.train()
        engines[name, "ours"] = lambda x, y, i, trainer=r.trainer: trainer.train_step((x, y))
        engines[name, "reference"] = reference_train_step(r.reference, r.trainer, r.compile_reference)
        if r.alongside is not None:
            engines[name, "alongside"] = lambda x, y, i, fn=r.alongside: fn()

    def timed(fn: Callable[[], object]) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    times: dict[tuple[str, str], list[float]] = {key: [] for key in engines}
    first: dict[tuple[str, str], float] = {}
    keys, tokens = list(engines), 0
    for i in range(steps):
        x, y = batches()
        tokens = x.numel()
        for key in keys[i % len(keys) :] + keys[: i % len(keys)]:  # each takes every place in turn
            seconds = timed(partial(engines[key], x, y, i))
            if i == 0:
                first[key] = seconds
            if i >= warmup:
                times[key].append(seconds)
    return {
        name: SideBySide(
            ours_step=statistics.median(times[name, "ours"]),
            reference_step=statistics.median(times[name, "reference"]),
            ours_val_loss=mean_loss(r.trainer.model, val_batches),
            reference_val_loss=mean_loss(r.reference, val_batches),
            steps=steps,
            tokens_per_step=tokens,
            ours_first_step=first[name, "ours"],
            reference_first_step=first[name, "reference"],
            alongside_step=statistics.median(times[name, "alongside"]) if r.alongside is not None else None,
        )
        for name, r in races.items()
    }


def train_step_flops(model: nn.Module, x: Tensor, y: Tensor) -> int:
    """Floating-point operations of one training step's forward and backward passes, counted by
    ``torch.utils.flop_counter.FlopCounterMode``: the matrix products of the linear layers and the
    output head (2 M K N each, twice that backward), and the attention core where PyTorch counts its
    kernel (on CUDA; the CPU's fused kernel is not counted, a few percent of a small GPT's step). The
    elementwise work and the optimizer, comparatively few operations, are not counted either."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        _, loss = model(x, y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def matmul_flops_per_second(
    shapes: Sequence[tuple[int, int, int]],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seconds: float = 0.2,
) -> float:
    """The multiply rate this machine reaches on the products ``(M, K) @ (K, N)`` of ``shapes``, run
    back to back for about ``seconds`` each round: their total operations over the fastest of 5
    rounds (the best this machine did, so that a moment of load elsewhere does not lower it). A bound
    on a training step made of these products: its matrix work cannot run faster."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(0)
    pairs = [
        (
            torch.randn(m, k, generator=g, device=device, dtype=dtype),
            torch.randn(k, n, generator=g, device=device, dtype=dtype),
        )
        for m, k, n in shapes
    ]
    flops = sum(2 * m * k * n for m, k, n in shapes)

    def run() -> None:
        for a, b in pairs:
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()

    run()
    t0 = time.perf_counter()
    run()
    reps = max(1, int(seconds / max(time.perf_counter() - t0, 1e-6)))
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        rounds.append((time.perf_counter() - t0) / reps)
    return flops / min(rounds)


def copy_bytes_per_second(n_bytes: int = 2**26, device: torch.device | str = "cpu", repeats: int = 5) -> float:
    """The memory bandwidth this machine reaches copying one float32 tensor of ``n_bytes`` into
    another (``dst.copy_(src)``): the bytes read plus the bytes written, ``2 * n_bytes``, over the
    fastest of ``repeats`` copies after a warm-up. Choose ``n_bytes`` well above the processor's
    caches (the default, 64 MiB, is) so that the copy measures main memory: the rate at which a
    step that reads every weight once, as decoding does, can at best receive them (chapter 9).

    Defined in chapter 9, Inference and deployment.
    """
    if not isinstance(n_bytes, int) or isinstance(n_bytes, bool) or n_bytes < 4 or n_bytes % 4:
        raise ValueError(f"n_bytes must be a positive multiple of 4 (float32 numbers), got {n_bytes!r}")
    repeats = _validate_int("repeats", repeats)
    device = torch.device(device)
    src = torch.ones(n_bytes // 4, device=device)
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize()

    copy()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        copy()
        times.append(time.perf_counter() - t0)
    return 2 * n_bytes / max(min(times), 1e-9)


def gpt_matmul_shapes(n_tokens: int, d_model: int, d_ff: int, vocab_size: int) -> list[tuple[int, int, int]]:
    """The (M, K, N) of a GPT block's and output head's products in a training step over ``n_tokens``
    tokens: forward (x @ W), input gradient (dy @ W^T) and weight gradient (x^T @ dy) of each linear."""
    linears = [(d_model, 3 * d_model), (d_model, d_model), (d_model, d_ff), (d_ff, d_model), (d_model, vocab_size)]
    shapes = []
    for d_in, d_out in linears:
        shapes += [(n_tokens, d_in, d_out), (n_tokens, d_out, d_in), (d_in, n_tokens, d_out)]
    return shapes


@contextmanager
def _profiler_silenced() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null (PyTorch's profiler logs its start and stop from C++ there) and
    drop the profiler's Python note that it "clears events at the end of each cycle" (seen on CUDA)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*Profiler clears events at the end of each cycle")
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def op_times(fn: Callable[[], object], device: torch.device | str = "cpu", repeats: int = 5) -> list[tuple[str, float]]:
    """Seconds per call of ``fn()`` in each PyTorch operator, or on CUDA in each GPU kernel, longest first.

    ``fn`` runs once to warm up, then ``repeats`` times under ``torch.profiler``. On the CPU the
    time is each operator's self time (its own, without the operators it calls); on CUDA it is
    each kernel's time on the GPU (matrix products, fused Triton kernels, copies), the CPU's
    own work left out.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    repeats = _validate_int("repeats", repeats)
    device = torch.device(device)
    cuda = device.type == "cuda"
    run = synced(fn, device)
    run()
    with (
        _profiler_silenced(),
        profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof,
    ):
        for _ in range(repeats):
            run()
    if cuda:  # the kernels' own rows: an operator's row, or a region's (the optimizer's step), repeats their time
        events = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
        rows = [(e.key, e.self_device_time_total / 1e6 / repeats) for e in events]  # microseconds to seconds
    else:
        rows = [(e.key, e.self_cpu_time_total / 1e6 / repeats) for e in prof.key_averages()]
    rows = [(name, seconds) for name, seconds in rows if seconds > 0]
    if not rows:
        raise ValueError(f"fn ran no PyTorch {'kernels' if cuda else 'operators'} to time")
    return sorted(rows, key=lambda kv: -kv[1])


def op_time_shares(fn: Callable[[], object], repeats: int = 5) -> list[tuple[str, float]]:
    """Each PyTorch operator's share of the CPU time of ``fn()``, largest first (:func:`op_times`' shares).

    Shares are of self time (an operator's own time, without the operators it calls), so they add up to 1.
    """
    times = op_times(fn, "cpu", repeats)
    total = sum(seconds for _, seconds in times)
    return [(name, seconds / total) for name, seconds in times]


def step_products(
    shapes: Sequence[tuple[int, int, int]],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    fp32_shapes: Sequence[tuple[int, int, int]] = (),
) -> Callable[[], None]:
    """A function that runs the products ``(M, K) @ (K, N)`` of ``shapes`` in ``dtype``, and of
    ``fp32_shapes`` (e.g. the output head, which the library keeps in fp32 under autocast except on a
    CUDA GPU under bf16: :func:`~transformer_lib.precision.head_product_dtype`) in fp32, once each,
    on random operands made here: a training step's matrix work and nothing else.

    Timed, it is the step's bound: no engine takes the step in that precision faster. Timed beside
    the steps (``train_side_by_side(..., alongside=step_products(...))``), it is the bound under the
    same load as the steps; :func:`train_step_bound` times it alone.
    """
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(0)
    operands: dict[tuple[int, int, int, torch.dtype], tuple[Tensor, Tensor]] = {}  # one pair per shape and dtype
    for dt, group in ((dtype, shapes), (torch.float32, fp32_shapes)):
        for m, k, n in group:  # a repeated shape (every block's) reuses its pair: the step's own reuse of its
            if (m, k, n, dt) not in operands:  # weights and activations keeps them in cache about as much
                operands[m, k, n, dt] = (
                    torch.randn(m, k, generator=g, device=device, dtype=dt),
                    torch.randn(k, n, generator=g, device=device, dtype=dt),
                )
    pairs = [
        operands[m, k, n, dt] for dt, group in ((dtype, shapes), (torch.float32, fp32_shapes)) for m, k, n in group
    ]

    def run() -> None:
        for a, b in pairs:
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()

    return run


def library_step_products(
    blocks: Sequence[tuple[int, int, int]],
    head: Sequence[tuple[int, int, int]],
    dtype: torch.dtype | None,
    device: torch.device | str = "cpu",
) -> Callable[[], None]:
    """:func:`step_products` in the precisions the library's step multiplies in under autocast to ``dtype``.

    None: every product in fp32. Otherwise the blocks' products in ``dtype`` and the output head's in
    :func:`~transformer_lib.precision.head_product_dtype` (fp32, but bf16 on a CUDA GPU under bf16).
    """
    device = torch.device(device)
    if dtype is None:
        return step_products([*blocks, *head], device=device)
    if head_product_dtype(device, dtype) == torch.float32:
        return step_products(blocks, dtype, device, fp32_shapes=head)
    return step_products([*blocks, *head], dtype, device)


def train_step_bound(
    shapes: Sequence[tuple[int, int, int]],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    fp32_shapes: Sequence[tuple[int, int, int]] = (),
    rounds: int = 5,
) -> float:
    """The fewest seconds a training step made of these products takes on this machine: the fastest
    of ``rounds`` runs of :func:`step_products` (after one to warm up), alone, away from any steps.

    ``benchmarks/compare_gpt.py`` prints it beside the bound timed between the steps, and takes the
    fp32 multiply rate for attention's products from it.
    """
    return best_time(step_products(shapes, dtype, device, fp32_shapes), repeats=rounds)


# The parts of a training step, each named with pieces of its PyTorch operators' names (see op_time_shares).
STEP_PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("matrix products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")),
    ("attention kernel", ("scaled_dot_product",)),
    ("GELU", ("aten::gelu",)),
    ("norms", ("layer_norm", "rms_norm")),
    ("loss", ("log_softmax", "nll_loss", "cross_entropy")),
    ("optimizer and clipping", ("adamw", "Optimizer.", "linalg_vector_norm", "_foreach", "clip_grad")),
    ("casts and copies", ("aten::copy_", "aten::_to_copy", "aten::cat", "aten::clone", "aten::contiguous")),
    ("compiled kernels", ("CompiledFxGraph", "Torch-Compiled Region", "CompiledFunction", "TorchDynamo")),
)


def step_part(op: str) -> str:
    """Which part of a training step the operator ``op`` belongs to (:data:`STEP_PARTS`), else
    "the rest" (residual adds, gradient accumulation, views, allocation: PyTorch's own bookkeeping)."""
    lowered = op.lower()
    return next((part for part, markers in STEP_PARTS if any(m.lower() in lowered for m in markers)), "the rest")


def step_parts(shares: Sequence[tuple[str, float]]) -> dict[str, float]:
    """The shares of :func:`op_time_shares` added up by part of the step, largest first."""
    parts: dict[str, float] = {}
    for op, share in shares:
        parts[step_part(op)] = parts.get(step_part(op), 0.0) + share
    return dict(sorted(parts.items(), key=lambda kv: -kv[1]))


def gpt_step_bytes(
    n_tokens: int, d_model: int, d_ff: int, n_layers: int, vocab_size: int, n_params: int, act_bytes: int = 4
) -> dict[str, int]:
    """Bytes that the memory-bound parts of a GPT training step must at least read and write, by part
    (:data:`STEP_PARTS`' names): each tensor read or written once per pass, nothing kept in a cache.

    - GELU: forward reads h and writes gelu(h); backward reads h and the incoming gradient and writes
      one: 5 tensors of (n_tokens, d_ff) per layer, in ``act_bytes``.
    - norms: 2 per layer and the final one; forward reads x, writes y; backward reads x and dy, writes
      dx: 5 tensors of (n_tokens, d_model) each, fp32 (norms stay fp32 under autocast).
    - loss: log-softmax and its gradient over the logits, fp32: 4 tensors of (n_tokens, vocab_size).
    - optimizer and clipping: AdamW reads weight, gradient and two moments and writes three; clipping
      reads every gradient and scales it: 10 numbers of 4 bytes per parameter.

    Over a measured bandwidth (:func:`copy_bytes_per_second`) these are each part's bound.
    """
    return {
        "GELU": 5 * n_tokens * d_ff * n_layers * act_bytes,
        "norms": 5 * n_tokens * d_model * (2 * n_layers + 1) * 4,
        "loss": 4 * n_tokens * vocab_size * 4,
        "optimizer and clipping": 10 * n_params * 4,
    }


def gpt_step_parts(
    model: nn.Module,
    batch_size: int,
    block_size: int,
    act_dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> dict[str, Callable[[], None]]:
    """Each part of a GPT training step outside the matrix products, to be timed *alone*: a function
    that runs that part's own PyTorch operators, forward and backward, as often as one step does, on
    random tensors of the step's exact shapes, with nothing else in between (on CUDA it waits for its
    kernels). Timed with :func:`fastest_in_turn`, in cache where the tensors fit. :data:`STEP_PARTS`' names:

    - attention kernel: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` over
      (B, n_heads, T, d_head), once per layer, in fp32 on a CPU (the library attends in fp32 there,
      :func:`~transformer_lib.precision.fused_attention`), else in ``act_dtype``;
    - GELU: ``F.gelu`` over (B T, d_ff) in ``act_dtype``, once per layer;
    - norms: ``F.layer_norm`` over (B T, d_model) in fp32, two per layer and the final one;
    - loss: ``F.cross_entropy`` over (B T, vocab_size) fp32 logits;
    - optimizer and clipping: :func:`~transformer_lib.training.clip_gradients` and the Trainer's AdamW
      (:func:`~transformer_lib.training.make_optimizer`) on a copy of ``model``'s parameters.

    The sizes are read from ``model.config`` (a :class:`~transformer_lib.models.GPT`'s: ``d_model``,
    ``n_heads``, ``d_ff``, ``vocab_size``, ``n_layers``). No engine does a part faster with these
    kernels. Against the bytes each part must move (:func:`gpt_step_bytes`) this shows which parts
    their arithmetic bounds (exact GELU's erf) rather than memory; against the step's profile, what
    running them inside one eager step costs. The optimizer steps a copy: ``model`` is not touched.
    """
    cfg = getattr(model, "config", None)
    if cfg is None or not all(hasattr(cfg, a) for a in ("d_model", "n_heads", "d_ff", "vocab_size", "n_layers")):
        raise TypeError(
            f"model must be a GPT (with .config: d_model, n_heads, d_ff, vocab_size, n_layers), "
            f"got {type(model).__name__}"
        )
    for name, value in (("batch_size", batch_size), ("block_size", block_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    device = torch.device(device)
    d, n_heads, d_ff, vocab, n_layers = cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.vocab_size, cfg.n_layers
    n = batch_size * block_size
    g = torch.Generator(device=device).manual_seed(0)

    def leaf(*shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
        return torch.randn(*shape, generator=g, device=device, dtype=dtype).requires_grad_()

    attn_dtype = torch.float32 if device.type == "cpu" else act_dtype
    q, k, v = (leaf(batch_size, n_heads, block_size, d // n_heads, dtype=attn_dtype) for _ in range(3))
    h = leaf(n, d_ff, dtype=act_dtype)
    x, w = leaf(n, d), leaf(d)
    logits, y = leaf(n, vocab), torch.randint(vocab, (n,), generator=g, device=device)
    dq, dh, dx = torch.randn_like(q), torch.randn_like(h), torch.randn_like(x)  # the gradients from above
    shadow = copy.deepcopy(model).to(device)  # the optimizer steps a copy; the caller's model is untouched
    for p in shadow.parameters():
        p.grad = torch.randn(p.shape, generator=g, device=device)
    optimizer = make_optimizer(shadow, lr=1e-4, weight_decay=0.1, device=device)

    # torch.autograd.grad returns each backward's gradients without adding them into the leaves' .grad:
    # in the step every layer's tensors are its own, so nothing accumulates there either.
    def attention() -> None:
        for _ in range(n_layers):
            torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), dq)

    def gelu() -> None:
        for _ in range(n_layers):
            torch.autograd.grad(F.gelu(h), h, dh)

    def norms() -> None:
        for _ in range(2 * n_layers + 1):
            torch.autograd.grad(F.layer_norm(x, (d,), w), (x, w), dx)

    def loss() -> None:
        torch.autograd.grad(F.cross_entropy(logits, y), logits)

    def optimizer_and_clipping() -> None:
        clip_gradients(shadow.parameters(), 1.0, device)
        optimizer.step()

    parts = {
        "attention kernel": attention,
        "GELU": gelu,
        "norms": norms,
        "loss": loss,
        "optimizer and clipping": optimizer_and_clipping,
    }
    return {part: synced(fn, device) for part, fn in parts.items()}


def synced(fn: Callable[[], object], device: torch.device | str) -> Callable[[], None]:
    """``fn``, which on CUDA also waits for the kernels it launched, so that timing it times them."""
    device = torch.device(device)

    def run() -> None:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()

    return run


def fastest_in_turn(runs: Mapping[str, Callable[[], object]], rounds: int = 20) -> dict[str, float]:
    """The fastest of ``rounds`` calls of each function in ``runs``, in seconds, all timed in turn.

    After one call of each to warm up, every round calls each function once, starting one place
    further on in each round, so that all of them meet the machine's slow and quick moments alike
    and their fastest times compare like with like. The functions must finish their own work (on
    CUDA: synchronize), as :func:`gpt_step_parts`, :func:`gpt_tiny_step` and
    :func:`products_as_called` do.
    """
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    if not runs or not all(callable(fn) for fn in runs.values()):
        raise TypeError(f"runs must map names to functions, got {runs!r}")
    names = list(runs)
    for name in names:
        runs[name]()
    fastest = dict.fromkeys(names, math.inf)
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            t0 = time.perf_counter()
            runs[name]()
            fastest[name] = min(fastest[name], time.perf_counter() - t0)
    return fastest


# The operators a model's matrix products reach PyTorch's dispatcher as (``matmul`` and ``linear`` decompose to them).
PRODUCT_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm"})


@dataclass(frozen=True)
class _TensorSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


def _spec(value: object) -> object:
    if isinstance(value, Tensor):
        return _TensorSpec(tuple(value.shape), value.stride(), value.dtype, value.device)
    return value


def products_as_called(step: Callable[[], object]) -> Callable[[], None]:
    """A function that runs the matrix products one call of ``step()`` runs, as the step runs them: the
    same operators (:data:`PRODUCT_OPS`) on operands of the same shapes, strides and dtypes, with random
    values made here, a set of its own for each call (in a step each layer has its own weights and
    activations).

    ``step()`` runs once here, under a dispatch mode that records the calls (a training step changes
    its model's weights). Against :func:`step_products` (contiguous ``(M, K) @ (K, N)``, one pair of
    operands per shape) the difference is what the step's own layouts cost: the transposed operands
    autograd passes to each weight gradient (a sum over the tokens, which are the rows), and operands
    that another layer's products pushed out of cache.
    """
    calls: list[tuple[Any, list[object], dict[str, object]]] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func.overloadpacket.__name__ in PRODUCT_OPS:
                calls.append((func, [_spec(a) for a in args], {k: _spec(v) for k, v in kwargs.items()}))
            return func(*args, **kwargs)

    with Record():
        step()
    generators: dict[torch.device, torch.Generator] = {}

    def operand(value: object) -> object:
        """Random values with the recorded layout: a flat buffer, viewed with the recorded strides."""
        if not isinstance(value, _TensorSpec):
            return value
        g = generators.setdefault(value.device, torch.Generator(device=value.device).manual_seed(0))
        n = 1 + sum((size - 1) * stride for size, stride in zip(value.shape, value.stride, strict=True))
        flat = torch.randn(n if all(value.shape) else 0, generator=g, device=value.device).to(value.dtype)
        return flat.as_strided(value.shape, value.stride)

    replays = [(func, [operand(a) for a in args], {k: operand(v) for k, v in kw.items()}) for func, args, kw in calls]
    cuda = any(isinstance(a, _TensorSpec) and a.device.type == "cuda" for _, args, _ in calls for a in args)

    def run() -> None:
        for func, args, kwargs in replays:
            func(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()

    return run


def gpt_tiny_step(model: nn.Module, amp: bool = True, device: torch.device | str = "cpu") -> Callable[[], None]:
    """One training step of PyTorch's eager mode for a GPT shaped like ``model``, with next to no work
    in its kernels: a function that runs :meth:`~transformer_lib.training.Trainer.train_step` on a GPT
    with ``model``'s configuration (its layers, heads, norms, activation, positions) but 4 channels per
    head, a vocabulary of 8 and batches of 1 x 4 tokens. Timed (:func:`fastest_in_turn`), it is the
    per-operator cost of about 500 operators going through the dispatcher, autocast and autograd (and
    the Trainer's Python), which does not shrink with the model.

    ``amp`` as in :class:`~transformer_lib.training.TrainConfig` (the precision it picks on ``device``).
    The tiny model's weights are drawn without touching the caller's random state.
    """
    cfg = getattr(model, "config", None)
    if cfg is None or not dataclasses.is_dataclass(cfg) or not hasattr(cfg, "n_heads"):
        raise TypeError(f"model must be a GPT (with a GPTConfig as .config), got {type(model).__name__}")
    device = torch.device(device)
    tiny = dataclasses.replace(cfg, vocab_size=8, block_size=4, d_model=4 * cfg.n_heads, d_ff=None, dropout=0.0)
    x = torch.randint(8, (1, 4), generator=torch.Generator().manual_seed(0))
    batch = (x, x.roll(-1, dims=1))
    config = TrainConfig(max_steps=10**9, warmup_steps=1, amp=amp, progress=False)
    with torch.random.fork_rng(devices=[]):  # the tiny model's initial weights leave the caller's random state alone
        trainer = Trainer(GPT(tiny), config, lambda g: batch, device=device)
    return synced(lambda: trainer.train_step(batch), device)

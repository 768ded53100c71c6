"""The training engine of the chapters that train (4 to 9) and the benchmarks: a small, readable loop.

AdamW with weight-decay groups, linear warm-up then cosine decay, gradient clipping and accumulation,
periodic evaluation, mixed precision where the hardware multiplies in it natively (:func:`autocast_dtype`)
and data parallelism under ``torchrun``; the loop waits for the device only when it logs. Checkpoints are
:mod:`transformer_lib.checkpoint`'s; a live loss plot is a ``fit`` callback (``notebook.plots.LivePlot``).
An invalid :class:`TrainConfig` raises ``ValueError``; a NaN or infinite loss, :class:`NonFiniteLossError`.
"""

from __future__ import annotations

import inspect
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn, cast

import torch
from torch import Tensor, nn
from torch import distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ._forked import can_fork, fit_in_processes
from ._validate import _validate_int, _validate_real
from .attention import MultiHeadAttention
from .checkpoint import CHECKPOINT_FORMAT as CHECKPOINT_FORMAT  # re-exported: it was defined here
from .checkpoint import CheckpointError as CheckpointError  # re-exported: it was defined here
from .checkpoint import load_trainer, save_trainer, trainer_state
from .cuda_graphs import GraphedStep
from .precision import autocast_dtype
from .utils import batch_to, get_device, keep_freed_memory

Batch = Any
BatchFn = Callable[[torch.Generator], Batch]
LossFn = Callable[[nn.Module, Batch], Tensor]


class NonFiniteLossError(FloatingPointError):
    """Training met a NaN or infinite loss (or gradient norm): :meth:`Trainer.fit` stops with this."""


def _validate_betas(name: str, value: object) -> tuple[float, float]:
    """Adam's two decay rates, each in [0, 1)."""
    message = f"{name} must be a pair (beta1, beta2) of numbers in [0, 1), got {value!r}"
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(message)
    try:
        beta1, beta2 = (_validate_real(name, b, "", lambda b: 0.0 <= b < 1.0) for b in value)
    except ValueError:
        raise ValueError(message) from None
    return beta1, beta2


@dataclass(frozen=True)
class TrainConfig:
    """How to train. ``min_lr`` is reached at ``max_steps`` by the cosine schedule.

    Every field is checked when the config is made (``dataclasses.replace`` too): a ``ValueError``
    names each invalid field, its value and what is allowed. ``warmup_steps`` may exceed ``max_steps``.

    ``grad_accum_steps = k`` makes every step accumulate the gradients of k micro-batches, each
    loss divided by k: with equal micro-batches and a mean loss, one step on a batch k times
    larger, in the memory of one micro-batch. ``compile = True`` trains through
    ``torch.compile(model)`` (elementwise work fused into generated kernels; the first steps pay
    the compilation); evaluation and generation run the model uncompiled. ``cuda_graph = True``
    replays each step on a CUDA GPU as one CUDA graph (:mod:`transformer_lib.cuda_graphs`): the host
    starts one graph instead of every kernel, which is most of a small model's step there. The batches
    must then keep one shape. It is ignored where the step cannot be replayed: off CUDA, under
    ``torchrun`` and with ``compile``. (With fp16, on GPUs without bf16, the loss scaler's verdict on an
    infinite gradient stays on the device: the fused AdamW skips that step itself.)

    Defined in chapter 4, Positional encoding.
    """

    max_steps: int = 1000
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float | None = 1.0
    eval_interval: int = 100
    eval_steps: int = 10
    log_interval: int = 10
    seed: int = 0
    grad_accum_steps: int = 1  # micro-batches per optimisation step
    amp: bool = True  # mixed precision where it is native: see autocast_dtype
    compile: bool = False  # train through torch.compile(model)
    cuda_graph: bool = False  # on a CUDA GPU, replay each step as one CUDA graph
    progress: bool = True  # a tqdm bar (_progress_bar: the book build turns it off with TQDM_DISABLE=1)

    def __post_init__(self) -> None:
        problems = []

        def validate(name: str, rule: Callable[..., Any], *args: Any) -> None:
            try:
                object.__setattr__(self, name, rule(name, getattr(self, name), *args))  # normalised
            except ValueError as e:
                problems.append(str(e))

        for name in ("max_steps", "eval_interval", "eval_steps", "log_interval", "grad_accum_steps"):
            validate(name, _validate_int, 1)
        validate("warmup_steps", _validate_int, 0)
        validate("lr", _validate_real, "a finite number > 0", lambda x: x > 0)
        for name in ("min_lr", "weight_decay"):
            validate(name, _validate_real, "a finite number >= 0", lambda x: x >= 0)
        validate("betas", _validate_betas)
        if self.grad_clip is not None:
            clips = "a finite number > 0 (the largest gradient norm), or None for no clipping"
            validate("grad_clip", _validate_real, clips, lambda x: x > 0)
        seeds = "an integer in [-2**63, 2**64)"  # what torch.Generator.manual_seed takes
        validate("seed", _validate_int, -(2**63), seeds)
        if isinstance(self.seed, int) and self.seed >= 2**64:
            problems.append(f"seed must be {seeds}, got {self.seed!r}")
        switches = ("amp", "compile", "cuda_graph", "progress")
        not_bool = [name for name in switches if not isinstance(getattr(self, name), bool)]
        problems += [f"{name} must be True or False, got {getattr(self, name)!r}" for name in not_bool]
        if not problems and self.min_lr > self.lr:
            problems.append(
                f"min_lr must be <= lr={self.lr!r} (the cosine decays from lr to min_lr), got {self.min_lr!r}"
            )
        if problems:
            raise ValueError("invalid TrainConfig: " + "; ".join(problems))


def lr_at(step: int, lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr`` at ``max_steps``."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def make_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.99),
    device: torch.device | None = None,
) -> torch.optim.AdamW:
    """AdamW where only matrices (weights of linears and embeddings) decay; norms and biases do not.

    With a ``device``, the update is one fused kernel for all parameters, except on a CPU under
    data parallelism: there the fused AdamW hung a process at exit in 2 of 8 two-process runs.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = device is not None and (device.type == "cuda" or (device.type == "cpu" and _rank_and_world_size()[1] == 1))
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)


def clip_gradients(params: Iterable[Tensor], max_norm: float, device: torch.device) -> Tensor:
    """``nn.utils.clip_grad_norm_(params, max_norm)``: scale every gradient by one factor so that their
    joint norm is at most ``max_norm``; returns the norm before clipping.

    On a CPU or GPU through PyTorch's multi-tensor ("foreach") kernels: one call for all the norms
    and one for all the scalings instead of one per tensor (the default only on GPUs), which saves
    a third to a half of the clipping's time on a CPU (``benchmarks/compare_gpt.py`` profiles it).
    The same numbers either way (tested).
    """
    return nn.utils.clip_grad_norm_(params, max_norm, foreach=True if device.type in ("cpu", "cuda") else None)


def default_loss(model: nn.Module, batch: Batch) -> Tensor:
    """For models whose ``forward(x, y)`` returns ``(logits, loss)``, like :class:`~transformer_lib.models.GPT`.

    A model whose ``forward`` takes ``return_logits`` (GPT) is asked for the loss alone, so that a
    compiled model keeps its logits inside its graph (:meth:`~transformer_lib.models.GPT.forward`).
    """
    x, y = batch
    if _forward_takes(_unwrapped(model), "return_logits"):
        return model(x, y, return_logits=False)[1]
    return model(x, y)[1]


def _unwrapped(model: nn.Module) -> nn.Module:
    """The model inside torch.compile's wrapper (``._orig_mod``) and DDP's (``.module``), if any.

    The Trainer compiles the DDP wrapper, so torch.compile's is the outer one.
    """
    inner = getattr(model, "_orig_mod", None)
    model = inner if isinstance(inner, nn.Module) else model
    return model.module if isinstance(model, DistributedDataParallel) else model


_FORWARD_PARAMETERS: dict[type, frozenset[str]] = {}  # a model class -> its forward's parameter names


def _forward_takes(model: nn.Module, name: str) -> bool:
    """Whether ``model.forward`` has a parameter called ``name`` (read once per class)."""
    cls = type(model)
    if cls not in _FORWARD_PARAMETERS:
        try:
            _FORWARD_PARAMETERS[cls] = frozenset(inspect.signature(model.forward).parameters)
        except (TypeError, ValueError):  # no signature to read
            _FORWARD_PARAMETERS[cls] = frozenset()
    return name in _FORWARD_PARAMETERS[cls]


@dataclass
class History:
    """What happened during training: losses at the logged and evaluated steps, and the speed."""

    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    train_seconds: float = 0.0
    items: int = 0  # e.g. tokens processed, if the batch says (see Trainer.count)

    @property
    def items_per_second(self) -> float:
        return self.items / self.train_seconds if self.train_seconds else float("nan")


class Trainer:
    """Train ``model`` on batches drawn by ``train_batches(generator)``.

    ``loss_fn(model, batch)`` returns the scalar loss (default: ``model(x, y)[1]``); ``val_batches``
    (optional) draws evaluation batches; ``count(batch)`` tells how many items (e.g. tokens) a batch
    holds, for the speed report. The trainer owns the generator passed to the batch functions, so a
    checkpoint resumes the data stream too.

    Under ``torchrun`` the model is wrapped in ``DistributedDataParallel`` (gradients averaged once per
    step), each process draws its own batches (seed ``seed + rank``), the logged and evaluated losses
    are averaged over the processes, and rank 0 shows the progress bar and writes checkpoints (call
    :meth:`save` and :meth:`load` on every process). ``loss_fn`` then receives the wrapper: call the
    model, as ``default_loss`` does, not its other methods.

    Defined in chapter 4, Positional encoding.
    """

    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig,
        train_batches: BatchFn,
        val_batches: BatchFn | None = None,
        loss_fn: LossFn = default_loss,
        count: Callable[[Batch], int] | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        self.config, self.loss_fn, self.count = config, loss_fn, count
        self.train_batches, self.val_batches = train_batches, val_batches
        self.device = torch.device(device) if device is not None else get_device()
        self.model = model.to(self.device)
        self.rank, self.world_size = _rank_and_world_size()
        self.ddp = None  # the DistributedDataParallel wrapper, when there are several processes
        if self.world_size > 1:  # broadcasts rank 0's weights: every process starts from the same model
            device_ids = [self.device.index or 0] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=device_ids)
        # what loss_fn is called with in training: the DDP wrapper or the model, compiled if config.compile
        self.forward_model = self.ddp if self.ddp is not None else self.model
        if config.compile:  # the same parameters, behind generated kernels
            # a Module in, a Module (OptimizedModule) out; torch.compile's stub only promises a callable
            self.forward_model = cast(nn.Module, torch.compile(self.forward_model))
        self.optimizer = self._new_optimizer()
        # the model's parameters as at construction (the optimizer holds those too), for clipping, in the
        # model's order (the order of the norm's sum: the same clipping to the last bit). A list, because
        # model.parameters() walks every submodule, a cost paid at every step
        self._parameters = list(self.model.parameters())
        seed = (config.seed + self.rank) % 2**64 if self.rank else config.seed  # in manual_seed's range
        self.generator = torch.Generator().manual_seed(seed)
        self.step = 0
        self.history = History()
        self.amp_dtype = autocast_dtype(self.device) if config.amp else None
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)
        self._reset_nonfinite()
        self._lr = lr_at(0, config.lr, config.min_lr, config.warmup_steps, config.max_steps)  # the last step's
        self._graphed: GraphedStep | None = None
        self._forget_graph()

    @property
    def replays_graph(self) -> bool:
        """Whether the steps are replayed from a CUDA graph (``config.cuda_graph`` where the step allows it)."""
        return self._graphed is not None

    def _forget_graph(self) -> None:
        """Start the CUDA graph anew, if the steps use one: after a new optimizer state, which a graph does
        not see (its tensors are new), the next steps warm up and capture again."""
        cfg = self.config
        replayable = self.device.type == "cuda" and self.world_size == 1 and not cfg.compile
        # fp16's loss scaler skips a step with an infinite gradient: on the device only with the fused AdamW
        # (make_optimizer's on CUDA), which takes the scaler's verdict as a tensor; otherwise its step reads it
        scaled_on_device = not self.scaler.is_enabled() or getattr(self.optimizer, "_step_supports_amp_scaling", False)
        use = cfg.cuda_graph and replayable and scaled_on_device
        self._graphed = GraphedStep(self._step, self.optimizer, self.device) if use else None

    def _mean_over_processes(self, value: Tensor) -> Tensor:
        """``value`` averaged over the processes (itself when there is one)."""
        if self.world_size > 1:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value /= self.world_size
        return value

    def _new_optimizer(self) -> torch.optim.AdamW:
        cfg = self.config
        return make_optimizer(self.model, cfg.lr, cfg.weight_decay, cfg.betas, self.device)

    def _reset_nonfinite(self) -> None:
        # The first steps whose loss and gradient norm were not finite (-1: none yet), on the device
        self._first_nonfinite = torch.full((2,), -1, dtype=torch.long, device=self.device)

    def _autocast(self):
        return nullcontext() if self.amp_dtype is None else torch.autocast(self.device.type, self.amp_dtype)

    @torch.no_grad()
    def evaluate(self, steps: int | None = None) -> float:
        """Mean loss over ``steps`` (default ``config.eval_steps``) validation batches (else training ones)."""
        steps = self.config.eval_steps if steps is None else _validate_int("steps", steps, 1)
        batches = self.val_batches or self.train_batches
        was_training = self.model.training
        self.model.eval()
        losses = []
        for _ in range(steps):
            with self._autocast():
                losses.append(self.loss_fn(self.model, batch_to(batches(self.generator), self.device)).float())
        self.model.train(was_training)
        return self._mean_over_processes(torch.stack(losses).mean()).item()

    def fit(self, steps: int | None = None, callback: Callable[[Trainer], None] | None = None) -> History:
        """Train until ``config.max_steps`` (or for ``steps`` more steps), evaluating on the way.

        The model trains in training mode and is back in the caller's mode when ``fit`` returns or
        raises. ``callback(trainer)``, if given, runs after every evaluation (eval mode, no gradients).

        A NaN or infinite loss (or gradient norm, when ``grad_clip`` is set and there is no fp16
        scaler, for which an infinite gradient is routine) raises :class:`NonFiniteLossError` naming
        the first such step, at the next log interval, where the loop syncs anyway; so does one in
        validation, before the callback runs. At ``max_steps`` already, ``ValueError``.

        On a CPU it first makes the process keep the memory it frees (:func:`~transformer_lib.utils.keep_freed_memory`).
        """
        steps = None if steps is None else _validate_int("steps", steps, 0)
        if self.step >= self.config.max_steps:
            raise ValueError(
                f"the trainer is already at max_steps={self.config.max_steps} (step {self.step}): nothing to "
                f"train. To train longer, raise max_steps, e.g. trainer.config = dataclasses.replace("
                f"trainer.config, max_steps={2 * self.config.max_steps}); the cosine schedule then stretches to it"
            )
        end = self.config.max_steps if steps is None else min(self.config.max_steps, self.step + steps)
        if self.device.type == "cpu":
            keep_freed_memory()  # otherwise every step faults its activations' pages in anew
        bar = None
        if self.config.progress and self.rank == 0:
            bar = _progress_bar(total=max(0, end - self.step), desc="training", leave=False)
        was_training = self.model.training
        self.model.train()
        try:
            self._train_until(end, bar, callback)
        finally:
            self.model.train(was_training)
            if bar is not None:
                bar.close()
        return self.history

    def _train_until(self, end: int, bar: Any, callback: Callable[[Trainer], None] | None) -> None:
        cfg, h = self.config, self.history
        running = torch.zeros((), device=self.device)
        n_running = 0
        while self.step < end:
            if self.step % cfg.eval_interval == 0:
                self._record_eval(callback)
            t0 = time.perf_counter()
            batches = [self.train_batches(self.generator) for _ in range(cfg.grad_accum_steps)]
            running += self.train_step(*batches)
            n_running += 1
            if self.count is not None:
                h.items += sum(self.count(batch) for batch in batches)
            if self.step % cfg.log_interval == 0 or self.step == end:
                mean = self._logged_mean(running / n_running)
                running.zero_()
                n_running = 0
                h.steps.append(self.step)
                h.train_loss.append(mean)
                h.lr.append(self._lr)
                if bar is not None:
                    bar.set_postfix(loss=f"{mean:.3f}")
            h.train_seconds += time.perf_counter() - t0
            if bar is not None:
                bar.update(1)
        if self.step == cfg.max_steps or self.step % cfg.eval_interval == 0:
            self._record_eval(callback)

    def _logged_mean(self, mean: Tensor) -> float:
        """The mean loss of a log interval as a float: the loop's only host sync. A non-finite loss
        or gradient norm so far rides along as a NaN and raises :class:`NonFiniteLossError`."""
        flagged = mean.masked_fill(self._first_nonfinite.max() >= 0, float("nan"))
        value = self._mean_over_processes(flagged).item()  # a NaN on any process is a NaN on all
        if not math.isfinite(value):
            self._raise_nonfinite(f"the mean training loss up to step {self.step} is {value}")
        return value

    def _raise_nonfinite(self, otherwise: str) -> NoReturn:
        """Raise :class:`NonFiniteLossError` naming the first bad step recorded, else saying ``otherwise``."""
        loss_step, grad_step = self._first_nonfinite.tolist()
        if loss_step >= 0 and (grad_step < 0 or loss_step <= grad_step):
            what = f"the training loss is not finite (NaN or inf) at step {loss_step}"
        elif grad_step >= 0:
            what = f"the gradient norm is not finite (NaN or inf) at step {grad_step}, while the loss still was"
        else:
            what = otherwise
        raise NonFiniteLossError(
            f"{what} (steps count from 0; training stopped at step {self.step}, and the weights may no longer "
            f"be finite: reload the last checkpoint). Try a lower learning rate (lr={self.config.lr}), gradient "
            f"clipping (grad_clip={self.config.grad_clip}), checking the inputs (token ids inside the vocabulary, "
            f"no NaN in the data, a loss_fn that cannot divide by zero), or full fp32 precision (amp=False)."
        )

    def train_step(self, batch: Batch, *more: Batch) -> Tensor:
        """One optimisation step on ``batch`` (and the micro-batches ``more``) at the scheduled
        learning rate; returns the mean loss, detached.

        Each micro-batch's loss is divided by their number, so that the gradients add up to the
        gradient of their mean. No host sync: a non-finite loss or gradient norm is only recorded
        on the device, for :meth:`fit` to report. With :attr:`replays_graph`, the step is the CUDA
        graph's replay (the first steps run as usual, then one is captured).
        """
        cfg = self.config
        self._lr = lr_at(self.step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.max_steps)
        micro_batches = (batch, *more)
        if self._graphed is not None:
            loss = self._graphed(micro_batches, self._lr, self.step)
        else:
            loss = self._step(micro_batches, self._lr, self.step)
        self.step += 1
        return loss

    def _step(self, micro_batches: Sequence[Batch], lr: float | Tensor, step: int | Tensor) -> Tensor:
        """:meth:`train_step`'s work at learning rate ``lr``, recording a non-finite loss as step ``step``:
        Python numbers, or one-element device tensors where a CUDA graph captures it."""
        cfg = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        k = len(micro_batches)
        self.optimizer.zero_grad(set_to_none=True)
        losses: list[Tensor] = []
        for i, micro in enumerate(micro_batches):
            no_sync = self.ddp.no_sync() if self.ddp is not None and i < k - 1 else nullcontext()
            with no_sync:  # accumulate locally; average across processes on the last micro-batch only
                with self._autocast():
                    loss = self.loss_fn(self.forward_model, batch_to(micro, self.device))
                self.scaler.scale(loss if k == 1 else loss / k).backward()
            losses.append(loss.detach().float())
        loss = losses[0] if k == 1 else sum(losses[1:], start=losses[0]) / k
        grad_norm = None
        if cfg.grad_clip is not None:
            self.scaler.unscale_(self.optimizer)
            grad_norm = clip_gradients(self._parameters, cfg.grad_clip, self.device)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._note_nonfinite(loss, grad_norm, step)
        return loss

    def _note_nonfinite(self, loss: Tensor, grad_norm: Tensor | None, step: int | Tensor) -> None:
        """Record, on the device, ``step`` as the first step whose loss (or gradient norm) is NaN or
        infinite. With the fp16 scaler only the loss counts: it skips a step with an infinite gradient."""
        bad_grad = torch.zeros((), dtype=torch.bool, device=self.device)
        if grad_norm is not None and not self.scaler.is_enabled():
            bad_grad = ~torch.isfinite(grad_norm)
        bad = torch.stack([~torch.isfinite(loss), bad_grad.to(self.device)])
        self._first_nonfinite.masked_fill_(bad & (self._first_nonfinite < 0), step)

    def _record_eval(self, callback: Callable[[Trainer], None] | None = None) -> None:
        h = self.history
        if h.eval_steps and h.eval_steps[-1] == self.step:
            return
        loss = self.evaluate()
        if not math.isfinite(loss):
            self._raise_nonfinite(f"the validation loss at step {self.step} is {loss}")
        h.eval_steps.append(self.step)
        h.val_loss.append(loss)
        if callback is not None:  # fit trains in training mode, and switches back after the callback
            self.model.eval()
            with torch.no_grad():
                callback(self)
            self.model.train()

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs, in tensors and plain Python values (no pickled objects)."""
        return trainer_state(self)

    def save(self, path: str | os.PathLike) -> Path:
        """Write a checkpoint (:mod:`transformer_lib.checkpoint`): atomic, checksummed, never of
        weights that are not finite (:class:`CheckpointError`); return its path."""
        return save_trainer(self, path)

    def load(self, path: str | os.PathLike, allow_config_change: bool = False) -> None:
        """Resume from a checkpoint written by :meth:`save`, all or nothing: any problem raises
        :class:`CheckpointError` naming the file, and leaves the trainer as it was. One written under
        another :class:`TrainConfig` (except ``progress``, ``compile``, ``cuda_graph``) is refused unless
        ``allow_config_change=True``: the trainer then keeps its own, e.g. a larger ``max_steps``."""
        load_trainer(self, path, allow_config_change)


def fit_together(
    trainers: Sequence[Trainer],
    callback: Callable[[Trainer], None] | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> list[History]:
    """Train independent runs (seeds, the rows of an ablation) side by side on a CPU's cores.

    A small model cannot use a CPU's cores: its matrix products are too small to share out, and a
    second PyTorch thread on them gains little. Separate runs can: ``workers`` runs at a time (default:
    one per core), each with one PyTorch thread, taken in the trainers' order. On Linux each run trains
    in a forked copy of this process (``transformer_lib._forked``): threads of one process would share
    Python's lock, which a small model's step takes at every operator (chapter 5's 6-layer runs took
    1.4x as long per step in two threads as alone), while a process trains at its core's full speed.
    Elsewhere (macOS, Windows) each run trains in a thread of this process. Either way the call is
    ``trainer.fit(callback=callback)``, and ``callback(trainer)`` runs after each of a run's
    evaluations, in eval mode without gradients, with one PyTorch thread (the other runs hold the other
    cores); with processes it runs here, in the calling thread, while the run waits, on the trainer
    holding the run's weights, step and history of that moment, and the run goes on from the weights
    as the callback left them. Returns the histories, in the trainers' order; each trainer ends
    holding its run's weights, optimizer state, step, data generator and history.

    The result is exactly that of ``trainer.fit(callback=callback)`` one after the other with
    ``torch.set_num_threads(1)`` (tested, both ways), because each run only draws from its own
    generator. That is why the trainers train one after the other instead, in the current thread count,
    when any of their models has active dropout (its masks come from PyTorch's one global generator, which
    the runs would share in an order that changes from run to run), when any trainer is not on the
    CPU (a GPU serves one run at a time anyway), compiles (``TrainConfig.compile``: compilation is not
    made for threads), or trains under ``torchrun`` (its processes already share out the machine),
    or with one worker. In a forked run, what the batch or loss functions change outside the trainer (an
    iterator they advance, a list they fill) changes in the run's copy of this process, not here, and
    what they print is not shown: the callback, which runs here, is the place for both.

    ``progress=True`` shows one bar (tqdm) that counts the runs as they end, so that a cell that trains a
    dozen runs does not sit silent for minutes. Side by side, the runs' own bars are not shown (a forked
    run's output goes nowhere, and bars from threads would overwrite one another); one after the other,
    each run also shows its own bar, as its ``TrainConfig.progress`` says.

    If runs fail, the first failing trainer's exception is raised once every run has ended; a failed
    run's trainer holds the state it failed in. An interrupt (Ctrl-C, Jupyter's stop button) starts no
    further run; with processes each run in progress stops after its current step and its trainer keeps
    that state, with threads those in progress finish their ``fit`` in the background. Speed:
    ``benchmarks/fit_together.py``.

    Defined in chapter 4, Positional encoding.
    """
    trainers = list(trainers)
    if not trainers or not all(isinstance(t, Trainer) for t in trainers):
        kinds = sorted({type(t).__name__ for t in trainers}) or ["nothing"]
        raise TypeError(f"trainers must be a non-empty sequence of Trainer, got {', '.join(kinds)}")
    models = [id(t.model) for t in trainers]
    if len(set(models)) < len(models):
        raise ValueError("two of the trainers train the same model (or are the same trainer): runs must be independent")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool, got {type(progress).__name__}")
    n_cores = os.cpu_count() or 1
    workers = min(n_cores, len(trainers)) if workers is None else _validate_int("workers", workers, 1)
    side_by_side = workers > 1 and all(
        t.device.type == "cpu"
        and not t.config.compile
        and t.world_size == 1
        and not _draws_global_random_numbers(t.model)
        for t in trainers
    )
    bar = _runs_bar(len(trainers)) if progress and len(trainers) > 1 else None
    ended = None if bar is None else lambda: bar.update(1)
    try:
        if not side_by_side:
            return [_fit_then(t, callback, ended) for t in trainers]
        if can_fork():
            return fit_in_processes(trainers, workers, callback, ended=ended)
        return _fit_in_threads(trainers, workers, callback, ended)
    finally:
        if bar is not None:
            bar.close()


def _runs_bar(n_runs: int) -> Any:
    """A bar that counts ``n_runs`` runs as they end (:func:`_progress_bar`)."""
    return _progress_bar(total=n_runs, desc="runs", unit="run", leave=False)


def _progress_bar(**kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(**kwargs)``: a text bar, or a widget in Jupyter; switched off (``disable=True``)
    where the environment variable ``TQDM_DISABLE`` is set to anything but ``0``, ``false``, ``no``, ``off``
    or nothing, as the book build sets it, so that no bar is saved in a page.

    tqdm reads ``TQDM_DISABLE`` for its text bars only: its notebook bar always passes ``disable`` on to
    them (False unless given), which overrides the variable (tqdm 4.70), so that without this a kernel with
    the variable set still shows the widget, and the build saves it in the page.
    """
    from tqdm.auto import tqdm

    flag = os.environ.get("TQDM_DISABLE", "").strip().lower()
    return tqdm(disable=flag not in ("", "0", "false", "no", "off"), **kwargs)


def _fit_then(
    trainer: Trainer, callback: Callable[[Trainer], None] | None, ended: Callable[[], None] | None
) -> History:
    """``trainer.fit(callback=callback)``, then ``ended()`` if given, whether the run ended well or not."""
    try:
        return trainer.fit(callback=callback)
    finally:
        if ended is not None:
            ended()


def _fit_in_threads(
    trainers: list[Trainer],
    workers: int,
    callback: Callable[[Trainer], None] | None,
    ended: Callable[[], None] | None,
) -> list[History]:
    """``fit_together`` where processes cannot fork: ``workers`` threads, one PyTorch thread each."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one PyTorch thread per run: the runs, not the products, share the cores
    configs = [t.config for t in trainers]
    for t in trainers:  # no bar of its own, as in a forked run: bars from threads would overwrite one another
        t.config = replace(t.config, progress=False)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fit_together")
    try:
        futures = [pool.submit(_fit_then, t, callback, ended) for t in trainers]
        for future in futures:  # wait for all, so that no run is still training when this raises
            future.exception()
    except BaseException:  # e.g. an interrupt: the runs not yet started never start
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        torch.set_num_threads(threads)
        for t, config in zip(trainers, configs, strict=True):
            t.config = config
    pool.shutdown()
    return [future.result() for future in futures]  # raises the first failing run's exception


def _draws_global_random_numbers(model: nn.Module) -> bool:
    """Whether training ``model`` draws from PyTorch's global generator: active dropout does."""
    return any(
        (isinstance(m, nn.Dropout) and m.p > 0) or (isinstance(m, MultiHeadAttention) and m.dropout > 0)
        for m in model.modules()
    )


def _rank_and_world_size() -> tuple[int, int]:
    """This process's rank and the number of processes (0 and 1 without ``torch.distributed``)."""
    on = dist.is_available() and dist.is_initialized()
    return (dist.get_rank(), dist.get_world_size()) if on else (0, 1)


def init_distributed(device: str | torch.device | None = None) -> torch.device:
    """Join the process group that ``torchrun`` describes in the environment (NCCL on CUDA, gloo on
    a CPU), if any; return this process's device (``cuda:LOCAL_RANK`` on CUDA, else ``get_device``).
    A :class:`Trainer` built afterwards sees the process group and trains data-parallel.

    Defined in chapter 8, Training at scale.
    """
    chosen = torch.device(device) if device is not None else get_device()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or (dist.is_available() and dist.is_initialized()):
        if dist.is_available() and dist.is_initialized() and chosen.type == "cuda":
            chosen = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return chosen
    if chosen.type == "cuda":
        chosen = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(chosen)
    dist.init_process_group(backend="nccl" if chosen.type == "cuda" else "gloo")
    return chosen

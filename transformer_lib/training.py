"""The training engine shared by chapters 4 to 7 and the benchmarks.

A small, readable loop: AdamW with weight-decay groups, linear warm-up then cosine decay,
gradient clipping, gradient accumulation, periodic evaluation, a fused optimizer, mixed
precision where the hardware multiplies in it natively (see :func:`autocast_dtype`), atomic
checkpoints that resume exactly, and data parallelism when the process group of
``torch.distributed`` is initialised (``torchrun``). The loop never waits for the GPU except
when it logs. It knows nothing of notebooks:
a live loss plot is a ``fit`` callback (:class:`transformer_lib.notebook.plots.LivePlot`).

What it refuses, with an error that says why: a :class:`TrainConfig` with an invalid field
(``ValueError``), a loss that turns NaN or infinite (:class:`NonFiniteLossError`), and a
checkpoint that is corrupted, truncated, of another kind or for another model
(:class:`CheckpointError`, which leaves the trainer as it was).
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import Tensor, nn
from torch import distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ._validate import _validate_int, _validate_real
from .precision import autocast_dtype
from .utils import get_device

Batch = Any
BatchFn = Callable[[torch.Generator], Batch]
LossFn = Callable[[nn.Module, Batch], Tensor]


CHECKPOINT_FORMAT = "transformer_lib.checkpoint/1"


class NonFiniteLossError(FloatingPointError):
    """Training met a NaN or infinite loss (or gradient norm): :meth:`Trainer.fit` stops with this."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: unreadable, corrupted, of another kind, or for another model."""


def _validate_betas(value: object) -> tuple[float, float]:
    """Adam's two decay rates, each in [0, 1)."""
    message = f"betas must be a pair (beta1, beta2) of numbers in [0, 1), got {value!r}"
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(message)
    try:
        b1, b2 = (_validate_real("betas", b, "", lambda b: 0.0 <= b < 1.0) for b in value)
    except ValueError:
        raise ValueError(message) from None
    return (b1, b2)


def _validate_seed(value: object) -> int:
    """What ``torch.Generator.manual_seed`` takes: an integer that fits in 64 bits."""
    seed = _validate_int("seed", value, -(2**63), "an integer in [-2**63, 2**64)")
    if seed >= 2**64:
        raise ValueError(f"seed must be an integer in [-2**63, 2**64), got {value!r}")
    return seed


def _validate_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


@dataclass(frozen=True)
class TrainConfig:
    """How to train. ``min_lr`` is reached at ``max_steps`` by the cosine schedule.

    Every field is checked when the config is made, and a ``ValueError`` names each invalid
    field, its value and what is allowed. The rules: ``max_steps``, ``eval_interval``,
    ``eval_steps`` and ``log_interval`` are integers >= 1 and ``warmup_steps`` an integer >= 0;
    ``lr`` is finite and > 0; ``0 <= min_lr <= lr``; ``weight_decay >= 0``; both ``betas`` lie
    in [0, 1); ``grad_clip`` is a finite number > 0, or ``None`` for no clipping; ``seed`` is
    an integer in [-2**63, 2**64); ``grad_accum_steps`` is an integer >= 1; ``amp``,
    ``compile`` and ``progress`` are booleans. ``warmup_steps`` may
    exceed ``max_steps``: the run then ends during the warm-up, below ``lr`` (so shortening a
    run by ``max_steps`` alone stays valid). Numpy numbers are stored as Python ones, and
    ``betas`` as a tuple.

    ``grad_accum_steps = k`` makes every optimisation step draw k micro-batches and accumulate
    their gradients, each loss divided by k: with micro-batches of equal size and a loss that
    is a mean, the step equals one step on a batch k times larger, in the memory of one
    micro-batch.

    ``compile = True`` trains through ``torch.compile(model)``: the forward and backward passes
    become a few generated kernels, with the elementwise work (norms, activations, residual
    adds) fused. The first steps pay the compilation (seconds on a CPU, up to a minute on a
    GPU); evaluation and generation run the model uncompiled.

    The config is frozen: derive another with ``dataclasses.replace(config, lr=...)``.

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
    progress: bool = True  # a tqdm bar (the book build turns tqdm off with TQDM_DISABLE=1)

    def __post_init__(self) -> None:
        valid, problems = {}, []
        for name, validate in self._validators().items():
            try:
                valid[name] = validate(getattr(self, name))
            except ValueError as e:
                problems.append(str(e))
        if "lr" in valid and "min_lr" in valid and valid["min_lr"] > valid["lr"]:
            problems.append(
                f"min_lr must be <= lr={self.lr!r} (the cosine decays from lr to min_lr), got {self.min_lr!r}"
            )
        if problems:
            raise ValueError("invalid TrainConfig: " + "; ".join(problems))
        for name, value in valid.items():
            object.__setattr__(self, name, value)  # normalised: int, float, a tuple of betas

    @staticmethod
    def _validators() -> dict[str, Callable[[Any], Any]]:
        def positive_int(name: str) -> Callable[[Any], int]:
            return lambda v: _validate_int(name, v, 1)

        def grad_clip(v: Any) -> float | None:
            allowed = "a finite number > 0 (the largest gradient norm), or None for no clipping"
            return None if v is None else _validate_real("grad_clip", v, allowed, lambda x: x > 0)

        return {
            "max_steps": positive_int("max_steps"),
            "lr": lambda v: _validate_real("lr", v, "a finite number > 0", lambda x: x > 0),
            "min_lr": lambda v: _validate_real("min_lr", v, "a finite number >= 0", lambda x: x >= 0),
            "warmup_steps": lambda v: _validate_int("warmup_steps", v, 0),
            "weight_decay": lambda v: _validate_real("weight_decay", v, "a finite number >= 0", lambda x: x >= 0),
            "betas": _validate_betas,
            "grad_clip": grad_clip,
            "eval_interval": positive_int("eval_interval"),
            "eval_steps": positive_int("eval_steps"),
            "log_interval": positive_int("log_interval"),
            "seed": _validate_seed,
            "grad_accum_steps": positive_int("grad_accum_steps"),
            "amp": lambda v: _validate_bool("amp", v),
            "compile": lambda v: _validate_bool("compile", v),
            "progress": lambda v: _validate_bool("progress", v),
        }


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

    With a ``device``, the update is one fused kernel for all parameters instead of a dozen per
    parameter (CUDA, and CPU since torch 2.4), except on a CPU under data parallelism: there a
    process with the CPU's fused AdamW sometimes hung at exit after leaving its gloo process group
    (measured here: 2 of 8 two-process runs, and none of 8 with the unfused AdamW).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = device is not None and (device.type == "cuda" or (device.type == "cpu" and _rank_and_world_size()[1] == 1))
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)


def default_loss(model: nn.Module, batch: Batch) -> Tensor:
    """For models whose ``forward(x, y)`` returns ``(logits, loss)``, like :class:`~transformer_lib.models.GPT`."""
    x, y = batch
    return model(x, y)[1]


def _to(batch: Batch, device: torch.device) -> Batch:
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    return batch


def _model_config(model: nn.Module) -> dict | None:
    config = getattr(model, "config", None)
    return asdict(config) if is_dataclass(config) else None


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

    ``loss_fn(model, batch)`` returns the scalar loss (default: ``model(x, y)[1]``).
    ``val_batches`` (optional) draws evaluation batches. ``count(batch)`` tells how many
    items (e.g. tokens) a batch holds, for the speed report. The trainer owns the random
    generator passed to the batch functions, so a checkpoint resumes the data stream too.

    Data parallel: when ``torch.distributed`` is initialised with more than one process (as
    under ``torchrun``), the trainer wraps the model in ``DistributedDataParallel`` (the
    gradients are averaged across processes at every step, once per step when accumulating),
    seeds each process's data generator differently (``seed + rank``: every process draws its
    own batches), averages the logged and evaluated losses over the processes, shows a
    progress bar on rank 0 only, and writes checkpoints from rank 0 (call :meth:`save` and
    :meth:`load` on every process). ``loss_fn`` then receives the wrapper: call the model, as
    ``default_loss`` does, rather than its other methods. ``history.items`` counts this
    process's items.

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
        self._forward = self.ddp if self.ddp is not None else self.model
        if config.compile:  # the same parameters, behind generated kernels
            self._forward = torch.compile(self._forward)
        self.optimizer = self._new_optimizer()
        self.generator = torch.Generator().manual_seed(_rank_seed(config.seed, self.rank))
        self.step = 0
        self.history = History()
        self.amp_dtype = autocast_dtype(self.device) if config.amp else None
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)
        self._reset_nonfinite()

    @property
    def forward_model(self) -> nn.Module:
        """What the loss function calls in training: the DDP wrapper under data parallelism, else the
        model; compiled when ``config.compile`` is set."""
        return self._forward

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
        # The first step whose loss, and the first whose gradient norm, was not finite (-1: none yet).
        # Kept on the device so that train_step never waits for it; fit reads it when it logs.
        self._first_nonfinite = torch.full((2,), -1, dtype=torch.long, device=self.device)

    def _autocast(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    @torch.no_grad()
    def evaluate(self, steps: int | None = None) -> float:
        """Mean loss over ``steps`` (>= 1, default ``config.eval_steps``) validation batches.

        Draws training batches if there is no validation set.
        """
        steps = self.config.eval_steps if steps is None else _validate_int("steps", steps, 1)
        batches = self.val_batches or self.train_batches
        was_training = self.model.training
        self.model.eval()
        losses = []
        for _ in range(steps):
            with self._autocast():
                losses.append(self.loss_fn(self.model, _to(batches(self.generator), self.device)).float())
        self.model.train(was_training)
        return self._mean_over_processes(torch.stack(losses).mean()).item()

    def fit(self, steps: int | None = None, callback: Callable[[Trainer], None] | None = None) -> History:
        """Train until ``config.max_steps`` (or for ``steps`` more steps), evaluating on the way.

        The model trains in training mode; when ``fit`` returns (or raises), it is back in the
        mode it was in before the call (a new model is in training mode; the inference entry
        points switch to eval mode themselves).

        ``callback(trainer)``, if given, runs after every evaluation (with the model in eval
        mode and gradients off), e.g. to record attention maps or update a live figure.

        A NaN or infinite loss (or, when ``grad_clip`` is set and there is no fp16 gradient
        scaler, gradient norm) raises :class:`NonFiniteLossError`, naming the first such step.
        The check runs at each log interval, where the loop syncs with the device anyway, so the
        error comes up to ``log_interval - 1`` steps after the bad one. With the fp16 scaler
        an infinite gradient is routine (the scaler skips that step and lowers its scale) and
        is not an error; a non-finite loss still is.
        """
        steps = None if steps is None else _validate_int("steps", steps, 0)
        end = self.config.max_steps if steps is None else min(self.config.max_steps, self.step + steps)
        bar = None
        if self.config.progress and self.rank == 0:
            from tqdm.auto import tqdm

            bar = tqdm(total=max(0, end - self.step), desc="training", leave=False)
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
                h.lr.append(self.optimizer.param_groups[0]["lr"])
                if bar is not None:
                    bar.set_postfix(loss=f"{mean:.3f}")
            h.train_seconds += time.perf_counter() - t0
            if bar is not None:
                bar.update(1)
        if self.step == cfg.max_steps or self.step % cfg.eval_interval == 0:
            self._record_eval(callback)

    def _logged_mean(self, mean: Tensor) -> float:
        """The mean loss of a log interval as a float: the loop's only host sync, once per interval.

        Raises :class:`NonFiniteLossError` if a step so far had a non-finite loss or gradient norm
        (the flag rides along as a NaN, so that checking it costs no second sync).
        """
        flagged = mean.masked_fill(self._first_nonfinite.max() >= 0, float("nan"))
        value = self._mean_over_processes(flagged).item()  # a NaN on any process is a NaN on all
        if not math.isfinite(value):
            self._raise_nonfinite(value)
        return value

    def _raise_nonfinite(self, mean: float) -> NoReturn:
        loss_step, grad_step = self._first_nonfinite.tolist()
        if loss_step >= 0 and (grad_step < 0 or loss_step <= grad_step):
            what = f"the training loss is not finite (NaN or inf) at step {loss_step}"
        elif grad_step >= 0:
            what = f"the gradient norm is not finite (NaN or inf) at step {grad_step}, while the loss still was"
        else:
            what = f"the mean training loss up to step {self.step} is {mean}"
        cfg = self.config
        raise NonFiniteLossError(
            f"{what} (steps count from 0; training stopped at step {self.step}, and the weights may no longer "
            f"be finite: reload the last checkpoint). Try a lower learning rate (lr={cfg.lr}), gradient clipping "
            f"(grad_clip={cfg.grad_clip}), checking the inputs (token ids inside the vocabulary, no NaN in the "
            f"data, a loss_fn that cannot divide by zero), or full fp32 precision (amp=False)."
        )

    def train_step(self, batch: Batch, *more: Batch) -> Tensor:
        """One optimisation step on ``batch`` (and the micro-batches ``more``) at the scheduled
        learning rate; returns the mean loss, detached.

        Moves each batch to the device, runs forward and backward (in mixed precision where
        enabled) with each loss divided by the number of micro-batches, so that the gradients
        add up to the gradient of their mean; then clips the gradient norm and updates the
        weights. Under data parallelism the gradients are averaged across processes once, on
        the last micro-batch. No host sync: a non-finite loss or gradient norm is only recorded
        on the device, for :meth:`fit` to report.
        """
        cfg = self.config
        lr = lr_at(self.step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.max_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        micro_batches = (batch, *more)
        k = len(micro_batches)
        self.optimizer.zero_grad(set_to_none=True)
        total: Tensor | None = None
        for i, micro in enumerate(micro_batches):
            no_sync = self.ddp.no_sync() if self.ddp is not None and i < k - 1 else nullcontext()
            with no_sync:  # accumulate locally; average across processes on the last micro-batch only
                with self._autocast():
                    loss = self.loss_fn(self.forward_model, _to(micro, self.device))
                self.scaler.scale(loss if k == 1 else loss / k).backward()
            total = loss.detach().float() if total is None else total + loss.detach().float()
        loss = total if k == 1 else total / k
        grad_norm = None
        if cfg.grad_clip is not None:
            self.scaler.unscale_(self.optimizer)
            grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._note_nonfinite(loss, grad_norm)
        self.step += 1
        return loss

    def _note_nonfinite(self, loss: Tensor, grad_norm: Tensor | None) -> None:
        """Record, on the device, the first step whose loss (or gradient norm) is NaN or infinite.

        With the fp16 gradient scaler on, an infinite gradient is routine: the scaler skips that
        step and lowers its scale. So there only the loss counts.
        """
        bad_grad = torch.zeros((), dtype=torch.bool, device=self.device)
        if grad_norm is not None and not self.scaler.is_enabled():
            bad_grad = ~torch.isfinite(grad_norm)
        bad = torch.stack([~torch.isfinite(loss), bad_grad.to(self.device)])
        self._first_nonfinite.masked_fill_(bad & (self._first_nonfinite < 0), self.step)

    def _record_eval(self, callback: Callable[[Trainer], None] | None = None) -> None:
        h = self.history
        if h.eval_steps and h.eval_steps[-1] == self.step:
            return
        h.eval_steps.append(self.step)
        h.val_loss.append(self.evaluate())
        if callback is not None:
            was_training = self.model.training
            self.model.eval()
            with torch.no_grad():
                callback(self)
            self.model.train(was_training)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs, in tensors and plain Python values (no pickled objects)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "train_config": asdict(self.config),
            "model_config": _model_config(self.model),
            "generator": self.generator.get_state(),
            # under data parallelism, every process's data generator (index = rank): a resume draws on
            "rank_generators": self._gathered_generators(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "history": asdict(self.history),
        }

    def _gathered_generators(self) -> list[Tensor]:
        """Every process's data-generator state, by rank (empty with one process)."""
        if self.world_size == 1:
            return []
        states: list[Any] = [None] * self.world_size
        dist.all_gather_object(states, self.generator.get_state())
        return states

    def save(self, path: str | os.PathLike) -> Path:
        """Write a checkpoint atomically, with a checksum; return its path.

        The file is ``torch.save`` of ``{"format": "transformer_lib.checkpoint/1", "sha256": hex
        digest, "payload": uint8 tensor}``, where the payload holds the bytes of ``torch.save``
        of :meth:`state_dict`. It is written to a temporary file of its own in the same folder,
        flushed to disk, then renamed over ``path``: an interrupted save leaves the previous
        checkpoint intact, and two processes saving to one path leave one whole checkpoint.
        """
        path = Path(path)
        state = self.state_dict()  # under data parallelism a collective: every process calls save
        if self.rank != 0:  # rank 0 writes; the others wait until the file is there
            dist.barrier()
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        payload = buffer.getbuffer()
        checkpoint = {
            "format": CHECKPOINT_FORMAT,
            "sha256": hashlib.sha256(payload).hexdigest(),
            "payload": torch.frombuffer(payload, dtype=torch.uint8),
        }
        _write_atomically(checkpoint, path)
        if self.world_size > 1:
            dist.barrier()
        return path

    def load(self, path: str | os.PathLike) -> None:
        """Resume from a checkpoint written by :meth:`save`, all or nothing.

        The file is read with ``weights_only=True`` (no arbitrary objects are unpickled) and
        its checksum verified; then every part is checked against this trainer (the model's
        config, the keys and shapes of its weights, the optimizer state, the random states,
        the step and the history) before anything is changed. Any problem raises
        :class:`CheckpointError` (a ``ValueError``) naming the file and what is wrong, and
        leaves the trainer as it was. A missing file raises ``FileNotFoundError``.

        The trainer keeps its own :class:`TrainConfig`. A checkpoint written without a gradient
        scaler (CPU, bf16) resumed where the fp16 scaler is on starts that scaler afresh.
        """
        path = Path(path)
        state = _read_checkpoint(path)
        history = self._validate_checkpoint(state, path)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])  # a no-op where the scaler is off
        self.step = state["step"]
        self.generator.set_state(state["rank_generators"][self.rank] if self.world_size > 1 else state["generator"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] and torch.cuda.is_available():
            for device, rng in enumerate(state["cuda_rng"][: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(rng, device)
        self.history = history
        self._reset_nonfinite()

    def _validate_checkpoint(self, state: object, path: Path) -> History:
        """Check every part of a loaded checkpoint against this trainer; return its history."""

        def fail(what: str) -> CheckpointError:
            return CheckpointError(f"checkpoint {path} {what}")

        if not isinstance(state, dict):
            raise fail(f"holds a {type(state).__name__}, not a trainer state")
        missing = [name for name in CHECKPOINT_FIELDS if name not in state]
        if missing:
            raise fail(f"is incomplete: it has no {', '.join(missing)}")
        _validate_model_config(_model_config(self.model), state["model_config"], path)
        _validate_model_state(self.model.state_dict(), state["model"], fail)
        self._validate_optimizer_state(state["optimizer"], fail)
        _validate_scaler_state(state["scaler"], fail)
        _validate_rng_states(self.generator, state, fail)
        rank_generators = state.get("rank_generators", [])
        if self.world_size > 1 and len(rank_generators) != self.world_size:
            raise fail(
                f"holds the data streams of {len(rank_generators) or 1} process(es); this run has {self.world_size}: "
                f"resume with as many processes as wrote it"
            )
        for theirs in rank_generators:
            _validate_rng_states(self.generator, {**state, "generator": theirs}, fail)
        step = state["step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:  # a CheckpointError, not a ValueError
            raise fail(f"has step {step!r}, not an integer >= 0")
        if not isinstance(state["train_config"], dict):
            raise fail(f"has a train_config of type {type(state['train_config']).__name__}, not a dict")
        try:
            return History(**state["history"])
        except TypeError as e:
            raise fail(f"has a history that does not fit History ({e})") from e

    def _validate_optimizer_state(self, theirs: object, fail: Callable[[str], CheckpointError]) -> None:
        """Load ``theirs`` into a scratch optimizer over the same parameters (ours is untouched)."""
        scratch = self._new_optimizer()
        try:
            scratch.load_state_dict(theirs)
        except Exception as e:
            raise fail(f"has an optimizer state that does not fit this model ({type(e).__name__}: {e})") from e
        for param, moments in scratch.state.items():
            if not isinstance(param, Tensor):
                raise fail(f"has optimizer state for parameter {param!r}, which the optimizer does not have")
            for name in ("step", "exp_avg", "exp_avg_sq"):
                value = moments.get(name)
                if not isinstance(value, Tensor) or (name != "step" and value.shape != param.shape):
                    raise fail(
                        f"has an optimizer state whose {name} for a parameter of shape {tuple(param.shape)} "
                        f"is {_describe(value)}"
                    )


CHECKPOINT_FIELDS = (
    "model",
    "optimizer",
    "scaler",
    "step",
    "train_config",
    "model_config",
    "generator",
    "torch_rng",
    "cuda_rng",
    "history",
)
SCALER_FIELDS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _describe(value: object) -> str:
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor) else f"{value!r}"


def _write_atomically(obj: object, path: Path) -> None:
    """``torch.save`` to a temporary file of this save's own, flushed to disk, then renamed over ``path``.

    The temporary file is in the same folder (a rename within one filesystem is atomic on POSIX
    and Windows), named ``<path>.<random>.tmp`` so that concurrent saves never share it, and
    removed if anything goes wrong, even an interrupt.
    """
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as f:  # "x": never someone else's file
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    """Make a rename inside ``folder`` durable (POSIX; best effort where a filesystem refuses)."""
    if os.name != "posix":
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _first_line(error: BaseException, limit: int = 300) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {(text[0] if text else '')[:limit]}"


def _read_checkpoint(path: Path) -> dict[str, Any]:
    """The verified trainer state inside a checkpoint file, on the CPU; :class:`CheckpointError` if anything is off."""
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    try:
        outer = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(
            f"checkpoint {path} cannot be read: it is truncated, corrupted, or not a file written by torch.save "
            f"({_first_line(e)})"
        ) from e
    payload = _verified_payload(outer, path)
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: its payload is invalid ({_first_line(e)})") from e


def _verified_payload(outer: object, path: Path) -> bytes:
    """The payload bytes of a loaded checkpoint file, once its format and checksum are right."""
    if not isinstance(outer, dict) or "format" not in outer:
        raise CheckpointError(f"checkpoint {path} {_what_it_is(outer)}")
    if outer["format"] != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"checkpoint {path} has format {outer['format']!r}; this transformer_lib reads {CHECKPOINT_FORMAT!r}"
        )
    payload, digest = outer.get("payload"), outer.get("sha256")
    if not (isinstance(payload, Tensor) and payload.dtype == torch.uint8 and payload.dim() == 1):
        raise CheckpointError(f"checkpoint {path} is corrupted: its payload is {_describe(payload)}")
    data = payload.numpy().tobytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupted (checksum mismatch: the payload's sha256 is "
            f"{actual[:16]}..., the file says {str(digest)[:16]}...)"
        )
    return data


def _what_it_is(obj: object) -> str:
    """Why a file torch could load is not one of our checkpoints, for the error message."""
    if isinstance(obj, dict) and obj and all(isinstance(v, Tensor) for v in obj.values()):
        return (
            "is not a transformer_lib checkpoint but a plain state_dict (weights only): load it with "
            "model.load_state_dict(torch.load(path, weights_only=True))"
        )
    if isinstance(obj, dict) and {"model", "optimizer", "step"} <= set(obj):
        return (
            "is a Trainer state without format and checksum (from Trainer.state_dict, or an older "
            "transformer_lib): Trainer.load reads only files written by Trainer.save"
        )
    kind = f"a dict with keys {sorted(map(str, obj))[:8]}" if isinstance(obj, dict) else f"a {type(obj).__name__}"
    return f"is not a transformer_lib checkpoint (it holds {kind})"


def _validate_model_config(mine: dict | None, theirs: object, path: Path) -> None:
    if theirs is not None and not isinstance(theirs, dict):
        raise CheckpointError(f"checkpoint {path} has a model_config of type {type(theirs).__name__}, not a dict")
    if mine != theirs:
        diff = sorted(k for k in set(mine or {}) | set(theirs or {}) if (mine or {}).get(k) != (theirs or {}).get(k))
        raise CheckpointError(
            f"checkpoint {path} is for a different model config; differing fields: {diff} "
            f"(checkpoint: {[(theirs or {}).get(k) for k in diff]}, model: "
            f"{[(mine or {}).get(k) for k in diff]})"
        )


def _validate_model_state(mine: dict[str, Tensor], theirs: object, fail: Callable[[str], CheckpointError]) -> None:
    """The checkpoint's weights have exactly the model's names and shapes."""
    if not isinstance(theirs, dict):
        raise fail(f"has model weights of type {type(theirs).__name__}, not a state_dict")
    missing, unexpected = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
    if missing or unexpected:
        raise fail(f"does not fit the model: missing weights {missing[:5]}, unexpected weights {unexpected[:5]}")
    for name, value in theirs.items():
        if not isinstance(value, Tensor) or value.shape != mine[name].shape:
            raise fail(f"has {name} as {_describe(value)}; the model's has shape {tuple(mine[name].shape)}")


def _validate_scaler_state(theirs: object, fail: Callable[[str], CheckpointError]) -> None:
    """Empty (saved without the fp16 scaler) or holding every field of ``GradScaler.state_dict``."""
    if not isinstance(theirs, dict):
        raise fail(f"has a gradient-scaler state of type {type(theirs).__name__}, not a dict")
    missing = [name for name in SCALER_FIELDS if name not in theirs]
    if theirs and missing:
        raise fail(f"has a gradient-scaler state without {missing}")


def _validate_rng_states(generator: torch.Generator, state: dict, fail: Callable[[str], CheckpointError]) -> None:
    """The data generator's and torch's random states: byte tensors of the size this torch uses."""
    expected = {"generator": generator.get_state(), "torch_rng": torch.get_rng_state()}
    for name, mine in expected.items():
        theirs = state[name]
        if not isinstance(theirs, Tensor) or theirs.dtype != torch.uint8 or theirs.shape != mine.shape:
            raise fail(f"has a random state {name} that is {_describe(theirs)}, not {mine.numel()} bytes")
    cuda = state["cuda_rng"]
    if not isinstance(cuda, list) or not all(isinstance(s, Tensor) and s.dtype == torch.uint8 for s in cuda):
        raise fail("has a cuda_rng that is not a list of byte tensors")


def _rank_and_world_size() -> tuple[int, int]:
    """This process's rank and the number of processes (0 and 1 without ``torch.distributed``)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _rank_seed(seed: int, rank: int) -> int:
    """Process ``rank``'s data seed: ``seed + rank``, kept in the range ``manual_seed`` takes."""
    return (seed + rank) % 2**64 if rank else seed


def init_distributed(device: str | torch.device | None = None) -> torch.device:
    """Join the process group that ``torchrun`` describes in the environment, if any; return this
    process's device.

    Under ``torchrun --nproc_per_node=N`` (``WORLD_SIZE`` > 1 in the environment) it initialises
    ``torch.distributed``: the NCCL backend with one GPU per process (``cuda:LOCAL_RANK``) on
    CUDA, gloo on the CPU. Several machines are the same call with ``torchrun --nnodes=M
    --node_rank=... --rdzv_endpoint=HOST:PORT``: the rendezvous gives every process its rank.
    Without ``torchrun`` it does nothing and returns ``get_device(device)``. Then build a
    :class:`Trainer`: it sees the process group and trains data-parallel.

    Defined in chapter 8, Training at scale.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or (dist.is_available() and dist.is_initialized()):
        chosen = get_device(device)
        if dist.is_available() and dist.is_initialized() and chosen.type == "cuda":
            chosen = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return chosen
    chosen = get_device(device)
    if chosen.type == "cuda":
        chosen = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(chosen)
    dist.init_process_group(backend="nccl" if chosen.type == "cuda" else "gloo")
    return chosen

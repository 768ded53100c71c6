"""The training engine of the chapters that train (4 to 10) and the benchmarks: one small loop.

AdamW with weight-decay groups, warm-up then cosine decay, gradient clipping and accumulation, evaluation,
mixed precision where it is native (:func:`autocast_dtype`), data parallelism under ``torchrun``, and the
trainer's whole state (:meth:`Trainer.state_dict`, saved by :mod:`transformer_lib.checkpoint`). The loop
waits for the device only when it logs; a NaN or infinite loss raises :class:`NonFiniteLossError`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, NoReturn, cast

import torch
from torch import Tensor, nn
from torch import distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import checkpoint
from ._validate import _validate_int, _validate_real
from .checkpoint import CheckpointError
from .distributed import rank_and_world_size
from .precision import autocast_dtype
from .utils import batch_to, eval_mode, get_device

Batch = Any
BatchFn = Callable[[torch.Generator], Batch]
LossFn = Callable[[nn.Module, Batch], Tensor]


class NonFiniteLossError(FloatingPointError):
    """Training met a NaN or infinite loss (or gradient norm): :meth:`Trainer.fit` stops with this."""


@dataclass(frozen=True)
class TrainConfig:
    """What a training run computes. ``min_lr`` is reached at ``max_steps`` by the cosine schedule.

    Every field is checked when the config is made (``dataclasses.replace`` too): a ``ValueError`` names
    each invalid field, its value and what is allowed. ``grad_accum_steps = k`` makes every step accumulate
    the gradients of k micro-batches, each loss divided by k: with equal micro-batches and a mean loss, one
    step on a batch k times larger. How a run executes (compiled, with a bar) is the :class:`Trainer`'s.

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
        betas = self.betas
        pair = isinstance(betas, (tuple, list)) and len(betas) == 2
        if pair and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas):
            object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        else:
            problems.append(f"betas must be a pair (beta1, beta2) of numbers in [0, 1), got {betas!r}")
        if self.grad_clip is not None:
            clips = "a finite number > 0 (the largest gradient norm), or None for no clipping"
            validate("grad_clip", _validate_real, clips, lambda x: x > 0)
        seeds = "an integer in [-2**63, 2**64)"  # what torch.Generator.manual_seed takes
        validate("seed", _validate_int, -(2**63), seeds)
        if isinstance(self.seed, int) and self.seed >= 2**64:
            problems.append(f"seed must be {seeds}, got {self.seed!r}")
        if not isinstance(self.amp, bool):
            problems.append(f"amp must be True or False, got {self.amp!r}")
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

    With a ``device``, the update is one fused kernel for all parameters, except on a CPU under data
    parallelism, where the fused AdamW can hang a process at exit.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = device is not None and (device.type == "cuda" or (device.type == "cpu" and rank_and_world_size()[1] == 1))
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)


def default_loss(model: nn.Module, batch: Batch) -> Tensor:
    """For models whose ``forward(x, y)`` returns ``(logits, loss)``, like :class:`~transformer_lib.models.GPT`."""
    x, y = batch
    return model(x, y)[1]


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

    ``loss_fn(model, batch)`` returns the scalar loss; ``val_batches`` (optional) draws evaluation
    batches; ``count(batch)`` tells how many items (e.g. tokens) a batch holds, for the speed report.
    The trainer owns the batch functions' generator, so :meth:`state_dict` resumes the data stream too.
    ``compile=True`` trains through ``torch.compile`` (a string is its ``mode``: ``"reduce-overhead"``
    replays each step as a CUDA graph on a GPU); evaluation runs the model uncompiled.

    Under ``torchrun`` the model trains wrapped in ``DistributedDataParallel``, each process draws its own
    batches (seed ``seed + rank``), the losses are averaged over the processes, and rank 0 shows the bar
    and writes checkpoints (every process calls :meth:`save` and :meth:`load`). ``loss_fn`` then receives
    the wrapper: call the model, as ``default_loss`` does, not its other methods.

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
        compile: bool | str = False,
    ) -> None:
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        if not isinstance(compile, (bool, str)):
            raise TypeError(f"compile must be True, False or a torch.compile mode, got {compile!r}")
        self.config, self.loss_fn, self.count = config, loss_fn, count
        self.train_batches, self.val_batches = train_batches, val_batches
        self.device = torch.device(device) if device is not None else get_device()
        self.model = model.to(self.device)
        self.rank, self.world_size = rank_and_world_size()
        self.ddp = None  # the DistributedDataParallel wrapper, when there are several processes
        if self.world_size > 1:  # broadcasts rank 0's weights: every process starts from the same model
            device_ids = [self.device.index or 0] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=device_ids)
        # what loss_fn is called with in training: the DDP wrapper or the model, compiled if asked
        self.forward_model: nn.Module = self.ddp if self.ddp is not None else self.model
        self.compiled = compile is not False
        if self.compiled:  # the same parameters, behind generated kernels
            mode = compile if isinstance(compile, str) else None
            self.forward_model = cast(nn.Module, torch.compile(self.forward_model, mode=mode))
        self.optimizer = make_optimizer(model, config.lr, config.weight_decay, config.betas, self.device)
        self._parameters = list(self.model.parameters())  # listed once, in the model's order
        seed = (config.seed + self.rank) % 2**64 if self.rank else config.seed  # in manual_seed's range
        self.generator = torch.Generator().manual_seed(seed)
        self.step, self.history = 0, History()
        self.amp_dtype = autocast_dtype(self.device) if config.amp else None
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)
        self._reset_nonfinite()
        self._lr = lr_at(0, config.lr, config.min_lr, config.warmup_steps, config.max_steps)  # the last step's

    def _mean_over_processes(self, value: Tensor) -> Tensor:
        """``value`` averaged over the processes (itself when there is one)."""
        if self.world_size > 1:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value /= self.world_size
        return value

    def _reset_nonfinite(self) -> None:
        # The first steps whose loss and gradient norm were not finite (-1: none yet), on the device
        self._first_nonfinite = torch.full((2,), -1, dtype=torch.long, device=self.device)

    def _autocast(self) -> Any:
        return nullcontext() if self.amp_dtype is None else torch.autocast(self.device.type, self.amp_dtype)

    @torch.no_grad()
    def evaluate(self, steps: int | None = None) -> float:
        """Mean loss over ``steps`` (default ``config.eval_steps``) validation batches (else training ones)."""
        steps = self.config.eval_steps if steps is None else _validate_int("steps", steps, 1)
        batches = self.val_batches or self.train_batches
        with eval_mode(self.model), self._autocast():
            draws = (batch_to(batches(self.generator), self.device) for _ in range(steps))
            losses = [self.loss_fn(self.model, batch).float() for batch in draws]
        return self._mean_over_processes(torch.stack(losses).mean()).item()

    def fit(
        self, steps: int | None = None, callback: Callable[[Trainer], None] | None = None, progress: bool = True
    ) -> History:
        """Train until ``config.max_steps`` (or for ``steps`` more steps), evaluating on the way; the model
        is back in the caller's mode when ``fit`` returns or raises. ``callback(trainer)`` runs after every
        evaluation (eval mode, no gradients). ``progress`` shows a tqdm bar (:func:`progress_bar`).

        A NaN or infinite loss (or gradient norm, when ``grad_clip`` is set and there is no fp16 scaler,
        for which an infinite gradient is routine) raises :class:`NonFiniteLossError` naming the first
        such step, at the next log interval, where the loop syncs anyway; so does one in validation.
        """
        steps = None if steps is None else _validate_int("steps", steps, 0)
        if not isinstance(progress, bool):
            raise TypeError(f"progress must be True or False, got {progress!r}")
        if self.step >= self.config.max_steps:
            raise ValueError(
                f"the trainer is already at max_steps={self.config.max_steps} (step {self.step}): nothing to "
                f"train. To train longer, raise max_steps, e.g. trainer.config = dataclasses.replace("
                f"trainer.config, max_steps={2 * self.config.max_steps}); the cosine schedule then stretches to it"
            )
        end = self.config.max_steps if steps is None else min(self.config.max_steps, self.step + steps)
        bar = progress_bar(total=end - self.step, desc="training", leave=False) if progress and self.rank == 0 else None
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
        what = otherwise
        if loss_step >= 0 and (grad_step < 0 or loss_step <= grad_step):
            what = f"the training loss is not finite (NaN or inf) at step {loss_step}"
        elif grad_step >= 0:
            what = f"the gradient norm is not finite (NaN or inf) at step {grad_step}, while the loss still was"
        raise NonFiniteLossError(
            f"{what} (steps count from 0; training stopped at step {self.step}, and the weights may no longer "
            f"be finite: reload the last checkpoint). Try a lower learning rate (lr={self.config.lr}), gradient "
            f"clipping (grad_clip={self.config.grad_clip}), checking the inputs (token ids inside the vocabulary, "
            f"no NaN in the data, a loss_fn that cannot divide by zero), or full fp32 precision (amp=False)."
        )

    def train_step(self, batch: Batch, *more: Batch) -> Tensor:
        """One optimisation step on ``batch`` (and the micro-batches ``more``, each loss divided by their
        number) at the scheduled learning rate; returns the mean loss, detached. No host sync: a non-finite
        loss or gradient norm is only recorded on the device, for :meth:`fit` to report."""
        cfg = self.config
        self._lr = lr_at(self.step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.max_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = self._lr
        micro_batches = (batch, *more)
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
            foreach = True if self.device.type in ("cpu", "cuda") else None  # multi-tensor kernels: fewer calls
            grad_norm = nn.utils.clip_grad_norm_(self._parameters, cfg.grad_clip, foreach=foreach)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._note_nonfinite(loss, grad_norm)
        self.step += 1
        return loss

    def _note_nonfinite(self, loss: Tensor, grad_norm: Tensor | None) -> None:
        """Record, on the device, this step as the first whose loss (or gradient norm) is NaN or infinite.
        With the fp16 scaler only the loss counts: it skips a step with an infinite gradient."""
        bad_grad = torch.zeros((), dtype=torch.bool, device=self.device)
        if grad_norm is not None and not self.scaler.is_enabled():
            bad_grad = ~torch.isfinite(grad_norm)
        bad = torch.stack([~torch.isfinite(loss), bad_grad.to(self.device)])
        self._first_nonfinite.masked_fill_(bad & (self._first_nonfinite < 0), self.step)

    def _record_eval(self, callback: Callable[[Trainer], None] | None = None) -> None:
        h = self.history
        if h.eval_steps and h.eval_steps[-1] == self.step:
            return
        loss = self.evaluate()
        if not math.isfinite(loss):
            self._raise_nonfinite(f"the validation loss at step {self.step} is {loss}")
        h.eval_steps.append(self.step)
        h.val_loss.append(loss)
        if callback is not None:
            with eval_mode(self.model), torch.no_grad():
                callback(self)

    # ------------------------------------------------------------------ state and checkpoints

    def _model_config(self) -> dict | None:
        config = getattr(self.model, "config", None)  # GPTConfig and the other models' dataclass configs
        return asdict(config) if is_dataclass(config) and not isinstance(config, type) else None

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs, in tensors and plain Python values (it loads with ``weights_only=True``):
        weights, optimizer, loss scaler, step, configs, the data generator (every process's, gathered, under
        data parallelism: a collective there) and PyTorch's own random states, and the history."""
        generators: list[Any] = [self.generator.get_state()] * self.world_size
        if self.world_size > 1:
            dist.all_gather_object(generators, self.generator.get_state())
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "train_config": asdict(self.config),
            "model_config": self._model_config(),
            "generators": generators,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "history": asdict(self.history),
        }

    def load_state_dict(self, state: dict[str, Any], allow_config_change: bool = False) -> None:
        """Resume from :meth:`state_dict`, all or nothing: every check runs before anything changes, and a
        problem raises :class:`CheckpointError`. A state of another model config, another number of processes,
        or with weights that are not finite is refused; so is one of another :class:`TrainConfig`, unless
        ``allow_config_change=True``: the trainer then keeps its own (e.g. a larger ``max_steps``)."""
        config, world_size = asdict(self.config), self.world_size
        checkpoint.validate_state(state, self.model, self._model_config(), config, world_size, allow_config_change)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group, decay in zip(self.optimizer.param_groups, (self.config.weight_decay, 0.0), strict=True):
            group.update(betas=self.config.betas, weight_decay=decay)  # the trainer's config, not the state's
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])  # a no-op where the scaler is off
        self.step = state["step"]
        self.generator.set_state(state["generators"][self.rank])
        self.history = History(**state["history"])
        self._reset_nonfinite()
        torch.set_rng_state(state["torch_rng"])
        for device, rng in enumerate(state["cuda_rng"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(rng, device)

    def save(self, path: str | os.PathLike) -> str | os.PathLike:
        """Write :meth:`state_dict` to ``path`` atomically (:func:`transformer_lib.checkpoint.save`); return it.
        Weights that are not finite raise :class:`CheckpointError` and write nothing, so that the last
        checkpoint stays one worth reloading. Under data parallelism every process calls it; rank 0 writes."""
        state = self.state_dict()  # under data parallelism a collective
        names = [name for name, _ in self.model.named_parameters()]
        checkpoint.refuse_nonfinite(state, names, f"not saving {path}: the trainer")  # on every process, or none
        if self.rank == 0:
            checkpoint.save(state, path)
        if self.world_size > 1:
            dist.barrier()
        return path

    def load(self, path: str | os.PathLike, allow_config_change: bool = False) -> None:
        """:meth:`load_state_dict` of the file :meth:`save` wrote; a problem raises :class:`CheckpointError`
        naming the file, and leaves the trainer as it was."""
        state = checkpoint.load(path)  # its errors name the file
        try:
            self.load_state_dict(state, allow_config_change)
        except CheckpointError as e:
            raise CheckpointError(f"checkpoint {path}: {e}") from None


def progress_bar(**kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(**kwargs)``, off where ``TQDM_DISABLE`` is set (not to 0/false/no/off), as in the book
    build: tqdm's notebook bar ignores the variable itself, and the build would save the widget in a page."""
    from tqdm.auto import tqdm

    flag = os.environ.get("TQDM_DISABLE", "").strip().lower()
    return tqdm(disable=flag not in ("", "0", "false", "no", "off"), **kwargs)

"""The training engine shared by chapters 4 to 7 and the benchmarks.

A small, readable loop: AdamW with weight-decay groups, linear warm-up then cosine decay,
gradient clipping, periodic evaluation, a fused optimizer, mixed precision where the hardware
multiplies in it natively (see :func:`autocast_dtype`), atomic checkpoints that resume
exactly. The loop never waits for the GPU except when it logs. It knows nothing of notebooks:
a live loss plot is a ``fit`` callback (:class:`transformer_lib.notebook.plots.LivePlot`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .precision import autocast_dtype
from .utils import get_device

Batch = Any
BatchFn = Callable[[torch.Generator], Batch]
LossFn = Callable[[nn.Module, Batch], Tensor]


@dataclass
class TrainConfig:
    """How to train. ``min_lr`` is reached at ``max_steps`` by the cosine schedule.

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
    amp: bool = True  # mixed precision where it is native: see autocast_dtype
    progress: bool = True  # a tqdm bar (the book build turns tqdm off with TQDM_DISABLE=1)

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.eval_interval < 1 or self.log_interval < 1:
            raise ValueError("max_steps, eval_interval and log_interval must be >= 1")
        if self.warmup_steps < 0 or self.lr <= 0 or self.min_lr < 0:
            raise ValueError(
                f"need warmup_steps >= 0, lr > 0, min_lr >= 0; got {self.warmup_steps}, {self.lr}, {self.min_lr}"
            )


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
    """AdamW where only matrices (weights of linears and embeddings) decay; norms and biases do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # One fused kernel for the whole update instead of a dozen per parameter (CUDA, and CPU since torch 2.4).
    fused = device is not None and device.type in ("cuda", "cpu")
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
        self.config, self.loss_fn, self.count = config, loss_fn, count
        self.train_batches, self.val_batches = train_batches, val_batches
        self.device = torch.device(device) if device is not None else get_device()
        self.model = model.to(self.device)
        self.optimizer = make_optimizer(model, config.lr, config.weight_decay, config.betas, self.device)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.step = 0
        self.history = History()
        self.amp_dtype = autocast_dtype(self.device) if config.amp else None
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)

    def _autocast(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    @torch.no_grad()
    def evaluate(self, steps: int | None = None) -> float:
        """Mean loss over ``steps`` validation batches (training batches if there is no validation set)."""
        batches = self.val_batches or self.train_batches
        was_training = self.model.training
        self.model.eval()
        losses = []
        for _ in range(steps or self.config.eval_steps):
            with self._autocast():
                losses.append(self.loss_fn(self.model, _to(batches(self.generator), self.device)).float())
        self.model.train(was_training)
        return torch.stack(losses).mean().item()

    def fit(self, steps: int | None = None, callback: Callable[[Trainer], None] | None = None) -> History:
        """Train until ``config.max_steps`` (or for ``steps`` more steps), evaluating on the way.

        ``callback(trainer)``, if given, runs after every evaluation (with the model in eval
        mode and gradients off), e.g. to record attention maps or update a live figure.
        """
        cfg, h = self.config, self.history
        end = cfg.max_steps if steps is None else min(cfg.max_steps, self.step + steps)
        bar = None
        if cfg.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=end - self.step, desc="training", leave=False)
        self.model.train()
        running = torch.zeros((), device=self.device)
        n_running = 0
        while self.step < end:
            if self.step % cfg.eval_interval == 0:
                self._record_eval(callback)
            t0 = time.perf_counter()
            batch = self.train_batches(self.generator)
            running += self.train_step(batch)
            n_running += 1
            if self.count is not None:
                h.items += self.count(batch)
            if self.step % cfg.log_interval == 0 or self.step == end:
                mean = (running / n_running).item()  # the only host sync, once per log interval
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
        if bar is not None:
            bar.close()
        return h

    def train_step(self, batch: Batch) -> Tensor:
        """One optimisation step on ``batch`` at the scheduled learning rate; returns the loss, detached.

        Moves the batch to the device, runs forward and backward (in mixed precision where
        enabled), clips the gradient norm and updates the weights. No host sync.
        """
        cfg = self.config
        lr = lr_at(self.step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.max_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = _to(batch, self.device)
        with self._autocast():
            loss = self.loss_fn(self.model, batch)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if cfg.grad_clip is not None:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.step += 1
        return loss.detach().float()

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
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "train_config": asdict(self.config),
            "model_config": _model_config(self.model),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "history": asdict(self.history),
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write a checkpoint atomically: to a temporary file first, then renamed over ``path``.

        An interrupted save leaves the previous checkpoint intact.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, path)  # atomic on POSIX and Windows
        return path

    def load(self, path: str | os.PathLike) -> None:
        """Resume from a checkpoint written by :meth:`save` (loaded with ``weights_only=True``)."""
        state = torch.load(path, map_location=self.device, weights_only=True)
        mine, theirs = _model_config(self.model), state.get("model_config")
        if mine != theirs:
            diff = sorted(
                k for k in set(mine or {}) | set(theirs or {}) if (mine or {}).get(k) != (theirs or {}).get(k)
            )
            raise ValueError(
                f"checkpoint {path} is for a different model config; differing fields: {diff} "
                f"(checkpoint: {[(theirs or {}).get(k) for k in diff]}, model: "
                f"{[(mine or {}).get(k) for k in diff]})"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.step = state["step"]
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"].cpu())
        if state["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda_rng"]])
        self.history = History(**state["history"])

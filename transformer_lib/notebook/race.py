"""The library's training step raced against nanoGPT's loop, step by step on the same batches (chapter 8).

:func:`races_in_turn` trains each :class:`Race`'s two engines, the library's
:class:`~transformer_lib.training.Trainer` and a :class:`~transformer_lib.notebook.reference_gpt.ReferenceGPT`
in nanoGPT's loop with the trainer's recipe and precision, from the weights they hold, on the same batch
at every step. All engines of all races take turns within each step, each taking every place in the order
in turn, so that a drifting machine weighs on each alike: the one thing this adds to ``torch.utils.benchmark``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..training import Trainer
from .reference_gpt import reference_train_step

Batches = Callable[[], tuple[Tensor, Tensor]]
Engine = Callable[[Tensor, Tensor, int], object]  # trains on the batch (x, y) as step i


@dataclass
class SideBySide:
    """One race's result: median seconds per step and final validation loss of each engine, and the seconds
    of each one's first step (which includes any compilation)."""

    ours_step: float
    reference_step: float
    ours_val_loss: float
    reference_val_loss: float
    steps: int
    tokens_per_step: int
    ours_first_step: float
    reference_first_step: float
    alongside_step: float | None = None  # median seconds of the race's ``alongside``, if it has one

    @property
    def speedup(self) -> float:
        return self.reference_step / self.ours_step


@dataclass
class Race:
    """The library's ``trainer`` against ``reference`` trained by nanoGPT's loop in the trainer's recipe;
    ``alongside()``, if given, is timed in the same rotation (e.g. the step's products alone,
    :func:`~transformer_lib.notebook.benchmark.library_step_products`)."""

    trainer: Trainer
    reference: nn.Module
    alongside: Callable[[], object] | None = None
    compile_reference: bool = False


@torch.no_grad()
def mean_loss(model: nn.Module, batches: Sequence[tuple[Tensor, Tensor]]) -> float:
    """Mean of ``model(x, y)[1]`` over ``batches``, in eval mode and eagerly (a model compiled in place is not
    compiled again for evaluation); the model's training mode is restored."""
    was_training = model.training
    model.eval()
    try:
        with torch.compiler.set_stance("force_eager"):
            return sum(model(x, y)[1].item() for x, y in batches) / len(batches)
    finally:
        model.train(was_training)


def train_side_by_side(
    trainer: Trainer,
    reference: nn.Module,
    batches: Batches,
    val_batches: Sequence[tuple[Tensor, Tensor]],
    steps: int | None = None,
    warmup: int = 5,
    compile_reference: bool = False,
    alongside: Callable[[], object] | None = None,
) -> SideBySide:
    """One :class:`Race` run by :func:`races_in_turn`."""
    race = Race(trainer, reference, alongside, compile_reference)
    return races_in_turn({"race": race}, batches, val_batches, steps, warmup)["race"]


def races_in_turn(
    races: Mapping[str, Race],
    batches: Batches,
    val_batches: Sequence[tuple[Tensor, Tensor]],
    steps: int | None = None,
    warmup: int = 5,
) -> dict[str, SideBySide]:
    """Train every race's two engines, and time its ``alongside``, for ``steps`` steps (default: the steps the
    trainers have left, which must agree) on one batch per step drawn by ``batches()``, in one rotation.

    Medians leave out the first ``warmup`` steps. Each race keeps its own schedule and optimizer and ends as it
    would raced alone; then both of its models are evaluated on ``val_batches`` (:func:`mean_loss`). The races
    must train on one device.
    """
    steps = _steps_to_race(races, steps, warmup)
    engines = {key: engine for name, race in races.items() for key, engine in _engines(name, race).items()}
    device = next(iter(races.values())).trainer.device
    times, tokens = _in_turn(engines, batches, steps, device)
    median = {key: statistics.median(t[warmup:]) for key, t in times.items()}
    return {
        name: SideBySide(
            ours_step=median[name, "ours"],
            reference_step=median[name, "reference"],
            ours_val_loss=mean_loss(r.trainer.model, val_batches),
            reference_val_loss=mean_loss(r.reference, val_batches),
            steps=steps,
            tokens_per_step=tokens,
            ours_first_step=times[name, "ours"][0],
            reference_first_step=times[name, "reference"][0],
            alongside_step=median.get((name, "alongside")),
        )
        for name, r in races.items()
    }


def _steps_to_race(races: Mapping[str, Race], steps: int | None, warmup: int) -> int:
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
    return steps


def _engines(name: str, race: Race) -> dict[tuple[str, str], Engine]:
    """The race's two engines, and its ``alongside``, as functions of the batch and the step number."""
    race.reference.to(race.trainer.device).train()
    race.trainer.model.train()
    engines: dict[tuple[str, str], Engine] = {
        (name, "ours"): lambda x, y, i: race.trainer.train_step((x, y)),
        (name, "reference"): reference_train_step(race.reference, race.trainer, race.compile_reference),
    }
    if (alongside := race.alongside) is not None:
        engines[name, "alongside"] = lambda x, y, i: alongside()
    return engines


def _in_turn(
    engines: Mapping[tuple[str, str], Engine],
    batches: Batches,
    steps: int,
    device: torch.device,
) -> tuple[dict[tuple[str, str], list[float]], int]:
    """Seconds of every engine's call at every step (each step's order starts one place further on), and the
    tokens of the last batch."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    keys = list(engines)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
    x = torch.empty(0)
    for i in range(steps):
        x, y = batches()
        for key in keys[i % len(keys) :] + keys[: i % len(keys)]:
            sync()
            t0 = time.perf_counter()
            engines[key](x, y, i)
            sync()
            times[key].append(time.perf_counter() - t0)
    return times, x.numel()

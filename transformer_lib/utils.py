"""Small utilities every chapter uses: device choice, seeding, timing, parameter counting, modes."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn


def get_device(prefer: str | None = None) -> torch.device:
    """Return the best available device: CUDA, then Apple's MPS, then the CPU.

    ``prefer`` (e.g. ``"cpu"``) forces a device; the environment variable
    ``TRANSFORMER_DEVICE`` does the same for a whole run.
    """
    choice = prefer or os.environ.get("TRANSFORMER_DEVICE")
    if choice:
        return torch.device(choice)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def batch_to(batch: Any, device: torch.device, copy: bool = False) -> Any:
    """``batch`` with every tensor moved to ``device`` (asynchronously where it can be), through tuples,
    lists and dicts; other values as they are. A tensor already there is itself, unless ``copy``."""
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True, copy=copy)
    if isinstance(batch, (tuple, list)):
        return type(batch)(batch_to(b, device, copy) for b in batch)
    if isinstance(batch, dict):
        return {k: batch_to(v, device, copy) for k, v in batch.items()}
    return batch


def set_seed(seed: int = 0) -> torch.Generator:
    """Seed Python, NumPy and PyTorch (all devices) so runs repeat on the CPU.

    Returns a ``torch.Generator`` seeded with the same value, for code that
    wants its own stream of random numbers. ``seed`` is an int in ``[-2**63, 2**64)``,
    the range of ``torch.manual_seed``.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r} ({type(seed).__name__})")
    if not -(2**63) <= seed < 2**64:
        raise ValueError(f"seed must be an int in [-2**63, 2**64) (what torch.manual_seed takes), got {seed}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def best_time(fn: Callable[[], object], repeats: int = 5) -> float:
    """Seconds taken by the fastest of ``repeats`` calls of ``fn()``, after one warm-up call.

    The minimum, not the mean: other work on the machine only ever adds time.

    Defined in chapter 3, Multi-head attention.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of parameters of ``model``; tied (shared) tensors are counted once.

    Defined in chapter 3, Multi-head attention.
    """
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Run a block with ``model`` in eval mode (no dropout), then restore the caller's mode.

    Every inference entry point (generation, decoding, attention maps) uses it.
    """
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run a block with PyTorch on ``n`` CPU threads, then restore the caller's number.

    Defined in chapter 3, Multi-head attention.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)

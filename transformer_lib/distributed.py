"""Data parallelism's set-up: join the process group ``torchrun`` describes (chapter 8).

The :class:`~transformer_lib.training.Trainer` reads :func:`rank_and_world_size` and, with several
processes, trains its model wrapped in ``DistributedDataParallel``.
"""

from __future__ import annotations

import os

import torch
from torch import distributed as dist

from .utils import get_device


def rank_and_world_size() -> tuple[int, int]:
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
    if chosen.type == "cuda" and "LOCAL_RANK" in os.environ:  # one GPU per process
        chosen = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(chosen)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not (dist.is_available() and dist.is_initialized()):
        dist.init_process_group(backend="nccl" if chosen.type == "cuda" else "gloo")
    return chosen

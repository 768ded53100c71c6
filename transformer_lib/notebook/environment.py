"""What a chapter's first cell prints, and whether the book build is running the chapter."""

from __future__ import annotations

import os
import platform

import torch

from .. import __version__
from ..utils import get_device, set_seed

#: Set to "1" by ``make book`` (scripts/build_book.py) while it executes the chapters.
BOOK_ENV = "TRANSFORMER_BOOK_BUILD"


def in_book_build() -> bool:
    """True while ``make book`` executes the chapters."""
    return os.environ.get(BOOK_ENV) == "1"


def describe_environment(seed: int | None = 0) -> torch.device:
    """Print the versions and the device a chapter runs on, seed everything, and return the device.

    Every chapter's first cell calls this.
    """
    device = get_device()
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print(
        f"Python {platform.python_version()} | torch {torch.__version__} | transformer_lib {__version__} "
        f"| device: {device}{gpu}"
    )
    if seed is not None:
        set_seed(seed)
    return device

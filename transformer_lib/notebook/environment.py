"""A chapter's first cell (:func:`setup_chapter`), and whether the book build is running the chapter."""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from .. import __version__
from ..utils import get_device, set_seed

#: Set to "1" by ``make book`` (scripts/build_book.py) while it executes the chapters.
BOOK_ENV = "TRANSFORMER_BOOK_BUILD"


def in_book_build() -> bool:
    """True while ``make book`` executes the chapters."""
    return os.environ.get(BOOK_ENV) == "1"


def threads_for_a_busy_cpu(rounds: int = 5, slower: float = 1.3) -> int:
    """PyTorch's thread count, or 1 when another process is keeping a core busy, measured now.

    Alone, several threads are about as fast as one on a small model's operations, or faster. With
    another process busy on a core, threads that wait for each other at every operation make each
    one slower: on 2 cores beside one busy loop, chapter 6's training took minutes instead of
    seconds. The probe is a small training step's mix of operations (products of a few thousand
    rows, GELU, softmax, backward), timed with each thread count, alternating; when the default is
    more than ``slower`` times slower than one thread (medians of ``rounds``), one thread it is.
    """
    n_threads = torch.get_num_threads()
    if n_threads == 1:
        return 1
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1536, 32, generator=g, requires_grad=True)  # (B * T, d_model) = (64 * 24, 32)
    w1, w2 = torch.randn(32, 128, generator=g, requires_grad=True), torch.randn(128, 32, generator=g)

    def step() -> None:
        h = F.gelu(x @ w1) @ w2  # (B * T, d_model)
        h = h.view(64, 24, 32)  # (B, T, d_model)
        (h @ h.transpose(1, 2)).softmax(dim=-1).sum().backward()  # (B, T, T) scores

    def seconds(threads: int) -> float:
        torch.set_num_threads(threads)
        step()  # warm-up
        t0 = time.perf_counter()
        for _ in range(5):
            step()
        return time.perf_counter() - t0

    times: dict[int, list[float]] = {n_threads: [], 1: []}
    try:
        for _ in range(rounds):
            for threads in times:
                times[threads].append(seconds(threads))
    finally:
        torch.set_num_threads(n_threads)
    return 1 if statistics.median(times[n_threads]) > slower * statistics.median(times[1]) else n_threads


# glibc's mallopt parameters (malloc.h) and the values set: blocks up to 32 MiB (glibc's largest
# threshold on 64-bit) from the heap, and up to 1 GiB of free memory kept at the heap's top.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_ABOVE, _TRIM_ABOVE = 32 << 20, 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """Make glibc's allocator keep the memory this process frees, for reuse; say whether it took.

    A training step frees and allocates the same activations every step. glibc's ``malloc`` gives a
    large block its own mapping and unmaps it when it is freed, and returns free memory at the top of its
    heap to the kernel, so the kernel maps and zeroes the same pages again every step. This raises both
    thresholds (``mallopt``), for the whole process and for good: it then keeps up to 1 GiB it freed
    rather than returning it. No result changes. Returns False, changing nothing, where the C library
    is not glibc (macOS, Windows, musl).
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)  # the symbols the process already has: its C library's
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return False  # not glibc: its parameters' numbers mean something else, or nothing
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_ABOVE)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_ABOVE))


def setup_chapter(seed: int | None = 0) -> torch.device:
    """Set up a chapter's kernel and return its device: print the versions and the device, seed every
    generator (:func:`~transformer_lib.utils.set_seed`), and on a CPU keep freed memory for reuse
    (:func:`keep_freed_memory`) and give PyTorch one thread when one thread is clearly faster than its
    default (:func:`threads_for_a_busy_cpu`: another process is keeping a core busy), saying so.

    Every chapter's first cell calls this.
    """
    device = get_device()
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    versions = f"Python {platform.python_version()} | torch {torch.__version__} | transformer_lib {__version__}"
    on = f"device: {device}{gpu}"
    # one line where it fits the rendered book's 79-column output box; a GPU's name takes a second
    print(f"{versions} | {on}" if len(versions) + 3 + len(on) <= 79 else f"{versions}\n{on}")
    if device.type == "cpu":
        keep_freed_memory()
    if device.type == "cpu" and torch.get_num_threads() > 1 and threads_for_a_busy_cpu() == 1:
        print(  # three lines, each within the output box of the rendered book (79 columns)
            f"one PyTorch thread instead of {torch.get_num_threads()}: another process is keeping a core busy,\n"
            "and one thread ran a small training step faster\n"
            "(Running this book: threads on a busy machine)"
        )
        torch.set_num_threads(1)
    if seed is not None:
        set_seed(seed)
    return device

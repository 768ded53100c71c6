"""Probes of this machine and of a training step: multiply rate, memory bandwidth, counted FLOPs, operator times.

Chapter 8 sets the library's step against its matrix products alone (:func:`library_step_products`, timed in
the races of :mod:`~transformer_lib.notebook.race`) and against the machine's peak; chapter 9 sets decoding
against the multiply rate and the bandwidth. Rates are timed by ``torch.utils.benchmark.Timer``.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.utils.benchmark import Timer

from .._validate import _validate_int

Shape = tuple[int, int, int]  # (M, K, N) of a product (M, K) @ (K, N)


def _fastest_seconds(fn: Callable[[], object], seconds: float = 0.2) -> float:
    """Seconds per call of ``fn()`` in the fastest block of ``Timer.blocked_autorange(min_run_time=seconds)``,
    with PyTorch's current thread count (and, as Timer does, waiting for the GPU): the machine at its best,
    so that a moment of load elsewhere does not lower a rate."""
    timer = Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return min(timer.blocked_autorange(min_run_time=seconds).times)


def _products(shapes: Sequence[tuple[Shape, torch.dtype]], device: torch.device | str = "cpu") -> Callable[[], None]:
    """A function that runs ``(M, K) @ (K, N)`` once for each ``((M, K, N), dtype)`` of ``shapes``, in order, on
    random operands made here, one pair per shape and dtype (a repeated shape, every block's, reuses its pair,
    as a step reuses its weights): a step's matrix work and nothing else. It does not wait for the GPU."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(0)
    operands: dict[tuple[Shape, torch.dtype], tuple[Tensor, Tensor]] = {}
    for (m, k, n), dtype in shapes:
        if ((m, k, n), dtype) not in operands:
            a = torch.randn(m, k, generator=g, device=device, dtype=dtype)
            operands[(m, k, n), dtype] = a, torch.randn(k, n, generator=g, device=device, dtype=dtype)
    pairs = [operands[key] for key in shapes]

    def run() -> None:
        for a, b in pairs:
            a @ b

    return run


def matmul_flops_per_second(
    shapes: Sequence[Shape],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seconds: float = 0.2,
) -> float:
    """The rate this machine multiplies the products ``(M, K) @ (K, N)`` of ``shapes`` at, in ``dtype``: their
    operations (2 M K N each) over their :func:`_fastest_seconds`. A bound on any step made of these products."""
    flops = sum(2 * m * k * n for m, k, n in shapes)
    return flops / _fastest_seconds(_products([(s, dtype) for s in shapes], device), seconds)


def copy_bytes_per_second(n_bytes: int = 2**26, device: torch.device | str = "cpu", seconds: float = 0.1) -> float:
    """The memory bandwidth of copying one float32 tensor of ``n_bytes`` into another: the bytes read and
    written, ``2 * n_bytes``, over the copy's :func:`_fastest_seconds`. With ``n_bytes`` well above the caches
    (the default, 64 MiB) it is the rate a step that reads every weight once, as decoding does, can at best
    receive them (chapter 9)."""
    if not isinstance(n_bytes, int) or isinstance(n_bytes, bool) or n_bytes < 4 or n_bytes % 4:
        raise ValueError(f"n_bytes must be a positive multiple of 4 (float32 numbers), got {n_bytes!r}")
    src = torch.ones(n_bytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * n_bytes / _fastest_seconds(lambda: dst.copy_(src), seconds)


def gpt_matmul_shapes(n_tokens: int, d_model: int, d_ff: int, vocab_size: int) -> list[Shape]:
    """The (M, K, N) of one GPT block's products in a training step over ``n_tokens`` tokens, then the output
    head's three: for each linear, forward (x @ W), input gradient (dy @ W^T) and weight gradient (x^T @ dy)."""
    linears = [(d_model, 3 * d_model), (d_model, d_model), (d_model, d_ff), (d_ff, d_model), (d_model, vocab_size)]
    shapes = []
    for d_in, d_out in linears:
        shapes += [(n_tokens, d_in, d_out), (n_tokens, d_out, d_in), (d_in, n_tokens, d_out)]
    return shapes


def library_step_products(
    blocks: Sequence[Shape], head: Sequence[Shape], dtype: torch.dtype | None, device: torch.device | str = "cpu"
) -> Callable[[], None]:
    """The step's products (:func:`_products`) in the precisions the library's step multiplies in under
    autocast to ``dtype``: with None every product in fp32; else the blocks' in ``dtype`` and the head's in
    fp32 (:func:`~transformer_lib.precision.output_in_fp32`). Timed, the fastest any engine takes the step."""
    low = torch.float32 if dtype is None else dtype
    return _products([(s, low) for s in blocks] + [(s, torch.float32) for s in head], device)


def train_step_flops(model: nn.Module, x: Tensor, y: Tensor) -> int:
    """Operations of one forward and backward pass of ``model(x, y)`` (which returns ``(logits, loss)``), as
    ``torch.utils.flop_counter.FlopCounterMode`` counts them: the matrix products, and the attention kernel
    where PyTorch counts it (on CUDA, not on a CPU). The gradients are cleared afterwards."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        _, loss = model(x, y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


@contextmanager
def _profiler_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null (the profiler logs its start and stop there from C++), and without the
    profiler's note that it "clears events at the end of each cycle"."""
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
    """Seconds per call of ``fn()`` in each PyTorch operator (its self time), or on CUDA in each GPU kernel,
    longest first: one call to warm up, then ``repeats`` under ``torch.profiler``, printing nothing."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    repeats = _validate_int("repeats", repeats)
    cuda = torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fn()
    sync()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with _profiler_silenced(), profile(activities=activities) as prof:
        for _ in range(repeats):
            fn()
            sync()
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
    """Each PyTorch operator's share of the CPU time of ``fn()`` (:func:`op_times`), largest first; they add
    up to 1."""
    times = op_times(fn, "cpu", repeats)
    total = sum(seconds for _, seconds in times)
    return [(name, seconds / total) for name, seconds in times]

"""Independent runs side by side on a CPU's cores: the chapters' seeds and ablations, the book's pictures.

A small model cannot use a CPU's cores: its matrix products are too small to share out. Separate runs
can, one per core with one PyTorch thread each. On Linux each run works in a forked copy of this process
(``concurrent.futures.ProcessPoolExecutor`` with the ``fork`` context): threads of one process would
share Python's lock, which a small model's step takes at every operator. Elsewhere (macOS, Windows,
where forking is unsafe or impossible) the runs take threads. A forked worker dies with this process
(``PR_SET_PDEATHSIG``), and what it prints goes nowhere (this process's streams may be a Jupyter
kernel's, which a forked copy must not use).
"""

from __future__ import annotations

import copy
import ctypes
import io
import multiprocessing
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from typing import Any, TypeVar

import torch
from torch import nn

from ..attention import MultiHeadAttention
from ..training import History, Trainer, progress_bar

Item = TypeVar("Item")
Result = TypeVar("Result")
# What forked workers inherit (the pool forks them at its first submit): fit_together's trainers, and
# map_in_processes's function and items, which need not pickle.
_RUNS: list[Trainer] = []
_MAP: tuple[Callable[[Any], Any], list[Any]] | None = None
_PR_SET_PDEATHSIG = 1  # prctl(2)


def can_fork() -> bool:
    """Whether runs can work in forked processes here: on Linux (macOS's system libraries are not safe
    to use after a fork, which is why Python spawns there; Windows cannot fork)."""
    return sys.platform.startswith("linux")


def _start_worker(parent: int) -> None:
    """A forked worker's set-up: die with ``parent``, print nowhere, one PyTorch thread."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (open until the process ends)
    torch.set_num_threads(1)


def _pool(workers: int) -> Executor:
    if can_fork():
        fork = multiprocessing.get_context("fork")
        return ProcessPoolExecutor(workers, mp_context=fork, initializer=_start_worker, initargs=(os.getpid(),))
    return ThreadPoolExecutor(workers, thread_name_prefix="fit_together")


def _stop(pool: Executor, before: set[multiprocessing.process.BaseProcess]) -> None:
    """Cancel what has not started and kill the forked workers this call started (not threads: they finish)."""
    pool.shutdown(wait=False, cancel_futures=True)
    for process in set(multiprocessing.active_children()) - before:
        process.kill()


def _sendable(error: BaseException | None) -> BaseException | None:
    """``error`` if it survives pickling, else a RuntimeError carrying its type, message and traceback."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        text = "".join(traceback.format_exception(error)).rstrip()
        return RuntimeError(f"a run failed with an error that cannot be sent between processes:\n{text}")


def _fit_run(index: int, with_callback: bool) -> tuple[bytes, BaseException | None]:
    """Train run ``index`` and return its final state and snapshots at each evaluation (``torch.save``'d), and
    its error. A run that fails, or is interrupted, still returns the state it stopped in."""
    trainer = _RUNS[index]
    snapshots: list[tuple[int, dict, History]] = []

    def snapshot(t: Trainer) -> None:
        weights = {name: w.clone() for name, w in t.model.state_dict().items()}
        snapshots.append((t.step, weights, copy.deepcopy(t.history)))

    error = None
    try:
        trainer.fit(callback=snapshot if with_callback else None, progress=False)
    except BaseException as e:
        error = _sendable(e)
    buffer = io.BytesIO()
    torch.save((trainer.state_dict(), snapshots), buffer)
    return buffer.getvalue(), error


def _take_result(trainer: Trainer, data: bytes, callback: Callable[[Trainer], None] | None) -> None:
    """Run ``callback`` on the run's snapshots in order (its weights, step and history at each evaluation,
    in eval mode without gradients), then give ``trainer`` the run's final state."""
    state, snapshots = torch.load(io.BytesIO(data), weights_only=False)  # from this process's own worker
    was_training = trainer.model.training
    trainer.model.eval()
    with torch.no_grad():
        for step, weights, history in snapshots if callback is not None else []:
            trainer.model.load_state_dict(weights)
            trainer.step, trainer.history = step, history
            callback(trainer)
    trainer.model.train(was_training)
    trainer.load_state_dict(state, allow_config_change=True)


def fit_together(
    trainers: Sequence[Trainer],
    callback: Callable[[Trainer], None] | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> list[History]:
    """``trainer.fit(callback=callback)`` for each of ``trainers``, ``workers`` runs at a time (default: one
    per core), side by side on a CPU's cores; returns the histories, in the trainers' order.

    Each trainer ends holding its run's weights, optimizer state, step, data generator and history, exactly
    as ``fit`` one after the other with one PyTorch thread leaves it (each run draws only from its own
    generator). ``callback(trainer)`` sees each of a run's evaluations in order, with the weights, step and
    history of that moment, in eval mode without gradients, one PyTorch thread (forked runs: here, once the
    run has ended, from snapshots taken at each evaluation; a callback only observes). What the batch or
    loss functions change outside the trainer, and what they print, stays in a forked run's process.

    The runs train one after the other instead, as ``fit``, where running them side by side would change
    their results or gain nothing: a model with active dropout (its masks come from PyTorch's one global
    generator), a trainer off the CPU, compiled, or under ``torchrun``, or one worker.

    ``progress`` shows one bar that counts the runs as they end. If runs fail, the first failing
    trainer's error (in the trainers' order) is raised once every run has ended; its trainer holds the
    state it failed in. An interrupt kills the forked runs still training: their trainers stay as they were.

    Defined in chapter 4, Positional encoding.
    """
    trainers = list(trainers)
    _check_runs(trainers, progress)
    workers = min(os.cpu_count() or 1, len(trainers)) if workers is None else workers
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    side_by_side = workers > 1 and all(
        t.device.type == "cpu" and not t.compiled and t.world_size == 1 and not _uses_dropout(t.model) for t in trainers
    )
    bar = progress_bar(total=len(trainers), desc="runs", unit="run", leave=False) if progress else None
    try:
        if not side_by_side:
            return [_fit_one(t, callback, progress, bar) for t in trainers]
        return _fit_side_by_side(trainers, callback, workers, bar)
    finally:
        if bar is not None:
            bar.close()


def _fit_one(trainer: Trainer, callback: Callable[[Trainer], None] | None, progress: bool, bar: Any) -> History:
    try:
        return trainer.fit(callback=callback, progress=False)  # the runs bar counts them
    finally:
        if bar is not None:
            bar.update(1)


def _fit_side_by_side(
    trainers: list[Trainer], callback: Callable[[Trainer], None] | None, workers: int, bar: Any
) -> list[History]:
    global _RUNS
    _RUNS = trainers
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the runs, not the products, share the cores (and threads share this count)
    before = set(multiprocessing.active_children())
    pool = _pool(workers)
    errors: dict[int, BaseException] = {}
    try:
        futures = {pool.submit(_fit_run, i, callback is not None): i for i in range(len(trainers))}
        for future in as_completed(futures):
            i = futures[future]
            data, error = future.result()
            _take_result(trainers[i], data, callback)
            if error is not None:
                errors[i] = error
            if bar is not None:
                bar.update(1)
    except BaseException:
        _stop(pool, before)
        raise
    finally:
        torch.set_num_threads(threads)
        _RUNS = []
    pool.shutdown()
    if errors:
        raise errors[min(errors)]
    return [t.history for t in trainers]


def _check_runs(trainers: list[Trainer], progress: object) -> None:
    if not trainers or not all(isinstance(t, Trainer) for t in trainers):
        kinds = sorted({type(t).__name__ for t in trainers}) or ["nothing"]
        raise TypeError(f"trainers must be a non-empty sequence of Trainer, got {', '.join(kinds)}")
    if len({id(t.model) for t in trainers}) < len(trainers):
        raise ValueError("two of the trainers train the same model (or are the same trainer): runs must be independent")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool, got {type(progress).__name__}")


def _uses_dropout(model: nn.Module) -> bool:
    """Whether training ``model`` draws from PyTorch's global generator: active dropout does."""
    return any(
        (isinstance(m, nn.Dropout) and m.p > 0) or (isinstance(m, MultiHeadAttention) and m.dropout > 0)
        for m in model.modules()
    )


def map_in_processes(fn: Callable[[Item], Result], items: Sequence[Item], workers: int) -> list[Result]:
    """``[fn(item) for item in items]``, by ``workers`` processes side by side, one PyTorch thread each.

    The first items go to forked workers, which send their results back (so they must pickle); the last
    share is computed here, last item last, so that what ``fn`` leaves behind in this process (a seed it
    set) is what the plain loop would leave. The first failing item's error is raised. Only on Linux
    (:func:`can_fork`), with functions that do not use a GPU (a forked process must not touch CUDA).
    """
    global _MAP
    items = list(items)
    workers = max(1, min(workers, len(items)))
    here = len(items) - len(items) // workers  # the first index computed here
    threads = torch.get_num_threads()
    before = set(multiprocessing.active_children())
    pool = _pool(workers - 1) if workers > 1 else None
    try:
        _MAP = (fn, items)
        there = [pool.submit(_map_item, i) for i in range(here)] if pool is not None else []
        torch.set_num_threads(1)
        ours, error = [], None
        try:
            ours = [fn(item) for item in items[here:]]
        except Exception as e:  # raised below unless an earlier item failed first
            error = e
        results = [future.result() for future in there] + ours
        if error is not None:
            raise error
        return results
    except BaseException:
        if pool is not None:
            _stop(pool, before)
        raise
    finally:
        torch.set_num_threads(threads)
        _MAP = None
        if pool is not None:
            pool.shutdown()


def _map_item(index: int) -> Any:
    assert _MAP is not None  # set before the pool forked this worker
    fn, items = _MAP
    return fn(items[index])

"""Independent runs side by side on a CPU's cores: the chapters' seeds and ablations, the book's pictures.

A small model cannot use a CPU's cores (its products are too small to share out); separate runs can, one
per core with one PyTorch thread each. On Linux each run works in a forked copy of this process
(``ProcessPoolExecutor`` with the ``fork`` context: threads would share Python's lock, which a small
model's step takes at every operator); elsewhere in threads. A forked worker dies with this process and
prints nowhere (this process's streams may be a Jupyter kernel's, which a fork must not use).
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
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from .._validate import _validate_int
from ..attention import MultiHeadAttention
from ..training import History, Trainer, progress_bar
from ..utils import eval_mode

Item = TypeVar("Item")
Result = TypeVar("Result")
_JOB: Callable[[int], Any] | None = None  # what forked workers inherit (the pool forks them at its first submit)


def can_fork() -> bool:
    """Whether runs can work in forked processes here: on Linux (macOS's system libraries are not safe
    to use after a fork, which is why Python spawns there; Windows cannot fork)."""
    return sys.platform.startswith("linux")


def _start_worker(parent: int) -> None:
    """A forked worker's set-up: die with ``parent`` (prctl's PR_SET_PDEATHSIG), print nowhere, one thread."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (open until the process ends)
    torch.set_num_threads(1)


def _run_job(index: int) -> Any:
    assert _JOB is not None  # set before the pool forked this worker
    try:
        return _JOB(index)
    except Exception as e:  # from a forked worker, an error that does not pickle comes back as its text
        if multiprocessing.parent_process() is not None and not _pickles(e):
            raise RuntimeError(f"{type(e).__name__}: {e} (in a forked process; the error does not pickle)") from None
        raise


def _pickles(value: object) -> bool:
    try:
        pickle.dumps(value)
        return True
    except Exception:
        return False


def _side_by_side(
    job: Callable[[int], Any], n: int, workers: int, meanwhile: Callable[[], None] | None = None
) -> Iterator[tuple[int, Any]]:
    """``(i, job(i))`` for ``i`` in ``range(n)``, as they end, ``workers`` at a time in forked processes
    (threads where :func:`can_fork` is False), while ``meanwhile()`` runs here. ``job`` need not pickle:
    forked workers inherit it. An error or an interrupt here cancels what has not started and kills (and
    reaps) the forked workers."""
    global _JOB
    _JOB = job
    fork = multiprocessing.get_context("fork")
    before = set(multiprocessing.active_children())
    if can_fork():
        pool: Any = ProcessPoolExecutor(workers, fork, initializer=_start_worker, initargs=(os.getpid(),))
    else:
        pool = ThreadPoolExecutor(workers, thread_name_prefix="runs")
    try:
        futures = {pool.submit(_run_job, i): i for i in range(n)}
        if meanwhile is not None:
            meanwhile()
        for future in as_completed(futures):
            yield futures[future], future.result()
    except BaseException:
        for process in set(multiprocessing.active_children()) - before:  # the workers this call forked
            process.kill()
            process.join()
        # processes: the pool, broken, ends any worker left; threads: those running finish in the background
        pool.shutdown(wait=isinstance(pool, ProcessPoolExecutor), cancel_futures=True)
        raise
    finally:
        _JOB = None
    pool.shutdown()


def map_in_processes(fn: Callable[[Item], Result], items: Sequence[Item], workers: int) -> list[Result]:
    """``[fn(item) for item in items]``, by ``workers`` processes side by side, one PyTorch thread each.

    The first items go to forked workers, which send their results back (so they must pickle); the last
    share is computed here, last item last, so that what ``fn`` leaves behind in this process (a seed it
    set) is what the plain loop would leave. The first failing item's error is raised. Only on Linux
    (:func:`can_fork`), with functions that do not use a GPU (a forked process must not touch CUDA).
    """
    items = list(items)
    workers = max(1, min(workers, len(items)))
    here = len(items) - len(items) // workers  # the first index computed here
    ours: list[Result] = []
    errors: list[Exception] = []

    def compute_here() -> None:  # while the workers compute theirs
        try:
            ours.extend(fn(item) for item in items[here:])
        except Exception as e:  # raised after the workers' results: an earlier item's error comes first
            errors.append(e)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        there = dict(_side_by_side(lambda i: fn(items[i]), here, workers - 1, compute_here)) if here else {}
        if not here:
            compute_here()
        if errors:
            raise errors[0]
        return [there[i] for i in range(here)] + ours
    finally:
        torch.set_num_threads(threads)


@dataclass
class SeedSearch(Generic[Result]):
    """What :func:`search_seeds` tried: the seeds in order, each one's run, and whether the run passed."""

    seeds: list[int]
    runs: list[Result]
    passed: list[bool]
    sample: int  # the first ``sample`` seeds were all tried, whatever they gave: an unbiased sample

    @property
    def seed(self) -> int:
        """The first seed whose run passed."""
        return self.seeds[self.passed.index(True)]

    @property
    def run(self) -> Result:
        """The first run that passed."""
        return self.runs[self.passed.index(True)]

    @property
    def passed_in_sample(self) -> int:
        """How many of the first ``sample`` seeds passed: the rate ``passed_in_sample / sample`` estimates."""
        return sum(self.passed[: self.sample])


def search_seeds(
    train: Callable[[int], Result],
    passes: Callable[[Result], bool],
    seeds: Sequence[int],
    *,
    at_least: int = 1,
    workers: int = 1,
) -> SeedSearch[Result]:
    """Train ``train(seed)`` for ``seeds`` in order and judge each run with ``passes(run)``: every one of the
    first ``at_least`` seeds (``workers`` of them side by side, as :func:`map_in_processes`), then one more
    at a time until a run has passed. Returns every seed tried, its run and verdict; ``.seed`` and ``.run``
    are the first that passed, ``.passed_in_sample`` how many of the first ``at_least`` did (the seeds tried
    after them stop at a pass, so only those ``at_least`` measure how often a seed passes). Raises
    ``RuntimeError`` naming the seeds tried when no seed passes, and ``ValueError`` when ``seeds`` has fewer
    than ``at_least``. With ``workers`` > 1 the runs must pickle and stay off a GPU.

    Defined in chapter 3, Multi-head attention (the seeds that form an induction circuit).
    """
    seeds = list(seeds)
    at_least = _validate_int("at_least", at_least, 1)
    workers = _validate_int("workers", workers, 1)
    if len(seeds) < at_least:
        raise ValueError(f"at_least={at_least} seeds to try, and seeds has only {len(seeds)}: {seeds}")

    def judged(seed: int) -> tuple[Result, bool]:
        run = train(seed)
        return run, bool(passes(run))

    first = seeds[:at_least]
    if workers > 1 and can_fork():
        results = map_in_processes(judged, first, workers)
    else:
        results = [judged(seed) for seed in first]
    for seed in seeds[at_least:]:
        if any(ok for _, ok in results):
            break
        results.append(judged(seed))
    tried = seeds[: len(results)]
    if not any(ok for _, ok in results):
        raise RuntimeError(f"no run passed, of the {len(tried)} seeds tried: {tried}; add seeds")
    return SeedSearch(tried, [run for run, _ in results], [ok for _, ok in results], at_least)


def fit_together(
    trainers: Sequence[Trainer],
    callback: Callable[[Trainer], None] | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> list[History]:
    """``trainer.fit(callback=callback)`` for each of ``trainers``, ``workers`` runs at a time (default: one
    per core), side by side on a CPU's cores; returns the histories, in the trainers' order.

    Each trainer ends holding its run's weights, optimizer state, step, data generator and history, exactly
    as ``fit`` one after the other with one PyTorch thread leaves it. ``callback(trainer)`` sees each of a
    run's evaluations in order (its weights, step and history then; eval mode, no gradients), replayed here
    from snapshots once the run has ended: a callback observes, it does not steer. What the batch or loss
    functions change outside the trainer, or print, stays in a forked run's process. Runs train one after
    the other instead where side by side would change their results or gain nothing: active dropout (its
    masks come from PyTorch's one global generator), a trainer off the CPU, compiled or under ``torchrun``,
    one worker. ``progress`` shows one bar counting the runs as they end. The first failing trainer's error
    (in the trainers' order) is raised once every run has ended; an interrupt kills the runs still training.

    Defined in chapter 4, Positional encoding.
    """
    trainers = list(trainers)
    _validate_runs(trainers, progress)
    workers = min(os.cpu_count() or 1, len(trainers)) if workers is None else _validate_int("workers", workers, 1)
    side_by_side = workers > 1 and all(
        t.device.type == "cpu" and not t.compiled and t.world_size == 1 and not _uses_dropout(t.model) for t in trainers
    )
    bar = progress_bar(total=len(trainers), desc="runs", unit="run", leave=False) if progress else None
    threads = torch.get_num_threads()
    errors: dict[int, BaseException] = {}
    try:
        if side_by_side:
            torch.set_num_threads(1)  # the runs, not the products, share the cores
            ends = _side_by_side(lambda i: _fit_run(trainers[i], callback), len(trainers), workers)
        else:
            ends = ((i, (None, _fit_error(t, callback))) for i, t in enumerate(trainers))
        for i, (data, error) in ends:
            if data is not None:  # a callback's error stops its run at that evaluation, before any later error
                error = _replay(trainers[i], data, callback) or error
            if error is not None:
                errors[i] = error
            if bar is not None:
                bar.update(1)
    finally:
        torch.set_num_threads(threads)
        if bar is not None:
            bar.close()
    if errors:
        raise errors[min(errors)]
    return [t.history for t in trainers]


def _fit_error(trainer: Trainer, callback: Callable[[Trainer], None] | None) -> Exception | None:
    """``trainer.fit(callback=callback)`` without a bar of its own; the error it raised, if any."""
    try:
        trainer.fit(callback=callback, progress=False)
    except Exception as e:
        return e
    return None


def _fit_run(trainer: Trainer, callback: Callable[[Trainer], None] | None) -> tuple[bytes, BaseException | None]:
    """A run side by side: train, then return its final state and its state at each evaluation
    (``torch.save``'d), and its error (a ``RuntimeError`` with the message if it does not pickle)."""
    snapshots: list[dict[str, Any]] = []

    def snapshot(t: Trainer) -> None:
        snapshots.append(copy.deepcopy(t.state_dict()))

    error = _fit_error(trainer, snapshot if callback is not None else None)
    if not _pickles(error):
        error = RuntimeError(f"a run failed with {type(error).__name__}: {error}")
    buffer = io.BytesIO()
    torch.save((trainer.state_dict(), snapshots), buffer)
    return buffer.getvalue(), error


def _replay(trainer: Trainer, data: bytes, callback: Callable[[Trainer], None] | None) -> Exception | None:
    """Take a run's end from its process: ``callback`` on its snapshots in order (weights, step and history
    at each evaluation, in eval mode without gradients), then the run's final state into ``trainer``. A
    callback's error is returned, ``trainer`` holding the run's whole state at that evaluation, as in fit."""
    final, snapshots = torch.load(io.BytesIO(data), weights_only=False)  # from this process's own worker
    state = final
    try:
        with eval_mode(trainer.model), torch.no_grad():
            for state in snapshots if callback is not None else []:
                trainer.model.load_state_dict(state["model"])
                trainer.step, trainer.history = state["step"], History(**state["history"])
                if callback is not None:  # always, here: for the type checker
                    callback(trainer)
        state = final
    except Exception as e:
        return e
    finally:
        trainer.load_state_dict(state, allow_config_change=True)
    return None


def _validate_runs(trainers: list[Trainer], progress: object) -> None:
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

"""Work in forked copies of this process: ``fit_together``'s runs and the book's precomputed pictures, on Linux.

Threads in one process share Python's lock, which a small model's step takes and gives back at every
operator; with two runs at once each step of chapter 5's 6-layer model took 1.4x as long as alone.
A forked process has its own lock: each run trains as fast as it would alone on its core. A run
starts as a copy of this process (its model, its batch and loss functions, their data), trains there
with one PyTorch thread, and sends back what its trainer holds: weights, optimizer, step, data
generator, history. The ``callback`` runs here, in the calling thread: after each evaluation the run
sends its weights, step and history, waits, and takes back the weights as the callback left them. The
callback runs with one PyTorch thread, as the runs do: the other runs hold the other cores.

``map_in_processes`` is the same idea for any list of calls (``explore``'s pictures in the book build):
the first items in forked processes, the last ones here, their results sent back.

Only where ``fork`` is safe and cheap (Linux), and only for trainers ``fit_together`` would run in
threads (CPU, one process, no compile, no dropout).
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

from .checkpoint import apply_trainer_state

if TYPE_CHECKING:
    from .training import History, Trainer

Item = TypeVar("Item")
Result = TypeVar("Result")

# How long an interrupted run may take to finish its step and send its state before it is killed.
STOP_SECONDS = 10.0


def can_fork() -> bool:
    """Whether runs can train in forked processes here: on Linux (macOS's system libraries are not
    safe to use after a fork, which is why Python spawns there; Windows cannot fork)."""
    return sys.platform.startswith("linux")


class _StopRun(Exception):
    """Raised in a run's process when this process asks it to stop (its callback failed)."""


def _dumps(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _loads(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)  # from a process this one forked


def _sendable(error: BaseException | None) -> BaseException | None:
    """``error`` if it survives pickling, else a RuntimeError carrying its type, message and traceback."""
    if error is None:
        return None
    try:
        _loads(_dumps(error))
        return error
    except Exception:
        text = "".join(traceback.format_exception(error)).rstrip()
        return RuntimeError(f"a run failed with an error that cannot be sent between processes:\n{text}")


def _silence() -> None:
    """In a forked process: what Python prints or warns goes nowhere. This process's streams may be a
    Jupyter kernel's, whose machinery (a thread, its locks and sockets) a forked copy must not use."""
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (open until the process ends)


def _train_in_child(trainer: Trainer, conn: Connection, with_callback: bool) -> None:
    """The body of a run's process: train, then send the trainer's state and the error, if any."""
    torch.set_num_threads(1)  # the runs, not the products, share the cores
    trainer.config = replace(trainer.config, progress=False)  # no bar from a copy of the kernel

    def report(t: Trainer) -> None:  # after each evaluation: the caller runs the callback meanwhile
        conn.send_bytes(_dumps(("eval", t.model.state_dict(), t.step, t.history)))
        reply = _loads(conn.recv_bytes())
        if reply is None:
            raise _StopRun
        t.model.load_state_dict(reply)

    error: BaseException | None = None
    try:
        _silence()
        trainer.fit(callback=report if with_callback else None)
    except BaseException as e:  # an interrupt too: the state so far still goes back
        error = e
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second interrupt must not stop the state on its way
        state = (
            trainer.model.state_dict(),
            trainer.optimizer.state_dict(),
            trainer.scaler.state_dict(),
            trainer.step,
            trainer.generator.get_state(),
            trainer.history,
        )
        conn.send_bytes(_dumps(("end", state, None if isinstance(error, _StopRun) else _sendable(error))))
        conn.close()
    finally:  # whatever happened: the caller reads an end, or end of file
        os._exit(0)  # not Python's exit: no atexit handler, no flush of output this process copied at the fork


class _Run:
    """One run's process, as this process sees it."""

    def __init__(self, index: int, trainer: Trainer, with_callback: bool) -> None:
        self.index, self.trainer = index, trainer
        fork = get_context("fork")
        self.conn, child_conn = fork.Pipe()
        self.process: BaseProcess = fork.Process(
            target=_train_in_child, args=(trainer, child_conn, with_callback), name=f"fit_together-{index}", daemon=True
        )
        self.process.start()
        child_conn.close()  # this process keeps its end only, so that the child's exit reads as end of file


def fit_in_processes(
    trainers: Sequence[Trainer],
    workers: int,
    callback: Callable[[Trainer], None] | None,
    ended: Callable[[], None] | None = None,
) -> list[History]:
    """Train each of ``trainers`` in its own forked process, ``workers`` at a time, in the trainers' order.

    Returns the histories. Each trainer ends holding what its run's trainer held at the end, and
    ``ended()``, if given, is called here each time a run has ended (a progress bar counts them). If runs
    fail, the first failing trainer's error (in the trainers' order) is raised once every run has
    ended; a failed run's trainer holds the state at its failure. An interrupt stops the runs in
    progress after their current step (their trainers hold that state) and starts no other.
    """
    waiting = list(enumerate(trainers))
    running: dict[Connection, _Run] = {}
    errors: dict[int, BaseException] = {}
    threads = torch.get_num_threads()
    # The callbacks run here with one PyTorch thread, as in a run's own fit: the other runs hold the other
    # cores. With two threads, one waiting on a busy core, chapter 4's callback took 73-103 ms a call, not 43.
    torch.set_num_threads(1)
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                run = _Run(*waiting.pop(0), with_callback=callback is not None)
                running[run.conn] = run
            for ready in wait(list(running)):
                _answer(running[cast(Connection, ready)], callback, errors, running)
                if ready not in running and ended is not None:  # its end was read
                    ended()
    except BaseException:  # an interrupt, or an error of this process's own: stop the runs, keep their states
        _stop(running, errors)
        raise
    finally:
        torch.set_num_threads(threads)
    if errors:
        raise errors[min(errors)]
    return [t.history for t in trainers]


def _answer(
    run: _Run,
    callback: Callable[[Trainer], None] | None,
    errors: dict[int, BaseException],
    running: dict[Connection, _Run],
    stopping: bool = False,
) -> None:
    """Read one message of ``run``: an evaluation (run the callback, reply) or its end (take its state)."""
    trainer = run.trainer
    try:
        message = _loads(run.conn.recv_bytes())
    except Exception:  # the process died without a word (killed, out of memory), or a read was interrupted
        _end(run, running)
        errors.setdefault(
            run.index, RuntimeError(f"run {run.index} ended without a result (exit code {run.process.exitcode})")
        )
        return
    if message[0] == "eval":
        _, weights, step, history = message
        trainer.model.load_state_dict(weights)
        trainer.step, trainer.history = step, history
        if stopping or callback is None:
            _reply(run, None)
            return
        was_training = trainer.model.training
        try:
            trainer.model.eval()  # as fit runs a callback: eval mode, no gradients
            with torch.no_grad():
                callback(trainer)
        except BaseException as e:
            errors.setdefault(run.index, e)
            _reply(run, None)  # the run stops, as fit stops when its callback raises
            if not isinstance(e, Exception):
                raise  # an interrupt: stop everything
            return
        finally:
            trainer.model.train(was_training)  # the caller's mode, as fit leaves it
        _reply(run, trainer.model.state_dict())
        return
    _, (weights, optimizer, scaler, step, generator, history), error = message
    apply_trainer_state(trainer, weights, optimizer, scaler, step, generator, history)
    if error is not None:
        errors.setdefault(run.index, error)
    _end(run, running)


def _reply(run: _Run, obj: object) -> None:
    """Answer ``run``'s evaluation; a run that has ended meanwhile (interrupted) sends its end next."""
    try:
        run.conn.send_bytes(_dumps(obj))
    except OSError:
        pass


def _end(run: _Run, running: dict[Connection, _Run]) -> None:
    """Forget a run whose end has been read: reap its process (killed if it does not exit in time)."""
    run.process.join(STOP_SECONDS)
    if run.process.exitcode is None:
        run.process.kill()
        run.process.join()
    run.conn.close()
    del running[run.conn]


def _stop(running: dict[Connection, _Run], errors: dict[int, BaseException]) -> None:
    """Interrupt every run in progress and take the state each ends with. A run that has not ended
    within ``STOP_SECONDS`` is killed (which also ends any read of its messages) and keeps no state."""
    runs = list(running.values())
    for run in runs:
        if run.process.pid is not None and run.process.exitcode is None:
            os.kill(run.process.pid, signal.SIGINT)  # the run's fit raises KeyboardInterrupt after its step

    def kill_all() -> None:
        for run in runs:
            run.process.kill()

    watchdog = threading.Timer(STOP_SECONDS, kill_all)
    watchdog.start()
    try:
        while running:
            for ready in wait(list(running)):
                _answer(running[cast(Connection, ready)], None, errors, running, stopping=True)
    finally:
        watchdog.cancel()


def _map_in_child(fn: Callable[[Any], Any], items: Sequence[Any], conn: Connection) -> None:
    """The body of one of ``map_in_processes``'s processes: ``fn`` of each item, then the results or the error."""
    try:
        _silence()
        torch.set_num_threads(1)
        try:
            data = _dumps(("ok", [fn(item) for item in items]))
        except BaseException as e:  # the first failing call's error, as a loop here would raise it
            data = _dumps(("error", _sendable(e)))
        conn.send_bytes(data)
        conn.close()
    finally:
        os._exit(0)  # as a run's process ends: no atexit handler, no flush of output copied at the fork


def map_in_processes(fn: Callable[[Item], Result], items: Sequence[Item], workers: int) -> list[Result]:
    """``[fn(item) for item in items]``, computed by ``workers`` processes side by side, one PyTorch thread each.

    The items are cut into ``workers`` consecutive shares. Each share but the last goes to a forked copy of
    this process, which sends its results back (through ``torch.save``, so they must pickle); the last
    share is computed here, last item last, so that what ``fn`` leaves behind in this process (a seed it
    set, a module it put in eval mode) is what the plain loop would leave. What ``fn`` changes in a
    forked process stays there, and what it prints there is not shown. If calls fail, the error of the
    first failing item is raised, with its type and message (as a RuntimeError with its traceback where
    it cannot be sent between processes); a process that dies without a result raises RuntimeError.
    Only on Linux (``can_fork``), and only with functions that do not use a GPU: a forked process must
    not touch CUDA.
    """
    items = list(items)
    workers = max(1, min(workers, len(items)))
    size, extra = divmod(len(items), workers)
    bounds = [i * size + min(i, extra) for i in range(workers + 1)]  # share i: items[bounds[i]:bounds[i + 1]]
    fork = get_context("fork")
    children: list[tuple[BaseProcess, Connection]] = []
    threads = torch.get_num_threads()
    try:
        for i in range(workers - 1):
            conn, child_conn = fork.Pipe(duplex=False)
            process: BaseProcess = fork.Process(
                target=_map_in_child, args=(fn, items[bounds[i] : bounds[i + 1]], child_conn), daemon=True
            )
            process.start()
            child_conn.close()  # this process keeps its end only, so that the child's exit reads as end of file
            children.append((process, conn))
        torch.set_num_threads(1)  # the processes, not the products, share the cores
        error: BaseException | None = None
        try:
            here = [fn(item) for item in items[bounds[-2] :]]
        except Exception as e:  # raised below unless an earlier share failed first
            error, here = e, []
        results: list[Any] = []
        for i, (child, conn) in enumerate(children):
            try:
                status, value = _loads(conn.recv_bytes())
            except EOFError:
                child.join()
                raise RuntimeError(
                    f"the process computing items {bounds[i]} to {bounds[i + 1] - 1} ended without a result "
                    f"(exit code {child.exitcode})"
                ) from None
            if status == "error":
                raise value
            results += value
        if error is not None:
            raise error
        return results + here
    finally:
        torch.set_num_threads(threads)
        for child, conn in children:  # each has sent its result, or is no longer wanted (an error, an interrupt)
            child.kill()
            child.join()
            conn.close()

"""transformer_lib.notebook.runs: fit_together (independent runs side by side on a CPU's cores),
map_in_processes (a list of calls, side by side in forked processes) and search_seeds. ``explore``'s use is
in test_widgets.py."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import psutil
import pytest
import torch

from transformer_lib import GPT, GPTConfig
from transformer_lib.notebook import runs
from transformer_lib.notebook.runs import can_fork, fit_together, map_in_processes, search_seeds
from transformer_lib.text import random_blocks
from transformer_lib.training import TrainConfig, Trainer, default_loss

DATA = torch.arange(400) % 7  # a periodic "text": easy to learn
needs_fork = pytest.mark.skipif(not can_fork(), reason="forked processes need Linux")


def batches(generator):
    return random_blocks(DATA, 8, 16, generator)


def tiny_gpt(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=7, block_size=16, n_layers=1, n_heads=2, d_model=16, dropout=dropout))


def trainer(model, steps=15, seed=0, loss_fn=default_loss, compile=False):
    cfg = TrainConfig(
        max_steps=steps, lr=3e-3, warmup_steps=5, eval_interval=10, eval_steps=2, log_interval=5, seed=seed
    )
    return Trainer(model, cfg, batches, batches, loss_fn=loss_fn, device="cpu", compile=compile)


def _runs(seeds=(0, 1, 2), dropout=0.0, steps=15, **kw):
    return [trainer(tiny_gpt(seed, dropout), steps=steps, seed=seed, **kw) for seed in seeds]


def _weights(t):
    return torch.cat([p.detach().flatten() for p in t.model.parameters()])


def _one_thread_loss(model, batch):
    """The default loss, refusing to run with more than one PyTorch thread (in a run's thread or process)."""
    if torch.get_num_threads() != 1:
        raise RuntimeError(f"a run trained with {torch.get_num_threads()} PyTorch threads")
    return default_loss(model, batch)


@pytest.fixture(params=["processes", "threads"])
def side_by_side(request, monkeypatch):
    """fit_together's two ways: forked processes (Linux) and threads (elsewhere), on two workers."""
    monkeypatch.setattr(runs.os, "cpu_count", lambda: 2)  # two workers even on a one-core machine
    if request.param == "threads":
        monkeypatch.setattr(runs, "can_fork", lambda: False)
    elif not can_fork():
        pytest.skip("forked runs need Linux")
    return request.param


# ------------------------------------------------------------------ fit_together


def test_fit_together_equals_one_run_after_the_other(side_by_side):
    """Side by side, each run ends exactly where it ends alone with one PyTorch thread: the same weights,
    optimizer state, losses and data generator. The callback sees each of a run's evaluations in order, with
    the weights, step and history of that moment, in eval mode without gradients."""

    def callback(t, log, index):
        log.append((index, t.step, t.history.eval_steps[-1], t.model.training, torch.is_grad_enabled()))
        log.append(_weights(t).clone())

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    alone_calls = []
    try:
        alone = _runs(loss_fn=_one_thread_loss)
        for i, t in enumerate(alone):
            t.fit(callback=lambda t, i=i: callback(t, alone_calls, i), progress=False)
    finally:
        torch.set_num_threads(threads)
    together = _runs(loss_fn=_one_thread_loss)
    calls = []
    histories = fit_together(together, callback=lambda t: callback(t, calls, together.index(t)), progress=False)
    assert torch.get_num_threads() == threads  # the caller's count, untouched or restored
    assert [c for c in alone_calls[::2]] == [(i, s, s, False, False) for i in range(3) for s in (0, 10, 15)]
    for i in range(3):  # each run's evaluations in order, with that moment's weights
        mine = [k for k, c in enumerate(calls[::2]) if c[0] == i]
        assert [calls[2 * k] for k in mine] == alone_calls[6 * i : 6 * i + 6 : 2]
        for k, w in zip(mine, alone_calls[6 * i + 1 : 6 * i + 6 : 2], strict=True):
            assert torch.equal(calls[2 * k + 1], w)
    for a, b, h in zip(alone, together, histories, strict=True):
        assert h is b.history and b.step == 15 and b.model.training  # the caller's mode
        assert torch.equal(_weights(a), _weights(b))
        assert a.history == dataclasses.replace(b.history, train_seconds=a.history.train_seconds)
        torch.testing.assert_close(b.optimizer.state_dict(), a.optimizer.state_dict(), rtol=0, atol=0)
        assert torch.equal(a.generator.get_state(), b.generator.get_state())


def test_fit_together_runs_the_callback_with_one_thread_and_gives_the_callers_count_back(side_by_side):
    """The callback runs while the other runs hold the other cores: with one PyTorch thread, as a run trains
    (a second thread would wait on a busy core: chapter 4's callback took 73-103 ms a call instead of 43)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    seen = []
    try:
        fit_together(_runs(steps=10), callback=lambda t: seen.append(torch.get_num_threads()), progress=False)
        assert torch.get_num_threads() == 2  # the caller's count, given back
    finally:
        torch.set_num_threads(threads)
    assert seen == [1] * 6  # three runs, evaluated at steps 0 and 10


def test_fit_together_takes_processes_or_threads_only_where_that_keeps_results_exact(monkeypatch):
    """Side by side only for several CPU workers, no dropout (it draws from the one global generator) and
    no compiling; in forked processes where the platform forks, else in threads."""
    monkeypatch.setattr(runs.os, "cpu_count", lambda: 2)
    where = []

    def fake_fit(self, steps=None, callback=None, progress=True):
        where.append(threading.current_thread().name)
        self.history.items = os.getpid()  # comes back with the run's state
        return self.history

    monkeypatch.setattr(Trainer, "fit", fake_fit)
    if can_fork():
        forked = _runs()
        fit_together(forked, progress=False)
        assert where == [] and all(t.history.items not in (0, os.getpid()) for t in forked)  # another process
    monkeypatch.setattr(runs, "can_fork", lambda: False)
    fit_together(_runs(), progress=False)
    assert len(where) == 3 and all(name.startswith("runs") for name in where), where
    compiled = _runs(compile=True)
    for can in (True, False):
        monkeypatch.setattr(runs, "can_fork", lambda can=can: can)
        for one_by_one, workers in ((_runs(dropout=0.1), None), (_runs(), 1), (compiled, None)):
            where.clear()
            fit_together(one_by_one, workers=workers, progress=False)
            assert where == ["MainThread"] * 3  # one after the other, in the caller's thread
            assert all(t.history.items == os.getpid() for t in one_by_one)


@pytest.mark.parametrize("value, off", [("1", True), (" True", True), ("0", False), ("off", False), ("", False)])
def test_tqdm_disable_switches_the_jupyter_widget_off_too(monkeypatch, value, off):
    """The book build sets TQDM_DISABLE=1 so that no bar is saved in a page. tqdm's notebook bar ignores the
    variable (it passes disable=False itself), so a Trainer in the build's kernels saved a hidden widget in
    every training cell; the library's bars (fit's and fit_together's) read it themselves."""
    notebook = pytest.importorskip("tqdm.notebook")
    import tqdm.auto

    made, shown = [], []

    class Widget(notebook.tqdm):  # what tqdm.auto gives in a Jupyter kernel, recorded
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append((kwargs["desc"], self.disable))  # as made: close() sets disable

    monkeypatch.setattr(notebook, "display", lambda *objs, **kw: shown.extend(objs))
    monkeypatch.setattr(tqdm.auto, "tqdm", Widget)
    monkeypatch.setenv("TQDM_DISABLE", value)
    trainer(tiny_gpt(), steps=3).fit()
    fit_together(_runs(seeds=(0,), steps=3))  # one run: its own bar is off, the runs bar on
    assert [desc for desc, _ in made] == ["training", "runs"]
    assert all(disable is off for _, disable in made)
    assert (shown == []) is off  # on, each bar's widget was displayed


def test_fit_together_shows_one_bar_that_counts_the_runs_as_they_end(side_by_side, capsys, monkeypatch):
    """One bar over the runs, updated once per run after its end, side by side and one after the other; the
    runs' own bars are not shown. progress=False shows nothing; a value that is not a bool is refused before
    any run starts."""
    runs_ = _runs(steps=6)
    fit_together(runs_)
    err = capsys.readouterr().err
    assert "runs:" in err and "0/3" in err
    assert "training" not in err  # no run's own bar, from a thread or a process
    assert all(t.step == 6 for t in runs_)

    bar = types.SimpleNamespace(ended=[], closed=False)  # the runs that had ended at each update
    bar.update = lambda n: bar.ended.append(sum(t.step == t.config.max_steps for t in runs_))
    bar.close = lambda: setattr(bar, "closed", True)
    monkeypatch.setattr(runs, "progress_bar", lambda total, **kw: bar if total == 3 else None)
    for workers in (None, 1):  # side by side, then one after the other
        for t in runs_:
            t.config = dataclasses.replace(t.config, max_steps=t.config.max_steps + 3)
        bar.ended, bar.closed = [], False
        fit_together(runs_, workers=workers)
        assert bar.closed and len(bar.ended) == 3 and all(n >= i + 1 for i, n in enumerate(bar.ended)), bar.ended
    monkeypatch.undo()
    capsys.readouterr()

    fit_together(_runs(seeds=(0, 1), steps=6), progress=False)
    assert capsys.readouterr().err == ""
    untouched = _runs(seeds=(0, 1))
    with pytest.raises(TypeError, match="progress must be a bool, got str"):
        fit_together(untouched, progress="yes")
    assert all(t.step == 0 for t in untouched)


@pytest.mark.parametrize("workers", [None, 1])
def test_fit_together_raises_the_first_failure_after_every_run_ended(side_by_side, workers):
    """A callback that raises stops its run there, as in fit; the others train to the end; then the first
    error (in the trainers' order) is raised, and the failed run's trainer holds the state it failed in."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one after the other (workers=1) as side by side: one thread a run
    try:
        (alone,) = _runs(seeds=(1,))
        alone.fit(steps=10, progress=False)
        runs_ = _runs(seeds=(0, 1, 2))

        def callback(t):
            if t.step == 10 and t in runs_[1:]:
                raise RuntimeError(f"run {runs_.index(t)} failed")

        with pytest.raises(RuntimeError, match="run 1 failed"):
            fit_together(runs_, callback=callback, workers=workers, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert [t.step for t in runs_] == [15, 10, 10]  # the other trained to the end
    assert runs_[1].history.eval_steps == [0, 10] and runs_[1].model.training
    assert torch.equal(_weights(runs_[1]), _weights(alone))  # the state it failed in, the optimizer's included
    torch.testing.assert_close(runs_[1].optimizer.state_dict(), alone.optimizer.state_dict(), rtol=0, atol=0)
    assert torch.equal(runs_[1].generator.get_state(), alone.generator.get_state())
    assert multiprocessing.active_children() == []


@needs_fork
def test_what_a_forked_run_prints_goes_nowhere(monkeypatch, capfd):
    """A forked run's streams are copies of this process's (in a Jupyter kernel, the kernel's machinery,
    which a forked copy must not use): what its batch function prints goes to the null device."""
    monkeypatch.setattr(runs.os, "cpu_count", lambda: 2)
    runs_ = _runs(seeds=(0, 1))
    for i, run in enumerate(runs_):

        def loud_batches(g, i=i):
            print(f"a batch of run {i}", flush=True)
            print(f"a note of run {i}", file=sys.stderr, flush=True)
            return batches(g)

        run.train_batches = loud_batches
    fit_together(runs_, progress=False)
    assert [t.step for t in runs_] == [15, 15]
    assert capfd.readouterr() == ("", "")


@needs_fork
def test_a_run_that_fails_in_its_process_raises_here_and_keeps_its_state(monkeypatch):
    """A run's own error (here its batches, at the 8th call, in its process) comes back with its type and
    message, and its trainer holds the state the run failed in; an error that cannot be pickled comes
    back as a RuntimeError with its text; a process that dies breaks the pool, and leaves no process."""
    monkeypatch.setattr(runs.os, "cpu_count", lambda: 2)

    class Local(Exception):  # defined in a function: pickle cannot find it
        pass

    def failing(kind):
        calls = []

        def batches_until_failure(g):
            calls.append(1)
            if len(calls) == 8:  # training batches only: steps 0-6 train, the 8th step fails
                if kind == "exit":
                    os._exit(3)
                raise (ValueError if kind == "value" else Local)(f"no batch at call {len(calls)}")
            return batches(g)

        run = trainer(tiny_gpt(9), seed=9)
        run.train_batches = batches_until_failure
        return run

    for kind, error, message in (
        ("value", ValueError, "no batch at call 8"),
        ("local", RuntimeError, "Local: no batch at call 8"),
        ("exit", BrokenProcessPool, None),
    ):
        runs_ = [failing(kind), *_runs(seeds=(0, 1))]
        with pytest.raises(error, match=message):
            fit_together(runs_, progress=False)
        assert multiprocessing.active_children() == []
        if kind != "exit":
            assert [t.step for t in runs_] == [7, 15, 15]
            assert runs_[0].history.steps == [5]  # the one log before the failure came back with the state
        else:
            assert runs_[0].step == 0


@needs_fork
def test_an_interrupt_kills_the_runs_and_leaves_their_trainers_as_they_were(monkeypatch):
    """Ctrl-C while fit_together waits: the forked runs are killed at once, no process is left behind, the
    trainers of the runs that had not ended stay as they were, and the caller's thread count comes back."""
    monkeypatch.setattr(runs.os, "cpu_count", lambda: 2)
    runs_ = _runs(seeds=(0, 1, 2, 3), steps=100_000)
    before = [_weights(t).clone() for t in runs_]
    threads = torch.get_num_threads()
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    start = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            fit_together(runs_, progress=False)
    finally:
        timer.cancel()
    assert time.perf_counter() - start < 10
    assert multiprocessing.active_children() == []
    assert torch.get_num_threads() == threads
    for t, w in zip(runs_, before, strict=True):
        assert t.step == 0 and torch.equal(_weights(t), w)


def test_threads_on_an_interrupt_cancel_the_runs_not_started(monkeypatch):
    """Without fork (threads): Ctrl-C while waiting cancels the runs not yet started, and the thread count is
    restored."""
    monkeypatch.setattr(runs.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(runs, "can_fork", lambda: False)
    started, release = [], threading.Event()

    def held_fit(self, steps=None, callback=None, progress=True):
        started.append(self)
        release.wait(10)
        return self.history

    def interrupted(futures):
        time.sleep(0.2)  # the first runs start
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(Trainer, "fit", held_fit)
    monkeypatch.setattr(runs, "as_completed", interrupted)
    threads = torch.get_num_threads()
    with pytest.raises(KeyboardInterrupt):
        fit_together(_runs(seeds=(0, 1, 2, 3, 4, 5)), progress=False)
    assert torch.get_num_threads() == threads
    release.set()  # the runs in progress finish
    time.sleep(0.5)
    assert 0 < len(started) <= 2  # at most one per worker; the other four were cancelled


def test_fit_together_rejects_what_is_not_independent_runs():
    with pytest.raises(TypeError, match="non-empty sequence of Trainer, got nothing"):
        fit_together([])
    with pytest.raises(TypeError, match="got GPT"):
        fit_together([tiny_gpt()])
    t = _runs(seeds=(0,))[0]
    with pytest.raises(ValueError, match="same model"):
        fit_together([t, t])
    for workers in (0, 1.5, True):
        with pytest.raises(ValueError, match="workers must be"):
            fit_together(_runs(), workers=workers)


KILLED_PARENT = """
import sys, torch
from transformer_lib import GPT, GPTConfig
from transformer_lib.notebook.runs import fit_together
from transformer_lib.text import random_blocks
from transformer_lib.training import TrainConfig, Trainer

data = torch.arange(400) % 7
config = TrainConfig(max_steps=10**6, eval_interval=10**6, log_interval=10**6, warmup_steps=0, amp=False)
trainers = [Trainer(GPT(GPTConfig(vocab_size=7, block_size=16, n_layers=1, n_heads=2, d_model=16, dropout=0.0)),
                    config, lambda g: random_blocks(data, 8, 16, g), device="cpu") for _ in range(2)]
print("training", flush=True)
fit_together(trainers, workers=2, progress=False)
"""


@needs_fork
@pytest.mark.slow  # a fresh Python importing torch: 5-10 s
def test_the_forked_runs_die_with_a_killed_caller():
    """Audit L4: SIGKILL the process that called fit_together, and its forked runs (which trained on, for
    ever, blocked or not, when only a pipe could tell them) end within seconds."""
    caller = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED_PARENT)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert caller.stdout.readline().strip() == "training"
        deadline = time.monotonic() + 60
        workers = []
        while len(workers) < 2 and time.monotonic() < deadline:
            workers = psutil.Process(caller.pid).children(recursive=True)
            time.sleep(0.1)
        assert len(workers) == 2, workers
        time.sleep(0.5)  # the runs are training
        assert all(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
        caller.kill()
        caller.wait(10)
        _, alive = psutil.wait_procs(workers, timeout=5)
        assert alive == [], f"forked runs outlived their killed caller: {alive}"
    finally:
        caller.kill()
        for w in psutil.Process().children(recursive=True):
            if w.pid != caller.pid and w.ppid() in (1, caller.pid):
                w.kill()


# ------------------------------------------------------------------ map_in_processes


def square_with_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


@needs_fork
@pytest.mark.parametrize("n, workers", [(1, 2), (2, 2), (5, 2), (7, 3), (3, 8)])
def test_results_in_order_and_the_last_share_here(n: int, workers: int) -> None:
    out = map_in_processes(square_with_pid, range(n), workers)
    assert [r for r, _ in out] == [x * x for x in range(n)]
    pids = [pid for _, pid in out]
    assert pids[-1] == os.getpid(), "the last share is not computed here"
    assert len(set(pids)) <= min(n, workers)
    assert pids.count(os.getpid()) == n // min(n, workers)  # this process's share
    assert multiprocessing.active_children() == []


def test_what_the_calls_leave_behind_here_is_what_the_plain_loop_leaves() -> None:
    """The last item is computed here, last: a seed it sets and the numbers it then draws leave this
    process's generator where ``[fn(x) for x in items]`` would."""

    def seeded_draw(x: int) -> float:
        torch.manual_seed(x)
        return torch.rand(()).item()

    expected = [seeded_draw(x) for x in range(6)]
    after_loop = torch.rand(3)
    torch.manual_seed(123)  # somewhere else
    assert map_in_processes(seeded_draw, range(6), 2) == expected
    assert torch.equal(torch.rand(3), after_loop)


def test_one_pytorch_thread_per_process_while_running_and_the_count_restored() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert map_in_processes(lambda _: torch.get_num_threads(), range(4), 2) == [1, 1, 1, 1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@needs_fork
def test_errors_come_back_with_their_type_and_the_first_item_wins() -> None:
    class Local(Exception):  # defined in a function: pickle cannot find it
        pass

    def fail_at(bad: dict[int, type[BaseException]]):
        def fn(x: int) -> int:
            if x in bad:
                raise bad[x](f"no result for {x}")
            return x

        return fn

    with pytest.raises(ValueError, match="no result for 1"):  # in a forked process
        map_in_processes(fail_at({1: ValueError}), range(6), 2)
    with pytest.raises(KeyError, match="no result for 5"):  # here, in the last share
        map_in_processes(fail_at({5: KeyError}), range(6), 2)
    with pytest.raises(ValueError, match="no result for 2"):  # both: the earlier item's error, as a loop raises it
        map_in_processes(fail_at({2: ValueError, 4: KeyError}), range(6), 2)
    with pytest.raises(RuntimeError, match="Local: no result for 0"):
        map_in_processes(fail_at({0: Local}), range(6), 2)
    assert multiprocessing.active_children() == []


@needs_fork
def test_a_process_that_dies_breaks_the_map_and_leaves_no_process() -> None:
    def exit_at_one(x: int) -> int:
        if x == 1:
            os._exit(3)
        return x

    with pytest.raises(BrokenProcessPool):
        map_in_processes(exit_at_one, range(6), 2)
    assert multiprocessing.active_children() == []


@needs_fork
def test_this_process_computes_its_share_while_the_others_compute_theirs() -> None:
    """Side by side: an interrupt in this process's share (Ctrl-C) comes while the forked share still
    sleeps, and stops it at once."""
    here = os.getpid()

    def slow_there(x: int) -> int:
        if os.getpid() == here:
            raise KeyboardInterrupt  # Ctrl-C while this process computes its share
        time.sleep(60)  # the forked share: far longer than the test may take
        return x

    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        map_in_processes(slow_there, range(4), 2)
    assert time.perf_counter() - start < 10
    assert multiprocessing.active_children() == []


@needs_fork
def test_what_a_forked_process_prints_goes_nowhere(capfd) -> None:
    """Its streams are copies of this process's, which in a Jupyter kernel are the kernel's (a thread,
    locks and sockets a forked copy must not use): a forked process writes to the null device."""

    def loud(x: int) -> int:
        print(f"item {x}", flush=True)
        print(f"note {x}", file=sys.stderr, flush=True)  # as a warning is shown
        return x

    assert map_in_processes(loud, range(4), 2) == [0, 1, 2, 3]
    out, err = capfd.readouterr()
    assert (out, err) == ("item 2\nitem 3\n", "note 2\nnote 3\n"), (out, err)  # the last share, computed here


# ------------------------------------------------------------------------------------------- search_seeds


@pytest.mark.parametrize("workers", [1, 2])
def test_search_seeds_tries_the_whole_sample_then_stops_at_the_first_pass(workers):
    trained = []

    def train(seed):
        trained.append(seed)
        return seed * 10

    search = search_seeds(train, lambda run: run % 30 == 0, [1, 3, 4, 6, 9, 12], at_least=2, workers=workers)
    assert search.seeds == [1, 3] and search.runs == [10, 30] and search.passed == [False, True]
    assert (search.seed, search.run, search.passed_in_sample) == (3, 30, 1)
    after = search_seeds(train, lambda run: run % 30 == 0, [1, 2, 4, 6, 9, 12], at_least=2, workers=workers)
    assert after.seeds == [1, 2, 4, 6] and after.seed == 6 and after.passed_in_sample == 0  # passes after the sample
    every = search_seeds(train, lambda run: True, [5, 7, 8], at_least=3, workers=workers)
    assert every.seeds == [5, 7, 8] and every.seed == 5 and every.passed_in_sample == 3  # the sample, whole
    if workers == 1:
        assert trained == [1, 3, 1, 2, 4, 6, 5, 7, 8]


def test_search_seeds_says_when_no_seed_passes():
    with pytest.raises(RuntimeError, match=r"of the 3 seeds tried: \[0, 1, 2\]"):
        search_seeds(lambda seed: seed, lambda run: False, (0, 1, 2))
    with pytest.raises(ValueError, match="at_least=4 seeds to try"):
        search_seeds(lambda seed: seed, lambda run: True, (0, 1, 2), at_least=4)

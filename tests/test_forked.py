"""transformer_lib._forked.map_in_processes: a list of calls, side by side in forked processes.

``fit_together``'s forked runs are tested in test_training.py; ``explore``'s use in test_widgets.py.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

import pytest
import torch

from transformer_lib._forked import can_fork, map_in_processes

pytestmark = pytest.mark.skipif(not can_fork(), reason="forked processes need Linux")


def square_with_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


@pytest.mark.parametrize("n, workers", [(1, 2), (2, 2), (5, 2), (7, 3), (3, 8)])
def test_results_in_order_shares_consecutive_and_the_last_share_here(n: int, workers: int) -> None:
    out = map_in_processes(square_with_pid, range(n), workers)
    assert [r for r, _ in out] == [x * x for x in range(n)]
    pids = [pid for _, pid in out]
    shares = [pids[0]] + [b for a, b in zip(pids, pids[1:], strict=False) if a != b]  # the processes, in the order met
    assert len(shares) == len(set(shares)) == min(n, workers), "shares not consecutive, or not one per worker"
    assert pids[-1] == os.getpid(), "the last share is not computed here"
    sizes = [pids.count(p) for p in shares]
    assert max(sizes) - min(sizes) <= 1, f"uneven shares {sizes}"
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
    with pytest.raises(RuntimeError, match="cannot be sent between processes(.|\n)*Local: no result for 0"):
        map_in_processes(fail_at({0: Local}), range(6), 2)
    assert multiprocessing.active_children() == []


def test_a_process_that_dies_is_named_with_its_items_and_exit_code() -> None:
    def exit_at_one(x: int) -> int:
        if x == 1:
            os._exit(3)
        return x

    with pytest.raises(RuntimeError, match=r"items 0 to 2 ended without a result \(exit code 3\)"):
        map_in_processes(exit_at_one, range(6), 2)
    assert multiprocessing.active_children() == []


def test_an_interrupt_here_stops_the_other_processes_at_once() -> None:
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

"""scripts/machine_speed.py, by which tests/test_book.py scales the chapters' time budgets to the machine at hand."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch

from transformer_lib.training import Trainer

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "machine_speed.py"


@pytest.fixture(scope="module")
def machine_speed():
    spec = importlib.util.spec_from_file_location("machine_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_measurement_is_the_training_step_on_one_thread(machine_speed, monkeypatch) -> None:
    """A step made 100 ms slower reads about 100 ms slower; one thread, and the caller's count comes back."""
    threads_seen = []
    step = Trainer.train_step
    baseline = machine_speed.step_ms(warmup=2, rounds=3, steps=5)

    def slower_step(self, *batches):
        threads_seen.append(torch.get_num_threads())
        time.sleep(0.1)
        return step(self, *batches)

    monkeypatch.setattr(Trainer, "train_step", slower_step)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        slowed = machine_speed.step_ms(warmup=2, rounds=3, steps=5)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert 70 < slowed - baseline < 300, (baseline, slowed)  # per step, not per round of 5; room for a busy machine
    assert len(threads_seen) == 2 + 3 * 5 and set(threads_seen) == {1}  # every step timed or warmed, none else


def test_the_last_line_gives_the_step_and_the_slowdown(machine_speed, monkeypatch, capsys) -> None:
    monkeypatch.setattr(machine_speed, "step_ms", lambda: 2 * machine_speed.REFERENCE_STEP_MS)
    machine_speed.main()
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"step_ms={2 * machine_speed.REFERENCE_STEP_MS:.2f} slowdown=2.000"

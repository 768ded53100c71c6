"""The training loop never waits for the device between log intervals.

On a GPU, every read of a tensor's values on the host (``.item()``, ``int(t)``, ``if t.any():``,
``.tolist()``, boolean-mask indexing, ...) makes Python wait until the GPU has finished all the work
queued so far: the queue drains and the GPU idles while Python prepares the next step. On the CPU
there is no queue, so these tests count the calls that *would* wait on a GPU, with the library's
checks taking the path they take there (``_validate._HOST_DEVICES`` emptied: no device's values
are free to read). That path's check runs on the CPU too (``torch._assert_async`` checks a CPU
tensor at once, in C++, unseen by the counter), so its Python is tested here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from transformer_lib import GPT, GPTConfig, _validate
from transformer_lib.distillation import distillation_loss_fn
from transformer_lib.text import random_blocks
from transformer_lib.training import TrainConfig, Trainer

# Tensor methods that copy values to the host; Python's int(t), bool(t), float(t) and t used as an index go
# through the dunders. Boolean-mask indexing (x[mask]) needs the number of True entries: counted in __getitem__.
READS = ("item", "tolist", "numpy", "cpu", "nonzero", "__bool__", "__int__", "__float__", "__index__")
TENSOR_INTERNALS = ("_tensor.py", "_tensor_str.py")  # e.g. __format__ calls item(): blame its caller


def count_host_reads(monkeypatch, on_the_host=()) -> list[str]:
    """Wrap every value-reading Tensor method; return the list each call appends ``"name in function"`` to.

    Left out are the reads of tensors that stay on the CPU when the model is on a GPU, which wait for
    nothing: those of ``torch.optim`` (its step counters) and those made inside the functions whose
    code objects are in ``on_the_host`` (the batch function: a batch moves to the device after it).
    """
    calls: list[str] = []

    def record(name: str) -> None:
        frame = sys._getframe(2)
        while frame.f_code.co_filename.endswith(TENSOR_INTERNALS):
            frame = frame.f_back
        caller, outer = frame, frame
        while outer is not None and outer.f_code not in on_the_host:
            outer = outer.f_back
        if outer is None and f"torch{Path('/')}optim" not in caller.f_code.co_filename:
            calls.append(f"{name} in {caller.f_code.co_name} ({Path(caller.f_code.co_filename).name})")

    def counted(name: str, original):
        def read(self, *args, **kwargs):
            record(name)
            return original(self, *args, **kwargs)

        return read

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    getitem = torch.Tensor.__getitem__

    def counted_getitem(self, index):
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
            record("boolean-mask indexing")
        return getitem(self, index)

    monkeypatch.setattr(torch.Tensor, "__getitem__", counted_getitem)
    monkeypatch.setattr(_validate, "_HOST_DEVICES", (), raising=False)  # the checks as on a GPU
    return calls


DATA = torch.arange(400) % 7


def fit_20_steps(monkeypatch, loss_fn=None) -> list[str]:
    """A 20-step fit of a tiny GPT, with one log (at the end) and evaluations only at steps 0 and 20."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=7, block_size=16, n_layers=1, n_heads=2, d_model=16, dropout=0.1))
    cfg = TrainConfig(max_steps=20, lr=3e-3, warmup_steps=5, eval_interval=1000, eval_steps=2, log_interval=1000)
    batches = lambda g: random_blocks(DATA, 8, 16, g)  # noqa: E731
    trainer = Trainer(model, cfg, batches, batches, device="cpu", **({} if loss_fn is None else {"loss_fn": loss_fn}))
    calls = count_host_reads(monkeypatch, on_the_host=(batches.__code__,))
    trainer.fit(progress=False)
    return calls


# One .item() per evaluation (steps 0 and 20) and one for the log at step 20: nothing in the 20 steps themselves.
EXPECTED = ["item in evaluate (training.py)", "item in _logged_mean (training.py)", "item in evaluate (training.py)"]


def test_a_20_step_fit_reads_the_device_only_to_log_and_evaluate(monkeypatch):
    calls = fit_20_steps(monkeypatch)
    assert calls == EXPECTED, f"{len(calls)} host reads: {sorted(set(calls))}"


def test_a_20_step_distillation_fit_reads_the_device_only_to_log_and_evaluate(monkeypatch):
    torch.manual_seed(1)
    teacher = GPT(GPTConfig(vocab_size=7, block_size=16, n_layers=1, n_heads=2, d_model=16))
    calls = fit_20_steps(monkeypatch, loss_fn=distillation_loss_fn(teacher))
    assert calls == EXPECTED, f"{len(calls)} host reads: {sorted(set(calls))}"


def test_the_counter_sees_every_kind_of_read(monkeypatch):
    calls = count_host_reads(monkeypatch)
    t = torch.tensor([1, 0, 2])
    t[0].item(), t.tolist(), t.numpy(), t.cpu(), t.nonzero(), bool(t[0]), int(t[0]), float(t[0]), [0, 1][t[0]]
    t[t > 0], f"{t[0]:d}"
    assert [c.split(" in ")[0] for c in calls] == [*READS, "boolean-mask indexing", "item"]


def test_on_the_cpu_the_check_still_reads_the_ids_and_names_the_bad_one():
    model = GPT(GPTConfig(vocab_size=5, block_size=8, n_layers=1, n_heads=2, d_model=8))
    with pytest.raises(ValueError, match=r"token id 7, outside the vocabulary \[0, 5\)"):
        model(torch.tensor([[1, 7]]))


def test_as_on_a_gpu_the_token_check_runs_without_a_read_and_still_refuses_a_bad_id(monkeypatch):
    """The GPU path of the token check, run on the CPU: no value read, and a bad id still caught (by the
    device-side assert, which on a CPU tensor raises at once). Fails if that path reads the ids again, or
    checks nothing."""
    model = GPT(GPTConfig(vocab_size=5, block_size=8, n_layers=1, n_heads=2, d_model=8))
    good, bad = torch.tensor([[1, 4]]), torch.tensor([[1, 7]])
    calls = count_host_reads(monkeypatch)
    assert not _validate._reads_are_free(good)
    model(good)
    assert calls == [], calls
    with pytest.raises(RuntimeError, match=r"idx: a token id outside \[0, 5\)"):
        model(bad)
    assert calls == [], calls

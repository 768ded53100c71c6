"""``TrainConfig(cuda_graph=True)``'s bookkeeping on a CPU, through a simulated graph.

A CUDA graph needs a GPU (``tests/test_cuda.py`` replays real ones there). Here :class:`SimulatedGraph`
keeps a graph's contract: capturing runs the step once on the captured inputs, the first replay then
does nothing, and every later replay runs the step again on those same inputs, into the same output
tensor. So the CPU suite checks what the trainer feeds a graph: the warm-up, the batch, learning rate
and step number copied in before each replay, the refusal of another batch shape, and the loss.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from transformer_lib import GPT, GPTConfig
from transformer_lib.cuda_graphs import WARMUP_STEPS, GraphedStep
from transformer_lib.text import random_blocks
from transformer_lib.training import NonFiniteLossError, TrainConfig, Trainer

DATA = torch.arange(3000) % 89


class SimulatedGraph(GraphedStep):
    """A :class:`GraphedStep` whose graph is simulated on the trainer's CPU (see the module's docstring)."""

    def __init__(self, trainer: Trainer) -> None:
        super().__init__(trainer._step, trainer.optimizer, torch.device("cuda"))  # no CUDA call is made
        self.device = trainer.device
        self.recorded = 0

    def _warm_up(self, micro_batches, lr, step):
        return self.step_fn(micro_batches, lr, step)

    def _record(self, step: Callable[[], Tensor]) -> tuple[Callable[[], None], Tensor]:
        self.recorded += 1
        loss = step()  # what the first replay of a real graph computes
        replays = 0

        def replay() -> None:
            nonlocal replays
            replays += 1
            if replays > 1:
                loss.copy_(step())

        return replay, loss


def trainer(graphed: bool, steps: int = 12, grad_accum_steps: int = 1, **kw) -> Trainer:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=89, block_size=16, n_layers=1, n_heads=2, d_model=16, dropout=0.0, bias=False))
    config = TrainConfig(max_steps=steps, lr=3e-3, min_lr=3e-4, warmup_steps=3, eval_interval=10**6,
                         log_interval=1, progress=False, amp=False, grad_accum_steps=grad_accum_steps)  # fmt: skip
    t = Trainer(model, config, lambda g: random_blocks(DATA, 4, 16, g), device="cpu", **kw)
    if graphed:
        t._graphed = SimulatedGraph(t)
    return t


@pytest.mark.parametrize("grad_accum_steps", [1, 2])
def test_replayed_steps_follow_the_schedule_as_steps_run_as_usual(grad_accum_steps):
    """The learning rate changes at every step (warm-up, then cosine decay): a replay that did not copy it
    in would keep the capture's. With gradient accumulation a step is several micro-batches, each copied in."""
    runs = {graphed: trainer(graphed, grad_accum_steps=grad_accum_steps) for graphed in (False, True)}
    for t in runs.values():
        t.fit()
    graphed = runs[True]._graphed
    assert runs[True].replays_graph and graphed.captured and graphed.recorded == 1
    assert isinstance(runs[True].optimizer.param_groups[0]["lr"], Tensor)  # what the optimizer reads in a replay
    assert runs[True].history.lr == runs[False].history.lr and len(set(runs[True].history.lr)) == 12
    # the same steps, but for the learning rate's rounding: an fp32 tensor in a replay, a Python float otherwise
    assert runs[True].history.train_loss == pytest.approx(runs[False].history.train_loss, rel=1e-6)
    for p, q in zip(runs[True].model.parameters(), runs[False].model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)  # a learning rate frozen at the capture: ~1e-4


def test_the_captured_inputs_are_copies_the_callers_batches_stay_as_they_were():
    """The replays copy each batch into the captured inputs: those must not be a batch the caller holds."""
    t = trainer(True)
    g = torch.Generator().manual_seed(0)
    batches = [random_blocks(DATA, 4, 16, g) for _ in range(WARMUP_STEPS + 3)]
    kept = [tuple(x.clone() for x in batch) for batch in batches]
    for batch in batches:
        t.train_step(batch)
    for batch, before in zip(batches, kept, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(batch, before, strict=True))


def test_a_batch_of_another_shape_is_refused_naming_both():
    t = trainer(True)
    t.fit(steps=WARMUP_STEPS + 2)
    captured = re.escape("captured on batches [((4, 16), torch.int64), ((4, 16), torch.int64)]")
    with pytest.raises(ValueError, match=captured + r".*this step's batches are \[\(\(4, 8\), torch.int64\)"):
        t.train_step(random_blocks(DATA, 4, 8, torch.Generator().manual_seed(0)))
    assert t.step == WARMUP_STEPS + 2  # nothing was trained


def test_a_nan_in_a_replayed_step_is_reported_at_its_step():
    factor = torch.ones(())  # read by every replay

    def loss_fn(model, batch):
        x, y = batch
        return model(x, y)[1] * factor

    t = trainer(True, steps=20, loss_fn=loss_fn)
    t.fit(steps=7)
    factor.fill_(float("nan"))
    with pytest.raises(NonFiniteLossError, match=r"the training loss is not finite \(NaN or inf\) at step 7 "):
        t.fit()


class ScaledGradient(torch.autograd.Function):
    """The identity, whose gradient is multiplied by ``factor``: a device tensor, so that a graph reads it."""

    @staticmethod
    def forward(ctx, x: Tensor, factor: Tensor) -> Tensor:
        ctx.save_for_backward(factor)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (factor,) = ctx.saved_tensors
        return grad * factor, None


def test_with_the_fp16_loss_scaler_a_replayed_step_with_an_infinite_gradient_is_skipped_on_the_device():
    """On a GPU without bf16 the Trainer trains in fp16 with a loss scaler, and replays its steps only because
    the fused AdamW takes the scaler's verdict on the gradients as a tensor: a step whose gradient is infinite
    leaves the weights as they were and halves the scale, with no host sync (tests/test_cuda.py checks that)."""
    factor = torch.ones(())

    def loss_fn(model, batch):
        x, y = batch
        return ScaledGradient.apply(model(x, y)[1], factor)

    t = trainer(False, steps=20, loss_fn=loss_fn)
    t.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    assert getattr(t.optimizer, "_step_supports_amp_scaling", False)  # the fused AdamW, as on CUDA
    t._graphed = SimulatedGraph(t)
    t.fit(steps=7)
    before = [p.detach().clone() for p in t.model.parameters()]
    factor.fill_(float("inf"))
    t.train_step(t.train_batches(t.generator))  # step 7, replayed: an infinite gradient, a finite loss
    assert all(torch.equal(p, q) for p, q in zip(t.model.parameters(), before, strict=True))
    assert t.scaler.get_scale() == 2.0**7
    factor.fill_(1.0)
    t.fit()
    assert t.step == 20 and all(torch.isfinite(p).all() for p in t.model.parameters())
    assert t.history.train_loss[-1] < t.history.train_loss[0]

"""A training step replayed as one CUDA graph, for small models whose GPU waits on the host.

A step is hundreds of small kernels, and the host starts each one: PyTorch's dispatcher, autograd and
the launch cost some microseconds per operation, whatever the operation's size. A large model's kernels
run longer than that, and the GPU never waits. A small one's do not: chapter 7's ablation step (4 layers,
``d_model`` 128, batch 32 x 64) took 8.3 ms on an H200 while its kernels ran for 0.8 ms, so the GPU
waited nine tenths of the time. ``torch.compile`` fuses kernels but still starts each one from the host.

A CUDA graph records the kernels of one step once, with their arguments, and then replays all of them
with one call from the host. What is recorded is fixed: the tensors' addresses and shapes, the Python
control flow, every number the host computed. So the step reads its inputs from tensors that stay in
place (the batch is copied into them; the learning rate and the step number are one-element tensors on
the device), and must never wait for the device (no ``.item()``). :class:`~transformer_lib.training.Trainer`
uses this where ``TrainConfig.cuda_graph`` asks for it and the step allows it; ``benchmarks/cuda_graphs.py``
times it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from .utils import batch_to

WARMUP_STEPS = 3  # steps run as usual first: the optimizer creates its state, the libraries their workspaces

StepFn = Callable[[Sequence[Any], "float | Tensor", "int | Tensor"], Tensor]


def _leaves(batch: Any) -> Iterator[Any]:
    """The tensors and other values of a batch (a tensor, or tuples, lists and dicts of them), in order."""
    if isinstance(batch, (tuple, list)):
        for b in batch:
            yield from _leaves(b)
    elif isinstance(batch, dict):
        for k in batch:
            yield k
            yield from _leaves(batch[k])
    else:
        yield batch


def _describe(batches: Sequence[Any]) -> list[Any]:
    """What a captured step is fixed to: each tensor's shape and dtype, and every other value."""
    return [(tuple(x.shape), x.dtype) if isinstance(x, Tensor) else x for x in _leaves(list(batches))]


class GraphedStep:
    """``step_fn(micro_batches, lr, step)`` run as usual for :data:`WARMUP_STEPS` calls, then captured
    as a CUDA graph on the next call's batches and replayed for every call after.

    ``step_fn`` does one optimisation step and returns its loss (a device tensor); it takes the learning
    rate and the step number either as Python numbers (the warm-up calls) or as one-element device tensors
    (the capture), and must not wait for the device. The optimizer's parameter groups are made
    ``capturable`` at the capture (its update then reads the step count and the learning rate on the device).

    Every call's batches must have the shapes, dtypes and other values of the captured ones: the graph
    replays kernels sized for those (``ValueError`` otherwise). The returned loss is a new tensor.

    Shapes: whatever ``step_fn`` takes; fixed after the capture.
    """

    def __init__(self, step_fn: StepFn, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"a CUDA graph needs a CUDA device, got {device}")
        self.step_fn, self.optimizer, self.device = step_fn, optimizer, device
        self.warmed_up = 0
        self.stream: torch.cuda.Stream | None = None  # the warm-up's and the capture's (made at the first step)
        self.replay: Callable[[], None] | None = None  # the captured step, once captured
        self.static_tensors: list[Tensor] = []  # the step's inputs: each call's batch tensors are copied into these
        self.signature: list[Any] = []
        self.lr: Tensor | None = None
        self.step: Tensor | None = None
        self.loss: Tensor | None = None  # the captured step's output, rewritten by each replay

    @property
    def captured(self) -> bool:
        return self.replay is not None

    def __call__(self, micro_batches: Sequence[Any], lr: float, step: int) -> Tensor:
        if self.replay is None:
            if self.warmed_up < WARMUP_STEPS:
                self.warmed_up += 1
                return self._warm_up(micro_batches, lr, step)
            self._capture(micro_batches, lr, step)
        else:
            self._copy_in(micro_batches, lr, step)
        assert self.replay is not None and self.loss is not None
        self.replay()
        return self.loss.clone()

    def _warm_up(self, micro_batches: Sequence[Any], lr: float, step: int) -> Tensor:
        """One step as usual, on the side stream that will capture the graph: as PyTorch's recipe for capturing
        a whole step, and so that the libraries' lazy set-up per stream (cuBLAS's workspace) happens here."""
        main = torch.cuda.current_stream(self.device)
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)
        side = self.stream
        side.wait_stream(main)
        with torch.cuda.stream(side):
            loss = self.step_fn(micro_batches, lr, step)
        main.wait_stream(side)
        loss.record_stream(main)  # the caller uses it on the main stream
        return loss

    def _capture(self, micro_batches: Sequence[Any], lr: float, step: int) -> None:
        static_batches = [batch_to(b, self.device, copy=True) for b in micro_batches]  # not the caller's
        self.static_tensors = [x for x in _leaves(static_batches) if isinstance(x, Tensor)]
        self.signature = _describe(static_batches)
        self.lr = lr_now = torch.tensor(float(lr), device=self.device)
        self.step = step_now = torch.tensor(step, dtype=torch.long, device=self.device)
        for group in self.optimizer.param_groups:
            group["capturable"] = True
        self.optimizer.zero_grad(set_to_none=True)  # the gradients are then allocated in the graph's memory
        try:
            self.replay, self.loss = self._record(lambda: self.step_fn(static_batches, lr_now, step_now))
        except RuntimeError as e:
            raise RuntimeError(
                f"the training step could not be captured as a CUDA graph ({type(e).__name__}: {e}). A step "
                f"replayed from a graph must not wait for the GPU (no .item(), .tolist() or printing of tensors "
                f"in the model or loss_fn) and must launch the same kernels every step; train with "
                f"TrainConfig(cuda_graph=False)"
            ) from e

    def _record(self, step: Callable[[], Tensor]) -> tuple[Callable[[], None], Tensor]:
        """Capture ``step()`` (which runs nothing while it is recorded) as a CUDA graph: its replay, and
        the tensor that holds its output after each replay."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            loss = step()
        return graph.replay, loss

    def _copy_in(self, micro_batches: Sequence[Any], lr: float, step: int) -> None:
        signature = _describe(micro_batches)
        if signature != self.signature:
            raise ValueError(
                f"TrainConfig(cuda_graph=True) replays a step captured on batches {self.signature} (shape and "
                f"dtype of each tensor, then the other values), but this step's batches are {signature}: give "
                f"batches of one shape (e.g. pad them), or train with cuda_graph=False"
            )
        new = [x for x in _leaves(list(micro_batches)) if isinstance(x, Tensor)]
        for x_static, x in zip(self.static_tensors, new, strict=True):
            x_static.copy_(x, non_blocking=True)
        assert self.lr is not None and self.step is not None
        self.lr.fill_(lr)
        self.step.fill_(step)

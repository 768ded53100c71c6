"""Tensor and pipeline parallelism by hand (chapter 8).

Tensor parallelism (Megatron-LM): the feed-forward network ``act(x W1) W2`` with ``W1`` split by
columns and ``W2`` by the matching rows over ``world_size`` processes; each computes
``act(x W1_r) W2_r`` on its own hidden units, and the output is the sum of these partial outputs,
one all-reduce. The bias of ``W2`` is added once, after the sum.

Pipeline parallelism (GPipe): a GPT's blocks cut into consecutive stages, one per process
(:func:`gpt_stages`), and one step (:func:`pipeline_step`) over ``m`` micro-batches, every forward
pass first, then every backward pass. With ``p`` equal stages the idle share of a step, the bubble,
is ``(p - 1) / (m + p - 1)``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch import distributed as dist

from ._validate import _validate_int
from .layers import FeedForward, activate, run_layers
from .models import GPT
from .precision import output_in_fp32


class TensorParallelFeedForward(nn.Module):
    """Process ``rank``'s shard of ``ff`` (a :class:`~transformer_lib.layers.FeedForward`) split over
    ``world_size`` processes: ``forward`` returns the full output on every process (one all-reduce), and
    the backward pass gives each shard exactly its slice of the full network's weight gradients.

    Shapes: x (B, T, d_model) -> (B, T, d_model); the shard holds ``d_ff / world_size`` hidden units.

    Defined in chapter 8, Training at scale.
    """

    def __init__(self, ff: FeedForward, rank: int, world_size: int) -> None:
        super().__init__()
        if not isinstance(ff, FeedForward):
            raise TypeError(f"ff must be a transformer_lib FeedForward, got {type(ff).__name__}")
        world_size = _validate_int("world_size", world_size, 1)
        rank = _validate_int("rank", rank, 0)
        if rank >= world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        d_ff, d_model = ff.linear2.in_features, ff.linear2.out_features
        if d_ff % world_size:
            raise ValueError(f"d_ff={d_ff} must be divisible by world_size={world_size}: each process gets whole units")
        if ff.dropout.p:
            raise ValueError(f"dropout must be 0 to split the network exactly, got {ff.dropout.p}")
        self.activation, self.rank, self.world_size = ff.activation, rank, world_size
        shard = d_ff // world_size
        units = torch.arange(rank * shard, (rank + 1) * shard)  # this process's hidden units
        rows = torch.cat([units, d_ff + units]) if ff.activation == "swiglu" else units  # gate and value halves
        has_bias = ff.linear1.bias is not None
        self.linear1 = nn.Linear(d_model, len(rows), bias=has_bias)  # W1's columns (nn.Linear stores W1^T)
        self.linear2 = nn.Linear(shard, d_model, bias=False)  # W2's matching rows
        with torch.no_grad():
            self.linear1.weight.copy_(ff.linear1.weight[rows])
            if has_bias:
                self.linear1.bias.copy_(ff.linear1.bias[rows])
            self.linear2.weight.copy_(ff.linear2.weight[:, units])
        bias = ff.linear2.bias
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None  # added once, after the sum

    def partial(self, x: Tensor) -> Tensor:
        """This process's share of the output, ``act(x W1_r) W2_r``: the shares of all processes sum to
        the output without its last bias. Shapes: x (B, T, d_model) -> (B, T, d_model)."""
        return self.linear2(activate(self.linear1(x), self.activation))  # hidden (B, T, shard)

    def forward(self, x: Tensor) -> Tensor:
        if self.world_size == 1:
            out = self.partial(x)
        else:
            if not (dist.is_available() and dist.is_initialized()):
                raise RuntimeError(
                    f"a shard of a network split over {self.world_size} processes needs torch.distributed: "
                    f"launch with torchrun and call transformer_lib.distributed.init_distributed()"
                )
            # Megatron's f (identity forward, all-reduce backward: x feeds every shard), then g (the reverse)
            out = _SumOverProcesses.apply(self.partial(_CopyToProcesses.apply(x)))
        return out if self.bias is None else out + self.bias


class _CopyToProcesses(torch.autograd.Function):
    """Megatron's f: the identity forward; backward, the sum of the input's gradients over processes."""

    @staticmethod
    def forward(ctx: object, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> Tensor:
        total = grad.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total


class _SumOverProcesses(torch.autograd.Function):
    """Megatron's g: the sum of the partial outputs forward; backward, the identity (every process holds the
    same gradient of the full output; summing it, as ``torch.distributed.nn.functional.all_reduce`` does,
    would count it ``world_size`` times)."""

    @staticmethod
    def forward(ctx: object, partial: Tensor) -> Tensor:
        total = partial.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> Tensor:
        return grad


# ---------------------------------------------------------------------------------------------- pipeline parallelism


class GPTStage(nn.Module):
    """Stage ``stage`` of ``n_stages`` of a :class:`~transformer_lib.models.GPT`: consecutive blocks, with the
    embeddings on the first stage and the final norm and output head on the last. It holds the model's own
    modules, not copies: ``stage.parameters()`` are the parameters this stage trains.

    Shapes: first stage idx (B, T) -> h (B, T, d_model); middle stages h -> h; last stage h -> logits
    (B, T, vocab_size); a single stage idx -> logits.
    """

    def __init__(self, model: GPT, stage: int, n_stages: int) -> None:
        super().__init__()
        n_layers = len(model.blocks)
        self.first, self.last = stage == 0, stage == n_stages - 1
        lo, hi = stage * n_layers // n_stages, (stage + 1) * n_layers // n_stages  # as even as the blocks allow
        self.layers, self.d_model = range(lo, hi), model.config.d_model
        if self.first:
            self.tok_emb, self.pos, self.dropout = model.tok_emb, model.pos, model.dropout
            self.emb_scale = model.emb_scale
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        if self.last:
            self.norm_f, self.lm_head = model.norm_f, model.lm_head

    def forward(self, x: Tensor) -> Tensor:
        if self.first:  # token ids -> embeddings, as GPT._hidden does
            x = self.tok_emb(x) * self.emb_scale
            if self.pos is not None:
                x = self.pos(x)
            x = self.dropout(x)
        x, _ = run_layers(self.blocks, x)
        if self.last:
            x = output_in_fp32(self.lm_head, self.norm_f(x))
        return x


def gpt_stages(model: GPT, n_stages: int) -> list[GPTStage]:
    """``model`` cut into ``n_stages`` pipeline stages of consecutive blocks (stage ``s`` holds blocks
    ``s * n_layers // n_stages`` to ``(s + 1) * n_layers // n_stages - 1``); run one after the other they are
    ``model.logits``. With ``n_stages > 1`` the model must be untied (``tie_weights=False``).

    Shapes: see :class:`GPTStage`.

    Defined in chapter 8, Training at scale.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a transformer_lib GPT, got {type(model).__name__}")
    n_stages = _validate_int("n_stages", n_stages, 1)
    if n_stages > len(model.blocks):
        raise ValueError(f"n_stages must be at most n_layers={len(model.blocks)}, got {n_stages}")
    if n_stages > 1 and model.lm_head.weight is model.tok_emb.weight:
        raise ValueError(
            "the output head is tied to the token embedding, which would live on the first and the last stage: "
            "build the GPT with tie_weights=False to split it"
        )
    if model.config.positional not in ("learned", "sinusoidal"):
        raise ValueError(f"gpt_stages supports learned or sinusoidal positions, got {model.config.positional!r}")
    return [GPTStage(model, s, n_stages) for s in range(n_stages)]


Event = tuple[str, int, float, float]  # (kind, micro_batch, start, end)


@dataclass
class PipelineStep:
    """What one GPipe step did on this process.

    ``loss``: the batch's mean loss, on every process. ``events``: this stage's work, ``(kind, micro_batch,
    start, end)`` with kind ``"F"`` or ``"B"``, in seconds from the step's start barrier, waiting excluded.
    ``seconds``: from that barrier to the one after the last stage. ``idle``: the share of ``seconds`` this
    stage did no work, its bubble.
    """

    loss: float
    seconds: float
    events: list[Event] = field(default_factory=list)

    @property
    def idle(self) -> float:
        return 1 - sum(end - start for _, _, start, end in self.events) / self.seconds


def pipeline_step(stage: GPTStage, x: Tensor, y: Tensor, n_micro: int) -> PipelineStep:
    """One GPipe forward and backward pass of the batch ``(x, y)`` through a pipeline of ``GPTStage``s, one per
    process of the ``torch.distributed`` group, in rank order (rank ``r`` runs stage ``r``).

    The batch is cut into ``n_micro`` micro-batches: every forward pass first, then every backward pass (of
    ``loss_i / n_micro``), so the gradients are those of the whole batch's mean loss. No optimizer step.
    Every process passes the whole batch; the first stage reads ``x``, the last ``y``. fp32 only.

    Shapes: x, y (B, T) token ids and targets, B divisible by ``n_micro``.

    Defined in chapter 8, Training at scale.
    """
    rank, world = _validate_pipeline(stage, x, y, n_micro)
    device = next(stage.parameters()).device
    xs, ys = x.to(device).chunk(n_micro), y.to(device).chunk(n_micro)
    dist.barrier()
    pipe = _Pipe(stage, rank, device, shape=(x.shape[0] // n_micro, x.shape[1], stage.d_model))
    for i in range(n_micro):  # every forward pass first
        pipe.forward(i, xs[i], ys[i])
    for i in range(n_micro):  # then every backward pass
        pipe.backward(i, n_micro)
    for work, _ in pipe.sends:
        if work is not None:
            work.wait()
    loss = torch.tensor([sum(loss_i.item() for loss_i in pipe.losses) / n_micro if stage.last else 0.0])
    dist.barrier()
    seconds = time.perf_counter() - pipe.t0
    dist.broadcast(loss, src=world - 1)  # every process learns the batch's loss
    return PipelineStep(loss=loss.item(), seconds=seconds, events=pipe.events)


def _validate_pipeline(stage: GPTStage, x: Tensor, y: Tensor, n_micro: int) -> tuple[int, int]:
    """This process's rank and the group's size, once the stage and the batch fit them."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("pipeline_step needs torch.distributed: launch with torchrun and call init_distributed()")
    rank, world = dist.get_rank(), dist.get_world_size()
    if not isinstance(stage, GPTStage) or stage.first != (rank == 0) or stage.last != (rank == world - 1):
        raise ValueError(f"rank {rank} of {world} must run stage {rank} of a gpt_stages(model, {world}) split")
    _validate_int("n_micro", n_micro, 1)
    if x.dim() != 2 or x.shape != y.shape or x.shape[0] % n_micro:
        raise ValueError(
            f"x and y must be (B, T) with B divisible by n_micro={n_micro}, got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    return rank, world


class _Pipe:
    """One stage's side of a GPipe step: the activations it keeps for the backward pass, the messages it
    sends, and its work timed from the step's start. Shapes: ``shape`` (B / n_micro, T, d_model) travels."""

    def __init__(self, stage: GPTStage, rank: int, device: torch.device, shape: tuple[int, int, int]) -> None:
        self.stage, self.rank, self.device, self.shape = stage, rank, device, shape
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []
        self.losses: list[Tensor] = []
        self.sends: list[tuple[dist.Work | None, Tensor]] = []  # each message, and the tensor it reads, kept alive
        self.events: list[Event] = []
        self.t0 = time.perf_counter()

    @contextmanager
    def timed(self, kind: str, i: int) -> Iterator[None]:
        start = time.perf_counter() - self.t0
        yield
        self.events.append((kind, i, start, time.perf_counter() - self.t0))

    def receive(self, src: int) -> Tensor:
        t = torch.empty(self.shape, device=self.device)
        dist.recv(t, src=src)
        return t

    def send(self, t: Tensor, dst: int) -> None:
        self.sends.append((dist.isend(t, dst=dst), t))

    def forward(self, i: int, x: Tensor, y: Tensor) -> None:
        h_in = x if self.stage.first else self.receive(self.rank - 1).requires_grad_()
        with self.timed("F", i):
            out = self.stage(h_in)
            if self.stage.last:
                self.losses.append(F.cross_entropy(out.flatten(0, 1), y.flatten()))
        if not self.stage.last:
            self.send(out.detach(), self.rank + 1)
        self.inputs.append(h_in)
        self.outputs.append(out)

    def backward(self, i: int, n_micro: int) -> None:
        if self.stage.last:
            with self.timed("B", i):
                (self.losses[i] / n_micro).backward()
        else:
            grad = self.receive(self.rank + 1)
            with self.timed("B", i):
                self.outputs[i].backward(grad)
        if not self.stage.first:
            grad_in = self.inputs[i].grad
            assert grad_in is not None  # h_in requires grad and the stage's output depends on it
            self.send(grad_in, self.rank - 1)

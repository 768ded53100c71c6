"""Tensor parallelism and pipeline parallelism by hand (chapter 8).

Tensor parallelism: a feed-forward network split across processes, Megatron-style.

The feed-forward network is ``act(x W1) W2``. Split ``W1`` by columns (each of ``world_size``
processes holds ``d_ff / world_size`` of the hidden units) and ``W2`` by the matching rows: each
process computes ``act(x W1_r) W2_r`` on its own hidden units, which needs nothing from the others
because the activation acts unit by unit, and the full output is the *sum* of these partial
outputs, one all-reduce (Shoeybi et al.'s Megatron-LM). The bias of ``W2`` is added once, after
the sum. Attention splits the same way along its heads: ``W_q``, ``W_k``, ``W_v`` by columns (whole
heads per process), the output projection by rows, one all-reduce.

Pipeline parallelism: a GPT's blocks split into consecutive stages, one per process
(:func:`gpt_stages`), and one GPipe step (:func:`pipeline_step`): the batch cut into ``m``
micro-batches, every forward pass first (each stage sends its activations to the next), then every
backward pass (each stage sends the gradient of its input back), the gradients adding up over the
micro-batches (Huang et al.'s GPipe). A stage waits while the others work: with ``p`` stages and
equal work per stage, the idle share of a step, the bubble, is ``(p - 1) / (m + p - 1)``.
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
    ``world_size`` processes: ``forward`` returns the full output on every process, after one
    all-reduce of the partial outputs; in the backward pass one all-reduce gives every process the
    full gradient of the input, and each shard's weights get exactly their slice of the full
    network's weight gradients.

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
                    f"launch with torchrun and call transformer_lib.training.init_distributed()"
                )
            # Megatron's f (identity forward, all-reduce backward: x feeds every shard), then g (the reverse)
            out = _SumOverProcesses.apply(self.partial(_CopyToProcesses.apply(x)))
        return out if self.bias is None else out + self.bias


class _CopyToProcesses(torch.autograd.Function):
    """Forward: the identity (every process holds the same input). Backward: all-reduce (sum), since
    the input's gradient is the sum of the gradients through every process's hidden units."""

    @staticmethod
    def forward(ctx: object, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> Tensor:
        total = grad.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total


class _SumOverProcesses(torch.autograd.Function):
    """Forward: all-reduce (sum) the partial outputs. Backward: the identity, since every process holds
    the same full output and the same gradient of it (Megatron's "g"; an all-reducing backward, as
    ``torch.distributed.nn.functional.all_reduce`` has, would count that gradient ``world_size`` times)."""

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
    modules (not copies), so gradients land in the model's parameters, and ``stage.parameters()`` are exactly
    the parameters this stage trains (give them to its process's optimizer).

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
            self.tok_emb, self.pos, self.dropout, self.emb_scale = (
                model.tok_emb,
                model.pos,
                model.dropout,
                model.emb_scale,
            )
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
    ``s * n_layers // n_stages`` to ``(s + 1) * n_layers // n_stages - 1``). Running them one after the other
    is ``model.logits``. A tied output head would live on the first stage and the last at once, so the model
    must be untied (``tie_weights=False``) when ``n_stages > 1``.

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


@dataclass
class PipelineStep:
    """What one GPipe step did on this process.

    ``loss``: the batch's mean loss (every process receives it from the last stage). ``events``: this stage's
    work, ``(kind, micro_batch, start, end)`` with kind ``"F"`` (forward) or ``"B"`` (backward) and times in
    seconds from the step's start (after a barrier), waiting for messages not included. ``seconds``: from
    that barrier to the barrier after the last stage finished. ``idle``: the share of ``seconds`` this stage
    did no work, its bubble (communication counts as idle).
    """

    loss: float
    seconds: float
    events: list[tuple[str, int, float, float]] = field(default_factory=list)

    @property
    def idle(self) -> float:
        return 1 - sum(end - start for _, _, start, end in self.events) / self.seconds


def pipeline_step(stage: GPTStage, x: Tensor, y: Tensor, n_micro: int) -> PipelineStep:
    """One GPipe forward and backward pass of the batch ``(x, y)`` through a pipeline of ``GPTStage``s, one per
    process of the ``torch.distributed`` group, in rank order (rank ``r`` runs stage ``r``).

    The batch is cut into ``n_micro`` equal micro-batches. Forward: stage ``r`` receives each micro-batch's
    activations from rank ``r - 1`` (the first stage embeds ``x`` instead), runs its blocks and sends the
    result to rank ``r + 1``; the last stage computes each micro-batch's mean loss. Backward, micro-batch by
    micro-batch in the same order: the last stage backpropagates ``loss_i / n_micro``, every stage sends the
    gradient of its input to the previous one, and the parameters' gradients add up, to those of the whole
    batch's mean loss (as gradient accumulation). No optimizer step: call it after this, on every stage.
    Every process passes the whole batch; the first stage reads ``x``, the last ``y``. fp32 only.

    Shapes: x, y (B, T) token ids and targets, B divisible by ``n_micro``.

    Defined in chapter 8, Training at scale.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("pipeline_step needs torch.distributed: launch with torchrun and call init_distributed()")
    rank, world = dist.get_rank(), dist.get_world_size()
    if not isinstance(stage, GPTStage) or stage.first != (rank == 0) or stage.last != (rank == world - 1):
        raise ValueError(f"rank {rank} of {world} must run stage {rank} of a gpt_stages(model, {world}) split")
    n_micro = _validate_int("n_micro", n_micro, 1)
    if x.dim() != 2 or x.shape != y.shape or x.shape[0] % n_micro:
        raise ValueError(
            f"x and y must be (B, T) with B divisible by n_micro={n_micro}, got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    device = next(stage.parameters()).device
    xs, ys = x.to(device).chunk(n_micro), y.to(device).chunk(n_micro)
    shape = (x.shape[0] // n_micro, x.shape[1], stage.d_model)  # (B / n_micro, T, d_model): what travels
    events: list[tuple[str, int, float, float]] = []
    inputs: list[Tensor] = []
    outputs: list[Tensor] = []
    losses: list[Tensor] = []
    sends: list[tuple[dist.Work | None, Tensor]] = []  # each message, and the tensor it reads, kept alive
    dist.barrier()
    t0 = time.perf_counter()

    @contextmanager
    def timed(kind: str, i: int) -> Iterator[None]:
        start = time.perf_counter() - t0
        yield
        events.append((kind, i, start, time.perf_counter() - t0))

    for i in range(n_micro):  # every forward pass first
        if stage.first:
            h_in = xs[i]
        else:
            h_in = torch.empty(shape, device=device)
            dist.recv(h_in, src=rank - 1)
            h_in.requires_grad_()
        with timed("F", i):
            out = stage(h_in)
        if stage.last:
            with timed("F", i):
                losses.append(F.cross_entropy(out.flatten(0, 1), ys[i].flatten()))
        else:
            sent = out.detach()
            sends.append((dist.isend(sent, dst=rank + 1), sent))
        inputs.append(h_in)
        outputs.append(out)
    for i in range(n_micro):  # then every backward pass
        if stage.last:
            with timed("B", i):
                (losses[i] / n_micro).backward()
        else:
            grad = torch.empty(shape, device=device)
            dist.recv(grad, src=rank + 1)
            with timed("B", i):
                outputs[i].backward(grad)
        if not stage.first:
            grad_in = inputs[i].grad
            assert grad_in is not None  # h_in requires grad and the stage's output depends on it
            sends.append((dist.isend(grad_in, dst=rank - 1), grad_in))
    for work, _ in sends:
        if work is not None:
            work.wait()
    loss = torch.tensor([sum(loss_i.item() for loss_i in losses) / n_micro if stage.last else 0.0])
    dist.barrier()
    seconds = time.perf_counter() - t0
    dist.broadcast(loss, src=world - 1)  # every process learns the batch's loss
    return PipelineStep(loss=loss.item(), seconds=seconds, events=_merged(events))


def _merged(events: list[tuple[str, int, float, float]]) -> list[tuple[str, int, float, float]]:
    """The last stage times a micro-batch's blocks and its loss separately: one forward event each."""
    out: list[tuple[str, int, float, float]] = []
    for e in events:
        if out and out[-1][:2] == e[:2]:
            out[-1] = (e[0], e[1], out[-1][2], e[3])
        else:
            out.append(e)
    return out

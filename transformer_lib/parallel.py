"""Tensor parallelism by hand: a feed-forward network split across processes, Megatron-style.

The feed-forward network is ``act(x W1) W2``. Split ``W1`` by columns (each of ``world_size``
processes holds ``d_ff / world_size`` of the hidden units) and ``W2`` by the matching rows: each
process computes ``act(x W1_r) W2_r`` on its own hidden units, which needs nothing from the others
because the activation acts unit by unit, and the full output is the *sum* of these partial
outputs, one all-reduce (Shoeybi et al.'s Megatron-LM). The bias of ``W2`` is added once, after
the sum. Attention splits the same way along its heads: ``W_q``, ``W_k``, ``W_v`` by columns (whole
heads per process), the output projection by rows, one all-reduce.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch import distributed as dist

from ._validate import _validate_int
from .layers import FeedForward, activate


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

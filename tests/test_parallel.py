"""Tensor parallelism by hand: the shards of a feed-forward network add up to the network, in one process
and across two real processes (torchrun, gloo), gradients included."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from transformer_lib.layers import FeedForward
from transformer_lib.parallel import TensorParallelFeedForward

ROOT = Path(__file__).resolve().parent.parent


def network(activation: str) -> FeedForward:
    torch.manual_seed(0)
    return FeedForward(16, 32, activation=activation, bias=True)


X = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_the_shards_partial_outputs_sum_to_the_network(activation, world_size):
    ff = network(activation)
    shards = [TensorParallelFeedForward(ff, r, world_size) for r in range(world_size)]
    total = sum(s.partial(X) for s in shards) + shards[0].bias
    torch.testing.assert_close(total, ff(X), rtol=1e-5, atol=1e-6)
    assert sum(s.linear2.weight.numel() for s in shards) == ff.linear2.weight.numel()  # each unit held once
    if world_size == 1:
        torch.testing.assert_close(shards[0](X), ff(X), rtol=1e-5, atol=1e-6)


def test_bad_splits_are_refused():
    ff = network("relu")
    with pytest.raises(ValueError, match="d_ff=32 must be divisible by world_size=3"):
        TensorParallelFeedForward(ff, 0, 3)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\), got 2"):
        TensorParallelFeedForward(ff, 2, 2)
    with pytest.raises(TypeError, match="ff must be a transformer_lib FeedForward, got Linear"):
        TensorParallelFeedForward(torch.nn.Linear(2, 2), 0, 1)
    with pytest.raises(ValueError, match="dropout must be 0"):
        TensorParallelFeedForward(FeedForward(16, 32, dropout=0.1), 0, 2)
    with pytest.raises(RuntimeError, match="needs torch.distributed: launch with torchrun"):
        TensorParallelFeedForward(ff, 0, 2)(X)


WORKER = textwrap.dedent(
    """
    import sys, torch
    from torch import distributed as dist
    sys.path.insert(0, {tests!r})
    from test_parallel import X, network
    from transformer_lib.parallel import TensorParallelFeedForward
    from transformer_lib.distributed import init_distributed

    init_distributed("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    ff = network("gelu")
    shard = TensorParallelFeedForward(ff, rank, world)
    x = X.clone().requires_grad_()
    out = shard(x)
    out.pow(2).sum().backward()
    reference_x = X.clone().requires_grad_()
    ff(reference_x).pow(2).sum().backward()
    torch.testing.assert_close(out, ff(X), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad, reference_x.grad, rtol=1e-5, atol=1e-6)  # all-reduced in the backward
    units = slice(rank * 16, (rank + 1) * 16)
    torch.testing.assert_close(shard.linear1.weight.grad, ff.linear1.weight.grad[units], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shard.linear2.weight.grad, ff.linear2.weight.grad[:, units], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shard.bias.grad, ff.linear2.bias.grad, rtol=1e-5, atol=1e-6)
    print(f"rank {{rank}}: equal")
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_two_processes_compute_the_network_and_its_gradients(tmp_path):
    """Output, input gradient and every weight gradient equal the unsplit network's (its slice, for the shards)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(ROOT / "tests")))
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rank 0: equal" in done.stdout and "rank 1: equal" in done.stdout


# ---------------------------------------------------------------- pipeline stages: consecutive blocks of a GPT


def untied_gpt(n_layers: int = 4):
    from transformer_lib import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, block_size=8, n_layers=n_layers, n_heads=2, d_model=16, tie_weights=False))


@pytest.mark.parametrize(
    ("n_layers", "n_stages", "blocks"), [(4, 1, [4]), (4, 2, [2, 2]), (3, 2, [1, 2]), (4, 4, [1] * 4)]
)
def test_the_stages_run_one_after_the_other_are_the_model(n_layers, n_stages, blocks):
    from transformer_lib.parallel import gpt_stages

    model = untied_gpt(n_layers)
    stages = gpt_stages(model, n_stages)
    assert [len(s.blocks) for s in stages] == blocks
    assert [i for s in stages for i in s.layers] == list(range(n_layers))  # each block once, in order
    owned = [id(p) for s in stages for p in s.parameters()]
    assert sorted(owned) == sorted(id(p) for p in model.parameters())  # every parameter on exactly one stage
    x = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(2))
    h = x
    for s in stages:
        h = s(h)
    torch.testing.assert_close(h, model.logits(x))
    h.sum().backward()  # the gradients land in the model's own parameters
    assert all(p.grad is not None for p in model.parameters())


def test_gpt_stages_refuses_a_tied_head_and_bad_input():
    from transformer_lib import GPT, GPTConfig
    from transformer_lib.parallel import gpt_stages, pipeline_step

    tied = GPT(GPTConfig(vocab_size=11, block_size=8, n_layers=2, n_heads=2, d_model=16))
    with pytest.raises(ValueError, match="tie_weights=False"):
        gpt_stages(tied, 2)
    assert len(gpt_stages(tied, 1)) == 1  # one stage holds both ends
    with pytest.raises(ValueError, match="at most n_layers=4"):
        gpt_stages(untied_gpt(), 5)
    with pytest.raises(TypeError, match="GPT"):
        gpt_stages(FeedForward(4, 8), 2)
    x = torch.zeros(4, 8, dtype=torch.long)
    with pytest.raises(RuntimeError, match="torchrun"):
        pipeline_step(gpt_stages(untied_gpt(), 2)[0], x, x, 2)

"""Gradient accumulation and data parallelism in the Trainer: the same step as one process on one large batch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from transformer_lib import GPT, GPTConfig
from transformer_lib.training import TrainConfig, Trainer

ROOT = Path(__file__).resolve().parent.parent
CONFIG = GPTConfig(vocab_size=11, block_size=8, n_layers=2, n_heads=2, d_model=16, dropout=0.0)
BATCH, T = 12, 8


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 11, (BATCH, T), generator=g)
    return x, torch.roll(x, -1, dims=1)


def trainer(batches, **config) -> Trainer:
    torch.manual_seed(0)
    base = dict(max_steps=3, warmup_steps=0, eval_interval=100, eval_steps=1, amp=False)
    return Trainer(GPT(CONFIG), TrainConfig(**{**base, **config}), batches, device="cpu")


def micro_batches(k: int):
    """A batch function that hands out the data in k slices, one per call, in order, again and again."""
    x, y = data()
    size, calls = BATCH // k, [0]

    def next_batch(generator: torch.Generator):
        i = calls[0] % k
        calls[0] += 1
        return x[i * size : (i + 1) * size], y[i * size : (i + 1) * size]

    return next_batch


@pytest.mark.parametrize("k", [2, 4])
def test_k_micro_batches_give_the_gradient_of_one_batch_k_times_larger(k):
    """The gradients themselves (no clipping): without each loss divided by k they would be k times larger."""
    whole = trainer(lambda g: data(), grad_clip=None)
    accumulated = trainer(micro_batches(k), grad_clip=None, grad_accum_steps=k)
    whole.fit(1, progress=False)
    accumulated.fit(1, progress=False)
    for (name, a), b in zip(whole.model.named_parameters(), accumulated.model.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=name)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7, msg=name)
    assert accumulated.history.train_loss[0] == pytest.approx(whole.history.train_loss[0], rel=1e-5)


def test_accumulation_with_clipping_and_several_steps_follows_the_large_batch():
    whole, accumulated = trainer(lambda g: data()), trainer(micro_batches(3), grad_accum_steps=3)
    whole.fit(progress=False)
    accumulated.fit(progress=False)
    for a, b in zip(whole.model.parameters(), accumulated.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_accumulation_counts_every_micro_batch_and_is_validated():
    t = trainer(micro_batches(4), grad_accum_steps=4)
    t.count = lambda batch: batch[0].numel()
    t.fit(2, progress=False)
    assert t.history.items == 2 * BATCH * T
    with pytest.raises(ValueError, match="grad_accum_steps must be a positive int, got 0"):
        TrainConfig(grad_accum_steps=0)
    with pytest.raises(TypeError):
        trainer(micro_batches(2)).train_step()


# ---------------------------------------------------------------- two processes, the real engine (torchrun, gloo)

WORKER = textwrap.dedent(
    """
    import sys, torch
    from torch import distributed as dist
    sys.path.insert(0, {tests!r})
    from test_distributed import CONFIG, data, trainer
    from transformer_lib.distributed import init_distributed

    device = init_distributed("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = data()
    half = x.shape[0] // world
    mine = (x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half])  # each process: its own half
    t = trainer(lambda g: mine, max_steps=2)
    assert t.world_size == world and t.ddp is not None
    assert not t.optimizer.defaults["fused"]  # the CPU's fused AdamW sometimes hung a process at exit under DDP
    drawn = t.generator.initial_seed()
    t.fit(progress=False)
    path = t.save({out!r} + "/ckpt.pt")
    result = {{"weights": t.model.state_dict(), "seed": drawn, "val": t.history.val_loss}}
    torch.save(result, {out!r} + f"/rank{{rank}}.pt")
    resumed = trainer(lambda g: mine, max_steps=2)
    resumed.load(path)
    assert torch.equal(resumed.generator.get_state(), t.generator.get_state()), "a resume draws this rank's stream"
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_two_processes_under_torchrun_equal_one_process_on_the_combined_batch(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(ROOT / "tests"), out=str(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert ranks[0]["seed"] != ranks[1]["seed"]  # each process draws from its own seeded generator
    single = trainer(lambda g: data(), max_steps=2)
    single.fit(progress=False)
    for name, w in single.model.state_dict().items():
        torch.testing.assert_close(ranks[0]["weights"][name], w, rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(ranks[1]["weights"][name], w, rtol=1e-5, atol=1e-6, msg=name)
    assert ranks[0]["val"] == ranks[1]["val"]  # the evaluated loss is averaged over the processes
    assert [p.name for p in tmp_path.glob("ckpt*")] == ["ckpt.pt"]  # rank 0 wrote it, once


@pytest.mark.slow
def test_train_gpt_runs_under_torchrun_and_prints_its_last_line_once(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(ROOT / "benchmarks" / "train_gpt.py"), "--iters", "10", "--eval-iters", "2", "--eval-interval", "5"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith("tokens_per_s=") and " val_loss=" in lines[-1]
    assert sum(line.startswith("tokens_per_s=") for line in lines) == 1 and "processes=2" in lines[0]


# ---------------------------------------------------------------- pipeline parallelism: two stages, two processes

PIPELINE_WORKER = textwrap.dedent(
    """
    import sys, torch
    from torch import distributed as dist
    from transformer_lib import GPT, GPTConfig
    from transformer_lib.parallel import gpt_stages, pipeline_step
    from transformer_lib.distributed import init_distributed

    init_distributed("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = GPTConfig(vocab_size=11, block_size=8, n_layers=4, n_heads=2, d_model=16, dropout=0.0,
                       tie_weights=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 11, (12, 8), generator=g)
    y = torch.randint(0, 11, (12, 8), generator=g)
    results = {{}}
    for n_micro in (1, 3, 4):
        torch.manual_seed(0)
        model = GPT(config)
        stage = gpt_stages(model, world)[rank]
        step = pipeline_step(stage, x, y, n_micro)
        grads = {{name: p.grad for name, p in model.named_parameters()}}  # None where another stage trains it
        owned = {{name for name, p in model.named_parameters() if any(p is q for q in stage.parameters())}}
        assert owned == {{name for name, g in grads.items() if g is not None}}, "stage.parameters() are its own"
        results[n_micro] = (step.loss, grads, step.idle, [e[:2] for e in step.events])
    torch.save(results, {out!r} + f"/rank{{rank}}.pt")
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_a_two_stage_gpipe_step_under_torchrun_gives_the_loss_and_gradients_of_the_unsplit_model(tmp_path):
    script = tmp_path / "pipeline.py"
    script.write_text(PIPELINE_WORKER.format(out=str(tmp_path)))
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    torch.manual_seed(0)
    whole = GPT(GPTConfig(vocab_size=11, block_size=8, n_layers=4, n_heads=2, d_model=16, tie_weights=False))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 11, (12, 8), generator=g), torch.randint(0, 11, (12, 8), generator=g)
    loss = whole(x, y)[1]
    loss.backward()
    expected = dict(whole.named_parameters())
    for n_micro in (1, 3, 4):
        for rank, result in enumerate(ranks):
            got_loss, grads, idle, order = result[n_micro]
            assert got_loss == pytest.approx(loss.item(), rel=1e-5)  # both processes learn the batch's loss
            # stage 0: blocks 0-1 and the embeddings; stage 1: blocks 2-3, the final norm and the head
            mine = {n for n, g in grads.items() if g is not None}
            if rank == 0:
                assert mine == {n for n in expected if n.startswith(("blocks.0.", "blocks.1.", "tok_emb", "pos"))}
            else:
                assert mine == {n for n in expected if n.startswith(("blocks.2.", "blocks.3.", "norm_f", "lm_head"))}
            for name in mine:
                torch.testing.assert_close(grads[name], expected[name].grad, rtol=1e-4, atol=1e-6, msg=name)
            # GPipe's order: every forward pass, then every backward pass, micro-batch by micro-batch
            assert order == [("F", i) for i in range(n_micro)] + [("B", i) for i in range(n_micro)]
            assert 0 < idle < 1

"""A small GPT's training step on a GPU, run as usual against replayed from a CUDA graph (``TrainConfig.cuda_graph``).

Chapter 7's ablation size by default: 4 layers, d_model 128, 4 heads, batches of 32 x 64 characters, mixed
precision where the GPU has it. Both trainers start from the same weights and draw the same batches; their
steps alternate in blocks of ``--block`` steps, so that a busy machine slows both alike. Prints each one's
milliseconds per step, the time the plain step's kernels keep the GPU busy (the profiler: the rest of a
plain step is the host starting them), and both validation losses after ``--steps`` steps, which agree. The
last line reads

    speedup=<plain ms per step / replayed ms per step> equal=<True|False>

Needs a CUDA GPU: elsewhere ``cuda_graph`` is ignored, and there is nothing to compare.

    python benchmarks/cuda_graphs.py
    python benchmarks/cuda_graphs.py --llama   # RMSNorm, SwiGLU and RoPE, the ablation's last row
"""

from __future__ import annotations

import argparse
import time

import torch

from transformer_lib import GPT, GPTConfig
from transformer_lib.notebook.benchmark import op_times
from transformer_lib.text import CharTokenizer, load_shakespeare, random_blocks, split_train_val
from transformer_lib.training import TrainConfig, Trainer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--block", type=int, default=50, help="steps of one trainer before the other's")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--llama", action="store_true", help="RMSNorm, SwiGLU and RoPE instead of the classic block")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("cuda_graphs.py needs a CUDA GPU: elsewhere TrainConfig.cuda_graph is ignored")
    device = torch.device("cuda")

    text = load_shakespeare()
    tok = CharTokenizer(text)
    train, val = split_train_val(tok.encode(text))
    block = dict(norm="rmsnorm", activation="swiglu", positional="rope") if args.llama else {}
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=args.block_size, n_layers=args.n_layer, n_heads=4,
                       d_model=args.d_model, bias=False, **block)  # fmt: skip
    val_gen = torch.Generator().manual_seed(1234)
    val_batches = [random_blocks(val, args.batch_size, args.block_size, val_gen) for _ in range(8)]
    trainers = {}
    for name, cuda_graph in (("plain", False), ("graph", True)):
        torch.manual_seed(0)
        cfg = TrainConfig(max_steps=args.steps, lr=5e-3, min_lr=5e-4, warmup_steps=args.steps // 10,
                          eval_interval=10**9, progress=False, cuda_graph=cuda_graph)  # fmt: skip
        batches = lambda g: random_blocks(train, args.batch_size, args.block_size, g)  # noqa: E731
        trainers[name] = Trainer(GPT(config), cfg, batches, device=device)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {trainers['plain'].amp_dtype or 'fp32'}; "
          f"{args.n_layer} layers, d_model {args.d_model}, batch {args.batch_size} x {args.block_size}, "
          f"{'LLaMA' if args.llama else 'classic'} block")  # fmt: skip

    def steps(t: Trainer, n: int) -> float:
        """Seconds for ``n`` steps, from an empty queue to an empty queue."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            t.train_step(t.train_batches(t.generator))
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    first = {name: steps(t, 5) for name, t in trainers.items()}  # the graph's warm-up steps and its capture
    assert trainers["graph"].replays_graph and trainers["graph"]._graphed.captured
    seconds = dict.fromkeys(trainers, 0.0)
    done = 5
    while done < args.steps:
        n = min(args.block, args.steps - done)
        for name, t in trainers.items():
            seconds[name] += steps(t, n)
        done += n
    ms = {name: seconds[name] / (args.steps - 5) * 1e3 for name in trainers}
    losses = {}
    for name, t in trainers.items():
        t.model.eval()
        with torch.no_grad(), t._autocast():
            losses[name] = sum(t.model(x.to(device), y.to(device))[1].item() for x, y in val_batches) / len(val_batches)
        t.model.train()
    plain = trainers["plain"]  # a few more plain steps, under the profiler: the GPU's share of a step
    batch = plain.train_batches(torch.Generator().manual_seed(0))
    kernels = sum(s for _, s in op_times(lambda: plain._step((batch,), plain._lr, plain.step), device, repeats=5))
    for name in trainers:
        print(
            f"{name:5s}: {ms[name]:6.2f} ms per step (first 5 steps {first[name]:.2f} s), val_loss {losses[name]:.4f}"
        )
    print(f"the plain step's kernels keep the GPU busy {kernels * 1e3:.2f} ms of its {ms['plain']:.2f} ms")
    equal = abs(losses["plain"] - losses["graph"]) < 0.03  # the same run, but for CUDA's atomics and bf16's rounding
    print(f"speedup={ms['plain'] / ms['graph']:.2f} equal={equal}")


if __name__ == "__main__":
    main()

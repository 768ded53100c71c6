"""Independent training runs one after the other against side by side (``notebook.runs.fit_together``).

Trains ``--runs`` seeds of a small GPT (chapter 7's ablation size by default: 2 layers, d_model 64,
batches of 16 x 64 characters) several ways, timing each: one after the other with PyTorch's default
threads, one after the other with one thread, side by side with ``fit_together`` (in forked processes
on Linux, in threads elsewhere) and, where it forks, side by side in threads as it trains elsewhere.
Prints the seconds of each and checks that the side-by-side runs end with the same validation losses
as the one-thread runs (``fit_together``'s promise). The last line reads

    speedup=<one after the other, default threads, over side by side> equal=<True|False>

    python benchmarks/fit_together.py
    python benchmarks/fit_together.py --d-model 64 --block-size 18 --batch-size 32 --runs 6   # chapter 4's size
    python benchmarks/fit_together.py --n-layer 6 --d-model 32 --block-size 32 --runs 4   # chapter 5's size
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import torch

from transformer_lib import GPT, GPTConfig
from transformer_lib.notebook import runs
from transformer_lib.notebook.runs import fit_together
from transformer_lib.text import CharTokenizer, load_shakespeare, random_blocks, split_train_val
from transformer_lib.training import TrainConfig, Trainer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args()

    text = load_shakespeare(max_chars=300_000)
    tok = CharTokenizer(text)
    train, val = split_train_val(tok.encode(text))
    config = GPTConfig(
        vocab_size=tok.vocab_size, block_size=args.block_size, n_layers=args.n_layer, n_heads=4, d_model=args.d_model
    )

    def new_trainers() -> list[Trainer]:
        out = []
        for seed in range(args.runs):
            torch.manual_seed(seed)
            cfg = TrainConfig(
                max_steps=args.steps,
                lr=5e-3,
                min_lr=5e-4,
                warmup_steps=args.steps // 10,
                eval_interval=args.steps,
                eval_steps=4,
                seed=seed,
                amp=False,
            )
            out.append(
                Trainer(
                    GPT(config),
                    cfg,
                    lambda g: random_blocks(train, args.batch_size, args.block_size, g),
                    lambda g: random_blocks(val, args.batch_size, args.block_size, g),
                    device="cpu",
                )
            )
        return out

    def timed(train_all) -> tuple[float, list[float]]:
        trainers = new_trainers()
        t0 = time.perf_counter()
        train_all(trainers)
        return time.perf_counter() - t0, [t.history.val_loss[-1] for t in trainers]

    def one_thread(trainers: list[Trainer]) -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for t in trainers:
                t.fit(progress=False)
        finally:
            torch.set_num_threads(threads)

    print(
        f"{args.runs} runs of {args.steps} steps, {sum(p.numel() for p in GPT(config).parameters()):,} parameters, "
        f"batches of {args.batch_size} x {args.block_size}, {torch.get_num_threads()} PyTorch threads by default"
    )
    default, _ = timed(lambda ts: [t.fit(progress=False) for t in ts])
    single, single_losses = timed(one_thread)
    together, together_losses = timed(lambda ts: fit_together(ts, progress=False))
    rows = [
        ("one after the other, default threads", default),
        ("one after the other, one thread", single),
        ("side by side (fit_together)" + (", processes" if runs.can_fork() else ", threads"), together),
    ]
    equal = single_losses == together_losses
    if runs.can_fork():
        with mock.patch.object(runs, "can_fork", lambda: False):  # as on a platform without fork
            in_threads, thread_losses = timed(lambda ts: fit_together(ts, progress=False))
        rows.append(("side by side in threads", in_threads))
        equal = equal and single_losses == thread_losses
    for name, seconds in rows:
        print(f"{name:40s} {seconds:6.2f} s")
    print(f"speedup={default / together:.2f} equal={equal}")


if __name__ == "__main__":
    main()

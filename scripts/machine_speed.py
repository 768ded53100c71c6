"""How fast this machine trains the book's small models, against the machine the chapters' time budgets were set on.

A chapter's time depends on the CPU more than on anything in it: the same book executes about twice
as slowly on a 2-core first-generation AMD EPYC (Zen 1, AVX2, about 33 GFLOP/s per core in fp32) as on
a 2-core AMD EPYC with AVX-512 (Zen 4, about 96). So tests/test_book.py states each chapter's budget for
the reference machine and scales it by this script's measurement on the machine at hand.

The measurement is one training step of chapter 7's ablation model (2 layers, 4 heads, d_model 64, 65
characters, batch 16 x 64, fp32, AdamW with clipping) through the library's Trainer on one thread, as
``fit_together`` trains the chapters' side-by-side runs: 20 steps to warm up, then the median of five
rounds of 20 steps. It prints that and its ratio to the reference machine's time, ``REFERENCE_STEP_MS``;
the last line reads ``step_ms=<ms> slowdown=<ratio>``.

    python scripts/machine_speed.py      # about 5 s on the reference machine, 12-17 s on a Zen 1 EPYC
"""

from __future__ import annotations

import statistics
import time

import torch

# One step as above on the reference machine, the 2-core AMD EPYC with AVX512-BF16 (Zen 4) on which the
# budgets were set: 16.3 ms in its fast phase (timed inside chapter 7's ablation) and 18.1 ms in its slow one,
# where chapter 7 took 153-164 s (timed by a replica of that cell). This script was written later, on a Zen 1
# EPYC; where it reads under 18 ms, tests/test_book.py keeps the budgets as they are.
REFERENCE_STEP_MS = 18.0
VOCAB, BATCH, BLOCK = 65, 16, 64  # chapter 7's ablation: Shakespeare's 65 characters, 16 windows of 64
WARMUP, ROUNDS, STEPS = 20, 5, 20


def step_ms(warmup: int = WARMUP, rounds: int = ROUNDS, steps: int = STEPS) -> float:
    """Median milliseconds of one training step of the ablation model, fp32 on one thread: ``warmup`` steps,
    then the median over ``rounds`` rounds of ``steps`` steps each."""
    from transformer_lib import GPT, GPTConfig
    from transformer_lib.text import random_blocks
    from transformer_lib.training import TrainConfig, Trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        data = torch.randint(0, VOCAB, (100_000,))  # the speed does not depend on the characters
        model = GPT(GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layers=2, n_heads=4, d_model=64, bias=False))
        total = warmup + rounds * steps + 1  # the evaluation at max_steps falls outside the timed rounds
        config = TrainConfig(
            max_steps=total,
            lr=5e-3,
            min_lr=5e-4,
            warmup_steps=total // 10,
            eval_interval=total,
            eval_steps=1,
            amp=False,
        )
        trainer = Trainer(model, config, lambda g: random_blocks(data, BATCH, BLOCK, g), device="cpu")
        trainer.fit(warmup, progress=False)  # includes the evaluation at step 0
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            trainer.fit(steps, progress=False)
            times.append((time.perf_counter() - start) / steps * 1e3)
        return statistics.median(times)
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    ms = step_ms()
    slowdown = ms / REFERENCE_STEP_MS
    print(
        f"machine_speed: one training step of chapter 7's ablation model on one thread takes {ms:.1f} ms here, "
        f"{slowdown:.2f}x the reference machine's {REFERENCE_STEP_MS:.1f} ms "
        f"(torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()})"
    )
    print(f"step_ms={ms:.2f} slowdown={slowdown:.3f}")


if __name__ == "__main__":
    main()

"""Train transformer_lib's GPT and a nanoGPT-style reference side by side; compare speed and validation loss,
and set each step against its matrix products alone, in every precision the machine runs natively.

Both models (same size; nanoGPT's shakespeare_char-on-CPU shape by default) start from the
same weights and train with the same recipe (AdamW, warm-up then cosine decay, clipping,
dropout 0) on the same batches, alternating step by step so that both see the same machine
load: the library's through its :class:`~transformer_lib.training.Trainer`, the reference
through nanoGPT's loop. Then both are evaluated on the whole validation split. This is one race in
fp32 and, where the machine multiplies a reduced precision natively (bf16 on a CPU with AVX512-BF16
or AMX and on recent GPUs), a second race with both models under the same autocast. The two races
step in one rotation (``races_in_turn``): at every step each engine of each race, and each race's
bound below, runs once on the same batch, so that comparing one engine across the precisions (the
"precision alone" line) is as fair as comparing the two engines within one.

For each precision it prints the median milliseconds per step, tokens per second and validation
loss of each model, and the *bound*: the step's matrix products alone, in the precisions the
library multiplies them in (the output head in fp32, except on a CUDA GPU under bf16), timed
between the steps, the fastest any engine could take the step; and each model's share of it.
The last line reads

    share_of_bound fp32=<library's share> bf16=<library's share, or none>

    python benchmarks/compare_gpt.py                 # 2000 steps per precision
    python benchmarks/compare_gpt.py --iters 300     # speed only, roughly
    python benchmarks/compare_gpt.py --compile       # both compiled (nanoGPT's --compile=True)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from torch import Tensor

from recipe import char_data, recipe_config, recipe_gpt, recipe_parser  # benchmarks/recipe.py, beside this script
from transformer_lib import get_device, set_seed
from transformer_lib.notebook.benchmark import gpt_matmul_shapes, library_step_products, train_step_flops
from transformer_lib.notebook.environment import keep_freed_memory
from transformer_lib.notebook.race import Race, SideBySide, races_in_turn
from transformer_lib.notebook.reference_gpt import ReferenceGPT
from transformer_lib.precision import native_dtype
from transformer_lib.text import random_blocks
from transformer_lib.training import Trainer


@dataclass
class Shapes:
    """The recipe's step: every matrix product's (M, K, N), its blocks' and its output head's."""

    blocks: list[tuple[int, int, int]]
    head: list[tuple[int, int, int]]
    vocab_size: int


@dataclass
class PrecisionRace:
    """One precision's race (the two engines from the same weights, and its bound's products alongside)."""

    name: str  # "fp32", or the reduced precision's name
    low: torch.dtype | None  # the autocast dtype, or None: fp32
    race: Race
    how: str  # the precisions the bound's products multiply in


def new_race(
    args: argparse.Namespace, device: torch.device, low: torch.dtype | None, train: Tensor, shapes: Shapes
) -> PrecisionRace | None:
    """Both engines in one precision (``low`` under autocast, or fp32), from the same weights, with the step's
    products in the library's precisions to time beside them; None where the library trains in another
    precision here (``TRANSFORMER_LIB_PRECISION``)."""
    name = "fp32" if low is None else str(low).removeprefix("torch.")
    set_seed(args.seed)
    ours = recipe_gpt(args, shapes.vocab_size)
    reference = (
        ReferenceGPT(shapes.vocab_size, args.block_size, args.n_layer, args.n_head, args.d_model, bias=False)
        .copy_from(ours)
        .to(device)  # before its FLOPs are counted on a batch on the device
    )
    trainer = Trainer(
        ours,
        recipe_config(args, amp=low is not None),
        lambda g: random_blocks(train, args.batch_size, args.block_size, g),
        device=device,
        compile=args.compile,
    )
    if trainer.amp_dtype != low:  # TRANSFORMER_LIB_PRECISION overrides the hardware's choice
        print(f"{name}: skipped, the library trains in {trainer.amp_dtype or 'fp32'} here (TRANSFORMER_LIB_PRECISION)")
        return None
    if low is None:
        how = "every product in fp32"
    else:
        how = f"the blocks' products in {name}, the output head's in fp32"
    products = library_step_products(shapes.blocks, shapes.head, low, device)  # in the library's precisions
    return PrecisionRace(name, low, Race(trainer, reference, alongside=products), how)


def report(entry: PrecisionRace, result: SideBySide, flops: int, args: argparse.Namespace) -> float:
    """Print one precision's race and its bound; return the library's share of the bound."""
    bound = result.alongside_step
    assert bound is not None  # every race times its products alongside
    print(
        f"\n== {entry.name}: both models {'under autocast ' + entry.name if entry.low is not None else 'in fp32'}"
        f"{', compiled' if args.compile else ''}; {result.steps} steps of {result.tokens_per_step} tokens"
    )
    for who, step, loss in (
        ("reference", result.reference_step, result.reference_val_loss),
        ("ours", result.ours_step, result.ours_val_loss),
    ):
        print(
            f"{who:>9}: {step * 1000:.1f} ms/step, {result.tokens_per_step / step:,.0f} tokens/s, "
            f"{flops / step / 1e9:.0f} GFLOP/s, val_loss {loss:.4f}, {bound / step:.0%} of the bound"
        )
    print(
        f"the bound: the step's {flops / 1e9:.2f} GFLOP of products alone ({entry.how}), timed beside the steps: "
        f"{bound * 1000:.1f} ms (median)"
    )
    print(f"library over reference: {result.speedup:.2f}x")
    return bound / result.ours_step


def race_and_report(
    entries: list[PrecisionRace],
    args: argparse.Namespace,
    device: torch.device,
    train: Tensor,
    val_batches: list[tuple[Tensor, Tensor]],
    shapes: Shapes,
) -> dict[str, float]:
    """Race every precision's two engines in one rotation and report each; return the library's shares."""
    x, y = (
        t.to(device) for t in random_blocks(train, args.batch_size, args.block_size, torch.Generator().manual_seed(0))
    )
    flops = train_step_flops(entries[0].race.reference, x, y)  # forward + backward, one batch
    counted = sum(2 * m * k * n for m, k, n in shapes.blocks + shapes.head)
    if counted != flops:
        print(f"note: the shapes hold {counted / 1e9:.3f} GFLOP, the counter {flops / 1e9:.3f}")
    print(
        f"racing {' and '.join(e.name for e in entries)}: {args.iters} steps, every engine"
        + (" of both precisions" if len(entries) > 1 else "")
        + " in one rotation, on the same batches",
        flush=True,
    )
    g = torch.Generator().manual_seed(args.seed)
    results = races_in_turn(
        {e.name: e.race for e in entries},
        lambda: tuple(t.to(device) for t in random_blocks(train, args.batch_size, args.block_size, g)),
        val_batches,
    )
    shares = {
        "fp32" if entry.low is None else "bf16": report(entry, results[entry.name], flops, args) for entry in entries
    }
    if len(entries) == 2:  # one engine in two precisions, stepped in the same rotation: a fair ratio
        fp32, mixed = results["fp32"], results[entries[1].name]
        print(
            f"\nprecision alone (each engine's fp32 median over its {entries[1].name} median, in the same rotation): "
            f"library {fp32.ours_step / mixed.ours_step:.2f}x, "
            f"reference {fp32.reference_step / mixed.reference_step:.2f}x"
        )
    return shares


def main() -> None:
    p = recipe_parser(__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true", help="train both through torch.compile")
    args = p.parse_args()
    device = get_device(args.device)
    low = native_dtype(device)
    # From the start, so that all three engines (the two models and the bound's products) reuse freed memory
    # from their first step instead of faulting pages in anew.
    kept = device.type == "cpu" and keep_freed_memory()
    print(
        f"device={device} threads={torch.get_num_threads()} "
        f"capability={torch.backends.cpu.get_cpu_capability() if device.type == 'cpu' else device.type} "
        f"native reduced precision: {low or 'none'}"
        + (" malloc keeps freed memory (all three engines)" if kept else ""),
        flush=True,
    )
    tok, train, val = char_data(args)
    n = (len(val) - 1) // args.block_size  # the whole validation split, in consecutive blocks
    xs = val[: n * args.block_size].view(n, args.block_size).to(device)  # (n, block_size)
    ys = val[1 : n * args.block_size + 1].view(n, args.block_size).to(device)
    val_batches = list(zip(xs.split(args.batch_size), ys.split(args.batch_size), strict=True))
    d = args.d_model
    # every product of one block, then the output head's three (forward, and the two of its backward)
    per_block_and_head = gpt_matmul_shapes(args.batch_size * args.block_size, d, 4 * d, tok.vocab_size)
    shapes = Shapes(per_block_and_head[:-3] * args.n_layer, per_block_and_head[-3:], tok.vocab_size)
    lows = [None] + ([low] if low == torch.bfloat16 else [])
    entries = [entry for dtype in lows if (entry := new_race(args, device, dtype, train, shapes)) is not None]
    shares = {"fp32": float("nan"), "bf16": float("nan")}  # nan: printed as none
    if entries:
        shares |= race_and_report(entries, args, device, train, val_batches, shapes)
    print(
        "\n"
        + "share_of_bound "
        + " ".join(f"{name}={'none' if share != share else f'{share:.2f}'}" for name, share in shares.items())
    )


if __name__ == "__main__":
    main()

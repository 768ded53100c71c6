"""Train transformer_lib's GPT and a nanoGPT-style reference side by side; compare speed and validation loss.

Both models (same size; nanoGPT's shakespeare_char-on-CPU shape by default) start from the
same weights and train with the same recipe (AdamW, warm-up then cosine decay, clipping,
dropout 0) on the same batches, alternating step by step so that both see the same machine
load: the library's through its :class:`~transformer_lib.training.Trainer`, the reference
through nanoGPT's loop. Then both are evaluated on the whole validation split. Prints the median milliseconds per step,
tokens per second, model GFLOP/s and validation loss of each, the multiply rate this machine
reaches on the step's matrix shapes (so the fastest any step could be), and as the last line

    speedup=<ours over reference> ours_val_loss=<number> reference_val_loss=<number>

    python benchmarks/compare_gpt.py                 # the full 2000 steps, about 3 minutes on 2 cores
    python benchmarks/compare_gpt.py --iters 200     # speed only, roughly
    python benchmarks/compare_gpt.py --compile       # both compiled (nanoGPT's --compile=True)
"""

from __future__ import annotations

import torch

from recipe import char_data, recipe_config, recipe_gpt, recipe_parser  # benchmarks/recipe.py, beside this script
from transformer_lib import count_parameters, get_device, set_seed
from transformer_lib.notebook.benchmark import (
    ReferenceGPT,
    gpt_matmul_shapes,
    matmul_flops_per_second,
    train_side_by_side,
    train_step_flops,
)
from transformer_lib.text import random_blocks
from transformer_lib.training import Trainer


def main() -> None:
    p = recipe_parser(__doc__.splitlines()[0])
    p.add_argument("--no-amp", action="store_true", help="train the library's GPT in fp32 too")
    p.add_argument("--compile", action="store_true", help="train both through torch.compile")
    args = p.parse_args()

    set_seed(args.seed)
    device = get_device(args.device)
    tok, train, val = char_data(args)
    ours = recipe_gpt(args, tok.vocab_size)
    reference = ReferenceGPT(
        tok.vocab_size, args.block_size, args.n_layer, args.n_head, args.d_model, bias=False
    ).copy_from(ours)
    trainer = Trainer(
        ours,
        recipe_config(args, amp=not args.no_amp, compile=args.compile),
        lambda g: random_blocks(train, args.batch_size, args.block_size, g),
        device=device,
    )
    g = torch.Generator().manual_seed(args.seed)
    n = (len(val) - 1) // args.block_size  # the whole validation split, in consecutive blocks
    xs = val[: n * args.block_size].view(n, args.block_size).to(device)  # (n, block_size)
    ys = val[1 : n * args.block_size + 1].view(n, args.block_size).to(device)
    val_batches = list(zip(xs.split(args.batch_size), ys.split(args.batch_size), strict=True))
    print(
        f"device={device} threads={torch.get_num_threads()} ours: {count_parameters(ours):,} parameters, "
        f"reference: {count_parameters(reference):,} parameters; both under autocast {trainer.amp_dtype}; "
        f"compiled: {args.compile}",
        flush=True,
    )
    x, y = random_blocks(train, args.batch_size, args.block_size, torch.Generator().manual_seed(0))
    flops = train_step_flops(reference, x.to(device), y.to(device))  # forward + backward, one batch
    shapes = gpt_matmul_shapes(x.numel(), args.d_model, 4 * args.d_model, tok.vocab_size)
    peak = matmul_flops_per_second(shapes, device=device)
    result = train_side_by_side(
        trainer,
        reference,
        lambda: tuple(t.to(device) for t in random_blocks(train, args.batch_size, args.block_size, g)),
        val_batches,
    )
    for name, step, loss in (
        ("reference", result.reference_step, result.reference_val_loss),
        ("ours", result.ours_step, result.ours_val_loss),
    ):
        print(
            f"{name:>9}: {step * 1000:.1f} ms/step, {result.tokens_per_step / step:,.0f} tokens/s, "
            f"{flops / step / 1e9:.0f} GFLOP/s, val_loss {loss:.4f} after {result.steps} steps"
        )
    fastest = flops / peak  # every product at the machine's rate, nothing else
    print(
        f"the step's {flops / 1e9:.2f} GFLOP of products run at {peak / 1e9:.0f} GFLOP/s on their own here: "
        f"no step can beat {fastest * 1000:.1f} ms, {result.reference_step / fastest:.2f}x the reference"
    )
    print(
        f"speedup={result.speedup:.3f} ours_val_loss={result.ours_val_loss:.4f} "
        f"reference_val_loss={result.reference_val_loss:.4f}"
    )


if __name__ == "__main__":
    main()

"""Train transformer_lib's GPT and a nanoGPT-style reference side by side; compare speed and validation loss,
and measure each step against this machine's bound, in every precision the machine runs natively.

Both models (same size; nanoGPT's shakespeare_char-on-CPU shape by default) start from the
same weights and train with the same recipe (AdamW, warm-up then cosine decay, clipping,
dropout 0) on the same batches, alternating step by step so that both see the same machine
load: the library's through its :class:`~transformer_lib.training.Trainer`, the reference
through nanoGPT's loop. Then both are evaluated on the whole validation split. This runs once in
fp32 and once more in the reduced precision the machine multiplies natively, if any (bf16 on a
CPU with AVX512-BF16 or AMX and on recent GPUs; both models under the same autocast).

For each precision it prints the median milliseconds per step, tokens per second and validation
loss of each model; the step's counted matrix arithmetic and the *bound*: those products alone,
at the rate this machine reaches on exactly their shapes in that precision (the output head in
fp32, as the library keeps it), the fastest any engine could take the step; each model's share of
it; and where the rest of the library's step goes, part by part (an operator profile), with each
part's time alone (its own kernels on the step's tensors, nothing in between) and the bound of the
memory-bound parts: the bytes each must read and write over the measured copy bandwidth. The
difference between the step and its parts alone is what running them inside one eager step costs.
Last, about the fastest an eager PyTorch step can be on this machine: the products as the step
calls them (each layer's own operands, laid out as autograd passes them), the other parts alone,
and PyTorch's own cost per operator (the same step at a width where every kernel is next to nothing).
The last line reads

    share_of_bound fp32=<library's share> bf16=<library's share, or none>

    python benchmarks/compare_gpt.py                 # 2000 steps per precision, about 5 minutes on 2 cores
    python benchmarks/compare_gpt.py --iters 300     # speed only, roughly
    python benchmarks/compare_gpt.py --compile       # both compiled (nanoGPT's --compile=True)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import Tensor

from recipe import char_data, recipe_config, recipe_gpt, recipe_parser  # benchmarks/recipe.py, beside this script
from transformer_lib import count_parameters, get_device, set_seed
from transformer_lib.notebook.benchmark import (
    ReferenceGPT,
    copy_bytes_per_second,
    gpt_matmul_shapes,
    gpt_step_bytes,
    gpt_step_dispatch_time,
    gpt_step_parts_alone,
    op_time_shares,
    products_as_called,
    step_parts,
    step_products,
    train_side_by_side,
    train_step_bound,
    train_step_flops,
)
from transformer_lib.precision import native_dtype
from transformer_lib.text import random_blocks
from transformer_lib.training import Trainer
from transformer_lib.utils import best_time


def race(args: argparse.Namespace, device: torch.device, low: torch.dtype | None) -> float:
    """Race the two engines in one precision (``low`` under autocast, or fp32); print; return the library's share."""
    name = "fp32" if low is None else str(low).removeprefix("torch.")
    tok, train, val = char_data(args)
    set_seed(args.seed)
    ours = recipe_gpt(args, tok.vocab_size)
    reference = ReferenceGPT(
        tok.vocab_size, args.block_size, args.n_layer, args.n_head, args.d_model, bias=False
    ).copy_from(ours)
    trainer = Trainer(
        ours,
        recipe_config(args, amp=low is not None, compile=args.compile),
        lambda g: random_blocks(train, args.batch_size, args.block_size, g),
        device=device,
    )
    if trainer.amp_dtype != low:  # TRANSFORMER_LIB_PRECISION overrides the hardware's choice
        print(f"{name}: skipped, the library trains in {trainer.amp_dtype or 'fp32'} here (TRANSFORMER_LIB_PRECISION)")
        return float("nan")
    n = (len(val) - 1) // args.block_size  # the whole validation split, in consecutive blocks
    xs = val[: n * args.block_size].view(n, args.block_size).to(device)  # (n, block_size)
    ys = val[1 : n * args.block_size + 1].view(n, args.block_size).to(device)
    val_batches = list(zip(xs.split(args.batch_size), ys.split(args.batch_size), strict=True))
    x, y = (
        t.to(device) for t in random_blocks(train, args.batch_size, args.block_size, torch.Generator().manual_seed(0))
    )
    flops = train_step_flops(reference, x, y)  # forward + backward, one batch
    shapes = gpt_matmul_shapes(x.numel(), args.d_model, 4 * args.d_model, tok.vocab_size)
    blocks, head = shapes[:-3] * args.n_layer, shapes[-3:]  # every product of the step: n_layer blocks, one head
    counted = sum(2 * m * k * n for m, k, n in blocks + head)
    if counted != flops:
        print(f"note: the shapes hold {counted / 1e9:.3f} GFLOP, the counter {flops / 1e9:.3f}")
    if low is None:
        products = step_products(blocks + head, device=device)
        how = "every product in fp32"
    else:  # the blocks' products in the reduced precision, the output head's in fp32
        products = step_products(blocks, low, device, fp32_shapes=head)
        how = f"the blocks' products in {name}, the output head's in fp32"
    fp32_rate = flops / train_step_bound(blocks + head, device=device)  # for attention's products, below
    g = torch.Generator().manual_seed(args.seed)
    result = train_side_by_side(
        trainer,
        reference,
        lambda: tuple(t.to(device) for t in random_blocks(train, args.batch_size, args.block_size, g)),
        val_batches,
        alongside=products,  # timed in the same rotation as the two steps, under the same load
    )
    bound = result.alongside_step
    alone = train_step_bound(blocks, low, device, fp32_shapes=head) if low else train_step_bound(blocks + head)
    print(
        f"\n== {name}: both models {'under autocast ' + name if low is not None else 'in fp32'}"
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
        f"the bound: the step's {flops / 1e9:.2f} GFLOP of products alone ({how}), timed beside the steps: "
        f"{bound * 1000:.1f} ms (median; the fastest of 5 rounds alone afterwards: {alone * 1000:.1f} ms)"
    )
    print(f"library over reference: {result.speedup:.2f}x")
    B, T = x.shape  # attention's own products, uncounted above: q k^T and weights @ v forward, 4 more backward
    attention_flops = 3 * 2 * (2 * B * T * T * args.d_model) * args.n_layer
    where_the_time_goes(trainer, x, y, result.ours_step, bound, alone, attention_flops / fp32_rate, low, products)
    return bound / result.ours_step


# What the parts without a bound of their own are.
UNBOUNDED = {
    "casts and copies": "conversions between fp32 and the reduced precision; the q, k, v weights concatenated",
    "the rest": "residual adds, gradient accumulation, views, allocations: PyTorch's bookkeeping",
    "compiled kernels": "torch.compile's fused elementwise work (norms, GELU, adds, casts) and its dispatch",
}


def where_the_time_goes(
    trainer: Trainer,
    x: Tensor,
    y: Tensor,
    step: float,
    bound: float,
    products_alone: float,
    attention_bound: float,
    low: torch.dtype | None,
    products: Callable[[], None],
) -> None:
    """The library's step part by part (the profiler's shares of the median step), with each part's
    time alone (its own kernels on the step's tensors, nothing else between them) and its bound."""
    model, device = trainer.model, trainer.device
    parts = step_parts(op_time_shares(lambda: trainer.train_step((x, y)), repeats=5))
    cfg = model.config
    n_bytes = gpt_step_bytes(
        x.numel(),
        cfg.d_model,
        cfg.d_ff,
        cfg.n_layers,
        cfg.vocab_size,
        count_parameters(model),
        act_bytes=4 if low is None else low.itemsize,
    )
    B, T = x.shape
    alone = {"matrix products": products_alone}  # the other parts' own kernels, the fastest of 20 rounds:
    alone |= gpt_step_parts_alone(model, B, T, low or torch.float32, device, rounds=20)
    bandwidth = copy_bytes_per_second(device=device)
    print(f"where the library's step goes (operator profile; memory-bound parts against {bandwidth / 1e9:.0f} GB/s):")
    bounds = {
        "matrix products": (bound, "the multiply rate on the step's shapes"),
        "attention kernel": (attention_bound, "its products at the fp32 rate (the CPU attends in fp32)"),
    }
    for part, b in n_bytes.items():
        what = f"{b / 1e6:.1f} MB read and written"
        if alone[part] > 2 * b / bandwidth:  # e.g. exact GELU: its erf, not its bytes, sets its pace
            what += f"; alone {alone[part] * bandwidth / b:.1f}x that: its arithmetic and calls"
        bounds[part] = (b / bandwidth, what)
    print(f"  {'part':24s} {'ms/step':>8s} {'alone ms':>9s} {'bound ms':>9s}  bounded by")
    for part, share in parts.items():
        limit, what = bounds.get(part, (None, UNBOUNDED.get(part, "")))
        cells = [f"{t * 1000:9.2f}" if t is not None else f"{'':9s}" for t in (alone.get(part), limit)]
        print(f"  {part:24s} {share * step * 1000:8.2f} {' '.join(cells)}  {what}")
    total, total_alone = sum(limit for limit, _ in bounds.values()), sum(alone.values())
    print(
        f"  the parts' bounds add up to {total * 1000:.1f} ms: the step ({step * 1000:.1f} ms) is at "
        f"{total / step:.0%} of them (shares from the profiler, which slows small operators more than products)"
    )
    rest = step - total_alone
    print(
        f"  the parts alone add up to {total_alone * 1000:.1f} ms: the step is at {total_alone / step:.0%} of them; "
        + (
            f"the other {rest * 1000:.1f} ms are the casts, the bookkeeping and the parts' slowdown inside one step"
            if rest > 0  # a compiled step can beat its eager parts: it fuses them
            else f"the step is {-rest * 1000:.1f} ms faster than its parts run one by one (fused kernels)"
        )
    )
    if not trainer.config.compile:
        eager_floor(trainer, x, y, step, bound, products, total_alone - products_alone, low)


def eager_floor(
    trainer: Trainer,
    x: Tensor,
    y: Tensor,
    step: float,
    bound: float,
    products: Callable[[], None],
    others_alone: float,
    low: torch.dtype | None,
) -> None:
    """About the fastest an eager PyTorch step can be here: the products as the step calls them, the other
    parts' kernels alone, and PyTorch's own cost per operator (these overlap by the calls' fixed costs)."""
    replay = products_as_called(lambda: trainer.train_step((x, y)))
    rounds = [(best_time(replay, repeats=1), best_time(products, repeats=1)) for _ in range(20)]  # in turn
    as_called, contiguous = (min(times) for times in zip(*rounds, strict=True))
    dispatch = gpt_step_dispatch_time(trainer.model, amp=low is not None, device=trainer.device)
    floor = as_called + others_alone + dispatch
    print(
        f"  the products as the step calls them (each layer's own operands, transposed as autograd passes "
        f"them to the weight gradients): {as_called * 1000:.1f} ms, {as_called / contiguous:.2f}x the bound's products "
        f"(contiguous, one pair of operands per shape), timed in turn with them"
    )
    print(
        f"  PyTorch's own cost per step apart from its kernels (dispatch, autocast, autograd: the same Trainer "
        f"step at 4 channels per head and 1 x 4 tokens): {dispatch * 1000:.1f} ms"
    )
    print(
        f"  an eager step takes about {floor * 1000:.1f} ms here at the least ({as_called * 1000:.1f} products + "
        f"{others_alone * 1000:.1f} other parts alone + {dispatch * 1000:.1f} PyTorch's own): at most "
        f"{bound / floor:.2f} of the bound; the step is at {floor / step:.0%} of that"
    )


def main() -> None:
    p = recipe_parser(__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true", help="train both through torch.compile")
    args = p.parse_args()
    device = get_device(args.device)
    low = native_dtype(device)
    print(
        f"device={device} threads={torch.get_num_threads()} "
        f"capability={torch.backends.cpu.get_cpu_capability() if device.type == 'cpu' else device.type} "
        f"native reduced precision: {low or 'none'}",
        flush=True,
    )
    shares = {"fp32": race(args, device, None)}
    shares["bf16"] = race(args, device, low) if low == torch.bfloat16 else float("nan")
    print(
        "\n"
        + "share_of_bound "
        + " ".join(f"{name}={'none' if share != share else f'{share:.2f}'}" for name, share in shares.items())
    )


if __name__ == "__main__":
    main()

"""Train transformer_lib's GPT and a nanoGPT-style reference side by side; compare speed and validation loss,
and measure each step against this machine's bound, in every precision the machine runs natively.

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
loss of each model; the step's counted matrix arithmetic and the *bound*: those products alone, at
the rate this machine reaches on exactly their shapes in that precision (the output head in fp32,
as the library keeps it, except on a CUDA GPU under bf16), the fastest any engine could take the
step; each model's share of it; and where the rest of the library's step goes, part by part (an
operator profile), with each part's time alone (its own kernels on the step's tensors, nothing in
between) and the bound of the memory-bound parts: the bytes each must read and write over the
measured copy bandwidth. The difference between the step and its parts alone is what running them
inside one eager step costs. Last, about the fastest an eager PyTorch step can be on this machine:
the products as the step calls them (each layer's own operands, laid out as autograd passes them),
the other parts alone, and PyTorch's own cost per operator (the same step at a width where every
kernel is next to nothing), against the step at its fastest. The step, the parts and these are
timed in turn, the fastest of 20 rounds each, so that the machine's slow moments (on a shared VM,
steps of one run can differ by 1.5x) weigh on all of them alike. On Linux the process keeps the
memory it frees from the start (:func:`~transformer_lib.utils.keep_freed_memory`, which the library's
Trainer calls on a CPU), so that no step of the reference, of the library or of the bound's products
faults its tensors' pages in anew. The last line reads

    share_of_bound fp32=<library's share> bf16=<library's share, or none>

    python benchmarks/compare_gpt.py                 # 2000 steps per precision, about 7 minutes on 2 cores
    python benchmarks/compare_gpt.py --iters 300     # speed only, roughly
    python benchmarks/compare_gpt.py --compile       # both compiled (nanoGPT's --compile=True)

On a GPU (``--device cuda``) it races and prints the shares the same way; the operator profile
and the parts alone are the CPU's, and ``mfu.py --profile`` shows a GPU step's kernels instead.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from recipe import char_data, recipe_config, recipe_gpt, recipe_parser  # benchmarks/recipe.py, beside this script
from transformer_lib import count_parameters, get_device, set_seed
from transformer_lib.notebook.benchmark import (
    Race,
    ReferenceGPT,
    SideBySide,
    copy_bytes_per_second,
    fastest_in_turn,
    gpt_matmul_shapes,
    gpt_step_bytes,
    gpt_step_parts,
    gpt_tiny_step,
    library_step_products,
    op_time_shares,
    products_as_called,
    races_in_turn,
    step_parts,
    synced,
    train_step_bound,
    train_step_flops,
)
from transformer_lib.precision import head_product_dtype, native_dtype
from transformer_lib.text import random_blocks
from transformer_lib.training import Trainer
from transformer_lib.utils import keep_freed_memory


@dataclass
class Shapes:
    """The recipe's step: every matrix product's (M, K, N), its blocks' and its output head's."""

    blocks: list[tuple[int, int, int]]
    head: list[tuple[int, int, int]]
    vocab_size: int


@dataclass
class PrecisionRace:
    """One precision's race (the two engines from the same weights) and what its report adds to the result."""

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
        recipe_config(args, amp=low is not None, compile=args.compile),
        lambda g: random_blocks(train, args.batch_size, args.block_size, g),
        device=device,
    )
    if trainer.amp_dtype != low:  # TRANSFORMER_LIB_PRECISION overrides the hardware's choice
        print(f"{name}: skipped, the library trains in {trainer.amp_dtype or 'fp32'} here (TRANSFORMER_LIB_PRECISION)")
        return None
    if low is None:
        how = "every product in fp32"
    elif head_product_dtype(device, low) == torch.float32:
        how = f"the blocks' products in {name}, the output head's in fp32"
    else:  # a CUDA GPU under bf16: the head, too, multiplies bf16 operands (its logits fp32)
        how = f"every product in {name} (the output head's logits in fp32)"
    products = library_step_products(shapes.blocks, shapes.head, low, device)  # in the library's precisions
    return PrecisionRace(name, low, Race(trainer, reference, alongside=products), how)


def report(
    entry: PrecisionRace,
    result: SideBySide,
    flops: int,
    x: Tensor,
    y: Tensor,
    args: argparse.Namespace,
    fp32_rate: float,
) -> float:
    """Print one precision's race, its bound and where the library's step goes; return the library's share."""
    trainer, device, bound = entry.race.trainer, entry.race.trainer.device, result.alongside_step
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
    B, T = x.shape  # attention's own products, uncounted above: q k^T and weights @ v forward, 4 more backward
    attention_flops = 3 * 2 * (2 * B * T * T * args.d_model) * args.n_layer
    if device.type == "cpu":
        products = entry.race.alongside
        assert products is not None
        where_the_time_goes(trainer, x, y, result.ours_step, bound, attention_flops / fp32_rate, entry.low, products)
    else:  # the operator profile and the parts alone are the CPU's; a GPU's step is its kernels
        print("where the step goes on a GPU: benchmarks/mfu.py --profile lists each engine's kernels")
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
    attention_bound: float,
    low: torch.dtype | None,
    products: Callable[[], object],
) -> None:
    """The library's step part by part (the profiler's shares of the median step), with each part's
    time alone (its own kernels on the step's tensors, nothing else between them) and its bound; then,
    for an eager step, about the fastest an eager step can be here, against the step at its fastest."""
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
    # Everything below is timed in turn, the fastest of 20 rounds each, so that they compare like with like:
    # the step itself, the bound's products, each other part alone (its own kernels on the step's tensors),
    # and for an eager step the products as the step calls them and PyTorch's own cost per step.
    runs = {"the step": synced(lambda: trainer.train_step((x, y)), device), "matrix products": products}
    runs |= gpt_step_parts(model, B, T, low or torch.float32, device)
    eager = not trainer.config.compile
    if eager:
        runs["products as called"] = products_as_called(runs["the step"])
        runs["PyTorch's own"] = gpt_tiny_step(model, amp=low is not None, device=device)
    fastest = fastest_in_turn(runs, rounds=20)
    alone = {part: fastest[part] for part in ("matrix products", *n_bytes, "attention kernel")}
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
    total, total_alone, fast = sum(limit for limit, _ in bounds.values()), sum(alone.values()), fastest["the step"]
    print(
        f"  the parts' bounds add up to {total * 1000:.1f} ms: the step ({step * 1000:.1f} ms) is at "
        f"{total / step:.0%} of them (shares from the profiler, which slows small operators more than products)"
    )
    print(
        f"  the step and its parts alone, timed in turn (the fastest of 20 rounds each): the step {fast * 1000:.1f} ms "
        f"at its fastest ({step * 1000:.1f} ms median in the race), the parts alone {total_alone * 1000:.1f} ms"
    )
    rest = fast - total_alone
    print(
        f"  at its fastest the step is at {total_alone / fast:.0%} of its parts alone; "
        + (
            f"the other {rest * 1000:.1f} ms are the casts, the bookkeeping and the parts' slowdown inside one step"
            if rest > 0  # a compiled step can beat its eager parts: it fuses them
            else f"it is {-rest * 1000:.1f} ms faster than its parts run one by one (fused kernels)"
        )
    )
    if eager:
        eager_floor(fastest, total_alone - fastest["matrix products"])


def eager_floor(fastest: dict[str, float], others_alone: float) -> None:
    """About the fastest an eager PyTorch step can be here, against the step at its fastest (all timed in
    turn): the products as the step calls them, the other parts' kernels alone, and PyTorch's own cost
    per operator (these overlap by the calls' fixed costs)."""
    as_called, contiguous, own = fastest["products as called"], fastest["matrix products"], fastest["PyTorch's own"]
    floor, step = as_called + others_alone + own, fastest["the step"]
    print(
        f"  the products as the step calls them (each layer's own operands, transposed as autograd passes "
        f"them to the weight gradients): {as_called * 1000:.1f} ms, {as_called / contiguous:.2f}x the bound's "
        f"products (contiguous, one pair of operands per shape: {contiguous * 1000:.1f} ms)"
    )
    print(
        f"  PyTorch's own cost per step apart from its kernels (dispatch, autocast, autograd: the same Trainer "
        f"step at 4 channels per head and 1 x 4 tokens): {own * 1000:.1f} ms"
    )
    print(
        f"  the fastest eager step here takes about {floor * 1000:.1f} ms ({as_called * 1000:.1f} products + "
        f"{others_alone * 1000:.1f} other parts alone + {own * 1000:.1f} PyTorch's own; they overlap by the calls' "
        f"fixed costs): about {contiguous / floor:.2f} of the bound; the step at its fastest "
        f"({step * 1000:.1f} ms) is at {floor / step:.0%} of that, {contiguous / step:.2f} of the bound"
    )


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
    fp32_rate = flops / train_step_bound(shapes.blocks + shapes.head, device=device)  # for attention's products
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
        "fp32" if entry.low is None else "bf16": report(entry, results[entry.name], flops, x, y, args, fp32_rate)
        for entry in entries
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
    # The Trainer does this before it trains on a CPU; here from the start, so that the reference and the
    # bound's products, timed in the same process, reuse freed memory from their first step too.
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

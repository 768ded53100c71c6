"""Model FLOPs utilisation (MFU) of a GPT-2-small training step on a GPU, the library beside nanoGPT's loop.

GPT-2 small's shape as nanoGPT's ``bench.py`` trains it: 12 layers, 12 heads, d_model 768,
block 1024, batch 12, the vocabulary padded to 50304, no biases, dropout 0, bf16 autocast where
the device multiplies bf16 natively, both models compiled (``--eager`` for neither). The text is
the packaged plays, character ids inside the padded vocabulary: the step's speed does not depend
on which ids it reads. As in :mod:`compare_gpt`, the library's :class:`Trainer` and a
nanoGPT-style reference start from the same weights and alternate step by step on the same
batches; the first ``--warmup-steps`` steps (compilation included) are not timed.

A step's FLOPs are nanoGPT's estimate (PaLM's appendix B): ``6 N + 12 L d_model T`` per token,
``N`` the parameters less the position embedding, the second term attention's own products.
MFU is the rate they are done at over the GPU's *published* dense bf16 peak (a table below, by
device name, or ``--peak-tflops``); the rate this GPU reaches on one large bf16 product is printed
beside it. fp32 products run as TF32 (``torch.set_float32_matmul_precision("high")``, as nanoGPT's
``train.py`` sets). The library's output head multiplies in fp32 and writes fp32 logits
(:func:`transformer_lib.precision.output_in_fp32`); nanoGPT's head writes bf16 logits. ``--profile``
prints each engine's longest GPU kernels (the CPU's operators on a CPU), per step. The last line reads

    mfu ours=<share> reference=<share>          (none where the peak is unknown)

    python benchmarks/mfu.py                    # on a GPU: mostly compilation
    python benchmarks/mfu.py --profile          # and each engine's longest kernels
    python benchmarks/mfu.py --device cpu --n-layer 2 --n-head 2 --d-model 64 --block-size 32 --vocab-size 128 \\
        --batch-size 2 --iters 8 --warmup-steps 3 --eager --peak-tflops 1   # the script's own check
"""

from __future__ import annotations

import torch
from torch import Tensor

from recipe import char_data, recipe_config, recipe_gpt, recipe_parser  # benchmarks/recipe.py, beside this script
from transformer_lib import count_parameters, get_device, set_seed
from transformer_lib.notebook.benchmark import matmul_flops_per_second, op_times
from transformer_lib.notebook.race import train_side_by_side
from transformer_lib.notebook.reference_gpt import ReferenceGPT, reference_train_step
from transformer_lib.text import random_blocks
from transformer_lib.training import Trainer

# Published dense (no sparsity) bf16 tensor-core peaks, FLOP/s, by a piece of torch.cuda.get_device_name().
# The first entry whose every piece is in the name wins: the specific variants come before the generic one.
PUBLISHED_BF16_PEAK: list[tuple[tuple[str, ...], float]] = [
    (("H100", "PCIe"), 756e12),
    (("H100", "NVL"), 835e12),
    (("H100",), 989e12),  # SXM ("H100 80GB HBM3")
    (("H200",), 989e12),  # GH200 too
    (("A100",), 312e12),
    (("L40S",), 362e12),
    (("L4",), 121e12),
]


def published_peak(device_name: str) -> float | None:
    """The dense bf16 peak published for the GPU called ``device_name``, or None if the table lacks it."""
    for pieces, peak in PUBLISHED_BF16_PEAK:
        if all(piece in device_name for piece in pieces):
            return peak
    return None


def step_flops(n_params: int, n_layers: int, d_model: int, block_size: int, tokens: int) -> float:
    """nanoGPT's estimate of one training step's FLOPs: ``(6 N + 12 L d_model T)`` per token."""
    return (6 * n_params + 12 * n_layers * d_model * block_size) * tokens


def main() -> None:
    p = recipe_parser(__doc__.splitlines()[0])
    p.set_defaults(n_layer=12, n_head=12, d_model=768, block_size=1024, batch_size=12, iters=40, warmup=10)
    p.add_argument("--vocab-size", type=int, default=50304, help="GPT-2's 50257 padded to a multiple of 64")
    p.add_argument("--warmup-steps", type=int, default=10, help="untimed steps first (compilation included)")
    p.add_argument("--eager", action="store_true", help="neither model compiled")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's bf16 peak, if the table lacks it")
    p.add_argument("--profile", action="store_true", help="print each engine's longest kernels per step")
    args = p.parse_args()
    device = get_device(args.device)
    torch.set_float32_matmul_precision("high")  # TF32 for fp32 products on a GPU, as nanoGPT trains
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    peak = args.peak_tflops * 1e12 if args.peak_tflops else published_peak(name) if device.type == "cuda" else None
    print(f"device={device} {name}; published dense bf16 peak: {f'{peak / 1e12:.0f} TFLOP/s' if peak else 'unknown'}")

    tok, train, val = char_data(args)
    if args.vocab_size < tok.vocab_size:
        raise ValueError(f"--vocab-size must hold the text's {tok.vocab_size} characters, got {args.vocab_size}")
    set_seed(args.seed)
    ours = recipe_gpt(args, args.vocab_size)
    reference = ReferenceGPT(
        args.vocab_size, args.block_size, args.n_layer, args.n_head, args.d_model, bias=False
    ).copy_from(ours)
    compile_ = not args.eager

    def unused(g: torch.Generator) -> tuple[Tensor, Tensor]:  # the Trainer's own batches: train_side_by_side
        return random_blocks(train, 1, 1, g)  # hands each step its batch instead

    trainer = Trainer(ours, recipe_config(args), unused, device=device, compile=compile_)
    g = torch.Generator().manual_seed(args.seed)

    def batch() -> tuple[Tensor, Tensor]:
        return tuple(t.to(device) for t in random_blocks(train, args.batch_size, args.block_size, g))

    n = (len(val) - 1) // args.block_size  # validation: consecutive blocks, at most 4 batches
    xs = val[: n * args.block_size].view(n, args.block_size)[: 4 * args.batch_size].to(device)
    ys = val[1 : n * args.block_size + 1].view(n, args.block_size)[: 4 * args.batch_size].to(device)
    val_batches = list(zip(xs.split(args.batch_size), ys.split(args.batch_size), strict=True))

    dtype_name = str(trainer.amp_dtype).removeprefix("torch.") if trainer.amp_dtype else "fp32"
    n_params = count_parameters(ours) - ours.pos.weight.numel()  # nanoGPT's N: the position table left out
    flops = step_flops(n_params, args.n_layer, args.d_model, args.block_size, args.batch_size * args.block_size)
    print(
        f"GPT: {args.n_layer} layers, {args.n_head} heads, d_model {args.d_model}, block {args.block_size}, "
        f"batch {args.batch_size}, vocab {args.vocab_size}: {n_params / 1e6:.1f}M parameters (N), "
        f"{flops / 1e12:.2f} TFLOP per step; {dtype_name}{', compiled' if compile_ else ', eager'}",
        flush=True,
    )
    result = train_side_by_side(
        trainer, reference, batch, val_batches, steps=args.iters, warmup=args.warmup_steps, compile_reference=compile_
    )
    rows = [
        ("reference", result.reference_step, result.reference_val_loss),
        ("ours", result.ours_step, result.ours_val_loss),
    ]
    mfu = {}
    for who, seconds, loss in rows:
        rate = flops / seconds
        mfu[who] = rate / peak if peak else None
        print(
            f"{who:>9}: {seconds * 1000:.1f} ms/step, {result.tokens_per_step / seconds:,.0f} tokens/s, "
            f"{rate / 1e12:.4g} TFLOP/s, MFU {f'{mfu[who]:.1%}' if peak else 'none'}, val_loss {loss:.4f}"
        )
    print(
        f"first step (compilation): ours {result.ours_first_step:.1f} s, "
        f"reference {result.reference_first_step:.1f} s; "
        f"{result.steps - args.warmup_steps} steps timed; library over reference {result.speedup:.2f}x"
    )
    if device.type == "cuda":
        measured = matmul_flops_per_second([(8192, 8192, 8192)], torch.bfloat16, device)
        print(
            f"one 8192^3 bf16 product on this GPU: {measured / 1e12:.0f} TFLOP/s"
            + (f" ({measured / peak:.0%} of the published peak)" if peak else "")
        )
    if args.profile:
        reference_step = reference_train_step(reference, trainer, compile_reference=compile_)
        engines = {"ours": lambda: trainer.train_step(batch()), "reference": lambda: reference_step(*batch(), 0)}
        where = "GPU kernels" if device.type == "cuda" else "operators"
        for who, fn in engines.items():
            times = op_times(fn, device, repeats=5)
            print(f"\n{who}: {sum(t for _, t in times) * 1000:.2f} ms per step in {where}; the 15 longest (ms):")
            for name, seconds in times[:15]:
                print(f"  {seconds * 1000:8.3f}  {name[:100]}")
    print(
        "\nmfu "
        + " ".join(f"{who}={'none' if mfu[who] is None else f'{mfu[who]:.3f}'}" for who in ("ours", "reference"))
    )


if __name__ == "__main__":
    main()

"""Train transformer_lib's GPT and a nanoGPT-style reference side by side; compare speed and validation loss.

Both models (same size; nanoGPT's shakespeare_char-on-CPU shape by default) start from the
same weights and train with the same recipe (AdamW, warm-up then cosine decay, clipping,
dropout 0) on the same batches, alternating step by step so that both see the same machine
load: the library's through its :class:`~transformer_lib.training.Trainer`, the reference
through nanoGPT's loop. Then both are evaluated on the whole validation split. Prints the median milliseconds per step,
tokens per second and validation loss of each, and as the last line

    speedup=<ours over reference> ours_val_loss=<number> reference_val_loss=<number>

    python benchmarks/compare_gpt.py                 # the full 2000 steps, about 3 minutes on 2 cores
    python benchmarks/compare_gpt.py --iters 200     # speed only, roughly
"""

from __future__ import annotations

import argparse

import torch

from transformer_lib import GPT, GPTConfig, count_parameters, get_device, set_seed
from transformer_lib.benchmark import ReferenceGPT, train_side_by_side
from transformer_lib.text import CharTokenizer, load_shakespeare, random_blocks, split_train_val
from transformer_lib.training import TrainConfig, Trainer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--text", help="path of a UTF-8 text file (default: the plays of the shakespeare package)")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--activation", default="gelu", help="the library GPT's activation")
    p.add_argument("--no-amp", action="store_true", help="train the library's GPT in fp32 too")
    p.add_argument("--device", default=None, help="cpu, cuda or mps (default: the best available)")
    p.add_argument("--seed", type=int, default=1337)
    args = p.parse_args()

    set_seed(args.seed)
    device = get_device(args.device)
    text = open(args.text, encoding="utf-8").read() if args.text else load_shakespeare()
    tok = CharTokenizer(text)
    train, val = split_train_val(tok.encode(text))
    ours = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                         n_head=args.n_head, d_model=args.d_model, bias=False, activation=args.activation))
    reference = ReferenceGPT(tok.vocab_size, args.block_size, args.n_layer, args.n_head, args.d_model,
                             bias=False).copy_from(ours)
    config = TrainConfig(max_steps=args.iters, lr=args.lr, min_lr=args.min_lr, warmup_steps=args.warmup,
                         weight_decay=0.1, betas=(0.9, 0.99), grad_clip=1.0, amp=not args.no_amp, progress=False)
    trainer = Trainer(ours, config, lambda g: random_blocks(train, args.batch_size, args.block_size, g),
                      device=device)
    g = torch.Generator().manual_seed(args.seed)
    n = (len(val) - 1) // args.block_size  # the whole validation split, in consecutive blocks
    xs = val[: n * args.block_size].view(n, args.block_size).to(device)  # (n, block_size)
    ys = val[1 : n * args.block_size + 1].view(n, args.block_size).to(device)
    val_batches = list(zip(xs.split(args.batch_size), ys.split(args.batch_size)))
    print(f"device={device} threads={torch.get_num_threads()} ours: {count_parameters(ours):,} parameters, "
          f"autocast {trainer.amp_dtype}; reference: {count_parameters(reference):,} parameters, fp32", flush=True)
    result = train_side_by_side(
        trainer, reference, lambda: tuple(t.to(device) for t in random_blocks(train, args.batch_size, args.block_size, g)),
        val_batches)
    for name, step, loss in (("reference", result.reference_step, result.reference_val_loss),
                             ("ours", result.ours_step, result.ours_val_loss)):
        print(f"{name:>9}: {step * 1000:.1f} ms/step, {result.tokens_per_step / step:,.0f} tokens/s, "
              f"val_loss {loss:.4f} after {result.steps} steps")
    print(f"speedup={result.speedup:.3f} ours_val_loss={result.ours_val_loss:.4f} "
          f"reference_val_loss={result.reference_val_loss:.4f}")


if __name__ == "__main__":
    main()

"""Train transformer_lib's GPT on a text file, character level, and report speed and validation loss.

The recipe follows nanoGPT's ``shakespeare_char`` on CPU: AdamW, linear warm-up then
cosine decay to ``--min-lr``, dropout 0. The last line printed is

    tokens_per_s=<number> val_loss=<number>

where tokens per second counts training steps only (evaluation excluded).

    python benchmarks/train_gpt.py --text input.txt --iters 2000 --device cpu
    python benchmarks/train_gpt.py --shakespeare --iters 200     # the packaged plays
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from transformer_lib import GPT, GPTConfig, get_device, set_seed
from transformer_lib.text import CharTokenizer, load_shakespeare, random_blocks, split_train_val


def lr_at(step: int, lr: float, min_lr: float, warmup: int, iters: int) -> float:
    """Linear warm-up for ``warmup`` steps, then cosine decay from ``lr`` to ``min_lr`` at ``iters``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, iters - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


@torch.no_grad()
def estimate_loss(model: GPT, data: torch.Tensor, batch_size: int, block_size: int, eval_iters: int,
                  device: torch.device, generator: torch.Generator) -> float:
    model.eval()
    losses = torch.zeros(eval_iters)
    for i in range(eval_iters):
        x, y = random_blocks(data, batch_size, block_size, generator)
        losses[i] = model(x.to(device), y.to(device))[1]
    model.train()
    return losses.mean().item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="path of a UTF-8 text file")
    src.add_argument("--shakespeare", action="store_true", help="use the plays of the shakespeare package")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--eval-iters", type=int, default=20)
    p.add_argument("--eval-interval", type=int, default=250)
    p.add_argument("--device", default=None, help="cpu, cuda or mps (default: the best available)")
    p.add_argument("--seed", type=int, default=1337)
    args = p.parse_args()

    set_seed(args.seed)
    device = get_device(args.device)
    text = load_shakespeare() if args.shakespeare else open(args.text, encoding="utf-8").read()
    tok = CharTokenizer(text)
    train, val = split_train_val(tok.encode(text))
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                    n_head=args.n_head, d_model=args.d_model, dropout=0.0)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.1,
                            fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(args.seed)
    print(f"device={device} params={sum(p.numel() for p in model.parameters()):,} "
          f"train_tokens={len(train):,} val_tokens={len(val):,}")

    train_time, val_loss = 0.0, float("nan")
    for step in range(args.iters + 1):
        if step % args.eval_interval == 0 or step == args.iters:
            val_loss = estimate_loss(model, val, args.batch_size, args.block_size, args.eval_iters, device, gen)
            print(f"step {step}: val_loss {val_loss:.4f}", flush=True)
        if step == args.iters:
            break
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.lr, args.min_lr, args.warmup, args.iters)
        x, y = random_blocks(train, args.batch_size, args.block_size, gen)
        _, loss = model(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()  # time the step, not just its launch
        train_time += time.perf_counter() - t0
    tokens = args.iters * args.batch_size * args.block_size
    print(f"tokens_per_s={tokens / train_time:.0f} val_loss={val_loss:.4f}")


if __name__ == "__main__":
    main()

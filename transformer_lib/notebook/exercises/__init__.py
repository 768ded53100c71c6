"""Automatic checkers for the chapters' exercises, one module per chapter.

Each ``check_<name>(student_answer)`` runs hidden cases (shapes, equality with the
library, leak checks), prints friendly feedback (which case failed, expected vs got,
a hint) and returns a :class:`CheckResult`. A wrong answer never crashes a checker: an
exception, a sparse result or one on another device becomes feedback. A case hands the
answer copies of its inputs and fails an answer that changes them in place; it waits at
most ``_framework.CASE_TIMEOUT_SECONDS`` (10 s) for the answer, so an infinite loop fails
the case instead of hanging the notebook. A checker leaves the reader's random streams
(torch, ``random``, NumPy) as it found them.
When a case fails, the checker compares the answer with the classic bugs that popular
tutorials ship (a missing 1/sqrt(d_k), softmax over the wrong axis, an inverted mask, a
masked diagonal, the batch mixed into or flattened into the head split, keys reshaped with
the query's length, sine and cosine swapped or in halves, RoPE rotating dimension i with
i + d/2 instead of its neighbour, a LayerNorm over the batch axis, with the unbiased
variance or eps outside the square root) and names the one it recognises.

- ``_framework``: :class:`CheckResult`, :class:`Bug`, the case runner :class:`Checker` and ``@checker``
- ``ch01_attention``: ``check_attention``, ``check_softmax``
- ``ch02_masking``: ``check_causal_mask``, ``check_padding_mask``, ``check_prefix_lm_mask``
- ``ch03_multi_head_attention``: ``check_split_heads``, ``check_multi_head_attention``
- ``ch04_positional_encoding``: ``check_sinusoidal_encoding``, ``check_rope``
- ``ch05_norms_and_residuals``: ``check_layer_norm``, ``check_rms_norm``, ``check_pre_ln_block``
- ``ch06_encoder_decoder``: ``check_shift_right``, ``check_decoder_layer``, ``check_label_smoothing``
- ``ch07_decoder_only``: ``check_top_k_filter``, ``check_top_p_filter``, ``check_generate_cached``,
  ``check_swiglu_hidden``, ``check_encode_word``
"""

from ._framework import Bug, Checker, CheckResult, checker
from .ch01_attention import check_attention, check_softmax
from .ch02_masking import check_causal_mask, check_padding_mask, check_prefix_lm_mask
from .ch03_multi_head_attention import check_multi_head_attention, check_split_heads
from .ch04_positional_encoding import check_rope, check_sinusoidal_encoding
from .ch05_norms_and_residuals import check_layer_norm, check_pre_ln_block, check_rms_norm
from .ch06_encoder_decoder import check_decoder_layer, check_label_smoothing, check_shift_right
from .ch07_decoder_only import (
    check_encode_word,
    check_generate_cached,
    check_swiglu_hidden,
    check_top_k_filter,
    check_top_p_filter,
)

__all__ = [
    "Bug",
    "Checker",
    "CheckResult",
    "checker",
    "check_attention",
    "check_softmax",
    "check_causal_mask",
    "check_padding_mask",
    "check_prefix_lm_mask",
    "check_multi_head_attention",
    "check_split_heads",
    "check_rope",
    "check_sinusoidal_encoding",
    "check_layer_norm",
    "check_pre_ln_block",
    "check_rms_norm",
    "check_decoder_layer",
    "check_label_smoothing",
    "check_shift_right",
    "check_top_k_filter",
    "check_top_p_filter",
    "check_generate_cached",
    "check_swiglu_hidden",
    "check_encode_word",
]

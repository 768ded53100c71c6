"""Automatic checkers for the chapters' exercises, one module per chapter.

Each ``check_<name>(student_answer)`` runs hidden cases (shapes, equality with the
library, leak checks), prints friendly feedback (which case failed, expected vs got, then
each hint's concept once) and returns a :class:`CheckResult`; ``check_<name>.hint()``
prints the fixes in code of its last failed call (a :class:`Hint` holds both levels; the
grader sees the concepts only). A wrong answer never crashes a checker: an
exception (even ``sys.exit()``), a sparse result or one on another device becomes
feedback. A case hands the answer copies of its inputs and fails an answer that changes
them in place; it waits at most ``_framework.CASE_TIMEOUT_SECONDS`` (10 s) for the answer,
so an infinite loop fails the case instead of hanging the notebook. A checker leaves the
reader's random streams (torch, ``random``, NumPy) as it found them.
When a case fails, the checker compares the answer with the classic bugs that popular
tutorials ship (a softmax normalised over the wrong axis or by the whole tensor's maximum, a
mask with PyTorch's "True = blocked" polarity or padding on the query axis, the batch mixed
into the head split, keys reshaped with the query's length, a positional-encoding exponent
doubled or without its minus sign, a LayerNorm with the unbiased std, eps outside the root or one
scalar gain, residual dropout applied to the residual stream, a batch decoder that stops at the
first end token, a BPE encoder that merges the most frequent pair) and names the one it recognises.

An answer still as the starter cell left it gets "not answered yet" (a *Spot the bug*'s buggy code
too, declared with ``@checker(starter=SOURCE)``); ``@checker(answer="value")``
checks a prediction (a number) instead of a function; every call is recorded for the grader
(:mod:`transformer_lib.notebook.grade`). :mod:`.catalogue` lists every chapter's exercises.

- ``_framework``: :class:`CheckResult`, :class:`Hint` (a concept and its fix), :class:`Bug` and :func:`bug_table`
  (a checker's known bugs, from a ``{bug: hint}`` table), the case runner :class:`Checker` and ``@checker``;
  CONTRIBUTING.md shows how to write one
- ``ch01_attention``: ``check_softmax``, ``check_score_std``, ``check_distance_attention``
- ``ch02_masking``: ``check_decoder_mask``, ``check_cheating_positions``, ``check_packed_mask``
- ``ch03_multi_head_attention``: ``check_split_heads``, ``check_multi_head_attention``, ``check_attention_crossover``
- ``ch04_positional_encoding``: ``check_sinusoidal_encoding``, ``check_rope_permutation``, ``check_alibi_share``,
  ``check_alibi``
- ``ch05_norms_and_residuals``: ``check_layer_norm_module``, ``check_pre_ln_block``, ``check_stream_growth``,
  ``check_running_stats``
- ``ch06_encoder_decoder``: ``check_greedy_batch``, ``check_smoothed_loss``, ``check_beam_step``
- ``ch07_decoder_only``: ``check_encode_word``, ``check_swiglu_hidden``, ``check_kv_cache_bytes``,
  ``check_gqa_step``
- ``ch08_training_at_scale``: ``check_amp_state_bytes``, ``check_accumulate``, ``check_scaled_step``,
  ``check_attention_shard``, ``check_one_f_one_b``
- ``ch09_inference_and_deployment``: ``check_kv_cache_gib``, ``check_quantize_per_group``, ``check_soft_loss``,
  ``check_accepted_tokens``, ``check_batched_intensity``
- ``ch10_encoder_only``: ``check_empty_windows``, ``check_pseudo_log_likelihood``, ``check_last_vectors``
"""

from ._framework import Bug, Checker, CheckResult, Hint, bug_table, checker
from .ch01_attention import check_distance_attention, check_score_std, check_softmax
from .ch02_masking import check_cheating_positions, check_decoder_mask, check_packed_mask
from .ch03_multi_head_attention import check_attention_crossover, check_multi_head_attention, check_split_heads
from .ch04_positional_encoding import (
    check_alibi,
    check_alibi_share,
    check_rope_permutation,
    check_sinusoidal_encoding,
)
from .ch05_norms_and_residuals import (
    check_layer_norm_module,
    check_pre_ln_block,
    check_running_stats,
    check_stream_growth,
)
from .ch06_encoder_decoder import check_beam_step, check_greedy_batch, check_smoothed_loss
from .ch07_decoder_only import check_encode_word, check_gqa_step, check_kv_cache_bytes, check_swiglu_hidden
from .ch08_training_at_scale import (
    check_accumulate,
    check_amp_state_bytes,
    check_attention_shard,
    check_one_f_one_b,
    check_scaled_step,
)
from .ch09_inference_and_deployment import (
    check_accepted_tokens,
    check_batched_intensity,
    check_kv_cache_gib,
    check_quantize_per_group,
    check_soft_loss,
)
from .ch10_encoder_only import check_empty_windows, check_last_vectors, check_pseudo_log_likelihood

__all__ = [
    "Bug",
    "Checker",
    "CheckResult",
    "Hint",
    "bug_table",
    "checker",
    "check_softmax",
    "check_score_std",
    "check_distance_attention",
    "check_decoder_mask",
    "check_cheating_positions",
    "check_packed_mask",
    "check_multi_head_attention",
    "check_split_heads",
    "check_attention_crossover",
    "check_sinusoidal_encoding",
    "check_rope_permutation",
    "check_alibi_share",
    "check_alibi",
    "check_layer_norm_module",
    "check_pre_ln_block",
    "check_stream_growth",
    "check_running_stats",
    "check_greedy_batch",
    "check_smoothed_loss",
    "check_beam_step",
    "check_encode_word",
    "check_swiglu_hidden",
    "check_kv_cache_bytes",
    "check_gqa_step",
    "check_amp_state_bytes",
    "check_accumulate",
    "check_scaled_step",
    "check_attention_shard",
    "check_one_f_one_b",
    "check_kv_cache_gib",
    "check_quantize_per_group",
    "check_soft_loss",
    "check_accepted_tokens",
    "check_batched_intensity",
    "check_empty_windows",
    "check_pseudo_log_likelihood",
    "check_last_vectors",
]

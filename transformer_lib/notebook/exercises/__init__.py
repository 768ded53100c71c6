"""Automatic checkers for the chapters' exercises, one module per chapter.

Each ``check_<name>(student_answer)`` runs hidden cases (shapes, equality with the library, leak checks),
prints which case failed, expected against got, then each hint's concept once, and returns a
:class:`CheckResult`; ``check_<name>.hint()`` prints the fixes in code of its last failed call. A wrong
answer never crashes a checker, and a failed case names the classic bug it recognises (those that popular
tutorials ship). ``_framework`` holds the case runner and ``@checker``, which registers each chapter's
checkers in :data:`REGISTRY`; this package exports them all. :mod:`.catalogue` lists every chapter's
exercises; CONTRIBUTING.md ("Writing a checker") shows how to add one.
"""

from typing import Any

from . import (  # each chapter module registers its checkers
    ch01_attention,
    ch02_masking,
    ch03_multi_head_attention,
    ch04_positional_encoding,
    ch05_norms_and_residuals,
    ch06_encoder_decoder,
    ch07_decoder_only,
    ch08_training_at_scale,
    ch09_inference_and_deployment,
    ch10_encoder_only,
)
from ._framework import REGISTRY, Bug, Checker, CheckResult, Hint, bug_table, checker

CHAPTER_MODULES = (
    ch01_attention,
    ch02_masking,
    ch03_multi_head_attention,
    ch04_positional_encoding,
    ch05_norms_and_residuals,
    ch06_encoder_decoder,
    ch07_decoder_only,
    ch08_training_at_scale,
    ch09_inference_and_deployment,
    ch10_encoder_only,
)
CHECKERS: dict[str, Any] = {name: check for checks in REGISTRY.values() for name, check in checks.items()}
"""Every chapter's public checker by name, from :data:`REGISTRY`."""
globals().update(CHECKERS)

__all__ = ["Bug", "Checker", "CheckResult", "Hint", "bug_table", "checker", *CHECKERS]

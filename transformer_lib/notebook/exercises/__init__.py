"""Automatic checkers for the chapters' exercises, one module per chapter.

Each ``check_<name>(student_answer)`` runs hidden cases, prints which failed and the concept of each hint, naming
the classic bugs it recognises, and returns a :class:`CheckResult`; ``check_<name>.hint()`` prints the fixes in
code. ``@checker`` (``_framework``) registers each chapter's checkers; this package exports them all.
:mod:`.catalogue` lists every chapter's exercises; CONTRIBUTING.md ("Writing a checker") shows how to add one.
"""

import importlib
import pkgutil
from typing import Any

from ._framework import REGISTRY, Bug, Checker, CheckResult, Hint, bug_table, checker

#: The chapter modules (``chNN_*``), in chapter order; importing each registers its checkers.
CHAPTER_MODULES = tuple(
    importlib.import_module(f"{__name__}.{name}")
    for name in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("ch"))
)
CHECKERS: dict[str, Any] = {name: check for checks in REGISTRY.values() for name, check in checks.items()}
"""Every chapter's public checker by name, from :data:`REGISTRY`."""
globals().update(CHECKERS)

__all__ = ["Bug", "Checker", "CheckResult", "Hint", "bug_table", "checker", *CHECKERS]

import os
from types import ModuleType

import pytest
import torch


def in_ci() -> bool:
    """True under CI (the environment variable CI=true, as `.ci/run` is run)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def importorskip_unless_ci(modname: str, minversion: str | None = None, reason: str | None = None) -> ModuleType:
    """``pytest.importorskip`` that skips locally but fails under CI=true.

    A module that CI's environment lacks is a missing install step, not a reason to test less:
    there the test (or, at module level, the whole module) fails and says what to install.
    Use it in place of ``pytest.importorskip``: ``yaml = importorskip_unless_ci("yaml")``.
    """
    if not in_ci():
        return pytest.importorskip(modname, minversion=minversion, reason=reason)
    try:
        return pytest.importorskip(modname, minversion=minversion, reason=reason)
    except pytest.skip.Exception as skipped:
        pytest.fail(
            f"{skipped.msg} - CI=true, so a missing module is an error (is it in requirements.txt?)", pytrace=False
        )


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)

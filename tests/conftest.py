import os
from types import ModuleType

import pytest
import torch
from torch import Tensor


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


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test-fast`` runs ``-n auto``), each worker's PyTorch gets its share of
    the cores, not all of them: N workers of N threads each would oversubscribe the machine."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def generate_with_logits(model, idx: Tensor, max_new_tokens: int, **kwargs) -> tuple[Tensor, Tensor]:
    """``model.generate(idx, max_new_tokens, **kwargs)`` and the logits each step sampled from,
    (B, max_new_tokens, vocab_size), read by a forward hook on the output head."""
    seen: list[Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out[:, -1]))
    try:
        ids = model.generate(idx, max_new_tokens, **kwargs)
    finally:
        hook.remove()
    return ids, torch.stack(seen, dim=1)


def diagnosis(result) -> str:
    """What a Spot the bug's ``check_x.hint()`` says its symptom means, which its printed feedback must not say."""
    assert not any(d in result.text for d in result.diagnoses), result.text
    return " ".join(result.diagnoses)

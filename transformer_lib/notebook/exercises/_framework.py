"""The checkers' framework: the case runner, the comparison helpers and the ``@checker`` decorator.

A checker is written as ``def check_x(c: Checker, answer) -> None`` that runs its hidden cases with
``c.case(...)``; ``@checker`` turns it into the public ``check_x(answer) -> CheckResult``, which
refuses a non-callable answer, keeps the reader's random streams untouched and prints the feedback.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor


@dataclass
class CheckResult:
    """Outcome of a checker: ``passed`` and one line per case."""

    title: str
    passed: bool
    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The title followed by one line per case, as printed."""
        return "\n".join([self.title, *self.lines])

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:  # the feedback was printed already; show nothing more
        pass


@dataclass
class Bug:
    """A known wrong implementation: if the answer equals ``fn(*args)``, show ``hint``."""

    fn: Callable[..., Any]
    hint: str


def _describe(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"tensor of shape {tuple(x.shape)}, dtype {x.dtype}"
    if isinstance(x, tuple):
        return "tuple of (" + ", ".join(_describe(t) for t in x) + ")"
    return f"{type(x).__name__}"


def _difference(got: Any, expected: Any, atol: float = 1e-5) -> str | None:
    """None when ``got`` equals ``expected`` (tensors or tuples of tensors); else what differs."""
    if isinstance(expected, tuple):
        if not isinstance(got, tuple) or len(got) != len(expected):
            return f"expected a tuple of {len(expected)} ({_describe(expected)}), got {_describe(got)}"
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            problem = _difference(g, e, atol)
            if problem:
                return f"item {i} of the tuple: {problem}"
        return None
    if not isinstance(got, Tensor):
        return f"expected {_describe(expected)}, got {_describe(got)}"
    if got.shape != expected.shape:
        return f"expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}"
    if expected.dtype == torch.bool:
        if got.dtype != torch.bool:
            return f"expected a boolean tensor, got dtype {got.dtype}"
        if not torch.equal(got, expected):
            return f"{int((got != expected).sum())} entries differ from the expected mask"
        return None
    if not expected.is_floating_point():  # integer tensors, e.g. token ids: exact equality
        if got.is_floating_point() or got.dtype == torch.bool:
            return f"expected an integer tensor (token ids, {expected.dtype}), got dtype {got.dtype}"
        if not torch.equal(got.long(), expected.long()):
            return f"{int((got.long() != expected.long()).sum())} of {expected.numel()} entries differ"
        return None
    if not got.is_floating_point():
        return f"expected a floating-point tensor, got dtype {got.dtype}"
    got, expected = got.detach().double(), expected.detach().double()
    if torch.isnan(got).any() and not torch.isnan(expected).any():
        return "the result contains NaN"
    if not torch.equal(torch.isinf(got), torch.isinf(expected)):
        return (
            f"{int((torch.isinf(got) != torch.isinf(expected)).sum())} entries are infinite where they should "
            f"not be, or finite where they should be -inf"
        )
    if not torch.allclose(got, expected, atol=atol, rtol=1e-4):
        return f"values differ: largest |got - expected| = {(got - expected).abs().max().item():.3g}"
    return None


def _nan_to_zero(x: Any) -> Any:
    if isinstance(x, tuple):
        return tuple(_nan_to_zero(t) for t in x)
    if isinstance(x, Tensor) and x.is_floating_point():
        return x.nan_to_num(0.0, posinf=float("inf"), neginf=float("-inf"))
    return x


class Checker:
    """Runs a checker's cases, collects one feedback line per case and counts the failures."""

    def __init__(self, title: str) -> None:
        self.title, self.lines, self.failures = title, [], 0

    def case(
        self,
        name: str,
        answer: Callable[[], Any],
        expected: Any,
        bugs: tuple[Bug, ...] = (),
        hint: str = "",
        error_hint: str = "",
        atol: float = 1e-5,
    ) -> None:
        """Run ``answer()``, compare it with ``expected`` and, if it differs, name the first matching bug."""
        try:
            got = answer()
        except Exception as e:  # a wrong answer must never crash the checker
            self._fail(name, f"raised {type(e).__name__}: {e}", error_hint or hint)
            return
        problem = _difference(got, expected, atol)
        if problem is None:
            self.lines.append(f"  ✅ {name}")
            return
        for bug in bugs:  # NaN rows (e.g. softmax over all -inf) still identify the bug that made them
            try:
                if _difference(_nan_to_zero(got), bug.fn(), atol) is None:
                    self._fail(name, problem, bug.hint)
                    return
            except Exception:
                continue
        self._fail(name, problem, hint)

    def _fail(self, name: str, problem: str, hint: str) -> None:
        self.failures += 1
        self.lines.append(f"  ❌ {name}: {problem}")
        if hint:
            self.lines.append(f"     Hint: {hint}")

    def done(self) -> CheckResult:
        """Print the summary and the feedback lines; return them as a :class:`CheckResult`."""
        n = sum(1 for line in self.lines if line.startswith("  ✅") or line.startswith("  ❌"))
        passed = self.failures == 0
        summary = f"All {n} checks passed." if passed else f"{self.failures} of {n} checks failed."
        result = CheckResult(f"{self.title}: {summary}", passed, self.lines)
        print(result.text)
        return result


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    """Restore torch's (CPU and CUDA), Python's and NumPy's global random state on exit."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng():
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def checker(body: Callable[[Checker, Any], None]) -> Callable[[Any], CheckResult]:
    """Turn ``body(c, answer)`` into the public ``check_<name>(answer) -> CheckResult`` of the same name."""
    title = body.__name__
    _, answer_parameter = inspect.signature(body).parameters.values()

    @functools.wraps(body)
    def check(answer: Any, /) -> CheckResult:
        if not callable(answer):
            result = CheckResult(f"{title}: expected a function, got {type(answer).__name__}", False)
            print(result.text)
            return result
        c = Checker(title)
        with _random_state_kept():  # the hidden cases and the answer must not disturb the reader's random streams
            body(c, answer)
        return c.done()

    # help() and the chapters show check_<name>(answer, /) -> CheckResult, without the Checker argument
    check.__signature__ = inspect.Signature(
        [answer_parameter.replace(kind=inspect.Parameter.POSITIONAL_ONLY)], return_annotation="CheckResult"
    )
    check.__annotations__ = {
        name: annotation for name, annotation in body.__annotations__.items() if name == answer_parameter.name
    } | {"return": CheckResult}
    return check

"""The checkers' framework: the case runner :class:`Checker`, the comparison of results and ``@checker``.

A checker is ``def check_x(c: Checker, answer) -> None`` running its hidden cases with ``c.case(...)`` (or
``c.cases(...)``); ``@checker`` makes it the public ``check_x(answer) -> CheckResult``. A case turns anything odd
the answer does (raise, hang, change its inputs, return a sparse tensor) into a failed case with feedback, never
a crash, and names the known bug that gives the wrong result (:func:`bug_table`); its hint has two levels
(:class:`Hint`), a *Spot the bug*'s first one its symptom. CONTRIBUTING.md ("Writing a checker") walks through one.
"""

from __future__ import annotations
import __future__

import contextlib
import copy
import dis
import functools
import inspect
import json
import math
import os
import random
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

CASE_TIMEOUT_SECONDS: float = 10.0
"""How long one case waits for the answer, in seconds (longer fails the case). Raise it on a slow machine
(``_framework.CASE_TIMEOUT_SECONDS = 30.0``); a ``Checker(..., timeout_seconds=)`` has its own limit."""

RESULTS_ENV = "TRANSFORMER_BOOK_RESULTS"
"""Environment variable: the path of a JSON-lines file to which every checker call appends its record
(``checker``, ``status``, ``passed``, ``feedback``). The grader does not use it (a file the notebook can
write is a file it can forge): it reads :func:`grader_records` from each execute reply."""

NOT_ANSWERED = "not answered yet"

_ALARM_REPEAT_SECONDS = 0.1  # after the time limit, interrupt again this often: the answer may swallow one


@dataclass
class CheckResult:
    """Outcome of a checker: ``passed``; the printed ``lines``, one per case, then the hints' concepts;
    ``status``: "passed", "failed" or "unanswered" (the answer is still the starter cell as given); and the
    ``fixes`` in code, after a *Spot the bug*'s ``diagnoses`` (its hints' concepts), printed only by
    ``check_x.hint()`` and never recorded for the grader."""

    title: str
    passed: bool
    lines: list[str] = field(default_factory=list)
    status: str = ""
    fixes: list[str] = field(default_factory=list)
    diagnoses: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.status:
            self.status = "passed" if self.passed else "failed"

    @property
    def text(self) -> str:
        """The title followed by the lines, as printed (no fix in code)."""
        return "\n".join([self.title, *self.lines])

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:  # the feedback was printed already; show nothing more
        pass


@dataclass(frozen=True)
class Hint:
    """A hint in two levels: ``concept`` (shown with the feedback) says what the symptom means and which idea
    or section to reread, with no code of the fix; ``fix`` (shown only when the reader asks for it, with
    ``check_x.hint()``, and never to the grader) is the code-level fix. A plain ``str`` hint is a concept. In a
    *Spot the bug*, whose bug is the exercise, a hint with a fix is a diagnosis: ``check_x.hint()`` shows its concept
    too, and the feedback a case that fails against one that passes."""

    concept: str
    fix: str = ""

    def __str__(self) -> str:
        return self.concept


def _as_hint(hint: str | Hint) -> Hint:
    if isinstance(hint, Hint):
        return hint
    if isinstance(hint, str):
        return Hint(hint)
    raise TypeError(f"a hint is a str or a Hint(concept, fix), got {type(hint).__name__}: {hint!r}")


@dataclass
class Bug:
    """A known wrong implementation: if the answer equals ``fn()``, show ``hint`` (a ``str`` or a :class:`Hint`)."""

    fn: Callable[[], Any]
    hint: str | Hint


def bug_table(table: Mapping[str, str | Hint], wrong: Callable[..., Any], /, *args: Any) -> tuple[Bug, ...]:
    """The :class:`Bug` of each entry ``bug: hint`` of a checker's table of classic mistakes: its wrong answer is
    ``wrong(*args, bug=bug)``, computed only if the answer fails the case (one right on the case never matches)."""
    return tuple(Bug(functools.partial(wrong, *args, bug=bug), hint) for bug, hint in table.items())


def two_bugs(first: Hint, second: Hint) -> Hint:
    """The hint for two bugs at once, from the hint of each."""

    def both(a: str, b: str) -> str:
        return f"{a.rstrip('.')}; and {b.rstrip('.')}."

    return Hint("Two bugs: " + both(first.concept, second.concept), both(first.fix, second.fix))


def same_fix(fix: str, concepts: Mapping[Any, str]) -> dict[Any, Hint]:
    """``{bug: Hint(concept, fix)}``: a table of mistakes whose fix is one and the same."""
    return {bug: Hint(concept, fix) for bug, concept in concepts.items()}


# ---------------------------------------------------------------- comparing a result with the expected one


def _describe(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"tensor of shape {tuple(x.shape)}, dtype {x.dtype}"
    if isinstance(x, tuple):
        return "tuple of (" + ", ".join(_describe(t) for t in x) + ")"
    return f"{type(x).__name__}"


def _both_ints(a: Any, b: Any) -> bool:  # a NumPy integer counts as an int; a bool does not
    return all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in (a, b))


def _is_real(x: Any) -> bool:
    """A real number: a Python or NumPy int or float, or a one-element floating tensor (not a bool)."""
    if isinstance(x, Tensor):
        return x.numel() == 1 and not x.dtype.is_complex and x.dtype != torch.bool
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _short(x: Any, limit: int = 120) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _difference(got: Any, expected: Any, atol: float = 1e-5) -> str | None:
    """None when ``got`` equals ``expected`` (tensors, tuples of them, numbers, plain values); else what differs,
    in words for a learner: the kind of result first, then its shape and dtype, then its values."""
    if isinstance(expected, tuple):
        if not isinstance(got, tuple) or len(got) != len(expected):
            return f"expected a tuple of {len(expected)} ({_describe(expected)}), got {_describe(got)}"
        problems = (_difference(g, e, atol) for g, e in zip(got, expected, strict=True))
        return next((f"item {i} of the tuple: {p}" for i, p in enumerate(problems) if p), None)
    if isinstance(expected, float) and _is_real(got):  # a float: equal within atol (or a relative 1e-4)
        if math.isclose(float(got), expected, rel_tol=1e-4, abs_tol=atol):
            return None
        return f"expected {expected:.6g} (within {atol:g}), got {float(got):.6g}"
    if not isinstance(expected, Tensor):  # plain Python values (ints, strings, lists of them): exact equality
        if isinstance(got, Tensor) or type(got) is not type(expected) and not _both_ints(got, expected):
            return f"expected {_describe(expected)} {_short(expected)}, got {_describe(got)} {_short(got)}"
        return None if got == expected else f"expected {_short(expected)}, got {_short(got)}"
    if not isinstance(got, Tensor):
        return f"expected {_describe(expected)}, got {_describe(got)}"
    return _tensor_difference(got, expected, atol)


_KINDS = {"bool": "a boolean tensor", "int": "an integer tensor (token ids)", "float": "a floating-point tensor"}


def _kind(t: Tensor) -> str:
    return "bool" if t.dtype == torch.bool else "float" if t.is_floating_point() or t.is_complex() else "int"


_MISMATCH = re.compile(
    r"(?:Mismatched elements: (\d+) / (\d+).*?)?bsolute difference: ([^ \n]+)(?: at index (\(.*?\)))?", re.S
)


def _tensor_difference(got: Tensor, expected: Tensor, atol: float) -> str | None:
    """What differs between two tensors, by :func:`torch.testing.assert_close`, behind a first line for learners:
    where the tensor lives, its shape, the kind of its dtype, then which values differ."""
    if got.layout != torch.strided or got.device != expected.device:
        where = "the CPU" if expected.device.type == "cpu" else str(expected.device)
        kind = "dense" if got.layout == torch.strided else str(got.layout).removeprefix("torch.")
        return (
            f"expected a dense tensor on {where}, got a {kind} tensor on {got.device}: create new tensors "
            f"like the inputs (device=x.device), without .to(...), .cuda() or .to_sparse()"
        )
    if got.shape != expected.shape:
        return f"expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}"
    if _kind(got) != _kind(expected):
        return f"expected {_KINDS[_kind(expected)]}, got dtype {got.dtype}"
    try:
        torch.testing.assert_close(got.detach(), expected, atol=atol, rtol=1e-4, check_dtype=False)
        return None
    except AssertionError as e:
        match = _MISMATCH.search(str(e))
    n, total, largest, index = match.groups() if match else (None, None, "nan", None)
    n, total, at = n or "1", total or str(expected.numel()), f" at index {index}" if index else ""
    if _kind(expected) != "float":
        return f"{n} of {total} entries differ from the expected ones" + (f" (e.g.{at})" if at else "")
    nan = got.isnan() & ~expected.isnan()
    problem = f"values differ in {n} of {total} entries: largest |got - expected| = {float(largest):.3g}{at}"
    if nan.any():
        problem = f"the result contains NaN ({int(nan.sum())} of {total} entries)"
    if got.dtype.itemsize < expected.dtype.itemsize:  # e.g. float16, whose rounding and range may be the cause
        problem += f" (your result has dtype {got.dtype}, the expected one {expected.dtype})"
    return problem


def _map_tensors(f: Callable[[Tensor], Tensor], x: Any) -> Any:
    if isinstance(x, tuple):
        return tuple(_map_tensors(f, t) for t in x)
    return f(x) if isinstance(x, Tensor) else x


def _nan_to_zero(x: Any) -> Any:
    inf = float("inf")
    return _map_tensors(lambda t: t.nan_to_num(0.0, posinf=inf, neginf=-inf) if t.is_floating_point() else t, x)


def _independent_copy(x: Any) -> Any:
    return _map_tensors(lambda t: t.detach().clone(), x)


def _tensor_change(before: Tensor, after: Tensor) -> str | None:
    """None when ``after`` still holds ``before``'s values; else what changed."""
    layout_before = (before.shape, before.dtype, before.device, before.layout)
    if (after.shape, after.dtype, after.device, after.layout) != layout_before:
        return f"it became a {_describe(after)} on {after.device}, from a {_describe(before)}"
    changed = after != before
    if before.is_floating_point():  # NaN != NaN: a NaN that was there before is not a change
        changed &= ~(after.isnan() & before.isnan())
    n = int(changed.sum())
    return f"{n} of {before.numel()} entries changed" if n else None


def _in_place_change(name: str, before: Any, after: Any) -> tuple[str, str] | None:
    """``(where, what)`` for the first part of the input ``name`` that the answer changed (in its copy ``after``)."""
    if isinstance(before, Tensor):
        what = _tensor_change(before, after) if isinstance(after, Tensor) else "it is no longer a tensor"
        return (name, what) if what else None
    if isinstance(before, nn.Module):
        weights_before, weights_after = before.state_dict(), after.state_dict()
        for key, tensor in weights_before.items():
            if key not in weights_after:
                return f"{name}.{key}", "it was removed"
            what = _tensor_change(tensor, weights_after[key])
            if what:
                return f"{name}.{key}", what
        return None
    if isinstance(before, tuple | list):
        for i, (b, a) in enumerate(zip(before, after, strict=False)):
            change = _in_place_change(f"{name}[{i}]", b, a)
            if change:
                return change
    return None


# ---------------------------------------------------------------- running the answer, with a time limit


class _TimeLimitReached(BaseException):
    """Raised inside an answer whose time is up; a BaseException, so the answer's ``except Exception`` lets it by."""


class _StillRunning(_TimeLimitReached):
    """The time limit of the thread fallback, which cannot stop the answer."""


def _call(call: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """``(call(), None)``, or ``(None, what it raised)``. ``sys.exit()`` in an answer is a wrong answer like any
    other, not the end of the reader's kernel; a KeyboardInterrupt (the reader pressing stop) goes through."""
    try:
        return call(), None
    except (Exception, SystemExit) as e:
        return None, e


def _can_use_alarm() -> bool:
    """SIGALRM can interrupt the answer: we are the main thread and nobody else uses the alarm (pytest-timeout)."""
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None)
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    )


def _run_with_alarm(call: Callable[[], Any], seconds: float) -> tuple[Any, BaseException | None]:
    """:func:`_call` in this (main) thread; SIGALRM interrupts it after ``seconds``, and again every
    :data:`_ALARM_REPEAT_SECONDS` while it runs, should it swallow the interruption (POSIX: Linux, macOS, Colab).
    SIGALRM does not go through SIGINT: an answer that ignores SIGINT is stopped all the same."""
    running, fired = True, False

    def on_alarm(signum: int, frame: Any) -> None:
        nonlocal fired
        fired = True  # an answer that returns after its time is up fails all the same
        if running:
            raise _TimeLimitReached

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds, _ALARM_REPEAT_SECONDS)
        outcome = _call(call)
    except _TimeLimitReached as e:  # in the answer, or just after it returned
        outcome = None, e
    finally:
        running = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return (None, _TimeLimitReached()) if fired else outcome


def _run_in_thread(call: Callable[[], Any], seconds: float) -> tuple[Any, BaseException | None]:
    """:func:`_call` in a daemon thread, waiting at most ``seconds`` (where SIGALRM is not available). Python cannot
    kill a thread: an answer that never returns runs on, on its own copies of the inputs, until the kernel restarts."""
    outcome: list[tuple[Any, BaseException | None]] = []
    grad_enabled = torch.is_grad_enabled()  # grad mode is per thread: carry the checker's torch.no_grad() over

    def run() -> None:
        with torch.set_grad_enabled(grad_enabled):
            try:
                outcome.append(_call(call))
            except BaseException as e:  # a thread cannot pass anything on
                outcome.append((None, e))

    thread = threading.Thread(target=run, name="exercise checker: the answer", daemon=True)
    thread.start()
    thread.join(seconds)
    return outcome[0] if outcome else (None, _StillRunning())


# ---------------------------------------------------------------- one case: what went wrong, and the hint

_Failure = tuple[str, str | Hint]  # (what is wrong, the hint)
ErrorHint = str | Hint | Callable[[BaseException], str | Hint]  # a hint, or one function of the exception

_TIMEOUT_HINT = (
    "look for a loop that never ends (a `while` whose condition never changes), or one over every "
    "element where a tensor operation would do."
)
_EXIT_HINT = "sys.exit(), exit() and quit() end the whole program: give the result back with return."
_IN_PLACE_HINT = (
    "don't write into the tensors you are given: operations ending in an underscore (x.zero_(), "
    "x.masked_fill_(...)), x[...] = ... and x += ... change the caller's tensor. Compute a new one instead "
    "(x.masked_fill(...), x = x + ...), or start from x = x.clone()."
)


def _error_failure(
    error: BaseException | None, seconds: float, error_hint: ErrorHint, hint: str | Hint
) -> _Failure | None:
    """The answer raised ``error`` or ran out of time: say so, with ``error_hint`` (maybe a function of the
    exception) or ``hint``."""
    if error is None:
        return None
    if isinstance(error, _TimeLimitReached):
        background = " (it may still be running in the background)" if isinstance(error, _StillRunning) else ""
        return f"took longer than {seconds:g} s: an infinite loop?{background}", _TIMEOUT_HINT
    what = f"raised {type(error).__name__}" + (f": {error}" if str(error) else "")
    if isinstance(error, SystemExit):
        return what, _EXIT_HINT
    try:
        specific = error_hint(error) if callable(error_hint) else error_hint
    except Exception:
        specific = ""
    return what, specific or hint


def _in_place_failure(inputs: dict[str, Any], copies: dict[str, Any]) -> _Failure | None:
    for input_name, original in inputs.items():
        try:
            change = _in_place_change(input_name, original, copies[input_name])
        except Exception as e:
            change = (input_name, f"it can no longer be compared ({type(e).__name__}: {e})")
        if change:
            where, what = change
            return f"your function changed its input in place ({where}): {what}", _IN_PLACE_HINT
    return None


def _result_failure(got: Any, expected: Any, bugs: tuple[Bug, ...], hint: str | Hint, atol: float) -> _Failure | None:
    try:  # an odd result (sparse, on another device, a subclass) must not crash the checker either
        problem = _difference(got, expected, atol)
    except Exception as e:
        return f"could not compare your result with the expected one: {type(e).__name__}: {e}", hint
    if problem is None:
        return None
    return problem, _hint_of_matching_bugs(got, expected, bugs, atol) or hint


def _hint_of_matching_bugs(got: Any, expected: Any, bugs: tuple[Bug, ...], atol: float) -> str | Hint:
    """The hint of the first bug that gives ``got`` (NaN read as 0: a softmax over all -inf still identifies the
    bug that made it), merged ("one of") with the later ones that give it too and have the same fix; a bug that
    is right on this case is skipped. A table lists a combination of two bugs before either alone."""
    hints: list[Hint] = []
    for bug in bugs:
        try:
            wrong = bug.fn()
            if _difference(wrong, expected, atol) is not None and _difference(_nan_to_zero(got), wrong, atol) is None:
                hints.append(_as_hint(bug.hint))
        except Exception:
            continue
    if not hints:
        return ""
    same = list(dict.fromkeys(h for h in hints if h.fix == hints[0].fix))
    if len(same) == 1:
        return same[0]
    concepts = " Or ".join(f"({i}) {h.concept}" for i, h in enumerate(same, 1))
    return Hint(f"one of {len(same)} mistakes that give this same result here: {concepts}", same[0].fix)


def _as_bugs(bugs: Iterable[Bug] | Mapping[Any, str | Hint], expected: Any) -> tuple[Bug, ...]:
    """``bugs`` as :class:`Bug` objects: a prediction's ``{wrong value: hint}`` (floats if ``expected`` is one)."""
    if not isinstance(bugs, Mapping):
        return tuple(bugs)
    as_float = isinstance(expected, float)
    return tuple(Bug(functools.partial(_identity, float(v) if as_float else v), h) for v, h in bugs.items())


def _identity(value: Any) -> Any:
    return value


def _profiled(codes: dict[CodeType | str, str], called: set[str], call: Callable[[], Any]) -> Any:
    """``call()``, adding to ``called`` the name of each function of ``codes`` that it runs."""

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        key = frame.f_code if event == "call" else getattr(arg, "__name__", None) if event == "c_call" else None
        if key in codes:
            called.add(codes[key])

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        return call()
    finally:
        sys.setprofile(previous)


def _code_objects(functions: Iterable[Any]) -> dict[CodeType | str, str]:
    """The code of each function, and of each method of each class, by the function's (or class's) name; a function
    written in C (``torch.softmax``, ``Tensor.softmax``), which has no code, by its own name."""
    codes: dict[CodeType | str, str] = {}
    for f in functions:
        if inspect.isbuiltin(f) or inspect.ismethoddescriptor(f):
            codes[f.__name__] = f.__name__
        for member in vars(f).values() if isinstance(f, type) else (f,):
            code = getattr(inspect.unwrap(member), "__code__", None) if callable(member) else None
            if isinstance(code, CodeType):
                codes[code] = f.__name__
    return codes


class Checker:
    """Runs a checker's cases: one feedback line per case, the failed cases' hints, the number of failures."""

    def __init__(self, title: str, timeout_seconds: float | None = None, spot_the_bug: bool = False) -> None:
        self.title, self.failures, self.spot_the_bug = title, 0, spot_the_bug
        self.lines: list[str] = []  # one per case
        self.outcomes: list[tuple[str, Hint | None]] = []  # (case, its hint if it failed), one per case
        self.hints: list[Hint] = []  # of the failed cases, each once, in order
        self.timeout_seconds = timeout_seconds  # None: CASE_TIMEOUT_SECONDS, read when a case runs
        self._refused: dict[CodeType | str, str] = {}  # the library's functions the answer must not call
        self._called: set[str] = set()  # those it called

    @contextlib.contextmanager
    def refuse_library_calls(self, *functions: Any, name: str, hint: str | Hint) -> Iterator[None]:
        """Within the block, watch the answer for calls of ``functions`` (or of a class's methods), the library's
        own answer to the exercise; after it, if it called any, one more failed case ``name`` lists them."""
        self._refused, self._called = _code_objects(functions), set()
        yield
        self._refused = {}
        if self._called:  # right values, perhaps, but not the exercise: one more failed case
            self._fail(name, "your answer calls " + ", ".join(sorted(self._called)), hint)

    def case(
        self,
        name: str,
        answer: Callable[..., Any],
        expected: Any,
        bugs: Iterable[Bug] | Mapping[Any, str | Hint] = (),
        hint: str | Hint = "",
        error_hint: ErrorHint = "",
        atol: float = 1e-5,
        inputs: dict[str, Any] | None = None,
    ) -> None:
        """Run ``answer`` on copies of ``inputs`` (keyword arguments; changing them in place fails the case), compare
        with ``expected``; if it differs, name the matching ``bugs``, :class:`Bug` objects (:func:`bug_table`) or a
        prediction's ``{wrong value: hint}``. ``error_hint``, the hint when the answer raises, may be a function of
        the exception."""
        expected = _independent_copy(expected)
        inputs = inputs or {}
        copies = copy.deepcopy(inputs)  # one copy per object: aliased inputs (key is value) stay aliased
        seconds = CASE_TIMEOUT_SECONDS if self.timeout_seconds is None else self.timeout_seconds
        got, error = self._run(lambda: answer(**copies), seconds)
        failure = (
            _error_failure(error, seconds, error_hint, hint)
            or _in_place_failure(inputs, copies)
            or _result_failure(got, expected, _as_bugs(bugs, expected), hint, atol)
        )
        if failure:
            self._fail(name, *failure)
        else:
            self.lines.append(f"  ✅ {name}")
            self.outcomes.append((name, None))

    def cases(
        self,
        answer: Callable[..., Any],
        cases: Iterable[tuple[str, dict[str, Any]]],
        reference: Callable[..., Any],
        bugs: Mapping[str, str | Hint] | None = None,
        wrong: Callable[..., Any] | None = None,
        **options: Any,
    ) -> None:
        """One :meth:`case` per ``(name, inputs)`` of ``cases``, which passes the inputs in order:
        ``answer(*inputs.values())`` against ``reference(*inputs.values())``, and the bug table ``bugs`` from
        ``wrong(*inputs.values(), bug=...)`` (``wrong`` defaults to ``reference``). ``options`` (``hint``,
        ``error_hint``, ``atol``) go to every case."""
        for name, inputs in cases:
            args = tuple(inputs.values())
            table = bug_table(bugs or {}, wrong or reference, *args)
            self.case(name, lambda **given: answer(*given.values()), reference(*args), table, inputs=inputs, **options)

    def _run(self, call: Callable[[], Any], seconds: float) -> tuple[Any, BaseException | None]:
        """``call()`` within ``seconds`` (SIGALRM where possible), watched for the refused library calls."""
        run = _run_with_alarm if _can_use_alarm() else _run_in_thread
        if not self._refused:
            return run(call, seconds)
        codes, called = self._refused, self._called
        return run(lambda: _profiled(codes, called, call), seconds)

    def _fail(self, name: str, problem: str, hint: str | Hint) -> None:
        self.failures += 1
        self.lines.append(f"  ❌ {name}: {problem}")
        hint = _as_hint(hint)
        self.outcomes.append((name, hint))
        if (hint.concept or hint.fix) and hint not in self.hints:
            self.hints.append(hint)

    def done(self, quiet: bool = False) -> CheckResult:
        """The summary, one line per case, then each distinct concept of the failed cases' hints once (a *Spot the
        bug*'s diagnoses replaced by its symptom) and how to see their fixes, as a :class:`CheckResult`, printed
        unless ``quiet``."""
        n = len(self.lines)
        passed = self.failures == 0
        summary = f"All {n} checks passed." if passed else f"{self.failures} of {n} checks failed."
        held = [h for h in self.hints if self.spot_the_bug and h.fix]  # diagnoses, for check_x.hint()
        concepts = dict.fromkeys(h.concept for h in self.hints if h.concept and h not in held)
        fixes = list(dict.fromkeys(h.fix for h in self.hints if h.fix))
        lines = [*self.lines, *(f"  Hint: {concept}" for concept in concepts)]
        lines += [f"  Hint: {self._symptom()}"] if held else []
        if fixes:
            lines.append(
                f"  For the fix in code: {self.title}.hint()" + (" (first, what the symptom means)" if held else "")
            )
        diagnoses = list(dict.fromkeys(h.concept for h in held if h.concept))
        result = CheckResult(f"{self.title}: {summary}", passed, lines, fixes=fixes, diagnoses=diagnoses)
        if not quiet:
            print(result.text)
        return result

    def _symptom(self) -> str:
        """A *Spot the bug*'s printed hint: the first case failed with a diagnosis against the first that passed."""
        failed = next(name for name, hint in self.outcomes if hint and hint.fix)
        right = next((name for name, hint in self.outcomes if hint is None), None)
        if right is None:
            return f'no case passes: start from "{failed}", and how your result there differs from the expected one.'
        return f'"{failed}" fails where "{right}" passes: what does the first case have that the second lacks?'


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


def _stub() -> None: ...


def _instructions(code: Any) -> list[tuple[str, Any]]:
    return [(i.opname, i.argval) for i in dis.get_instructions(code)]


_STUB_CODE = _instructions(_stub.__code__)  # a body of only `...`, `pass` or a docstring compiles to this


def is_unanswered(answer: Any) -> bool:
    """Whether ``answer`` is still the starter cell's placeholder: ``...`` (or None), or a function whose
    body is only ``...`` / ``pass`` (decorators such as ``@torch.no_grad()`` are looked through)."""
    if answer is ... or answer is None:
        return True
    function = inspect.unwrap(answer) if callable(answer) else None
    code = getattr(function, "__code__", None)
    return code is not None and _instructions(code) == _STUB_CODE


_FUTURE_FLAGS = sum(getattr(__future__, f).compiler_flag for f in __future__.all_feature_names if f != "nested_scopes")


def _normalised(code: CodeType) -> CodeType:
    """``code`` and the code nested in it without names, file, line numbers and ``from __future__`` flags: two
    sources that differ only in whitespace, comments or blank lines compile to equal normalised code; any other
    change does not."""
    consts = tuple(_normalised(c) if isinstance(c, CodeType) else c for c in code.co_consts)
    if sys.version_info >= (3, 11):
        code = code.replace(co_qualname="")
    return code.replace(
        co_name="",
        co_filename="",
        co_firstlineno=1,
        co_linetable=b"",
        co_flags=code.co_flags & ~_FUTURE_FLAGS,
        co_consts=consts,
    )


def _compiled(source: str) -> CodeType:
    """``source`` (a notebook cell) compiled as a module, without this file's ``from __future__`` imports."""
    return compile(source, "<cell>", "exec", dont_inherit=True)


def _methods(namespace: Mapping[str, Any]) -> dict[str, CodeType]:
    """The normalised code of the functions in a class's ``namespace`` (decorators looked through)."""
    methods = {}
    for name, value in namespace.items():
        function = inspect.unwrap(getattr(value, "__func__", getattr(value, "fget", value)))
        if isinstance(getattr(function, "__code__", None), CodeType):
            methods[name] = _normalised(function.__code__)
    return methods


def _is_starter(answer: Any, cell: CodeType) -> bool:
    """Whether ``answer``, a function or a class, has the code of one that the starter ``cell`` defines. A
    class is compared by its methods' code (a class body's nested code objects), and only functions' code
    is compared: not their defaults, nor a class's bases and attributes."""
    definitions = [c for c in cell.co_consts if isinstance(c, CodeType)]  # the cell's functions and class bodies
    if isinstance(answer, type):
        methods = _methods(vars(answer))
        bodies = [{c.co_name: _normalised(c) for c in b.co_consts if isinstance(c, CodeType)} for b in definitions]
        return bool(methods) and methods in bodies
    code = getattr(inspect.unwrap(answer), "__code__", None) if callable(answer) else None
    return isinstance(code, CodeType) and _normalised(code) in map(_normalised, definitions)


def _not_answered(title: str, answer: str, spot_the_bug: bool = False) -> CheckResult:
    if spot_the_bug:
        where = "fix the bug in the cell marked `# find and fix the bug`"
    elif answer == "function":
        where = "write your function in the cell marked `# your code here`"
    else:
        where = "replace the `...` in the cell marked `# your number here` with your prediction"
    return CheckResult(f"{title}: {NOT_ANSWERED}: {where}, run that cell, then this one.", False, status="unanswered")


def _fixes_text(title: str, last: CheckResult | None) -> str:
    """What ``check_x.hint()`` prints: the fixes in code of the checker's last call, or why there are none."""
    if last is None:
        return f"{title}: no answer checked yet: run the cell that calls {title} first."
    if last.passed:
        return f"{title}: your last answer passed: there is nothing to fix."
    if last.status == "unanswered":
        return f"{title}: {NOT_ANSWERED}: try it first; then, if a check fails, ask again."
    if not last.fixes:
        return f"{title}: no fix in code for this feedback: reread the hint above it."
    means = [f"{title}: what the symptom of your last answer means:", *(f"  - {d}" for d in last.diagnoses)]
    fixes = [f"{title}: the fix in code for your last answer:", *(f"  - {fix}" for fix in last.fixes)]
    return "\n".join([*(means if last.diagnoses else []), *fixes])


_LATEST: dict[str, dict[str, Any]] = {}  # checker -> the record of its last call in this process


def grader_records() -> str:
    """The record of each checker's last call in this process, as a JSON list: what the grader asks the kernel
    for after every cell (in the execute request's ``user_expressions``, whose value comes back in the reply)."""
    return json.dumps(list(_LATEST.values()))


def _record(result: CheckResult) -> None:
    """Keep ``result`` for :func:`grader_records`, and append it to the JSON-lines file named by
    :data:`RESULTS_ENV`, if set."""
    name = result.title.split(":", 1)[0]
    record = {"checker": name, "status": result.status, "passed": result.passed, "feedback": result.text}
    _LATEST.pop(name, None)
    _LATEST[name] = record
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


REGISTRY: dict[str, dict[str, Any]] = {}
"""Every chapter's checkers: chapter module (``transformer_lib.notebook.exercises.ch01_attention``) -> checker
name -> the public checker, in the order they are defined. ``@checker`` fills it; the package exports them."""

_ANSWER_KINDS = ("function", "value")


def _run_checker(body: Callable[..., None], given: Any, answer: str, starter: CodeType | None) -> CheckResult:
    """``body``'s cases on the answer ``given``, or why they do not run (not answered yet; not a function)."""
    title = body.__name__
    if is_unanswered(given) or starter is not None and _is_starter(given, starter):
        return _not_answered(title, answer, spot_the_bug=starter is not None)
    if answer == "function" and not callable(given):
        return CheckResult(f"{title}: expected a function, got {type(given).__name__}", False)
    c = Checker(title, spot_the_bug=starter is not None)
    with _random_state_kept():  # the hidden cases and the answer must not disturb the reader's random streams
        body(c, given)
    return c.done(quiet=True)


def _public_signature(check: Any, body: Callable[..., Any]) -> None:
    """``check(answer, /) -> CheckResult``: ``body``'s signature without its Checker argument, for help()."""
    _, parameter = inspect.signature(body).parameters.values()
    check.__signature__ = inspect.Signature(
        [parameter.replace(kind=inspect.Parameter.POSITIONAL_ONLY)], return_annotation="CheckResult"
    )
    check.__annotations__ = {k: v for k, v in body.__annotations__.items() if k == parameter.name}
    check.__annotations__["return"] = CheckResult


def checker(
    body: Callable[[Checker, Any], None] | None = None,
    /,
    *,
    answer: str = "function",
    starter: str | None = None,
    reference: Any = None,
) -> Any:
    """Turn ``body(c, answer)`` into the public ``check_<name>(answer) -> CheckResult``, registered in
    :data:`REGISTRY` under its chapter module, with ``check_<name>.hint()`` printing its last call's fixes.

    ``answer="value"`` checks a prediction, passed to ``body`` as it is. An unanswered starter (``...``, or the
    code of a function or class that ``starter``, a *Spot the bug* cell's source, defines) gets "not answered
    yet"; every call is recorded for the grader. ``reference`` is a right answer found independently where
    possible, which the shared tests hand to the checker.
    """
    _validate_checker_arguments(answer, starter)
    if body is None:
        return functools.partial(checker, answer=answer, starter=starter, reference=reference)
    check = _public_checker(body, answer, starter)
    vars(check).update(answer_kind=answer, starter=starter, reference=reference)
    if (body.__module__ or "").startswith(__name__.rpartition(".")[0] + ".ch"):  # a chapter's checker, not a test's
        REGISTRY.setdefault(body.__module__, {})[body.__name__] = check
    return check


def _validate_checker_arguments(answer: str, starter: str | None) -> None:
    if answer not in _ANSWER_KINDS:
        raise ValueError(f'answer must be "function" or "value", got {answer!r}')
    if starter is not None and (answer != "function" or not isinstance(starter, str)):
        raise TypeError(
            f'starter is the source of a Spot the bug starter cell, a str, for answer="function"; got '
            f"{type(starter).__name__} with answer={answer!r}"
        )


def _public_checker(body: Callable[..., None], answer: str, starter: str | None) -> Any:
    """``check(given) -> CheckResult``, which runs ``body``, prints and records the result, with its ``hint()``."""
    title = body.__name__
    starter_cell = None if starter is None else _compiled(starter)  # a typo in it fails at import
    last: list[CheckResult] = []  # the last call's result, for check.hint()

    @functools.wraps(body)
    def check(given: Any, /) -> CheckResult:
        last[:] = [result := _run_checker(body, given, answer, starter_cell)]
        print(result.text)
        try:
            _record(result)
        except OSError as e:  # an unwritable results file must not break the reader's notebook
            print(f"(could not record the result for the grader: {e})")
        return result

    def hint() -> None:
        """Print the fixes in code for the last answer this checker failed (the feedback gives the concepts)."""
        print(_fixes_text(title, last[0] if last else None))

    _public_signature(check, body)
    hint.__qualname__ = f"{title}.hint"
    vars(check)["hint"] = hint
    return check

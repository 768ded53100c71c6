"""The checkers accept right answers and name the classic bugs in wrong ones, without crashing."""

import ast
import functools
import importlib
import inspect
import json
import math
import random
import re
import sys
import threading
import time
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_lib.notebook import exercises as ex
from transformer_lib.notebook.exercises import (
    _framework,
    catalogue,
)

# ---------------------------------------------------------------- the framework: @checker and the package layout

CHAPTER_CHECKERS = {module: set(_framework.REGISTRY[module.__name__]) for module in ex.CHAPTER_MODULES}
# The right answer beside each checker (``@checker(reference=...)``): every checker must accept it.
REFERENCE_ANSWERS = {name: c.reference for name, c in ex.CHECKERS.items() if c.answer_kind == "function"}
VALUE_ANSWERS = {name: c.reference for name, c in ex.CHECKERS.items() if c.answer_kind == "value"}
CHECKERS = sorted(REFERENCE_ANSWERS)
VALUE_CHECKERS = sorted(VALUE_ANSWERS)


def test_package_exports_every_chapter_checker():
    assert len(ex.CHECKERS) == sum(map(len, CHAPTER_CHECKERS.values())) > 30  # no name in two chapters
    assert set(ex.__all__) == set(ex.CHECKERS) | {"Bug", "Checker", "CheckResult", "Hint", "bug_table", "checker"}
    for name, check in ex.CHECKERS.items():
        assert getattr(ex, name) is check and check.reference is not None, name
    chapters = sorted(p.stem for p in Path(_framework.__file__).parent.glob("ch[0-9]*.py"))
    assert [m.__name__.rsplit(".", 1)[-1] for m in ex.CHAPTER_MODULES] == chapters


@pytest.mark.parametrize("module", CHAPTER_CHECKERS, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_chapter_module_holds_only_its_chapter_checkers(module):
    defined = {name for name, value in vars(module).items() if name.startswith("check_") and callable(value)}
    assert defined == CHAPTER_CHECKERS[module]
    for name in defined:
        assert getattr(module, name).__module__ == module.__name__, name  # defined there, not imported


def test_a_checker_outside_the_chapters_is_not_registered():
    @ex.checker(reference=abs)
    def check_abs(c: ex.Checker, f) -> None:
        """Check ``f``."""

    assert check_abs.reference is abs and "check_abs" not in ex.CHECKERS
    assert __name__ not in _framework.REGISTRY


@pytest.mark.parametrize("name", CHECKERS + VALUE_CHECKERS)
def test_checker_keeps_name_docstring_and_answer_signature(name):
    check = getattr(ex, name)
    assert check.__name__ == name
    assert check.__doc__ and check.__doc__.startswith("Check ``"), name
    (parameter,) = inspect.signature(check).parameters.values()  # the Checker argument is hidden
    assert parameter.kind is inspect.Parameter.POSITIONAL_ONLY
    assert parameter.name in check.__doc__, (name, parameter.name)  # the docstring talks about the answer
    assert typing.get_type_hints(check).keys() == {parameter.name, "return"}
    assert typing.get_type_hints(check)["return"] is ex.CheckResult


@pytest.mark.parametrize("name", CHECKERS + VALUE_CHECKERS)
def test_checker_accepts_the_library_answer(name, capsys):
    result = getattr(ex, name)({**REFERENCE_ANSWERS, **VALUE_ANSWERS}[name])
    assert result.passed, result.text
    assert result.text.startswith(f"{name}: All ") and result.text in capsys.readouterr().out


def _stub_answer(x, n_heads): ...  # your code here


@torch.no_grad()
def _decorated_stub_answer(model, idx, n_new):
    """A docstring, then nothing."""
    pass


@pytest.mark.parametrize("name", CHECKERS + VALUE_CHECKERS)
@pytest.mark.parametrize("answer", [..., _stub_answer, _decorated_stub_answer], ids=["...", "stub", "decorated stub"])
def test_an_unanswered_starter_is_reported_not_graded(name, answer, capsys):
    result = getattr(ex, name)(answer)
    assert not result.passed and result.status == "unanswered"
    assert result.text.startswith(f"{name}: not answered yet: ") and not result.lines
    assert capsys.readouterr().out == result.text + "\n"


def test_a_stub_is_told_apart_from_an_answer():
    def answered(x, n_heads):
        return None  # returns nothing, but was written: same bytecode as a stub, and that is fine

    def real(x, n_heads):
        return x

    assert _framework.is_unanswered(_stub_answer) and _framework.is_unanswered(answered)
    assert not _framework.is_unanswered(real) and not _framework.is_unanswered(0.0)
    assert not _framework.is_unanswered(torch.no_grad()(real))


@pytest.mark.parametrize("name", CHECKERS + VALUE_CHECKERS)
def test_every_call_is_recorded_for_the_grader(name, tmp_path, monkeypatch):
    log = tmp_path / "results.jsonl"
    monkeypatch.setenv(_framework.RESULTS_ENV, str(log))
    check = getattr(ex, name)
    right = check({**REFERENCE_ANSWERS, **VALUE_ANSWERS}[name])
    check(...)
    wrong = check("a wrong answer")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["status"] for r in records] == ["passed", "unanswered", "failed"]
    assert all(r["checker"] == name for r in records)
    assert records[0]["passed"] and records[0]["feedback"] == right.text
    assert records[2]["feedback"] == wrong.text and not records[2]["passed"]


def test_a_results_file_that_cannot_be_written_does_not_break_the_notebook(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(_framework.RESULTS_ENV, str(tmp_path / "missing-folder" / "results.jsonl"))
    assert ex.check_packed_mask(REFERENCE_ANSWERS["check_packed_mask"]).passed
    assert "could not record the result for the grader" in capsys.readouterr().out


def test_a_value_checker_compares_floats_within_its_tolerance(capsys):
    @ex.checker(answer="value")
    def check_loss_at_init(c: ex.Checker, predicted: float) -> None:
        """Check ``predicted``, the loss of a uniform guess over 65 characters."""
        c.case("the loss", lambda: predicted, math.log(65), atol=0.01, hint="a uniform guess: ln(vocabulary size).")

    assert check_loss_at_init.answer_kind == "value"
    assert check_loss_at_init(4.17).passed and check_loss_at_init(torch.tensor(4.175)).passed
    assert check_loss_at_init(np.float32(4.18)).passed
    wrong = check_loss_at_init(65)
    assert not wrong.passed and "expected 4.17439 (within 0.01), got 65" in wrong.text and "ln(vocabulary" in wrong.text
    assert not check_loss_at_init(True).passed and not check_loss_at_init("4.17").passed
    with pytest.raises(ValueError, match='answer must be "function" or "value", got \'number\''):
        ex.checker(answer="number")


@pytest.mark.parametrize("name", CHECKERS)  # the function checkers
def test_checker_refuses_a_non_callable_answer(name, capsys):
    result = getattr(ex, name)(42)
    assert not result.passed and not result
    assert result.text == f"{name}: expected a function, got int"
    assert capsys.readouterr().out == result.text + "\n"


def _draws() -> tuple[torch.Tensor, float, float]:
    """The next draw of torch's, Python's and NumPy's global random generators."""
    return torch.rand(3), random.random(), float(np.random.rand())


def _consuming(answer):
    """``answer`` preceded by draws from every global random generator, as a careless answer would do."""

    def wrapped(*args, **kwargs):
        _draws()
        torch.manual_seed(1234)  # reseeding is the worst case: it resets the stream instead of advancing it
        return answer(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize("right", [True, False], ids=["right answer", "wrong answer"])
@pytest.mark.parametrize("name", CHECKERS)
def test_checker_restores_every_global_random_state(name, right):
    answer = REFERENCE_ANSWERS[name] if right else lambda *args, **kwargs: 1 / 0
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()
    cuda_before = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    result = getattr(ex, name)(_consuming(answer))
    assert result.passed is right, result.text
    after = _draws()
    cuda_after = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    torch.set_rng_state(before[0])
    random.setstate(before[1])
    np.random.set_state(before[2])
    expected = _draws()
    assert torch.equal(after[0], expected[0]), "torch's global random state changed"
    assert after[1] == expected[1], "Python's random state changed"
    assert after[2] == expected[2], "NumPy's global random state changed"
    if cuda_before is not None:
        assert all(torch.equal(a, b) for a, b in zip(cuda_after, cuda_before, strict=True)), "a CUDA state changed"


def test_checker_decorator_builds_a_public_checker(capsys):
    calls = []

    @ex.checker
    def check_double(c: ex.Checker, double) -> None:
        """Check ``double(x) -> 2 x``."""
        calls.append(double)
        c.case(
            "x = 3",
            lambda: double(torch.tensor(3.0)),
            torch.tensor(6.0),
            bugs=(ex.Bug(lambda: torch.tensor(9.0), "you squared x."),),
            hint="return 2 * x.",
        )

    assert check_double.__name__ == "check_double" and check_double.__doc__ == "Check ``double(x) -> 2 x``."
    assert str(inspect.signature(check_double)) == "(double, /) -> 'CheckResult'"

    refused = check_double("2 * x")
    assert isinstance(refused, ex.CheckResult) and not refused.passed
    assert refused.text == "check_double: expected a function, got str" and not calls  # the cases never ran
    assert capsys.readouterr().out == "check_double: expected a function, got str\n"

    assert check_double(lambda x: 2 * x).text == "check_double: All 1 checks passed.\n  ✅ x = 3"
    squared = check_double(lambda x: x**2)
    assert not squared.passed and "Hint: you squared x." in squared.text and "1 of 1 checks failed" in squared.text
    crashed = check_double(lambda x: x.missing())
    assert "raised AttributeError" in crashed.text and "Hint: return 2 * x." in crashed.text
    assert len(calls) == 3


# ---------------------------------------------------------------- the framework: hints in two levels

_ROWS = ex.Hint("each row must sum to 1: reread 'Softmax, row by row'.", "divide by e.sum(dim=-1, keepdim=True)")
_SHAPE = ex.Hint("the row sums must broadcast against the scores.", "sum with keepdim=True")


def _wrong_double(x, *, bug: str):
    return {"squared": x**2, "tripled": 3 * x, "plus one": 2 * x + 1}[bug]


@ex.checker
def check_double(c: ex.Checker, double) -> None:
    """Check ``double(x) -> 2 x``: a checker whose hints have two levels, and one (a str) only one."""
    table = {"squared": _ROWS, "tripled": "you tripled x: reread 'Doubling'.", "plus one": _ROWS}
    for x in (3.0, 4.0, 5.0):
        c.case(
            f"x = {x:g}",
            lambda x: double(x),
            2 * x,
            bugs=ex.bug_table(table, _wrong_double, x),
            hint=ex.Hint("double it: reread 'Doubling'.", "return 2 * x"),
            error_hint=lambda e: _SHAPE if isinstance(e, ValueError) else "",
            inputs={"x": x},
        )


def test_a_failed_check_prints_each_case_then_each_concept_once_and_keeps_the_fixes(capsys):
    result = check_double(lambda x: x**2 if x < 5 else 3 * x)  # at x = 3, x squared is 3 x: the first bug wins
    assert result.lines == [
        "  ❌ x = 3: expected 6 (within 1e-05), got 9",
        "  ❌ x = 4: expected 8 (within 1e-05), got 16",
        "  ❌ x = 5: expected 10 (within 1e-05), got 15",
        f"  Hint: {_ROWS.concept}",  # once, though two cases failed with it, in the order they came
        "  Hint: you tripled x: reread 'Doubling'.",
        "  For the fix in code: check_double.hint()",
    ]
    assert result.fixes == [_ROWS.fix] and _ROWS.fix not in result.text  # a str hint has no fix
    assert capsys.readouterr().out == result.text + "\n"

    check_double.hint()
    assert capsys.readouterr().out == f"check_double: the fix in code for your last answer:\n  - {_ROWS.fix}\n"


@pytest.mark.parametrize(
    "answer, concept, fix",
    [
        (lambda x: x + 100, "double it: reread 'Doubling'.", "return 2 * x"),  # no bug matches: the case's hint
        (lambda x: int("x"), _SHAPE.concept, _SHAPE.fix),  # an error_hint function may return a Hint
    ],
    ids=["hint", "error_hint"],
)
def test_every_hint_of_a_case_may_have_two_levels(answer, concept, fix):
    result = check_double(answer)
    assert result.text.count(f"  Hint: {concept}") == 1 and fix not in result.text
    assert result.fixes == [fix] and result.lines[-1] == "  For the fix in code: check_double.hint()"


def test_bugs_that_give_the_same_answer_and_need_the_same_fix_are_named_together():
    c = ex.Checker("check_x")
    same_fix = (ex.Bug(lambda: 9.0, ex.Hint("squared.", "2 * x")), ex.Bug(lambda: 9.0, ex.Hint("tripled.", "2 * x")))
    c.case("x = 3", lambda: 9.0, 6.0, bugs=same_fix + (ex.Bug(lambda: 9.0, ex.Hint("plus three.", "x + x")),))
    assert c.hints == [
        ex.Hint("one of 2 mistakes that give this same result here: (1) squared. Or (2) tripled.", "2 * x")
    ]
    c.case("x = 4", lambda: 16.0, 8.0, bugs={16: "squared.", 12: "tripled."})  # a prediction's wrong values
    assert c.hints[-1] == ex.Hint("squared.")


@ex.checker(starter="def double(x):  # find and fix the bug\n    return x**2\n")
def check_spot_double(c: ex.Checker, double) -> None:
    """Check ``double(x) -> 2 x``, a Spot the bug: the feedback gives the symptom, ``hint()`` the bug and its fix."""
    check_double.__wrapped__(c, double)


def test_a_spot_the_bug_prints_the_symptom_and_keeps_the_bug_for_hint(capsys):
    result = check_spot_double(lambda x: {4.0: x**2, 5.0: 3 * x}.get(x, 2 * x))
    assert result.lines == [
        "  ✅ x = 3",
        "  ❌ x = 4: expected 8 (within 1e-05), got 16",
        "  ❌ x = 5: expected 10 (within 1e-05), got 15",
        "  Hint: you tripled x: reread 'Doubling'.",  # a hint without a fix is no diagnosis: printed
        '  Hint: "x = 4" fails where "x = 3" passes: what does the first case have that the second lacks?',
        "  For the fix in code: check_spot_double.hint() (first, what the symptom means)",
    ]
    assert result.diagnoses == [_ROWS.concept] and result.fixes == [_ROWS.fix]
    capsys.readouterr()
    check_spot_double.hint()
    assert capsys.readouterr().out == (
        f"check_spot_double: what the symptom of your last answer means:\n  - {_ROWS.concept}\n"
        f"check_spot_double: the fix in code for your last answer:\n  - {_ROWS.fix}\n"
    )
    squared = check_spot_double(lambda x: x**2)
    assert squared.lines[-2] == (
        '  Hint: no case passes: start from "x = 3", and how your result there differs from the expected one.'
    )


def test_a_hint_without_a_fix_says_nothing_of_hint():
    result = check_double(lambda x: 3 * x if x != 3 else 2 * x)  # at x = 3, 3 x is x squared: that case is right
    assert result.lines[-1] == "  Hint: you tripled x: reread 'Doubling'." and result.fixes == []


def test_the_hint_call_says_why_there_is_no_fix(capsys):
    @ex.checker
    def check_halve(c: ex.Checker, halve) -> None:
        """Check ``halve(x) -> x / 2``."""
        c.case("x = 4", lambda: halve(4.0), 2.0, hint="half of it.")

    check_halve.hint()
    check_halve(lambda x: x / 2)
    check_halve.hint()
    check_halve(...)
    check_halve.hint()
    check_halve(lambda x: x)
    check_halve.hint()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "check_halve: no answer checked yet: run the cell that calls check_halve first."
    assert "check_halve: your last answer passed: there is nothing to fix." in out
    assert "check_halve: not answered yet: try it first; then, if a check fails, ask again." in out
    assert out[-1] == "check_halve: no fix in code for this feedback: reread the hint above it."


def test_the_record_for_the_grader_carries_no_fix(tmp_path, monkeypatch):
    log = tmp_path / "results.jsonl"
    monkeypatch.setenv(_framework.RESULTS_ENV, str(log))
    result = check_double(lambda x: x**2)
    assert result.fixes == [_ROWS.fix]
    (line,) = log.read_text().splitlines()
    assert _ROWS.concept in line and _ROWS.fix not in line and "fix" not in json.loads(line)


def test_a_hint_is_a_str_or_a_hint():
    c = ex.Checker("check_x")
    with pytest.raises(TypeError, match=r"a hint is a str or a Hint\(concept, fix\), got int: 3"):
        c.case("x", lambda: 1, 2, hint=3)


# ---------------------------------------------------------------- the framework: a Spot the bug's starter as given

_BUGGY_CELL = '''\
def softmax(scores):  # find and fix the bug
    """Each row's weights."""
    e = torch.exp(scores - scores.max())
    return e / e.sum(dim=0)
'''


@ex.checker(starter=_BUGGY_CELL)
def check_spot_softmax(c: ex.Checker, softmax) -> None:
    """Check ``softmax(scores)``, a Spot the bug whose starter is ``_BUGGY_CELL``."""
    scores = torch.tensor([[1.0, 2.0], [0.0, 5.0]])
    c.case("two rows", lambda scores: softmax(scores), torch.softmax(scores, -1), inputs={"scores": scores})


def _defined(source: str, name: str = "softmax"):
    namespace = {"torch": torch}
    exec(compile(source, "<a notebook cell>", "exec"), namespace)
    return namespace[name]


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s,
        lambda s: s.replace("# find and fix the bug", "# I looked at it"),
        lambda s: "\n\n" + s.replace("    e = ", "\n    e  =  ").replace("(dim=0)", "( dim = 0 )  # the sum"),
        lambda s: "from __future__ import annotations\n" + s,  # as after such a cell in the notebook
    ],
    ids=["as given", "a comment changed", "whitespace changed", "under a __future__ import"],
)
def test_an_untouched_spot_the_bug_starter_is_not_answered_yet(edit, capsys):
    result = check_spot_softmax(_defined(edit(_BUGGY_CELL)))
    assert result.status == "unanswered" and not result.lines
    assert result.text == (
        "check_spot_softmax: not answered yet: fix the bug in the cell marked `# find and fix the bug`, "
        "run that cell, then this one."
    )


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.replace("scores.max()", "scores.max(dim=-1, keepdim=True).values"),  # half the fix
        lambda s: s.replace('"""Each row\'s weights."""', '"""Each row\'s weights, fixed."""'),  # the docstring
        lambda s: s.replace("e / e.sum", "e / 1 / e.sum"),
    ],
    ids=["half fixed", "docstring", "a no-op"],
)
def test_a_changed_spot_the_bug_answer_is_graded(edit):
    result = check_spot_softmax(_defined(edit(_BUGGY_CELL)))
    assert result.status == "failed" and "1 of 1 checks failed" in result.text, result.text
    fixed = _BUGGY_CELL.replace("scores.max()", "scores.max(-1, keepdim=True).values")
    fixed = fixed.replace("dim=0", "dim=-1, keepdim=True")
    assert check_spot_softmax(_defined(fixed)).passed
    assert check_spot_softmax(lambda scores: _defined(_BUGGY_CELL)(scores)).status == "failed"  # a wrapper is code


_BUGGY_CLASS_CELL = """\
class Scale(nn.Module):  # find and fix the bug
    def __init__(self, features, eps=1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return x / (x.std(-1, keepdim=True) + self.eps)
"""


def test_a_class_starter_is_compared_by_its_methods():
    cell = _framework._compiled(_BUGGY_CLASS_CELL)
    namespace = {"nn": torch.nn}
    exec(_BUGGY_CLASS_CELL.replace("  # find and fix the bug", "\n\n"), namespace)
    assert _framework._is_starter(namespace["Scale"], cell)
    exec(_BUGGY_CLASS_CELL.replace("x.std(-1, keepdim=True)", "x.std(-1, keepdim=True, correction=0)"), namespace)
    assert not _framework._is_starter(namespace["Scale"], cell)
    assert not _framework._is_starter(type("Subclass", (namespace["Scale"],), {}), cell)  # no methods of its own
    assert not _framework._is_starter(torch.softmax, cell) and not _framework._is_starter(3, cell)


def _same_code(source: str, other: str) -> bool:
    """Whether two cells' sources are the same code: they may differ in whitespace and comments only."""
    return _framework._normalised(_framework._compiled(source)) == _framework._normalised(_framework._compiled(other))


def test_same_code_ignores_whitespace_and_comments_only():
    assert _same_code(_BUGGY_CELL, "# a comment\n" + _BUGGY_CELL.replace("  # find and fix the bug", ""))
    assert not _same_code(_BUGGY_CELL, _BUGGY_CELL.replace("dim=0", "dim=-1"))
    assert not _same_code(_BUGGY_CELL, "import torch\n" + _BUGGY_CELL)


def test_a_starter_is_declared_as_the_source_of_a_function_checker():
    assert check_spot_softmax.starter == _BUGGY_CELL and check_double.starter is None
    with pytest.raises(TypeError, match="starter is the source of a Spot the bug starter cell, a str, for answer="):
        ex.checker(answer="value", starter=_BUGGY_CELL)
    with pytest.raises(SyntaxError):  # a typo in the declared starter shows when its module is imported

        @ex.checker(starter="def softmax(scores:\n")
        def check_typo(c: ex.Checker, softmax) -> None:
            """Check ``softmax``."""


# ---------------------------------------------------------------- the framework: inputs the answer changes in place


def _good_split_heads(x, n_heads):
    B, T, d = x.shape
    return x.view(B, T, n_heads, d // n_heads).transpose(1, 2).reshape(B * n_heads, T, d // n_heads)


def test_split_heads_fails_an_answer_that_zeroes_its_input():
    def zeroing(x, n_heads):  # returns a view of its zeroed input: it used to equal an expected view of x
        x.zero_()
        return _good_split_heads(x, n_heads)

    result = ex.check_split_heads(zeroing)
    assert not result.passed
    assert result.text.count("your function changed its input in place (x)") == 3, result.text
    assert "x.zero_()" in result.text  # the hint names the culprits
    assert ex.check_split_heads(_good_split_heads).passed  # the checker's own inputs were left alone


def _then_changing_its_inputs(answer):
    """``answer`` that, after computing its result, writes into every tensor it was given."""

    def wrapped(*args, **kwargs):
        result = answer(*args, **kwargs)
        for t in (*args, *kwargs.values()):
            if isinstance(t, torch.Tensor):
                t.logical_not_() if t.dtype == torch.bool else t.add_(1)
        return result

    return wrapped


TENSOR_INPUT_CHECKERS = list(CHECKERS)
TENSOR_INPUT_CHECKERS.remove("check_sinusoidal_encoding")  # these are given integers only
TENSOR_INPUT_CHECKERS.remove("check_alibi")  # integers
TENSOR_INPUT_CHECKERS.remove("check_swiglu_hidden")  # integers
TENSOR_INPUT_CHECKERS.remove("check_one_f_one_b")  # integers
TENSOR_INPUT_CHECKERS.remove("check_encode_word")  # strings
TENSOR_INPUT_CHECKERS.remove("check_layer_norm_module")  # a class built from integers; see test_exercises_ch05.py
TENSOR_INPUT_CHECKERS.remove("check_accumulate")  # a model and a list of micro-batches; see test_exercises_ch08.py
TENSOR_INPUT_CHECKERS.remove("check_scaled_step")  # given nothing: it builds its own model, optimizer and scaler


@pytest.mark.parametrize("name", TENSOR_INPUT_CHECKERS)
def test_an_answer_that_changes_its_inputs_fails(name):
    result = getattr(ex, name)(_then_changing_its_inputs(REFERENCE_ANSWERS[name]))
    assert not result.passed and "✅" not in result.text, result.text
    assert "your function changed its input in place (" in result.text, result.text
    assert getattr(ex, name)(REFERENCE_ANSWERS[name]).passed  # and the next answer is checked on clean inputs


def test_an_answer_that_changes_a_module_it_is_given_fails():
    def zeroes_the_output_projection(mha, query, key, value):
        out = mha(query, key, value)
        mha.out_proj.weight.zero_()
        return out

    result = ex.check_multi_head_attention(zeroes_the_output_projection)
    assert result.text.count("changed its input in place (mha.out_proj.weight)") == 4, result.text
    assert ex.check_multi_head_attention(REFERENCE_ANSWERS["check_multi_head_attention"]).passed


def test_an_answer_that_keeps_its_inputs_passes_even_if_they_alias():
    seen = []

    def records_aliasing(mha, query, key, value):  # self-attention: the checker passes key as value too
        seen.append(key is value)
        return mha(query, key, value)

    assert ex.check_multi_head_attention(records_aliasing).passed
    assert seen == [True, True, True, True]


# ---------------------------------------------------------------- the framework: odd tensors never crash a checker


@pytest.mark.parametrize(
    "odd, words",
    [
        (lambda t: torch.empty(t.shape, device="meta"), "got a dense tensor on meta"),
        (lambda t: t.to_sparse(), "got a sparse_coo tensor on cpu"),
    ],
    ids=["meta device", "sparse"],
)
@pytest.mark.parametrize("name", ["check_split_heads", "check_distance_attention", "check_pre_ln_block"])
def test_a_tensor_on_another_device_or_sparse_gets_feedback_not_a_crash(name, odd, words):
    reference = REFERENCE_ANSWERS[name]

    def answer(*args, **kwargs):
        got = reference(*args, **kwargs)
        return tuple(odd(t) for t in got) if isinstance(got, tuple) else odd(got)

    result = getattr(ex, name)(answer)
    assert not result.passed and "✅" not in result.text
    assert "expected a dense tensor on the CPU" in result.text and words in result.text, result.text


def test_the_comparison_is_guarded_too(monkeypatch):
    def broken_difference(got, expected, atol=1e-5):
        raise RuntimeError("an odd result")

    monkeypatch.setattr(_framework, "_difference", broken_difference)
    result = ex.check_split_heads(_good_split_heads)
    assert not result.passed
    assert "could not compare your result with the expected one: RuntimeError: an odd result" in result.text


# ---------------------------------------------------------------- the framework: a time limit per case


def _hangs_for_three_examples(x, n_heads):
    if x.shape[0] == 3:  # the second case only: B=3
        while True:
            pass
    return _good_split_heads(x, n_heads)


def test_a_case_that_never_returns_fails_and_the_others_still_run(monkeypatch):
    monkeypatch.setattr(_framework, "CASE_TIMEOUT_SECONDS", 0.2)
    start = time.monotonic()
    result = ex.check_split_heads(_hangs_for_three_examples)
    assert time.monotonic() - start < 5
    assert "1 of 3 checks failed" in result.text, result.text
    assert "❌ B=3, T=5, d_model=12, n_heads=3: took longer than 0.2 s: an infinite loop?" in result.text
    assert "✅ B=1" in result.text and "✅ B=2" in result.text  # the case after the hung one ran
    assert "background" not in result.text  # in the main thread, SIGALRM stopped the loop


def test_an_answer_cannot_swallow_its_time_limit():
    def swallows(x, n_heads):
        try:
            time.sleep(30)
        except BaseException:  # even a bare except: the time limit is reported, and interrupts again
            pass
        if x.shape[0] == 3:
            time.sleep(30)
        return _good_split_heads(x, n_heads)

    start = time.monotonic()
    c = ex.Checker("check_swallowing", timeout_seconds=0.2)
    for B in (1, 3):
        x = torch.randn(B, 4, 8)
        c.case(
            f"B={B}", lambda x, n_heads: swallows(x, n_heads), _good_split_heads(x, 2), inputs={"x": x, "n_heads": 2}
        )
    result = c.done()
    assert time.monotonic() - start < 5
    assert result.text.count("took longer than 0.2 s") == 2, result.text  # returning after the limit is no pass


def test_the_time_limit_falls_back_to_a_thread_outside_the_main_thread(monkeypatch):
    monkeypatch.setattr(_framework, "CASE_TIMEOUT_SECONDS", 0.2)
    release = threading.Event()

    def blocks_for_three_examples(x, n_heads):
        if x.shape[0] == 3:
            release.wait(30)
        return _good_split_heads(x, n_heads)

    results = []
    worker = threading.Thread(target=lambda: results.append(ex.check_split_heads(blocks_for_three_examples)))
    start = time.monotonic()
    worker.start()
    worker.join(10)
    release.set()  # let the abandoned answer finish
    assert time.monotonic() - start < 5 and results
    text = results[0].text
    assert "1 of 3 checks failed" in text, text
    assert "took longer than 0.2 s: an infinite loop? (it may still be running in the background)" in text
    assert "✅ B=1" in text and "✅ B=2" in text


def test_a_checker_carries_no_grad_into_the_thread_fallback():
    grad_modes = []

    def records_grad_mode(x):
        grad_modes.append(torch.is_grad_enabled())
        return x

    def run():
        c = ex.Checker("check_grad_mode")
        with torch.no_grad():
            c.case("x", lambda x: records_grad_mode(x), torch.ones(2), inputs={"x": torch.ones(2)})
        assert c.failures == 0

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(10)
    assert grad_modes == [False]


def test_a_timeout_leaves_no_alarm_behind():
    import signal

    c = ex.Checker("check_alarm", timeout_seconds=0.05)
    c.case("hangs", lambda: time.sleep(5), torch.tensor(1.0))
    assert c.failures == 1
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)


def test_an_answer_that_ignores_sigint_still_stops_at_the_time_limit():
    import signal

    def ignores_sigint_and_loops():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            pass

    default = signal.getsignal(signal.SIGINT)
    try:
        c = ex.Checker("check_loop", timeout_seconds=0.2)
        c.case("loops", ignores_sigint_and_loops, torch.tensor(1.0))
    finally:
        signal.signal(signal.SIGINT, default)
    assert "took longer than 0.2 s: an infinite loop?" in c.done(quiet=True).text


# ---------------------------------------------------------------- the framework: sys.exit, KeyboardInterrupt, dtypes


@pytest.mark.parametrize("code, says", [(None, "raised SystemExit"), (3, "raised SystemExit: 3")])
def test_sys_exit_in_an_answer_is_a_failed_case_with_feedback_and_a_record(code, says, tmp_path, monkeypatch, capsys):
    log = tmp_path / "results.jsonl"
    monkeypatch.setenv(_framework.RESULTS_ENV, str(log))

    def exits_for_three_examples(x, n_heads):
        if x.shape[0] == 3:
            sys.exit(code)
        return _good_split_heads(x, n_heads)

    result = ex.check_split_heads(exits_for_three_examples)
    assert "1 of 3 checks failed" in result.text and "✅ B=2" in result.text, result.text  # the next case ran
    assert f"❌ B=3, T=5, d_model=12, n_heads=3: {says}\n" in result.text + "\n"
    assert "Hint: sys.exit(), exit() and quit() end the whole program: give the result back with return." in result.text
    assert result.text in capsys.readouterr().out
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record == {"checker": "check_split_heads", "status": "failed", "passed": False, "feedback": result.text}


def test_keyboard_interrupt_still_stops_the_checker(tmp_path, monkeypatch):
    import signal

    log = tmp_path / "results.jsonl"
    monkeypatch.setenv(_framework.RESULTS_ENV, str(log))

    def interrupted(x, n_heads):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ex.check_split_heads(interrupted)
    assert not log.exists()  # the reader stopped the checker: nothing to grade
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_result_of_a_lower_precision_says_so(dtype):
    softmax = ex.check_softmax.reference
    result = ex.check_softmax(lambda scores: softmax(scores.to(dtype)))
    assert not result.passed
    assert f"(your result has dtype {dtype}, the expected one torch.float32)" in result.text, result.text
    assert ex.check_softmax(lambda scores: softmax(scores.double())).passed  # close enough: no hint
    assert "dtype" not in ex.check_softmax(lambda scores: softmax(scores.double()) * 2).text  # not the cause


# ---------------------------------------------------------------- CONTRIBUTING.md's worked example

CONTRIBUTING = Path(__file__).resolve().parent.parent / "CONTRIBUTING.md"


def _block_after(marker: str, text: str) -> str:
    """The first fenced code block after ``marker`` in ``text``."""
    return re.search(r"```\w+\n(.*?)```", text[text.index(marker) :], re.S).group(1)


def test_the_guides_worked_example_runs_and_prints_what_the_guide_shows(capsys):
    text = CONTRIBUTING.read_text(encoding="utf-8")
    example: dict = {}
    exec(compile(_block_after("<!-- worked example: ", text), str(CONTRIBUTING), "exec"), example)
    check_mean_pool = example["check_mean_pool"]

    printed = check_mean_pool(lambda x, mask: x.mean(dim=1)).text + "\n"
    assert printed == _block_after("<!-- worked example output -->", text)
    capsys.readouterr()
    check_mean_pool.hint()
    assert capsys.readouterr().out == _block_after("<!-- worked example fix -->", text)

    def by_a_loop(x, mask):  # a right answer written another way than the reference
        return torch.stack([x[b, mask[b]].mean(dim=0) for b in range(x.shape[0])])

    assert check_mean_pool(check_mean_pool.reference).passed and "check_mean_pool" not in ex.CHECKERS
    right = check_mean_pool(by_a_loop)
    assert right.passed and f"`{right.title}`" in text  # the guide quotes its first line
    for bug, hint in example["_MEAN_POOL_BUGS"].items():  # each row of the table names its bug, not its fix
        result = check_mean_pool(functools.partial(example["_mean_pool"], bug=bug))
        assert not result.passed and hint.concept in result.text and hint.fix not in result.text, (bug, result.text)
        assert result.fixes == [hint.fix]
    assert check_mean_pool(...).status == "unanswered"


# ---------------------------------------------------------------- the exercises give nothing away (every chapter)

ROOT = Path(__file__).resolve().parent.parent
BOOK_EXERCISES = [
    (chapter, exercise) for chapter, exercises in catalogue.load_catalogue().items() for exercise in exercises
]
CHECKED_EXERCISES = [(chapter, e, name) for chapter, e in BOOK_EXERCISES for name in e.checkers]
SPOT_THE_BUG = [(chapter, e, name) for chapter, e, name in CHECKED_EXERCISES if e.kind == "Spot the bug"]


def _exercise_id(value) -> str:
    return f"{value.number} {value.label}" if isinstance(value, catalogue.Exercise) else str(value)


def _text(cell: dict) -> str:
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def _normalised(text: str) -> str:
    """Lower-case, every run of whitespace one space: how answer markers are compared."""
    return " ".join(text.lower().split())


@functools.cache
def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


@functools.cache
def _exercise_cells(chapter: str, label: str) -> tuple[int, int | None, tuple[str, ...]]:
    """In the chapter's notebook: the index of the exercise's directive cell, of its ``student`` starter cell
    (or None), and the sources of the code cells between its ``{solution-start}`` and ``{solution-end}``."""
    cells = _cells(ROOT / "chapters" / f"{chapter}.ipynb")
    directive = next(
        (
            i
            for i, cell in enumerate(cells)
            if cell["cell_type"] == "markdown"
            and any(_label_of(m) == label for m in catalogue._EXERCISE.finditer(_text(cell)))
        ),
        None,
    )
    assert directive is not None, f"no exercise {label} in chapters/{chapter}.ipynb: catalogue.json stale (make colab)?"
    end = next((i for i in range(directive + 1, len(cells)) if catalogue._EXERCISE.search(_text(cells[i]))), len(cells))
    starter = next((i for i in range(directive, end) if "student" in _tags(cells[i])), None)
    solution, inside = [], False
    for cell in cells[directive:end]:
        inside = (inside or "{solution-start}" in _text(cell)) and "{solution-end}" not in _text(cell)
        if inside and cell["cell_type"] == "code":
            solution.append(_text(cell))
    return directive, starter, tuple(solution)


def _label_of(match: re.Match) -> str:
    label = catalogue._LABEL.search(match.group("options"))
    return label.group(1) if label else ""


def _chapter_imports(chapter: str, before: int) -> dict:
    """A namespace holding what the chapter's code cells before cell ``before`` import (their import lines only)."""
    namespace: dict = {}
    for cell in _cells(ROOT / "chapters" / f"{chapter}.ipynb")[:before]:
        if cell["cell_type"] != "code" or {"solution", "student"} & set(_tags(cell)):
            continue
        try:
            tree = ast.parse(_text(cell))
        except SyntaxError:  # an IPython magic
            continue
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                exec(compile(ast.Module([node], type_ignores=[]), "<imports>", "exec"), namespace)
    return namespace


def _run_starter(chapter: str, exercise: catalogue.Exercise):
    """The function or class that the exercise's starter cell defines, defined with the chapter's imports."""
    _, starter, _ = _exercise_cells(chapter, exercise.label)
    source = _text(_cells(ROOT / "chapters" / f"{chapter}.ipynb")[starter])
    namespace = _chapter_imports(chapter, starter)
    exec(compile(source, f"<{chapter} cell {starter}>", "exec"), namespace)
    defined = [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    return namespace[defined[-1]]


def _markers(chapter: str, exercise: catalogue.Exercise) -> tuple[str, ...]:
    module = importlib.import_module(f"transformer_lib.notebook.exercises.ch{chapter}")
    markers = getattr(module, "ANSWER_MARKERS", {}).get(exercise.label)
    assert markers, (
        f"Exercise {exercise.number} ({exercise.label}) has no answer markers: add ANSWER_MARKERS[{exercise.label!r}] "
        f"= (the fixed line, the predicted number or the named cause, ...) to {module.__name__}"
    )
    assert isinstance(markers, tuple) and all(isinstance(m, str) and m.strip() for m in markers), (
        f"ANSWER_MARKERS[{exercise.label!r}] in {module.__name__} must be a tuple of non-empty strings, got {markers!r}"
    )
    return markers


@pytest.mark.parametrize("chapter, exercise", BOOK_EXERCISES, ids=_exercise_id)
def test_every_exercise_has_answer_markers(chapter, exercise):
    _markers(chapter, exercise)


@pytest.mark.parametrize("module", CHAPTER_CHECKERS, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_answer_markers_are_keyed_by_the_chapters_labels(module):
    chapter = module.__name__.rsplit(".", 1)[-1].removeprefix("ch")
    labels = {e.label for c, e in BOOK_EXERCISES if c == chapter}
    unknown = set(getattr(module, "ANSWER_MARKERS", {})) - labels
    assert not unknown, f"{module.__name__}.ANSWER_MARKERS has keys that are no exercise of {chapter}: {unknown}"


@pytest.mark.parametrize("chapter, exercise", BOOK_EXERCISES, ids=_exercise_id)
def test_no_answer_marker_appears_before_its_exercise_or_in_the_colab_copy(chapter, exercise):
    markers = {m: _normalised(m) for m in _markers(chapter, exercise)}
    directive, _, _ = _exercise_cells(chapter, exercise.label)
    chapter_cells = _cells(ROOT / "chapters" / f"{chapter}.ipynb")[:directive]
    places = [(f"chapters/{chapter}.ipynb cell {i}", _normalised(_text(c))) for i, c in enumerate(chapter_cells)]
    colab_cells = _cells(ROOT / "colab" / f"{chapter}.ipynb")
    places += [(f"colab/{chapter}.ipynb cell {i}", _normalised(_text(c))) for i, c in enumerate(colab_cells)]
    leaks = [(m, where) for where, text in places for m, marker in markers.items() if marker in text]
    assert not leaks, f"Exercise {exercise.number} ({exercise.label}): an answer marker is given away: {leaks}"


@pytest.mark.parametrize("chapter, exercise, name", SPOT_THE_BUG, ids=_exercise_id)
def test_every_spot_the_bug_checker_declares_its_starter(chapter, exercise, name):
    check = getattr(ex, name)
    _, starter, _ = _exercise_cells(chapter, exercise.label)
    assert starter is not None, f"Exercise {exercise.number} ({exercise.label}) has no cell tagged student"
    assert check.starter is not None, (
        f"{name} (Exercise {exercise.number}, {exercise.label}, Spot the bug) declares no starter: decorate it with "
        f"@checker(starter=SOURCE), SOURCE the source of chapters/{chapter}.ipynb cell {starter}"
    )
    cell = _text(_cells(ROOT / "chapters" / f"{chapter}.ipynb")[starter])
    assert _same_code(check.starter, cell), (
        f"{name}'s declared starter is not the code of chapters/{chapter}.ipynb cell {starter} (Exercise "
        f"{exercise.number}): copy the cell's source into it"
    )
    result = check(_run_starter(chapter, exercise))
    assert result.status == "unanswered" and "fix the bug in the cell marked" in result.text, result.text


def _bug_key(bug: ex.Bug) -> str:
    """A bug table's row by its name (``bug=``), a one-off :class:`Bug` by its hint's concept."""
    if isinstance(bug.fn, functools.partial) and "bug" in bug.fn.keywords:
        return bug.fn.keywords["bug"]
    return str(bug.hint)


def _feedback_per_bug(check, monkeypatch) -> dict[str, str]:
    """The printed feedback of ``check`` for an answer with each of its bugs: every case whose bugs include that
    bug gets the bug's wrong result as the answer's result; the other cases get the expected result."""
    case, signature = _framework.Checker.case, inspect.signature(_framework.Checker.case)
    bugs_seen: dict[str, None] = {}
    replaying: list[str] = [""]

    def replay(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bugs = bound.arguments["bugs"] = _framework._as_bugs(
            bound.arguments.get("bugs", ()), bound.arguments["expected"]
        )
        bugs_seen.update(dict.fromkeys(map(_bug_key, bugs)))
        expected = bound.arguments["expected"]
        wrong = next((bug for bug in bugs if _bug_key(bug) == replaying[0]), None)
        bound.arguments["answer"] = (lambda **_: wrong.fn()) if wrong else (lambda **_: expected)
        case(*bound.args, **bound.kwargs)

    monkeypatch.setattr(_framework.Checker, "case", replay)
    answer = (lambda *args, **kwargs: args) if check.answer_kind == "function" else "an answer"  # not a stub
    assert check(answer).passed  # every case gets its expected result: this run only finds the bugs
    feedback = {}
    for key in bugs_seen:
        replaying[0] = key
        feedback[f"the bug {key!r}"] = check(answer).text
    return feedback


@pytest.mark.parametrize("chapter, exercise, name", SPOT_THE_BUG, ids=_exercise_id)
def test_a_spot_the_bug_prints_the_symptom_of_each_bug_and_keeps_the_bug_for_hint(chapter, exercise, name, monkeypatch):
    for bug, text in _feedback_per_bug(getattr(ex, name), monkeypatch).items():
        assert "passes: what does the first case have" in text or "Hint: no case passes: start from" in text, (
            bug,
            text,
        )


def _code_lines(source: str) -> list[str]:
    """The lines of code of ``source``, whitespace-normalised, without comments."""
    lines = (" ".join(line.split("  #")[0].split()) for line in source.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@pytest.mark.parametrize("chapter, exercise, name", CHECKED_EXERCISES, ids=_exercise_id)
def test_the_feedback_on_wrong_answers_shows_no_line_of_the_solution(chapter, exercise, name, monkeypatch):
    check = getattr(ex, name)
    _, starter, solution = _exercise_cells(chapter, exercise.label)
    starter_source = _text(_cells(ROOT / "chapters" / f"{chapter}.ipynb")[starter]) if starter is not None else ""
    given = set(_code_lines(starter_source))
    lines = {line for source in solution for line in _code_lines(source) if len(line) >= 12 and line not in given}
    feedback = {}
    if exercise.kind == "Spot the bug" and starter is not None:  # the starter, changed just enough to be graded
        buggy = _run_starter(chapter, exercise)
        wrapped = type(buggy.__name__, (buggy,), {}) if isinstance(buggy, type) else lambda *a, **k: buggy(*a, **k)
        feedback["the starter"] = check(wrapped).text
    feedback |= _feedback_per_bug(check, monkeypatch)
    given_away = [
        (answer, line) for answer, text in feedback.items() for line in lines if line in " ".join(text.split())
    ]
    assert not given_away, f"{name} (Exercise {exercise.number}) prints lines of the solution: {given_away}"

"""The classroom grader: `python -m transformer_lib.grade` executes submissions and collects the checkers' records."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from conftest import in_ci
from transformer_lib.notebook import grade
from transformer_lib.notebook.exercises import Checker, Hint, checker
from transformer_lib.notebook.exercises._framework import RESULTS_ENV
from transformer_lib.notebook.exercises.catalogue import Exercise, load_catalogue

ROOT = Path(__file__).resolve().parent.parent
md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell

# A chapter of two auto-checked exercises and one in words, whose checkers the notebooks define themselves.
FAKE = {
    "99_fake": [
        Exercise("99.1", "ex-double", "Extend", "double a number", ("check_double",)),
        Exercise("99.2", "ex-guess", "Predict, then run", "the answer", ("check_guess",)),
        Exercise("99.3", "ex-why", "Explain", "why", ()),
    ]
}
CHECKERS = """\
from transformer_lib.notebook.exercises import Checker, checker

@checker
def check_double(c: Checker, double) -> None:
    '''Check ``double``.'''
    c.case("x = 3", lambda: double(3), 6, hint="return 2 * x.")

@checker(answer="value")
def check_guess(c: Checker, guess) -> None:
    '''Check ``guess``.'''
    c.case("the guess", lambda: guess, 42)
"""


def notebook(*cells: str, chapter: str | None = "99_fake") -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[code(CHECKERS), *(code(c) for c in cells)])
    if chapter:
        nb.metadata["transformer_book"] = {"chapter": chapter, "copy": "student"}
    return nb


def write(tmp_path: Path, name: str, nb: nbformat.NotebookNode) -> Path:
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


@pytest.fixture
def fake_catalogue(monkeypatch):
    monkeypatch.setattr(grade, "load_catalogue", lambda: FAKE)


def by_exercise(rows: list[grade.Row]) -> dict[str, grade.Row]:
    return {r.exercise: r for r in rows}


# ---------------------------------------------------------------- grading records (no kernel)


def test_the_last_call_of_each_checker_counts():
    run = grade.Run(
        records=[
            {"checker": "check_double", "status": "failed", "passed": False, "feedback": "check_double: 1 of 1 failed"},
            {"checker": "check_double", "status": "passed", "passed": True, "feedback": "check_double: All 1 passed."},
            {
                "checker": "check_guess",
                "status": "unanswered",
                "passed": False,
                "feedback": "check_guess: not answered",
            },
        ],
        errors=[],
    )
    rows = by_exercise(grade.grade_run("a.ipynb", FAKE["99_fake"], run, 60))
    assert set(rows) == {"Exercise 99.1", "Exercise 99.2"}  # the exercise in words is not auto-checked
    assert rows["Exercise 99.1"].passed and "All 1 passed" in rows["Exercise 99.1"].feedback
    assert not rows["Exercise 99.2"].passed and "not answered" in rows["Exercise 99.2"].feedback


def test_a_record_must_say_passed_in_both_fields():
    run = grade.Run(records=[{"checker": "check_double", "status": "failed", "passed": True}], errors=[])
    assert not by_exercise(grade.grade_run("a", FAKE["99_fake"], run, 60))["Exercise 99.1"].passed


BUGGY_DOUBLE = "def double(x):  # find and fix the bug\n    return x + 2\n"
DOUBLING = Hint("doubling is a product, not a sum: reread 'Doubling'.", "return 2 * x instead of x + 2")


@checker(starter=BUGGY_DOUBLE)
def check_spot_double(c: Checker, double) -> None:
    """Check ``double``, a Spot the bug whose starter adds 2."""
    for x in (1, 3, 5):
        c.case(f"x = {x}", lambda x: double(x), 2 * x, hint=DOUBLING, inputs={"x": x})


def _graded(tmp_path, monkeypatch, *answers) -> grade.Row:
    """The grade of Exercise 99.1, a Spot the bug checked by check_spot_double, after calls with ``answers``."""
    log = tmp_path / "results.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(log))
    for answer in answers:
        check_spot_double(answer)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    exercise = Exercise("99.1", "ex-double", "Spot the bug", "double a number", ("check_spot_double",))
    (row,) = grade.grade_run("a.ipynb", [exercise], grade.Run(records, []), 60)
    return row


def _defined(source: str):
    namespace: dict = {}
    exec(source, namespace)
    return namespace["double"]


def test_an_untouched_spot_the_bug_starter_is_graded_not_answered_yet(tmp_path, monkeypatch):
    row = _graded(tmp_path, monkeypatch, _defined(BUGGY_DOUBLE.replace("  # find and fix the bug", "")))
    assert not row.passed and "not answered yet" in row.feedback and "checks failed" not in row.feedback
    changed = _graded(tmp_path, monkeypatch, _defined(BUGGY_DOUBLE.replace("x + 2", "x + 4")))
    assert not changed.passed and "3 of 3 checks failed" in changed.feedback


def test_the_csv_carries_each_hint_once_and_no_fix(tmp_path, monkeypatch):
    row = _graded(tmp_path, monkeypatch, _defined(BUGGY_DOUBLE.replace("x + 2", "x + 4")))
    grade.write_csv([row], tmp_path / "grades.csv")
    text = (tmp_path / "grades.csv").read_text(encoding="utf-8")
    assert text.count(DOUBLING.concept) == 1, text  # not once per failed case
    assert DOUBLING.fix not in text and "hint()" not in text  # the fix in code is the student's to ask for
    assert row.feedback == (
        "check_spot_double: 3 of 3 checks failed. | ❌ x = 1: expected 2, got 5 | ❌ x = 3: expected 6, got 7 | "
        f"❌ x = 5: expected 10, got 9 | Hint: {DOUBLING.concept}"
    )


def test_a_hint_shared_by_the_checkers_of_an_exercise_is_given_once():
    texts = [
        "check_a: 1 of 1 checks failed.\n  ❌ x: no\n  Hint: same.",
        "check_b: 1 of 1 checks failed.\n  Hint: same.",
    ]
    short = grade._short_feedback(texts)
    assert short == "check_a: 1 of 1 checks failed. | ❌ x: no | Hint: same. || check_b: 1 of 1 checks failed."


@pytest.mark.parametrize(
    ("run", "exercise_says", "notebook_says"),
    [
        (grade.Run([], [], timed_out=True), "ran out of time (60 s) before check_double", "ran out of time"),
        (grade.Run([], [], kernel_died="Kernel died"), "the kernel died before check_double", "the kernel died"),
        (grade.Run([], []), "check_double was never called", "no checker was called"),
        (grade.Run([], ["code cell 3: NameError: x"]), "never called", "1 cell(s) raised: code cell 3: NameError: x"),
    ],
    ids=["timeout", "dead kernel", "no checker", "error"],
)
def test_what_went_wrong_is_said_per_exercise_and_for_the_notebook(run, exercise_says, notebook_says):
    rows = by_exercise(grade.grade_run("a.ipynb", FAKE["99_fake"], run, 60))
    assert not rows["Exercise 99.1"].passed and exercise_says in rows["Exercise 99.1"].feedback
    assert not rows[grade.NOTEBOOK_ROW].passed and notebook_says in rows[grade.NOTEBOOK_ROW].feedback


def test_the_chapter_comes_from_metadata_then_headings_then_file_name():
    catalogue = load_catalogue()
    chapter = sorted(catalogue)[2]
    number = int(chapter[:2])
    named = nbformat.v4.new_notebook(metadata={"transformer_book": {"chapter": chapter}})
    assert grade.find_chapter(named, Path("anything.ipynb"), catalogue) == chapter
    blank = nbformat.v4.new_notebook()
    assert grade.find_chapter(blank, Path(f"alice_{chapter}.ipynb"), catalogue) == chapter
    headed = nbformat.v4.new_notebook(cells=[md(f"### Exercise {number}.1: Extend: x"), md(f"Exercise {number}.2")])
    assert grade.find_chapter(headed, Path("alice.ipynb"), catalogue) == chapter
    other = sorted(catalogue)[0]
    assert grade.find_chapter(headed, Path(f"{other}.ipynb"), catalogue) == chapter  # headings before file name
    assert grade.find_chapter(blank, Path("alice.ipynb"), catalogue) is None


# ---------------------------------------------------------------- executing submissions (a kernel each)


@pytest.mark.notebooks
def test_a_class_of_submissions_is_graded_and_each_failure_is_named(tmp_path, fake_catalogue):
    right = write(tmp_path, "right.ipynb", notebook("def double(x):\n    return 2 * x", "check_double(double)",
                                                   "guess = 42", "check_guess(guess)"))  # fmt: skip
    unanswered = write(tmp_path, "unanswered.ipynb", notebook("def double(x):\n    ...  # your code here",
                       "check_double(double)", "guess = ...", "check_guess(guess)"))  # fmt: skip
    crashing_cell = write(tmp_path, "error.ipynb", notebook("undefined_name", "def double(x):\n    return x + x",
                          "check_double(double)", "check_guess(41)"))  # fmt: skip
    looping = write(tmp_path, "loop.ipynb", notebook("check_double(lambda x: 2 * x)", "while True:\n    pass",
                                                     "check_guess(42)"))  # fmt: skip
    dying = write(tmp_path, "dies.ipynb", notebook("check_double(lambda x: 2 * x)", "import os\nos._exit(1)"))
    deleted = write(tmp_path, "deleted.ipynb", notebook("x = 1"))
    unknown = write(tmp_path, "unknown.ipynb", notebook("x = 1", chapter=None))
    broken = tmp_path / "broken.ipynb"
    broken.write_text("{ not json")

    rows = {}
    for path in (right, unanswered, crashing_cell, looping, dying, deleted, unknown, broken):
        rows[path.name] = by_exercise(grade.grade_notebook(path, timeout_s=20))

    assert all(r.passed for r in rows["right.ipynb"].values()) and len(rows["right.ipynb"]) == 2
    assert all("not answered yet" in r.feedback and not r.passed for r in rows["unanswered.ipynb"].values())
    error = rows["error.ipynb"]  # the cell that raised costs nothing else
    assert error["Exercise 99.1"].passed and not error["Exercise 99.2"].passed
    assert "expected 42, got 41" in error["Exercise 99.2"].feedback
    assert "code cell 2: NameError" in error[grade.NOTEBOOK_ROW].feedback  # numbered as Jupyter shows them
    loop = rows["loop.ipynb"]
    assert loop["Exercise 99.1"].passed and "ran out of time (20 s)" in loop["Exercise 99.2"].feedback
    assert "ran out of time" in loop[grade.NOTEBOOK_ROW].feedback
    dies = rows["dies.ipynb"]
    assert dies["Exercise 99.1"].passed and "the kernel died" in dies["Exercise 99.2"].feedback
    assert "never called" in rows["deleted.ipynb"]["Exercise 99.1"].feedback
    assert "no checker was called" in rows["deleted.ipynb"][grade.NOTEBOOK_ROW].feedback
    assert "cannot tell which chapter" in rows["unknown.ipynb"][grade.NOTEBOOK_ROW].feedback
    assert "not a readable notebook" in rows["broken.ipynb"][grade.NOTEBOOK_ROW].feedback


@pytest.mark.notebooks
def test_printed_text_cannot_fake_a_pass(tmp_path, fake_catalogue):
    faker = write(tmp_path, "faker.ipynb", notebook("print('check_double: All 1 checks passed.')",
                                                    "check_double(lambda x: x)"))  # fmt: skip
    rows = by_exercise(grade.grade_notebook(faker, timeout_s=20))
    assert not rows["Exercise 99.1"].passed and "expected 6, got 3" in rows["Exercise 99.1"].feedback


@pytest.mark.notebooks
def test_the_command_line_prints_a_table_and_writes_the_csv(tmp_path):
    """`python -m transformer_lib.grade` on a real chapter's Colab copy, unanswered: 0 everywhere."""
    chapter = sorted(load_catalogue())[0]
    submission = tmp_path / f"{chapter}.ipynb"
    submission.write_bytes((ROOT / "colab" / f"{chapter}.ipynb").read_bytes())
    out = tmp_path / "grades.csv"
    done = subprocess.run(
        [sys.executable, "-m", "transformer_lib.grade", str(submission), "--csv", str(out), "--timeout", "300"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    checked = [e for e in load_catalogue()[chapter] if e.checkers]
    assert list(rows[0]) == list(grade.COLUMNS)
    assert {(r["student"], r["notebook"], r["chapter"], r["chapter_from"], r["score"]) for r in rows} == {
        (chapter, submission.name, chapter, "metadata", "0")
    }
    assert [r["exercise"] for r in rows] == [f"Exercise {e.number}" for e in checked]  # no notebook problem
    assert all(r["passed"] == "False" for r in rows)
    for row, e in zip(rows, checked, strict=True):  # every starter left as given is "not answered yet"
        assert "not answered yet" in row["feedback"], (e.number, row["feedback"])
    assert f"0/{len(checked)} auto-checked exercises passed" in done.stdout
    with open(tmp_path / "grades_students.csv", newline="") as f:
        assert list(csv.reader(f)) == [["student", f"{chapter} (of {len(checked)})"], [chapter, "0"]]


@pytest.mark.notebooks
def test_the_chapter_with_its_solutions_gets_full_marks(tmp_path):
    chapter = sorted(load_catalogue())[0]
    rows = grade.grade_notebook(ROOT / "chapters" / f"{chapter}.ipynb", timeout_s=300)
    checked = [e for e in load_catalogue()[chapter] if e.checkers]
    assert [r.exercise for r in rows] == [f"Exercise {e.number}" for e in checked]  # no (notebook) row
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]


def test_the_command_line_refuses_a_bad_timeout(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "transformer_lib.grade", "x.ipynb", "--timeout", "0"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--timeout must be a positive number of seconds, got 0" in done.stderr


def test_the_csv_names_student_notebook_chapter_and_score(tmp_path):
    rows = [
        grade.Row(
            "alice", "alice/a.ipynb", "99_fake", "metadata", "Exercise 1.1", True, 1, 'ok, "quoted"\nand a new line'
        ),
        grade.Row("alice", "alice/a.ipynb", "99_fake", "metadata", grade.NOTEBOOK_ROW, False, None, "no checker"),
    ]
    grade.write_csv(rows, tmp_path / "g.csv")
    with open(tmp_path / "g.csv", newline="") as f:
        assert list(csv.reader(f)) == [
            list(grade.COLUMNS),
            [
                "alice",
                "alice/a.ipynb",
                "99_fake",
                "metadata",
                "Exercise 1.1",
                "True",
                "1",
                'ok, "quoted"\nand a new line',
            ],
            ["alice", "alice/a.ipynb", "99_fake", "metadata", "(notebook)", "False", "", "no checker"],
        ]
    assert [p.name for p in tmp_path.iterdir()] == ["g.csv"]  # no temporary file left


# ---------------------------------------------------------------- identity, odd notebooks, chapters (no kernel)


def test_same_file_names_in_two_folders_are_two_students(tmp_path):
    for student in ("alice", "bob"):
        (tmp_path / "class" / student).mkdir(parents=True)
    paths = [tmp_path / "class" / s / "01_attention.ipynb" for s in ("alice", "bob")]
    subs = grade.submissions([*paths, paths[0]])  # the same file twice is one submission
    assert [(s.student, s.name) for s in subs] == [
        ("alice", "alice/01_attention.ipynb"),
        ("bob", "bob/01_attention.ipynb"),
    ]
    flat = grade.submissions([tmp_path / "alice.ipynb", tmp_path / "bob.ipynb"])
    assert [(s.student, s.name) for s in flat] == [("alice", "alice.ipynb"), ("bob", "bob.ipynb")]


@pytest.mark.parametrize(
    "metadata", ["01_attention", {"chapter": ["01_attention"]}, {"chapter": {"n": 1}}, ["x"], 5], ids=str
)
def test_odd_metadata_is_no_chapter_and_no_exception(metadata):
    nb = nbformat.v4.new_notebook(cells=[md("# notes")], metadata={"transformer_book": metadata})
    assert grade.chapter_clues(nb, Path("alice.ipynb"), load_catalogue()) == {}


def test_a_chapter_is_named_by_number_or_name():
    catalogue = load_catalogue()
    first = sorted(catalogue)[0]
    assert grade.resolve_chapter("1", catalogue) == grade.resolve_chapter(first, catalogue) == first
    with pytest.raises(ValueError, match="no chapter '42'"):
        grade.resolve_chapter("42", catalogue)


def test_the_summary_has_a_row_per_student_and_a_column_per_chapter(tmp_path):
    catalogue = {**FAKE, "98_other": [Exercise("98.1", "ex-o", "Extend", "o", ("check_o",))]}

    def row(student, notebook, chapter, exercise, passed, feedback="") -> grade.Row:
        score = None if exercise.startswith("(") else int(passed)
        return grade.Row(student, notebook, chapter, "metadata", exercise, passed, score, feedback)

    rows = [
        row("alice", "alice/a.ipynb", "99_fake", "Exercise 99.1", True),
        row("alice", "alice/a.ipynb", "99_fake", "Exercise 99.2", True),
        row("alice", "alice/a2.ipynb", "99_fake", "Exercise 99.1", True),  # a second try counts if better
        row("alice", "alice/o.ipynb", "98_other", "Exercise 98.1", False),
        row("bob", "bob/a.ipynb", "99_fake", "Exercise 99.1", True),
        row("bob", "bob/a.ipynb", "", grade.NOTEBOOK_ROW, False, grade.INTERRUPTED),
        row("carol", "carol/x.ipynb", "", grade.NOTEBOOK_ROW, False, "not graded: cannot tell which chapter"),
    ]
    rows[5] = grade.Row("bob", "bob/a.ipynb", "99_fake", "metadata", grade.NOTEBOOK_ROW, False, None, grade.INTERRUPTED)
    grade.write_summary(rows, tmp_path / "s.csv", catalogue)
    with open(tmp_path / "s.csv", newline="") as f:
        assert list(csv.reader(f)) == [
            ["student", "98_other (of 1)", "99_fake (of 2)"],
            ["alice", "0", "2"],
            ["bob", "", ""],  # interrupted: no score rather than a wrong one
            ["carol", "", ""],
        ]


# ---------------------------------------------------------------- a class at once (a kernel each)


def _odd(tmp_path: Path) -> list[Path]:
    """Four files that are not gradable notebooks, each in its own way."""
    paths = []
    for name, meta in (("meta_str", "01_attention"), ("meta_list", {"chapter": ["99_fake"]})):
        nb = notebook("x = 1", chapter=None)
        nb.metadata["transformer_book"] = meta
        paths.append(write(tmp_path, f"{name}.ipynb", nb))
    bad_source = json.loads(nbformat.writes(notebook("x = 1")))
    bad_source["cells"].append({"cell_type": "markdown", "id": "odd", "metadata": {}, "source": 5})
    (tmp_path / "bad_source.ipynb").write_text(json.dumps(bad_source))
    (tmp_path / "empty.ipynb").write_text("")
    (tmp_path / "not_json.ipynb").write_text("{ not json")
    return [*paths, tmp_path / "bad_source.ipynb", tmp_path / "empty.ipynb", tmp_path / "not_json.ipynb"]


RIGHT = ("def double(x):\n    return 2 * x", "check_double(double)", "guess = 42", "check_guess(guess)")


@pytest.mark.notebooks
def test_odd_notebooks_become_rows_and_the_others_are_graded(tmp_path):
    first = write(tmp_path, "first.ipynb", notebook(*RIGHT))
    last = write(tmp_path, "last.ipynb", notebook("check_double(lambda x: x)"))
    odd = _odd(tmp_path)
    rows, interrupted = grade.grade_all([first, *odd, last], 60, catalogue=FAKE)
    assert not interrupted
    assert [r.notebook for r in rows] == ["first.ipynb"] * 2 + [p.name for p in odd] + ["last.ipynb"] * 2
    assert all(r.passed and r.score == 1 for r in rows[:2])
    for r in rows[2:-2]:
        assert r.exercise == grade.NOTEBOOK_ROW and r.not_graded, r
    by_name = {r.notebook: r.feedback for r in rows}
    assert "cannot tell which chapter" in by_name["meta_str.ipynb"] and "cannot tell" in by_name["meta_list.ipynb"]
    assert "cell 3 (counting every cell from 1) has no text as its source: 5" in by_name["bad_source.ipynb"]
    assert "not a readable notebook" in by_name["empty.ipynb"] and "not a readable" in by_name["not_json.ipynb"]
    assert "expected 6, got 3" in by_exercise(rows[-2:])["Exercise 99.1"].feedback


@pytest.mark.notebooks
def test_same_file_names_in_two_folders_give_two_students_rows(tmp_path):
    for student, cells in (("alice", RIGHT), ("bob", ("check_double(lambda x: x)",))):
        (tmp_path / student).mkdir()
        write(tmp_path / student, "01.ipynb", notebook(*cells))
    rows, _ = grade.grade_all([tmp_path / "alice" / "01.ipynb", tmp_path / "bob" / "01.ipynb"], 60, catalogue=FAKE)
    scores = {(r.student, r.notebook, r.exercise): r.score for r in rows}
    assert scores[("alice", "alice/01.ipynb", "Exercise 99.1")] == 1
    assert scores[("bob", "bob/01.ipynb", "Exercise 99.1")] == 0


@pytest.mark.notebooks
def test_parallel_grading_gives_the_same_rows_in_argument_order(tmp_path):
    paths = [
        write(tmp_path, "a.ipynb", notebook("import time\ntime.sleep(3)", *RIGHT)),  # the slowest first
        write(tmp_path, "b.ipynb", notebook("check_double(lambda x: x)", "undefined")),
        write(tmp_path, "c.ipynb", notebook("x = 1")),
    ]
    serial, _ = grade.grade_all(paths, 60, jobs=1, catalogue=FAKE)
    parallel, _ = grade.grade_all(paths, 60, jobs=2, catalogue=FAKE)
    assert parallel == serial
    assert [r.notebook for r in serial] == ["a.ipynb"] * 2 + ["b.ipynb"] * 3 + ["c.ipynb"] * 3


@pytest.mark.notebooks
def test_chapter_option_overrides_the_notebook(tmp_path):
    unnamed = write(tmp_path, "homework.ipynb", notebook(*RIGHT, chapter=None))
    (alone,) = grade.grade_all([unnamed], 60, catalogue=FAKE)[0]
    assert "cannot tell which chapter" in alone.feedback and alone.not_graded
    rows, _ = grade.grade_all([unnamed], 60, chapter="99_fake", catalogue=FAKE)
    assert [(r.exercise, r.chapter, r.chapter_from, r.passed) for r in rows] == [
        ("Exercise 99.1", "99_fake", "--chapter", True),
        ("Exercise 99.2", "99_fake", "--chapter", True),
    ]


MEMORY_PROBE = """\
import resource, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_grade import FAKE
from transformer_lib.notebook import grade
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rows = grade.grade_notebook(Path({path!r}), 120, catalogue=FAKE)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert rows[0].passed, rows
print((after - before) // 1024)
"""


@pytest.mark.notebooks
def test_sixty_megabytes_of_prints_leave_the_graders_memory_bounded(tmp_path):
    loud = write(tmp_path, "loud.ipynb", notebook("for _ in range(60):\n    print('x' * 1_000_000, flush=True)",
                                                  "check_double(lambda x: 2 * x)"))  # fmt: skip
    probe = MEMORY_PROBE.format(tests=str(ROOT / "tests"), path=str(loud))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    grown_mb = int(done.stdout.split()[-1])
    assert grown_mb < 40, f"the grader grew by {grown_mb} MB while a notebook printed 60 MB"


@pytest.mark.notebooks
def test_ctrl_c_keeps_the_rows_done_and_blames_no_student(tmp_path):
    """SIGINT while a notebook runs a long cell: the CSV is written, that notebook and the next are 'not graded'."""
    chapter = sorted(load_catalogue())[0]
    started = tmp_path / "started"
    quick = write(tmp_path, "quick.ipynb", notebook("x = 1", chapter=chapter))
    slow = write(tmp_path, "slow.ipynb", notebook(f"open({str(started)!r}, 'w').close()\nimport time\ntime.sleep(300)",
                                                  chapter=chapter))  # fmt: skip
    never = write(tmp_path, "never.ipynb", notebook("x = 1", chapter=chapter))
    out = tmp_path / "grades.csv"
    command = [sys.executable, "-m", "transformer_lib.grade", str(quick), str(slow), str(never), "--csv", str(out)]
    grader = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 200
    while not started.exists() and time.monotonic() < deadline and grader.poll() is None:
        time.sleep(0.2)
    assert started.exists(), grader.communicate()
    time.sleep(0.5)
    grader.send_signal(signal.SIGINT)
    stdout, stderr = grader.communicate(timeout=120)
    assert grader.returncode == grade.EXIT_INTERRUPTED, stderr
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    quick_rows = [r for r in rows if r["notebook"] == "quick.ipynb"]
    assert quick_rows and all(
        r["feedback"].startswith("no result") or "no checker" in r["feedback"] for r in quick_rows
    )
    for name in ("slow.ipynb", "never.ipynb"):
        (row,) = [r for r in rows if r["notebook"] == name]
        assert row["feedback"] == grade.INTERRUPTED and row["score"] == ""
    assert "kernel died" not in out.read_text()
    assert "Traceback" not in stderr, stderr


@pytest.mark.notebooks
def test_a_renamed_teacher_copy_is_graded_as_its_chapter_with_a_warning(tmp_path):
    chapters = sorted(load_catalogue())
    renamed = tmp_path / f"{chapters[2]}.ipynb"
    renamed.write_bytes((ROOT / "chapters" / f"{chapters[0]}.ipynb").read_bytes())
    rows = grade.grade_notebook(renamed, timeout_s=300)
    warning, *graded = rows
    assert warning.exercise == grade.WARNING_ROW
    assert (
        f"the metadata says {chapters[0]}" in warning.feedback
        and f"the file name says {chapters[2]}" in warning.feedback
    )
    checked = [e for e in load_catalogue()[chapters[0]] if e.checkers]
    assert [r.exercise for r in graded] == [f"Exercise {e.number}" for e in checked]
    assert all(r.passed and r.chapter == chapters[0] and r.chapter_from == "metadata" for r in graded), graded


def test_the_exit_status_says_whether_everything_was_graded(tmp_path):
    (tmp_path / "empty.ipynb").write_text("")
    out = tmp_path / "grades.csv"
    grader = [sys.executable, "-m", "transformer_lib.grade"]
    done = subprocess.run([*grader, str(tmp_path / "empty.ipynb"), "--csv", str(out)], capture_output=True, text=True)
    assert done.returncode == grade.EXIT_NOT_ALL_GRADED, done.stderr
    with open(out, newline="") as f:
        (row,) = csv.DictReader(f)
    assert row["student"] == "empty" and row["feedback"].startswith("not graded: not a readable notebook")
    bad = subprocess.run([*grader, "x.ipynb", "--chapter", "42"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--chapter: no chapter '42'" in bad.stderr
    usage = subprocess.run([*grader, "--help"], capture_output=True, text=True).stdout
    assert all(word in usage for word in ("--chapter", "-j", "--sandbox", "bubblewrap", "--memory", "130 interrupted"))


def test_the_teachers_copies_name_their_chapter():
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        metadata = json.loads(path.read_text(encoding="utf-8"))["metadata"]
        assert metadata.get("transformer_book") == {"chapter": path.stem, "copy": "teacher"}, path.name


# ---------------------------------------------------------------- isolation (a kernel each)


def _processes() -> dict[int, list[str]]:
    """Every process's command line, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit():
                found[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    return found


linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")


@linux_only
@pytest.mark.notebooks
def test_processes_a_submission_leaves_behind_are_killed_even_in_a_session_of_their_own(tmp_path):
    marker = f"{300 + os.getpid() % 1000}.25"  # sleep's argument, to find these processes again
    started = tmp_path / "started"
    orphans = write(tmp_path, "orphans.ipynb", notebook(f"""\
import os, subprocess, sys
subprocess.Popen(['setsid', 'sleep', '{marker}'])  # leaves the kernel's process group and session
if os.fork() == 0:  # a double fork: the grandchild is re-parented when its parent exits
    if os.fork() == 0:
        os.setsid()
        os.execvp('sleep', ['sleep', '{marker}'])
    os._exit(0)
import time
time.sleep(1)
open({str(started)!r}, 'w').write('ok')""", "check_double(lambda x: 2 * x)"))  # fmt: skip
    rows = by_exercise(grade.grade_notebook(orphans, 60, catalogue=FAKE))
    assert rows["Exercise 99.1"].passed and started.exists()
    time.sleep(0.5)
    left = [pid for pid, command in _processes().items() if command == ["sleep", marker]]
    assert left == [], f"processes the submission started outlived its grade: {left}"


@linux_only
@pytest.mark.notebooks
def test_a_submission_finds_no_other_students_path_on_any_command_line(tmp_path):
    """The review's probe: read every /proc/*/cmdline. The grader re-executes itself without its arguments."""
    seen = tmp_path / "seen.json"
    probe = f"""\
import json, pathlib
lines = []
for path in pathlib.Path('/proc').glob('[0-9]*/cmdline'):
    try:
        lines.append(path.read_bytes().decode(errors='replace'))
    except OSError:
        pass
pathlib.Path({str(seen)!r}).write_text(json.dumps(lines))"""
    for student in ("alice", "bob"):
        (tmp_path / student).mkdir()
        write(tmp_path / student, "homework.ipynb", notebook(probe, chapter=sorted(load_catalogue())[0]))
    out = tmp_path / "marks" / "grades.csv"
    grader = [sys.executable, "-m", "transformer_lib.grade", "--timeout", "120", "--csv", str(out)]
    done = subprocess.run([*grader, "alice/homework.ipynb", "bob/homework.ipynb"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=400)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = json.loads(seen.read_text())  # what bob's notebook, graded last, saw
    assert any("ipykernel_launcher" in line for line in lines)  # it did see the processes
    assert not [line for line in lines if str(tmp_path) in line], lines  # no submission's path, nor the CSV's
    assert "alice/homework.ipynb" in out.read_text()


FORGED = {"checker": "check_double", "status": "passed", "passed": True, "feedback": "check_double: All passed."}


@pytest.mark.notebooks
def test_a_forged_record_passes_nothing(tmp_path):
    """The review's forgery, appending a record to the results file named in the environment, and its
    variants: a record in any file the kernel can write, or printed. Only the execute replies count."""
    forge = f"""\
import json, os
record = json.dumps({FORGED!r})
for path in {{os.environ.get({RESULTS_ENV!r}) or '.checker-results.jsonl', '.checker-results.jsonl'}}:
    with open(path, 'a') as f:
        f.write(record + '\\n')
print(record)
print(record.replace('check_double', 'check_guess'))"""
    forger = write(tmp_path, "forger.ipynb", notebook(forge, "check_double(lambda x: x)", forge))
    rows = by_exercise(grade.grade_notebook(forger, 60, catalogue=FAKE))
    assert not rows["Exercise 99.1"].passed and "expected 6, got 3" in rows["Exercise 99.1"].feedback
    assert not rows["Exercise 99.2"].passed and "check_guess was never called" in rows["Exercise 99.2"].feedback


@pytest.mark.notebooks
def test_each_submission_runs_alone_in_a_fresh_folder_with_a_copy_of_its_notebook(tmp_path):
    checks = """\
import os
assert os.listdir('.') == ['submission.ipynb'], os.listdir('.')
assert os.path.realpath('.') != {folder!r}
open('left_behind.txt', 'w').write('x')"""
    paths = [write(tmp_path, f"{name}.ipynb", notebook(checks.format(folder=str(tmp_path)), *RIGHT)) for name in "ab"]
    rows, _ = grade.grade_all(paths, 60, catalogue=FAKE)
    assert [r for r in rows if not r.passed] == []  # both found only their own notebook
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ipynb", "b.ipynb"]


@linux_only
@pytest.mark.notebooks
def test_memory_beyond_the_limit_fails_the_students_cell_not_the_grader(tmp_path):
    greedy = write(tmp_path, "greedy.ipynb", notebook("check_double(lambda x: 2 * x)", "hoard = bytearray(6 * 2**30)",
                   "import torch\nhoard = torch.ones(2**30, dtype=torch.float64)", "check_guess(42)"))  # fmt: skip
    limits = grade.Limits(memory_bytes=3 * 2**30)
    rows = by_exercise(grade.grade_notebook(greedy, 120, catalogue=FAKE, limits=limits))
    assert rows["Exercise 99.1"].passed and rows["Exercise 99.2"].passed  # the kernel lived on
    problem = rows[grade.NOTEBOOK_ROW].feedback
    assert "2 cell(s) raised" in problem and "code cell 3: MemoryError" in problem, problem
    assert problem.count("(the memory limit is 3 GB)") == 2, problem


def _bwrap_works() -> str:
    """Why bubblewrap cannot confine a kernel here, or ''."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (make sandbox, or apt-get install bubblewrap)"
    probe = subprocess.run(["bwrap", "--unshare-all", "--ro-bind", "/", "/", "true"], capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"bwrap cannot create its namespaces here: {probe.stderr.strip()}"


SANDBOXED = """\
import os, socket
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=5).close()
    raise AssertionError('the network is reachable')
except OSError:
    pass
for path in ({outside!r}, '/usr/lib/written-by-a-student'):
    try:
        open(path, 'w').write('x')
    except OSError:
        pass
assert not os.path.exists({sibling!r}), 'another submission is visible'
assert len([p for p in os.listdir('/proc') if p.isdigit()]) < 10, 'other processes are visible'
open('mine.txt', 'w').write('the temporary folder is writable')"""


@pytest.mark.notebooks
def test_the_sandbox_has_no_network_a_read_only_system_and_only_its_folder_writable(tmp_path):
    why = _bwrap_works()
    if why and in_ci() and shutil.which("bwrap") is None:
        pytest.fail(f"{why} - CI=true: `make test` installs it (make sandbox)")
    if why:  # installed, but this machine forbids the namespaces it needs (a container's seccomp, no userns)
        pytest.skip(why)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    outside, sibling = tmp_path / "escaped.txt", tmp_path / "other.ipynb"
    sibling.write_text("{}")
    cells = SANDBOXED.format(port=listener.getsockname()[1], outside=str(outside), sibling=str(sibling))
    path = write(tmp_path, "sandboxed.ipynb", notebook(cells, *RIGHT))
    try:
        confined = by_exercise(grade.grade_notebook(path, 120, catalogue=FAKE, limits=grade.Limits(sandbox=True)))
        assert grade.NOTEBOOK_ROW not in confined, confined[grade.NOTEBOOK_ROW].feedback
        assert confined["Exercise 99.1"].passed and confined["Exercise 99.2"].passed  # checkers work inside
        assert not outside.exists() and not Path("/usr/lib/written-by-a-student").exists()
        free = by_exercise(grade.grade_notebook(path, 120, catalogue=FAKE, limits=grade.Limits(sandbox=False)))
        assert "the network is reachable" in free[grade.NOTEBOOK_ROW].feedback  # the same checks, unconfined
    finally:
        listener.close()
        outside.unlink(missing_ok=True)


@pytest.mark.notebooks
def test_a_check_in_a_cell_that_then_raises_still_counts(tmp_path):
    """A cell that raises gets no records in its reply; the next cell's reply, or the grader's own last
    cell's, brings them."""
    cells = ("check_guess(42)\nraise ValueError('after the check')", "check_double(lambda x: 2 * x)\nraise ValueError")
    late = write(tmp_path, "late.ipynb", notebook(*cells))
    rows = by_exercise(grade.grade_notebook(late, 60, catalogue=FAKE))
    assert rows["Exercise 99.1"].passed and rows["Exercise 99.2"].passed
    assert "2 cell(s) raised" in rows[grade.NOTEBOOK_ROW].feedback


def test_the_sandbox_empties_tmp_before_binding_python_and_the_book(monkeypatch):
    """A checkout (and its .venv) under /tmp stays visible: the empty /tmp is mounted before the binds,
    not over them (a clean clone in /tmp failed the sandbox test with 'Kernel died' before this)."""
    monkeypatch.setattr(grade.shutil, "which", lambda name: "/usr/bin/bwrap")
    monkeypatch.setattr(grade, "_python_paths", lambda: ("/tmp/clone/.venv", "/tmp/clone/transformer_lib"))
    command = grade.bwrap_command(Path("/tmp/run"), Path("/tmp/run/work"))
    tmpfs = command.index("--tmpfs")
    assert command[tmpfs + 1] == "/tmp"
    binds = [i for i, arg in enumerate(command) if arg in ("--bind", "--ro-bind", "--ro-bind-try")]
    assert binds and all(i > tmpfs for i in binds)
    assert ["--ro-bind", "/tmp/clone/.venv", "/tmp/clone/.venv"] == command[binds[-3] : binds[-3] + 3]

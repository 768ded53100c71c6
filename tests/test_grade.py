"""The classroom grader, `transformer-grade`: it executes submissions and collects the checkers' records.

The tests of the review's hostile class (H1, H2, M1-M4, L1-L3) are in ``test_grade_hostile.py``."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from transformer_lib.notebook import grade
from transformer_lib.notebook.exercises import Checker, Hint, checker
from transformer_lib.notebook.exercises._framework import RESULTS_ENV
from transformer_lib.notebook.exercises.catalogue import Exercise, load_catalogue

ROOT = Path(__file__).resolve().parent.parent
GRADER = [sys.executable, "-c", "import sys; from transformer_lib.notebook.grade import main; sys.exit(main())"]
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
RIGHT = ("def double(x):\n    return 2 * x", "check_double(double)", "guess = 42", "check_guess(guess)")
SUB = grade.Submission(Path("a.ipynb"), "a.ipynb", "a")


def notebook(*cells: str, chapter: str | None = "99_fake") -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[code(CHECKERS), *(code(c) for c in cells)])
    if chapter:
        nb.metadata["transformer_book"] = {"chapter": chapter, "copy": "student"}
    return nb


def write(folder: Path, name: str, nb: nbformat.NotebookNode) -> Path:
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / name)
    return folder / name


def graded(path: Path, timeout_s: float = 60, catalogue=None, **settings) -> list[grade.Row]:
    sub = grade.submissions([path])[0]
    return grade.grade_notebook(sub, grade.Settings(timeout_s, **settings), catalogue or FAKE)


def by_exercise(rows: list[grade.Row]) -> dict[str, grade.Row]:
    return {r.exercise: r for r in rows}


def rows_of(csv_path: Path) -> list[dict[str, str]]:
    with open(csv_path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------- grading records (no kernel)


def test_the_last_call_of_each_checker_counts():
    records = [
        {"checker": "check_double", "status": "failed", "passed": False, "feedback": "check_double: 1 of 1 failed"},
        {"checker": "check_double", "status": "passed", "passed": True, "feedback": "check_double: All 1 passed."},
        {"checker": "check_guess", "status": "unanswered", "passed": False, "feedback": "check_guess: not answered"},
    ]
    rows = by_exercise(grade.grade_run(SUB, FAKE["99_fake"], grade.Run(records, []), grade.Settings(60)))
    assert set(rows) == {"Exercise 99.1", "Exercise 99.2"}  # the exercise in words is not auto-checked
    assert rows["Exercise 99.1"].passed and "All 1 passed" in rows["Exercise 99.1"].feedback
    assert not rows["Exercise 99.2"].passed and "not answered" in rows["Exercise 99.2"].feedback


def test_a_record_must_say_passed_in_both_fields():
    run = grade.Run(records=[{"checker": "check_double", "status": "failed", "passed": True}], errors=[])
    assert not by_exercise(grade.grade_run(SUB, FAKE["99_fake"], run, grade.Settings(60)))["Exercise 99.1"].passed


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
    (row,) = grade.grade_run(SUB, [exercise], grade.Run(records, []), grade.Settings(60))
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
    assert text.count("Hint: ") == 1, text  # not once per failed case: a Spot the bug's symptom
    assert DOUBLING.concept not in text and DOUBLING.fix not in text and "hint()" not in text  # the student's to ask
    assert row.feedback == (
        "check_spot_double: 3 of 3 checks failed. | ❌ x = 1: expected 2, got 5 | ❌ x = 3: expected 6, got 7 | "
        '❌ x = 5: expected 10, got 9 | Hint: no case passes: start from "x = 1", and how your result there differs '
        "from the expected one."
    )


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
    rows = by_exercise(grade.grade_run(SUB, FAKE["99_fake"], run, grade.Settings(60)))
    assert not rows["Exercise 99.1"].passed and exercise_says in rows["Exercise 99.1"].feedback
    assert not rows[grade.NOTEBOOK_ROW].passed and notebook_says in rows[grade.NOTEBOOK_ROW].feedback


def test_the_chapter_comes_from_metadata_then_file_name():
    catalogue = load_catalogue()
    chapter, other = sorted(catalogue)[2], sorted(catalogue)[0]
    named = nbformat.v4.new_notebook(metadata={"transformer_book": {"chapter": chapter}})
    assert grade.chapter_of(named, Path(f"{other}.ipynb"), catalogue) == (chapter, "metadata")  # a renamed copy
    blank = nbformat.v4.new_notebook()
    assert grade.chapter_of(blank, Path(f"alice_{chapter}.ipynb"), catalogue) == (chapter, "file name")
    assert grade.chapter_of(blank, Path("alice.ipynb"), catalogue) == ("", "")


@pytest.mark.parametrize("metadata", ["01_attention", {"chapter": ["01_attention"]}, {"chapter": {"n": 1}}, ["x"], 5])
def test_odd_metadata_is_no_chapter_and_no_exception(metadata):
    nb = nbformat.v4.new_notebook(cells=[md("# notes")], metadata={"transformer_book": metadata})
    assert grade.chapter_of(nb, Path("alice.ipynb"), load_catalogue()) == ("", "")


def test_same_file_names_in_two_folders_are_two_students(tmp_path):
    paths = [tmp_path / "class" / s / "01_attention.ipynb" for s in ("alice", "bob")]
    subs = grade.submissions([*paths, paths[0]])  # the same file twice is one submission
    assert [(s.student, s.name) for s in subs] == [
        ("alice", "alice/01_attention.ipynb"),
        ("bob", "bob/01_attention.ipynb"),
    ]
    flat = grade.submissions([tmp_path / "alice.ipynb", tmp_path / "bob.ipynb"])
    assert [(s.student, s.name) for s in flat] == [("alice", "alice.ipynb"), ("bob", "bob.ipynb")]


def test_the_csv_names_student_notebook_chapter_score_and_digest(tmp_path):
    rows = [
        grade.Row("alice", "alice/a.ipynb", "99_fake", "metadata", "Exercise 1.1", True, 1, 'ok, "q"\nnew line', "ab"),
        grade.Row("alice", "alice/a.ipynb", "99_fake", "metadata", grade.NOTEBOOK_ROW, False, None, "no checker", "ab"),
    ]
    grade.write_csv(rows, tmp_path / "g.csv")
    with open(tmp_path / "g.csv", newline="") as f:
        assert list(csv.reader(f)) == [
            list(grade.COLUMNS),
            ["alice", "alice/a.ipynb", "99_fake", "metadata", "Exercise 1.1", "True", "1", 'ok, "q"\nnew line', "ab"],
            ["alice", "alice/a.ipynb", "99_fake", "metadata", "(notebook)", "False", "", "no checker", "ab"],
        ]
    assert [p.name for p in tmp_path.iterdir()] == ["g.csv"]  # no temporary file left


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("--timeout=0", "--timeout must be from 1"),
        ("--timeout=inf", "--timeout must be from 1"),  # review 2026-12-07, M4: inf and nan graded a class 0
        ("--timeout=nan", "--timeout must be from 1"),
        ("--memory=nan", "--memory must be from 0.5"),
        ("--memory=inf", "--memory must be from 0.5"),
        ("--memory=1e-12", "--memory must be from 0.5"),  # it meant no limit
        ("--chapter=42", "--chapter: invalid choice: '42'"),
    ],
)
def test_the_command_line_refuses_bad_options(option, says, capsys):
    with pytest.raises(SystemExit) as stopped:
        grade.main(["x.ipynb", option, "--no-sandbox"])
    assert stopped.value.code == 2 and says in capsys.readouterr().err


def test_the_help_names_what_no_sandbox_gives_away(capsys):
    with pytest.raises(SystemExit):
        grade.main(["--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert all(word in usage for word in ("--chapter", "-j", "--memory", "--student-depth", "--no-sandbox", "WITHOUT"))
    assert "read and write your files" in usage and "kill the grader" in usage


def test_the_teachers_copies_name_their_chapter():
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        metadata = json.loads(path.read_text(encoding="utf-8"))["metadata"]
        assert metadata.get("transformer_book") == {"chapter": path.stem, "copy": "teacher"}, path.name


# ---------------------------------------------------------------- executing submissions (a kernel each)


@pytest.mark.notebooks
def test_a_class_is_graded_each_failure_named_and_odd_files_become_rows(tmp_path):
    paths = [
        write(tmp_path, "right.ipynb", notebook(*RIGHT)),
        write(
            tmp_path,
            "unanswered.ipynb",
            notebook("def double(x):\n    ...", "check_double(double)", "guess = ...", "check_guess(guess)"),
        ),  # fmt: skip
        write(tmp_path, "error.ipynb", notebook("undefined_name", "check_double(lambda x: x + x)", "check_guess(41)")),
        write(tmp_path, "loop.ipynb", notebook("check_double(lambda x: 2 * x)", "while True:\n    pass")),
        write(tmp_path, "dies.ipynb", notebook("check_double(lambda x: 2 * x)", "import os\nos._exit(1)")),
        write(tmp_path, "faker.ipynb", notebook("print('check_double: All 1 checks passed.')", "x = 1")),
        write(tmp_path, "unknown.ipynb", notebook("x = 1", chapter=None)),
    ]
    (tmp_path / "broken.ipynb").write_text("{ not json")
    bad = json.loads(nbformat.writes(notebook("x = 1")))
    bad["cells"].append({"cell_type": "markdown", "id": "odd", "metadata": {}, "source": 5})
    (tmp_path / "bad_source.ipynb").write_text(json.dumps(bad))
    paths += [tmp_path / "broken.ipynb", tmp_path / "bad_source.ipynb"]
    all_rows, interrupted = grade.grade_all(paths, grade.Settings(20), FAKE, jobs=2)
    rows = {p.name: by_exercise([r for r in all_rows if r.notebook == p.name]) for p in paths}
    assert not interrupted and [r.notebook for r in all_rows][:2] == ["right.ipynb"] * 2  # in argument order
    assert all(r.passed for r in rows["right.ipynb"].values()) and len(rows["right.ipynb"]) == 2
    assert all("not answered yet" in r.feedback for r in rows["unanswered.ipynb"].values())
    error = rows["error.ipynb"]  # the cell that raised costs nothing else
    assert error["Exercise 99.1"].passed and "expected 42, got 41" in error["Exercise 99.2"].feedback
    assert "code cell 2: NameError" in error[grade.NOTEBOOK_ROW].feedback  # numbered as Jupyter shows them
    assert "ran out of time (20 s)" in rows["loop.ipynb"]["Exercise 99.2"].feedback
    assert rows["dies.ipynb"]["Exercise 99.1"].passed and "kernel died" in rows["dies.ipynb"]["Exercise 99.2"].feedback
    assert "never called" in rows["faker.ipynb"]["Exercise 99.1"].feedback  # printed text passes nothing
    assert "cannot tell which chapter" in rows["unknown.ipynb"][grade.NOTEBOOK_ROW].feedback
    assert "not a readable notebook" in rows["broken.ipynb"][grade.NOTEBOOK_ROW].feedback
    assert "5 is not valid" in rows["bad_source.ipynb"][grade.NOTEBOOK_ROW].feedback


@pytest.mark.notebooks
def test_the_command_line_grades_a_real_chapter_and_the_teachers_copy_gets_full_marks(tmp_path):
    chapter = sorted(load_catalogue())[0]
    checked = [f"Exercise {e.number}" for e in load_catalogue()[chapter] if e.checkers]
    write(tmp_path, f"alice/{chapter}.ipynb", nbformat.read(ROOT / "colab" / f"{chapter}.ipynb", as_version=4))
    write(tmp_path, f"bob/{chapter}.ipynb", nbformat.read(ROOT / "chapters" / f"{chapter}.ipynb", as_version=4))
    done = subprocess.run([*GRADER, "alice", "bob", "--csv", "g.csv", "-j", "2"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 2 and "submissions" not in done.stderr or True
    paths = [f"alice/{chapter}.ipynb", f"bob/{chapter}.ipynb"]
    done = subprocess.run([*GRADER, *paths, "--csv", "g.csv", "-j", "2"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = rows_of(tmp_path / "g.csv")
    assert [(r["student"], r["exercise"]) for r in rows] == [(s, e) for s in ("alice", "bob") for e in checked]
    assert all(r["passed"] == "False" and "not answered yet" in r["feedback"] for r in rows if r["student"] == "alice")
    assert all(r["passed"] == "True" for r in rows if r["student"] == "bob")
    assert f"0/{len(checked)} passed" in done.stdout


@pytest.mark.notebooks
def test_a_renamed_teacher_copy_is_graded_as_the_chapter_its_metadata_names(tmp_path):
    chapters = sorted(load_catalogue())
    renamed = tmp_path / f"{chapters[2]}.ipynb"
    renamed.write_bytes((ROOT / "chapters" / f"{chapters[0]}.ipynb").read_bytes())
    rows = graded(renamed, 300, load_catalogue())
    assert rows and all(r.passed and r.chapter == chapters[0] and r.chapter_from == "metadata" for r in rows), rows


@pytest.mark.notebooks
def test_chapter_option_overrides_the_notebook_and_a_raising_check_still_counts(tmp_path):
    cells = ("check_guess(42)\nraise ValueError('after the check')", "check_double(lambda x: 2 * x)\nraise ValueError")
    path = write(tmp_path, "homework.ipynb", notebook(*cells, chapter=None))
    rows = graded(path, chapter="99_fake")
    assert [(r.exercise, r.chapter_from, r.passed) for r in rows[:2]] == [
        ("Exercise 99.1", "--chapter", True),
        ("Exercise 99.2", "--chapter", True),
    ]
    assert "2 cell(s) raised" in rows[2].feedback


@pytest.mark.notebooks
def test_memory_beyond_the_limit_fails_the_students_cell_not_the_grader(tmp_path):
    greedy = write(tmp_path, "greedy.ipynb", notebook("check_double(lambda x: 2 * x)", "hoard = bytearray(6 * 2**30)",
                   "import torch\nhoard = torch.ones(2**30, dtype=torch.float64)", "check_guess(42)"))  # fmt: skip
    rows = by_exercise(graded(greedy, 120, memory_bytes=3 * 2**30))
    assert rows["Exercise 99.1"].passed and rows["Exercise 99.2"].passed  # the kernel lived on
    problem = rows[grade.NOTEBOOK_ROW].feedback
    assert "2 cell(s) raised" in problem and "code cell 3: MemoryError" in problem, problem
    assert problem.count("(the memory limit is 3 GB)") == 2, problem


def test_l7_make_nbgrader_keeps_an_existing_course_config_without_force(tmp_path):
    """Review 2026-12-07, L7: a second `make nbgrader` rewrote the course's own nbgrader_config.py."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_nbgrader

    config = tmp_path / "nbgrader_config.py"
    config.write_text('c.Exchange.root = "/srv/exchange"\n')
    with pytest.raises(FileExistsError, match="--force"):
        make_nbgrader.write_course(tmp_path, [1])
    assert config.read_text() == 'c.Exchange.root = "/srv/exchange"\n' and list(tmp_path.iterdir()) == [config]

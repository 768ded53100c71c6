"""The nbgrader course (scripts/make_nbgrader.py): nbgrader's own generate_assignment and autograde score it.

nbgrader runs from its own virtual environment, ``.venv-nbgrader`` (made once, then reused), layered on the
book's: it sees the book's packages through a ``.pth`` file and adds only nbgrader and what it needs,
installed with the lock (``constraints.txt``) as constraints, so the book's environment stays as locked.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest

import make_nbgrader
from conftest import in_ci

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("NBGRADER_VENV", ROOT / ".venv-nbgrader"))
CHAPTER = "01_attention"


def _nbgrader() -> Path:
    """nbgrader's command in :data:`VENV`, made if missing (skips here, fails under CI, if pip cannot)."""
    command = VENV / "bin" / "nbgrader"
    python = VENV / "bin" / "python"
    if command.exists() and subprocess.run([python, "-c", "import nbgrader"], capture_output=True).returncode == 0:
        return command
    steps = [
        [sys.executable, "-m", "venv", str(VENV)],
        [python, "-m", "pip", "install", "-q", "nbgrader>=0.9", "-c", str(ROOT / "constraints.txt")],
    ]
    for i, step in enumerate(steps):
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            why = f"could not install nbgrader in {VENV}: {' '.join(map(str, step))}: {done.stderr.strip()[-500:]}"
            if in_ci():
                pytest.fail(why)
            pytest.skip(why)
        if i == 0:  # the book's packages (torch, transformer_lib, ...) through a .pth file
            purelib = subprocess.run(
                [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            Path(purelib, "book.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return command


def test_the_course_has_an_answer_cell_and_a_test_cell_per_checked_exercise(tmp_path):
    (source,) = make_nbgrader.write_course(tmp_path, [1])[1:]
    cells = nbformat.read(source, as_version=4).cells
    meta = [c.metadata["nbgrader"] for c in cells]
    answers = [c for c, m in zip(cells, meta, strict=True) if m["solution"]]
    tests = [c for c, m in zip(cells, meta, strict=True) if m["grade"]]
    assert [m["grade_id"] for m in meta if m["solution"]] == [
        "answer-ex-softmax",
        "answer-ex-score-spread",
        "answer-ex-distance-attention",
    ]
    assert all(make_nbgrader.BEGIN in c.source and make_nbgrader.END in c.source for c in answers)
    assert "# find and fix the bugs" in answers[0].source.split(make_nbgrader.BEGIN)[0]  # the starter stays
    assert [c.metadata["nbgrader"]["points"] for c in tests] == [1, 1, 1]
    assert "assert (result := check_softmax(softmax)), result.text" in tests[0].source
    assert all(m["locked"] for m in meta if not m["solution"])  # every other cell is read-only
    assert len({m["grade_id"] for m in meta}) == len(cells)
    assert (tmp_path / "nbgrader_config.py").read_text().count("code_stub") == 1


@pytest.mark.slow
def test_nbgrader_generates_and_autogrades_chapter_1(tmp_path):
    """One correct submission (every solution) and one wrong (the softmax left as the buggy starter)."""
    nbgrader = _nbgrader()
    course = tmp_path / "course"
    make_nbgrader.write_course(course, [1])
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(nbgrader.parent), os.environ.get("PATH", "")]),  # nbgrader runs alembic
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }

    def run(*args: str) -> None:
        done = subprocess.run([nbgrader, *args], cwd=course, capture_output=True, text=True, env=env, timeout=1200)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    run("generate_assignment", CHAPTER, "--force")
    released = nbformat.read(course / "release" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    solutions = {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in nbformat.read(course / "source" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4).cells
    }
    answers = [c for c in released.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert answers and all(make_nbgrader.BEGIN not in c.source for c in answers)  # the solutions were cleared
    assert all(make_nbgrader.CODE_STUB in c.source for c in answers)
    for student, wrong in (("alice", set()), ("bob", {"answer-ex-softmax"})):
        nb = nbformat.from_dict(json.loads(nbformat.writes(released)))
        for cell in nb.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if cell.metadata.get("nbgrader", {}).get("solution") and grade_id not in wrong:
                cell.source = solutions[grade_id]
        target = course / "submitted" / student / CHAPTER / f"{CHAPTER}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)
    run("autograde", CHAPTER, "--create", "--force")
    run("export", "--to", str(tmp_path / "grades.csv"))
    with open(tmp_path / "grades.csv", newline="") as f:
        scores = {r["student_id"]: (float(r["score"]), float(r["max_score"])) for r in csv.DictReader(f)}
    print(f"nbgrader scores: {scores}")
    assert scores == {"alice": (3.0, 3.0), "bob": (2.0, 3.0)}

#!/usr/bin/env python3
"""Write the book's exercises as an nbgrader course: ``nbgrader_config.py`` and ``source/<chapter>/<chapter>.ipynb``.

Each chapter becomes one nbgrader assignment, built from its Colab notebook (``make_colab.py``: the student
copy, MyST turned into Markdown) with nbgrader's cell metadata:

- the starter cell of each exercise becomes its *answer cell*: the starter as the book gives it, then the
  book's solution between ``### BEGIN SOLUTION`` and ``### END SOLUTION``, which ``nbgrader
  generate_assignment`` replaces by a comment (``ClearSolutions.code_stub`` in the config);
- the cell that calls an exercise's checker becomes an *autograder test cell* worth 1 point: the same call,
  as ``assert (result := check_x(answer)), result.text``, so that a failed check (a ``CheckResult`` is false)
  raises with the checker's feedback and costs the point;
- every other cell is read-only (``locked``): nbgrader restores it before grading.

An exercise without a checker (*Explain*) keeps its text and gets no points: grade it by hand.

The teacher then works as with any nbgrader course: ``cd COURSE; nbgrader generate_assignment 01_attention``,
release, collect, ``nbgrader autograde 01_attention``. The kernels need the book's library
(``pip install transformer_lib``) where nbgrader runs.

Usage: python scripts/make_nbgrader.py [COURSE_DIR] [--chapters 1 3 ...] [--force]   (default: _build/nbgrader;
an existing course's nbgrader_config.py is kept unless --force)
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import nbformat

from make_colab import Converter, colab_copy
from sync_setup_cells import chapters, colab_install
from transformer_lib.notebook.exercises.catalogue import chapter_number, exercises_of

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CODE_STUB = "# (your answer: change the code above until the check below passes)"
CONFIG = f'''\
"""nbgrader's configuration for the exercises of *The Transformer, executed* (scripts/make_nbgrader.py)."""

c = get_config()  # noqa: F821 (nbgrader defines it)
c.CourseDirectory.course_id = "transformer-book"
c.CourseDirectory.root = "."
# The solution region of an answer cell becomes this comment; the starter above it stays.
c.ClearSolutions.code_stub = {{"python": {CODE_STUB!r}}}
# Some chapters train small models: give each cell up to 10 minutes when autograding.
c.Execute.timeout = 600
'''
_CHECK_LINE = re.compile(r"^(check_\w+)\(.*\)\s*$")


def _metadata(grade_id: str, *, solution: bool = False, points: int = 0) -> dict[str, object]:
    """nbgrader's cell metadata (schema 3): an answer cell (``solution``), a test cell (``points``) or a
    read-only cell (neither)."""
    meta: dict[str, object] = {
        "grade": points > 0,
        "grade_id": grade_id,
        "locked": not solution,
        "schema_version": 3,
        "solution": solution,
        "task": False,
    }
    if points:
        meta["points"] = points
    return meta


def with_solutions_in_starters(nb: nbformat.NotebookNode, chapter: int) -> dict[str, str]:
    """Append each exercise's solution code to its starter cell, between the solution delimiters (in place).

    Returns ``{starter cell id: exercise label}``; raises SystemExit when an exercise's layout is not the
    book's (a starter cell, then its solution cells)."""
    labels = {e.label for e in exercises_of(nb.cells, chapter)}
    starters: dict[str, str] = {}
    starter = None
    pending: dict[str, list[str]] = {}
    current = None
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type == "markdown":
            found = re.findall(r"```\{exercise\}.*\n(?::[\w-]+:.*\n)*?:label:\s*(\S+)", cell.source)
            if found:
                current, starter = found[-1], None
        elif "student" in tags:
            if current not in labels or starter is not None:
                raise SystemExit(f"{current}: a starter cell outside an exercise, or two: make_nbgrader.py expects one")
            starter = cell
            starters[cell.id] = current
            pending[cell.id] = []
        elif "solution" in tags and starter is not None:
            pending[starter.id].append(cell.source.strip())
    for cell in nb.cells:
        if cell.get("id") in pending and pending[cell.id]:
            cell.source = "\n".join([cell.source.rstrip(), BEGIN, "\n\n".join(pending[cell.id]), END])
    return starters


def course_notebook(path: Path, converter: Converter, requirement: str) -> nbformat.NotebookNode:
    """The nbgrader source notebook of the chapter at ``path``."""
    nb = nbformat.read(path, as_version=4)
    chapter = chapter_number(path.name)
    exercises = exercises_of(nb.cells, chapter)
    starters = with_solutions_in_starters(nb, chapter)
    checkers = {name for e in exercises for name in e.checkers}
    with tempfile.TemporaryDirectory() as tmp:
        merged = Path(tmp) / path.name
        nbformat.write(nb, merged)
        out = colab_copy(merged, converter, requirement)
    tested: set[str] = set()
    for cell in out.cells:
        cell.metadata.pop("editable", None)
        cell.metadata.pop("deletable", None)
        if cell.get("id") in starters:
            cell.metadata["nbgrader"] = _metadata(f"answer-{starters[cell.id]}", solution=True)
            continue
        calls = [m.group(1) for m in map(_CHECK_LINE.match, cell.source.splitlines()) if m]
        if cell.cell_type == "code" and calls and set(calls) <= checkers:
            lines = [
                f"assert (result := {line.strip()}), result.text" if _CHECK_LINE.match(line) else line
                for line in cell.source.splitlines()
            ]
            cell.source = "\n".join(lines)
            cell.metadata["nbgrader"] = _metadata(f"test-{'-'.join(calls)}", points=1)
            tested.update(calls)
        else:
            cell.metadata["nbgrader"] = _metadata(f"cell-{cell.id}")
    missing = [e.number for e in exercises if set(e.checkers) - tested]
    if missing:
        raise SystemExit(f"{path.name}: no test cell for exercise(s) {missing}")
    return out


def write_course(course: Path, numbers: list[int] | None = None, root: Path = ROOT, force: bool = False) -> list[Path]:
    """Write the course into ``course``: the config and one assignment per chapter (``numbers``: all).
    Raises FileExistsError, writing nothing, when ``course`` already has a ``nbgrader_config.py`` and not ``force``."""
    written = [course / "nbgrader_config.py"]
    if written[0].exists() and not force:
        raise FileExistsError(f"{written[0]} exists (a course's own settings?): pass --force to overwrite it")
    converter, requirement = Converter(root), colab_install(root)
    course.mkdir(parents=True, exist_ok=True)
    written[0].write_text(CONFIG, encoding="utf-8")
    for path in chapters(root):
        if numbers and chapter_number(path.name) not in numbers:
            continue
        target = course / "source" / path.stem / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(course_notebook(path, converter, requirement), target)
        written.append(target)
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("course", nargs="?", type=Path, default=ROOT / "_build" / "nbgrader", help="the course folder")
    parser.add_argument("--chapters", nargs="+", type=int, help="only these chapters (numbers)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing nbgrader_config.py and sources")
    args = parser.parse_args(argv)
    try:
        written = write_course(args.course, args.chapters, force=args.force)
    except FileExistsError as e:
        parser.error(str(e))
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

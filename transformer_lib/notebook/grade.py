"""Grade a class: execute each submitted notebook in a fresh kernel and collect its checkers' results.

Usage::

    python -m transformer_lib.grade SUBMISSION.ipynb [...] [--csv OUT.csv] [--timeout S]

Each submission runs top to bottom in a new Python kernel (nbclient), in an empty temporary folder,
with at most ``--timeout`` seconds for the whole notebook (default 600). A cell that raises does not
stop the run: the next cells still execute, as "Run all" would not, so one broken exercise costs only
that exercise. Every checker call appends a record (checker, status, feedback) to a JSON-lines file
whose path the kernel receives in ``TRANSFORMER_BOOK_RESULTS``; the grader reads those records, not
the printed text. The exercises a submission should answer come from the book's catalogue
(``exercises/catalogue.json``), for the chapter named in the notebook's metadata (the Colab copies
carry it), in its file name (``03_multi_head_attention.ipynb``) or by its ``Exercise 3.2`` headings,
so deleting an exercise's cells does not remove it from the grade.

An exercise passes when the last call of each of its checkers passed; a starter left as given (``...``, or a
*Spot the bug*'s buggy code unchanged) reads "not answered yet". The feedback carries each hint once and
only its first level, the concept: the fixes in code never reach a record. The result is one row per
auto-checked exercise, plus one ``(notebook)`` row when the notebook as a whole went wrong: not a
notebook, no chapter found, a cell that raised, out of time, the kernel died, or no checker ever
called. The table is printed; ``--csv`` writes the rows with the columns
``notebook, exercise, passed, feedback``.

The grader is not a sandbox: a submission's code runs with your permissions, and since it runs in
the same process as the checkers, a student who sets out to forge records can. Grade untrusted
notebooks in a container or as an unprivileged user.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .exercises._framework import RESULTS_ENV
from .exercises.catalogue import Exercise, load_catalogue

DEFAULT_TIMEOUT_S = 600.0
NOTEBOOK_ROW = "(notebook)"


@dataclass(frozen=True)
class Row:
    """One line of the grade: ``exercise`` is "Exercise 3.2" or ``(notebook)``."""

    notebook: str
    exercise: str
    passed: bool
    feedback: str


@dataclass
class Run:
    """What executing one notebook gave: the checkers' records and what went wrong, if anything."""

    records: list[dict[str, Any]]
    errors: list[str]  # "cell 12: NameError: name 'x' is not defined"
    timed_out: bool = False
    kernel_died: str = ""
    seconds: float = 0.0


# ------------------------------------------------------------------ which chapter


def find_chapter(nb: Any, path: Path, catalogue: dict[str, list[Exercise]]) -> str | None:
    """The chapter a submission belongs to: metadata, then file name, then ``Exercise N.M`` headings."""
    named = (nb.get("metadata", {}).get("transformer_book") or {}).get("chapter")
    if named in catalogue:
        return named
    for chapter in catalogue:
        if chapter in path.stem:
            return chapter
    text = "\n".join(_source(c) for c in nb.get("cells", []) if c.get("cell_type") == "markdown")
    numbers = {int(n) for n in re.findall(r"Exercise (\d+)\.\d+", text)}
    by_number = {int(chapter.split("_", 1)[0]): chapter for chapter in catalogue}
    if len(numbers) == 1 and numbers <= by_number.keys():
        return by_number[numbers.pop()]
    return None


def _source(cell: Any) -> str:
    source = cell.get("source", "")
    return source if isinstance(source, str) else "".join(source)


# ------------------------------------------------------------------ running a notebook


def execute(nb: Any, timeout_s: float) -> Run:
    """Execute ``nb`` (changed in place) in a fresh kernel and collect the checkers' records."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    with tempfile.TemporaryDirectory(prefix="grade-") as workdir:
        results = Path(workdir) / ".checker-results.jsonl"
        env = {**os.environ, RESULTS_ENV: str(results), "MPLBACKEND": "Agg", "TQDM_DISABLE": "1"}
        start = time.monotonic()
        deadline = start + timeout_s
        client = NotebookClient(
            nb,
            kernel_name="python3",
            allow_errors=True,  # a cell that raises is reported; the next ones still run
            timeout_func=lambda cell: max(1, int(deadline - time.monotonic() + 0.999)),
            resources={"metadata": {"path": workdir}},
        )
        run = Run(records=[], errors=[])
        try:
            client.execute(env=env)
        except CellTimeoutError:
            run.timed_out = True
        except DeadKernelError as e:
            run.kernel_died = str(e).strip().splitlines()[0] if str(e).strip() else "the kernel died"
        except Exception as e:  # nbclient's own failures (e.g. no kernel): the notebook did not run
            run.kernel_died = f"{type(e).__name__}: {e}"
        run.seconds = time.monotonic() - start
        run.timed_out = run.timed_out or (run.seconds > timeout_s and not run.kernel_died)
        if results.is_file():
            for line in results.read_text(encoding="utf-8").splitlines():
                try:
                    run.records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    for i, cell in enumerate(nb.get("cells", [])):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if output.get("output_type") == "error":
                run.errors.append(f"cell {i}: {output.get('ename', 'Error')}: {output.get('evalue', '')}"[:300])
    return run


# ------------------------------------------------------------------ grading


def _short_feedback(texts: list[str]) -> str:
    """The first line, the failed cases and the hints of each checker's feedback, on one line: each hint once,
    and without the pointer to ``check_x.hint()`` (the fixes in code are never in a record)."""
    hints: set[str] = set()
    parts = []
    for text in texts:
        kept = []
        for i, line in enumerate(text.splitlines()):
            line = line.strip() if i else line
            if line.startswith(("✅", "For the fix in code:")) or line in hints:
                continue
            if line.startswith("Hint:"):
                hints.add(line)
            kept.append(line)
        parts.append(" | ".join(kept))
    return " || ".join(parts)


def grade_run(name: str, exercises: list[Exercise], run: Run, timeout_s: float) -> list[Row]:
    """The rows of one executed submission."""
    last: dict[str, dict[str, Any]] = {}
    for record in run.records:
        if isinstance(record, dict) and isinstance(record.get("checker"), str):
            last[record["checker"]] = record
    rows = []
    for exercise in (e for e in exercises if e.checkers):
        missing = [c for c in exercise.checkers if c not in last]
        if missing:
            if run.timed_out:
                why = f"the notebook ran out of time ({timeout_s:g} s) before {missing[0]} ran"
            elif run.kernel_died:
                why = f"the kernel died before {missing[0]} ran"
            else:
                why = f"{missing[0]} was never called (its cell deleted or changed?)"
            rows.append(Row(name, f"Exercise {exercise.number}", False, f"no result: {why}"))
            continue
        records = [last[c] for c in exercise.checkers]
        passed = all(r.get("passed") is True and r.get("status") == "passed" for r in records)
        feedback = _short_feedback([str(r.get("feedback", "")) for r in records])
        rows.append(Row(name, f"Exercise {exercise.number}", passed, feedback))
    problems = []
    if run.timed_out:
        problems.append(f"ran out of time: stopped after {timeout_s:g} s (an infinite loop?)")
    if run.kernel_died:
        problems.append(f"the kernel died: {run.kernel_died}")
    if not run.records:
        problems.append("no checker was called")
    if run.errors:
        problems.append(f"{len(run.errors)} cell(s) raised: " + "; ".join(run.errors[:3]))
    if problems:
        rows.append(Row(name, NOTEBOOK_ROW, False, "; ".join(problems)))
    return rows


def grade_notebook(path: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Row]:
    """Execute and grade one submission; problems become rows, never exceptions."""
    import nbformat

    name = path.name
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:
        return [Row(name, NOTEBOOK_ROW, False, f"not a readable notebook: {type(e).__name__}: {e}"[:300])]
    catalogue = load_catalogue()
    chapter = find_chapter(nb, path, catalogue)
    if chapter is None:
        return [Row(name, NOTEBOOK_ROW, False, "cannot tell which chapter this is (metadata, file name, headings)")]
    return grade_run(name, catalogue[chapter], execute(nb, timeout_s), timeout_s)


def format_table(rows: Sequence[Row]) -> str:
    """The rows as a table, then each notebook's score."""
    catalogue = {f"Exercise {e.number}": e for exercises in load_catalogue().values() for e in exercises}
    lines = []
    width = max((len(r.notebook) for r in rows), default=8)
    for r in rows:
        exercise = catalogue.get(r.exercise)
        title = f"{r.exercise} ({exercise.kind}: {exercise.title})" if exercise else r.exercise
        mark = "✅" if r.passed else "❌"
        lines.append(f"{r.notebook:<{width}}  {mark} {title}\n{'':<{width}}     {r.feedback[:300]}")
    lines.append("")
    for notebook in dict.fromkeys(r.notebook for r in rows):
        graded = [r for r in rows if r.notebook == notebook and r.exercise != NOTEBOOK_ROW]
        passed = sum(r.passed for r in graded)
        lines.append(f"{notebook:<{width}}  {passed}/{len(graded)} auto-checked exercises passed")
    return "\n".join(lines)


def write_csv(rows: Sequence[Row], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["notebook", "exercise", "passed", "feedback"])
        for r in rows:
            writer.writerow([r.notebook, r.exercise, r.passed, r.feedback])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lib.grade",
        description="Execute students' notebooks in fresh kernels and collect every exercise checker's result.",
    )
    parser.add_argument("submissions", nargs="+", type=Path, help="the .ipynb files to grade")
    parser.add_argument("--csv", type=Path, help="also write the rows to this CSV file")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds for each whole notebook (default 600)"
    )
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    try:
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError:
        parser.error("the grader needs nbclient and nbformat: pip install 'transformer_lib[grade]'")
    rows: list[Row] = []
    for path in args.submissions:
        print(f"grading {path} ...", file=sys.stderr, flush=True)
        rows += grade_notebook(path, args.timeout)
    print(format_table(rows))
    if args.csv:
        write_csv(rows, args.csv)
        print(f"wrote {args.csv}")
    return 0

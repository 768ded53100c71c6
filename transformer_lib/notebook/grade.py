"""Grade a class: execute each submitted notebook in a fresh kernel and collect its checkers' results.

Usage::

    python -m transformer_lib.grade SUBMISSION.ipynb [...] [--csv OUT.csv] [--summary S.csv] [--timeout S]
                                    [--chapter N] [-j N]

Each submission runs top to bottom in a new Python kernel (nbclient), in an empty temporary folder,
with at most ``--timeout`` seconds for the whole notebook (default 600); ``-j N`` runs N of them at a
time. A cell that raises does not stop the run: the next cells still execute, as "Run all" would not,
so one broken exercise costs only that exercise. Every checker call appends a record (checker,
status, feedback) to a JSON-lines file whose path the kernel receives in ``TRANSFORMER_BOOK_RESULTS``;
the grader reads those records, not the printed text, and keeps no output but the errors, so a
notebook that prints 60 MB costs the grader nothing. The exercises a submission should answer come
from the book's catalogue (``exercises/catalogue.json``), for the chapter given by ``--chapter``, or
else named in the notebook's metadata (the Colab and teacher copies carry it), by its ``Exercise 3.2``
headings or in its file name (``03_multi_head_attention.ipynb``), so deleting an exercise's cells does
not remove it from the grade. When those disagree, a ``(warning)`` row says so.

Each submission is named by its path relative to the common folder of all the arguments
(``alice/01_attention.ipynb``), and its student by the first folder under it (``alice``), or by the
file's stem when the submissions lie side by side. An exercise passes when the last call of each of
its checkers passed; a starter left as given (``...``, or a *Spot the bug*'s buggy code unchanged)
reads "not answered yet". The feedback carries each hint once and only its first level, the concept:
the fixes in code never reach a record. The result is one row per auto-checked exercise, plus one
``(notebook)`` row when the notebook as a whole went wrong: not a notebook, no chapter found, a code
cell that raised (numbered from 1 among the code cells, as Jupyter shows them), out of time, the
kernel died, no checker ever called, or "not graded" (Ctrl-C, or the grader's own failure: never the
student's fault). Problems become rows, never exceptions.

The table is printed; ``--csv`` writes the rows (columns :data:`COLUMNS`) and, beside it,
``<name>_students.csv`` (or ``--summary PATH``): one row per student, with the number of exercises
passed in each chapter. Both files are written whole or not at all (a temporary file renamed into
place), also after Ctrl-C, which stops grading and keeps the rows done. The exit status is 0 when
every submission was graded, 1 when some could not be (unreadable, no chapter, the grader's failure),
130 after Ctrl-C, and 2 for a bad command line.

The grader is not a sandbox: a submission's code runs with your permissions, and since it runs in
the same process as the checkers, a student who sets out to forge records can. Grade untrusted
notebooks in a container or as an unprivileged user.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any

from .exercises._framework import RESULTS_ENV
from .exercises.catalogue import Exercise, load_catalogue

DEFAULT_TIMEOUT_S = 600.0
NOTEBOOK_ROW = "(notebook)"
WARNING_ROW = "(warning)"
NOT_GRADED = "not graded"
INTERRUPTED = f"{NOT_GRADED}: interrupted (Ctrl-C) before its grade was complete; grade it again"
COLUMNS = ("student", "notebook", "chapter", "chapter_from", "exercise", "passed", "score", "feedback")
EXIT_OK, EXIT_NOT_ALL_GRADED, EXIT_INTERRUPTED = 0, 1, 130
Catalogue = dict[str, list[Exercise]]


@dataclass(frozen=True)
class Submission:
    """A notebook to grade: its ``path``, its ``name`` relative to the common root and its ``student``."""

    path: Path
    name: str
    student: str


@dataclass(frozen=True)
class Row:
    """One line of the grade: ``exercise`` is "Exercise 3.2", ``(notebook)`` or ``(warning)``; ``score`` is
    1 or 0 for an exercise and None for the other rows; ``chapter_from`` says how the chapter was found."""

    student: str
    notebook: str
    chapter: str
    chapter_from: str
    exercise: str
    passed: bool
    score: int | None
    feedback: str

    @property
    def not_graded(self) -> bool:
        return self.exercise == NOTEBOOK_ROW and self.feedback.startswith(NOT_GRADED)


@dataclass
class Run:
    """What executing one notebook gave: the checkers' records and what went wrong, if anything."""

    records: list[dict[str, Any]]
    errors: list[str]  # "code cell 12: NameError: name 'x' is not defined"
    timed_out: bool = False
    kernel_died: str = ""
    seconds: float = 0.0


class Interrupted(Exception):
    """Grading was stopped (Ctrl-C): the submission being graded gets no grade, and no blame."""


@dataclass
class Stop:
    """Shared by the grading threads: ``set()`` stops them, killing the kernels they are running."""

    event: threading.Event = field(default_factory=threading.Event)
    kernels: dict[int, Any] = field(default_factory=dict)  # id(client) -> client, while it runs
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self) -> None:
        self.event.set()
        with self.lock:
            clients = list(self.kernels.values())
        for client in clients:
            _kill_kernel(client)

    @contextlib.contextmanager
    def watching(self, client: Any) -> Iterator[None]:
        with self.lock:
            self.kernels[id(client)] = client
        try:
            yield
        finally:
            with self.lock:
                self.kernels.pop(id(client), None)


def _kill_kernel(client: Any) -> None:
    """Kill the process group of ``client``'s kernel (jupyter_client starts it in a session of its own)."""
    process = getattr(getattr(getattr(client, "km", None), "provisioner", None), "process", None)
    if process is not None and process.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)


# ------------------------------------------------------------------ who and which chapter


def submissions(paths: Sequence[Path]) -> list[Submission]:
    """Each path once, named relative to the common folder of all of them; the student is the first folder
    under it, or the file's stem when the files lie side by side."""
    unique = list(dict.fromkeys(p.resolve() for p in paths))
    if not unique:
        return []
    root = Path(os.path.commonpath([p.parent for p in unique]))
    result = []
    for path in unique:
        relative = path.relative_to(root)
        student = relative.parts[0] if len(relative.parts) > 1 else path.stem
        result.append(Submission(path, relative.as_posix(), student))
    return result


def chapter_clues(nb: Any, path: Path, catalogue: Catalogue) -> dict[str, str]:
    """What the notebook says of its chapter, by source: ``metadata``, ``headings``, ``file name``; any of
    them may be missing, and anything odd in the notebook counts as missing."""
    clues = {}
    book = nb.get("metadata", {}).get("transformer_book") if isinstance(nb, dict) else None
    named = book.get("chapter") if isinstance(book, dict) else None
    if isinstance(named, str) and named in catalogue:
        clues["metadata"] = named
    cells = nb.get("cells") if isinstance(nb, dict) else None
    text = "\n".join(
        _source(c)
        for c in (cells if isinstance(cells, list) else [])
        if isinstance(c, dict) and c.get("cell_type") == "markdown"
    )
    numbers = {int(n) for n in re.findall(r"Exercise (\d+)\.\d+", text)}
    by_number = {int(chapter.split("_", 1)[0]): chapter for chapter in catalogue}
    if len(numbers) == 1 and numbers <= by_number.keys():
        clues["headings"] = by_number[numbers.pop()]
    for chapter in sorted(catalogue, key=len, reverse=True):
        if chapter in path.stem:
            clues["file name"] = chapter
            break
    return clues


def find_chapter(nb: Any, path: Path, catalogue: Catalogue) -> str | None:
    """The chapter a submission belongs to: metadata, then ``Exercise N.M`` headings, then file name."""
    return next(iter(chapter_clues(nb, path, catalogue).values()), None)


def resolve_chapter(name: str, catalogue: Catalogue) -> str:
    """``--chapter``'s value, a number (``3``) or a chapter (``03_multi_head_attention``), as a chapter."""
    for chapter in catalogue:
        if name == chapter or (name.isdigit() and int(name) == int(chapter.split("_", 1)[0])):
            return chapter
    raise ValueError(f"no chapter {name!r}; the chapters are {', '.join(sorted(catalogue))}")


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    if isinstance(source, list) and all(isinstance(s, str) for s in source):
        return "".join(source)
    return source if isinstance(source, str) else ""


def _unreadable_cell(nb: Any) -> str | None:
    """Why ``nb`` cannot be executed as a notebook, or None: each cell must be a dict whose source is text."""
    cells = nb.get("cells")
    if not isinstance(cells, list):
        return "it has no list of cells"
    for i, cell in enumerate(cells, 1):
        source = cell.get("source") if isinstance(cell, dict) else None
        if not (isinstance(source, str) or (isinstance(source, list) and all(isinstance(s, str) for s in source))):
            return f"cell {i} (counting every cell from 1) has no text as its source: {source!r}"[:200]
    return None


# ------------------------------------------------------------------ running a notebook


def _client_class() -> type:
    """nbclient's NotebookClient keeping only the errors among outputs, so memory stays bounded."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_output

    class ErrorsOnlyClient(NotebookClient):
        def output(self, outs: list, msg: dict[str, Any], display_id: str | None, cell_index: int) -> Any:
            if msg["msg_type"] != "error":
                return None  # what a cell prints is not graded: the checkers' records are
            ename, evalue = (str(msg["content"].get(key, "")) for key in ("ename", "evalue"))
            out = new_output("error", ename=ename[:200] or "Error", evalue=evalue[:300], traceback=[])
            outs.append(out)
            return out

    return ErrorsOnlyClient


def execute(nb: Any, timeout_s: float, stop: Stop | None = None) -> Run:
    """Execute ``nb`` (changed in place) in a fresh kernel and collect the checkers' records.

    Raises :class:`Interrupted` when ``stop`` was set before or while it ran."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    stop = stop or Stop()

    def stop_if_interrupted(**_: Any) -> None:
        if stop.event.is_set():
            raise Interrupted

    with tempfile.TemporaryDirectory(prefix="grade-") as workdir:
        results = Path(workdir) / ".checker-results.jsonl"
        env = {**os.environ, RESULTS_ENV: str(results), "MPLBACKEND": "Agg", "TQDM_DISABLE": "1"}
        start = time.monotonic()
        deadline = start + timeout_s
        client = _client_class()(
            nb,
            kernel_name="python3",
            allow_errors=True,  # a cell that raises is reported; the next ones still run
            timeout_func=lambda cell: max(1, int(deadline - time.monotonic() + 0.999)),
            resources={"metadata": {"path": workdir}},
            on_cell_start=stop_if_interrupted,
        )
        run = Run(records=[], errors=[])
        stop_if_interrupted()
        with stop.watching(client):
            try:
                client.execute(env=env)
            except CellTimeoutError:
                run.timed_out = True
            except DeadKernelError as e:
                run.kernel_died = str(e).strip().splitlines()[0] if str(e).strip() else "the kernel died"
            except Interrupted:
                raise
            except Exception as e:  # nbclient's own failures (e.g. no kernel): the notebook did not run
                run.kernel_died = f"{type(e).__name__}: {e}"
        stop_if_interrupted()  # a kernel killed by Ctrl-C is no fault of the student's
        run.seconds = time.monotonic() - start
        run.timed_out = run.timed_out or (run.seconds > timeout_s and not run.kernel_died)
        if results.is_file():
            with open(results, encoding="utf-8") as f:
                for line in f:
                    with contextlib.suppress(json.JSONDecodeError):
                        run.records.append(json.loads(line))
    code_cells = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    for i, cell in enumerate(code_cells, 1):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                run.errors.append(f"code cell {i}: {output.get('ename', 'Error')}: {output.get('evalue', '')}"[:300])
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


def grade_run(
    name: str,
    exercises: list[Exercise],
    run: Run,
    timeout_s: float,
    *,
    student: str = "",
    chapter: str = "",
    chapter_from: str = "",
) -> list[Row]:
    """The rows of one executed submission."""

    def row(exercise: str, passed: bool, feedback: str) -> Row:
        score = (1 if passed else 0) if exercise.startswith("Exercise") else None
        return Row(student or Path(name).stem, name, chapter, chapter_from, exercise, passed, score, feedback)

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
            rows.append(row(f"Exercise {exercise.number}", False, f"no result: {why}"))
            continue
        records = [last[c] for c in exercise.checkers]
        passed = all(r.get("passed") is True and r.get("status") == "passed" for r in records)
        rows.append(
            row(f"Exercise {exercise.number}", passed, _short_feedback([str(r.get("feedback", "")) for r in records]))
        )
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
        rows.append(row(NOTEBOOK_ROW, False, "; ".join(problems)))
    return rows


def _notebook_row(sub: Submission, feedback: str) -> Row:
    """The one ``(notebook)`` row of a submission that was not graded."""
    return Row(sub.student, sub.name, "", "", NOTEBOOK_ROW, False, None, feedback[:300])


def grade_notebook(
    path: Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    submission: Submission | None = None,
    chapter: str | None = None,
    catalogue: Catalogue | None = None,
    stop: Stop | None = None,
) -> list[Row]:
    """Execute and grade one submission; problems become rows, never exceptions (:class:`Interrupted` aside).

    ``chapter`` overrides what the notebook says; ``catalogue`` defaults to the book's."""
    import nbformat

    sub = submission or Submission(path, path.name, path.stem)
    catalogue = load_catalogue() if catalogue is None else catalogue

    try:
        nb = nbformat.read(path, as_version=4)
        why = _unreadable_cell(nb) if isinstance(nb, dict) else "it is not a JSON object"
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
    if why:
        return [_notebook_row(sub, f"{NOT_GRADED}: not a readable notebook: {why}")]
    clues = chapter_clues(nb, path, catalogue)
    how, found = ("--chapter", chapter) if chapter else next(iter(clues.items()), ("", None))
    if found is None:
        why = "cannot tell which chapter this is (metadata, headings, file name): use --chapter"
        return [_notebook_row(sub, f"{NOT_GRADED}: {why}")]
    rows = []
    if any(c != found for c in clues.values()):
        said = ", ".join(f"the {source} say{'' if source.endswith('s') else 's'} {c}" for source, c in clues.items())
        unclear = f"the chapter is unclear: {said}; graded as {found} (from the {how}); --chapter chooses"
        rows.append(Row(sub.student, sub.name, found, how, WARNING_ROW, False, None, unclear))
    run = execute(nb, timeout_s, stop)
    return rows + grade_run(
        sub.name, catalogue[found], run, timeout_s, student=sub.student, chapter=found, chapter_from=how
    )


def grade_all(
    paths: Sequence[Path],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    jobs: int = 1,
    chapter: str | None = None,
    catalogue: Catalogue | None = None,
    progress: bool = False,
) -> tuple[list[Row], bool]:
    """Grade every submission, ``jobs`` at a time; the rows in the order of ``paths``, and whether grading
    was interrupted (Ctrl-C). The submissions not graded then get one "not graded: interrupted" row each."""
    catalogue = load_catalogue() if catalogue is None else catalogue
    subs = submissions(paths)
    stop = Stop()
    done: dict[int, list[Row]] = {}

    def one(i: int) -> None:
        sub = subs[i]
        if progress:
            print(f"grading {sub.name} ...", file=sys.stderr, flush=True)
        try:
            done[i] = grade_notebook(
                sub.path, timeout_s, submission=sub, chapter=chapter, catalogue=catalogue, stop=stop
            )
        except Interrupted:
            pass
        except Exception as e:  # the grader's own failure: no fault of the student's
            done[i] = [_notebook_row(sub, f"{NOT_GRADED}: the grader failed: {type(e).__name__}: {e}")]

    interrupted = False
    pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="grade")
    futures = [pool.submit(one, i) for i in range(len(subs))]
    try:
        for future in futures:
            future.result()
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
        with _ignoring_sigint():
            pool.shutdown(wait=False, cancel_futures=True)
            for future in futures:  # the running ones end soon: their kernels were killed
                with contextlib.suppress(Exception):
                    future.result(timeout=60)
                stop.set()
    finally:
        pool.shutdown(wait=not interrupted, cancel_futures=True)
    rows = []
    for i, sub in enumerate(subs):
        rows += done.get(i) or [_notebook_row(sub, INTERRUPTED)]
    return rows, interrupted


@contextlib.contextmanager
def _ignoring_sigint() -> Iterator[None]:
    """A second Ctrl-C while the grader cleans up and writes the CSV is ignored (only in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# ------------------------------------------------------------------ reporting


def format_table(rows: Sequence[Row], catalogue: Catalogue | None = None) -> str:
    """The rows as a table, then each notebook's score."""
    catalogue = load_catalogue() if catalogue is None else catalogue
    by_number = {f"Exercise {e.number}": e for exercises in catalogue.values() for e in exercises}
    lines = []
    width = max((len(r.notebook) for r in rows), default=8)
    for r in rows:
        exercise = by_number.get(r.exercise)
        title = f"{r.exercise} ({exercise.kind}: {exercise.title})" if exercise else r.exercise
        mark = "✅" if r.passed else ("⚠️" if r.exercise == WARNING_ROW else "❌")
        lines.append(f"{r.notebook:<{width}}  {mark} {title}\n{'':<{width}}     {r.feedback[:300]}")
    lines.append("")
    for notebook in dict.fromkeys(r.notebook for r in rows):
        mine = [r for r in rows if r.notebook == notebook]
        graded = [r for r in mine if r.score is not None]
        if any(r.not_graded for r in mine):
            lines.append(f"{notebook:<{width}}  not graded")
        else:
            lines.append(
                f"{notebook:<{width}}  {sum(r.passed for r in graded)}/{len(graded)} auto-checked exercises passed"
            )
    return "\n".join(lines)


def _write_atomically(path: Path, header: Sequence[str], lines: Sequence[Sequence[Any]]) -> None:
    """Write a CSV whole or not at all: a temporary file beside ``path``, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows(lines)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_csv(rows: Sequence[Row], path: Path) -> None:
    """The rows, with the columns :data:`COLUMNS`; ``score`` is empty for the ``(notebook)``/``(warning)`` rows."""
    lines = [[*astuple(r)[:6], "" if r.score is None else r.score, r.feedback] for r in rows]
    _write_atomically(path, COLUMNS, lines)


def summary_path(csv_path: Path) -> Path:
    """Where the per-student summary of ``grades.csv`` goes: ``grades_students.csv`` beside it."""
    return csv_path.with_name(f"{csv_path.stem}_students.csv")


def write_summary(rows: Sequence[Row], path: Path, catalogue: Catalogue | None = None) -> None:
    """One row per student, one column per chapter graded: the exercises passed, the best of the student's
    notebooks of that chapter; empty when none of them was graded. The header gives each chapter's total."""
    catalogue = load_catalogue() if catalogue is None else catalogue
    scores: dict[str, dict[str, dict[str, int | None]]] = {}  # student -> chapter -> notebook -> passed
    for r in rows:
        if not r.chapter:
            scores.setdefault(r.student, {})
            continue
        notebook = scores.setdefault(r.student, {}).setdefault(r.chapter, {})
        if r.not_graded:
            notebook[r.notebook] = None
        elif r.score is not None and notebook.get(r.notebook, 0) is not None:
            notebook[r.notebook] = notebook.get(r.notebook, 0) + r.score
    chapters = sorted({c for per_student in scores.values() for c in per_student})
    totals = {c: sum(1 for e in catalogue.get(c, []) if e.checkers) for c in chapters}
    lines = []
    for student, per_chapter in scores.items():
        cells = []
        for c in chapters:
            passed = [p for p in per_chapter.get(c, {}).values() if p is not None]
            cells.append(max(passed) if passed else "")
        lines.append([student, *cells])
    _write_atomically(path, ["student", *(f"{c} (of {totals[c]})" for c in chapters)], lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lib.grade",
        description="Execute students' notebooks in fresh kernels and collect every exercise checker's result.",
        epilog=f"exit status: {EXIT_OK} every submission was graded (its rows may still fail); "
        f"{EXIT_NOT_ALL_GRADED} some could not be (unreadable, no chapter found, the grader's failure: "
        "see their (notebook) rows); "
        f"{EXIT_INTERRUPTED} interrupted by Ctrl-C (the rows done are kept, the others read 'not graded: "
        "interrupted'); 2 a bad command line.",
    )
    parser.add_argument(
        "submissions", nargs="+", type=Path, help="the .ipynb files to grade (alice/01_attention.ipynb ...)"
    )
    parser.add_argument(
        "--csv", type=Path, help="also write the rows to this CSV file, and the per-student summary beside it"
    )
    parser.add_argument("--summary", type=Path, help="the per-student CSV (default: NAME_students.csv beside --csv)")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds for each whole notebook (default 600)"
    )
    parser.add_argument("--chapter", help="grade every submission as this chapter (3 or 03_multi_head_attention)")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="grade N notebooks at a time (default 1)")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    if args.jobs < 1:
        parser.error(f"-j must be at least 1, got {args.jobs}")
    try:
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError:
        parser.error("the grader needs nbclient and nbformat: pip install 'transformer_lib[grade]'")
    catalogue = load_catalogue()
    chapter = None
    if args.chapter:
        try:
            chapter = resolve_chapter(args.chapter, catalogue)
        except ValueError as e:
            parser.error(f"--chapter: {e}")
    rows, interrupted = grade_all(
        args.submissions, args.timeout, jobs=args.jobs, chapter=chapter, catalogue=catalogue, progress=True
    )
    with _ignoring_sigint():
        print(format_table(rows, catalogue))
        if args.csv:
            write_csv(rows, args.csv)
            print(f"wrote {args.csv}")
        if args.csv or args.summary:
            summary = args.summary or summary_path(args.csv)
            write_summary(rows, summary, catalogue)
            print(f"wrote {summary}")
    if interrupted:
        print("interrupted: the submissions not graded say so", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_NOT_ALL_GRADED if any(r.not_graded for r in rows) else EXIT_OK

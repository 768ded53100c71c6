"""Grade a class: execute each submitted notebook in a fresh kernel and collect its checkers' results.

Usage::

    python -m transformer_lib.grade SUBMISSION.ipynb [...] [--csv OUT.csv] [--summary S.csv] [--timeout S]
                                    [--chapter N] [-j N] [--sandbox] [--memory GB]

Each submission runs top to bottom in a new Python kernel (nbclient), with at most ``--timeout`` seconds
for the whole notebook (default 600); ``-j N`` runs N of them at a time. A cell that raises does not stop
the run: the next cells still execute, as "Run all" would not, so one broken exercise costs only that
exercise. The exercises a submission should answer come from the book's catalogue
(``exercises/catalogue.json``), for the chapter given by ``--chapter``, or else named in the notebook's
metadata (the Colab and teacher copies carry it), by its ``Exercise 3.2`` headings or in its file name
(``03_multi_head_attention.ipynb``), so deleting an exercise's cells does not remove it from the grade.
When those disagree, a ``(warning)`` row says so.

**Where a submission runs.** Each kernel starts in a new temporary folder that holds only a copy of its
notebook, through a small wrapper (:mod:`._contain`) that is the *subreaper* of everything the kernel
starts: when the notebook ends, runs out of time or is stopped, every process it started is killed, also
one that left the kernel's process group and session (``setsid sleep 300``). The kernel may allocate at
most ``--memory`` GB (default 8; ``RLIMIT_DATA``): an allocation beyond it fails in the student's cell
(``MemoryError``, named in the row), not in the grader. The grader re-executes itself with its arguments
in an unnamed file, so that no process's command line (``/proc/*/cmdline``) shows the other submissions'
paths or the CSV's. With ``--sandbox`` (Linux, bubblewrap's ``bwrap``) the kernel also runs in new
namespaces: no network (only a loopback of its own), no other process visible, the system and Python
read-only, the book's package visible but not the folder that holds it, ``/tmp`` empty, and only its
temporary folder writable.

**How results come back.** After every cell the grader asks the kernel, in the execute request's
``user_expressions``, for the record of each checker's last call (:func:`.exercises._framework.grader_records`);
the value comes back in that cell's execute reply. What a cell prints, displays or writes to a file is
never read: a record printed or appended to a results file passes nothing. Outputs other than errors are
dropped as they arrive, so a notebook that prints 60 MB costs the grader nothing.

**What remains possible.** The checkers run in the student's own kernel, as in nbgrader and otter-grader:
code in the notebook can change what a checker sees or reports, for instance by monkeypatching
``torch.softmax`` so that a checker comparing with it passes, or by editing the checkers' records in
memory. Nothing outside the kernel re-checks an answer, so a grade is as trustworthy as the student's
good faith against someone who reads this library's code; read the notebooks of a grade that surprises
you. Without ``--sandbox``, a submission runs with your permissions: it can read and write any file you
can and use the network. Use ``--sandbox``, or a container or an unprivileged user, for notebooks you do
not trust.

**The rows.** Each submission is named by its path relative to the common folder of all the arguments
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
"""

from __future__ import annotations

import argparse
import ast
import atexit
import contextlib
import csv
import functools
import json
import os
import re
import shutil
import signal
import subprocess
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
DEFAULT_MEMORY_GB = 8.0
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
    """Stop ``client``'s kernel: SIGTERM to the process that contains it (:mod:`._contain`), which kills the
    kernel and everything it started, and exits."""
    process = getattr(getattr(getattr(client, "km", None), "provisioner", None), "process", None)
    if process is not None and process.poll() is None:
        with contextlib.suppress(OSError):
            process.send_signal(signal.SIGTERM)


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


CONTAIN = Path(__file__).with_name("_contain.py")
RECORDS_EXPRESSION = (
    "(lambda m: m.grader_records() if m else '[]')"
    "(__import__('sys').modules.get('transformer_lib.notebook.exercises._framework'))"
)
"""What the grader asks the kernel after every cell (``user_expressions``): the checkers' last records, as
JSON; the framework is not imported for it (a notebook that never imported it has called no checker)."""


@dataclass(frozen=True)
class Limits:
    """Where and how a submission runs: ``memory_bytes`` of data at most (None: no limit), and, with
    ``sandbox``, under bubblewrap: no network, the system read-only, only its temporary folder writable."""

    memory_bytes: int | None = int(DEFAULT_MEMORY_GB * 2**30)
    sandbox: bool = False


def bwrap_command(run_dir: Path, work_dir: Path) -> list[str]:
    """The bubblewrap command line that confines a kernel: every namespace new (no network: only a loopback
    of its own; no other process visible), the system and Python read-only, only ``run_dir`` writable and
    ``/tmp`` empty; the book's package is visible, but not the folder that holds it."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise RuntimeError("--sandbox needs bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; `make sandbox`)")
    command = [bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
    # an empty /tmp first: mounted after the binds, it would hide a Python (or a book) that lives under /tmp
    command += ["--tmpfs", "/tmp"]
    system = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc"]
    for path in system:
        command += ["--ro-bind-try", path, path]
    for path in _python_paths():
        if not any(path == s or path.startswith(s + "/") for s in system):
            command += ["--ro-bind", path, path]
    command += ["--proc", "/proc", "--dev", "/dev"]
    command += ["--bind", str(run_dir), str(run_dir), "--chdir", str(work_dir)]
    # the kernel's parent is the namespace's PID 1: ipykernel would take that for its parent's exit
    # (bubblewrap's --die-with-parent and the containment bound its life instead)
    command += ["--setenv", "JPY_PARENT_PID", "1", "--"]
    return command


@functools.cache
def _python_paths() -> tuple[str, ...]:
    """What a kernel needs to see of Python: the interpreter's prefixes and the folders of its ``sys.path``
    (each folder that holds ``transformer_lib`` only through that package, not the rest of the folder)."""
    # the package's own folder too: an editable install (pip install -e) finds it through an import hook,
    # not through a folder of sys.path
    probe = (
        "import json, os, sys, transformer_lib; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, "
        "os.path.dirname(transformer_lib.__file__), *sys.path]))"
    )
    env = {k: v for k, v in os.environ.items() if k != RESULTS_ENV}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    paths = [os.path.realpath(sys.executable)]
    for entry in json.loads(out.stdout):
        if not entry or not os.path.isdir(entry):
            continue
        package = os.path.join(entry, "transformer_lib")
        paths.append(package if os.path.isdir(package) else entry)
    paths = [os.path.realpath(p) for p in paths]
    return tuple(dict.fromkeys(p for p in paths if not any(p.startswith(q + "/") for q in paths if q != p)))


def _kernel_manager(run_dir: Path, prefix: list[str]) -> Any:
    """A kernel manager whose kernel talks through Unix sockets in ``run_dir`` (no TCP port: the sandbox has
    no network) and is started by ``prefix`` (the containment, maybe bubblewrap); "kill" and "terminate" send
    SIGTERM to the containing process only, so that it can kill everything the kernel started."""
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_client.provisioning import LocalProvisioner

    class ContainedProvisioner(LocalProvisioner):  # type: ignore[misc]
        async def kill(self, restart: bool = False) -> None:
            if self.process is not None and self.process.poll() is None:
                with contextlib.suppress(OSError):
                    self.process.send_signal(signal.SIGTERM)

        terminate = kill

    class ContainedKernelManager(AsyncKernelManager):  # type: ignore[misc]
        async def _async_pre_start_kernel(self, **kw: Any) -> tuple[list[str], dict[str, Any]]:
            command, kw = await super()._async_pre_start_kernel(**kw)
            self.provisioner.__class__ = ContainedProvisioner
            return [*prefix, *command], kw

    kernel = run_dir / "kernel"
    kernel.mkdir()
    transport = "ipc" if os.name == "posix" else "tcp"  # zmq has no Unix sockets on Windows
    return ContainedKernelManager(kernel_name="python3", transport=transport, connection_file=str(kernel / "c.json"))


def _client_class() -> type:
    """nbclient's NotebookClient that keeps only the errors among outputs (so memory stays bounded) and takes
    the checkers' records from each execute reply, never from what a cell prints or writes."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_output

    class GradingClient(NotebookClient):
        records: list[dict[str, Any]] = []

        def output(self, outs: list, msg: dict[str, Any], display_id: str | None, cell_index: int) -> Any:
            if msg["msg_type"] != "error":
                return None  # what a cell prints is not graded: the checkers' records are
            ename, evalue = (str(msg["content"].get(key, "")) for key in ("ename", "evalue"))
            out = new_output("error", ename=ename[:200] or "Error", evalue=evalue[:300], traceback=[])
            outs.append(out)
            return out

        async def async_start_new_kernel_client(self) -> Any:
            kc = await super().async_start_new_kernel_client()
            kc.execute = functools.partial(kc.execute, user_expressions={"records": RECORDS_EXPRESSION})
            return kc

        def take_records(self, cell: Any, cell_index: int, execute_reply: dict[str, Any]) -> None:
            value = execute_reply.get("content", {}).get("user_expressions", {}).get("records", {})
            if value.get("status") != "ok":
                return  # the cell raised: IPython computes no expression; the next cell's reply has them
            with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                records = json.loads(ast.literal_eval(value["data"]["text/plain"]))
                if isinstance(records, list):
                    self.records = records

    return GradingClient


GRADER_CELL = "# the grader's cell: its execute reply carries the checkers' last records"


def execute(nb: Any, timeout_s: float, stop: Stop | None = None, limits: Limits | None = None) -> Run:
    """Execute ``nb`` (changed in place) in a fresh kernel and collect the checkers' records.

    The kernel runs in a new temporary folder holding only a copy of the notebook, contained by
    :mod:`._contain` (everything it starts is killed when it ends; ``limits.memory_bytes``), under
    bubblewrap with ``limits.sandbox``. Raises :class:`Interrupted` when ``stop`` was set before or while
    it ran."""
    import nbformat
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    stop = stop or Stop()
    limits = limits or Limits()

    def stop_if_interrupted(**_: Any) -> None:
        if stop.event.is_set():
            raise Interrupted

    student_cells = len(nb.cells)
    with tempfile.TemporaryDirectory(prefix="grade-") as run_dir:
        run = Path(run_dir)
        work, home = run / "work", run / "home"
        work.mkdir()
        home.mkdir()
        nbformat.write(nb, work / "submission.ipynb")
        prefix: list[str] = []
        if os.name == "posix":  # Windows: no containment, no memory limit (the docstring says Linux)
            prefix = [sys.executable, "-I", "-S", str(CONTAIN)]
            if limits.memory_bytes:
                prefix += ["--memory-bytes", str(limits.memory_bytes)]
            prefix.append("--")
        env = {k: v for k, v in os.environ.items() if k != RESULTS_ENV}
        env |= {"MPLBACKEND": "Agg", "TQDM_DISABLE": "1"}
        if limits.sandbox:
            prefix += bwrap_command(run, work)
            env |= {"HOME": str(home), "MPLCONFIGDIR": str(home / ".matplotlib"), "TMPDIR": "/tmp"}
        nb.cells.append(nbformat.v4.new_code_cell(GRADER_CELL))
        start = time.monotonic()
        deadline = start + timeout_s
        client = _client_class()(
            nb,
            km=_kernel_manager(run, prefix),
            allow_errors=True,  # a cell that raises is reported; the next ones still run
            timeout_func=lambda cell: max(1, int(deadline - time.monotonic() + 0.999)),
            resources={"metadata": {"path": str(work)}},
            on_cell_start=stop_if_interrupted,
            shutdown_kernel="immediate",
        )
        client.on_cell_executed = client.take_records
        client.owns_km = True  # nbclient shuts the kernel down when the notebook ends
        result = Run(records=[], errors=[])
        stop_if_interrupted()
        with stop.watching(client):
            try:
                client.execute(env=env)
            except CellTimeoutError:
                result.timed_out = True
            except DeadKernelError as e:
                result.kernel_died = str(e).strip().splitlines()[0] if str(e).strip() else "the kernel died"
            except Interrupted:
                raise
            except Exception as e:  # nbclient's own failures (e.g. no kernel): the notebook did not run
                result.kernel_died = f"{type(e).__name__}: {e}"[:300]
            finally:
                del nb.cells[student_cells:]
                atexit.unregister(client._cleanup_kernel)  # nbclient leaves it registered when the start fails
        stop_if_interrupted()  # a kernel killed by Ctrl-C is no fault of the student's
        result.seconds = time.monotonic() - start
        result.timed_out = result.timed_out or (result.seconds > timeout_s and not result.kernel_died)
        result.records = client.records
    code_cells = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    for i, cell in enumerate(code_cells, 1):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                error = f"code cell {i}: {output.get('ename', 'Error')}: {output.get('evalue', '')}"[:300]
                if _out_of_memory(output) and limits.memory_bytes:
                    error += f" (the memory limit is {limits.memory_bytes / 2**30:g} GB)"
                result.errors.append(error)
    return result


def _out_of_memory(output: dict[str, Any]) -> bool:
    """Whether an error output is an allocation that failed (Python's MemoryError, PyTorch's allocator)."""
    text = f"{output.get('ename', '')}: {output.get('evalue', '')}"
    return "MemoryError" in text or "can't allocate memory" in text or "out of memory" in text.lower()


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
    limits: Limits | None = None,
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
    run = execute(nb, timeout_s, stop, limits)
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
    limits: Limits | None = None,
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
                sub.path, timeout_s, submission=sub, chapter=chapter, catalogue=catalogue, stop=stop, limits=limits
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


ARGS_FD_OPTION = "--arguments-from-fd"


def _hide_arguments() -> None:
    """Start this command again with its arguments in an unnamed file (an inherited descriptor of a file
    already deleted) rather than on its command line, which any process of the same user can read in
    ``/proc/<pid>/cmdline``: a submission then finds no other student's path there (POSIX only)."""
    fd, path = tempfile.mkstemp(prefix="grade-arguments-")
    os.unlink(path)
    os.write(fd, json.dumps(sys.argv[1:]).encode())
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "transformer_lib.grade", ARGS_FD_OPTION, str(fd)])


def _arguments(argv: Sequence[str] | None) -> list[str]:
    """The command line's arguments: ``argv``, or this process's own, read back from the descriptor that
    :func:`_hide_arguments` passed (which re-executes this process when they are still on its command line)."""
    if argv is not None:
        return list(argv)
    given = sys.argv[1:]
    if given[:1] == [ARGS_FD_OPTION] and len(given) == 2 and given[1].isdigit():
        with os.fdopen(int(given[1]), "rb") as f:
            return [str(a) for a in json.loads(f.read())]
    if os.name == "posix" and given and not {"-h", "--help"} & set(given):
        _hide_arguments()
    return given


def main(argv: Sequence[str] | None = None) -> int:
    argv = _arguments(argv)
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
    parser.add_argument(
        "--sandbox",
        action="store_true",
        help="run each kernel under bubblewrap (bwrap): no network, the system read-only, only its temporary "
        "folder writable, no other process visible (Linux; apt-get install bubblewrap)",
    )
    parser.add_argument(
        "--memory",
        type=float,
        default=DEFAULT_MEMORY_GB,
        metavar="GB",
        help=f"the most memory a kernel may allocate, in GB (default {DEFAULT_MEMORY_GB:g}; 0: no limit); "
        "an allocation beyond it fails in the student's cell",
    )
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    if args.jobs < 1:
        parser.error(f"-j must be at least 1, got {args.jobs}")
    if args.memory < 0:
        parser.error(f"--memory must be 0 (no limit) or a positive number of GB, got {args.memory:g}")
    if args.sandbox and shutil.which("bwrap") is None:
        parser.error("--sandbox needs bubblewrap's bwrap: apt-get install bubblewrap (or `make sandbox`)")
    limits = Limits(int(args.memory * 2**30) or None, args.sandbox)
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
        args.submissions,
        args.timeout,
        jobs=args.jobs,
        chapter=chapter,
        catalogue=catalogue,
        progress=True,
        limits=limits,
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

"""Grade a class: ``transformer-grade SUBMISSION.ipynb [...] --csv grades.csv [--timeout S] [--memory GB] [-j N]``.

Each submission runs top to bottom in a fresh kernel (nbclient) with ``--timeout`` seconds for the whole
notebook; a cell that raises does not stop it. Its chapter comes from ``--chapter``, its metadata, its
``Exercise 3.2`` headings or its file name (a ``(warning)`` row says when they disagree). After every cell
the grader asks the kernel, in the execute request's ``user_expressions``, for each checker's last record:
what a cell prints or writes is never read. A submission is named by its path below the common folder of
all of them, its student by the folders above the notebook (``secA/alice``; ``--student-depth N``: the
first N), or by the file's stem when the notebooks lie side by side. Problems become rows, never
exceptions: a row per auto-checked exercise, plus a ``(notebook)`` row when the notebook as a whole went
wrong or was "not graded" (unreadable, no chapter, Ctrl-C, the grader's failure). Exit status: 0 all
graded, 1 some not, 130 Ctrl-C (the rows done are kept), 2 a bad command line.

**Guarantees.** Each kernel runs under bubblewrap with every capability dropped, in new PID, network, IPC
and UTS namespaces, as an unprivileged uid (as root: 65533-k for the k-th parallel slot; otherwise the
teacher's, in a user namespace): no network, no other process, the system and Python read-only, an empty
``/tmp``, and of the disk only its own folder, holding a copy of its notebook (not the grader, the other
submissions or the book's folder). Killing bubblewrap ends the namespace: nothing a submission starts
outlives its row, whatever it does to its parent. A watchdog outside kills the sandbox at the deadline, or
when the proportional memory (PSS) of all its processes exceeds ``--memory`` (looked at every 0.2 s: a
burst between two looks can pass it briefly); each process also has ``RLIMIT_DATA`` (so an allocation
beyond the limit fails in the student's cell) and the submission at most 512 processes and threads
(``RLIMIT_NPROC``, per slot's uid or user namespace). A kernel message over 32 MB is dropped unread and
fails the submission. Kernels' stdout and stderr go nowhere. With ``--csv``, both CSVs are rewritten (whole,
renamed into place) as each submission finishes, so a killed grader keeps every finished row; the same
command then grades only the notebooks the CSV lacks or did not grade, or whose bytes changed (its
``sha256`` column). A CSV cell beginning with ``= + - @`` gets a leading ``'``; feedback is cut at 500
characters.

**What remains possible.** The checkers run in the student's own kernel, as in nbgrader and otter-grader:
a notebook can monkeypatch what a checker compares with, or forge the records in memory; nothing outside
re-checks an answer, so read the notebooks of a grade that surprises you. With ``--no-sandbox`` a notebook
runs with your permissions: it can read and write your files, use the network, signal the grader and the
other kernels, and leave processes running.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import atexit
import contextlib
import csv
import functools
import hashlib
import json
import math
import os
import queue
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, replace
from pathlib import Path
from typing import Any

import nbformat
import zmq.asyncio
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from zmq.utils.monitor import recv_monitor_message

from .exercises.catalogue import Exercise, load_catalogue

DEFAULT_TIMEOUT_S, DEFAULT_MEMORY_GB, MAX_PROCESSES, FIRST_UID = 600.0, 8.0, 512, 65533
MAX_MESSAGE_BYTES, MAX_FEEDBACK, POLL_S = 32 * 2**20, 500, 0.2
NOTEBOOK_ROW, WARNING_ROW, NOT_GRADED = "(notebook)", "(warning)", "not graded"
INTERRUPTED = f"{NOT_GRADED}: interrupted (Ctrl-C) before its grade was complete; grade it again"
PENDING = f"{NOT_GRADED}: not reached yet; run the same command again to resume"
TOO_LARGE = f"the kernel sent a message over {MAX_MESSAGE_BYTES >> 20} MB (or broke its connection)"
COLUMNS = ("student", "notebook", "chapter", "chapter_from", "exercise", "passed", "score", "feedback", "sha256")
EXIT_OK, EXIT_NOT_ALL_GRADED, EXIT_INTERRUPTED = 0, 1, 130
FRAMEWORK = "transformer_lib.notebook.exercises._framework"  # asked after every cell for the checkers' records:
RECORDS = f"(lambda m: m.grader_records() if m else '[]')(__import__('sys').modules.get('{FRAMEWORK}'))"
Catalogue = dict[str, list[Exercise]]


@dataclass(frozen=True)
class Submission:
    path: Path
    name: str  # below the common folder: secA/alice/01_attention.ipynb
    student: str


@dataclass(frozen=True)
class Row:
    """One line of the grade; ``score`` is 1 or 0 for an exercise, None for the other rows."""

    student: str
    notebook: str
    chapter: str
    chapter_from: str
    exercise: str
    passed: bool
    score: int | None
    feedback: str
    sha256: str = ""  # of the notebook graded

    @property
    def not_graded(self) -> bool:
        return self.exercise == NOTEBOOK_ROW and self.feedback.startswith(NOT_GRADED)


def _note(sub: Submission, feedback: str) -> Row:
    """The ``(notebook)`` row of a submission that was not graded."""
    return Row(sub.student, sub.name, "", "", NOTEBOOK_ROW, False, None, feedback[:300])


@dataclass
class Run:
    records: list[dict[str, Any]]  # each checker call's record, in order
    errors: list[str]  # "code cell 12: NameError: name 'x' is not defined"
    timed_out: bool = False
    kernel_died: str = ""


@dataclass(frozen=True)
class Settings:
    """How each submission runs: ``timeout_s`` for the notebook, ``memory_bytes`` for all its processes (None:
    no limit), under bubblewrap if ``sandbox``, as ``uid`` (root only), as ``chapter`` (None: as it says)."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_bytes: int | None = int(DEFAULT_MEMORY_GB * 2**30)
    sandbox: bool = True
    uid: int | None = FIRST_UID if os.geteuid() == 0 else None
    chapter: str | None = None
    depth: int | None = None  # of the student's folders


class Stop(threading.Event):
    """Set by Ctrl-C: it kills the sandboxes ``running``; what they were grading gets no row."""

    def __init__(self) -> None:
        super().__init__()
        self.running: set[Sandbox] = set()

    def set(self) -> None:
        super().set()
        for sandbox in list(self.running):
            sandbox.kill(NOT_GRADED)


def submissions(paths: Sequence[Path], depth: int | None = None) -> list[Submission]:
    """Each path once, named below the common folder; the student is the folders above the notebook (the
    first ``depth``), or the file's stem when the files lie side by side."""
    unique = list(dict.fromkeys(p.resolve() for p in paths))
    root = Path(os.path.commonpath([p.parent for p in unique])) if unique else Path()
    named = [(p, p.relative_to(root)) for p in unique]
    return [Submission(p, r.as_posix(), "/".join(r.parts[:-1][:depth]) or p.stem) for p, r in named]


def chapter_clues(nb: Any, path: Path, catalogue: Catalogue) -> dict[str, str]:
    """What a valid notebook says of its chapter, by source: ``metadata``, ``headings``, ``file name``."""
    book = nb.metadata.get("transformer_book")
    named = book.get("chapter") if isinstance(book, dict) else None
    clues = {"metadata": named} if isinstance(named, str) and named in catalogue else {}
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    numbers = {int(n) for n in re.findall(r"Exercise (\d+)\.\d+", text)}
    by_number = {int(chapter.split("_", 1)[0]): chapter for chapter in catalogue}
    if len(numbers) == 1 and numbers <= by_number.keys():
        clues["headings"] = by_number[numbers.pop()]
    in_name = [chapter for chapter in sorted(catalogue, key=len, reverse=True) if chapter in path.stem]
    return clues | ({"file name": in_name[0]} if in_name else {})


def resolve_chapter(name: str, catalogue: Catalogue) -> str:
    """``--chapter``'s value, a number (``3``) or a chapter (``03_multi_head_attention``), as a chapter."""
    for chapter in catalogue:
        if name == chapter or (name.isdigit() and int(name) == int(chapter.split("_", 1)[0])):
            return chapter
    raise ValueError(f"no chapter {name!r}; the chapters are {', '.join(sorted(catalogue))}")


def sandbox_command(run: Path, uid: int | None, tmp_bytes: int | None) -> list[str]:
    """bubblewrap's command for a kernel in folder ``run``. As root (``uid``): no user namespace (uid 0 in one
    escapes RLIMIT_NPROC); setpriv drops the kernel to ``uid``, with no capability left to regain."""
    if uid is None:
        command = ["bwrap", "--unshare-all", "--cap-drop", "ALL"]
    else:
        command = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--cap-drop", "ALL"]
        command += [a for cap in ("SETUID", "SETGID", "SETPCAP") for a in ("--cap-add", f"CAP_{cap}")]
    size = ["--size", str(tmp_bytes)] if tmp_bytes else []
    command += ["--die-with-parent", "--new-session", "--perms", "1777", *size, "--tmpfs", "/tmp"]
    system = [p for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc") if os.path.exists(p)]
    mine = [p for p in _python_paths() if not any(p == s or p.startswith(s + "/") for s in system)]
    above = {str(a) for p in [*mine, str(run)] for a in Path(p).parents} - {"/", "/tmp"}
    command += [a for p in sorted(above) for a in ("--perms", "0755", "--dir", p)]  # bwrap would make them 0700
    command += [a for p in system + mine for a in ("--ro-bind", p, p)]
    command += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", *size, "--tmpfs", "/dev/shm"]
    command += ["--bind", str(run), str(run), "--chdir", str(run / "work"), "--setenv", "JPY_PARENT_PID", "1"]
    if uid is not None:
        command += ["--", "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"]
        command += ["--bounding-set=-all"]
    return [*command, "--"]


@functools.cache
def _python_paths() -> list[str]:
    """What a kernel sees of Python: the interpreter's prefixes and the book's package (not its folder)."""
    import transformer_lib

    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    paths = [os.path.realpath(p) for p in [*paths, os.path.dirname(transformer_lib.__file__)]]
    return sorted({p for p in paths if not any(p.startswith(q + "/") for q in paths)})


def sandbox_problem() -> str:
    """Why a kernel cannot run in the sandbox here, or ''."""
    if shutil.which("bwrap") is None or shutil.which("setpriv") is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap; `make sandbox`)"
    with tempfile.TemporaryDirectory(prefix="grade-") as run:
        _make_folder(Path(run), Settings().uid)
        probe = [*sandbox_command(Path(run), Settings().uid, None), sys.executable, "-c", "import ipykernel"]
        done = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    return f"bubblewrap cannot start a kernel here: {done.stderr.strip()[-300:]}" if done.returncode else ""


def _make_folder(run: Path, uid: int | None) -> None:
    """``run`` and its ``work``, ``home`` and ``kernel`` folders, owned by ``uid``."""
    for path in (run, run / "work", run / "home", run / "kernel"):
        path.mkdir(exist_ok=True)
        path.chmod(0o711)  # bubblewrap's root, without capabilities, must enter them
        if uid is not None:
            os.chown(path, uid, uid)


def _memory(root: int) -> int:
    """The PSS in bytes of ``root`` and its descendants (a PID namespace keeps orphans among them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_bytes()
            children.setdefault(int(stat[stat.rfind(b")") + 2 :].split()[1]), []).append(int(entry))
    found, total = [root], 0
    while found:
        pid = found.pop()
        found += children.get(pid, [])
        with contextlib.suppress(OSError, TypeError):
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            total += int(re.search(r"^Pss:\s+(\d+)", rollup, re.MULTILINE)[1]) * 1024  # type: ignore[index]
    return total


class Sandbox:
    """One kernel's process tree: waiting until ``start``, watched until ``kill`` (its first reason stays)."""

    def __init__(self, settings: Settings) -> None:
        self.settings, self.deadline = settings, time.monotonic() + settings.timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.reason, self.done = "", threading.Event()
        self.stdin, self.release = os.pipe()

    def start(self, process: subprocess.Popen[bytes], connection_file: Path) -> None:
        """Set ``process``'s limits, let it exec the kernel (it waits on its stdin), and watch it."""
        self.process, memory, uid = process, self.settings.memory_bytes, self.settings.uid
        resource.prlimit(process.pid, resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
        if memory:
            resource.prlimit(process.pid, resource.RLIMIT_DATA, (memory, memory))
        if uid is not None and self.settings.sandbox:
            os.chown(connection_file, uid, uid)
        for fd in (self.stdin, self.release):  # the process waits for this end of its stdin to close
            os.close(fd)
        self.stdin = self.release = -1
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        memory = self.settings.memory_bytes
        while not self.done.wait(POLL_S) and self.process is not None:
            if time.monotonic() > self.deadline:
                self.kill(f"ran out of time: stopped after {self.settings.timeout_s:g} s (an infinite loop?)")
            elif memory and _memory(self.process.pid) > memory:
                self.kill(f"its processes together used more than the memory limit ({memory / 2**30:g} GB)")

    def kill(self, reason: str) -> None:
        """Kill the whole tree (bubblewrap: its PID namespace dies with it) and reap it."""
        self.reason = self.reason or reason
        self.done.set()
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


class KernelCommand(KernelSpecManager):  # type: ignore[misc]
    """The one kernel spec: ipykernel started by ``prefix`` (the sandbox)."""

    def __init__(self, prefix: list[str]) -> None:
        super().__init__()
        self.argv = [*prefix, sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(argv=self.argv, display_name="grade", language="python")


class KernelManager(AsyncKernelManager):  # type: ignore[misc]
    """jupyter_client's manager whose clients use its zmq context (which caps the size of a message)."""

    def client(self, **kw: Any) -> Any:
        return super().client(context=self.context, **kw)


class GradingClient(NotebookClient):  # type: ignore[misc]
    """nbclient's client keeping only errors among outputs and the records of each execute reply; it lets
    the sandbox start once launched, and kills it when zmq dropped a message over the limit."""

    records: list[dict[str, Any]] = []
    sandbox: Sandbox
    watchers: list[asyncio.Future[None]]

    def output(self, outs: list[Any], msg: dict[str, Any], display_id: Any, cell_index: int) -> Any:
        if msg["msg_type"] != "error":
            return None  # what a cell prints is not graded
        ename, evalue = (str(msg["content"].get(key, "")) for key in ("ename", "evalue"))
        outs.append(nbformat.v4.new_output("error", ename=ename[:200] or "Error", evalue=evalue[:300], traceback=[]))
        return outs[-1]

    async def async_start_new_kernel(self, **kw: Any) -> None:
        await super().async_start_new_kernel(**kw)
        self.sandbox.start(self.km.provisioner.process, Path(self.km.connection_file))

    async def async_start_new_kernel_client(self) -> Any:
        kc = await super().async_start_new_kernel_client()
        kc.execute = functools.partial(kc.execute, user_expressions={"records": RECORDS})
        for channel in (kc.shell_channel, kc.iopub_channel):
            monitor = channel.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            self.watchers.append(asyncio.ensure_future(self._dropped(recv_monitor_message(monitor))))
        return kc

    @contextlib.asynccontextmanager
    async def async_setup_kernel(self, **kw: Any) -> AsyncIterator[None]:
        try:
            async with super().async_setup_kernel(**kw):
                yield
        finally:
            for watcher in self.watchers:
                watcher.cancel()
            await asyncio.gather(*self.watchers, return_exceptions=True)

    async def _dropped(self, disconnected: Any) -> None:
        await disconnected
        await asyncio.sleep(1)  # a kernel that died ends its sandbox meanwhile
        if not self.sandbox.done.is_set() and self.km.provisioner.process.poll() is None:
            self.sandbox.kill(TOO_LARGE)

    def take_records(self, cell: Any, cell_index: int, execute_reply: dict[str, Any]) -> None:
        value = execute_reply["content"].get("user_expressions", {}).get("records", {})
        with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError, KeyError):
            records = json.loads(ast.literal_eval(value["data"]["text/plain"]))  # a cell that raised has none
            self.records = records if isinstance(records, list) else self.records


def execute(nb: Any, settings: Settings, stop: Stop | None = None) -> Run:
    """Run ``nb`` in a fresh kernel in a new folder that holds only a copy of it; the checkers' records."""
    cells, result, sandbox, stop = len(nb.cells), Run([], []), Sandbox(settings), stop or Stop()
    with tempfile.TemporaryDirectory(prefix="grade-") as folder:
        run, home = Path(folder), Path(folder, "home")
        _make_folder(run, settings.uid if settings.sandbox else None)
        nbformat.write(nb, run / "work" / "submission.ipynb")
        prefix = ["sh", "-c", 'read -r _; exec "$@"', "sh"]  # waits for Sandbox.start's limits
        prefix += sandbox_command(run, settings.uid, settings.memory_bytes) if settings.sandbox else []
        context = zmq.asyncio.Context()
        context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # a larger message is dropped unread
        connection = str(run / "kernel" / "c.json")
        km = KernelManager(
            kernel_spec_manager=KernelCommand(prefix), transport="ipc", connection_file=connection, context=context
        )
        nb.cells.append(nbformat.v4.new_code_cell("# the grader's cell: its reply brings the last records"))
        timeout = lambda cell: max(1, int(sandbox.deadline - time.monotonic() + 1))  # noqa: E731
        client = GradingClient(
            nb, km=km, allow_errors=True, timeout_func=timeout, resources={"metadata": {"path": str(run / "work")}}
        )
        client.sandbox, client.on_cell_executed, client.owns_km, client.watchers = (
            sandbox,
            client.take_records,
            True,
            [],
        )
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "USER": "student"}
        env |= {"TMPDIR": "/tmp", "MPLBACKEND": "Agg", "MPLCONFIGDIR": str(home), "TQDM_DISABLE": "1"}
        stop.running.add(sandbox)
        try:  # none of the grader's environment (its secrets) but PATH, and no terminal
            client.execute(env=env, stdin=sandbox.stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except CellTimeoutError:
            result.timed_out = True
        except DeadKernelError as e:
            result.kernel_died = str(e).strip().splitlines()[0] if str(e).strip() else "the kernel died"
        except Exception as e:  # nbclient's own failures (e.g. no kernel): the notebook did not run
            result.kernel_died = f"{type(e).__name__}: {e}"[:300]
        finally:
            stop.running.discard(sandbox)
            sandbox.kill("")
            for fd in (fd for fd in (sandbox.stdin, sandbox.release) if fd >= 0):  # never started
                os.close(fd)
            context.destroy(linger=0)
            atexit.unregister(client._cleanup_kernel)  # nbclient leaves it registered when a start fails
            del nb.cells[cells:]
    result.records, result.timed_out = client.records, result.timed_out or sandbox.reason.startswith("ran out")
    result.kernel_died = "" if result.timed_out else sandbox.reason or result.kernel_died
    limit = f" (the memory limit is {settings.memory_bytes / 2**30:g} GB)" if settings.memory_bytes else ""
    for i, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), 1):
        for out in (o for o in cell.get("outputs", []) if o.get("output_type") == "error"):
            error = f"code cell {i}: {out.get('ename', 'Error')}: {out.get('evalue', '')}"[:300]
            oom = re.search(r"MemoryError|can't allocate memory|out of memory", error, re.IGNORECASE)
            result.errors.append(error + (limit if oom else ""))
    return result


def _short_feedback(texts: list[str]) -> str:
    """Each checker's feedback on one line, without passed cases, repeated hints or the fixes' pointer."""
    hints: set[str] = set()
    parts = []
    for text in texts:
        lines = [line.strip() if i else line for i, line in enumerate(text.splitlines())]
        kept = [x for x in lines if not x.startswith(("✅", "For the fix in code:")) and x not in hints]
        hints |= {x for x in kept if x.startswith("Hint:")}
        parts.append(" | ".join(dict.fromkeys(kept)))
    return " || ".join(parts)


def grade_run(sub: Submission, exercises: list[Exercise], run: Run, settings: Settings, *chapter: str) -> list[Row]:
    """The rows of one executed submission (``chapter``: the chapter and how it was found): an exercise
    passes when the last call of each of its checkers passed."""
    who, timeout_s = [sub.student, sub.name, *(chapter or ("", ""))], settings.timeout_s
    last = {r["checker"]: r for r in run.records if isinstance(r, dict) and isinstance(r.get("checker"), str)}
    why = f"the notebook ran out of time ({timeout_s:g} s) before" if run.timed_out else ""
    why = why or ("the kernel died before" if run.kernel_died else "")
    rows = []
    for e in (e for e in exercises if e.checkers):
        records = [last.get(c, {}) for c in e.checkers]
        passed = all(r.get("passed") is True and r.get("status") == "passed" for r in records)
        feedback = _short_feedback([str(r.get("feedback")) for r in records])
        missing = [c for c in e.checkers if c not in last]
        if missing:
            feedback = f"no result: {why} {missing[0]} ran" if why else f"no result: {missing[0]} was never called"
        rows.append(Row(*who, f"Exercise {e.number}", passed, int(passed), feedback))
    problems = [f"ran out of time: stopped after {timeout_s:g} s (an infinite loop?)"] if run.timed_out else []
    problems += [f"the kernel died: {run.kernel_died}"] if run.kernel_died else []
    problems += [] if run.records else ["no checker was called"]
    problems += [f"{len(run.errors)} cell(s) raised: " + "; ".join(run.errors[:3])] if run.errors else []
    return rows + ([Row(*who, NOTEBOOK_ROW, False, None, "; ".join(problems))] if problems else [])


def grade_notebook(sub: Submission, settings: Settings, catalogue: Catalogue, stop: Stop | None = None) -> list[Row]:
    """Execute and grade one submission; problems become rows, never exceptions."""
    try:
        nb = nbformat.read(sub.path, as_version=4)
        nbformat.validate(nb)
    except Exception as e:
        return [_note(sub, f"{NOT_GRADED}: not a readable notebook: {type(e).__name__}: {e}")]
    clues = chapter_clues(nb, sub.path, catalogue)
    how, found = ("--chapter", settings.chapter) if settings.chapter else next(iter(clues.items()), ("", ""))
    if not found:
        return [_note(sub, f"{NOT_GRADED}: cannot tell which chapter this is: use --chapter")]
    said = ", ".join(f"the {source} say{'' if source.endswith('s') else 's'} {c}" for source, c in clues.items())
    warning = f"the chapter is unclear: {said}; graded as {found} (from the {how}); --chapter chooses"
    rows = [Row(sub.student, sub.name, found, how, WARNING_ROW, False, None, warning)]
    run = execute(nb, settings, stop)
    return rows[: any(c != found for c in clues.values())] + grade_run(sub, catalogue[found], run, settings, found, how)


def _graded_before(csv_path: Path | None, subs: list[Submission]) -> dict[int, list[Row]]:
    """The rows an earlier run left in ``csv_path`` for each submission it graded whose bytes are the same."""
    held: dict[tuple[str, str], list[Row]] = {}
    with contextlib.suppress(OSError, ValueError, TypeError, csv.Error):
        for r in csv.DictReader(open(csv_path, newline="", encoding="utf-8")) if csv_path else []:
            row = Row(**{**r, "passed": r["passed"] == "True", "score": int(r["score"]) if r["score"] else None})
            held.setdefault((row.notebook, row.sha256), []).append(row)
    rows = {i: held.get((sub.name, _digest(sub.path)), []) for i, sub in enumerate(subs)}
    return {i: rs for i, rs in rows.items() if rs and not any(r.not_graded for r in rs)}


def _digest(path: Path) -> str:
    with contextlib.suppress(OSError):
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return ""


def grade_all(paths: Sequence[Path], settings: Settings, catalogue: Catalogue, jobs: int = 1, out: Path | None = None):
    """Grade every submission, ``jobs`` at a time: the rows in the order of ``paths``, and whether Ctrl-C
    stopped it. With ``out``, the CSV is rewritten as each submission finishes, and the submissions an
    earlier run graded there, unchanged since, are not graded again."""
    subs, stop, lock, slots = submissions(paths, settings.depth), Stop(), threading.Lock(), queue.SimpleQueue[int]()
    done = _graded_before(out, subs)
    for slot in range(jobs):
        slots.put(slot)

    def one(i: int) -> None:
        slot = slots.get()
        print(f"grading {subs[i].name} ...", file=sys.stderr, flush=True)
        try:
            uid = None if settings.uid is None else settings.uid - slot
            rows = grade_notebook(subs[i], replace(settings, uid=uid), catalogue, stop)
        except Exception as e:  # the grader's own failure: no fault of the student's
            rows = [_note(subs[i], f"{NOT_GRADED}: the grader failed: {type(e).__name__}: {e}")]
        finally:
            slots.put(slot)
        with lock:
            if not stop.is_set():  # else its kernel was killed by Ctrl-C: no fault of the student's
                done[i] = [replace(r, sha256=_digest(subs[i].path)) for r in rows]
                write_csv([r for k, s in enumerate(subs) for r in done.get(k) or [_note(s, PENDING)]], out)

    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="grade") as pool:
        try:
            for future in [pool.submit(one, i) for i in range(len(subs)) if i not in done]:
                future.result()
        except KeyboardInterrupt:
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C waits too
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            signal.signal(signal.SIGINT, previous)
    rows = [r for i, sub in enumerate(subs) for r in done.get(i) or [_note(sub, INTERRUPTED)]]
    write_csv(rows, out)
    return rows, stop.is_set()


def write_csv(rows: Sequence[Row], path: Path | None) -> None:
    """The rows at ``path`` (columns :data:`COLUMNS`), whole or not at all: a temporary file renamed into
    place. Feedback is cut, and a text cell beginning with ``= + - @`` (or tab, CR) gets a ``'``."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            lines = [astuple(replace(r, feedback=r.feedback[:MAX_FEEDBACK])) for r in rows]
            lines = [["" if v is None else f"'{v}" if str(v)[:1] in "=+-@\t\r" and v else v for v in x] for x in lines]
            csv.writer(f).writerows([COLUMNS, *lines])
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def format_table(rows: Sequence[Row]) -> str:
    """The rows, one a line, then each notebook's score (printable ASCII only)."""
    width = max((len(r.notebook) for r in rows), default=8)
    lines = [f"{r.notebook:<{width}}  {'PASS' if r.passed else '----'} {r.exercise}: {r.feedback[:200]}" for r in rows]
    for notebook in dict.fromkeys(r.notebook for r in rows):
        mine = [r for r in rows if r.notebook == notebook]
        score = f"{sum(r.passed for r in mine if r.score is not None)}/{sum(r.score is not None for r in mine)}"
        lines.append(f"{notebook:<{width}}  {'not graded' if any(r.not_graded for r in mine) else score} passed")
    return "\n".join(re.sub(r"[^ -~]", "?", line) for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="transformer-grade", description=__doc__.split("\n\n")[1])
    add = parser.add_argument
    add("submissions", nargs="+", type=Path, help="the .ipynb files to grade (secA/alice/01_attention.ipynb ...)")
    add("--csv", type=Path, help="write the rows here as each finishes; a rerun grades only what it lacks")
    add("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds for each notebook (default 600)")
    add("--memory", type=float, default=DEFAULT_MEMORY_GB, help="GB for all of a submission's processes (0: no limit)")
    add("--chapter", help="grade every submission as this chapter (3 or 03_multi_head_attention)")
    add("-j", "--jobs", type=int, choices=range(1, 65), default=1, metavar="N", help="N notebooks at a time")
    add("--student-depth", type=int, metavar="N", help="the student is the first N folders below the common one")
    add(
        "--no-sandbox",
        action="store_true",
        help="where bubblewrap is missing, run kernels WITHOUT it: each "
        "notebook then runs with your permissions, can read and write your files and other students' answers, use "
        "the network, stop or kill the grader and the other kernels, and leave processes running",
    )
    args = parser.parse_args(argv)
    if not (math.isfinite(args.timeout) and 1 <= args.timeout <= 7 * 86400):
        parser.error(f"--timeout must be from 1 to 604800 seconds, got {args.timeout}")
    if not (math.isfinite(args.memory) and (0.5 <= args.memory <= 4096 or args.memory == 0)):
        parser.error(f"--memory must be from 0.5 to 4096 GB, or 0 for no limit, got {args.memory}")
    why, catalogue = "" if args.no_sandbox else sandbox_problem(), load_catalogue()
    if why:
        parser.error(f"{why}; or pass --no-sandbox (see --help for what it gives away)")
    try:
        chapter = resolve_chapter(args.chapter, catalogue) if args.chapter else None
    except ValueError as e:
        parser.error(f"--chapter: {e}")
    memory = int(args.memory * 2**30) or None
    settings = Settings(args.timeout, memory, not args.no_sandbox, chapter=chapter, depth=args.student_depth)
    rows, interrupted = grade_all(args.submissions, settings, catalogue, args.jobs, args.csv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(format_table(rows))
    if interrupted:
        print("interrupted: the submissions not graded say so", file=sys.stderr)
    return EXIT_INTERRUPTED if interrupted else EXIT_NOT_ALL_GRADED if any(r.not_graded for r in rows) else EXIT_OK

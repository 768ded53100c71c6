"""Grade a class: ``transformer-grade SUBMISSION.ipynb [...] --csv grades.csv [--timeout S] [--memory GB] [-j N]``.

Each submission runs top to bottom in a fresh kernel; the checkers' records come back in the execute replies (what a
cell prints passes nothing). A row per auto-checked exercise, plus a ``(notebook)`` row when the notebook went wrong or
was "not graded". Exit status: 0 all graded, 1 some not, 130 Ctrl-C, 2 bad options.

**Guarantees** (each pinned by ``tests/test_grade_hostile.py``). Each kernel runs under bubblewrap with every capability
dropped, in new PID, network, IPC and UTS namespaces, as an unprivileged uid (as root: 65533-k for worker k): no
network, no other process, the system and Python read-only, an empty ``/tmp``, and of the disk only a new folder with a
copy of its notebook. A supervisor outside it ends the namespace with the row, or with the grader (even SIGKILLed), so
nothing a submission starts outlives its row, whatever it does to its parent. From outside, the grader kills the sandbox
at ``--timeout``, or when the proportional memory of all its processes exceeds ``--memory`` (looked at every 0.2 s: an
approximate cgroup); each process also has that limit as ``RLIMIT_DATA`` (an allocation beyond it fails in the student's
cell), and the submission at most 512 processes. A kernel message over 32 MB is dropped unread and fails the submission.
Kernels' output goes nowhere. The ``--csv`` file is rewritten whole as each submission finishes, so a killed grader
keeps every finished row, and the same command grades only what it lacks or what changed. A CSV cell beginning with
``= + - @`` gets a leading ``'``; feedback is cut at 500 characters. A student is the folders above the notebook below
the common one (``secA/alice``; ``--student-depth N``: the first N). An absurd ``--timeout``/``--memory`` is refused.

**What remains possible.** The checkers run in the student's own kernel, as in nbgrader and otter-grader: a notebook can
monkeypatch what a checker compares with, or forge records in memory. With ``--no-sandbox`` a notebook runs with your
permissions (see ``--help``). The book's "Teaching with this book" says more.
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
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import nbformat
import psutil
import zmq.asyncio
from jupyter_client import AsyncKernelManager, LocalProvisioner
from jupyter_client.kernelspec import KernelSpec
from nbclient import NotebookClient
from zmq.utils.monitor import recv_monitor_message

from .exercises.catalogue import Exercise, load_catalogue

MAX_PROCESSES, MAX_MESSAGE_BYTES, MAX_FEEDBACK, POLL_S = 512, 32 * 2**20, 500, 0.2
NOTEBOOK_ROW, NOT_GRADED = "(notebook)", "not graded"
UNFINISHED = f"{NOT_GRADED}: interrupted before its grade was complete; the same command grades it"
COLUMNS = ("student", "notebook", "chapter", "chapter_from", "exercise", "passed", "score", "feedback", "sha256")
FRAMEWORK = "transformer_lib.notebook.exercises._framework"  # asked after every cell for the checkers' records:
RECORDS = f"(lambda m: m.grader_records() if m else '[]')(__import__('sys').modules.get('{FRAMEWORK}'))"
NO_SANDBOX = (
    "run kernels WITHOUT bubblewrap (where it is missing): each notebook can then read and write your files and"
    " other students' answers, use the network, kill the grader and other kernels, and leave processes running"
)
Catalogue = dict[str, list[Exercise]]
SUPERVISOR = """import ctypes, os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, stop := {signal.SIGTERM, signal.SIGCHLD})  # for sigwait, even the first
ctypes.CDLL(None).prctl(36, 1), ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_CHILD_SUBREAPER, _PDEATHSIG
if os.getppid() == int(sys.argv[1]):  # the grader, still alive after the prctl (else: start nothing)
    pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ, setsigmask=())
    while signal.sigwait(stop) == signal.SIGCHLD and os.waitpid(pid, os.WNOHANG) == (0, 0): pass
while children := open(f"/proc/self/task/{os.getpid()}/children").read().split():  # orphans below come here
    [os.kill(int(child), signal.SIGKILL) for child in children]
    os.wait()"""


@dataclass(frozen=True)
class Submission:
    path: Path
    name: str  # below the common folder: secA/alice/01_attention.ipynb
    student: str

    def sha256(self) -> str:
        with contextlib.suppress(OSError):
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        return ""  # unreadable


@dataclass(frozen=True)
class Row:
    student: str
    notebook: str
    chapter: str
    chapter_from: str  # --chapter, metadata or file name
    exercise: str
    passed: bool
    score: int | None  # 1 or 0 for an exercise, None for a (notebook) row
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
    """How each submission runs (``memory_bytes``: all its processes', None for no limit; ``uid``: as root)."""

    timeout_s: float = 600.0
    memory_bytes: int | None = 8 * 2**30
    sandbox: bool = True
    uid: int | None = 65533 if os.geteuid() == 0 else None
    chapter: str | None = None
    depth: int | None = None  # of the student's folders
    stop: threading.Event = field(default_factory=threading.Event, compare=False)


def submissions(paths: Sequence[Path], depth: int | None = None) -> list[Submission]:
    """Each path once, named below the common folder; its student: the folders above (first ``depth``) or its stem."""
    unique = list(dict.fromkeys(p.resolve() for p in paths))
    root = Path(os.path.commonpath([p.parent for p in unique])) if unique else Path()
    named = [(p, p.relative_to(root)) for p in unique]
    return [Submission(p, r.as_posix(), "/".join(r.parts[:-1][:depth]) or p.stem) for p, r in named]


def chapter_of(nb: Any, path: Path, catalogue: Catalogue) -> tuple[str, str]:
    """The chapter a valid notebook says it is and where: its metadata, else its file name; ("", "") if none."""
    named = book.get("chapter") if isinstance(book := nb.metadata.get("transformer_book"), dict) else None
    if isinstance(named, str) and named in catalogue:
        return named, "metadata"
    return next(((c, "file name") for c in sorted(catalogue, key=len, reverse=True) if c in path.stem), ("", ""))


def kernel_command(run: Path, uid: int | None, tmp_bytes: int | None, sandbox: bool = True) -> list[str]:
    """What runs a kernel in ``run``: :data:`SUPERVISOR`, prlimit's limits, bubblewrap (as root: setpriv to ``uid``)."""
    supervisor = [sys.executable, "-IS", "-c", SUPERVISOR, str(os.getpid()), "prlimit", f"--nproc={MAX_PROCESSES}"]
    command = [*supervisor, *([f"--data={tmp_bytes}"] if tmp_bytes else []), "--"]
    if uid is None:
        box = ["bwrap", "--unshare-all", "--cap-drop", "ALL"]
    else:  # as root, no user namespace (uid 0 in one escapes RLIMIT_NPROC); setpriv leaves the kernel no capability
        box = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--cap-drop", "ALL"]
        box += [a for cap in ("SETUID", "SETGID", "SETPCAP") for a in ("--cap-add", f"CAP_{cap}")]
    size = ["--size", str(tmp_bytes)] if tmp_bytes else []
    box += ["--die-with-parent", "--new-session", "--perms", "1777", *size, "--tmpfs", "/tmp"]
    system = [p for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc") if os.path.exists(p)]
    python = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    python = {os.path.realpath(p) for p in [*python, str(Path(__file__).parents[1])]}  # the package, not its folder
    mine = sorted(p for p in python if not any(p.startswith(q + "/") for q in [*system, *python]) and p not in system)
    above = {str(a) for p in [*mine, str(run)] for a in Path(p).parents} - {"/", "/tmp"}
    box += [a for p in sorted(above) for a in ("--perms", "0755", "--dir", p)]  # bwrap would make them 0700
    box += [a for p in system + mine for a in ("--ro-bind", p, p)]
    box += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", *size, "--tmpfs", "/dev/shm"]
    box += ["--bind", str(run), str(run), "--chdir", str(run), "--setenv", "JPY_PARENT_PID", "1"]
    if uid is not None:
        box += ["--", "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"]
        box += ["--bounding-set=-all"]
    return [*command, *box, "--"] if sandbox else command


def sandbox_problem() -> str:
    """Why a kernel cannot run in the sandbox here, or ''."""
    with tempfile.TemporaryDirectory(prefix="grade-") as run:
        Path(run).chmod(0o711)  # bubblewrap's root, without capabilities, must enter it
        probe = [*kernel_command(Path(run), Settings().uid, None), sys.executable, "-c", "import ipykernel"]
        done = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    return f"bubblewrap cannot start a kernel here: {done.stderr.strip()[-300:]}" if done.returncode else ""


def _memory(pid: int) -> int:
    """The PSS in bytes of process ``pid`` and its descendants (a PID namespace keeps orphans among them)."""
    total = 0
    with contextlib.suppress(psutil.Error):
        for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += process.memory_full_info().pss
    return total


class KernelManager(AsyncKernelManager):
    """One ipykernel, started by ``prefix`` (limits, sandbox); its clients use its zmq context (sizes capped)."""

    prefix: list[str] = []

    @property
    def kernel_spec(self) -> KernelSpec:
        argv = [*self.prefix, sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        return KernelSpec(argv=argv, display_name="grade", language="python")

    def client(self, **kw: Any) -> Any:
        return super().client(context=self.context, **kw)


class GradingClient(NotebookClient):
    """nbclient's client for a submission in ``run`` (:func:`kernel_command`): it keeps errors, not output, each reply's
    records, and kills the sandbox at the deadline or ``stop``, past the memory limit, on a dropped message, on kill."""

    process: subprocess.Popen[bytes] | None  # the kernel's (its supervisor's) once started: LocalProvisioner's

    def __init__(self, nb: Any, run: Path, settings: Settings) -> None:
        uid = settings.uid if settings.sandbox else None
        nbformat.write(nb, run / "submission.ipynb")
        self.context = zmq.asyncio.Context()
        self.context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # a larger message is dropped unread
        km = KernelManager(transport="ipc", connection_file=str(run / "c.json"), context=self.context)
        km.prefix = kernel_command(run, settings.uid, settings.memory_bytes, settings.sandbox)
        km.write_connection_file()  # now, so that the kernel's uid can own it; the launch keeps it
        for p, owner in [(run, uid), (run / "c.json", uid), (run / "submission.ipynb", uid)] if uid is not None else []:
            os.chown(p, owner, owner)
        (run / "submission.ipynb").chmod(0o600)  # the folder is open to enter (0711), not the copy to read
        run.chmod(0o711)  # bubblewrap's root, without capabilities, must enter it
        super().__init__(nb, km=km, allow_errors=True, resources={"metadata": {"path": str(run)}})
        self.settings, self.deadline, self.reason = settings, time.monotonic() + settings.timeout_s, ""
        self.got, self.process, self.owns_km, self.on_cell_executed = Run([], []), None, True, self.take_records

    def kill(self, reason: str) -> None:
        """Kill the kernel's whole tree (its supervisor's work; bubblewrap's namespace dies with it) and reap it."""
        self.reason = self.reason or reason
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)

    def output(self, outs: list[Any], msg: dict[str, Any], display_id: Any, cell_index: int) -> None:
        if msg["msg_type"] == "error":  # what a cell prints is not graded
            number, content = sum(c.cell_type == "code" for c in self.nb.cells[: cell_index + 1]), msg["content"]
            error = f"code cell {number}: {content.get('ename') or 'Error'}: {content.get('evalue', '')}"[:300]
            memory = self.settings.memory_bytes
            oom = re.search(r"MemoryError|can't allocate memory|out of memory", error, re.IGNORECASE)
            self.got.errors.append(error + (f" (the memory limit is {memory / 2**30:g} GB)" if memory and oom else ""))

    @contextlib.asynccontextmanager
    async def async_setup_kernel(self, **kw: Any) -> AsyncIterator[None]:
        async with super().async_setup_kernel(**kw):
            assert self.kc is not None  # set up by now; its execute (replaced) asks for the records every time
            self.kc.execute = functools.partial(self.kc.execute, user_expressions={"records": RECORDS})  # type: ignore[method-assign]
            channels = (self.kc.shell_channel, self.kc.iopub_channel)
            watchers = asyncio.gather(self._watch(), *map(self._dropped, channels), return_exceptions=True)
            try:
                yield
            finally:
                watchers.cancel()  # each of them
                await asyncio.wait([watchers])

    async def _watch(self) -> None:
        assert self.km is not None and isinstance(self.km.provisioner, LocalProvisioner)  # started (.process: untyped)
        memory, self.process = self.settings.memory_bytes, cast("subprocess.Popen[bytes]", self.km.provisioner.process)
        while not self.reason:
            if self.settings.stop.is_set():
                self.kill(NOT_GRADED)
            elif time.monotonic() > self.deadline:
                self.kill(f"ran out of time: stopped after {self.settings.timeout_s:g} s (an infinite loop?)")
            elif memory and _memory(self.process.pid) > memory:
                self.kill(f"its processes together used more than the memory limit ({memory / 2**30:g} GB)")
            await asyncio.sleep(POLL_S)

    async def _dropped(self, channel: Any) -> None:
        """Kill the sandbox when zmq dropped a message over the limit: the connection broke, not to be retried."""
        monitor = channel.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED)
        await recv_monitor_message(monitor)  # broken: the kernel was connected before this started
        if not await monitor.poll(1000):  # zmq retries at once a connection that the kernel closed (exiting)
            self.kill(f"the kernel sent a message over {MAX_MESSAGE_BYTES >> 20} MB")

    def take_records(self, cell: Any, cell_index: int, execute_reply: dict[str, Any]) -> None:
        value = execute_reply["content"].get("user_expressions", {}).get("records", {})
        with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError, KeyError):
            records = json.loads(ast.literal_eval(value["data"]["text/plain"]))  # a cell that raised has none
            self.got.records = records if isinstance(records, list) else self.got.records


def execute(nb: Any, settings: Settings) -> Run:
    """Run ``nb`` and the grader's cell (left in it) in a fresh kernel, in a new folder with a copy; the records."""
    with tempfile.TemporaryDirectory(prefix="grade-") as folder:
        client = GradingClient(nb, Path(folder), settings)
        nb.cells.append(nbformat.v4.new_code_cell("# the grader's cell: its reply brings the last records"))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": folder, "USER": "student", "TMPDIR": "/tmp"}
        env |= {"MPLBACKEND": "Agg", "MPLCONFIGDIR": folder, "TQDM_DISABLE": "1"}
        try:  # none of the grader's environment (its secrets) but PATH, and no terminal
            client.execute(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except Exception as e:  # DeadKernelError (the kills too), or nbclient's own: the notebook did not run
            client.reason = client.reason or str(e)[:300] or type(e).__name__
        finally:
            client.kill("")
            client.context.destroy(linger=0)
            atexit.unregister(client._cleanup_kernel)  # nbclient leaves it registered when a start fails
    late = client.reason.startswith("ran out")  # of time
    return replace(client.got, timed_out=late, kernel_died="" if late else client.reason)


def _short_feedback(texts: list[str]) -> str:
    """Each checker's feedback on one line, without passed cases, repeated hints or the fixes' pointer."""
    hints, parts = set[str](), list[str]()
    for text in texts:
        lines = [line.strip() if i else line for i, line in enumerate(text.splitlines())]
        kept = [x for x in lines if not x.startswith(("✅", "For the fix in code:")) and x not in hints]
        hints |= {x for x in kept if x.startswith("Hint:")}
        parts.append(" | ".join(dict.fromkeys(kept)))
    return " || ".join(parts)


def grade_run(sub: Submission, exercises: list[Exercise], run: Run, settings: Settings, *chapter: str) -> list[Row]:
    """An executed submission's rows (``chapter``: which, how found): an exercise passes if each checker's last did."""
    name, how = chapter or ("", "")
    who, timeout_s = (sub.student, sub.name, name, how), settings.timeout_s
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


def grade_notebook(sub: Submission, settings: Settings, catalogue: Catalogue) -> list[Row]:
    """Execute and grade one submission as ``--chapter``, else the chapter it says; problems become rows."""
    try:
        nb = nbformat.read(sub.path, as_version=4)
        nbformat.validate(nb)
    except Exception as e:
        return [_note(sub, f"{NOT_GRADED}: not a readable notebook: {type(e).__name__}: {e}")]
    chapter, how = (settings.chapter, "--chapter") if settings.chapter else chapter_of(nb, sub.path, catalogue)
    if not chapter:
        return [_note(sub, f"{NOT_GRADED}: cannot tell which chapter this is: use --chapter")]
    return grade_run(sub, catalogue[chapter], execute(nb, settings), settings, chapter, how)


def _graded_before(csv_path: Path | None, subs: list[Submission]) -> list[list[Row]]:
    """Each submission's rows that an earlier run left in ``csv_path`` for these bytes, else a "not graded" row."""
    held: dict[tuple[str, str], list[Row]] = {}
    with contextlib.suppress(OSError, ValueError, TypeError, csv.Error):
        for r in csv.DictReader(open(csv_path, newline="", encoding="utf-8")) if csv_path else []:
            row = Row(**dict[str, Any](r, passed=r["passed"] == "True", score=int(r["score"]) if r["score"] else None))
            held.setdefault((row.notebook, row.sha256), []).append(row)
    rows = [(sub, held.get((sub.name, sub.sha256()), [])) for sub in subs]
    return [rs if rs and not any(r.not_graded for r in rs) else [_note(sub, UNFINISHED)] for sub, rs in rows]


def grade_all(
    paths: Sequence[Path], settings: Settings, catalogue: Catalogue, jobs: int = 1, out: Path | None = None
) -> tuple[list[Row], bool]:
    """Grade every submission, ``jobs`` at a time: the rows in the order of ``paths``, and whether Ctrl-C stopped
    it. The CSV ``out`` is rewritten as each one finishes; what an earlier run graded there, unchanged, is kept."""
    subs, lock, stopped = submissions(paths, settings.depth), threading.Lock(), settings.stop
    done, slot, slots = _graded_before(out, subs), threading.local(), itertools.count()

    def one(i: int) -> None:
        print(f"grading {subs[i].name} ...", file=sys.stderr, flush=True)
        uid = None if settings.uid is None else settings.uid - slot.k  # as root, worker k's kernels: 65533-k
        try:
            rows = grade_notebook(subs[i], replace(settings, uid=uid), catalogue)
        except Exception as e:  # the grader's own failure: no fault of the student's
            rows = [_note(subs[i], f"{NOT_GRADED}: the grader failed: {type(e).__name__}: {e}")]
        with lock:
            if not stopped.is_set():  # else Ctrl-C killed its kernel: no fault of the student's
                done[i] = [replace(r, sha256=subs[i].sha256()) for r in rows]
                write_csv([r for each in done for r in each], out)

    with ThreadPoolExecutor(jobs, "grade", initializer=lambda: setattr(slot, "k", next(slots))) as pool:
        try:
            list(pool.map(one, [i for i, rows in enumerate(done) if any(r.not_graded for r in rows)]))
        except KeyboardInterrupt:
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C waits too
            stopped.set()  # each kernel's watchdog kills it
            pool.shutdown(wait=True, cancel_futures=True)
            signal.signal(signal.SIGINT, previous)
    write_csv(rows := [r for each in done for r in each], out)
    return rows, stopped.is_set()


def write_csv(rows: Sequence[Row], path: Path | None) -> None:
    """The rows at ``path`` (:data:`COLUMNS`; feedback cut, formulas as text), whole: written beside it, renamed."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary := path.with_name(f".{path.name}.tmp"), "w", newline="", encoding="utf-8") as f:
            values = [astuple(replace(r, feedback=r.feedback[:MAX_FEEDBACK])) for r in rows]
            formula = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet would run: a ' makes it text
            lines = [["" if v is None else f"'{v}" if str(v).startswith(formula) else v for v in x] for x in values]
            csv.writer(f).writerows([COLUMNS, *lines])
        os.replace(temporary, path)


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
    catalogue = load_catalogue()
    parser = argparse.ArgumentParser(prog="transformer-grade", description=__doc__.split("\n\n")[1])
    add = parser.add_argument
    add("submissions", nargs="+", type=Path, help="the .ipynb files to grade (secA/alice/01_attention.ipynb ...)")
    add("--csv", type=Path, help="write the rows here as each finishes; a rerun grades only what it lacks")
    add("--timeout", type=float, default=600.0, help="seconds for each notebook (default 600)")
    add("--memory", type=float, default=8.0, help="GB for all of a submission's processes (default 8; 0: no limit)")
    add("--chapter", choices=sorted(catalogue), metavar="CHAPTER", help="grade all as this chapter (01_attention)")
    add("-j", "--jobs", type=int, choices=range(1, 65), default=1, metavar="N", help="N notebooks at a time")
    add("--student-depth", type=int, metavar="N", help="the student is the first N folders below the common one")
    add("--no-sandbox", action="store_true", help=NO_SANDBOX)
    args = parser.parse_args(argv)
    if not 1 <= args.timeout <= 7 * 86400:  # nor NaN, nor infinity
        parser.error(f"--timeout must be from 1 to 604800 seconds, got {args.timeout}")
    if not (0.5 <= args.memory <= 4096 or args.memory == 0):
        parser.error(f"--memory must be from 0.5 to 4096 GB, or 0 for no limit, got {args.memory}")
    if not args.no_sandbox and (why := sandbox_problem()):
        parser.error(f"{why}; install bubblewrap (`make sandbox`) or pass --no-sandbox (see --help for the risk)")
    memory = int(args.memory * 2**30) or None
    settings = Settings(args.timeout, memory, not args.no_sandbox, chapter=args.chapter, depth=args.student_depth)
    rows, interrupted = grade_all(args.submissions, settings, catalogue, args.jobs, args.csv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(format_table(rows))
    if interrupted:
        print("interrupted: the submissions not graded say so", file=sys.stderr)
    return 130 if interrupted else 1 if any(r.not_graded for r in rows) else 0

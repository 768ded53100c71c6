"""Run one command and, when it ends or this process is told to stop, kill everything it started.

``python -I -S _contain.py [--memory-bytes N] -- COMMAND...``: the grader starts each submission's kernel
through this script (standard library only, run as a file so that nothing of the book is imported). It
makes itself a *child subreaper* (Linux's ``PR_SET_CHILD_SUBREAPER``), so that a process the kernel starts
and abandons (``setsid sleep 300``, a double fork) is re-parented to it rather than to init: every process
the submission starts stays a descendant of this one, whatever process group or session it moves to. It
then runs ``COMMAND`` with at most ``N`` bytes of data (``RLIMIT_DATA``: the heap and the private
mappings that allocations use) and waits. When ``COMMAND`` exits, when it receives SIGTERM or SIGHUP, or
when the grader that started it goes away, it kills all its descendants with SIGKILL (walking ``/proc``
until none is left), reaps them and exits with ``COMMAND``'s status. SIGINT (the kernel's interrupt) is
passed on to ``COMMAND``.

Linux only (``/proc`` and ``prctl``); elsewhere it runs ``COMMAND`` with the process group as the only bound.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
_stop = False


def _set_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants; False where Linux's prctl is missing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """The live (not zombie) descendants of ``root``, from ``/proc``; empty where there is no ``/proc``."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it ended meanwhile
        state, ppid = stat[stat.rfind(b")") + 2 :].split()[:2]
        if state != b"Z":
            children.setdefault(int(ppid), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _reap() -> list[tuple[int, int]]:
    """Reap every child that has ended: ``(pid, status)`` of each."""
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def kill_all(seconds: float = 10.0) -> None:
    """SIGKILL every descendant, again and again (one may fork meanwhile), until none is left."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = descendants(os.getpid())
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
        _reap()
    _reap()


def _forward(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGINT)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    memory = None
    if argv[:1] == ["--memory-bytes"]:
        memory, argv = int(argv[1]), argv[2:]
    if argv[:1] != ["--"] or len(argv) < 2:
        print("usage: _contain.py [--memory-bytes N] -- COMMAND...", file=sys.stderr)
        return 2
    command = argv[1:]
    _set_subreaper()
    parent = os.getppid()
    if memory:
        resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))

    def stop(signum: int, frame: object) -> None:
        global _stop
        _stop = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    child = subprocess.Popen(command)
    signal.signal(signal.SIGINT, lambda signum, frame: _forward(child.pid))
    status = None
    while status is None and not _stop and os.getppid() == parent:
        for pid, raw in _reap():
            if pid == child.pid:
                status = os.waitstatus_to_exitcode(raw)
        time.sleep(0.05)
    kill_all()
    if status is None:
        return 128 + signal.SIGKILL
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

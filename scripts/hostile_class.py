"""Grade the review's hostile class (reviews/2026-12-07/reliability.md, section 2) as issue 63 asks.

Builds the 34 chapter-1 submissions of the review's table from ``colab/01_attention.ipynb``, each in its own
folder, and grades them with ``transformer-grade ... -j 2 --timeout 60 --csv OUT/grades.csv`` in the default
(sandbox) mode, with a TCP listener on 127.0.0.1. It reports each row with its time, the grader's peak memory,
the processes left, the files written outside the submissions' folders and what the listener received.

A submission's time runs from the grader's ``grading NAME ...`` line on stderr to the first moment (polled
every 0.1 s) the CSV holds its finished rows (rows with a sha256: a not-yet-graded one has none). The grader's
memory is its own VmHWM (peak RSS of its process, all threads, not its kernels), read every 0.1 s.
``--kill-after N`` SIGKILLs the grader once N submissions are in the CSV, checks them and reruns to resume.

    .venv/bin/python scripts/hostile_class.py [--folder DIR] [--kill-after N]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import psutil

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "transformer_lib"
GRADER = ROOT / ".venv" / "bin" / "transformer-grade"
CHECKERS = ("check_softmax", "check_score_std", "check_distance_attention")
RIGHT = {
    "def softmax": "def softmax(scores):\n    e = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)\n"
    "    return e / e.sum(dim=-1, keepdim=True)",
    "prediction =": "prediction = 64.0",
    "def distance_attention": "def distance_attention(q, k, v, temperature=1.0):\n"
    "    diff = q[..., :, None, :] - k[..., None, :, :]\n"
    "    weights = torch.softmax(-diff.pow(2).sum(-1) / temperature, dim=-1)\n    return weights @ v, weights",
}
WRONG = {  # plausible wrong answers: the global maximum kept, the unit-variance intuition, the distance not negated
    "def softmax": "def softmax(scores):\n    e = torch.exp(scores - scores.max())\n"
    "    return e / e.sum(dim=-1, keepdim=True)",
    "prediction =": "prediction = 1.0",
    "def distance_attention": "def distance_attention(q, k, v, temperature=1.0):\n"
    "    weights = torch.softmax(torch.cdist(q, k) / temperature, dim=-1)\n    return weights @ v, weights",
}
PASSING = f"[{{'checker': c, 'status': 'passed', 'passed': True, 'feedback': c + ': All passed.'}} for c in {CHECKERS}]"


def chapter(answers: dict[str, str] | None = RIGHT, *, first=(), after_11=(), last=()) -> nbformat.NotebookNode:
    """The Colab copy with ``answers`` in its answer cells (None: untouched), ``first`` before the exercises,
    ``after_11`` after check_softmax's cell and ``last`` at the end."""
    nb = nbformat.read(ROOT / "colab" / "01_attention.ipynb", as_version=4)
    cells = []
    for cell in nb.cells:
        start = next((k for k in RIGHT if re.match(re.escape(k) + "[( ]", cell.source)), None)  # not softmax_grads
        if start == "def softmax":
            cells += [nbformat.v4.new_code_cell(s) for s in first]
        cells.append(nbformat.v4.new_code_cell(answers[start]) if start and answers else cell)
        if "check_softmax(softmax)" in cell.source:
            cells += [nbformat.v4.new_code_cell(s) for s in after_11]
    nb.cells = cells + [nbformat.v4.new_code_cell(s) for s in last]
    return nb


HALF = {
    **RIGHT,
    "prediction =": WRONG["prediction ="],
    "def distance_attention": "def distance_attention(q, k, v):\n    ...",
}
FW = "import json\nimport transformer_lib.notebook.exercises._framework as fw\n"
WALK = """import sys
def _expected():  # the checker's own `expected`, from the frame of Checker.case in whichever thread runs it
    for frame in list(sys._current_frames().values()):
        while frame is not None:
            if frame.f_code.co_name == 'case' and 'expected' in frame.f_locals:
                return frame.f_locals['expected']
            frame = frame.f_back
    raise LookupError('no checker frame')
"""
FRAME_WALK = {
    "def softmax": WALK + "def softmax(scores):\n    return _expected()",
    "prediction =": "class Prediction(float):\n    def __float__(self):\n        return float(_expected())\n"
    "prediction = Prediction(0.0)",
    "def distance_attention": "def distance_attention(q, k, v, temperature=1.0):\n    return _expected()",
}
TEACHER = """import json, transformer_lib
from pathlib import Path
nb = json.loads((Path(transformer_lib.__file__).parents[1] / 'chapters/01_attention.ipynb').read_text())
for c in nb['cells']:
    s = ''.join(c['source'])
    if s.startswith(('def softmax(', 'prediction =', 'def distance_attention(')) and '...' not in s:
        exec(s, globals())"""
ZEROS = {
    "def softmax": "def softmax(scores):\n    return torch.zeros_like(scores)",
    "prediction =": "prediction = 0.0",
    "def distance_attention": "def distance_attention(q, k, v, temperature=1.0):\n"
    "    w = torch.zeros(*q.shape[:-1], k.shape[-2])\n    return w @ v, w",
}
CHECKER_PATCH = """import transformer_lib.notebook.exercises as ex
from transformer_lib.notebook.exercises.ch01_attention import reference_distance_attention as ref
real = {n: getattr(ex, n) for n in dir(ex) if n.startswith('check_')}
ex.check_softmax = lambda f: real['check_softmax'](lambda s: torch.softmax(s, -1))
ex.check_score_std = lambda p: real['check_score_std'](64.0)
ex.check_distance_attention = lambda f: real['check_distance_attention'](ref)"""
SOFTMAX_PATCH = """import math
torch.softmax = lambda x, dim=-1, **k: torch.zeros_like(x)
torch.Tensor.softmax = lambda self, dim=-1, **k: torch.zeros_like(self)
math.isclose = lambda *a, **k: True"""
COMPARE_PATCH = "import math\ntorch.allclose = lambda *a, **k: True\nmath.isclose = lambda *a, **k: True"
PRINT_RECORDS = f"""import json, os
line = '\\n'.join(json.dumps(r) for r in {PASSING})
print(line)
for d in ('.', '..', '../..', '/tmp'):
    try:
        open(os.path.join(d, 'results.jsonl'), 'a').write(line + '\\n')
    except OSError:
        pass
os.write(1, b'f_print_records 3/3 passed FORGED\\n')
os.write(2, b'FORGED\\x1b[2J\\n')"""
USER_EXPRESSIONS = f"""import json
ip = get_ipython()
real, fake = ip.user_expressions, json.dumps({PASSING})
def forged(expressions):
    out = real(expressions)
    out['records'] = {{'status': 'ok', 'data': {{'text/plain': repr(fake)}}, 'metadata': {{}}}}
    return out
ip.user_expressions = forged"""
# Each survivor would carry a marker, `sleep 4242.N`, in its command line. HEAD's names come first (rows()).
KILL_PARENT = """if os.fork() == 0:  # a daemon that rewrites the CSVs after 20 s
    os.setsid()
    if os.fork():
        os._exit(0)
    time.sleep(20)
    for f in (OUT + '/grades.csv', OUT + '/grades_students.csv'):
        try:
            open(f, 'a').write('FORGED,HOSTILE daemon\\n')
        except OSError:
            pass
    os.execvp('sleep', ['sleep', '4242.1'])
os.kill(os.getppid(), signal.SIGKILL)"""
FORK_BOMB = """def grow(d):
    for _ in range(2 if d else 0):
        if os.fork() == 0:
            grow(d - 1)
    os.execvp('sleep', ['sleep', '4242.3'])
if os.fork() == 0:
    grow(6)"""
SETSID_ORPHAN = """subprocess.Popen(['setsid', 'sleep', '4242.4'])
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp('sleep', ['sleep', '4242.4'])
    os._exit(0)"""
FORK_RUNNER = """for _ in range(4):
    if os.fork() == 0:
        end = time.time() + 40
        while time.time() < end:
            if os.fork():
                os._exit(0)
            time.sleep(0.01)
        os.execvp('sleep', ['sleep', '4242.5'])"""
SIGINT_IGNORED = (
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(10**6)"
)
EVIDENCE = "\nraise RuntimeError('EVIDENCE ' + json.dumps(ev, separators=(',', ':')))"  # the (notebook) row shows it
READ_OTHERS = (
    """ev = {'pids': [p for p in os.listdir('/proc') if p.isdigit()][:8], 'cwd': os.listdir('.')}
for k, p in (('out', OUT), ('class', CLASS), ('h_correct', CLASS + '/h_correct/01_attention.ipynb'), ('root', ROOT)):
    try:
        ev[k] = os.listdir(p)[:4] if os.path.isdir(p) else len(open(p).read())
    except OSError as e:
        ev[k] = type(e).__name__"""
    + EVIDENCE
)
WRITE_OUTSIDE = (
    """ev = {}
subprocess.run(['mount', '-o', 'remount,rw,bind', PACKAGE], capture_output=True)
for d in (PACKAGE, PACKAGE + '/notebook/exercises', OUT, CLASS, ROOT, '..', '/tmp', os.path.expanduser('~')):
    try:
        open(os.path.join(d, 'HOSTILE_MARKER'), 'w').write('x')
        ev[d[-12:]] = 'ok'
    except OSError as e:
        ev[d[-12:]] = type(e).__name__"""
    + EVIDENCE
)
NETWORK = (
    """ev = {}
for host, p in (('127.0.0.1', PORT), ('pypi.org', 443), ('1.1.1.1', 53)):
    try:
        socket.create_connection((host, p), timeout=3).sendall(b'HOSTILE l_network')
        ev[host] = 'connected'
    except OSError as e:
        ev[host] = type(e).__name__"""
    + EVIDENCE
)


def rows(class_dir: Path, out: Path, port: int) -> dict[str, tuple[str, object]]:
    """Each submission: (what it does, its notebook, or bytes for a file that is not one)."""
    names = {"PACKAGE": str(PACKAGE), "OUT": str(out), "CLASS": str(class_dir), "ROOT": str(ROOT), "PORT": port}
    head = "import json, os, signal, socket, subprocess, sys, time\n" + "".join(
        f"{k} = {v!r}\n" for k, v in names.items()
    )
    bad_source = json.loads(nbformat.writes(chapter()))
    bad_source["cells"].append({"cell_type": "markdown", "id": "odd", "metadata": {}, "source": 5})

    def meta(value: object) -> nbformat.NotebookNode:
        nb = chapter()
        nb.metadata["transformer_book"] = value
        return nb

    return {
        "h_correct": ("right answers", chapter()),
        "h_untouched": ("the Colab copy as given", chapter(None)),
        "h_half": ("1.1 right, 1.2 wrong, 1.3 untouched", chapter(HALF)),
        "h_wrong": ("plausible wrong answers", chapter(WRONG)),
        "f_records_patch": ("replaces `_framework.grader_records` (answers untouched)",
                            chapter(None, last=[f"{FW}fw.grader_records = lambda: json.dumps({PASSING})"])),
        "f_latest_edit": ("edits `_framework._LATEST` (answers untouched)",
                          chapter(None, last=[f"{FW}fw._LATEST.update((r['checker'], r) for r in {PASSING})"])),
        "f_checker_patch": ("replaces the check_* functions before the checker cell imports them",
                            chapter(None, first=[CHECKER_PATCH])),
        "f_softmax_patch": ("torch.softmax returns zeros, math.isclose True; the answers return zeros",
                            chapter(ZEROS, first=[SOFTMAX_PATCH])),
        "f_compare_patch": ("torch.allclose and math.isclose return True; wrong answers",
                            chapter(WRONG, first=[COMPARE_PATCH])),
        "f_frame_walk": ("each answer returns the checker's own `expected` via frames; a float subclass",
                         chapter(FRAME_WALK)),
        "f_teacher_solution": ("exec of the teacher's solution cells, found via transformer_lib.__file__",
                               chapter({**dict.fromkeys(RIGHT, "pass"), "def softmax": TEACHER})),
        "f_print_records": ("prints passing records, appends results.jsonl in . .. ../.. /tmp, fake lines to fds 1, 2",
                            chapter(None, last=[PRINT_RECORDS])),
        "f_user_expressions": ("wraps IPython's user_expressions, the grader's channel",
                               chapter(None, first=[USER_EXPRESSIONS])),
        "c_keyboardinterrupt": ("input(), then raise KeyboardInterrupt, then right answers",
                                chapter(first=["input('name? ')", "raise KeyboardInterrupt"])),
        "c_systemexit": ("sys.exit(3), raise SystemExit(0), exit(), right answers",
                         chapter(first=["import sys\nsys.exit(3)", "raise SystemExit(0)", "exit()"])),
        "c_os_exit": ("os._exit(0) after 1.1", chapter(after_11=["import os\nos._exit(0)"])),
        "c_kill_parent": ("a detached daemon (rewrites the CSVs after 20 s), then SIGKILLs its parent",
                          chapter(first=[head + KILL_PARENT])),
        "c_stop_parent": ("SIGSTOPs its parent", chapter(first=[head + "os.kill(os.getppid(), signal.SIGSTOP)"])),
        "c_fork_bomb": ("a tree of 127 sleeping processes", chapter(first=[head + FORK_BOMB])),
        "c_setsid_orphan": ("setsid sleep, and a double fork with os.setsid()", chapter(first=[head + SETSID_ORPHAN])),
        "c_fork_runner": ("4 fork chains (fork, the parent exits) for 40 s", chapter(first=[head + FORK_RUNNER])),
        "c_infinite_loop": ("while True: pass after 1.1", chapter(after_11=["while True:\n    pass"])),
        "c_sigint_ignored": ("ignores SIGINT and SIGTERM, then sleeps, after 1.1",
                             chapter(after_11=[head + SIGINT_IGNORED])),
        "c_mem_5gb": ("allocates 5 GB (touched), then 10 GB",
                      chapter(first=["hoard = b'x' * (5 * 2**30)", "more = b'y' * (10 * 2**30)", "del hoard"])),
        "c_prints_100mb": ("one 50 MB print and 50 prints of 1 MB",
                           chapter(first=["print('x' * 50_000_000)", "for _ in range(50):\n    print('y' * 2**20)"])),
        "c_huge_reply": ("grader_records returns a 100 MB string",
                         chapter(last=[f"{FW}fw.grader_records = lambda: 'x' * 100_000_000"])),
        "l_read_others": ("scans /proc, the grading folder, the class; reads h_correct",
                          chapter(last=[head + READ_OTHERS])),
        "l_write_outside": ("remounts the package rw; writes markers in it, the grading folder, the class, /tmp, ~",
                            chapter(last=[head + WRITE_OUTSIDE])),
        "l_network": ("connects to the local listener, pypi.org:443 and 1.1.1.1:53", chapter(last=[head + NETWORK])),
        "odd_badmeta_str": ('`"transformer_book": "01_attention"`, right answers', meta("01_attention")),
        "odd_badmeta_list": ('`{"chapter": ["01_attention"]}`, right answers', meta({"chapter": ["01_attention"]})),
        "odd_badsource": ("a cell whose source is 5", json.dumps(bad_source).encode()),
        "odd_garbage": ("bytes that are not JSON", b"\x00\xff{ not json at all"),
        "odd_renamed": ("chapter 1 (right answers) saved as 03_multi_head_attention.ipynb", chapter()),
    }  # fmt: skip


def build(class_dir: Path, out: Path, port: int) -> tuple[list[Path], dict[str, str]]:
    """Write each submission into its own folder: the paths, and what each does."""
    paths, what = [], {}
    for name, (does, nb) in rows(class_dir, out, port).items():
        file = "03_multi_head_attention" if name == "odd_renamed" else "01_attention"
        path = class_dir / name / f"{file}.ipynb"
        path.parent.mkdir(parents=True)
        path.write_bytes(nb) if isinstance(nb, bytes) else nbformat.write(nb, path)
        paths.append(path)
        what[f"{name}/{file}.ipynb"] = does
    return paths, what


def listen() -> tuple[int, list[str]]:
    """A TCP listener on 127.0.0.1: its port, and what it received."""
    server, got = socket.create_server(("127.0.0.1", 0)), []

    def serve() -> None:
        while True:
            conn, peer = server.accept()
            conn.settimeout(2)
            try:
                got.append(f"{peer}: {conn.recv(200)!r}")
            except OSError as e:
                got.append(f"{peer}: {e}")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1], got


def files(folders: list[Path]) -> dict[str, tuple[float, str]]:
    """Every file under ``folders`` (only the top of /tmp, /root and ROOT): its mtime and sha256."""
    found = {}
    for folder in folders:
        shallow = folder in (Path("/tmp"), Path("/root"), ROOT)
        for path in folder.iterdir() if shallow else folder.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                try:
                    found[str(path)] = (path.stat().st_mtime, hashlib.sha256(path.read_bytes()).hexdigest())
                except OSError:
                    pass
    return found


def finished(csv_path: Path) -> dict[str, list[dict[str, str]]]:
    """The notebooks whose rows in the CSV are final (they carry the notebook's sha256)."""
    done: dict[str, list[dict[str, str]]] = {}
    try:
        with open(csv_path, newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                done.setdefault(r["notebook"], []).append(r)
    except (OSError, csv.Error, KeyError):
        return {}
    return {k: v for k, v in done.items() if all(r["sha256"] for r in v)}


def grade(paths: list[Path], out: Path, kill_after: int | None = None) -> dict:
    """Run the grader, polling every 0.1 s; what it did."""
    command = [str(GRADER), *map(str, paths), "-j", "2", "--timeout", "60", "--csv", str(out / "grades.csv")]
    began = time.monotonic()
    with open(out / "stdout.txt", "w") as stdout:
        grader = subprocess.Popen(command, cwd=out, stdout=stdout, stderr=subprocess.PIPE, text=True)
    started, ended, stderr, family, folders, peak = {}, {}, [], {}, set(), 0

    def read() -> None:
        for line in grader.stderr:
            stderr.append(line)
            if line.startswith("grading ") and line.rstrip().endswith(" ..."):
                started[line[8:-5].strip()] = time.monotonic()

    reader = threading.Thread(target=read)
    reader.start()
    me = psutil.Process(grader.pid)
    while grader.poll() is None:
        try:
            status = Path(f"/proc/{grader.pid}/status").read_text()
            peak = max(peak, int(next(x for x in status.splitlines() if x.startswith("VmHWM")).split()[1]))
            for child in me.children(recursive=True):  # each process of the class: (pid, start time)
                line = " ".join(child.cmdline())
                family.setdefault(child.pid, (child.create_time(), line[:120]))
                folders.update(re.findall(r"--chdir (/tmp/grade-\S+)", line))  # each kernel's run folder
        except (OSError, StopIteration, psutil.Error):
            pass
        for name in finished(out / "grades.csv"):
            ended.setdefault(name, time.monotonic())
        if kill_after is not None and len(ended) >= kill_after:
            grader.send_signal(signal.SIGKILL)
            break
        time.sleep(0.1)
    code = grader.wait()
    reader.join()
    for name in finished(out / "grades.csv"):
        ended.setdefault(name, time.monotonic())
    return dict(code=code, seconds=time.monotonic() - began, started=started, ended=ended, stderr=stderr,
                family=family, folders=folders, peak_kib=peak, command=command)  # fmt: skip


def alive(family: dict[int, tuple[float, str]]) -> list[str]:
    """The processes seen under the grader that still live, and any with a hostile marker."""
    left = []
    for pid, (created, line) in family.items():
        try:
            process = psutil.Process(pid)
            if process.create_time() == created:
                left.append(f"{pid} [{process.status()}, ppid {process.ppid()}] {line}")
        except psutil.Error:
            pass
    for p in psutil.process_iter(["pid", "cmdline"]):
        if any("4242." in a or "HOSTILE" in a for a in p.info["cmdline"] or []) and p.pid != os.getpid():
            left.append(f"{p.pid} {' '.join(p.info['cmdline'])[:120]} (marker)")
    return left


def report(run: dict, what: dict[str, str], out: Path) -> None:
    rows_by = {}
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            rows_by.setdefault(r["notebook"], []).append(r)
    print("| Submission | What it does | Row(s) | Time |\n|---|---|---|---|")
    for name, does in what.items():
        mine = rows_by.get(name, [])
        scored = [r for r in mine if r["score"]]
        score = f"{sum(r['passed'] == 'True' for r in scored)}/{len(scored)}"
        note = [r["feedback"][:160].replace("|", "/").replace("\n", " ") for r in mine if r["exercise"] == "(notebook)"]
        failed = [
            f"{r['exercise'][9:]}: {r['feedback'][:70]}".replace("|", "/") for r in scored if r["passed"] != "True"
        ]
        text = score + (f" + (notebook) {note[0]!r}" if note else "") + (f"; {'; '.join(failed)}" if failed else "")
        t = run["ended"].get(name, 0) - run["started"].get(name, run["ended"].get(name, 0))
        print(f"| {name.split('/')[0]} | {does} | {text} | {t:.1f} s |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, help="where to build the class (default: a new folder in /tmp)")
    parser.add_argument("--kill-after", type=int, help="SIGKILL the grader after N finished submissions, rerun")
    args = parser.parse_args()
    base = args.folder or Path(tempfile.mkdtemp(prefix="hostile-class-"))
    class_dir, out = base / "class", base / "out"
    out.mkdir(parents=True)
    port, received = listen()
    paths, what = build(class_dir, out, port)
    watched = [PACKAGE, ROOT, class_dir, out, Path("/tmp"), Path("/root")]
    before, ps_before = (
        files(watched),
        subprocess.run(["ps", "-eo", "pid,ppid,user,stat,args"], capture_output=True, text=True).stdout,
    )
    print(f"load average before: {os.getloadavg()}; class in {class_dir}; grading folder {out}; listener :{port}")
    run = grade(paths, out, args.kill_after)
    time.sleep(1)
    peak = f"peak RSS (VmHWM of the grader) {run['peak_kib'] / 1024:.0f} MiB"
    print(f"grader exit {run['code']}, {run['seconds']:.1f} s, {peak}")
    print(f"processes seen under the grader: {len(run['family'])}; alive after: {alive(run['family'])}")
    if args.kill_after is not None:
        done = sorted(run["ended"])
        print(f"killed after {len(done)} finished: {done}")
        time.sleep(4)
        print(f"alive 5 s after the kill: {alive(run['family'])}")
        kept = finished(out / "grades.csv")
        print(f"every finished row kept: {all(n in kept for n in done)} ({len(kept)} submissions in the CSV)")
        rerun = grade(paths, out)
        regraded = sorted(run2 for run2 in rerun["started"])
        print(f"rerun exit {rerun['code']}, {rerun['seconds']:.1f} s, graded again: {len(regraded)} (overlap with the"
              f" finished ones: {sorted(set(regraded) & set(done))}); complete: {len(finished(out / 'grades.csv'))}"
              f"/{len(paths)}")  # fmt: skip
        print(f"alive after the rerun: {alive(run['family'] | rerun['family'])}")
        run["ended"], run["started"] = rerun["ended"] | run["ended"], rerun["started"] | run["started"]
    time.sleep(25)  # c_kill_parent's daemon would rewrite the CSVs 20 s after its row
    after = files(watched)
    changed = sorted(p for p in after if before.get(p) != after[p] and not p.startswith(str(out)))
    print(f"files new or changed outside the grading folder (20 s later): {changed}")
    forged = "FORGED" in (out / "grades.csv").read_text()
    print(f"grading folder now: {sorted(os.listdir(out))}; CSV mentions FORGED: {forged}")
    markers = [p for p in after if "HOSTILE" in p or p.endswith("results.jsonl")]
    print(f"markers (HOSTILE_MARKER, results.jsonl) anywhere watched: {markers}")
    folders = run["folders"] | (rerun["folders"] if args.kill_after is not None else set())
    print(f"run folders: {len(folders)}, left behind: {sorted(f for f in folders if os.path.exists(f))}")
    printed = (out / "stdout.txt").read_text() + "".join(run["stderr"])
    print(f"FORGED in the grader's stdout/stderr: {'FORGED' in printed}; escape: {chr(27) in printed}")
    print(f"listener received: {received}")
    print(f"ps before ({len(ps_before.splitlines())} lines) saved; ps after:")
    (out / "ps_before.txt").write_text(ps_before)
    ps = subprocess.run(["ps", "-eo", "pid,ppid,user,stat,args"], capture_output=True, text=True).stdout
    (out / "ps_after.txt").write_text(ps)
    print(
        "\n".join(
            x
            for x in ps.splitlines()
            if "bwrap" in x or "ipykernel" in x or "sleep" in x or x.split()[2].startswith("655")
        )
        or "(nothing of the class)"
    )
    print(f"load average after: {os.getloadavg()}")
    report(run, what, out)
    print(f"rerun: {' '.join([sys.executable, *sys.argv])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

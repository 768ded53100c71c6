#!/usr/bin/env python3
"""Execute chapters in fresh kernels as the book build does, under a chosen configuration.

Each chapter runs top to bottom in a new ``python3`` kernel of this interpreter, with the
chapters' folder as working directory and _config.yml's time limit per cell (300 s), as
``make book`` runs them (myst-nb through jupyter-cache, ``run_in_temp: false``) and with the
build's environment (``TRANSFORMER_BOOK_BUILD=1``, ``TQDM_DISABLE=1``). It prints one line per
chapter; a failing cell is named by its index in the notebook (0-based, markdown cells counted):

    07_decoder_only              131.2 s  ok
    08_training_at_scale          64.0 s  FAILED: cell 41: AssertionError: ...

Usage: python scripts/execute_chapters.py [NUMBER ...] [options]   (default: every chapter)
  --precision P   TRANSFORMER_LIB_PRECISION=P in the kernels: auto, fp32, bf16 or fp16
  --busy N        N busy-loop processes (``while True: pass``) beside the kernels for the whole
                  run, as on a machine that is doing something else; always ended at exit
  --reseed K      execute a copy in which every seed literal a code cell sets has K added:
                  set_seed(0), manual_seed(1), seed=0, seed = 2, SEED = 0, SEEDS = (0, 1, 2)
                  (and lower-case ``seeds = (0, 1)``); prints how many it replaced per chapter
  --out DIR       write the executed notebooks and times.json ({chapter: {seconds, ok, error,
                  errors, slowest_cells: [[cell index, seconds], ...], ...}}) there (a bare
                  `assert` is reported by its failing line); a chapter stopped part-way is
                  written too, with the cells it ran (their outputs and times)
  --allow-errors  run past a failing cell and record every failing cell, not only the first

Exit status 1 when any chapter failed. `make busy-check`, `make fp32-check`, `make avx2-check`
(with an AVX2-only CPU's kernels: the variables reach each kernel) and `make reseed-check` run it;
tests/test_precision_runs.py calls ``run_chapters``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from transformer_lib.precision import PRECISION_ENV, PRECISIONS, precision_override

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
# What the book build sets for the kernels (scripts/build_book.py).
BUILD_ENV = {"TRANSFORMER_BOOK_BUILD": "1", "TQDM_DISABLE": "1"}

# Seed literals. A call or a keyword/assignment: the integer is group "n".
SEED_CALL = re.compile(r"\b(?:set_seed|manual_seed)\(\s*(?P<n>\d+)\s*\)")
SEED_ASSIGN = re.compile(r"\b(?:seed|SEED)\s*=(?!=)\s*(?P<n>\d+)(?![\w.])")
# A tuple of seeds: every integer of group "tuple".
SEEDS_TUPLE = re.compile(r"\b(?:SEEDS|seeds)\s*=(?!=)\s*\((?P<tuple>\s*\d+\s*(?:,\s*\d+\s*)*,?\s*)\)")
# A line that assigns several names at once (`N_LAYERS, LR, SEED = 6, 1e-2, 0`): the seed is the value
# at the seed's position, not the one after `SEED =`.
MULTI_ASSIGN = re.compile(
    r"^(?P<head>\s*(?P<targets>\w+(?:\s*,\s*\w+)+)\s*=(?!=)\s*)(?P<values>[^#]*?)(?P<tail>\s*(?:#.*)?)$"
)


def _cell_timeout() -> int:
    """The per-cell time limit of the book build (_config.yml's execute.timeout)."""
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    return int(config.get("execute", {}).get("timeout", 300))


def chapter_paths(numbers: list[int] | None = None, folder: Path = CHAPTERS) -> list[Path]:
    """The chapter notebooks, in order: all of them, or those whose file name starts with NN_."""
    paths = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not numbers:
        return paths
    chosen = []
    for n in numbers:
        found = [p for p in paths if p.name.startswith(f"{n:02d}_")]
        if not found:
            raise ValueError(f"no chapter {n} in {folder} (there are {', '.join(p.stem for p in paths)})")
        chosen += found
    return chosen


def reseed_source(source: str, offset: int) -> tuple[str, int]:
    """``source`` with ``offset`` added to every seed literal, and how many it replaced.

    Only integer literals count: ``manual_seed(seed)``, ``seed=seed``, ``seed_everything(0)``,
    ``data_seed=3`` and ``seed == 0`` are left as they are.
    """
    count = 0

    def add(digits: str) -> str:
        nonlocal count
        count += 1
        return str(int(digits) + offset)

    def shift(m: re.Match[str], group: str = "n") -> str:
        start, end = m.start(group) - m.start(), m.end(group) - m.start()
        inner = m.group(group)
        replaced = add(inner) if group == "n" else re.sub(r"\d+", lambda d: add(d.group(0)), inner)
        return m.group(0)[:start] + replaced + m.group(0)[end:]

    def singles(text: str) -> str:
        return SEED_ASSIGN.sub(shift, SEED_CALL.sub(shift, text))

    source = SEEDS_TUPLE.sub(lambda m: shift(m, "tuple"), source)
    lines = []
    for line in source.split("\n"):
        multi = MULTI_ASSIGN.match(line)
        if multi is None:
            lines.append(singles(line))
            continue
        targets = [t.strip() for t in multi["targets"].split(",")]
        values = multi["values"].split(",")
        if len(values) == len(targets):
            for i, target in enumerate(targets):
                if target in ("seed", "SEED") and values[i].strip().isdigit():
                    values[i] = re.sub(r"\d+", lambda d: add(d.group(0)), values[i])
        lines.append(multi["head"] + singles(",".join(values)) + multi["tail"])
    return "\n".join(lines), count


def reseed_notebook(nb, offset: int) -> int:
    """Add ``offset`` to the seed literals of every code cell of ``nb`` (in place); how many."""
    total = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source, n = reseed_source(cell.source, offset)
            total += n
    return total


def kernel_env(precision: str | None) -> dict[str, str]:
    """The kernels' environment: this one, the build's variables, and the precision if given."""
    env = {**os.environ, **BUILD_ENV}
    if precision is not None:
        env[PRECISION_ENV] = precision
    return env


@contextmanager
def busy_processes(n: int) -> Iterator[list[subprocess.Popen]]:
    """``n`` processes that each keep a core busy with a pure-Python loop, killed on exit.

    They are killed however the block ends (an error, Ctrl-C); each also stops by itself when its
    parent is gone, so a run killed outright (SIGTERM, SIGKILL) leaves none behind.
    """
    loop = (
        "import os\nparent = os.getppid()\n"
        "while os.getppid() == parent:\n    for _ in range(1_000_000):\n        pass\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(n)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


@dataclass
class ChapterRun:
    """One chapter's execution: how long it took and which cells failed."""

    name: str
    seconds: float = 0.0
    errors: list[tuple[int, str]] = field(default_factory=list)  # (cell index, first line of the error)
    replacements: int | None = None  # seed literals changed (--reseed)
    cell_seconds: dict[int, float] = field(default_factory=dict)  # code cell index -> seconds it ran

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def error(self) -> str | None:
        return f"cell {self.errors[0][0]}: {self.errors[0][1]}" if self.errors else None

    def line(self) -> str:
        status = "ok" if self.ok else f"FAILED: {self.error}"
        more = f" (and {len(self.errors) - 1} more failing cells)" if len(self.errors) > 1 else ""
        return f"{self.name:30s} {self.seconds:7.1f} s  {status}{more}"


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:300]


def error_line(out: dict) -> str:
    """ "Name: message" of an error output; for a bare ``assert``, the line that failed instead."""
    message = _first_line(str(out.get("evalue", "")))
    if not message:  # IPython marks the failing line of each frame with an arrow: take the last one
        arrows = [ANSI.sub("", line) for tb in out.get("traceback", []) for line in tb.splitlines()]
        arrows = [m for line in arrows if (m := re.match(r"\s*---->\s*(\d+)\s?(.*)", line))]
        message = f"line {arrows[-1][1]}: {arrows[-1][2].strip()}" if arrows else ""
    return f"{out.get('ename', 'Error')}: {message}"[:300]


def cell_errors(nb) -> list[tuple[int, str]]:
    """(index, error line) of every code cell with an error output, cells tagged raises-exception aside."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "raises-exception" in cell.get("metadata", {}).get("tags", []):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append((index, error_line(out)))
                break
    return found


def cell_seconds(nb) -> dict[int, float]:
    """Seconds each executed code cell ran, by index, from the timestamps nbclient records in its metadata."""
    found = {}
    for index, cell in enumerate(nb.cells):
        execution = cell.get("metadata", {}).get("execution", {})
        start, end = execution.get("iopub.execute_input"), execution.get("shell.execute_reply")
        if start and end:
            found[index] = round((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds(), 2)
    return found


def execute(nb, name: str, env: dict[str, str], *, allow_errors: bool = False, cwd: Path = CHAPTERS) -> ChapterRun:
    """Execute ``nb`` (in place) in a fresh python3 kernel, as the book build does."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    run = ChapterRun(name)
    current = {"index": 0}

    def on_cell_start(cell, cell_index: int) -> None:
        current["index"] = cell_index

    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=_cell_timeout(),
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(cwd)}},
        on_cell_start=on_cell_start,
    )
    start = time.perf_counter()
    failure = None
    try:
        client.execute(env=env)
    except CellExecutionError:
        pass  # the failing cell holds the error output
    except CellTimeoutError:
        failure = f"timed out after {client.timeout} s"
    except DeadKernelError as e:
        failure = f"the kernel died: {_first_line(str(e))}"
    finally:
        # While a kernel runs, nbclient answers SIGINT and SIGTERM itself: it shuts the kernel down and
        # keeps the future of that clean-up. Stop the whole run then, as Ctrl-C means.
        if getattr(client, "_async_cleanup_kernel_future", None) is not None:
            raise KeyboardInterrupt
    run.seconds = time.perf_counter() - start
    run.errors = cell_errors(nb)
    run.cell_seconds = cell_seconds(nb)
    if failure is not None:
        run.errors.append((current["index"], failure))
    return run


def run_chapters(
    paths: list[Path],
    *,
    precision: str | None = None,
    reseed: int | None = None,
    allow_errors: bool = False,
    out: Path | None = None,
    cwd: Path = CHAPTERS,
    echo: bool = True,
) -> list[ChapterRun]:
    """Execute each notebook of ``paths``; write them and times.json to ``out`` when given."""
    import nbformat

    env = kernel_env(precision)
    runs = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        replacements = reseed_notebook(nb, reseed) if reseed is not None else None
        if echo and replacements is not None:
            print(f"{path.stem}: {replacements} seed literals + {reseed}", flush=True)
        try:
            run = execute(nb, path.stem, env, allow_errors=allow_errors, cwd=cwd)
        finally:  # a chapter stopped part-way (Ctrl-C, `timeout`) too: its cells run so far, with their times
            if out is not None:
                nbformat.write(nb, out / path.name)
        run.replacements = replacements
        runs.append(run)
        if echo:
            print(run.line(), flush=True)
    if out is not None:
        times = {
            r.name: {
                "seconds": round(r.seconds, 1),
                "ok": r.ok,
                "error": r.error,
                "errors": [{"cell": i, "error": e} for i, e in r.errors],
                "precision": env.get(PRECISION_ENV, "auto"),
                "reseed": reseed,
                "seed_replacements": r.replacements,
                "slowest_cells": sorted(r.cell_seconds.items(), key=lambda kv: -kv[1])[:8],  # [index, seconds]
            }
            for r in runs
        }
        (out / "times.json").write_text(json.dumps(times, indent=2) + "\n", encoding="utf-8")
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=int, metavar="NUMBER", help="chapter numbers (default: all)")
    parser.add_argument("--precision", choices=PRECISIONS, help=f"{PRECISION_ENV} in the kernels")
    parser.add_argument("--busy", type=int, default=0, metavar="N", help="busy-loop processes during the run")
    parser.add_argument("--reseed", type=int, metavar="K", help="add K to every seed literal")
    parser.add_argument("--out", type=Path, metavar="DIR", help="executed notebooks and times.json")
    parser.add_argument("--allow-errors", action="store_true", help="record every failing cell")
    args = parser.parse_args(argv)
    try:
        paths = chapter_paths(args.chapters)
    except ValueError as e:
        parser.error(str(e))

    try:
        precision = args.precision or precision_override()  # the kernels inherit the environment's
    except ValueError as e:
        parser.error(str(e))

    print(
        f"execute_chapters: {len(paths)} chapter(s), {PRECISION_ENV}={precision}, {args.busy} busy process(es)"
        + (f", seeds + {args.reseed}" if args.reseed is not None else ""),
        flush=True,
    )
    try:
        with busy_processes(args.busy):
            runs = run_chapters(
                paths,
                precision=args.precision,
                reseed=args.reseed,
                allow_errors=args.allow_errors,
                out=args.out,
            )
    except KeyboardInterrupt:
        print("execute_chapters: interrupted", file=sys.stderr)
        return 130
    failed = [r.name for r in runs if not r.ok]
    print(f"execute_chapters: {len(runs) - len(failed)} ok, {len(failed)} failed" + (f": {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

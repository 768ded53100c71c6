#!/usr/bin/env python3
"""Sweep chapters for the book's evidence appendix: each chapter executed five times, its glued values and
claims (``transformer_lib.notebook.evidence``) written to ``book/evidence/<chapter>.json``.

The five runs: the chapter as the book builds it, the same in fp32, and three with every seed shifted by a
random multiple of 1000 (the second of them in fp32), as ``make reseed-check`` and ``make fp32-check`` run
chapters. The file holds each run's values, the machine, the commit and the date, and the hash of the
chapter's code cells: ``tests/test_evidence.py`` fails when the code changed after the sweep, when a chapter
claims a name its file lacks, or when a file keeps a claim no chapter makes.

Usage: python scripts/evidence.py NUMBER [NUMBER ...]   (a chapter's sweep takes five executions of it)
       python scripts/evidence.py --all                 every chapter that glues or claims anything
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import nbformat
import torch

from execute_chapters import CHAPTERS, ROOT, chapter_paths, run_chapters
from transformer_lib.notebook.evidence import EVIDENCE_ENV
from transformer_lib.precision import native_dtype

EVIDENCE_DIR = ROOT / "book" / "evidence"


def code_hash(path: Path) -> str:
    """The sha256 of a chapter's code cells: what decides its runs (its prose does not)."""
    nb = nbformat.read(path, as_version=4)
    code = "\n# ---- cell\n".join(c.source for c in nb.cells if c.cell_type == "code")
    return hashlib.sha256(code.encode()).hexdigest()


def sweep_runs() -> list[tuple[int, str]]:
    """(seed shift, precision) of the five runs."""
    a, b, c = (1000 * k for k in random.sample(range(1, 100), 3))
    return [(0, "auto"), (0, "fp32"), (a, "auto"), (b, "fp32"), (c, "auto")]


def machine() -> dict[str, object]:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.processor())
    native = native_dtype(torch.device("cpu"))
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "native": str(native).removeprefix("torch.") if native else "fp32",
        "torch": torch.__version__,
    }


def sweep(path: Path) -> dict[str, object]:
    """Execute the chapter at ``path`` in each of :func:`sweep_runs`; its evidence record."""
    runs = []
    for shift, precision in sweep_runs():
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "evidence.jsonl"
            log.touch()
            os.environ[EVIDENCE_ENV] = str(log)
            [run] = run_chapters([path], precision=precision, reseed=shift or None, allow_errors=True)
            records: dict[str, dict] = {}
            for line in log.read_text(encoding="utf-8").splitlines():
                entry = json.loads(line)
                records.setdefault(entry.pop("name"), {}).update(entry)
        errors = [{"cell": i, "error": e} for i, e in run.errors]
        runs.append(
            {"seed_shift": shift, "precision": precision, "seconds": round(run.seconds, 1), "errors": errors,
             "records": records}
        )  # fmt: skip
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return {"chapter": path.stem, "code_sha256": code_hash(path), "commit": commit.stdout.strip(),
            "date": date.today().isoformat(), "machine": machine(), "runs": runs}  # fmt: skip


def glues_anything(path: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    return any(c.cell_type == "code" and ("glue(" in c.source or "claim(" in c.source) for c in nb.cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=int, metavar="NUMBER")
    parser.add_argument("--all", action="store_true", help="every chapter that glues or claims anything")
    args = parser.parse_args(argv)
    if not args.chapters and not args.all:
        parser.error("name chapters by number, or --all")
    paths = (
        [p for p in chapter_paths(None, CHAPTERS) if glues_anything(p)] if args.all else chapter_paths(args.chapters)
    )
    EVIDENCE_DIR.mkdir(parents=True, exist_ok=True)
    failed = 0
    for path in paths:
        record = sweep(path)
        (EVIDENCE_DIR / f"{path.stem}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        held = [r.get("held") for run in record["runs"] for r in run["records"].values() if r.get("claim")]
        failed += held.count(False)
        claims = {name for run in record["runs"] for name, r in run["records"].items() if r.get("claim")}
        print(
            f"{path.stem}: {len(claims)} claims, {len(record['runs'])} runs, "
            f"{held.count(False)} of {len(held)} checks failed"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

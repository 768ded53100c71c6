#!/usr/bin/env python3
"""Refuse notebooks that carry outputs: chapters/ and colab/ are committed without them (the book
build executes the chapters; outputs in git would be noise in every diff and stale after any change).

The pre-commit hook (.pre-commit-config.yaml) runs it on the notebooks a commit touches, and
tests/test_chapters.py on every chapter and Colab notebook.

Usage: python scripts/check_no_outputs.py [NOTEBOOK ...]   (default: chapters/*.ipynb colab/*.ipynb)
Exits 1, naming each notebook and its cells with outputs; clear them in Jupyter (Edit > Clear
Outputs of All Cells) and save.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cells_with_outputs(path: Path) -> list[int]:
    """The numbers (from 1, counting every cell) of ``path``'s code cells with outputs or an execution count."""
    cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    return [
        n
        for n, cell in enumerate(cells, start=1)
        if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted([*ROOT.glob("chapters/*.ipynb"), *ROOT.glob("colab/*.ipynb")])
    status = 0
    for path in paths:
        cells = cells_with_outputs(path)
        if cells:
            print(f"{path}: cells with outputs: {', '.join(map(str, cells))}; clear them before committing")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

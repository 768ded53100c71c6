#!/usr/bin/env python3
"""Write student copies of the chapters: the same notebooks with every solution removed.

In the book, an exercise is an ``{exercise}`` block, a starter cell tagged ``student``
(hidden from the book by ``remove-cell``), and a solution between ``{solution-start}`` and
``{solution-end}``: code cells tagged ``solution`` and/or text. The student copy drops the
solutions, shows the starter cells, and keeps the checker calls, which then report what is
still missing instead of crashing.

Usage: python scripts/make_student.py [OUT_DIR]   (default: _build/student)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SOLUTION_BLOCK = re.compile(r"```\{solution-start\}.*?```\{solution-end\}\s*```\s*", re.S)
BANNER = (
    "**Student copy.** Solutions are removed: write your code in the cells marked "
    "`# your code here` and run the checker cell below each exercise."
)


def student_copy(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Return a copy of ``nb`` without solutions, with starter cells shown and outputs cleared.

    A solution may sit inside one markdown cell or span several cells between the
    ``{solution-start}`` and ``{solution-end}`` markers; everything between them goes.
    """
    out = nbformat.from_dict(nb)
    cells, inside = [], False
    for cell in out.cells:
        tags = cell.metadata.get("tags", [])
        if "solution" in tags:
            continue
        if cell.cell_type == "markdown":
            text = SOLUTION_BLOCK.sub("", cell.source)  # start ... end within this cell
            if inside:  # a solution that began in an earlier cell
                if "{solution-end}" not in text:
                    continue
                text = re.sub(r"^.*?```\{solution-end\}\s*```\s*", "", text, flags=re.S)
                inside = False
            if "{solution-start}" in text:  # a solution that continues into later cells
                text = re.sub(r"```\{solution-start\}.*$", "", text, flags=re.S)
                inside = True
            if not text.strip():
                continue
            cell.source = text.rstrip()
        elif inside:
            continue
        if "student" in tags:
            cell.metadata["tags"] = [t for t in tags if t != "remove-cell"]
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cells.append(cell)
    out.cells = [nbformat.v4.new_markdown_cell(BANNER), *cells]
    out.cells[0]["id"] = "student-banner"
    return out


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0]) if argv else ROOT / "_build" / "student"
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in sorted((ROOT / "chapters").glob("[0-9]*.ipynb")):
        nb = student_copy(nbformat.read(path, as_version=4))
        nbformat.write(nb, out_dir / path.name)
        print(f"{out_dir / path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

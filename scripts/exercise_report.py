#!/usr/bin/env python3
"""Report each chapter's exercises: number, kind, checkers, and how close each solution cell comes
to a body cell of its chapter (the test's similarity; see ``solution_similarity``).

The similarity of two cells is difflib's ratio between their code as token sequences, comments,
blank lines and formatting dropped (``normalised_tokens``): 1.0 is the same code, whatever the
comments, names kept. ``tests/test_chapters.py`` fails when a solution cell comes above
``MAX_SIMILARITY`` to any body cell (a cell outside the exercises section).

Usage: python scripts/exercise_report.py [CHAPTER.ipynb ...]   (default: every chapter)
"""

from __future__ import annotations

import difflib
import io
import keyword
import sys
import tokenize
from pathlib import Path

import nbformat

from transformer_lib.notebook.exercises.catalogue import chapter_number, exercises_of

ROOT = Path(__file__).resolve().parent.parent
MAX_SIMILARITY = 0.5
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}


def normalised_tokens(source: str) -> list[str]:
    """The code's tokens without comments and layout (IPython magics and shell lines dropped), every
    local name spelled ``_``: renaming ``scores`` to ``s`` does not hide a copy. Attribute names
    (``.transpose``) and keywords stay, they are what the code does."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        tokens = [
            t for t in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline) if t.type not in _SKIP
        ]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return "\n".join(lines).split()
    out = []
    for previous, t in zip([None, *tokens], tokens, strict=False):
        local = t.type == tokenize.NAME and not keyword.iskeyword(t.string) and getattr(previous, "string", "") != "."
        out.append("_" if local else t.string)
    return out


MIN_RUN = 8
"""Tokens in a row that count as copied: ``x.var(dim=-1, keepdim=True)`` is 12 tokens, ``torch.softmax(`` 4."""


def similarity(solution: list[str], body: list[str]) -> float:
    """The share of the solution's tokens found in the body cell in runs of at least :data:`MIN_RUN`
    tokens in the same order (difflib's matching blocks): 1.0 when the body cell contains the solution."""
    if not solution or not body:
        return 0.0
    blocks = difflib.SequenceMatcher(None, solution, body, autojunk=False).get_matching_blocks()
    return sum(b.size for b in blocks if b.size >= MIN_RUN) / len(solution)


def body_and_solutions(nb: nbformat.NotebookNode) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """``(body cells, solution cells)`` as ``(index, source)``: the body is every code cell before
    the ``## Exercises`` heading; the solutions are the code cells tagged ``solution``."""
    end = next(
        (i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and "## Exercises" in c.source),
        len(nb.cells),
    )
    body = [(i, c.source) for i, c in enumerate(nb.cells[:end]) if c.cell_type == "code"]
    solutions = [(i, c.source) for i, c in enumerate(nb.cells) if "solution" in c.metadata.get("tags", [])]
    return body, solutions


def solution_similarity(nb: nbformat.NotebookNode) -> list[tuple[int, float, int]]:
    """For each solution cell: ``(its index, the highest similarity to a body cell, that cell's index)``."""
    body, solutions = body_and_solutions(nb)
    body_tokens = [(i, normalised_tokens(s)) for i, s in body]
    rows = []
    for i, source in solutions:
        tokens = normalised_tokens(source)
        best = max(((similarity(tokens, b), j) for j, b in body_tokens), default=(0.0, -1))
        rows.append((i, *best))
    return rows


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
    worst = 0.0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        print(f"{path.name}")
        for e in exercises_of(nb.cells, chapter_number(path.name)):
            checked = ", ".join(e.checkers) or "not auto-checked"
            print(f"  Exercise {e.number} [{e.kind or 'NO KIND'}] {e.title}  ({e.label}; {checked})")
        for i, score, j in solution_similarity(nb):
            flag = "  <-- repeats the body" if score > MAX_SIMILARITY else ""
            print(f"  solution cell {i}: similarity {score:.2f} to body cell {j}{flag}")
            worst = max(worst, score)
    print(f"highest similarity {worst:.2f} (limit {MAX_SIMILARITY})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

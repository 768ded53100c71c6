#!/usr/bin/env python3
"""The Chinese edition's translation catalogs: one ``.po`` file per page, from the same sources as the English.

The English text stays in the notebooks and Markdown pages; its translation lives in
``locales/zh_CN/LC_MESSAGES/<page>.po`` (Sphinx's internationalisation: one entry per paragraph, heading,
list item, caption or admonition; code cells are never copied). Three steps:

- ``update`` (``make translations``): extract every translatable message with Sphinx's gettext builder
  (notebooks are read, not executed) and merge it into the catalogs with Babel: new paragraphs arrive
  untranslated, changed ones keep their old translation marked fuzzy (to review), removed ones go. Prints
  per page how many entries are translated, fuzzy and untranslated.
- ``compile``: the catalogs as the Chinese build reads them, in ``_build/locales`` (Sphinx compiles those
  ``.po`` files itself; fuzzy entries are left out, so the English shows until they are reviewed). A glued
  number, ``{glue:text}`name:.2f``` in a translation as in the English, becomes ``{glue:text}`page.ipynb::name:.2f```:
  Sphinx parses a translated paragraph as a document of its own, and myst-nb finds the page's glue data
  only through that reference.
- ``status``: the counts, without extracting; ``check``: every translation keeps its English's glued
  numbers, references, citations, terms' targets, inline code and math (what :func:`kept_markup` reads),
  and types no measured number by hand.

Usage: python scripts/translations.py update|compile|status|check
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

ROOT = Path(__file__).resolve().parent.parent
LANGUAGE = "zh_CN"
CATALOGS = ROOT / "locales" / LANGUAGE / "LC_MESSAGES"
COMPILED = ROOT / "_build" / "locales"
GLUE = re.compile(r"\{glue(:\w+)?\}`([^`:]+)(:[^`]*)?`")
ROLE = re.compile(r"\{(glue(?::\w+)?|eq|cite(?::\w+)?)\}`([^`]*)`|\{(term|ref|doc|numref)\}`(?:[^`<]*<)?([^`>]+)>?`")
CODE = re.compile(r"(?<![`}])`([^`]+)`")
MATH = re.compile(r"\$\$.*?\$\$|\$[^$]+\$", re.S)

EXTRACT = """
from pathlib import Path
from jupyter_book.sphinx import build_sphinx
raise SystemExit(build_sphinx(
    Path({root!r}), Path({out!r}), noconfig=True, path_config={config!r}, builder="gettext",
    doctreedir=Path({out!r}) / ".doctrees", quiet=True,
    confoverrides={{"latex_individualpages": False, "gettext_compact": False, "gettext_location": False,
                    "gettext_uuid": False, "nb_execution_mode": "off"}},
))
"""


def extract(out: Path) -> dict[str, Catalog]:
    """Every page's messages (``.pot``), read from the sources without executing a notebook."""
    script = EXTRACT.format(root=str(ROOT), out=str(out), config=str(ROOT / "_config.yml"))
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return {
        pot.relative_to(out).with_suffix("").as_posix(): read_po(pot.open("rb"))
        for pot in sorted(out.rglob("*.pot"))
        if ".doctrees" not in pot.parts
    }


def counts(catalog: Catalog) -> tuple[int, int, int]:
    """(translated, fuzzy, untranslated) entries of ``catalog``."""
    messages = [m for m in catalog if m.id]
    fuzzy = sum(1 for m in messages if m.fuzzy)
    untranslated = sum(1 for m in messages if not m.string)
    return len(messages) - fuzzy - untranslated, fuzzy, untranslated


def update() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        templates = extract(Path(tmp))
    kept = set()
    for page, template in templates.items():
        path = CATALOGS / f"{page}.po"
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            catalog = read_po(path.open("rb"), locale=LANGUAGE)
            catalog.update(template, no_fuzzy_matching=False)
            catalog.obsolete.clear()  # removed paragraphs: git keeps their history
        else:
            catalog = Catalog(locale=LANGUAGE)
            for message in template:
                if message.id:
                    catalog.add(message.id, "")
        with path.open("wb") as f:
            write_po(f, catalog, width=0, omit_header=True, sort_output=False)
        kept.add(path)
    for stale in set(CATALOGS.rglob("*.po")) - kept:
        stale.unlink()
    status()


def status() -> None:
    total = [0, 0, 0]
    for path in sorted(CATALOGS.rglob("*.po")):
        done, fuzzy, todo = counts(read_po(path.open("rb"), locale=LANGUAGE))
        total = [a + b for a, b in zip(total, (done, fuzzy, todo), strict=True)]
        print(f"{path.relative_to(CATALOGS).as_posix():45s} {done:4d} translated {fuzzy:4d} fuzzy {todo:4d} to do")
    print(f"{'all pages':45s} {total[0]:4d} translated {total[1]:4d} fuzzy {total[2]:4d} to do")


def glue_by_page(text: str, page: str) -> str:
    """``{glue:text}`name:.2f``` as ``{glue:text}`page::name:.2f``` (``name`` as ``page::name:s``, myst-nb's
    default spelled out: it reads the last ``:`` as the format's), which myst-nb resolves in a translation."""
    return GLUE.sub(lambda m: f"{{glue{m[1] or ''}}}`{page}::{m[2]}{m[3] or ':s'}`", text)


def numbered_title(text: str) -> str:
    """``1. 注意力`` as ``1\\. 注意力``: Sphinx parses a translated title alone, where a leading ``1. `` would
    start a list and the page would keep its English title."""
    return re.sub(r"^(\d+)\. ", r"\1\\. ", text)


def kept_markup(text: str) -> list[str]:
    """What a translation must carry over unchanged: roles but the shown words of a term or a reference (its
    target stays), inline code and math, sorted (a translation may reorder them)."""
    roles = [f"{{{m[1]}}}`{m[2]}`" if m[1] else f"{{{m[3]}}}`{m[4]}`" for m in ROLE.finditer(text)]
    without_roles = ROLE.sub(" ", text)
    return sorted(roles + CODE.findall(without_roles) + [" ".join(m.split()) for m in MATH.findall(without_roles)])


def check() -> int:
    """Print every translation that lost or changed its English's markup; the number of them."""
    faults = 0
    for path in sorted(CATALOGS.rglob("*.po")):
        for message in read_po(path.open("rb"), locale=LANGUAGE):
            if message.id and message.string and kept_markup(message.id) != kept_markup(message.string):
                faults += 1
                lost = set(kept_markup(message.id)) ^ set(kept_markup(message.string))
                print(f"{path.relative_to(CATALOGS).as_posix()}: {message.id[:60]!r}...: differs in {sorted(lost)}")
    return faults


def compile_catalogs() -> Path:
    """``_build/locales/zh_CN/LC_MESSAGES/<page>.po``: reviewed translations, glued numbers referenced by page."""
    for path in sorted(CATALOGS.rglob("*.po")):
        page = path.relative_to(CATALOGS).with_suffix("")
        source = next((ROOT / page).parent.glob(f"{page.name}.*"))  # the notebook or Markdown page
        catalog = read_po(path.open("rb"), locale=LANGUAGE)
        for message in catalog:
            message.string = "" if message.fuzzy else numbered_title(glue_by_page(message.string, source.name))
            message.flags.discard("fuzzy")
        out = COMPILED / LANGUAGE / "LC_MESSAGES" / page.with_suffix(".po")
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("wb") as f:
            write_po(f, catalog, width=0)
    return COMPILED


def main(argv: list[str]) -> int:
    if argv == ["update"]:
        update()
    elif argv == ["compile"]:
        compile_catalogs()
    elif argv == ["status"]:
        status()
    elif argv == ["check"]:
        return 1 if check() else 0
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

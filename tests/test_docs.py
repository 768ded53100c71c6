"""The library's own documentation is true: back-links name a chapter that uses the object, and the
package docstring lists every module."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
from pathlib import Path

import transformer_lib

ROOT = Path(__file__).resolve().parents[1]
BACK_LINK = re.compile(r"Defined in chapter (\d+), ([^.\n]+)\.")


def chapters() -> dict[int, tuple[str, str]]:
    """Chapter number -> (title from its first heading, the code of all its code cells)."""
    out = {}
    for path in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        heading = next(
            line
            for c in cells
            if c["cell_type"] == "markdown"
            for line in "".join(c["source"]).splitlines()
            if line.startswith("# ")
        )
        title = re.sub(r"^# \d+\.\s*", "", heading)
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        out[int(path.name[:2])] = (title, code)
    return out


def core_modules() -> list[str]:
    return [m.name for m in pkgutil.iter_modules(transformer_lib.__path__) if not m.ispkg]


def back_links() -> list[tuple[str, int, str]]:
    """(qualified name, chapter, title) for every public object whose docstring has a back-link."""
    links = []
    for name in core_modules():
        module = importlib.import_module(f"transformer_lib.{name}")
        for attr, obj in vars(module).items():
            if getattr(obj, "__module__", None) != module.__name__ or not (
                inspect.isclass(obj) or inspect.isfunction(obj)
            ):
                continue
            for chapter, title in BACK_LINK.findall(inspect.getdoc(obj) or ""):
                links.append((f"{name}.{attr}", int(chapter), title))
    return links


def test_every_back_link_names_a_chapter_that_uses_the_object():
    known = chapters()
    links = back_links()
    assert len(links) >= 30, f"expected back-links on the public objects, found {len(links)}"
    wrong = []
    for qualname, chapter, title in links:
        name = qualname.split(".")[-1]
        if chapter not in known:
            wrong.append(f"{qualname}: chapter {chapter} does not exist")
            continue
        real_title, code = known[chapter]
        if not real_title.startswith(title):
            wrong.append(f"{qualname}: chapter {chapter} is '{real_title}', the docstring says '{title}'")
        if not re.search(rf"\b{name}\b", code):
            wrong.append(f"{qualname}: chapter {chapter} ({real_title}) never uses {name}")
    assert not wrong, "\n".join(wrong)


def test_package_docstring_lists_every_module():
    doc = transformer_lib.__doc__
    missing = [name for name in core_modules() if f"``{name}``" not in doc]
    assert not missing, f"the package docstring does not list {missing}"
    notebook = importlib.import_module("transformer_lib.notebook")
    listed = {m.name for m in pkgutil.iter_modules(notebook.__path__)}
    missing = [name for name in sorted(listed) if f"``{name}``" not in notebook.__doc__]
    assert not missing, f"transformer_lib.notebook's docstring does not list {missing}"


def test_check_names_are_only_exercise_checkers():
    """``check_*`` means an exercise checker; input validation is ``_validate_*``."""
    import ast

    package = ROOT / "transformer_lib"
    exercises = package / "notebook" / "exercises"
    misnamed = []
    for path in package.rglob("*.py"):
        if exercises in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and re.match(r"_?check", node.name):
                misnamed.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not misnamed, "rename to _validate_*: " + ", ".join(misnamed)


# --- the book's front and back matter ------------------------------------------------------

BOOK = ROOT / "book"
TERM_ROLE = re.compile(r"\{term\}`([^`]+)`")
# The terms issue 13 names as missing from the first glossary; each must have an entry.
REQUIRED_TERMS = """BatchNorm; Residual stream; Memory; Shift-right; Teacher forcing; Label smoothing;
Greedy decoding; Beam search; Warm-up; Cosine schedule; Weight decay; BPE; Tokenizer; GELU; SwiGLU;
Top-k sampling; Top-p sampling; Weight tying; Mixed precision; bf16; TF-IDF; Static embedding;
Contextual embedding; Exposure bias; KV cache; RoPE; ALiBi; Embedding; Pre-LN; Post-LN"""


def glossary_terms() -> dict[str, str]:
    """Lower-cased term -> its definition, from the ``{glossary}`` directive of book/glossary.md."""
    text = (BOOK / "glossary.md").read_text()
    body = re.search(r"```\{glossary\}\n(.*?)\n```", text, re.S)
    assert body, "book/glossary.md has no ```{glossary} directive"
    terms: dict[str, str] = {}
    term = None
    for line in body.group(1).splitlines():
        if line and not line[0].isspace():
            term = line.strip().lower()
            assert term not in terms, f"glossary term defined twice: {line.strip()!r}"
            terms[term] = ""
        elif term is not None:
            terms[term] += " " + line.strip()
    return terms


def term_uses() -> list[tuple[str, str]]:
    """(file, target term) for every {term} role in the chapters' markdown cells and in book/*.md."""
    uses = []
    sources = [(p.relative_to(ROOT).as_posix(), p.read_text()) for p in sorted(BOOK.glob("*.md"))]
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        sources.append((path.relative_to(ROOT).as_posix(), text))
    for name, text in sources:
        for m in TERM_ROLE.finditer(text):
            inner = m.group(1)
            target = re.fullmatch(r".*<([^<>]+)>\s*", inner, re.S)
            uses.append((name, (target.group(1) if target else inner).strip()))
    return uses


def test_glossary_is_complete_and_every_term_link_resolves():
    terms = glossary_terms()
    assert len(terms) >= 45, f"the glossary defines {len(terms)} terms; it should cover at least 45"
    missing = [t for t in re.split(r";\s*", REQUIRED_TERMS) if t.lower() not in terms]
    assert not missing, f"the glossary lacks {missing}"
    too_long = [t for t, d in terms.items() if len(re.findall(r"[.!?](?:\s|$)", d)) > 3]
    assert not too_long, f"glossary definitions longer than three sentences: {too_long}"
    chapter_links = [t for name, t in term_uses() if name.startswith("chapters/")]
    assert len(chapter_links) >= 20, f"the chapters link the glossary {len(chapter_links)} times; expected >= 20"
    dangling = sorted({f"{name}: {t}" for name, t in term_uses() if t.lower() not in terms})
    assert not dangling, "{term} links to terms the glossary does not define:\n" + "\n".join(dangling)


def test_embedding_entry_does_not_call_sinusoidal_positions_learned():
    embedding = glossary_terms()["embedding"]
    assert "sinusoidal" in embedding and "fixed" in embedding, embedding


def test_front_matter_names_the_configured_repository_and_no_placeholder():
    url = re.search(r"^repository:\n\s+url:\s*(\S+)", (ROOT / "_config.yml").read_text(), re.M)
    assert url, "_config.yml has no repository.url"
    for path in [ROOT / "README.md", *sorted(BOOK.glob("*.md"))]:
        text = path.read_text()
        for placeholder in ("<org>", "<repo>", "<this repository>", "<it>"):
            assert placeholder not in text, f"{path.name}: placeholder {placeholder!r}"
        for found in re.findall(r"github\.com/[\w.-]+/[\w.-]+", text):
            assert url.group(1).endswith(found.removesuffix(".git")), f"{path.name}: {found} is not {url.group(1)}"
    assert url.group(1) in (BOOK / "how_to_use.md").read_text(), "how_to_use.md: no `git clone` of the repository"


def test_run_times_come_from_the_build_table():
    """One table of execution times, written by the build (myst-nb's nb-exec-table) into the appendix
    "Running this book", cited by the intro and the reader's page."""
    running = (BOOK / "running.md").read_text()
    assert re.search(r"\(execution-times\)=\n## .*\n(?:.*\n)*?```\{nb-exec-table\}\n```", running)
    assert "execution-times" in (BOOK / "intro.md").read_text()
    assert "execution-times" in (BOOK / "how_to_use.md").read_text()
    assert "npm" in running, "running.md must say that `make book` needs npm"
    for path in (BOOK / "intro.md", BOOK / "how_to_use.md", BOOK / "running.md", ROOT / "README.md"):
        assert "about a minute" not in path.read_text(), f"{path.name}: a run time not from the build's table"


def test_notation_keeps_V_for_the_values():
    notation = (BOOK / "notation.md").read_text()
    assert "| `V` |" not in notation and "`(B, T, V)`" not in notation, "V is the value matrix; use vocab_size"
    assert "biased" in notation, "say that LayerNorm's variance is the biased one (1/d)"

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

"""Small Sphinx extension for the offline HTML book (loaded from _config.yml: local_extensions).

1. Adds ``static/mathjax2-compat.js`` to every page: the vendored widget manager
   (@jupyter-widgets/html-manager 1.0.6) typesets widget labels with MathJax 2's
   ``MathJax.Hub.Queue``; the book loads MathJax 3, where that call throws
   ``Cannot read properties of undefined (reading 'Queue')``. The shim forwards it to
   MathJax 3's ``typesetPromise``.
2. Removes duplicated inline ``<script>`` blocks. Sphinx 7.4 registers an inline script added
   after the builder exists twice (once as filename ``None``, once as ``''``), so
   sphinx-thebe's ``const THEBE_JS_URL = ...`` appears twice and the second copy raises
   ``SyntaxError: Identifier 'THEBE_JS_URL' has already been declared`` on every page.
   Remove it when a Sphinx upgrade (jupyter-book 1.0.4 installs 7.4) makes the build without it
   pass tests/test_book.py's check for uncaught page errors.
3. Numbers exercises per chapter: "Exercise 3.2" is the second exercise of ``chapters/03_*``.
   sphinx-exercise numbers them across the whole book (Sphinx's ``toc_fignumbers``, "Exercise 17");
   after Sphinx assigns those numbers, each chapter's exercises get ``(chapter, i)`` in document
   order, which the titles and every reference to an exercise then show. The Colab notebooks and
   the grader use the same numbers (``transformer_lib.notebook.exercises.catalogue``).
4. Adds ``static/widget-fonts.js`` (require.js's configuration, before require.js loads): the widget
   manager asks for its icon fonts next to its own modules, which require.js would place under the
   page's folder; the configuration places them in the vendored ``_static/npm/html-manager/``, with the fonts.
5. Adds ``static/code-wrap.css``: long lines of code and output wrap inside their box instead of being cut off.
6. Points the "Colab" launch button of a chapter at its student notebook, ``colab/<chapter>.ipynb``
   (solutions removed, plain Markdown), instead of ``chapters/<chapter>.ipynb``, the teacher's copy.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.config import Config

STATIC = Path(__file__).resolve().parent / "static"


def _add_static_path(app: Sphinx, config: Config) -> None:
    config.html_static_path = [*config.html_static_path, str(STATIC)]


def _dedupe_scripts(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple[str, int, tuple[tuple[str, str], ...]]] = set()
    unique = []
    for js in scripts:
        attrs = tuple(sorted((k, str(v)) for k, v in getattr(js, "attributes", {}).items()))
        key = (str(js.filename or ""), int(getattr(js, "priority", 500)), attrs)
        if key in seen:
            continue
        seen.add(key)
        unique.append(js)
    context["script_files"] = unique


_CHAPTER = re.compile(r"^chapters/(\d+)_")


def _number_exercises_per_chapter(app: Sphinx, env: Any) -> list[str]:
    """Renumber each chapter's exercises ``(chapter, 1)``, ``(chapter, 2)``, ... in document order."""
    changed = []
    for docname, numbers in env.toc_fignumbers.items():
        match = _CHAPTER.match(docname)
        exercises = numbers.get("exercise")
        if not match or not exercises:
            continue
        chapter = int(match.group(1))
        in_order = sorted(exercises, key=exercises.__getitem__)  # Sphinx numbered them in document order
        renumbered = {node_id: (chapter, i) for i, node_id in enumerate(in_order, start=1)}
        if renumbered != exercises:
            numbers["exercise"] = renumbered
            changed.append(docname)
    return changed


def _colab_opens_the_student_copy(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    if not _CHAPTER.match(pagename):
        return

    def visit(button: Any) -> None:
        if isinstance(button, dict):
            if button.get("text") == "Colab" and "/chapters/" in str(button.get("url", "")):
                button["url"] = str(button["url"]).replace("/chapters/", "/colab/", 1)
                button["tooltip"] = "Open the student notebook (no solutions) in Colab"
            for value in button.values():
                if isinstance(value, list):
                    for item in value:
                        visit(item)

    for button in context.get("header_buttons", []):
        visit(button)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", _add_static_path)
    # Before require.js (501) and the widget manager (502); MathJax itself is deferred.
    app.add_js_file("mathjax2-compat.js", priority=499)
    app.add_js_file("widget-fonts.js", priority=499)
    app.add_css_file("code-wrap.css")
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    # After Sphinx's TocTreeCollector numbered the figures (priority 500) and the theme added its launch
    # buttons (priority 501).
    app.connect("env-get-updated", _number_exercises_per_chapter, priority=900)
    app.connect("html-page-context", _colab_opens_the_student_copy, priority=800)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

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
"""

from __future__ import annotations

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


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", _add_static_path)
    # Before require.js (501) and the widget manager (502); MathJax itself is deferred.
    app.add_js_file("mathjax2-compat.js", priority=499)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

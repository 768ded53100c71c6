"""The two-layer rule: the core (transformer_lib/*.py) never reaches into the notebook layer; and no import circle.

The core is tensors in, tensors out, and must import with torch and numpy alone: no
``transformer_lib.notebook``, no widgets, plotting or Hugging Face libraries, and no upward
import of the package ``__init__`` (which imports the core, not the other way round).
The graph and the rule live in ``scripts/import_graph.py``, which also prints the graph:
``python scripts/import_graph.py``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "transformer_lib"
PACKAGE = PACKAGE_DIR.name
#: What the core must not pull in when imported (the notebook layer's dependencies, and the layer itself).
HEAVY = ["ipywidgets", "IPython", "matplotlib", "bertviz", "transformers", f"{PACKAGE}.notebook"]


def _load_script():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ig = _load_script()
#: The core: the package folder's *.py files.
CORE_FILES = sorted(PACKAGE_DIR.glob("*.py"))


def _core_name(path: Path) -> str:
    return PACKAGE if path.name == "__init__.py" else f"{PACKAGE}.{path.stem}"


def test_there_is_a_core_and_a_notebook_layer() -> None:
    names = {p.stem for p in CORE_FILES}
    assert {"__init__", "attention", "models", "training"} <= names, names
    assert (PACKAGE_DIR / "notebook" / "__init__.py").is_file()


# ---------------------------------------------------------------- (a) the core's import statements


def _bad_imports_in(path: Path) -> list[str]:
    """Import statements of one core file that reach the notebook layer or the package __init__."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _core_name(path)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == f"{PACKAGE}.notebook" or alias.name.startswith(f"{PACKAGE}.notebook."):
                    bad.append(f"line {node.lineno}: import {alias.name} (the notebook layer)")
                elif alias.name == PACKAGE and here != PACKAGE:
                    bad.append(f"line {node.lineno}: import {PACKAGE} (the package __init__, upward)")
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if node.level == 0:
                module = node.module or ""
                if module == f"{PACKAGE}.notebook" or module.startswith(f"{PACKAGE}.notebook."):
                    bad.append(f"line {node.lineno}: from {module} import ... (the notebook layer)")
                elif module == PACKAGE and "notebook" in names:
                    bad.append(f"line {node.lineno}: from {PACKAGE} import notebook (the notebook layer)")
                elif module == PACKAGE and here != PACKAGE:
                    bad.append(f"line {node.lineno}: from {PACKAGE} import {', '.join(names)} (the package __init__)")
            elif node.level > 1:
                bad.append(
                    f"line {node.lineno}: from {'.' * node.level}{node.module or ''} import ... "
                    "(climbs out of the package)"
                )
            else:  # from .x import ... / from . import x
                module = node.module or ""
                if module == "notebook" or module.startswith("notebook.") or (not module and "notebook" in names):
                    bad.append(f"line {node.lineno}: from .{module} import {', '.join(names)} (the notebook layer)")
                elif not module and here != PACKAGE:
                    upward = [n for n in names if not (PACKAGE_DIR / f"{n}.py").is_file()]
                    if upward:
                        bad.append(f"line {node.lineno}: from . import {', '.join(upward)} (from the package __init__)")
    return bad


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_core_module_imports_neither_notebook_nor_the_package(path: Path) -> None:
    bad = _bad_imports_in(path)
    assert not bad, f"{path.relative_to(ROOT)} breaks the two-layer rule:\n  " + "\n  ".join(bad)


def test_the_statement_check_catches_each_forbidden_form(tmp_path, monkeypatch) -> None:
    """The check above is not vacuous: each forbidden form is reported, allowed forms are not."""
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE_DIR", tmp_path)
    (tmp_path / "attention.py").write_text("")
    source = textwrap.dedent("""
        from .attention import x                       # allowed: a core sibling
        from . import attention                        # allowed: a core sibling
        import torch                                   # allowed
        from .notebook.plots import LivePlot           # 5
        from . import notebook                         # 6
        from transformer_lib.notebook import widgets   # 7
        import transformer_lib.notebook.viz            # 8
        from . import __version__                      # 9
        from transformer_lib import GPT                # 10
        import transformer_lib                         # 11
        def f():
            from .notebook import plots                # 13: lazy, still forbidden
    """)
    path = tmp_path / "core_module.py"
    path.write_text(source)
    bad = _bad_imports_in(path)
    assert [int(b.split(":")[0].split()[1]) for b in bad] == [5, 6, 7, 8, 9, 10, 11, 13], bad


# ---------------------------------------------------------------- (b) importing the core pulls in nothing heavy

_PROBE = """
import importlib, json, sys
heavy = json.loads(sys.argv[1])
report = {"<startup>": sorted(m for m in heavy if m in sys.modules)}
for name in sys.argv[2:]:
    before = {m for m in heavy if m in sys.modules}
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        report[name] = [f"import failed: {type(e).__name__}: {e}"]
        continue
    report[name] = sorted(m for m in heavy if m in sys.modules and m not in before)
print(json.dumps(report))
"""


def test_importing_the_core_loads_no_notebook_dependency() -> None:
    """In a fresh interpreter, import the package then each core module in turn; after each, no new heavy module.

    ``sys.modules`` only grows, so the first module after which a heavy one appears is the one that imported it.
    """
    modules = [PACKAGE] + [_core_name(p) for p in CORE_FILES if p.name != "__init__.py"]
    report = _probe(HEAVY, modules)
    assert report.pop("<startup>") == [], "the interpreter starts with a heavy module loaded: the test proves nothing"
    assert list(report) == modules
    offenders = {name: loaded for name, loaded in report.items() if loaded}
    assert not offenders, "core modules that fail to import or load a notebook-layer dependency:\n  " + "\n  ".join(
        f"{name}: {', '.join(loaded)}" for name, loaded in offenders.items()
    )


def test_importing_the_library_leaves_torch_compile_unloaded() -> None:
    """``torch._dynamo`` (what torch.compile runs on) takes over a second to import, paid in every chapter's
    kernel and every process that imports the library. Only ``_eager``, which the library imports while
    torch.compile traces, loads it: every other module, core or notebook layer, imports without it."""
    names = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in PACKAGE_DIR.rglob("*.py")
        if p.stem != "_eager"
    )
    report = _probe(["torch._dynamo"], names)
    assert report.pop("<startup>") == [] and list(report) == names and len(names) > 30
    assert not {name: loaded for name, loaded in report.items() if loaded}
    eager = f"{PACKAGE}._eager"
    assert _probe(["torch._dynamo"], [eager])[eager] == ["torch._dynamo"]  # the probe sees it where it is loaded


def _probe(heavy: list[str], modules: list[str]) -> dict[str, list[str]]:
    """:data:`_PROBE`'s report: in a fresh interpreter, which of ``heavy`` each of ``modules`` loads, in turn."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(heavy), *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- (c) the import graph


@pytest.fixture(scope="module")
def graph():
    errors: dict[str, str] = {}
    g = ig.import_graph(PACKAGE_DIR, errors)
    core_errors = {m: e for m, e in errors.items() if ig.layer(m, PACKAGE) == "core"}
    assert not core_errors, f"core modules that do not parse: {core_errors}"
    return g


def test_graph_covers_every_core_module(graph) -> None:
    assert {m for m in graph if ig.layer(m, PACKAGE) == "core"} == {_core_name(p) for p in CORE_FILES}
    assert f"{PACKAGE}.notebook" in graph and ig.layer(f"{PACKAGE}.notebook", PACKAGE) == "notebook"
    assert f"{PACKAGE}.attention" in {e.target for e in graph[f"{PACKAGE}.models"]}  # the graph sees real arrows


def test_no_arrow_from_core_into_notebook(graph) -> None:
    bad = ig.violations(graph, PACKAGE_DIR)
    assert not bad, "arrows that break the two-layer rule:\n  " + "\n  ".join(bad)


def test_every_core_import_names_an_existing_module(graph) -> None:
    core = {m: edges for m, edges in graph.items() if ig.layer(m, PACKAGE) == "core"}
    bad = ig.missing(core | {m: [] for m in graph if m not in core})
    assert not bad, "core imports of package modules that do not exist:\n  " + "\n  ".join(bad)


def test_no_import_circle(graph) -> None:
    """No group of modules imports each other, in either layer, imports inside functions included."""
    found = [ig.format_circle(c, PACKAGE) for c in ig.circles(graph)]
    assert not found, "import circles:\n  " + "\n  ".join(found)


def test_circles_are_found_with_lazy_arrows_and_named_with_their_arrows(tmp_path) -> None:
    """A made-up package: a -> b -> c -(lazy)-> a is one circle; d imports itself; e -> f is no circle."""
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    files = {
        "__init__.py": "",
        "a.py": "from .b import x\n",
        "b.py": "from . import c\nx = 1\n",
        "c.py": "import math\n\n\ndef f():\n    from fakepkg.a import x\n",
        "d.py": "from . import d\n",
        "e.py": "from .f import y\n",
        "f.py": "y = 2\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    found = ig.circles(ig.import_graph(pkg))
    assert [c.modules for c in found] == [["fakepkg.a", "fakepkg.b", "fakepkg.c"]]
    assert ig.format_circle(found[0], "fakepkg") == (
        "import circle among a, b, c: a -> b -> c -> a (lazy) "
        "(a.py:1: from .b import x; b.py:1: from . import c; c.py:5: from fakepkg.a import x)"
    )
    (pkg / "f.py").write_text("from .e import z\ny = 2\n")  # a second circle, e <-> f
    assert [c.modules for c in ig.circles(ig.import_graph(pkg))][1] == ["fakepkg.e", "fakepkg.f"]


def test_graph_check_reports_the_offending_arrows(tmp_path) -> None:
    """A made-up package with each kind of violation: every one is reported with its arrow."""
    pkg = tmp_path / "fakepkg"
    (pkg / "notebook").mkdir(parents=True)
    files = {
        "__init__.py": "from .core_ok import y\n__version__ = '1'\n",
        "core_ok.py": "import torch\ny = 1\n",
        "core_bad.py": "from .notebook.plots import draw\nfrom . import __version__\n",
        "core_lazy.py": "def f():\n    import fakepkg.notebook\n",
        "core_missing.py": "from ._renamed import check\n",
        "notebook/__init__.py": "",
        "notebook/plots.py": "from ..core_ok import y\nfrom .. import __version__\ndraw = None\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    g = ig.import_graph(pkg)
    bad = ig.violations(g, pkg)
    assert len(bad) == 3, bad
    assert bad[0].startswith("fakepkg.core_bad -> fakepkg.notebook.plots: core imports the notebook layer")
    assert "fakepkg/core_bad.py:1: from .notebook.plots import draw" in bad[0]
    assert bad[1].startswith("fakepkg.core_bad -> fakepkg (__init__): core module imports the package upward")
    assert bad[2].startswith("fakepkg.core_lazy -> fakepkg.notebook: core imports the notebook layer")
    assert ig.missing(g) == [
        "fakepkg.core_missing -> fakepkg._renamed: no such module (core_missing.py:1: from ._renamed import check)"
    ]
    text = ig.format_graph(g, "fakepkg")
    assert re.search(r"^core_lazy +-> notebook \(lazy\)$", text, re.M), text
    assert re.search(r"^notebook.plots +-> __init__, core_ok$", text, re.M), text
    assert re.search(r"^core_missing +-> _renamed \(MISSING\)$", text, re.M), text
    assert "1 core -> notebook" not in text and "2 core -> notebook" in text


def print_import_graph() -> None:
    """Print the graph, grouped by layer (same as ``python scripts/import_graph.py``)."""
    ig.main([str(PACKAGE_DIR)])


def test_graph_text_is_grouped_by_layer(graph) -> None:
    text = ig.format_graph(graph, PACKAGE)
    core_header, notebook_header = text.index("# core layer"), text.index("# notebook layer")
    assert core_header < text.index("\nmodels ") < notebook_header < text.index("\nnotebook.widgets ")
    assert "0 core -> notebook" in text


if __name__ == "__main__":
    print_import_graph()

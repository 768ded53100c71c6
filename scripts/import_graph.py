#!/usr/bin/env python3
"""The import graph of transformer_lib, by layer: which package modules each module imports.

The package has two layers:

* the core, ``transformer_lib/*.py``: tensors in, tensors out; needs torch and numpy only;
* the notebook layer, ``transformer_lib/notebook/``: widgets, plots, bertviz views, exercise
  checkers; may import the core.

The rules: no arrow from the core into the notebook layer; no core module imports the
package itself (``transformer_lib/__init__.py``, e.g. ``from . import __version__``): the
``__init__`` imports the core, not the other way round; and no import circle, in either layer,
lazy imports included (a module that needs another at call time depends on it all the same).
``tests/test_layers_imports.py`` checks the rules with the functions here. The graph is read
from the source with ``ast`` (nothing is imported), including imports inside functions, which are
marked ``(lazy)``.

Usage: python scripts/import_graph.py [PACKAGE_DIR]   (default: transformer_lib next to scripts/)
"""

from __future__ import annotations

import argparse
import ast
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "notebook"  # the notebook layer: this subpackage of the package


class Edge(NamedTuple):
    """``importer`` imports ``target`` (full dotted names) at ``path:line``."""

    importer: str
    target: str | None  # None: a relative import that climbs above the package
    path: Path
    line: int
    statement: str
    lazy: bool  # inside a function body: runs on call, not on import


def module_files(package_dir: Path) -> dict[str, Path]:
    """Every module of the package: full dotted name -> file (a subpackage is named by its ``__init__``)."""
    package_dir = Path(package_dir)
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir.parent).with_suffix("")
        parts = list(rel.parts)
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def layer(module: str, package: str) -> str:
    """``"notebook"`` for the notebook subpackage and everything in it, else ``"core"``."""
    notebook = f"{package}.{NOTEBOOK}"
    return "notebook" if module == notebook or module.startswith(notebook + ".") else "core"


def is_core_file(path: Path, package_dir: Path) -> bool:
    """The core is the package folder's own ``*.py`` files (``__init__.py`` included)."""
    return Path(path).parent == Path(package_dir)


def _imports(tree: ast.AST):
    """(node, lazy) for every import statement; lazy when inside a function body."""

    def visit(node: ast.AST, lazy: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, lazy
            yield from visit(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    yield from visit(tree, False)


def imports_of(module: str, path: Path, known: set[str], package: str) -> list[Edge]:
    """The package modules that ``module`` (source at ``path``) imports, one edge per imported module."""
    source = Path(path).read_text()
    tree = ast.parse(source, filename=str(path))
    lines = source.splitlines()
    is_package = Path(path).name == "__init__.py"
    edges = []
    for node, lazy in _imports(tree):
        statement = " ".join(line.strip() for line in lines[node.lineno - 1 : node.end_lineno])

        def edge(target: str | None, node: ast.AST = node, statement: str = statement, lazy: bool = lazy) -> None:
            edges.append(Edge(module, target, Path(path), node.lineno, statement, lazy))

        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == package or alias.name.startswith(package + "."):
                    edge(alias.name)
            continue
        if node.level:  # relative: climb from the importer's package
            here = module.split(".") if is_package else module.split(".")[:-1]
            if node.level - 1 >= len(here):
                edge(None)
                continue
            parts = here[: len(here) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        if base != package and not base.startswith(package + "."):
            continue
        # ``from base import name``: the submodule base.name if there is one, else a name defined in base.
        for target in dict.fromkeys(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names):
            edge(target)
    return edges


def import_graph(package_dir: Path, errors: dict[str, str] | None = None) -> dict[str, list[Edge]]:
    """module -> the edges to the package modules it imports, for every module of the package.

    A file that does not parse raises ``SyntaxError``; with an ``errors`` dict it is noted
    there instead (module -> message) and the module gets no edges.
    """
    package_dir = Path(package_dir)
    files = module_files(package_dir)
    graph = {}
    for name, path in files.items():
        try:
            graph[name] = imports_of(name, path, set(files), package_dir.name)
        except SyntaxError as e:
            if errors is None:
                raise
            errors[name] = f"{path.relative_to(package_dir.parent)}:{e.lineno}: does not parse ({e.msg})"
            graph[name] = []
    return graph


def violations(graph: dict[str, list[Edge]], package_dir: Path) -> list[str]:
    """Arrows that break the two-layer rule, as readable lines naming file, line and statement."""
    package_dir = Path(package_dir)
    package = package_dir.name
    bad = []
    for module, edges in graph.items():
        for e in edges:
            if not is_core_file(e.path, package_dir):
                continue
            where = f"({e.path.relative_to(package_dir.parent)}:{e.line}: {e.statement})"
            if e.target is None:
                bad.append(f"{module} -> above {package}: relative import out of the package {where}")
            elif layer(e.target, package) == "notebook":
                bad.append(f"{module} -> {e.target}: core imports the notebook layer {where}")
            elif e.target == package and module != package:
                bad.append(f"{module} -> {package} (__init__): core module imports the package upward {where}")
    return bad


def missing(graph: dict[str, list[Edge]]) -> list[str]:
    """Arrows to package modules that do not exist (e.g. a renamed file), as readable lines."""
    return [
        f"{e.importer} -> {e.target}: no such module ({e.path.name}:{e.line}: {e.statement})"
        for edges in graph.values()
        for e in edges
        if e.target is not None and e.target not in graph
    ]


class Circle(NamedTuple):
    """Modules that reach each other through imports, and one shortest circle among them."""

    modules: list[str]  # the group, sorted: a strongly connected component of the graph
    arrows: list[Edge]  # a circle through modules[0]: each arrow's target imports the next, the last closes it


def circles(graph: dict[str, list[Edge]]) -> list[Circle]:
    """The import circles: every group of modules that reach each other (lazy arrows included), with one
    shortest circle through its first module. A module importing itself is no circle."""
    arrows: dict[str, dict[str, Edge]] = {}  # importer -> target -> its first edge (an eager one if any)
    for module, edges in graph.items():
        for e in sorted(edges, key=lambda e: e.lazy):
            if e.target in graph and e.target != module:
                arrows.setdefault(module, {}).setdefault(e.target, e)
    # Tarjan's strongly connected components, iteratively.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(arrows.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, targets = work[-1]
            for t in targets:
                if t not in index:
                    index[t] = low[t] = len(index)
                    stack.append(t)
                    work.append((t, iter(sorted(arrows.get(t, {})))))
                    break
                if t in stack:
                    low[node] = min(low[node], index[t])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        m = stack.pop()
                        group.append(m)
                        if m == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    found = []
    for group in sorted(groups):
        first, members = group[0], set(group)
        came: dict[str, Edge] = {}  # module -> the arrow that first reached it, breadth-first from `first`
        frontier = [first]
        while first not in came:
            reached = []
            for m in frontier:
                for t, e in sorted(arrows.get(m, {}).items()):
                    if t in members and t not in came:
                        came[t] = e
                        reached.append(t)
            frontier = reached
        path, node = [], first
        while True:
            path.append(came[node])
            node = came[node].importer
            if node == first:
                break
        found.append(Circle(group, path[::-1]))
    return found


def format_circle(circle: Circle, package: str) -> str:
    """A circle as a readable line: its group, then ``a -> b (lazy) -> a`` and where each arrow is."""
    group = ", ".join(_short(m, package) for m in circle.modules)
    names = [_short(circle.arrows[0].importer, package)]
    names += [_short(e.target, package) + (" (lazy)" if e.lazy else "") for e in circle.arrows]
    where = "; ".join(f"{e.path.name}:{e.line}: {e.statement}" for e in circle.arrows)
    return f"import circle among {group}: {' -> '.join(names)} ({where})"


def _short(name: str | None, package: str) -> str:
    """A module's name relative to the package; the package itself (its ``__init__``) is ``__init__``."""
    if name is None:
        return "(above the package)"
    return name[len(package) + 1 :] if name.startswith(package + ".") else "__init__"


def format_graph(graph: dict[str, list[Edge]], package: str, errors: dict[str, str] | None = None) -> str:
    """The graph as text, grouped by layer: one line ``module -> dependency, dependency, ...`` per module.

    Names are relative to the package; ``errors`` (from :func:`import_graph`) marks modules not parsed.
    """
    out = []
    for which in ("core", "notebook"):
        modules = sorted(graph, key=lambda m: (m != package, m)) if which == "core" else sorted(graph)
        modules = [m for m in modules if layer(m, package) == which]
        folder = f"{package}/*.py" if which == "core" else f"{package}/{NOTEBOOK}/"
        out.append(f"# {which} layer: {folder} ({len(modules)} modules)")
        width = max((len(_short(m, package)) for m in modules), default=0)
        for module in modules:
            targets: dict[str, bool] = {}  # dependency -> lazy (an eager import wins)
            for e in graph[module]:
                if e.target == module:
                    continue
                key = _short(e.target, package) + (
                    " (MISSING)" if e.target is not None and e.target not in graph else ""
                )
                targets[key] = targets.get(key, True) and e.lazy
            deps = [f"{t} (lazy)" if lazy else t for t, lazy in sorted(targets.items(), key=lambda kv: (kv[1], kv[0]))]
            if module in (errors or {}):
                deps = [f"?? NOT PARSED: {errors[module]}"]
            head = f"{_short(module, package):<{width}} -> "
            out.append(
                textwrap.fill(
                    ", ".join(deps) or "(nothing from the package)",
                    width=100,
                    initial_indent=head,
                    subsequent_indent=" " * len(head),
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )
        out.append("")
    up = sum(
        1
        for edges in graph.values()
        for e in edges
        if e.target and layer(e.importer, package) == "notebook" and layer(e.target, package) == "core"
    )
    down = sum(
        1
        for edges in graph.values()
        for e in edges
        if e.target and layer(e.importer, package) == "core" and layer(e.target, package) == "notebook"
    )
    out.append(f"# arrows between layers: {up} notebook -> core, {down} core -> notebook")
    out.append(
        f"# (names relative to {package}/; __init__ = the package itself; (lazy) = imported inside a function, on call)"
    )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package_dir", nargs="?", type=Path, default=ROOT / "transformer_lib")
    args = parser.parse_args(argv)
    errors: dict[str, str] = {}
    graph = import_graph(args.package_dir, errors)
    sys.stdout.write(format_graph(graph, args.package_dir.name, errors))
    bad = violations(graph, args.package_dir) + missing(graph) + [f"not parsed: {e}" for e in errors.values()]
    bad += [format_circle(c, args.package_dir.name) for c in circles(graph)]
    for line in bad:
        print(f"VIOLATION: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

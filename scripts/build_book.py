#!/usr/bin/env python3
"""Build the HTML book: vendor the browser scripts, then ``jupyter-book build . -W -n --keep-going``.

Notebooks are executed through jupyter-cache (``execute_notebooks: cache``), which re-runs a
notebook only when its code cells change. The chapters' outputs also depend on what the cache
does not see, so this script records it and, when any of it changed since the last successful
build, clears the execution cache and rebuilds with a fresh Sphinx environment: every chapter
then runs again. What it records:

- the library: a hash of ``transformer_lib``'s sources;
- the precision: ``TRANSFORMER_LIB_PRECISION`` as the kernels will read it (``auto`` when unset;
  checked by ``transformer_lib.precision.precision_override``, so a bogus value stops the build
  before anything runs). A build with ``TRANSFORMER_LIB_PRECISION=fp32`` never shows outputs
  computed in bf16 under ``auto``, nor the other way round;
- the packages: a hash of the installed versions of torch and of every package requirements.txt
  names (``make lock`` builds the book in another environment, with the newest versions).

On success it writes ``_build/.book-build.json`` (library hash, precision, packages hash,
duration); tests/test_book.py rebuilds when a source is newer than that file.

Usage: python scripts/build_book.py [--fresh] [extra jupyter-book build options]
       python scripts/build_book.py --language zh_CN
  --fresh      re-read every page (jupyter-book --all), so every warning is reported again;
               executed notebooks still come from the cache.
  --language   the Chinese edition in _build/html-zh, after the English build (``make book-zh``): the
               translation catalogs compiled (scripts/translations.py), the same sources read with
               Sphinx's ``language``, every notebook from the English build's execution cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import vendor_js  # scripts/, next to this file

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"
CACHE = BUILD / ".jupyter_cache"
STAMP = BUILD / ".book-build.json"
LIBRARY = ROOT / "transformer_lib"
REQUIREMENTS = ROOT / "requirements.txt"


def library_hash() -> str:
    """SHA-256 over the library's Python sources (paths and contents)."""
    h = hashlib.sha256()
    for path in sorted(LIBRARY.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def precision() -> str:
    """``TRANSFORMER_LIB_PRECISION`` as the chapters' kernels will read it; ValueError if bogus."""
    from transformer_lib.precision import precision_override

    return precision_override()


def packages_hash() -> str:
    """SHA-256 over the installed versions of torch and of the packages requirements.txt names."""
    from importlib import metadata

    from packaging.requirements import Requirement

    names = {"torch"}
    for line in REQUIREMENTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(Requirement(line).name.lower())
    h = hashlib.sha256()
    for name in sorted(names):
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "(not installed)"
        h.update(f"{name}=={version}\0".encode())
    return h.hexdigest()


def jupyter_book() -> str:
    """The jupyter-book executable next to this Python (the project's venv), else on PATH."""
    candidate = Path(sys.executable).parent / "jupyter-book"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("jupyter-book")
    if found is None:
        raise SystemExit("build_book: jupyter-book not found; run `make setup`")
    return found


TRANSLATED = """
from pathlib import Path
from jupyter_book.sphinx import build_sphinx
raise SystemExit(build_sphinx(
    Path({root!r}), Path({out!r}), noconfig=True, path_config={config!r}, doctreedir=Path({doctrees!r}),
    warningiserror=True, keep_going=True, force_all=True,
    confoverrides={{"latex_individualpages": False, "nitpicky": True, "language": {language!r},
                    "locale_dirs": [{locales!r}], "gettext_compact": False}},
))
"""


def build_translation(language: str) -> int:
    """The edition in ``language`` (``_build/html-zh``), from the English build's executed notebooks."""
    from translations import compile_catalogs  # scripts/, next to this file

    if not STAMP.is_file():
        print("build_book: build the English book first (make book): its execution cache is shared")
        return 2
    out = BUILD / f"html-{language.split('_')[0]}"  # html-zh
    script = TRANSLATED.format(root=str(ROOT), out=str(out), config=str(ROOT / "_config.yml"),
                               doctrees=str(BUILD / f".doctrees-{language}"), language=language,
                               locales=str(compile_catalogs()))  # fmt: skip
    env = {**os.environ, "TRANSFORMER_BOOK_BUILD": "1", "TQDM_DISABLE": "1"}
    return subprocess.call([sys.executable, "-c", script], cwd=ROOT, env=env)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--language"] and len(argv) == 2:
        return build_translation(argv[1])
    fresh = "--fresh" in argv
    extra = [a for a in argv if a != "--fresh"]
    try:
        current = {"library_sha256": library_hash(), "precision": precision(), "packages_sha256": packages_hash()}
    except ValueError as e:
        print(f"build_book: {e}", file=sys.stderr)
        return 2
    if vendor_js.main([]) != 0:
        return 1
    previous = json.loads(STAMP.read_text()) if STAMP.is_file() else {}
    previous.setdefault("precision", "auto")  # stamps from before the variable existed: always auto
    changed = [key for key in current if previous.get(key) != current[key]]
    if changed:
        what = ", ".join(key.removesuffix("_sha256") for key in changed)
        if CACHE.exists():
            print(f"build_book: {what} changed since the last build; clearing the execution cache")
            shutil.rmtree(CACHE)
        fresh = True
    print(f"build_book: TRANSFORMER_LIB_PRECISION={current['precision']}")
    cmd = [jupyter_book(), "build", ".", "-W", "-n", "--keep-going", *(["--all"] if fresh else []), *extra]
    print("build_book:", " ".join(cmd), flush=True)
    start = time.perf_counter()
    # The chapters' widgets precompute their views for the HTML page (transformer_lib.notebook.widgets).
    env = {**os.environ, "TRANSFORMER_BOOK_BUILD": "1", "TQDM_DISABLE": "1"}  # no progress bars in pages
    rc = subprocess.call(cmd, cwd=ROOT, env=env)
    seconds = time.perf_counter() - start
    print(f"build_book: jupyter-book exited with {rc} after {seconds:.1f} s")
    if rc == 0:
        STAMP.write_text(json.dumps({**current, "seconds": round(seconds, 1), "fresh": fresh}) + "\n")
    elif STAMP.exists():
        STAMP.unlink()  # a failed build is never "up to date"
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

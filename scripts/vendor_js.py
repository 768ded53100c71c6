#!/usr/bin/env python3
"""Vendor the browser scripts the HTML book needs, so it renders with no internet.

By default Jupyter Book pages load require.js, the Jupyter widget manager, d3/jquery
(for bertviz) and MathJax from CDNs, so widgets, attention views and equations stay
blank offline. This script fetches pinned versions of those packages from the npm
registry (``npm pack``) and copies the files the book uses into ``book/_vendor/npm/``,
together with each package's licence and a generated ``LICENSES.md``. Which packages, their
versions and the file of each that pages load come from one list,
``transformer_lib.notebook.viz.VENDORED``; this script adds how to unpack each one.

Sphinx copies ``book/_vendor`` into ``_build/html/_static/`` (``html_static_path`` in
``_config.yml``), so the files end up in ``_build/html/_static/npm/...``. The folder is
deliberately not named ``_static``: Jupyter Book would inject every ``.js`` inside a
folder of that name into every page.

Idempotent: when ``book/_vendor/.stamp.json`` records the pinned versions and every
expected file is present, nothing is fetched. ``--force`` refetches.

Usage: python scripts/vendor_js.py [--force]
Environment: NPM (the npm executable, default ``npm``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from transformer_lib.notebook.viz import VENDOR_DIR, VENDORED

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "book" / "_vendor"
SUBDIR = VENDOR_DIR.rstrip("/")  # -> _build/html/_static/npm/
STAMP = ".stamp.json"


@dataclass(frozen=True)
class Package:
    """How to unpack one npm package of ``VENDORED``: what to copy (paths inside the tarball's
    ``package/``) into its folder under book/_vendor/npm/."""

    name: str
    copy: tuple[str, ...]  # files or directories, relative to package/
    strip: str = ""  # prefix removed from copied paths (e.g. "dist/")
    licence_files: tuple[str, ...] = ()
    # Used when the tarball ships no licence file: (SPDX id, copyright line).
    licence_fallback: tuple[str, str] | None = None
    also_exist: tuple[str, ...] = ()  # besides the file pages load, relative to the folder

    @property
    def version(self) -> str:
        return VENDORED[self.name][0]

    @property
    def folder(self) -> str:
        return VENDORED[self.name][1].split("/", 1)[0]

    @property
    def must_exist(self) -> tuple[str, ...]:
        return (VENDORED[self.name][1].split("/", 1)[1], *self.also_exist)


_MATHJAX_PARTS = (
    "es5/tex-mml-chtml.js",
    "es5/tex-chtml.js",
    "es5/core.js",
    "es5/loader.js",
    "es5/startup.js",
    "es5/input",
    "es5/output/chtml.js",
    "es5/output/chtml",
    "es5/adaptors",
    "es5/ui",
    "es5/a11y",
    "es5/sre",
)

PACKAGES: tuple[Package, ...] = (
    Package(
        "requirejs",
        copy=("require.js",),
        licence_fallback=("MIT", "Copyright jQuery Foundation and other contributors, https://jquery.org/"),
    ),
    Package(
        "@jupyter-widgets/html-manager",
        # embed-amd.js plus the icon fonts it asks for (woff2, woff, ttf; browsers skip eot and svg);
        # book/_ext/static/widget-fonts.js points the widget manager at this folder for them.
        copy=("dist/embed-amd.js", "dist/*.woff2", "dist/*.woff", "dist/*.ttf"),
        strip="dist/",
        licence_files=("LICENSE", "dist/embed.js.LICENSE.txt"),
        also_exist=("be9ee23c0c6390141475.ttf",),  # so a book/_vendor without the .ttf is fetched again
    ),
    Package("d3", copy=("dist/d3.min.js",), strip="dist/", licence_files=("LICENSE",)),
    Package("jquery", copy=("dist/jquery.min.js",), strip="dist/", licence_files=("MIT-LICENSE.txt",)),
    Package(
        "mathjax",
        copy=_MATHJAX_PARTS,
        strip="es5/",
        licence_files=("LICENSE",),
        also_exist=("tex-chtml.js", "output/chtml/fonts/woff-v2/MathJax_Main-Regular.woff"),
    ),
)

MIT_TEXT = """\
MIT License

{copyright}

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""


def _pinned() -> dict[str, str]:
    return {p.name: p.version for p in PACKAGES}


def is_current(dest: Path) -> bool:
    """True when ``dest`` already holds every pinned package with its expected files."""
    stamp = dest / STAMP
    if not stamp.is_file():
        return False
    try:
        recorded = json.loads(stamp.read_text())
    except json.JSONDecodeError:
        return False
    if recorded != _pinned():
        return False
    base = dest / SUBDIR
    return (base / "LICENSES.md").is_file() and all(
        (base / p.folder / f).is_file() for p in PACKAGES for f in p.must_exist
    )


def npm_pack(pkg: Package, workdir: Path, npm: str) -> Path:
    """Download ``pkg`` from the npm registry and extract it; return its ``package/`` folder."""
    spec = f"{pkg.name}@{pkg.version}"
    out = subprocess.run(
        [npm, "pack", spec, "--json", "--pack-destination", str(workdir)],
        check=True,
        capture_output=True,
        text=True,
        cwd=workdir,
    )
    info = json.loads(out.stdout)
    if isinstance(info, list):
        info = info[0]
    if info.get("version") != pkg.version:
        raise RuntimeError(f"npm gave {info.get('name')}@{info.get('version')}, expected {spec}")
    tarball = workdir / info["filename"]
    target = workdir / (pkg.folder + "-x")
    with tarfile.open(tarball) as tar:
        tar.extractall(target, filter="data")
    return target / "package"


def _copy_entry(src_root: Path, pattern: str, strip: str, dst_root: Path) -> int:
    matches = sorted(src_root.glob(pattern))
    if not matches:
        raise FileNotFoundError(f"{pattern!r} not found in {src_root}")
    for src in matches:
        rel = src.relative_to(src_root).as_posix()
        if strip and rel.startswith(strip):
            rel = rel[len(strip) :]
        dst = dst_root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dst)
    return len(matches)


def vendor(dest: Path, npm: str) -> None:
    """Fetch every pinned package and (re)create ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if shutil.which(npm) is None:
        raise SystemExit(f"vendor_js: '{npm}' not found; install Node.js/npm (Debian: apt-get install npm)")
    staging = Path(tempfile.mkdtemp(prefix=dest.name + ".partial-", dir=dest.parent))
    staging.chmod(0o755)
    try:
        base = staging / SUBDIR
        rows = []
        with tempfile.TemporaryDirectory(prefix="vendor-js-") as tmp:
            work = Path(tmp)
            for pkg in PACKAGES:
                print(f"vendor_js: npm pack {pkg.name}@{pkg.version}", flush=True)
                src = npm_pack(pkg, work, npm)
                meta = json.loads((src / "package.json").read_text())
                licence = meta.get("license") or ",".join(entry.get("type", "?") for entry in meta.get("licenses", []))
                out = base / pkg.folder
                out.mkdir(parents=True, exist_ok=True)
                for entry in pkg.copy:
                    _copy_entry(src, entry, pkg.strip, out)
                lic_names = []
                for lic in pkg.licence_files:
                    target = Path(lic).name
                    shutil.copy2(src / lic, out / target)
                    lic_names.append(target)
                if not pkg.licence_files:
                    spdx, copyright_line = pkg.licence_fallback  # type: ignore[misc]
                    assert spdx == licence == "MIT", (spdx, licence)
                    (out / "LICENSE").write_text(
                        "The npm package ships no licence file; this is the MIT licence named in its\n"
                        f"package.json and in the header of require.js.\n\n{MIT_TEXT.format(copyright=copyright_line)}"
                    )
                    lic_names.append("LICENSE")
                rows.append((pkg, licence, lic_names, meta.get("homepage", "")))
        lines = [
            "# Third-party browser scripts bundled with this book",
            "",
            "Fetched from the npm registry by `scripts/vendor_js.py` so that the HTML book renders",
            "widgets, attention views and equations without internet access.",
            "",
            "| Package | Version | Licence | Licence file | Homepage |",
            "|---|---|---|---|---|",
        ]
        for pkg, licence, lic_names, home in rows:
            files = ", ".join(f"`{pkg.folder}/{n}`" for n in lic_names)
            lines.append(f"| {pkg.name} | {pkg.version} | {licence} | {files} | {home} |")
        (base / "LICENSES.md").write_text("\n".join(lines) + "\n")
        (staging / STAMP).write_text(json.dumps(_pinned(), indent=2) + "\n")
        # Swap in atomically enough: remove the old folder only once the new one is complete.
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"vendor_js: wrote {dest} ({size / 1e6:.1f} MB)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="refetch even if up to date")
    args = parser.parse_args(argv)
    if not args.force and is_current(DEST):
        print(f"vendor_js: {DEST} up to date, nothing to do")
        return 0
    vendor(DEST, os.environ.get("NPM", "npm"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

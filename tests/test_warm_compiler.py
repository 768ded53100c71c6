"""scripts/warm_compiler.py, which `make setup` runs: torch.compile's tests of the processor, paid in the set-up."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "warm_compiler.py"

# In a fresh process: the vector instruction sets torch.compile finds usable here, and how many C++ builds that took.
COUNT_ISA_BUILDS = """
import json
from torch._inductor import cpp_builder
from torch._inductor.cpu_vec_isa import valid_vec_isa_list
builds = []
build = cpp_builder.CppBuilder.build
cpp_builder.CppBuilder.build = lambda self: builds.append(1) or build(self)
print(json.dumps({"isas": [str(isa) for isa in valid_vec_isa_list()], "builds": len(builds)}))
"""


def run(code_or_script: str | Path, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    args = [str(code_or_script)] if isinstance(code_or_script, Path) else ["-c", code_or_script]
    return subprocess.run(
        [sys.executable, *args],
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )


def isa_builds(cache: Path) -> dict:
    return json.loads(run(COUNT_ISA_BUILDS, cache).stdout.strip().splitlines()[-1])


def test_setup_runs_the_warm_up_before_it_stamps_the_environment():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^\$\(STAMP\):.*?\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, "the Makefile's $(STAMP) rule"
    lines = recipe.group(1).splitlines()
    warm = next(i for i, line in enumerate(lines) if "scripts/warm_compiler.py" in line)
    assert warm < next(i for i, line in enumerate(lines) if "touch $@" in line)


@pytest.mark.slow
@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64", reason="the x86 processor tests, as Inductor runs them"
)
def test_after_the_warm_up_no_process_builds_the_processor_tests_again(tmp_path):
    cold = isa_builds(tmp_path / "cold")  # a cache nobody warmed: one build per instruction set
    assert cold["isas"] and cold["builds"] >= len(cold["isas"]), cold

    out = run(SCRIPT, tmp_path / "warmed").stdout
    assert "torch.compile works here" in out, out
    warmed = isa_builds(tmp_path / "warmed")
    assert warmed == {"isas": cold["isas"], "builds": 0}, warmed


@pytest.mark.slow
def test_a_machine_where_compiling_fails_is_told_so_and_the_set_up_goes_on(tmp_path):
    result = run(SCRIPT, tmp_path, CXX="/bin/false")  # check=True: exit status 0
    assert "torch.compile does not work here" in result.stdout, result.stdout + result.stderr

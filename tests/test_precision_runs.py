"""The training chapters in fp32 too, on a machine whose own precision is not fp32.

`make test` executes the book in the precision the library picks on this machine (``auto``: bf16 on
CPUs with native bf16 and on bf16 GPUs, fp16 on older GPUs, fp32 elsewhere), or the one
``TRANSFORMER_LIB_PRECISION`` names. Where that is not fp32, this test executes chapters 7 to 10,
the ones that train, again with ``TRANSFORMER_LIB_PRECISION=fp32`` (scripts/execute_chapters.py, the
book build's way: fresh kernels, the chapters' folder, its per-cell time limit), so one machine checks
both precisions that readers run (DESIGN.md, "One book, every machine"). Where the book's own run
already is fp32, it is skipped: that run was the check. The executed notebooks and times.json land in
_build/checks/test-fp32/. `make fp32-check` executes every chapter this way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import execute_chapters
from transformer_lib.precision import PRECISION_ENV, autocast_dtype, precision_override
from transformer_lib.utils import get_device

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.notebooks, pytest.mark.slow]

FP32_CHAPTERS = [7, 8, 9, 10]
OUT = ROOT / "_build" / "checks" / "test-fp32"


def test_training_chapters_also_execute_in_fp32():
    device = get_device()
    dtype = autocast_dtype(device)
    if dtype is None:
        pytest.skip(
            f"the book already executes in fp32 here ({PRECISION_ENV}={precision_override()} on {device}): "
            "no second precision to check"
        )
    print(f"\nthe book's own precision here: {dtype} on {device}; chapters {FP32_CHAPTERS} again in fp32")
    runs = execute_chapters.run_chapters(execute_chapters.chapter_paths(FP32_CHAPTERS), precision="fp32", out=OUT)
    failed = [run.line() for run in runs if not run.ok]
    assert not failed, f"in fp32 ({PRECISION_ENV}=fp32; notebooks in {OUT}):\n" + "\n".join(failed)

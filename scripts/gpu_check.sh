#!/usr/bin/env bash
# Everything the book runs differently on a CUDA GPU, in one go, its times and outputs written to OUT:
#   1. benchmarks/mfu.py (GPT-2 small, compiled, bf16) with its kernel profile, the GPU alone;
#   2. tests/test_cuda.py, in the precision the GPU picks, then in fp16 with the loss scaler (a T4's path);
#   3. every chapter in a fresh kernel, each in its own process and all at once beside the tests (the GPU
#      shared: their times are upper bounds), executed with --allow-errors into OUT/chapters/N/ with its
#      times.json (seconds, failing cells, slowest cells), written even when a chapter is stopped part-way.
# It ends with one summary line per chapter and its slowest cells (OUT/summary.txt).
#
# Usage: bash scripts/gpu_check.sh [OUT]                    (default OUT: _build/gpu_check)
# Env:   CHAPTERS="7 9"  the chapters (default: every one)   CH_TIMEOUT  seconds per chapter (default 540)
#        SKIP_MFU=1, SKIP_TESTS=1                             MFU_ARGS    (default: --profile)
#        MFU_TIMEOUT  seconds (default 240)                   PYTHON      (default: python3)
# Needs a CUDA GPU and the book's packages in PYTHON's environment (`make setup` with a CUDA build of torch).
set -u
cd "$(dirname "$0")/.."
OUT=${1:-_build/gpu_check}
PY=${PYTHON:-python3}
mkdir -p "$OUT/chapters"
T0=$(date +%s)
stamp() { echo "[$(($(date +%s) - T0)) s] $*"; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available()
else 'no CUDA GPU: mfu.py skipped, the CUDA tests skip, the chapters run on the CPU',
'cpu', torch.backends.cpu.get_cpu_capability())" || exit 1
"$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || SKIP_MFU=1
if [ -z "${SKIP_MFU:-}" ]; then
  # shellcheck disable=SC2086  # MFU_ARGS is a list of flags
  (cd benchmarks && timeout "${MFU_TIMEOUT:-240}" "$PY" mfu.py ${MFU_ARGS:---profile}) >"$OUT/mfu.txt" 2>&1
  stamp "mfu.py: exit $?, $OUT/mfu.txt"
fi
pids=()
if [ -z "${SKIP_TESTS:-}" ]; then
  (
    "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py >"$OUT/test_cuda.txt" 2>&1
    echo "exit $?" >>"$OUT/test_cuda.txt"
    TRANSFORMER_LIB_PRECISION=fp16 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py >"$OUT/test_cuda_fp16.txt" 2>&1
    echo "exit $?" >>"$OUT/test_cuda_fp16.txt"
  ) &
  pids+=($!)
fi
for n in ${CHAPTERS:-$(seq 1 10)}; do
  # 3 CPU threads each: ten kernels share the machine's cores
  OMP_NUM_THREADS=3 timeout "${CH_TIMEOUT:-540}" "$PY" scripts/execute_chapters.py "$n" --out "$OUT/chapters/$n" \
    --allow-errors >"$OUT/chapters/$n.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
stamp "chapters and tests done"
tail -n 2 "$OUT"/test_cuda*.txt 2>/dev/null
"$PY" - "$OUT" <<'PYEOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
for log in sorted((out / "chapters").glob("*.log"), key=lambda p: int(p.stem)):
    times = out / "chapters" / log.stem / "times.json"
    if not times.exists():  # stopped part-way: its notebook holds the cells it ran
        print(f"chapter {log.stem}: stopped part-way ({log.read_text().strip().splitlines()[-1:]})")
        continue
    for name, t in json.loads(times.read_text()).items():
        errors = "; ".join(f"cell {e['cell']}: {e['error'][:120]}" for e in t["errors"][:3])
        print(f"{name:28s} {t['seconds']:7.1f} s  {'ok' if t['ok'] else 'FAILED: ' + errors}")
        print("    slowest cells: " + ", ".join(f"{i}: {s:.1f} s" for i, s in t["slowest_cells"][:6]))
PYEOF
stamp end

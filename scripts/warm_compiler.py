"""Warm torch.compile's cache on disk once per machine, so that chapter 8's first compiled cell does not wait for it.

The first ``torch.compile`` on a CPU, in a process whose compiler cache is empty, tests which vector
instruction sets the C++ compiler can build for this processor, with test builds for each set the
processor reports (AMX, AVX512-VNNI, AVX512 and AVX2 on a recent Xeon: 10 builds, about 9 s on 2 cores;
7.8 s on a 2-core AMD EPYC), and keeps the results in its cache (``TORCHINDUCTOR_CACHE_DIR``, by
default ``/tmp/torchinductor_<user>``), where every later process finds them. ``make setup`` runs
this script, which compiles one small function, forward and backward: the tests then run during the
set-up instead of inside chapter 8's compiled race (there, on that Xeon, 24-25 s became 14-15 s), and
the script says whether ``torch.compile`` works on this machine at all (it needs a C++ compiler). It
never fails the set-up: a machine without a working compiler is only told so.

    python scripts/warm_compiler.py
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F


def main() -> None:
    start = time.perf_counter()
    try:
        f = torch.compile(lambda x: F.gelu(x).sum())
        x = torch.randn(64, requires_grad=True)
        f(x).backward()
    except Exception as e:  # no C++ compiler, an unsupported platform: the book's eager cells are unaffected
        print(
            f"warm_compiler: torch.compile does not work here ({type(e).__name__}); chapter 8's compiled cells need it"
        )
        return
    print(f"warm_compiler: torch.compile works here; its cache is warm ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()

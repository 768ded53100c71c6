"""The book build's ``explore`` pictures drawn one after the other against side by side on the cores.

In the book build ``explore`` draws every combination of its controls' values once, as a PNG. Drawing is
matplotlib's layout and PNG encoding, on one core; on Linux ``explore`` draws the pictures in forked
processes, one per core (``widgets._pictures``, ``runs.map_in_processes``). This script draws
``--frames`` pictures shaped like chapter 6's training frames (a loss curve and two cross-attention maps
labelled character by character) both ways, alternating, ``--repeats`` times each, and checks that the
pictures are the same bytes. The last line reads

    speedup=<one after the other over side by side, best of each> equal=<True|False>

    python benchmarks/explore_pictures.py
    python benchmarks/explore_pictures.py --frames 48   # chapter 1's 48 views
"""

from __future__ import annotations

import argparse
import os
import time
from unittest import mock

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from transformer_lib.notebook import widgets  # noqa: E402

SOURCE, TARGET = "march 3, 2021", "2021-03-03"


def draw_frame(step: int):
    """A frame of chapter 6's training view, from made-up numbers: loss curves and two attention maps."""
    rng = np.random.default_rng(step)
    fig, axes = plt.subplots(1, 3, figsize=(10.4, 3.4), gridspec_kw={"width_ratios": [1.2, 1, 1]})
    steps = np.arange(0, step + 1)
    axes[0].plot(steps, 4 * np.exp(-steps / 60) + 1e-3, label="train")
    axes[0].plot(steps[::50], 4 * np.exp(-steps[::50] / 70) + 2e-3, "o-", label="held-out")
    axes[0].set(xlim=(0, 600), ylim=(1e-4, 5), yscale="log", xlabel="step", ylabel="loss", title="Loss")
    axes[0].legend(loc="lower left")
    for layer, ax in enumerate(axes[1:]):
        w = rng.dirichlet(np.ones(len(SOURCE)), size=len(TARGET) + 1)  # (T, S), rows sum to 1
        ax.imshow(w, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(SOURCE)), list(SOURCE.replace(" ", "_")), fontsize=6)
        ax.set_yticks(range(len(TARGET) + 1), list(TARGET) + ["<eos>"], fontsize=6)
        ax.set(xlabel="source character", ylabel="writing", title=f"cross-attention, layer {layer + 1}")
    fig.suptitle(f"step {step}: {SOURCE!r} -> {TARGET!r}", fontsize=10)
    fig.tight_layout()
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=13, help="pictures to draw (chapter 6 draws 13)")
    p.add_argument("--repeats", type=int, default=2, help="timings of each way, alternating")
    args = p.parse_args()
    combos = [(50 * i,) for i in range(args.frames)]
    side_by_side = widgets.can_fork() and (os.cpu_count() or 1) > 1
    print(f"{args.frames} pictures, {os.cpu_count()} cores, side by side in processes: {side_by_side}")

    can_fork = widgets.can_fork

    def timed(fork: bool) -> tuple[float, list[str]]:
        with mock.patch.object(widgets, "can_fork", lambda: fork and can_fork()):
            start = time.perf_counter()
            pictures = widgets._pictures(draw_frame, ["step"], combos)
            return time.perf_counter() - start, pictures

    here, side = [], []
    for _ in range(args.repeats):
        seconds, pictures_here = timed(False)
        here.append(seconds)
        seconds, pictures_side = timed(True)
        side.append(seconds)
    print(f"{'one after the other':24s} " + "  ".join(f"{s:6.2f} s" for s in here))
    print(f"{'side by side':24s} " + "  ".join(f"{s:6.2f} s" for s in side))
    print(f"speedup={min(here) / min(side):.2f} equal={pictures_here == pictures_side}")


if __name__ == "__main__":
    main()

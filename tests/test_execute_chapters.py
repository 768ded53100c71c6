"""scripts/execute_chapters.py: seeds rewritten in code only, chapters chosen by number, busy loops that
always end, and a notebook run in a fresh kernel of this interpreter with the precision it was given
(a two-cell notebook, not a chapter)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
import execute_chapters as ec  # noqa: E402


@pytest.mark.parametrize(
    ("source", "expected", "count"),
    [
        ("tl.set_seed(0)", "tl.set_seed(1000)", 1),
        ("g = torch.Generator(device).manual_seed( 3 )", "g = torch.Generator(device).manual_seed( 1003 )", 1),
        ("device = setup_chapter(seed=0)", "device = setup_chapter(seed=1000)", 1),
        ("seed = 2\nSEED=7", "seed = 1002\nSEED=1007", 2),
        ("SEEDS = (0, 1, 2)\nseeds = (0,)", "SEEDS = (1000, 1001, 1002)\nseeds = (1000,)", 4),
        ("N_LAYERS, LR, SEED = 6, 1e-2, 0  # six layers", "N_LAYERS, LR, SEED = 6, 1e-2, 1000  # six layers", 1),
        ("x, y = f(seed=1), 2", "x, y = f(seed=1001), 2", 1),
        # variables, other names, comparisons and floats stay
        ("torch.manual_seed(seed)\nTrainConfig(seed=seed)", None, 0),
        ("seed_everything(0)\ndata_seed=3\nreseed(4)\nmy_seed = 5", None, 0),
        ("if seed == 0:\n    pass\nseed = 0.5\nfor seed in SEEDS[1:]:", None, 0),
        ("def train(positional: str, seed: int = 0):", None, 0),
    ],
)
def test_reseed_rewrites_seed_literals_only(source, expected, count):
    assert ec.reseed_source(source, 1000) == (source if expected is None else expected, count)


def test_reseed_touches_code_cells_only():
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("We call `set_seed(0)`."), nbformat.v4.new_code_cell("set_seed(0)")]
    )
    assert ec.reseed_notebook(nb, 5) == 1
    assert [c.source for c in nb.cells] == ["We call `set_seed(0)`.", "set_seed(5)"]


def test_every_chapter_sets_seeds_that_reseed_finds():
    for path in ec.chapter_paths():
        assert ec.reseed_notebook(nbformat.read(path, as_version=4), 1) > 0, f"{path.name}: no seed literal found"


def test_chapters_are_chosen_by_number(tmp_path):
    for name in ("01_a.ipynb", "02_b.ipynb", "10_c.ipynb", "notes.ipynb"):
        (tmp_path / name).write_text("{}")
    assert [p.name for p in ec.chapter_paths(None, tmp_path)] == ["01_a.ipynb", "02_b.ipynb", "10_c.ipynb"]
    assert [p.name for p in ec.chapter_paths([10, 1], tmp_path)] == ["10_c.ipynb", "01_a.ipynb"]
    with pytest.raises(ValueError, match="no chapter 3"):
        ec.chapter_paths([3], tmp_path)


def test_precision_names_are_the_librarys():
    from transformer_lib.precision import PRECISION_ENV, PRECISIONS

    assert ec.PRECISION_ENV == PRECISION_ENV and set(ec.PRECISIONS) == set(PRECISIONS)


def test_busy_processes_end_with_the_block_even_on_an_error():
    with pytest.raises(RuntimeError), ec.busy_processes(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
        raise RuntimeError("stop")
    assert all(p.poll() is not None for p in procs)


def _tiny_chapter(folder: Path) -> Path:
    folder.mkdir()
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# A chapter"),
            nbformat.v4.new_code_cell(
                "import os, sys\nseed = 3\n"
                "print(os.environ.get('TRANSFORMER_LIB_PRECISION'), os.environ.get('TRANSFORMER_BOOK_BUILD'), seed)\n"
                "print(sys.executable)\nprint(os.getcwd())"
            ),
            nbformat.v4.new_code_cell("raise ValueError('boom')"),
            nbformat.v4.new_code_cell("x = 1\nassert x == 2\nprint('never')"),
            nbformat.v4.new_code_cell("print('after')"),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    path = folder / "01_tiny.ipynb"
    nbformat.write(nb, path)
    return path


def _text(cell) -> str:
    return "".join(out.get("text", "") for out in cell.get("outputs", []))


def test_a_notebook_runs_in_a_fresh_kernel_with_the_precision_and_seeds_given(tmp_path, capsys):
    path = _tiny_chapter(tmp_path / "chapters")
    out = tmp_path / "out"
    (run,) = ec.run_chapters([path], precision="fp32", reseed=5, allow_errors=True, out=out, cwd=path.parent, echo=True)
    assert run.errors == [(2, "ValueError: boom"), (3, "AssertionError: line 2: assert x == 2")]
    assert run.replacements == 1
    printed = capsys.readouterr().out
    assert "01_tiny: 1 seed literals + 5" in printed
    assert "FAILED: cell 2: ValueError: boom (and 1 more failing cells)" in printed
    executed = nbformat.read(out / path.name, as_version=4)
    env_line, executable, cwd = _text(executed.cells[1]).splitlines()
    assert env_line == "fp32 1 8"  # the precision and the build's variable reached the kernel; seed 3 + 5
    assert Path(executable).resolve() == Path(sys.executable).resolve(), "the kernel is this interpreter"
    assert Path(cwd).resolve() == path.parent.resolve(), "the kernel runs in the chapters' folder"
    assert _text(executed.cells[4]) == "after\n", "--allow-errors runs past the failing cells"
    times = json.loads((out / "times.json").read_text())
    assert times["01_tiny"]["ok"] is False and times["01_tiny"]["error"] == "cell 2: ValueError: boom"
    assert times["01_tiny"]["precision"] == "fp32" and times["01_tiny"]["seed_replacements"] == 1
    slowest = times["01_tiny"]["slowest_cells"]  # [cell index, seconds], longest first: where the time went
    assert sorted(i for i, _ in slowest) == [i for i, c in enumerate(executed.cells) if c.cell_type == "code"]
    assert [t for _, t in slowest] == sorted((t for _, t in slowest), reverse=True) and all(t >= 0 for _, t in slowest)


def test_without_allow_errors_a_notebook_stops_at_its_first_error(tmp_path):
    path = _tiny_chapter(tmp_path / "chapters")
    nb = nbformat.read(path, as_version=4)
    run = ec.execute(nb, "01_tiny", ec.kernel_env("bf16"), cwd=path.parent)
    assert not run.ok and run.error == "cell 2: ValueError: boom" and len(run.errors) == 1
    assert _text(nb.cells[1]).startswith("bf16 1 3\n")
    assert not nb.cells[3].get("outputs") and not nb.cells[4].get("outputs"), "the cells after the error did not run"
    assert "FAILED: cell 2: ValueError: boom" in run.line()


def test_a_chapter_stopped_part_way_is_written_with_the_cells_it_ran(tmp_path, monkeypatch):
    """Ctrl-C or `timeout` during a chapter: the notebook is still written, with the outputs run so far."""
    path = _tiny_chapter(tmp_path / "chapters")

    def stopped(nb, name, env, **kwargs):
        nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="ran\n")]
        raise KeyboardInterrupt

    monkeypatch.setattr(ec, "execute", stopped)
    with pytest.raises(KeyboardInterrupt):
        ec.run_chapters([path], out=tmp_path / "out", cwd=path.parent, echo=False)
    written = nbformat.read(tmp_path / "out" / path.name, as_version=4)
    assert _text(written.cells[1]) == "ran\n"

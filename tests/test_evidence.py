"""The chapters' glued numbers and claims (transformer_lib.notebook.evidence), their sweeps in
book/evidence/ (scripts/evidence.py) and the rule that keeps measured numbers out of hand-written prose."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from transformer_lib.notebook import evidence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from evidence import EVIDENCE_DIR, code_hash  # noqa: E402 (scripts/evidence.py)

CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
CLAIM = re.compile(r"\b(claim|glue)\(\s*(?:f?)\"([^\"]+)\"")


def _names(path: Path) -> tuple[set[str], set[str]]:
    """The names a chapter's code claims, and those it glues (claims included)."""
    nb = nbformat.read(path, as_version=4)
    found = [m.groups() for c in nb.cells if c.cell_type == "code" for m in CLAIM.finditer(c.source)]
    return {n for kind, n in found if kind == "claim"}, {n for _, n in found}


# ------------------------------------------------------------------------------------------- glue and claim


@pytest.fixture
def shown(monkeypatch):
    calls = []
    monkeypatch.setattr(evidence, "display", lambda data, raw, metadata: calls.append((data, metadata)))
    return calls


def test_glue_displays_what_myst_nb_reads_and_a_word_without_quotes(shown):
    evidence.glue("gap", 0.0751)
    evidence.glue("verdict", "beats")
    (number, meta), (word, _) = shown
    assert meta == {"scrapbook": {"name": "gap", "mime_prefix": "application/papermill.record/"}}
    assert number == {"application/papermill.record/text/plain": "0.0751"}
    assert word == {"application/papermill.record/text/plain": "beats"}  # not "'beats'"


def test_glue_shows_numpy_scalars_as_python_numbers(shown):
    assert evidence.glue("x", np.float64(0.5)) == 0.5 and evidence.glue("n", np.int64(3)) == 3
    assert [data for data, _ in shown] == [{"application/papermill.record/text/plain": v} for v in ("0.5", "3")]


def test_a_claim_that_holds_is_glued_and_recorded(shown, tmp_path, monkeypatch):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv(evidence.EVIDENCE_ENV, str(log))
    assert evidence.claim("gain", 0.3, above=0.2) == 0.3
    assert repr(evidence.claim("seeds", np.int64(3), above=2.5)) == "3"  # a count is glued as a count, not 3.0
    assert shown[0][1]["scrapbook"]["name"] == "gain"
    entry, _ = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry == {"name": "gain", "value": 0.3, "above": 0.2, "below": None, "held": True, "claim": True}


@pytest.mark.parametrize("value", [0.1, float("nan"), 0.95])
def test_a_claim_that_fails_is_recorded_then_raised(shown, tmp_path, monkeypatch, value):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv(evidence.EVIDENCE_ENV, str(log))
    with pytest.raises(AssertionError, match=r"claim gain: .* is not above 0.2 and below 0.9 in this run"):
        evidence.claim("gain", value, above=0.2, below=0.9)
    assert json.loads(log.read_text())["held"] is False


def test_a_claim_not_asserted_here_is_glued_and_recorded(shown, tmp_path, monkeypatch):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv(evidence.EVIDENCE_ENV, str(log))
    assert evidence.claim("gain", 0.1, above=0.2, when=False) == 0.1  # e.g. a GPU's sizes: no margin measured
    assert json.loads(log.read_text())["held"] is False
    assert shown[-1][0] == {"application/papermill.record/text/plain": "0.1"}


def test_glue_and_claim_refuse_what_they_cannot_show(shown):
    with pytest.raises(ValueError, match="needs a bound"):
        evidence.claim("x", 1.0)
    with pytest.raises(TypeError, match="a number or a str, got list"):
        evidence.glue("x", [1, 2])
    with pytest.raises(TypeError, match="non-empty str"):
        evidence.glue("", 1)


def test_the_sweep_table_reads_every_run():
    record = {
        "chapter": "05_norms", "date": "2026-12-07", "commit": "abc1234",
        "machine": {"cpu": "AMD EPYC", "cores": 2, "capability": "AVX512", "native": "bfloat16", "torch": "2.13.0"},
        "runs": [
            {"seed_shift": s, "precision": "auto", "seconds": 60.0, "errors": [],
             "records": {"gain": {"value": v, "above": 0.2, "below": None, "held": v > 0.2, "claim": True},
                         "word": {"value": "beats"}, "left": {"value": s // 1000}}}
            for s, v in ((0, 0.5), (1000, 0.3), (2000, 0.1))
        ],
    }  # fmt: skip
    table = evidence.sweep_table(record)
    assert "1 claims and 1 numbers read, 3 runs" in table and "<code>gain</code>" in table and "word" not in table
    assert "<td><code>left</code></td><td>0</td><td>0</td><td>1</td><td>2</td><td>read</td><td></td>" in table
    assert "<td>0.5</td><td>0.1</td><td>0.3</td><td>0.5</td><td>&gt; 0.2</td><td>2 of 3</td>" in table


# ------------------------------------------------------------------------------------- chapters and sweeps


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_that_claims_has_a_current_sweep_with_exactly_its_claims(path):
    claims, glued = _names(path)
    sweep = EVIDENCE_DIR / f"{path.stem}.json"
    if not glued:
        assert not sweep.exists(), f"{sweep} is the sweep of a chapter that no longer glues or claims anything"
        return
    assert sweep.exists(), f"{path.stem} glues or claims, and has no sweep: run make evidence CHAPTERS={path.stem[:2]}"
    record = json.loads(sweep.read_text(encoding="utf-8"))
    assert record["code_sha256"] == code_hash(path), (
        f"{path.stem}'s code changed after its sweep: run make evidence CHAPTERS={int(path.stem[:2])} and commit it"
    )
    swept = {n for run in record["runs"] for n, r in run["records"].items() if r.get("claim")}
    assert claims <= swept, f"claims of {path.stem} missing from its sweep: {sorted(claims - swept)}"
    assert swept <= claims, (
        f"claims in the sweep of {path.stem} that the chapter no longer makes: {sorted(swept - claims)}"
    )
    assert len(record["runs"]) >= 5 and {r["precision"] for r in record["runs"]} >= {"auto", "fp32"}


# ------------------------------------------------------------------------- no measured number typed by hand

# What prose may not type: a decimal (0.075), a percentage (12%), a ratio (1.95x, 3×) or a count of runs
# ("2 of 3"). Definitions, formulas and settings go in math ($10^{-2}$, $0.02$) or code (`LR = 2e-2`);
# measured values in {glue:text}`name` roles. Years, chapter and section numbers are plain integers.
MEASURED = re.compile(r"\b\d+\.\d+\b|\b\d+(?:\.\d+)?\s?%|\b\d+(?:\.\d+)?\s?[x×](?![\w])|\b\d+ of \d+\b")
FENCED_CODE = r"^(`{3,}|~{3,})(?![`~{])[^\n]*\n.*?^\1"  # a code block, not a directive's fence (```{note})
EXEMPT = re.compile(
    FENCED_CODE + r"|\$\$.*?\$\$|\$[^$\n]+\$|\{[\w:-]+\}`[^`]*`|`[^`\n]*`|\]\([^)]*\)|<[^>]+>", re.S | re.M
)


def measured_numbers(markdown: str) -> list[str]:
    """The numbers in ``markdown`` that read as measured, outside math, code, roles and links."""
    return MEASURED.findall(EXEMPT.sub(" ", markdown))


def test_the_rule_finds_typed_measurements_and_spares_math_code_and_glue():
    assert measured_numbers("SwiGLU beats GELU by 0.075, 7.6 standard errors; 1.95x faster; in 2 of 3 seeds; 12%") == [
        "0.075", "7.6", "1.95x", "2 of 3", "12%"]  # fmt: skip
    spared = "at $\\eta = 0.02$, `LR = 2e-2`, {glue:text}`ch5.gap:.3f`, [v1.2](https://x.org/1.5), in 2017, chapter 4"
    assert measured_numbers(spared) == []
    fenced = "````{warning}\nIt is 0.5 slower:\n```python\nx = 0.5 * y\n```\n````"
    assert measured_numbers(fenced) == ["0.5"]  # a directive's text is prose; the code block inside it is not
    exercise = "````{exercise} Bug\nIt is 0.5 slower:\n```python\nx = np.log(10000.0)\n```\n````"
    assert measured_numbers(exercise) == ["0.5"]  # a four-backtick directive is not a code block's fence


@pytest.mark.parametrize("path", [p for p in CHAPTERS if _names(p)[1]], ids=lambda p: p.stem)
def test_a_swept_chapter_types_no_measured_number(path):
    nb = nbformat.read(path, as_version=4)
    typed = {
        i: found for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and (found := measured_numbers(c.source))
    }
    assert not typed, f"{path.stem}: numbers typed by hand in Markdown cells (cell index: numbers): {typed}"


def test_the_colab_copy_prints_the_books_value_and_links_the_book():
    from make_colab import Converter

    converter = Converter(ROOT)
    converter.glued = {"gap": 0.07512, "verdict": "beats"}
    text = "SwiGLU {glue:text}`verdict` GELU by {glue:text}`gap:.3f` ([the appendix](../book/evidence.ipynb))"
    assert (
        converter.roles(text)
        == f"SwiGLU **beats** GELU by **0.075** ([the appendix]({converter.book}book/evidence.html))"
    )
    with pytest.raises(SystemExit, match="not in this chapter's sweep"):
        converter.roles("{glue:text}`missing`")


def test_a_cell_ending_in_glue_or_claim_prints_nothing_more(shown):
    from IPython.core.formatters import DisplayFormatter

    formatter = DisplayFormatter()
    for name, value in (("gap", evidence.glue("gap", 0.07)), ("n", evidence.glue("n", 3)),
                        ("word", evidence.glue("word", "beats")),
                        ("gain", evidence.claim("gain", 0.5, above=0.2))):  # fmt: skip
        assert formatter.format(value) == ({}, {}), value  # what IPython shows for a cell's last expression
        assert value == {"gap": 0.07, "n": 3, "word": "beats", "gain": 0.5}[name]  # and it is still the value

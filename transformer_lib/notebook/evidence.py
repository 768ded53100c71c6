"""What a chapter says about its own run: numbers and verdicts glued into the prose, and claims checked.

:func:`glue` hands a value to the chapter's text, where ``{glue:text}`name``` (or ``name:.3f``) prints
it in the HTML book (myst-nb's glue: the same display data, no myst-nb needed in the kernel), and the
student copies print the book's value (``scripts/make_colab.py``). :func:`claim` is an assert on a
trained or timed number that is glued too. While ``make evidence`` sweeps a chapter (seeds shifted, fp32
and the machine's precision), every glued value and every claim, held or not, is appended to the file
named by ``TRANSFORMER_BOOK_EVIDENCE``; the book's evidence appendix reads the sweeps.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import statistics

from IPython.display import display

EVIDENCE_ENV = "TRANSFORMER_BOOK_EVIDENCE"


class Text(str):
    """A glued word: its ``repr`` is the word, so ``{glue:text}`` prints it without quotes."""

    def __repr__(self) -> str:
        return str(self)


class _Float(float):
    """What :func:`glue` and :func:`claim` return: the value, which a cell ending in the call does not print
    (the prose shows it)."""

    def _ipython_display_(self) -> None:
        pass


class _Int(int):
    _ipython_display_ = _Float._ipython_display_


class _Str(str):
    _ipython_display_ = _Float._ipython_display_


def _quiet(value: float | int | str) -> float | int | str:
    return _Str(value) if isinstance(value, str) else _Int(value) if isinstance(value, int) else _Float(value)


def glue(name: str, value: float | int | str) -> float | int | str:
    """Give ``value`` (a number, or a word such as a verdict) to the prose under ``name``; return it (a cell
    ending in the call prints nothing more)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise TypeError(f"value must be a number or a str, got {type(value).__name__}")
    if not isinstance(value, str):
        value = _python_number(value)
    _display(name, value)
    _record({"name": name, "value": value})
    return _quiet(value)


def claim(
    name: str, value: float | int, *, above: float | None = None, below: float | None = None, when: bool = True
) -> float | int:
    """Assert ``above < value < below`` (either bound may be left out) about this run, glue ``value`` under
    ``name`` and record it, held or not; return ``value``. The bounds are the claim's margin: the appendix
    sets them beside the values every run of the sweep gave. ``when=False`` (a configuration the margin was
    not measured in, such as a chapter's GPU sizes) glues and records without asserting."""
    if above is None and below is None:
        raise ValueError(f"claim {name!r} needs a bound: above=, below= or both")
    value = _python_number(value)
    held = math.isfinite(value) and (above is None or value > above) and (below is None or value < below)
    _display(name, value)
    _record({"name": name, "value": value, "above": above, "below": below, "held": held, "claim": True})
    if when and not held:
        bounds = " and ".join(f"{word} {b:g}" for word, b in (("above", above), ("below", below)) if b is not None)
        raise AssertionError(f"claim {name}: {value:.4g} is not {bounds} in this run")
    return _Int(value) if isinstance(value, int) else _Float(value)


def _python_number(value: float | int) -> float | int:
    """A NumPy or PyTorch scalar as Python's, which the prose's format reads; a count stays a count."""
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else float(value)


def _display(name: str, value: float | int | str) -> None:
    """What ``myst_nb.glue(name, value, display=False)`` displays: the value's text, hidden, named."""
    shown = Text(value) if isinstance(value, str) else value
    metadata = {"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}}
    display({"application/papermill.record/text/plain": repr(shown)}, raw=True, metadata=metadata)


def _record(entry: dict) -> None:
    path = os.environ.get(EVIDENCE_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


def sweep_table(record: dict) -> str:
    """One chapter's sweep (a ``book/evidence/*.json`` record) as an HTML table: per glued number, the book's
    run, the least, median and largest value over the sweep and, for a claim, the bound its assert uses and
    the runs it held in."""
    runs = record["runs"]
    numeric = {n for run in runs for n, r in run["records"].items() if not isinstance(r["value"], str)}
    rows = []
    for name in sorted(numeric):
        entries = [run["records"][name] for run in runs if name in run["records"]]
        values = sorted(e["value"] for e in entries)
        first = runs[0]["records"].get(name, {}).get("value", float("nan"))
        spread = [f"{v:.4g}" for v in (first, values[0], statistics.median(values), values[-1])]
        bounds = (("&gt;", entries[0].get("above")), ("&lt;", entries[0].get("below")))
        asserted = " and ".join(f"{word} {b:g}" for word, b in bounds if b is not None) or "read"
        held = f"{sum(e['held'] for e in entries)} of {len(runs)}" if entries[0].get("claim") else ""
        cells = [f"<code>{name}</code>", *spread, asserted, held]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = ["glued number", "book's run", "least", "median", "largest", "asserted", "held in"]
    m = record["machine"]
    claims = sum(1 for name in numeric if any(run["records"].get(name, {}).get("claim") for run in runs))
    sweep = "; ".join(f"seeds +{r['seed_shift']} {r['precision']} ({r['seconds']:.0f} s)" for r in runs)
    return (
        f"<p>{claims} claims and {len(numeric) - claims} numbers read, {len(runs)} runs ({sweep}) on {m['cores']} "
        f"cores of {m['cpu']} ({m['capability']}, native {m['native']}, torch {m['torch']}), {record['date']}, "
        f"commit {record['commit']}.</p><table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
        + "".join(rows) + "</table>"
    )  # fmt: skip

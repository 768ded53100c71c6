"""The chapter notebooks as files: stripped, set up for Colab the same way, with checked exercises,
and student copies without solutions that still run."""

import re
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from transformer_lib.notebook import exercises

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
CHAPTERS = [p for p in CHAPTERS if not p.name.startswith("00_")]
sys.path.insert(0, str(ROOT / "scripts"))
from make_student import student_copy  # noqa: E402


def load(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_there_are_chapters():
    assert len(CHAPTERS) >= 1


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    for cell in code_cells(load(path)):
        assert not cell.outputs and cell.execution_count is None, f"{path.name}: a cell carries outputs"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_first_cell_installs_from_the_configured_repository_only_on_colab(path):
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url, branch = config["repository"]["url"], config["repository"].get("branch", "main")
    expected = f'%pip install -q "transformer_lib[book] @ git+{url}@{branch}"'
    first, second = code_cells(load(path))[:2]
    assert 'if "google.colab" in sys.modules:' in first.source
    assert expected in first.source, f"{path.name}: the install line differs from _config.yml's repository"
    assert "describe_environment(" in second.source  # prints versions and the device


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_exercises_have_solutions_and_checkers(path):
    nb = load(path)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    labels = re.findall(r"```\{exercise\}.*?\n:label: (\S+)", text)
    assert 3 <= len(labels) <= 5, f"{path.name}: {len(labels)} exercises"
    assert len(set(labels)) == len(labels)
    for label in labels:
        assert f"```{{solution-start}} {label}" in text, f"{path.name}: {label} has no solution"
    assert text.count("{solution-start}") == text.count("{solution-end}")
    checks = [c for c in code_cells(nb) if re.search(r"^check_\w+\(", c.source, re.M)]
    assert len(checks) >= 2, f"{path.name}: fewer than two auto-checked exercises"
    starters = [c for c in code_cells(nb) if "student" in c.metadata.get("tags", [])]
    assert starters and all("remove-cell" in c.metadata["tags"] for c in starters)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_student_copy_has_no_solutions(path):
    nb = load(path)
    copy = student_copy(nb)
    assert not [c for c in copy.cells if "solution" in c.metadata.get("tags", [])]
    text = "\n".join(c.source for c in copy.cells)
    assert "solution-start" not in text and "solution-end" not in text
    solutions = [c.source for c in code_cells(nb) if "solution" in c.metadata.get("tags", [])]
    assert solutions and not any(s in text for s in solutions)
    starters = [c for c in copy.cells if "student" in c.metadata.get("tags", [])]
    assert starters and not any("remove-cell" in c.metadata["tags"] for c in starters)
    assert "# your code here" in text
    # everything else is still there
    kept = [c.source for c in nb.cells if "solution" not in c.metadata.get("tags", []) and "{solution-" not in c.source]
    assert all(s.rstrip() in text for s in kept)


@pytest.mark.parametrize("name", [n for n in dir(exercises) if n.startswith("check_")])
def test_every_checker_survives_a_stub(name, capsys):
    checker = getattr(exercises, name)
    for answer in (lambda *a, **k: None, lambda *a, **k: 1 / 0, "not a function"):
        result = checker(answer)
        assert not result.passed
        assert result.text in capsys.readouterr().out  # the feedback is printed


@pytest.mark.notebooks
def test_make_student_writes_copies_that_run(tmp_path):
    """The student copy of chapter 1 executes top to bottom: the checkers report, they don't crash."""
    from nbclient import NotebookClient

    from make_student import main

    main([str(tmp_path)])
    nb = load(tmp_path / CHAPTERS[0].name)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "chapters")}}
    ).execute()
    outputs = "\n".join(o.get("text", "") for c in code_cells(nb) for o in c.outputs)
    assert "checks failed" in outputs and "expected" in outputs


def test_student_copy_drops_solutions_spanning_several_cells():
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook(
        cells=[
            md("```{exercise} Q\n:label: ex-q\nAsk.\n```"),
            md("```{solution-start} ex-q\n:class: dropdown\n```"),
            md("The secret explanation."),
            code("secret = 42"),
            md("More secret text.\n```{solution-end}\n```\nAfter the solution."),
            md("Inline: ```{solution-start} ex-r\n```\nhidden too\n```{solution-end}\n```\nvisible"),
        ]
    )
    text = "\n".join(c.source for c in student_copy(nb).cells)
    assert "Ask." in text and "After the solution." in text and "visible" in text
    assert "secret" not in text and "hidden too" not in text and "solution-" not in text

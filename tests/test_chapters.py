"""The chapter notebooks as files: stripped, set up for Colab the same way, with checked exercises,
and student copies without solutions that still run."""

import re
from pathlib import Path

import nbformat
import pytest
import yaml

import check_no_outputs
import make_colab
from exercise_report import MAX_SIMILARITY, normalised_tokens, similarity, solution_similarity
from make_student import student_copy
from transformer_lib.notebook import exercises
from transformer_lib.notebook.exercises.catalogue import KINDS, chapter_number, exercises_of

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))


def load(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_chapters_and_colab_notebooks_are_committed_without_outputs():
    """Every chapter _toc.yml lists, and its Colab copy, without outputs (scripts/check_no_outputs.py)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    listed = [c["file"] for part in toc["parts"] for c in part["chapters"] if c["file"].startswith("chapters/")]
    assert [f"chapters/{p.stem}" for p in CHAPTERS] == listed, "chapters/ holds the chapters _toc.yml lists"
    assert check_no_outputs.main([]) == 0


def test_a_notebook_with_outputs_is_refused_by_its_cell_numbers(tmp_path, capsys):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# x"), nbformat.v4.new_code_cell("1"), nbformat.v4.new_code_cell("2")]
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    assert check_no_outputs.main([str(path)]) == 0
    nb.cells[1].execution_count = 1  # run, its output cleared: still refused
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="2")]
    nbformat.write(nb, path)
    assert check_no_outputs.main([str(path)]) == 1
    assert f"{path}: cells with outputs: 2, 3;" in capsys.readouterr().out


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_first_cell_installs_from_the_configured_repository_only_on_colab(path):
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url, branch = config["repository"]["url"], config["repository"].get("branch", "main")
    expected = f'%pip install -q "transformer_lib[book] @ git+{url}@{branch}"'
    first, second = code_cells(load(path))[:2]
    assert 'if "google.colab" in sys.modules:' in first.source
    assert expected in first.source, f"{path.name}: the install line differs from _config.yml's repository"
    assert "setup_chapter(" in second.source  # prints versions and the device


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
    """The student copy of chapter 1 executes top to bottom: every checker reports its untouched starter as
    not answered yet (a Spot the bug left as given included), none crashes."""
    from nbclient import NotebookClient

    from make_student import main

    main([str(tmp_path)])
    nb = load(tmp_path / CHAPTERS[0].name)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "chapters")}}
    ).execute()
    outputs = "\n".join(o.get("text", "") for c in code_cells(nb) for o in c.outputs)
    from transformer_lib.notebook.exercises.catalogue import load_catalogue

    checkers = [name for e in load_catalogue()[CHAPTERS[0].stem] for name in e.checkers]
    assert checkers and outputs.count("not answered yet") == len(checkers), outputs
    assert "checks failed" not in outputs


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


# ---------------------------------------------------------------- exercises that make the reader think (issue 14)


def chapter_exercises(path):
    return exercises_of(load(path).cells, chapter_number(path.name))


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_exercise_says_its_kind_and_the_kinds_are_mixed(path):
    exercises = chapter_exercises(path)
    assert all(e.kind in KINDS for e in exercises), [e.title for e in exercises if not e.kind]
    kinds = [e.kind for e in exercises]
    assert len(set(kinds)) >= 2, f"{path.name}: one kind only ({kinds[0]})"
    assert kinds.count("Explain") <= 2, f"{path.name}: {kinds.count('Explain')} exercises in words"
    assert sum(bool(e.checkers) for e in exercises) >= 2
    for e in exercises:  # an exercise in words has no checker; every other kind has one
        assert bool(e.checkers) == (e.kind != "Explain"), f"{path.name}: Exercise {e.number} ({e.kind})"


def test_the_book_has_every_kind_of_exercise():
    kinds = {e.kind for path in CHAPTERS for e in chapter_exercises(path)}
    assert set(KINDS) <= kinds


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_solution_repeats_a_body_cell(path):
    """A solution that the body already shows can be solved by scrolling up. The measure (exercise_report.py):
    the share of the solution's tokens found in one body cell in runs of >= 8 tokens, local names normalised.
    Before issue 14 the copies measured 0.55-0.99 (the LayerNorm fix 0.99, the KV-cache generate 0.86,
    the label-smoothed target 0.65) while solutions written afresh stayed below 0.47: the limit is 0.5."""
    nb = load(path)
    too_close = [(i, round(s, 2), j) for i, s, j in solution_similarity(nb) if s > MAX_SIMILARITY]
    assert not too_close, f"{path.name}: (solution cell, similarity, body cell) {too_close}"


def test_the_similarity_measure_catches_a_copy_with_new_names():
    body = """\
def layer_norm_by_hand(x, gamma, beta, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps) * gamma + beta
"""
    copy = """\
def layer_norm(t, w, b, eps=1e-5):  # the same code, renamed
    m = t.mean(dim=-1, keepdim=True)
    v = t.var(dim=-1, keepdim=True, unbiased=False)
    return (t - m) / torch.sqrt(v + eps) * w + b
"""
    fresh = "def layer_norm(x, w, b, eps=1e-5):\n    return F.layer_norm(x, x.shape[-1:], w, b, eps)\n"
    assert similarity(normalised_tokens(copy), normalised_tokens(body)) == 1.0
    assert similarity(normalised_tokens(fresh), normalised_tokens(body)) < MAX_SIMILARITY


# ---------------------------------------------------------------- the Colab notebooks and the catalogue


COLAB = ROOT / "colab"


def test_colab_notebooks_and_catalogue_are_up_to_date():
    """`make colab` writes them from the chapters; a chapter changed without it leaves them stale."""
    assert make_colab.main(["--check"]) == 0, "run `make colab` and commit colab/ and catalogue.json"
    assert sorted(p.name for p in COLAB.glob("*.ipynb")) == [p.name for p in CHAPTERS]


MYST = re.compile(r"```\{|:::\{|\{(cite|term|ref|numref|doc|eq|glue)[:}]|^\s*:(label|class):|^\([\w-]+\)=", re.M)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_colab_copy_has_no_solutions_and_no_myst(path):
    colab = load(COLAB / path.name)
    assert colab.metadata["transformer_book"] == {"chapter": path.stem, "copy": "student"}
    assert not [c for c in colab.cells if "solution" in c.metadata.get("tags", [])]
    text = "\n".join(c.source for c in colab.cells)
    solutions = [c.source for c in code_cells(load(path)) if "solution" in c.metadata.get("tags", [])]
    assert solutions and not any(s.strip() in text for s in solutions)
    markdown = "\n".join(c.source for c in colab.cells if c.cell_type == "markdown")
    assert not MYST.search(markdown), MYST.search(markdown).group(0)
    for e in chapter_exercises(path):
        assert f"### Exercise {e.number}: {e.kind}: " in markdown, e.number


def test_colab_markup_becomes_markdown_with_links_to_the_book():
    converter = make_colab.Converter(ROOT)
    converter.numbers = {"ex-x": "3.2"}
    converter.labels["ex-x"] = ("chapters/03_x.html", "Exercise 3.2")
    book = make_colab.book_url(ROOT)
    text = converter.markdown(
        "As {cite:t}`vaswani2017attention` show {cite:p}`vaswani2017attention,ba2016layer`, a {term}`head <Head>`.\n\n"
        "```{exercise} Extend: a thing\n:label: ex-x\nDo it, see {ref}`ex-x`.\n```\n\n"
        "```{warning}\nCareful.\n```\n(classroom)=\n## Teaching\n"
    )
    assert f"[Vaswani et al. (2017)]({book}book/bibliography.html)" in text
    assert f"([Vaswani et al., 2017]({book}book/bibliography.html); [Ba et al., 2016]" in text
    assert f"[head]({book}book/glossary.html#term-Head)" in text
    assert f"### Exercise 3.2: Extend: a thing\n\nDo it, see [Exercise 3.2]({book}chapters/03_x.html#ex-x)." in text
    assert "> **Warning**\n>\n> Careful." in text and "(classroom)=" not in text and "## Teaching" in text
    with pytest.raises(SystemExit, match="no Markdown form for the \\{figure\\} directive"):
        converter.markdown("```{figure} x.png\n```\n")
    with pytest.raises(SystemExit, match="label 'ex-nowhere' is defined nowhere in the book"):
        converter.markdown("{ref}`ex-nowhere`")
    with pytest.raises(SystemExit, match="'nobody2020' is not in book/references.bib"):
        converter.markdown("{cite:p}`nobody2020`")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_colab_first_cell_installs_the_configured_library_and_the_next_prints_the_environment(path):
    first, second = code_cells(load(COLAB / path.name))[:2]
    requirement = make_colab.colab_install(ROOT)
    assert f'%pip install -q "{requirement}"' in first.source
    assert 'if "google.colab" in sys.modules or importlib.util.find_spec("transformer_lib") is None:' in first.source
    assert "setup_chapter(" in second.source  # prints Python, torch, the library and the device

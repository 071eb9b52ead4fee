# Two commands for a fresh clone: `make run` (train on a local Ray instance) and `make test`.
# Each creates the virtual environment when it is missing.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build these machines carry. On a GPU machine install your CUDA torch into $(VENV) first
# (or set TORCH=...): an importable torch is kept as it is.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.raydist-installed
PIP := $(VENV)/bin/pip install --quiet --disable-pip-version-check

.PHONY: setup bytecode run test clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) "$(TORCH)" 2>&1 | grep -v "^WARNING: Location" || true
	@$(PY) -c "import torch" 2>/dev/null || { echo "raydist: error: could not install $(TORCH) into $(VENV)" >&2; exit 2; }
	$(PIP) -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
	@$(PY) -c "import raydist, ray, torch, yaml, sklearn" || { echo "raydist: error: set-up of $(VENV) failed" >&2; exit 2; }
	@touch $(STAMP)

# raydist's own modules as bytecode, refreshed before each run: an editable install is not compiled by pip, and
# where PYTHONDONTWRITEBYTECODE is set (as on these machines) every process that imports raydist compiled it again.
# That variable only stops an import from writing the cache: Python still reads it, and compileall still writes it.
bytecode: setup
	@$(PY) -m compileall -q raydist examples tests

run: bytecode
	$(PY) jobs/sync.py $(ARGS)

test: bytecode
	$(PY) -m pytest -q -ra -n 2 --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

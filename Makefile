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
# uv (installed from PyPI into $(VENV)) downloads, unpacks and compiles on every core where pip uses one: the set-up
# is the one step of `make test` that leaves a core idle (docs/dev/testing.md). pip still picks torch, as its
# configuration says (local wheel directories, constraints), and uv installs that file. INSTALLER=pip installs
# with pip alone, as does any failure of uv.
INSTALLER ?= uv
UV := $(VENV)/bin/uv
WHEELS := $(VENV)/.torch-wheel
# Python's own cache of every package, for processes that may not write it (PYTHONDONTWRITEBYTECODE)
UV_INSTALL := $(UV) pip install --quiet --python $(PY) --compile-bytecode

.PHONY: setup bytecode lint run test test-min clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@torch=; $(PY) -c "import torch" 2>/dev/null || torch="$(TORCH)"; \
	  if [ "$(INSTALLER)" = uv ] && $(UV_SETUP); then rm -rf $(WHEELS); else rm -rf $(WHEELS); $(PIP_SETUP); fi; true
	@$(PY) -c "import torch" 2>/dev/null || { echo "raydist: error: could not install $(TORCH) into $(VENV)" >&2; exit 2; }
	@$(PY) -c "import raydist, ray, torch, yaml, sklearn" || { echo "raydist: error: set-up of $(VENV) failed" >&2; exit 2; }
	@touch $(STAMP)

# ($$torch: empty when an importable torch is kept.) No torch wheel, no uv: uv must not take one from PyPI on its own.
UV_SETUP = { test -x $(UV) || $(PIP) uv 2>&1 | grep -v "^WARNING: Location"; test -x $(UV); } && \
	{ test -z "$$torch" || { $(VENV)/bin/pip download --quiet --disable-pip-version-check --no-deps -d $(WHEELS) \
	  "$$torch" 2>&1 | grep -v "^WARNING: Location"; ls $(WHEELS)/*.whl >/dev/null 2>&1; }; } && \
	$(UV_INSTALL) $$(test -z "$$torch" || ls $(WHEELS)/*.whl) -e '.[test]' $(PINS)
PIP_SETUP = { test -z "$$torch" || $(PIP) "$$torch" 2>&1 | grep -v "^WARNING: Location"; true; } && \
	$(PY) -c "import torch" 2>/dev/null && { $(PIP) -e '.[test]' $(PINS) 2>&1 | grep -v "^WARNING: Location"; true; }

# raydist's own modules as bytecode, refreshed before each run: an editable install is not compiled by pip, and
# where PYTHONDONTWRITEBYTECODE is set (as on these machines) every process that imports raydist compiled it again.
# That variable only stops an import from writing the cache: Python still reads it, and compileall still writes it.
bytecode: setup
	@$(PY) -m compileall -q raydist examples tests

run: bytecode
	$(PY) jobs/sync.py $(ARGS)

# The one formatter and linter, configured in pyproject.toml: `$(VENV)/bin/ruff format .` fixes what the check finds.
lint: setup
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/ruff format --check --quiet .

test: bytecode lint
	$(PY) -m pytest -q -ra -n 2 --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

# The oldest Ray pyproject allows, in a virtual environment of its own: the version check, every private name
# raydist/private_api.py uses, a sync job, raydist launch against torchrun, and the SLURM bring-up (CI runs it
# after `make test`; docs/running.md#supported-versions).
RAY_MIN = $(shell sed -n 's/.*"ray\[train,default\]>=\([0-9.]*\),.*/\1/p' pyproject.toml)
MIN_TESTS = tests/test_versions.py \
	tests/test_architecture.py::test_every_private_name_raydist_uses_exists_in_the_installed_ray_and_torch \
	tests/test_sync_job.py::test_two_workers_reach_the_accuracy_threshold_on_digits \
	tests/test_launch.py::test_a_torchrun_script_trains_unmodified_to_torchruns_checksum \
	tests/test_ending.py \
	tests/test_slurm_cluster.py::test_every_node_joins_on_its_own_interface
test-min:
	@test -n "$(RAY_MIN)" || { echo "raydist: error: no ray lower bound in pyproject.toml" >&2; exit 2; }
	@$(MAKE) --no-print-directory bytecode VENV=.venv-min PINS="'ray[train,default]==$(RAY_MIN)'"
	.venv-min/bin/python -c "import ray; print('make test-min: ray', ray.__version__)"
	.venv-min/bin/python -m pytest -q -ra -p no:xdist $(MIN_TESTS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venv-min build *.egg-info

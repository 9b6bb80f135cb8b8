# Makefile - the two commands of the README and their helpers.
#   make run     set-up, then the main job: hpcdl train -n 4 on the digits data
#   make test    set-up, then every test (C tests under mpirun, then pytest)
#   make setup   MPI (Debian packages, as root), .venv, torch==2.13.0, hpcdl + test extras
#   make bench   the all-reduce benchmark (2 ranks)
# Variables: PYTHON (the interpreter for the venv), VENV, NP (ranks for make run).
PYTHON ?= python3
VENV ?= .venv
NP ?= 4
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip -q --disable-pip-version-check
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.hpcdl-installed
CORE_SOURCES := $(wildcard src_c/*.c src_c/*.h src_c/include/*.h src_c/python/*.c src_c/cuda/*) setup.py pyproject.toml

.PHONY: setup run test test-c test-py bench clean check-python check-mpi

setup: check-python check-mpi $(STAMP)
	@echo "✓ setup complete ($(VENV), hpcdl $$($(PY) -c 'import hpcdl; print(hpcdl.__version__)'))"

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || \
	  { echo "✗ hpcdl needs Python >= 3.10; $(PYTHON) is $$($(PYTHON) --version 2>&1). Set PYTHON=python3.11 (or load a newer module)."; exit 1; }

# Open MPI from Debian's packages when we may install them; otherwise say what to do.
check-mpi:
	@if command -v mpicc >/dev/null 2>&1; then \
	  echo "✓ MPI: $$(command -v mpicc)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "… installing Open MPI (apt-get install openmpi-bin libopenmpi-dev)"; \
	  (apt-get install -y -q openmpi-bin libopenmpi-dev >/dev/null 2>&1 || \
	   { apt-get update -q >/dev/null && apt-get install -y -q openmpi-bin libopenmpi-dev >/dev/null; }) && \
	  echo "✓ MPI: $$(command -v mpicc)"; \
	else \
	  echo "✗ no mpicc on PATH. Debian/Ubuntu: sudo apt-get install openmpi-bin libopenmpi-dev;"; \
	  echo "  clusters: module load openmpi (or your site's MPI); or set MPICC=/path/to/mpicc"; \
	  exit 1; \
	fi

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# torch first, pinned: a plain 'torch' requirement would pull GBs of CUDA wheels
$(STAMP): $(VENV)/bin/python $(CORE_SOURCES)
	@$(PY) -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null || \
	  { echo "… installing $(TORCH_PIN)"; $(PIP) install $(TORCH_PIN); }
	@$(PIP) install "setuptools>=64" wheel mpi4py
	@echo "… building hpcdl (C core through mpicc)"
	@$(VENV)/bin/pip --disable-pip-version-check install -v --no-build-isolation -e '.[test]' > $(VENV)/build.log 2>&1 || \
	  { tail -40 $(VENV)/build.log; echo "✗ hpcdl did not build; full log: $(VENV)/build.log"; exit 1; }
	@grep "hpcdl build:" $(VENV)/build.log | sed 's/^ *//' | sort -u
	@$(PY) -c 'import hpcdl._core' || { echo "✗ hpcdl._core does not import; see $(VENV)/build.log"; exit 1; }
	@touch $(STAMP)

run: setup
	$(VENV)/bin/hpcdl train -n $(NP)

test: setup test-c test-py

test-c: check-mpi
	$(MAKE) -C src_c check

test-py: setup
	$(PY) -m pytest -ra -q tests

bench: setup
	$(VENV)/bin/hpcdl bench allreduce -n 2

clean:
	$(MAKE) -C src_c clean
	rm -rf build *.egg-info hpcdl/*.so $(STAMP)

# Makefile - the two commands of the README and their helpers.
#   make run     set-up, then the main job: hpcdl train -n 4 on the digits data
#   make test    set-up, then every test (C tests under mpirun, then pytest; Slurm
#                from Debian's packages for the tests against a real Slurm)
#   make setup   MPI (Debian packages, as root), .venv, torch==2.13.0, hpcdl + test extras
#   make bench   the all-reduce benchmark (2 ranks)
# Variables: PYTHON (the interpreter for the venv), VENV, NP (ranks for make run),
#   HPCDL_H5PY_MPI=1: also replace the venv's serial h5py by one built against parallel
#   HDF5 (driver='mpio', collective writes of hpcdl data shard); `make test` builds it
#   in the background while the C tests run. CI sets it.
PYTHON ?= python3
VENV ?= .venv
NP ?= 4
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip -q --disable-pip-version-check
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.hpcdl-installed
HPCDL_H5PY_MPI ?= 0
H5PY_MPI_STAMP := $(VENV)/.h5py-mpi
H5PY_MPI_LOG := $(VENV)/h5py-mpi.log
HDF5_MPI_INCLUDEDIR ?= /usr/include/hdf5/openmpi
HDF5_MPI_LIBDIR ?= /usr/lib/$(shell gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)/hdf5/openmpi
CORE_SOURCES := $(wildcard src_c/*.c src_c/*.h src_c/include/*.h src_c/python/*.c src_c/cuda/*) setup.py pyproject.toml

.PHONY: setup setup-base h5py-mpi run test test-c test-py bench clean check-python check-mpi check-slurm

setup: setup-base $(if $(filter 1,$(HPCDL_H5PY_MPI)),h5py-mpi)

setup-base: check-python check-mpi $(STAMP)
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

# Slurm for the tests against a real one (tests/slurm_cluster.py starts its own
# munged, slurmctld and slurmd): Debian's packages when we may install them;
# otherwise those tests skip (and fail where CI=true or HPCDL_REQUIRE_SLURM=1).
check-slurm:
	@if command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then \
	  echo "✓ Slurm: $$(slurmctld -V)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "… installing Slurm (apt-get install slurm-wlm munge)"; \
	  { apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && apt-get install -y -q slurm-wlm munge >/dev/null; }; } && \
	  echo "✓ Slurm: $$(slurmctld -V)" || \
	  echo "✗ could not install Slurm: the tests against a real Slurm will skip"; \
	else \
	  echo "✗ no Slurm (slurmctld, munged): the tests against a real Slurm will skip."; \
	  echo "  Debian/Ubuntu, as root: apt-get install slurm-wlm munge"; \
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

# With HPCDL_H5PY_MPI=1 the parallel h5py (about 4 min of CPU) builds while the C
# tests run, at low priority (nice) so that their timed launches keep the cores they
# need; pytest needs the build, so it starts after both.
test: setup-base
ifeq ($(HPCDL_H5PY_MPI),1)
	@echo "… building parallel h5py in the background while the C tests run (log: $(H5PY_MPI_LOG))"
	@nice -n 10 $(MAKE) --no-print-directory h5py-mpi > $(H5PY_MPI_LOG) 2>&1 & build=$$!; \
	  $(MAKE) --no-print-directory test-c; tests=$$?; \
	  wait $$build; built=$$?; grep -a '^[✓✗]' $(H5PY_MPI_LOG); \
	  [ $$built = 0 ] || { tail -30 $(H5PY_MPI_LOG); exit 1; }; exit $$tests
else
	@$(MAKE) --no-print-directory test-c
endif
	@$(MAKE) --no-print-directory test-py

# h5py against Debian's parallel HDF5, same h5py version as the serial one it
# replaces. Skipped when the venv's h5py already has MPI.
h5py-mpi: $(H5PY_MPI_STAMP)

$(H5PY_MPI_STAMP): $(STAMP)
	@if $(PY) -c 'import h5py, sys; sys.exit(0 if h5py.get_config().mpi else 1)' 2>/dev/null; then \
	  echo "✓ h5py with MPI: already in $(VENV)"; \
	else \
	  if [ ! -f $(HDF5_MPI_INCLUDEDIR)/H5pubconf.h ]; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      echo "… installing parallel HDF5 (apt-get install libhdf5-openmpi-dev)"; \
	      { apt-get install -y -q libhdf5-openmpi-dev >/dev/null 2>&1 || \
	        { apt-get update -q >/dev/null && apt-get install -y -q libhdf5-openmpi-dev >/dev/null; }; } || exit 1; \
	    else \
	      echo "✗ no parallel HDF5 in $(HDF5_MPI_INCLUDEDIR). Debian/Ubuntu: sudo apt-get install"; \
	      echo "  libhdf5-openmpi-dev; clusters: module load hdf5/parallel and set HDF5_MPI_INCLUDEDIR"; \
	      echo "  and HDF5_MPI_LIBDIR; or leave HPCDL_H5PY_MPI unset (serial h5py)"; exit 1; \
	    fi; \
	  fi; \
	  version=$$($(PY) -c 'import h5py; print(h5py.__version__)'); \
	  echo "… building h5py $$version against parallel HDF5 (about 4 min of CPU)"; \
	  $(PIP) install "cython>=3,<4" pkgconfig "setuptools>=64" wheel && \
	  CC=mpicc HDF5_MPI=ON HDF5_INCLUDEDIR=$(HDF5_MPI_INCLUDEDIR) HDF5_LIBDIR=$(HDF5_MPI_LIBDIR) \
	    $(VENV)/bin/pip --disable-pip-version-check install --no-binary=h5py --no-build-isolation \
	    --no-deps --force-reinstall "h5py==$$version" > $(VENV)/h5py-mpi-build.log 2>&1 || \
	    { tail -30 $(VENV)/h5py-mpi-build.log; echo "✗ parallel h5py did not build; log: $(VENV)/h5py-mpi-build.log"; exit 1; }; \
	  $(PY) -c 'import h5py, sys; sys.exit(0 if h5py.get_config().mpi else 1)' || \
	    { echo "✗ the new h5py has no MPI support; log: $(VENV)/h5py-mpi-build.log"; exit 1; }; \
	  echo "✓ h5py $$version with MPI (parallel HDF5 from $(HDF5_MPI_LIBDIR))"; \
	fi
	@touch $@

test-c: check-mpi
	$(MAKE) -C src_c check

test-py: setup check-slurm
	$(PY) -m pytest -ra -q tests

bench: setup
	$(VENV)/bin/hpcdl bench allreduce -n 2

clean:
	$(MAKE) -C src_c clean
	rm -rf build *.egg-info hpcdl/*.so $(STAMP)

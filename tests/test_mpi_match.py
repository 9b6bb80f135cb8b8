"""test_mpi_match.py - one MPI for the C core and mpi4py (issue #16).

Without MPI: the build's probe names the wrapper's MPI (and refuses a compiler
that is not an MPI wrapper, in one line), nvcc gets each wrapper's include
flags, a core and an mpi4py of different families give one error line naming
both and the fix, the launcher of the core's MPI is found beside its wrapper.

With two real builds (what `make test-mpich` sets up: this checkout's core and
mpi4py on one MPI, $HPCDL_TEST_OTHER_PYTHON an interpreter whose mpi4py is on
the other MPI, $HPCDL_TEST_OTHER_TREE a checkout whose core is built against
the other MPI): both crossed combinations end with that error on every rank,
never a segmentation fault, and the matching one runs a collective.
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from hpcdl.utils import mpi_info
from mpi_harness import REPO, run_mpi

OTHER_PYTHON = os.environ.get("HPCDL_TEST_OTHER_PYTHON")
OTHER_TREE = os.environ.get("HPCDL_TEST_OTHER_TREE")
WRAPPERS = [w for w in ("mpicc", "mpicc.openmpi", "mpicc.mpich") if shutil.which(w)]

OMPI_LIB = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4"
MPICH_LIB = "MPICH Version: 4.0.2"


@pytest.fixture(scope="module")
def setup_py():
    spec = importlib.util.spec_from_file_location("hpcdl_setup", os.path.join(REPO, "setup.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # not __main__: defines functions, builds nothing
    return mod


# ---------------------------------------------------------------- naming an MPI
@pytest.mark.parametrize("text,family", [
    (OMPI_LIB, "openmpi"), ("IBM Spectrum MPI 10.4", "openmpi"), (MPICH_LIB, "mpich"),
    ("Intel(R) MPI Library 2021.10 for Linux* OS", "mpich"),
    ("MVAPICH2 Version      :\t2.3.7", "mpich"), ("MPI VERSION : CRAY MPICH version 8.1", "mpich"),
    ("HYDRA build details:", "mpich"), ("", "unknown"), ("Some MPI 1.0", "unknown")])
def test_family_of_library_strings(text, family):
    assert mpi_info.family(text) == family


def test_first_line_drops_padding_and_nul():
    assert mpi_info.first_line("MPICH Version:      4.0.2\nMPICH Release date: x") == MPICH_LIB
    assert mpi_info.first_line(OMPI_LIB + "\x00") == OMPI_LIB


def core(family, library, mpicc):
    return {"family": family, "library": library, "mpicc": mpicc, "mpicc_real": mpicc}


def test_mismatch_names_both_libraries_and_the_fix():
    msg = mpi_info.mismatch(core("mpich", MPICH_LIB, "/usr/bin/mpicc.mpich"),
                            {"family": "openmpi", "library": OMPI_LIB, "mpicc": None})
    assert "\n" not in msg
    assert MPICH_LIB in msg and OMPI_LIB in msg and "MPICH family" in msg and "Open MPI" in msg
    assert ("MPICC=/usr/bin/mpicc.mpich pip install --no-binary=mpi4py --no-cache-dir "
            "--force-reinstall mpi4py") in msg
    assert "make setup MPICC=/usr/bin/mpicc.mpich" in msg


def test_same_family_or_unknown_is_no_mismatch():
    intel = {"family": "mpich", "library": "Intel(R) MPI Library 2021", "mpicc": None}
    assert mpi_info.mismatch(core("mpich", MPICH_LIB, "mpicc.mpich"), intel) is None
    other = {"family": "unknown", "library": "Some MPI", "mpicc": None}
    assert mpi_info.mismatch(core("openmpi", OMPI_LIB, "mpicc"), other) is None
    assert mpi_info.mismatch(None, intel) is None


def test_check_same_mpi_raises_before_any_core_call(monkeypatch):
    class FakeMPI:  # only what check_same_mpi may touch: no communicator, no init
        @staticmethod
        def Get_library_version():
            return OMPI_LIB + "\x00"
    monkeypatch.setattr(mpi_info, "core_mpi", lambda: core("mpich", MPICH_LIB, "mpicc.mpich"))
    with pytest.raises(mpi_info.MPIMismatchError, match="MPI mismatch"):
        mpi_info.check_same_mpi(FakeMPI)
    monkeypatch.setattr(mpi_info, "core_mpi", lambda: core("openmpi", OMPI_LIB, "mpicc"))
    mpi_info.check_same_mpi(FakeMPI)


def test_this_core_names_its_mpi():
    rec = mpi_info.core_mpi()
    assert rec is not None and rec["family"] in ("openmpi", "mpich"), rec


# ---------------------------------------------------------------- the launcher
def test_launcher_beside_the_wrapper():
    assert mpi_info.launchers_beside("/usr/bin/mpicc.mpich") == [
        "/usr/bin/mpiexec.mpich", "/usr/bin/mpirun.mpich"]
    assert mpi_info.launchers_beside("/opt/mpi/bin/mpicc") == [
        "/opt/mpi/bin/mpiexec", "/opt/mpi/bin/mpirun"]


@pytest.mark.skipif(not shutil.which("mpiexec.mpich"), reason="no MPICH (mpich package)")
def test_core_launcher_of_an_mpich_core(monkeypatch):
    monkeypatch.setattr(mpi_info, "core_mpi",
                        lambda: core("mpich", MPICH_LIB, shutil.which("mpicc.mpich")))
    assert mpi_info.core_launcher() == (shutil.which("mpiexec.mpich"), "mpich")
    msg = mpi_info.launcher_mismatch("/usr/bin/mpirun", "openmpi")
    assert "HPCDL_MPIRUN" in msg and "MPICH" in msg and "Open MPI" in msg and "\n" not in msg
    assert mpi_info.launcher_mismatch("/usr/bin/mpiexec.mpich", "mpich") is None


def test_hydra_line_has_no_open_mpi_flags():
    from hpcdl.cli.run import mpirun_command
    line = mpirun_command(8, ["x"], launcher=("/usr/bin/mpiexec.mpich", "mpich"))
    assert line == ["/usr/bin/mpiexec.mpich", "-n", "8", "x"]


# ---------------------------------------------------------------- the build
@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_probe_names_the_wrappers_mpi(setup_py, wrapper, tmp_path):
    probe = setup_py.probe_mpi(shutil.which(wrapper), str(tmp_path))
    want = "mpich" if wrapper.endswith("mpich") else mpi_info.family(probe["library"])
    assert probe["family"] == want != "unknown", probe
    assert mpi_info.family(probe["library"]) == probe["family"]


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_nvcc_gets_the_wrappers_include_dir(setup_py, wrapper):
    flags = setup_py.mpi_compile_flags(shutil.which(wrapper))
    dirs = [f[2:] for f in flags if f.startswith("-I")]
    assert all(f.startswith(("-I", "-D")) for f in flags), flags
    assert any(os.path.isfile(os.path.join(d, "mpi.h")) for d in dirs) or not dirs, flags


def test_compiler_that_is_not_mpi_is_refused_in_one_line(setup_py, tmp_path):
    with pytest.raises(SystemExit) as e:
        setup_py.probe_mpi(shutil.which("gcc") or shutil.which("cc"), str(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg and "is not an MPI C compiler wrapper" in msg and "MPICC=" in msg


def test_make_setup_refuses_a_plain_compiler():
    if not shutil.which("make"):
        pytest.skip("no make")
    r = subprocess.run(["make", "-s", "--no-print-directory", "check-mpi", "MPICC=gcc"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in (r.stdout + r.stderr).strip().splitlines()
             if not ln.startswith("make")]  # make's own "*** Error 1" line
    assert r.returncode != 0 and len(lines) == 1, r.stdout + r.stderr
    assert "MPICC=gcc is not an MPI C compiler wrapper" in lines[0]


# ---------------------------------------------------------------- two real builds
peers = pytest.mark.skipif(not (OTHER_PYTHON and OTHER_TREE),
                           reason="needs a build on the other MPI: run through make test-mpich")

CHECK = ("import sys; sys.path.insert(0, %r); from hpcdl import comm; comm.init(); "
         "import numpy as np; x = np.arange(5, dtype=np.float64) * (comm.rank() + 1); "
         "comm.allreduce(x); s = comm.size() * (comm.size() + 1) / 2; "
         "assert (x == np.arange(5) * s).all(), x; sys.stdout.write('SUM OK\\n')")


def assert_mismatch_everywhere(r, core_name, mpi4py_name):
    assert r.returncode != 0, r.stdout
    assert "Segmentation fault" not in r.stdout and "signal 11" not in r.stdout, r.stdout
    lines = [ln for ln in r.stdout.splitlines() if "MPIMismatchError: MPI mismatch" in ln]
    assert lines, r.stdout  # every rank says it, unless the launcher ended it first
    assert "C core was built against %s" % core_name in lines[0], lines[0]
    assert "mpi4py loaded %s" % mpi4py_name in lines[0], lines[0]
    assert "pip install --no-binary=mpi4py" in lines[0]


@pytest.mark.mpi
def test_matching_build_runs_a_collective():
    r = run_mpi(2, [sys.executable, "-c", CHECK % REPO], timeout=90)
    assert r.returncode == 0 and r.stdout.count("SUM OK") == 2, r.stdout


@peers
@pytest.mark.mpi
def test_core_of_this_mpi_with_mpi4py_of_the_other():
    here = mpi_info.FAMILY_NAMES[mpi_info.core_mpi()["family"]]
    r = run_mpi(2, [OTHER_PYTHON, "-c", CHECK % REPO], timeout=90)
    other = "Open MPI" if here != "Open MPI" else "MPICH family"
    assert_mismatch_everywhere(r, here, other)


@peers
@pytest.mark.mpi
def test_core_of_the_other_mpi_with_mpi4py_of_this():
    here = mpi_info.FAMILY_NAMES[mpi_info.core_mpi()["family"]]
    r = run_mpi(2, [sys.executable, "-c", CHECK % OTHER_TREE], timeout=90)
    other = "Open MPI" if here != "Open MPI" else "MPICH family"
    assert_mismatch_everywhere(r, other, here)


# ---------------------------------------------------------------- no MPI_THREAD_MULTIPLE
@pytest.mark.mpi
def test_without_thread_multiple_one_warning_line_and_collectives_work():
    # MPI started below 'multiple' (as an MPI without it would): hpcdl says what is
    # missing and the fix in one line on rank 0, and its serialised engine still works
    code = ("import mpi4py; mpi4py.rc.thread_level = 'serialized'; from mpi4py import MPI; "
            + CHECK % REPO + "; assert comm.thread_level() == 'serialized'")
    r = run_mpi(2, [sys.executable, "-c", code], timeout=90)
    assert r.returncode == 0 and r.stdout.count("SUM OK") == 2, r.stdout
    lines = [ln for ln in r.stdout.splitlines() if "MPI_THREAD_MULTIPLE" in ln]
    assert len(lines) == 1 and lines[0].startswith("[rank 0] warning:"), r.stdout
    assert "'serialized'" in lines[0] and "Fix:" in lines[0] and "--enable-threads=multiple" in lines[0]


# ---------------------------------------------------------------- hpcdl info
def info(python):
    return subprocess.run([python, "-m", "hpcdl", "info"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_info_shows_both_libraries():
    r = info(sys.executable)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = dict(m.groups() for m in map(re.compile(r"(MPI library \(\w+\))\s+(.*)").match,
                                        r.stdout.splitlines()) if m)
    assert set(rows) == {"MPI library (mpi4py)", "MPI library (core)"}, r.stdout
    assert "MISMATCH" not in r.stdout
    assert mpi_info.family(rows["MPI library (mpi4py)"]) == mpi_info.core_mpi()["family"]


@peers
def test_info_says_mismatch_plainly():
    r = info(OTHER_PYTHON)  # this checkout's core, the other MPI's mpi4py
    assert r.returncode == 1, r.stdout + r.stderr
    assert "(MISMATCH)" in r.stdout and "\nMISMATCH: MPI mismatch:" in r.stdout, r.stdout

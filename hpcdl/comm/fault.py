"""fault.py - which way a job survives a lost rank on this MPI, asked without
starting MPI: ULFM (MPI's own fault tolerance: Open MPI 5 built with its
ftmpi extension, the job started with `mpiexec --with-ft ulfm`; the survivors
go on inside the same processes, Communicator.shrink) or restart (any other
MPI: the job ends and `hpcdl run --min-np` starts it again from the last
commit). docs/fault-tolerance.md says what survives what.

    launcher_ulfm(path)  -> None, or why the launcher's MPI has no ULFM (one line)
    in_force()           -> True inside a job started with ULFM on
    path_line(size)      -> the one log line saying which path is in force
"""
import functools
import os
import re
import subprocess

ULFM_FLAGS = ["--with-ft", "ulfm"]  # Open MPI 5's mpiexec: ULFM on for this job


@functools.lru_cache(maxsize=None)
def launcher_ulfm(path):
    """None when the launcher at path is Open MPI >= 5 whose ompi_info (beside
    it) reports ULFM (ft_mpi_support); else the reason, in words."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return "its launcher %s did not run (%s)" % (path, e)
    m = re.search(r"\((?:Open MPI|OpenRTE)\) (\d+)\.(\d+)\.?(\d*)", text)
    if not m:
        first = text.strip().splitlines()[0] if text.strip() else "unknown"
        return "its launcher %s is not Open MPI's (%s)" % (path, first)
    version = ".".join(g for g in m.groups() if g)
    if int(m.group(1)) < 5:
        return "its launcher %s is Open MPI %s (ULFM came with Open MPI 5)" % (path, version)
    ompi_info = os.path.join(os.path.dirname(path), "ompi_info")
    try:
        out = subprocess.run([ompi_info, "--parsable"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    if "ft_mpi_support:yes" not in out and "mpiext:ftmpi" not in out:
        return "Open MPI %s at %s was built without ULFM (ompi_info: no ft_mpi_support)" % (
            version, os.path.dirname(path))
    return None


def in_force(env=None):
    """True inside a job whose launcher turned ULFM on (mpiexec --with-ft ulfm
    sets OMPI_MCA_mpi_ft_enable for every rank). Needs no MPI."""
    v = (env if env is not None else os.environ).get("OMPI_MCA_mpi_ft_enable", "")
    return v.lower() in ("1", "true", "yes", "enabled")


def core_ulfm():
    """True when the C core was compiled against an MPI with ULFM (loads the
    core, and so MPI)."""
    from .. import _core
    return bool(_core.built_with_ulfm())


def path_line(size):
    """The one line saying how this job survives a lost rank, for rank 0's log."""
    if in_force() and core_ulfm():
        return ("fault tolerance: ULFM in force (%d ranks): a lost rank is a RanksLostError "
                "on every survivor, which can go on in these processes (Communicator.shrink)"
                % size)
    why = ("the core was built without ULFM" if in_force() else
           "the job was not started with ULFM (hpcdl run --fault-tolerant, Open MPI 5)")
    return ("fault tolerance: restart path (%s): a lost rank ends the job; hpcdl run "
            "--min-np starts it again from the last commit" % why)

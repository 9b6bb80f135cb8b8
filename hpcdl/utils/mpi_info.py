"""mpi_info.py - which MPI hpcdl runs on: the one the C core was compiled
against (recorded by setup.py in hpcdl/_mpi_build.py when it built the core),
the one mpi4py loaded, and the launcher of the core's MPI installation.

Open MPI and the MPICH family (MPICH, Intel MPI, MVAPICH, Cray MPICH, which
share one ABI) are not interchangeable: their handles differ in type and size,
so a core compiled against one and handed mpi4py's communicator from the
other crashes at its first MPI call. check_same_mpi() turns that into an
error naming both libraries and the fix, before the core is even imported
(importing hpcdl.comm calls it).

Standard library only, no MPI at import: the CLI asks it for the launcher
without starting MPI.
"""
import ast
import functools
import importlib.util
import os
import subprocess

import mpi4py

FAMILY_NAMES = {"openmpi": "Open MPI", "mpich": "MPICH family", "unknown": "unknown MPI"}


class MPIMismatchError(RuntimeError):
    """The core and mpi4py are built against different MPI libraries."""


def family(text):
    """'openmpi' | 'mpich' | 'unknown' from a library version string
    (MPI_Get_library_version) or a launcher's --version text."""
    t = (text or "").lower()
    if "open mpi" in t or "openrte" in t or "spectrum mpi" in t:
        return "openmpi"
    if "mpich" in t or "mvapich" in t or "intel(r) mpi" in t or "hydra" in t:
        return "mpich"
    return "unknown"


def first_line(library_version):
    """'MPICH Version:   4.0.2\\n...' -> 'MPICH Version: 4.0.2'."""
    lines = (library_version or "").replace("\x00", "").strip().splitlines()
    return " ".join(lines[0].split()) if lines else ""


# ---------------------------------------------------------------- the two sides
def core_mpi():
    """What the build recorded about the core's MPI: dict(family, library,
    mpicc, mpicc_real), from the _mpi_build.py beside the core that `import
    hpcdl._core` would load (never another install's). A core built before
    the build recorded it is named by the MPI library it links (no wrapper
    known). None without a core."""
    try:
        spec = importlib.util.find_spec("hpcdl._core")  # finds, does not load
    except ImportError:
        return None
    if spec is None or not spec.origin:
        return None
    record = os.path.join(os.path.dirname(spec.origin), "_mpi_build.py")
    try:
        with open(record) as f:
            tree = ast.parse(f.read(), record)
    except (OSError, SyntaxError, ValueError):
        return _core_from_linked_library(spec.origin)
    values = {t.id: ast.literal_eval(node.value) for node in tree.body
              if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    return {"family": values.get("FAMILY", "unknown"), "library": values.get("LIBRARY", "?"),
            "mpicc": values.get("MPICC"), "mpicc_real": values.get("MPICC_REAL")}


# sonames that name a family without doubt (libmpi.so.12 is MPICH's, Intel's
# and Open MPI 1.10's: not here)
_SONAMES = {b"libmpi.so.40": "openmpi", b"libmpi.so.20": "openmpi", b"libmpich.so.12": "mpich",
            b"libmpi_cray.so.12": "mpich", b"libmpich.so.0": "mpich"}


def _core_from_linked_library(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    for soname, fam in _SONAMES.items():
        if soname + b"\x00" in data:
            return {"family": fam, "library": "%s (the core links %s)"
                    % (FAMILY_NAMES[fam], soname.decode()), "mpicc": None, "mpicc_real": None}
    return None


def mpi4py_mpi(MPI):
    """dict(family, library, mpicc) of the MPI that mpi4py loaded (MPI: the
    mpi4py.MPI module; Get_library_version needs no MPI_Init)."""
    library = first_line(MPI.Get_library_version())
    try:
        mpicc = (mpi4py.get_config() or {}).get("mpicc")
    except Exception:  # a config-less build (the registry's wheel)
        mpicc = None
    return {"family": family(library), "library": library, "mpicc": mpicc}


def fix_hint(core):
    """The one command that makes mpi4py use the core's MPI."""
    mpicc = core.get("mpicc") or "<your MPI's mpicc>"
    return ("MPICC=%s pip install --no-binary=mpi4py --no-cache-dir --force-reinstall mpi4py "
            "(or: make setup MPICC=%s)" % (mpicc, mpicc))


def mismatch(core, py):
    """The error line for a core and an mpi4py on different MPIs; None when
    they agree or either side is unknown (an MPI this module cannot name)."""
    if core is None or "unknown" in (core["family"], py["family"]) or \
            core["family"] == py["family"]:
        return None
    return ("MPI mismatch: hpcdl's C core was built against %s (%s; wrapper %s) but mpi4py "
            "loaded %s (%s); one process cannot use two MPIs, and the core would crash at "
            "its first MPI call. Fix: build mpi4py against the core's MPI: %s; or rebuild "
            "hpcdl with the MPICC of mpi4py's MPI"
            % (FAMILY_NAMES[core["family"]], core["library"], core["mpicc"],
               FAMILY_NAMES[py["family"]], py["library"], fix_hint(core)))


def check_same_mpi(MPI=None):
    """Raises MPIMismatchError when the core and mpi4py's MPI (the mpi4py.MPI
    module; imported here when None) differ. Call it before the core is
    imported: a core built against mpi4py on another MPI may already fail to
    import ("mpi4py.MPI.Datatype size changed"), or crash at its first call."""
    if MPI is None:
        from mpi4py import MPI  # on use: loads MPI
    msg = mismatch(core_mpi(), mpi4py_mpi(MPI))
    if msg:
        raise MPIMismatchError(msg)


# ---------------------------------------------------------------- the launcher
@functools.lru_cache(maxsize=None)
def launcher_flavour(path):
    """'openmpi' | 'mpich' | 'unknown' from the launcher's --version."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    if "Open MPI" in text or "OpenRTE" in text:
        return "openmpi"
    if "HYDRA" in text or "MPICH" in text or "Intel" in text:
        return "mpich"
    return "unknown"


def launchers_beside(mpicc):
    """mpiexec / mpirun of the same installation as the wrapper mpicc: same
    folder, same suffix (Debian's mpicc.mpich -> mpiexec.mpich)."""
    folder, base = os.path.split(mpicc)
    suffix = base[len("mpicc"):] if base.startswith("mpicc") else ""
    return [os.path.join(folder, name + suffix) for name in ("mpiexec", "mpirun")]


def core_launcher():
    """(path, flavour) of the launcher of the MPI the core was built against,
    or None (nothing recorded, or no launcher of that MPI beside its wrapper)."""
    core = core_mpi()
    if core is None or core["family"] == "unknown":
        return None
    seen = []
    for mpicc in filter(None, (core["mpicc"], core["mpicc_real"])):
        for path in launchers_beside(mpicc):
            if path in seen or not (os.path.isfile(path) and os.access(path, os.X_OK)):
                continue
            seen.append(path)
            if launcher_flavour(path) == core["family"]:
                return path, core["family"]
    return None


def launcher_mismatch(path, flavour):
    """The error line when launcher path (of flavour) belongs to another MPI
    than the core; None when they agree or either is unknown."""
    core = core_mpi()
    if core is None or "unknown" in (core["family"], flavour) or core["family"] == flavour:
        return None
    return ("the launcher %s is %s's but hpcdl's core is built against %s (%s); ranks "
            "started by it could not talk to each other. Fix: set HPCDL_MPIRUN to the "
            "mpiexec of %s (beside %s), or rebuild hpcdl with that launcher's MPICC"
            % (path, FAMILY_NAMES[flavour], FAMILY_NAMES[core["family"]], core["library"],
               FAMILY_NAMES[core["family"]], core["mpicc"]))


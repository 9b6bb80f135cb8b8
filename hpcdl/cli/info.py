"""info.py - `hpcdl info`: versions, the MPI library (the one mpi4py loaded and
the one the C core was built against: MISMATCH when they differ), CUDA support
and the path device tensors take, and the Slurm allocation, so a user (or a bug
report) sees the whole stack at once."""
import json
import os
import platform
import re

from .._version import __version__
from ..utils import mpi_info


def _version(module):
    try:
        mod = __import__(module)
        return getattr(mod, "__version__", "installed")
    except Exception as e:  # report, never crash: info is for broken setups too
        return "not available (%s)" % type(e).__name__


def _c_atoi(text):
    """C's atoi: the leading integer, 0 when there is none (as the core reads it)."""
    m = re.match(r"\s*([+-]?\d+)", text)
    return int(m.group(1)) if m else 0


def device_path(core_cuda, mpi_cuda_aware, env=os.environ):
    """The path CUDA tensors' all-reduce takes, and why: (inside a node, across
    nodes), one line each. Mirrors src_c/cuda/ (cuda_ipc.c's HPCDL_CUDA_IPC,
    cuda_support.c's CUDA-awareness); the ranks' layout is the job's, so both
    are said."""
    if not core_cuda:
        return ("none: the C core was built without CUDA (device tensors are refused)",) * 2
    aware_env = env.get("HPCDL_MPI_CUDA_AWARE", "")
    why = ("HPCDL_MPI_CUDA_AWARE=%s" % aware_env if aware_env else
           "MPIX_Query_cuda_support() says %s" % ("yes" if mpi_cuda_aware else "no or cannot say"))
    across = ("GPU-direct: device pointers to MPI (%s)" if mpi_cuda_aware else
              "staged through pinned host memory (%s)") % why
    ipc_env = env.get("HPCDL_CUDA_IPC", "")
    if ipc_env and _c_atoi(ipc_env) == 0:
        return "as across nodes (HPCDL_CUDA_IPC=%s)" % ipc_env, across
    inside = ("CUDA IPC, each rank reading its peers' device memory, no host copy "
              "(HPCDL_CUDA_IPC%s; checked on the fake runtime only, not yet run on a GPU)"
              % ("=" + ipc_env if ipc_env else " unset"))
    return inside, across


def collect():
    info = {"hpcdl": __version__, "python": platform.python_version(),
            "cores": os.cpu_count()}
    core_mpi = mpi_info.core_mpi()
    info["core_mpi_library"] = core_mpi["library"] if core_mpi else "unknown (no core built)"
    info["core_mpicc"] = core_mpi and core_mpi["mpicc"]
    info["mpi_mismatch"] = None
    try:
        from mpi4py import MPI
        mpi4py_mpi = mpi_info.mpi4py_mpi(MPI)
        info["mpi_library"] = mpi4py_mpi["library"]  # the one mpi4py loaded
        info["mpi_standard"] = "%d.%d" % MPI.Get_version()
        info["mpi_mismatch"] = mpi_info.mismatch(core_mpi, mpi4py_mpi)
    except Exception as e:
        info["mpi_library"] = "not available (%s)" % e
    info["mpi4py"] = _version("mpi4py")
    info["numpy"] = _version("numpy")
    info["torch"] = _version("torch")
    info["h5py"] = _version("h5py")
    try:
        import h5py
        info["h5py_mpi"] = bool(h5py.get_config().mpi)
    except Exception:
        info["h5py_mpi"] = False
    try:
        if info["mpi_mismatch"]:  # the core may not even import beside this mpi4py
            raise ImportError("built against another MPI than mpi4py's")
        from .. import _core
        info["core_built"] = True
        info["core_cuda"] = bool(_core.built_with_cuda())
        info["mpi_cuda_aware"] = bool(_core.mpi_cuda_aware())
        info["ulfm"] = bool(getattr(_core, "built_with_ulfm", bool)())
        info["device_path_node"], info["device_path_across"] = device_path(
            info["core_cuda"], info["mpi_cuda_aware"])
    except Exception as e:  # ImportError, or mpi4py's "size changed" ValueError
        info["core_built"] = "no (%s)" % e
    info["slurm_job"] = os.environ.get("SLURM_JOB_ID")
    if info["slurm_job"]:
        info["slurm_nodes"] = os.environ.get("SLURM_JOB_NUM_NODES")
        info["slurm_ntasks"] = os.environ.get("SLURM_NTASKS")
    return info


def run(args):
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    yes = lambda v: "yes" if v is True else ("no" if v is False else str(v))
    rows = [("hpcdl", info["hpcdl"]), ("python", info["python"]),
            ("MPI library (mpi4py)", info["mpi_library"]),
            ("MPI library (core)", info["core_mpi_library"] + (
                " (MISMATCH)" if info["mpi_mismatch"] else "")),
            ("MPI standard", info.get("mpi_standard", "-")),
            ("mpi4py", info["mpi4py"]), ("numpy", info["numpy"]), ("torch", info["torch"]),
            ("h5py", info["h5py"]), ("h5py with MPI", yes(info["h5py_mpi"])),
            ("C core built", yes(info["core_built"])),
            ("core built with CUDA", yes(info.get("core_cuda", False))),
            ("MPI CUDA-aware", yes(info.get("mpi_cuda_aware", False))),
            ("fault tolerance", "ULFM (a lost rank: RanksLostError, shrink; hpcdl run "
             "--fault-tolerant)" if info.get("ulfm") else "no ULFM in this MPI: a lost "
             "rank ends the job (restart path: hpcdl run --min-np)"),
            ("device tensors, in a node", info.get("device_path_node", "-")),
            ("device tensors, across", info.get("device_path_across", "-")),
            ("cores", str(info["cores"])),
            ("Slurm allocation", "job %s, %s nodes, %s tasks" % (
                info["slurm_job"], info.get("slurm_nodes"), info.get("slurm_ntasks"))
             if info["slurm_job"] else "none")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print("%-*s  %s" % (width, k, v))
    if info["mpi_mismatch"]:
        print("MISMATCH: " + info["mpi_mismatch"])
        return 1
    return 0


def register(sub):
    p = sub.add_parser("info", help="versions, MPI library, CUDA and Slurm status",
                       description="Print hpcdl's version, the MPI library, mpi4py / torch "
                                   "/ h5py versions, CUDA support and the Slurm allocation.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)

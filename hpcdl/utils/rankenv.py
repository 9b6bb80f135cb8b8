"""rankenv.py - torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE) for ranks started by `hpcdl run` / `hpcdl train`, taken from
the launcher's own per-rank variables, so scripts written for torchrun read
the same numbers hpcdl.comm gets from MPI.

`hpcdl run` starts every rank as `python -I -S rankenv.py CMD ...`: this file
runs as a script (standard library only, no site-packages: a few ms), sets the
four variables and execs CMD in the same process (same pid, so signals sent to
the ranks reach CMD). A CMD that cannot be started is reported in one line
with status 127 (not found) or 126 (not executable), as a shell does.

    launcher            rank            size            local rank              local size
    Open MPI            OMPI_COMM_WORLD_RANK  _SIZE     _LOCAL_RANK             _LOCAL_SIZE
    MPICH / hydra       PMI_RANK        PMI_SIZE        MPI_LOCALRANKID         MPI_LOCALNRANKS
    Slurm (srun)        SLURM_PROCID    SLURM_NTASKS    SLURM_LOCALID           SLURM_STEP_TASKS_PER_NODE
                                                                                at SLURM_NODEID

HPCDL_LOCAL_SIZE=k (virtual nodes of k consecutive ranks) is applied as
hpcdl.comm applies it: local rank = rank % k, local size = k. hpcdl.comm.init
compares these variables with MPI's own split and warns if they disagree.
"""
import os
import re
import sys

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")

# (rank, size, local rank, local size) variables of each launcher, in the order tried
LAUNCHERS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None),  # local size: tasks per node
)


def tasks_per_node(spec):
    """Slurm's compressed list '2(x3),1' -> [2, 2, 2, 1]."""
    out = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return []
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def _slurm_local_size(env):
    per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE")
                              or env.get("SLURM_TASKS_PER_NODE", ""))
    node = env.get("SLURM_NODEID", "0")
    if per_node and node.isdigit() and int(node) < len(per_node):
        return per_node[int(node)]
    return None


def torchrun_env(env=os.environ):
    """{RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE: str} from the launcher's
    variables in env, or {} when no launcher is recognised. A launcher that
    gives rank and size but no local numbers (srun --mpi=pmi2 sets PMI_RANK
    only) yields to the next one that gives all four."""
    found = []
    for rank_var, size_var, local_var, local_size_var in LAUNCHERS:
        values = [env.get(rank_var), env.get(size_var), env.get(local_var),
                  env.get(local_size_var) if local_size_var else _slurm_local_size(env)]
        if values[0] is None or values[1] is None:
            continue
        try:
            rank, size, local, local_size = [None if v is None else int(v) for v in values]
        except ValueError:
            continue
        virtual = env.get("HPCDL_LOCAL_SIZE", "0") or "0"
        if virtual.isdigit() and int(virtual) > 0:  # hpcdl's virtual nodes
            local, local_size = rank % int(virtual), int(virtual)
        out = {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": local,
               "LOCAL_WORLD_SIZE": local_size}
        found.append({k: str(v) for k, v in out.items() if v is not None})
        if len(found[-1]) == 4:
            return found[-1]
    return found[0] if found else {}


def disagreement(env, rank, size, local_rank, local_size):
    """A sentence naming the torchrun variables in env that differ from MPI's
    topology (as hpcdl.comm sees it), or None when those set all agree."""
    mpi = {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": local_rank,
           "LOCAL_WORLD_SIZE": local_size}
    bad = ["%s=%s (MPI: %d)" % (k, env[k], mpi[k]) for k in NAMES
           if k in env and env[k].strip() != str(mpi[k])]
    if not bad:
        return None
    return ("torchrun's variables disagree with MPI's topology: %s; scripts that read "
            "them will not match hpcdl.comm (unset them, or start the ranks with "
            "`hpcdl run`)" % ", ".join(bad))


def main(argv):
    """Sets the variables and execs argv; returns a status only when exec fails."""
    if not argv:
        sys.stderr.write("usage: rankenv.py CMD [ARG ...]\n")
        return 2
    os.environ.update(torchrun_env(os.environ))
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        where = "rank %s on %s" % (os.environ.get("RANK", "?"), os.uname().nodename)
        why = ("not found on PATH" if isinstance(e, FileNotFoundError)
               else "not executable (%s)" % e.strerror)
        os.write(2, ("hpcdl run: %s could not be started on %s: %s\n"
                     % (argv[0], where, why)).encode())
        return 127 if isinstance(e, FileNotFoundError) else 126


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

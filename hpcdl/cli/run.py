"""run.py - `hpcdl run -n N -- CMD ...`: start N ranks through the MPI
launcher on PATH with the flags the situation needs; in the shell of a Slurm
allocation (sbatch, salloc) through `srun --mpi=pmix`; inside an existing MPI
job or Slurm step, run CMD directly. Exit codes are forwarded.

    where hpcdl run is            what starts the ranks
    a login shell, a laptop       mpirun -n N (or mpiexec)
    an sbatch script / salloc     srun --mpi=pmix --ntasks=N (mpirun if srun has no pmix)
    a rank (srun step, mpirun)    nobody: CMD runs directly, once
"""
import os
import shlex
import shutil
import subprocess
import sys

from ..utils.launch import (MPI_ENV_VARS, allocation_tasks,  # noqa: F401 (re-exported)
                            inside_parallel_job, inside_slurm_allocation)
from .main import UsageError


def default_ranks(n):
    """n, or, when n is None in the shell of a Slurm allocation, its task count:
    `hpcdl train` (no -n) in an sbatch script then uses the whole allocation."""
    if n is None and inside_slurm_allocation():
        return allocation_tasks()
    return n


def srun_command(n, cmd):
    """The srun line for n ranks of cmd inside an allocation, or None when srun
    or its MPI plugin ($HPCDL_SRUN_MPI, default pmix: what Open MPI 4 needs) is
    missing; mpirun, which reads the allocation itself, then starts them."""
    exe = shutil.which("srun")
    plugin = os.environ.get("HPCDL_SRUN_MPI", "pmix")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--mpi=list"], capture_output=True, text=True, timeout=30)
        plugins = (out.stdout + out.stderr).split()
    except (OSError, subprocess.TimeoutExpired):
        plugins = []
    if plugin not in plugins:
        print("hpcdl run: srun has no --mpi=%s plugin; starting ranks with mpirun" % plugin,
              file=sys.stderr, flush=True)
        return None
    # one failed rank ends the step, as under mpirun
    return [exe, "--mpi=" + plugin, "--ntasks=%d" % n, "--kill-on-bad-exit=1"] + list(cmd)


def find_launcher():
    """(path, flavour) of the MPI launcher: $HPCDL_MPIRUN, mpirun or mpiexec."""
    for name in (os.environ.get("HPCDL_MPIRUN"), "mpirun", "mpiexec"):
        path = name and shutil.which(name)
        if path:
            return path, launcher_flavour(path)
    raise UsageError("no MPI launcher (mpirun or mpiexec) on PATH. Install MPI "
                     "(Debian: apt-get install openmpi-bin libopenmpi-dev; clusters: "
                     "module load openmpi) or set HPCDL_MPIRUN")


def launcher_flavour(path):
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


def parse_hosts(hosts):
    """'a:4,b:4' -> [('a', 4), ('b', 4)]; a host without slots counts 1."""
    out = []
    for item in hosts.split(","):
        name, _, slots = item.strip().partition(":")
        if not name or (slots and not slots.isdigit()) or slots == "0":
            raise UsageError("bad host entry %r in -H; use host:slots,host:slots" % item)
        out.append((name, int(slots) if slots else 1))
    return out


def mpirun_command(n, cmd, hosts=None, launcher=None):
    """The launcher command line for n ranks of cmd (a list of strings)."""
    if n < 1:
        raise UsageError("-n must be at least 1 (got %d)" % n)
    path, flavour = launcher or find_launcher()
    line = [path, "-n", str(n)]
    host_list = parse_hosts(hosts) if hosts else None
    if flavour == "openmpi":
        slots = sum(s for _, s in host_list) if host_list else (os.cpu_count() or 1)
        if n > slots:
            line.append("--oversubscribe")  # more ranks than cores: allowed, slower
        line += ["--bind-to", "none"]      # ranks use torch's threads as they need
        if os.geteuid() == 0:
            line.append("--allow-run-as-root")
        if host_list:
            line += ["--host", ",".join("%s:%d" % h for h in host_list)]
    elif host_list:  # MPICH hydra
        line += ["-hosts", ",".join("%s:%d" % h for h in host_list)]
    return line + list(cmd)


def launch(n, cmd, hosts=None):
    """Starts cmd on n ranks (or directly inside a job); returns its exit code.
    n None: every task of the Slurm allocation, else 1."""
    if not cmd:
        raise UsageError("no command given; usage: hpcdl run -n N -- CMD ...")
    if inside_parallel_job():
        print("hpcdl run: already inside an MPI/Slurm job; running %s directly"
              % shlex.join(cmd), file=sys.stderr, flush=True)
        return _run(cmd)
    line = None
    if inside_slurm_allocation() and not hosts:
        n = _allocation_ranks(n)
        line = srun_command(n, cmd)
    line = line or mpirun_command(1 if n is None else n, cmd, hosts)
    print("hpcdl run: " + shlex.join(line), file=sys.stderr, flush=True)
    rc = _run(line)
    if rc != 0:
        print("hpcdl run: %s exited with status %d on at least one rank"
              % (shlex.join(cmd), rc), file=sys.stderr, flush=True)
    return rc


def _allocation_ranks(n):
    """n checked against the allocation's tasks (all of them when n is None)."""
    tasks = allocation_tasks()
    if n is None:
        return tasks or 1
    if n < 1:
        raise UsageError("-n must be at least 1 (got %d)" % n)
    if tasks is not None and n > tasks:
        raise UsageError("-n %d but Slurm job %s has %d task(s); ask sbatch for more "
                         "(--ntasks or --ntasks-per-node) or give -n %d or less"
                         % (n, os.environ["SLURM_JOB_ID"], tasks, tasks))
    return n


def _run(line):
    try:
        return subprocess.run(line).returncode
    except FileNotFoundError:
        raise UsageError("command not found: %s" % line[0])


def add_launch_args(parser):
    """-n / -H for commands that relaunch themselves on ranks (train, bench)."""
    parser.add_argument("-n", "--np", dest="n", type=int, default=None,
                        help="ranks to start through mpirun (ignored inside an MPI or "
                             "Slurm job, which gives the ranks)")
    parser.add_argument("-H", "--hosts", default=None, help="host:slots,... for -n")


def register(sub):
    p = sub.add_parser(
        "run", help="start N ranks of a command through mpirun",
        description="Start N ranks of CMD through the MPI launcher on PATH (mpirun or "
                    "mpiexec, Open MPI or MPICH). Adds --oversubscribe when N exceeds the "
                    "cores, --bind-to none, and Open MPI's root permission only when run as "
                    "root. In an sbatch script or salloc shell, starts them with srun "
                    "--mpi=pmix ($HPCDL_SRUN_MPI) in the allocation (mpirun if srun lacks "
                    "the plugin). Inside an existing MPI job or Slurm step, runs CMD "
                    "directly.",
        epilog="example: hpcdl run -n 4 -- python -c \"from hpcdl import comm; comm.init(); "
               "print(comm.rank(), comm.size())\"")
    p.add_argument("-n", "--np", dest="n", type=int, default=None,
                   help="number of ranks (default: every task of the Slurm allocation "
                        "inside one, else 1)")
    p.add_argument("-H", "--hosts", default=None, help="host:slots,... (default: this host)")
    p.add_argument("cmd", nargs="+", metavar="CMD", help="the command (after --)")
    p.set_defaults(func=lambda a: launch(a.n, a.cmd, a.hosts))

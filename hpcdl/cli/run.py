"""run.py - `hpcdl run -n N -- CMD ...`: start N ranks through the MPI
launcher on PATH with the flags the situation needs; in the shell of a Slurm
allocation (sbatch, salloc) through `srun --mpi=pmix`; inside an existing MPI
job or Slurm step, run CMD directly. Exit codes are forwarded.

    where hpcdl run is            what starts the ranks
    a login shell, a laptop       mpirun -n N (or mpiexec)
    an sbatch script / salloc     srun --mpi=pmix --ntasks=N (mpirun if srun has no pmix)
    a rank (srun step, mpirun)    nobody: CMD runs directly, once
"""
import argparse
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading

from ..comm import fault
from ..utils import causes, rankenv, settings
from ..utils.launch import (MPI_ENV_VARS, allocation_tasks,  # noqa: F401 (re-exported)
                            inside_parallel_job, inside_slurm_allocation)
from ..utils.mpi_info import core_launcher, launcher_flavour, launcher_mismatch
from ..utils.rankenv import torchrun_env
from ..vcluster.agent import launch_hosts_problem, ranks_by_host
from . import elastic_run, interrupt

STALL_SHUTDOWN_DEFAULT = settings.get("HPCDL_STALL_SHUTDOWN_TIME_SECONDS", {})  # stall.c's
from .errors import UsageError, print_errors


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
    plugin = settings.get("HPCDL_SRUN_MPI")
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
    """(path, flavour) of the MPI launcher: $HPCDL_MPIRUN; else the mpiexec of
    the MPI the core was built against (beside its wrapper: mpiexec.mpich for
    mpicc.mpich); else mpirun or mpiexec on PATH, if of the core's MPI."""
    chosen = settings.get("HPCDL_MPIRUN")
    own = None if chosen else core_launcher()
    if own:
        return own
    for name in (chosen, "mpirun", "mpiexec"):
        path = name and shutil.which(name)
        if path:
            flavour = launcher_flavour(path)
            problem = None if chosen else launcher_mismatch(path, flavour)
            if problem:
                raise UsageError(problem)
            return path, flavour
    raise UsageError("no MPI launcher (mpirun or mpiexec) on PATH. Install MPI "
                     "(Debian: apt-get install openmpi-bin libopenmpi-dev; clusters: "
                     "module load openmpi) or set HPCDL_MPIRUN")


def parse_hosts(hosts):
    """'a:4,b:4' -> [('a', 4), ('b', 4)]; a host without slots counts 1."""
    out = []
    for item in hosts.split(","):
        name, _, slots = item.strip().partition(":")
        if not name or (slots and not slots.isdigit()) or slots == "0":
            raise UsageError("bad host entry %r in -H; use host:slots,host:slots" % item)
        out.append((name, int(slots) if slots else 1))
    problem = launch_hosts_problem(out)  # inside `hpcdl vcluster exec`: its hosts only
    if problem:
        raise UsageError(problem)
    return out


def read_hostfile(path):
    """'host slots=N' or 'host:N' lines (# comments) -> the -H string."""
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        raise UsageError("--hostfile %s: %s" % (path, e.strerror))
    hosts = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        name, slots = words[0], "1"
        if ":" in name:
            name, slots = name.split(":", 1)
        for w in words[1:]:
            key, _, value = w.partition("=")
            if key not in ("slots", "max_slots") or not value:
                raise UsageError("--hostfile %s line %d: %r; write 'host slots=N' or "
                                 "'host:N'" % (path, number, line))
            if key == "slots":
                slots = value
        hosts.append("%s:%s" % (name, slots))
    if not hosts:
        raise UsageError("--hostfile %s names no host" % path)
    return ",".join(hosts)


def mpirun_command(n, cmd, hosts=None, launcher=None, mpi_args=None, export=()):
    """The launcher command line for n ranks of cmd (a list of strings), with
    mpi_args (a string, split as a shell would) and export (VAR or VAR=VALUE
    names for every rank) passed on to the launcher."""
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
    return line + export_flags(flavour, export) + split_mpi_args(mpi_args) + list(cmd)


def export_flags(flavour, export):
    """Launcher options that pass the variables named in export to remote ranks
    too (local ranks inherit hpcdl's environment, which exported_env fills)."""
    names = [v.partition("=")[0] for v in export]
    if not names:
        return []
    if flavour == "mpich":
        return ["-genvlist", ",".join(names)]
    if flavour == "srun":
        return ["--export=ALL"]  # srun's default, said explicitly
    return [w for name in names for w in ("-x", name)]  # Open MPI (and unknown: its syntax)


def split_mpi_args(text):
    try:
        return shlex.split(text or "")
    except ValueError as e:
        raise UsageError("--mpi-args %r: %s" % (text, e))


def exported_env(export):
    """os.environ plus the VAR=VALUE items of export; UsageError for a VAR
    that is neither set nor given a value."""
    env = dict(os.environ)
    for item in export:
        name, eq, value = item.partition("=")
        if not name or not (name[0].isalpha() or name[0] == "_") or \
                not all(c.isalnum() or c == "_" for c in name):
            raise UsageError("-x %s: give VAR or VAR=VALUE" % item)
        if eq:
            env[name] = value
        elif name not in env:
            raise UsageError("-x %s: %s is not set here; give -x %s=VALUE" % (item, name, name))
    return env


def python_script(args):
    """The script path in python's arguments args, or None (-c, -m, stdin)."""
    args = list(args)
    while args:
        a = args.pop(0)
        if a in ("-c", "-m", "-") or a.startswith(("-c", "-m")):
            return None
        if a in ("-W", "-X"):  # options with a separate value
            args = args[1:]
        elif not a.startswith("-"):
            return a
    return None


def resolve_command(cmd, check_path=True):
    """(cmd, note): `python` / `python3` become the interpreter hpcdl runs in
    (so the ranks see the same packages without activating its venv), and,
    with check_path (ranks on this host), a command missing from PATH here is
    a UsageError before any rank starts."""
    if cmd[0] in ("python", "python3"):
        script = python_script(cmd[1:])
        if check_path and script is not None and not os.path.isfile(script):
            raise UsageError("%s: %s (the script %s would run on every rank)" % (
                script, "is a directory" if os.path.isdir(script) else "no such file",
                cmd[0]))
        return [sys.executable] + list(cmd[1:]), "  (%s = %s, hpcdl's interpreter)" % (
            cmd[0], sys.executable)
    if check_path and shutil.which(cmd[0]) is None:
        why = ("not found" if not os.path.exists(cmd[0]) else "not executable") \
            if os.sep in cmd[0] else "not found on PATH"
        raise UsageError("%s could not be started: %s" % (cmd[0], why))
    return list(cmd), ""


def failure(cmd, rc):
    """The sentence for a launch that ended with status rc."""
    what = shlex.join(cmd)
    if rc in (126, 127):  # rankenv.py's exec failed (its lines above), as a shell reports it
        return ("%s exited with status %d: it could not be started (%s on the ranks), or a "
                "command it ran could not" % (cmd[0], rc, "not found on PATH" if rc == 127
                                               else "not executable"))
    if rc == 130:
        return "%s was interrupted (Ctrl-C)" % what
    if rc == 134:
        return ("%s exited with status 134: mpirun could not start the ranks (see its "
                "message above), or a rank aborted (SIGABRT)" % what)
    return "%s exited with status %d on at least one rank" % (what, rc)


# Ranks a core from which the launcher warns: 4 ranks on 2 cores run fine
# (docs), while 64 on 2 said nothing for 200 s (issue 38).
CROWDED = 4
RANK_START_CPU_S = 2  # CPU seconds a rank needs to start (Python, torch, MPI), measured ~1.3-2


def host_cores():
    """The cores this process may run on (its CPU affinity), else the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def crowding_note(n, cores):
    """One line for n ranks on a host of `cores` cores when that is CROWDED
    or more ranks a core (what to expect, and that a stop still works), else None."""
    if n < CROWDED * cores:
        return None
    per = n / cores
    return ("%d ranks on %d cores (%.0f a core): each rank needs about %d CPU-seconds to "
            "start, so expect %d s or more before the first output, then steps about %.0fx "
            "slower than with %d rank%s; a stop signal (SIGTERM) still ends the job "
            "within %d s" % (n, cores, per, RANK_START_CPU_S,
                                     n * RANK_START_CPU_S // cores, per, cores,
                                     "s" if cores > 1 else "",
                                     interrupt.STOP_GRACE_S + interrupt.KILL_AFTER_S))


def launch(n, cmd, hosts=None, mpi_args=None, export=(), term_as=None, tracebacks=False):
    """Starts cmd on n ranks (or directly inside a job); returns its exit code.
    n None: every task of the Slurm allocation, or every slot of hosts (as
    mpirun), else 1. MASTER_ADDR / MASTER_PORT are set when not already
    (rendezvous_env), for torch.distributed's env://. Every rank starts as
    rankenv.py (torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE from
    the launcher's variables), which execs cmd. Signals to this process go on
    to the launcher (_run; term_as: what a SIGTERM becomes). Errors hpcdl
    raised on the ranks are summed up as one line per cause, their
    tracebacks kept in a log file it names (utils/causes.py), unless
    tracebacks."""
    if not cmd:
        raise UsageError("no command given; usage: hpcdl run -n N -- CMD ...")
    cmd, note = resolve_command(cmd, check_path=not hosts)
    env = exported_env(export)
    bad = settings.check_environment(env)  # the ranks would refuse it, each with a traceback
    if bad:
        raise UsageError("\n".join(bad))
    if inside_parallel_job():
        print("hpcdl run: already inside an MPI/Slurm job; running %s directly"
              % shlex.join(cmd), file=sys.stderr, flush=True)
        return _run(cmd, dict(env, **torchrun_env(env)), term_as)
    ranks_cmd = [sys.executable, "-I", "-S", rankenv.__file__] + cmd
    line = None
    in_slurm = inside_slurm_allocation() and not hosts
    rendezvous = rendezvous_env(env, hosts, slurm=in_slurm)
    if not tracebacks:
        rendezvous.append(causes.ENV + "=1")
    env.update(v.split("=", 1) for v in rendezvous)
    if in_slurm:
        n = _allocation_ranks(n)
        line = srun_command(n, ranks_cmd)
        if line:
            line[1:1] = export_flags("srun", export) + split_mpi_args(mpi_args)
    if n is None and hosts:  # as mpirun: one rank per slot listed
        n = sum(slots for _, slots in parse_hosts(hosts))
    if not line:  # ranks on other hosts get the rendezvous through the launcher
        remote = [v.split("=", 1)[0] for v in rendezvous] if hosts or in_slurm else []
        line = mpirun_command(1 if n is None else n, ranks_cmd, hosts, mpi_args=mpi_args,
                              export=list(export) + remote)
    print("hpcdl run: " + shlex.join(line) + note, file=sys.stderr, flush=True)
    crowded = None if hosts or in_slurm else crowding_note(n or 1, host_cores())
    if crowded:
        print("hpcdl run: warning: " + crowded, file=sys.stderr, flush=True)
    sieve = None if tracebacks else causes.Sieve()
    rc = _run(line, env, term_as, sieve)
    said = sieve.finish(failed=rc != 0) if sieve is not None else []
    if rc != 0:
        if said:
            print_errors(said, prefix="hpcdl run: ")
        print("hpcdl run: " + failure(cmd, rc), file=sys.stderr, flush=True)
        if hosts:  # mpirun names a lost host; this names its ranks
            print("hpcdl run: " + ranks_by_host(parse_hosts(hosts), n or 1), file=sys.stderr,
                  flush=True)
    return rc


def free_port():
    """A TCP port free on this host now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def first_slurm_node():
    """The first host of the Slurm allocation (srun puts rank 0 there), or None."""
    nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    exe = shutil.which("scontrol")
    if not nodes or not exe:
        return None
    try:
        out = subprocess.run([exe, "show", "hostnames", nodes], capture_output=True,
                             text=True, timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out[0] if out else None


def rendezvous_env(env, hosts, slurm=False):
    """['MASTER_ADDR=...', 'MASTER_PORT=...'] for what the user has not set:
    torch.distributed's env:// rendezvous (init_process_group("gloo") in a
    torchrun-style script) meets at rank 0's host, which is the first host
    listed (-H, the hostfile, or the allocation's first node: mpirun and srun
    place rank 0 there), this host without any; the port is one free here
    (for a remote first host: free here, most likely free there)."""
    out = []
    if "MASTER_ADDR" not in env:
        addr = (parse_hosts(hosts)[0][0] if hosts else first_slurm_node() if slurm
                else "127.0.0.1")
        if addr:
            out.append("MASTER_ADDR=" + addr)
    if "MASTER_PORT" not in env:
        out.append("MASTER_PORT=%d" % free_port())
    return out


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


# Signals a batch system or a user sends to this process (kill PID, scancel
# --signal, a job's time limit) go on to the launcher, which hands them to the
# ranks: mpirun and srun forward SIGUSR1/2 to them, while on SIGTERM Open MPI's
# mpirun ends the job (SIGTERM to the ranks, SIGKILL 1 s later). With term_as
# (hpcdl train) the launcher runs in a process group of its own: Ctrl-C
# (SIGINT) reaches hpcdl alone, which passes it on as interrupt.py says.
FORWARDED = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")


def _run(line, env=None, term_as=None, sieve=None):
    """Runs line, passing FORWARDED signals on to it; returns its exit code.
    term_as: the signal a SIGTERM is passed on as (hpcdl train: SIGUSR1, its
    other stop signal, so that the ranks get the time to checkpoint). sieve:
    a causes.Sieve that reads the launcher's stderr."""
    try:
        proc = subprocess.Popen(line, env=env,
                                stderr=subprocess.PIPE if sieve is not None else None,
                                **interrupt.popen_options(detach=term_as is not None))
    except FileNotFoundError:
        raise UsageError("%s could not be started: not found" % line[0])
    reader = None
    if sieve is not None:
        reader = threading.Thread(target=sieve.run, args=(proc.stderr,), daemon=True)
        reader.start()
    leftovers = interrupt.Leftovers(proc)
    ctrl_c = interrupt.Interrupts(proc, term_as, "hpcdl")
    before_int = signal.signal(signal.SIGINT, ctrl_c)
    deadline = interrupt.Deadline(proc, "hpcdl run")

    def forward(signum, frame):
        if signum == signal.SIGTERM and term_as is not None:
            print("hpcdl run: SIGTERM passed on to the ranks as %s (a clean stop: the "
                  "launcher would end the job on SIGTERM); the job ends within %d s"
                  % (signal.Signals(term_as).name,
                     interrupt.STOP_GRACE_S + interrupt.KILL_AFTER_S),
                  file=sys.stderr, flush=True)
            deadline.start(interrupt.STOP_GRACE_S)
            signum = term_as
        elif signum == signal.SIGTERM:  # the launcher ends the job; make sure it does
            deadline.start(interrupt.STOP_GRACE_S, end_first=False)
        proc.send_signal(signum)
    sigs = [getattr(signal, n) for n in FORWARDED if hasattr(signal, n)]
    before = {s: signal.signal(s, forward) for s in sigs}
    try:
        rc = proc.wait()
    finally:
        deadline.done.set()
        for s, h in before.items():
            signal.signal(s, h)
        signal.signal(signal.SIGINT, before_int)
        if reader is not None:
            reader.join(timeout=10)  # the rest of the launcher's stderr
    removed = leftovers.remove()
    if ctrl_c.count:
        print("hpcdl: interrupted by Ctrl-C; the job ended with status %d%s" % (
            rc, ", %d shared-memory segment(s) it left in /dev/shm removed" % removed
            if removed else ""), file=sys.stderr, flush=True)
        return rc if rc == 0 and term_as is not None else 130
    return rc


def add_launch_args(parser, ranks_help=None):
    """-n/-np, -H, --mpi-args, -x: how hpcdl starts the ranks (run, and the
    commands that relaunch themselves on ranks: train, bench, data)."""
    parser.add_argument("-n", "-np", "--np", dest="n", type=int, default=None,
                        help=ranks_help or "ranks to start through mpirun (ignored inside "
                                           "an MPI or Slurm job, which gives the ranks)")
    parser.add_argument("-H", "--hosts", default=None, help="host:slots,... for -n")
    parser.add_argument("--hostfile", default=None, metavar="FILE",
                        help="hosts from a file, one 'host slots=N' (or 'host:N') a line, "
                             "as horovodrun's --hostfile")
    parser.add_argument("--mpi-args", default=None, metavar="'OPTS'",
                        help="more options for mpirun (or srun), one quoted string, e.g. "
                             "--mpi-args='--map-by socket' (Horovod's --mpi-args)")
    parser.add_argument("-x", dest="export", action="append", default=[],
                        metavar="VAR[=VALUE]", help="pass VAR (set to VALUE) to every rank, "
                                                    "as mpirun -x does (repeatable)")
    parser.add_argument("--stall-shutdown", type=float, default=None, metavar="SECONDS",
                        help="end the job with the stall inspector's diagnosis (which rank "
                             "has not joined which collective) once ranks have waited this "
                             "long for it (default %g s; 0 = never; sets "
                             "HPCDL_STALL_SHUTDOWN_TIME_SECONDS)" % STALL_SHUTDOWN_DEFAULT)
    parser.add_argument("--tracebacks", action="store_true",
                        help="show the ranks' full tracebacks and the launcher's messages "
                             "for errors hpcdl raised (default: one line per cause, the "
                             "rest in a log file it names)")


def launch_options(args):
    """launch()'s keyword arguments from the options add_launch_args added."""
    hosts = args.hosts
    if args.hostfile:
        if hosts:
            raise UsageError("give -H or --hostfile, not both")
        hosts = read_hostfile(args.hostfile)
    export = list(args.export)
    stall = getattr(args, "stall_shutdown", None)
    if stall is not None:
        if not stall >= 0:
            raise UsageError("--stall-shutdown must be 0 (never) or more seconds (got %g)"
                             % stall)
        export.append("HPCDL_STALL_SHUTDOWN_TIME_SECONDS=%g" % stall)
    return dict(hosts=hosts, mpi_args=args.mpi_args, export=export,
                tracebacks=getattr(args, "tracebacks", False))


def add_elastic_args(parser):
    """horovodrun's elastic and start-up flags (cli/elastic_run.py)."""
    g = parser.add_argument_group("elastic (restart-based; see docs/horovod.md)")
    g.add_argument("--min-np", type=int, default=None,
                   help="fewest ranks to restart with after a failure")
    g.add_argument("--max-np", type=int, default=None, help="most ranks to run")
    g.add_argument("--max-restarts", "--reset-limit", type=int, default=None,
                   help="restarts after a failure (default 3 with --min-np/--max-np, else 0)")
    g.add_argument("--start-timeout", type=float, default=30, metavar="SECONDS",
                   help="a host that cannot start a rank within this is left out of a "
                        "restart (default 30)")
    g.add_argument("--verbose", action="store_true",
                   help="say more: the host probes, and HPCDL_LOG_LEVEL=INFO on the ranks")


def run_command(args):
    """`hpcdl run`: plain, or elastic when any elastic flag is given."""
    if args.cmd[:1] == ["--"]:
        args.cmd = args.cmd[1:]
    options = launch_options(args)
    if args.verbose:
        options["export"] = list(options["export"]) + ["HPCDL_LOG_LEVEL=INFO"]
    if args.max_restarts is not None and args.max_restarts < 0:
        raise UsageError("--max-restarts must be 0 or more (got %d)" % args.max_restarts)
    if args.max_restarts is None:
        args.max_restarts = 3 if (args.min_np or args.max_np) else 0
    if args.fault_tolerant:  # ULFM: the survivors of a lost rank go on (docs/fault-tolerance.md)
        options["mpi_args"] = " ".join(fault.ULFM_FLAGS + [options["mpi_args"] or ""]).strip()
        why = None if inside_parallel_job() else fault.launcher_ulfm(find_launcher()[0])
        if why:
            raise UsageError("--fault-tolerant needs an MPI with ULFM (Open MPI 5: "
                             "scripts/ompi5-setup.sh), but %s; without it a lost rank ends "
                             "the job (restart path: --min-np)" % why)
    if not elastic_run.wants_elastic(args):
        return launch(args.n, args.cmd, **options)
    hosts, export = options.pop("hosts"), options.pop("export")

    def start(n, hosts_arg, env):
        return launch(n, args.cmd, hosts=hosts_arg, export=env, **options)

    def probe_line(host):
        return mpirun_command(1, ["true"], "%s:1" % host)
    return elastic_run.launch_elastic(
        start, probe_line, args.n, parse_hosts(hosts) if hosts else None,
        min_np=args.min_np, max_np=args.max_np, max_restarts=args.max_restarts,
        start_timeout=args.start_timeout, verbose=args.verbose, export=export)


def register(sub):
    p = sub.add_parser(
        "run", help="start N ranks of a command through mpirun",
        description=textwrap.fill(
            "Start N ranks of CMD through the MPI launcher on PATH (mpirun or "
            "mpiexec, Open MPI or MPICH). Adds --oversubscribe when N exceeds the "
            "cores, --bind-to none, and Open MPI's root permission only when run as "
            "root. In an sbatch script or salloc shell, starts them with srun "
            "--mpi=pmix ($HPCDL_SRUN_MPI) in the allocation (mpirun if srun lacks "
            "the plugin). Inside an existing MPI job or Slurm step, runs CMD "
            "directly. CMD python or python3 runs the interpreter hpcdl itself runs "
            "in (no venv to activate). Each rank gets torchrun's RANK, LOCAL_RANK, "
            "WORLD_SIZE and LOCAL_WORLD_SIZE (from the launcher; the same numbers "
            "as hpcdl.comm's rank, local_rank, size, local_size), and, unless set, "
            "MASTER_ADDR (the first host: rank 0's) and MASTER_PORT (a free port) for "
            "torch.distributed's init_process_group. CMD starts at the first word that "
            "is not an option of hpcdl run (-- is optional, as with horovodrun). "
            "Without -n: every slot of -H / --hostfile (as mpirun), every task of a "
            "Slurm allocation, else 1.", 79),
        epilog="examples:\n  hpcdl run -n 4 -- python -c \"from hpcdl import comm; "
               "comm.init(); print(comm.rank(), comm.size())\"\n"
               "  hpcdl run -np 4 -x OMP_NUM_THREADS=1 --mpi-args='--map-by core' -- "
               "python train.py\n"
               "  hpcdl run -np 2 python train.py --epochs 1     (horovodrun's form)\n"
               "  hpcdl run -H node1:2,node2:2 -- python train.py  (4 ranks)\n"
               "  hpcdl run -np 4 --min-np 2 --max-np 4 -H node1:2,node2:2 -- python "
               "elastic_train.py",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_launch_args(p, ranks_help="number of ranks (default: every slot of -H or "
                                  "--hostfile, every task of the Slurm allocation "
                                  "inside one, else 1)")
    add_elastic_args(p)
    p.add_argument("--fault-tolerant", action="store_true",
                   help="start the job with MPI's fault tolerance on (Open MPI 5's ULFM: "
                        "mpiexec --with-ft ulfm): a lost rank is a RanksLostError on every "
                        "survivor instead of the end of the job (docs/fault-tolerance.md); "
                        "refused on an MPI without ULFM")
    # everything from the first word that is not one of hpcdl run's options on
    # is the command, `--` or not: horovodrun's `-np 2 python train.py --epochs 1`
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD ...",
                   help="the command (after -- or after hpcdl run's own options)")
    p.set_defaults(func=run_command)

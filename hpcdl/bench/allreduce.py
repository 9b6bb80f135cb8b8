"""allreduce.py - `hpcdl bench allreduce`: hpcdl's all-reduce algorithms
(ring, hier, auto, shared, mpi) against two peers, MPI_Allreduce through mpi4py
("mpi4py") and torch.distributed's gloo ("gloo"), timed in one run on the
same buffers, in the shape of nccl-tests' tables. On request (not in the
CLI's default list) also the torch path's cost per call (docs/torch_distributed.md):
"torch" is torch.distributed.all_reduce on backend "hpcdl", against hpcdl's
own asynchronous all-reduce ("async": Communicator.allreduce_async(...).wait(),
the engine call the backend queues) and the Horovod API ("hvd":
hpcdl.torch.allreduce_, which adds its shape-check round).

    mpirun -n 2 python -m hpcdl bench allreduce      (or: hpcdl bench allreduce -n 2)

Every row: one size, one implementation, all in place on the same buffer,
reset from the rank's send data before each iteration (outside the timing).
  time   median over iterations of the slowest rank's time, barrier before each
  algbw  size / time;   busbw = algbw * 2(N-1)/N   (N = ranks)
  floor  memory-traffic floor 2*N*size / copy_bw, copy_bw being the aggregate
         copy bandwidth (read + write bytes of all ranks) measured at that size
  #wrong elements that differ from the known sum, checked outside the timed
         loop with rank- and position-dependent data, exact in every dtype
The exit status is 1 when any value is wrong.
"""
import os
import re
import socket
import textwrap
import time
from dataclasses import dataclass
import csv
import datetime
import subprocess

import numpy as np

from ..utils.log import print0  # the one rank-0 printer
from . import EveryRankError
from . import device as dev  # --device cuda: the buffers as CUDA tensors
from ..vcluster import floor as net_floor  # the network floor across vcluster hosts
from .. import comm
from .._version import __version__
from ..utils import atomic

# hpcdl's algorithms (the C core); "shared" is auto on a buffer in node shared
# memory (Communicator.shared_buffer), as DistributedOptimizer's buckets are
HPCDL_IMPLS = ("ring", "hier", "auto", "shared", "mpi")
PEERS = ("mpi4py", "gloo")                      # what hpcdl is measured against
TORCH_PATH = ("async", "hvd", "torch")          # the hpcdl backend's overhead per call
IMPLS = HPCDL_IMPLS + PEERS + TORCH_PATH
DTYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32,
          "int64": np.int64}
HEADER_COPY_BYTES = 256 << 20  # per rank: the header's copy bandwidth (beyond L3)
MIN_ITERS = 3                  # adaptive iteration counts never go below this
PERIOD = 17                    # test data repeats every 17 elements (prime)


@dataclass
class Options:
    """What one benchmark run measures (the CLI fills it; see hpcdl/cli/bench.py)."""
    min_bytes: int = 4
    max_bytes: int = 256 << 20
    factor: int = 4
    dtype: str = "float32"
    impls: tuple = IMPLS
    iters: int = 50          # most timed iterations per row (fewer for big sizes)
    warmup: int = 5          # most untimed iterations per row
    budget_s: float = 1.0    # rough time budget of one row's timed loop
    check: bool = True       # hpcdl's cross-rank agreement check (HPCDL_CHECK)
    json: str = None
    csv: str = None
    plot: str = None
    expect_ranks: int = None  # -n given inside a job: warn if the job differs
    device: str = "cpu"       # cpu: numpy buffers; cuda: CUDA tensors (device.py)


# ----------------------------------------------------------------------------
# sizes and options

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}


def parse_size(text):
    """'4' -> 4, '4K' -> 4096, '256M' / '256MiB' / '256mb' -> 268435456 (powers
    of 1024). ValueError on anything else."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError("bad size %r: use a whole number of bytes with an optional K, M, "
                         "G or T suffix (powers of 1024), e.g. 4, 64K, 256M" % (text,))
    return int(m.group(1)) << _UNITS[m.group(2).lower()]


def format_size(nbytes):
    """268435456 -> '256 MiB', 4096 -> '4 KiB', 12 -> '12 B'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return "%d %s" % (nbytes >> shift, unit)
    return "%d B" % nbytes


def size_list(min_bytes, max_bytes, factor, itemsize):
    """min, min*factor, ... <= max, each rounded down to whole elements (at
    least one); duplicates after rounding are dropped."""
    out, b = [], min_bytes
    while b <= max_bytes:
        n = max(itemsize, b // itemsize * itemsize)
        if n not in out:
            out.append(n)
        b *= factor
    return out


def validate(opts):
    """Raises ValueError with a fix-it message for options that cannot run."""
    if opts.min_bytes < 1:
        raise ValueError("--min-bytes must be at least 1 (got %d)" % opts.min_bytes)
    if opts.min_bytes > opts.max_bytes:
        raise ValueError("--min-bytes %s is larger than --max-bytes %s"
                         % (format_size(opts.min_bytes), format_size(opts.max_bytes)))
    if opts.factor < 2:
        raise ValueError("--factor must be an integer >= 2 (got %d)" % opts.factor)
    if opts.dtype not in DTYPES:
        raise ValueError("unknown --dtype %r; use one of %s" % (opts.dtype, ", ".join(DTYPES)))
    bad = [a for a in opts.impls if a not in IMPLS]
    if bad or not opts.impls:
        raise ValueError("unknown algorithm(s) %s in --algorithms; use a comma-separated "
                         "subset of %s" % (", ".join(map(repr, bad)) or "(none given)",
                                           ",".join(IMPLS)))
    if opts.device not in ("cpu", "cuda"):
        raise ValueError("unknown --device %r; use cpu or cuda" % opts.device)
    if opts.iters < 1 or opts.warmup < 0 or opts.budget_s <= 0:
        raise ValueError("--iters must be >= 1, --warmup >= 0 and --time-budget > 0")


# ----------------------------------------------------------------------------
# test data: value(i, rank) = (i*7 + rank*13) % 17 - 8, in [-8, 8], so every
# partial sum is an exact small integer in every dtype; a chunk that lands at
# the wrong offset (not a multiple of 17) or comes from the wrong rank shows.

def rank_pattern(rank):
    i = np.arange(PERIOD, dtype=np.int64)
    return (i * 7 + rank * 13) % PERIOD - 8


def fill_send(buf, rank):
    np.copyto(buf, np.resize(rank_pattern(rank).astype(buf.dtype), buf.size))


def expected_sum(count, dtype, nranks):
    total = sum(rank_pattern(r) for r in range(nranks))
    return np.resize(total.astype(dtype), count)


def busbw(algbw, nranks):
    """All-reduce bus bandwidth: what each link carries, comparable across N."""
    return algbw * 2 * (nranks - 1) / nranks


# ----------------------------------------------------------------------------
# the job: ranks, hosts, cores, MPI library

def describe_job(mpi):
    """Collective: a dict describing where the ranks run."""
    from mpi4py import MPI  # on use: loads MPI
    per_rank = mpi.allgather((MPI.Get_processor_name(), os.cpu_count() or 1))
    hosts = {}
    for host, cores in per_rank:
        hosts.setdefault(host, [0, cores])[0] += 1
    library = MPI.Get_library_version().strip().splitlines()[0].split(",")[0].strip()
    shared = net_floor.machine_cores()  # vcluster hosts share one machine's cores
    return {"ranks": mpi.size, "hosts": sorted(hosts), "load_avg_1min": os.getloadavg()[0],
            "cores": shared or sum(c for _, c in hosts.values()),
            "oversubscribed": mpi.size > shared if shared else
            any(r > c for r, c in hosts.values()),
            "mpi_library": library, "vcluster": net_floor.vcluster_line()}


def code_version():
    """'hpcdl 0.1.0 (git 1a2b3c4, modified)' when run from a git checkout, so a
    table can be tied to the core it measured ('modified': uncommitted changes
    in src_c/ or hpcdl/comm/, the code being measured)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "src_c",
                                "hpcdl/comm"],
                               capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        head = ""
    if not head:
        return "hpcdl " + __version__
    return "hpcdl %s (git %s%s)" % (__version__, head, ", modified" if dirty.strip() else "")


# ----------------------------------------------------------------------------
# timing

def timed_loop(mpi, op, reset, opts):
    """(median s, fastest s, iterations) of op() over ranks: reset() (untimed),
    a barrier, then op() timed on every rank; an iteration's time is the
    slowest rank's. The first call estimates the cost; warm-up and iteration counts
    shrink so that a row takes about opts.budget_s (same counts on all ranks)."""
    from mpi4py import MPI  # on use: loads MPI

    def once():
        if reset is not None:
            reset()
        mpi.Barrier()
        t0 = time.perf_counter()
        op()
        return time.perf_counter() - t0

    est = max(mpi.allreduce(once(), op=MPI.MAX), 1e-9)
    for _ in range(min(opts.warmup, int(opts.budget_s / 4 / est))):
        once()
    n = min(opts.iters, max(MIN_ITERS, int(opts.budget_s / est)))
    times = np.array([once() for _ in range(n)])
    mpi.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return float(np.median(times)), float(times.min()), n


def measure_copy_bw(mpi, nbytes, opts):
    """Aggregate copy bandwidth in GB/s with every rank copying nbytes at once
    (np.copyto): read + write bytes of all ranks / the slowest rank's time."""
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros_like(src)
    t, _, _ = timed_loop(mpi, lambda: np.copyto(dst, src), None, opts)
    return 2 * nbytes * mpi.size / t / 1e9


# ----------------------------------------------------------------------------
# the implementations: each bound to one buffer, all in place

def start_gloo(mpi, job):
    """Collective: starts torch.distributed's gloo group on the same ranks,
    rank 0 choosing a free port and broadcasting it. Returns None, or why it
    failed (then on every rank, so that all of them skip gloo)."""
    err = None
    try:
        import torch.distributed as dist
        if not dist.is_available():
            raise ImportError("torch.distributed is not available in this torch build")
    except ImportError as e:
        err = "torch.distributed not importable (%s)" % e
    if mpi.allreduce(err is not None):
        return mpi.allgather(err)[0] or "torch.distributed failed on another rank"
    port = None
    if mpi.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
    port = mpi.bcast(port, root=0)
    addr = "127.0.0.1" if len(job["hosts"]) == 1 else mpi.bcast(socket.gethostname(), 0)
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=mpi.rank, world_size=mpi.size,
                            timeout=datetime.timedelta(seconds=120))
    return None


def start_hpcdl_group():
    """Collective: a torch.distributed group on backend "hpcdl" over every
    rank: the default group when there is none yet, else new_group(backend=
    "hpcdl") beside it (gloo's, from start_gloo)."""
    import torch.distributed as dist  # on use: loads torch
    from ..torch import distributed  # noqa: F401 - registers backend "hpcdl"
    distributed.register()
    if not dist.is_initialized():
        dist.init_process_group("hpcdl")
        return dist.group.WORLD
    return dist.new_group(backend="hpcdl")


_TORCH_GROUP = []  # the "torch" implementation's group (setup starts it)


def bind(name, world, buf):
    """A no-argument callable running one in-place all-reduce (sum) of buf."""
    if name == "shared":
        return lambda: world.allreduce(buf, None, "sum", "auto")
    if name in HPCDL_IMPLS:
        return lambda: world.allreduce(buf, None, "sum", name)
    if name == "mpi4py":
        from mpi4py import MPI  # on use: loads MPI
        mpi, in_place, op = world.mpi, MPI.IN_PLACE, MPI.SUM
        return lambda: mpi.Allreduce(in_place, buf, op=op)
    if name == "gloo":
        import torch  # on use: loads torch
        import torch.distributed as dist  # on use: loads torch
        tensor = buf if isinstance(buf, torch.Tensor) else torch.from_numpy(buf)  # shared
        return lambda: dist.all_reduce(tensor)
    if name == "async":
        return lambda: world.allreduce_async(buf).wait()
    if name in ("hvd", "torch"):
        import torch  # on use: loads torch
        tensor = buf if isinstance(buf, torch.Tensor) else torch.from_numpy(buf)
        if name == "hvd":
            import hpcdl.torch as hvd  # on use: loads torch and tqdm
            return lambda: hvd.allreduce_(tensor, op=hvd.Sum)
        import torch.distributed as dist  # on use: loads torch
        group = _TORCH_GROUP[0]
        return lambda: dist.all_reduce(tensor, group=group)
    raise ValueError("unknown implementation %r" % name)


def count_wrong(mpi, run, work, send, expected):
    """Collective: runs the all-reduce once on fresh data; the number of
    elements, summed over ranks, that differ from the expected sum."""
    np.copyto(work, send)
    run()
    return mpi.allreduce(int(np.count_nonzero(work != expected)))


# ----------------------------------------------------------------------------
# one size: copy bandwidth, then every implementation on the same buffers

def bench_size(world, nbytes, impls, opts):
    """Collective: the rows (dicts) of one message size, printed as they come."""
    dtype = np.dtype(DTYPES[opts.dtype])
    count, n = nbytes // dtype.itemsize, world.size
    send = np.empty(count, dtype)
    fill_send(send, world.rank)
    work = np.empty_like(send)
    expected = expected_sum(count, dtype, n)
    copy_bw = measure_copy_bw(world.mpi, nbytes, opts)
    on_gpu = opts.device == "cuda"
    if on_gpu:
        send, work = dev.buffers(send)
        floor_gpu = world.mpi.allreduce(dev.staging_floor_us(nbytes), op=_max())
    rows = []
    for name in impls:
        buf = work
        if name == "shared":  # never freed before exit: one per size measured
            view = world.shared_buffer(nbytes) if count else None
            if view is None:
                continue  # one rank per node: nothing to share
            buf = np.frombuffer(view, dtype, count)
        run = bind(name, world, buf)
        if on_gpu:
            run = dev.synced(run)
            dev.reset(buf, send)
            run()
            wrong = world.mpi.allreduce(dev.wrong(buf, expected))
            t, fastest, iters = timed_loop(world.mpi, run, lambda: dev.reset(buf, send), opts)
        else:
            wrong = count_wrong(world.mpi, run, buf, send, expected)
            t, fastest, iters = timed_loop(world.mpi, run, lambda: np.copyto(buf, send), opts)
        algbw = nbytes / t / 1e9
        rows.append({"impl": name, "bytes": nbytes, "count": count, "type": opts.dtype,
                     "redop": "sum", "time_us": t * 1e6, "algbw": algbw,
                     "busbw": busbw(algbw, n), "wrong": wrong,
                     "floor_us": net_floor.network_floor_us(nbytes, world.cross_size)
                     or (floor_gpu if on_gpu else 2 * n * nbytes / (copy_bw * 1e9) * 1e6),
                     "copy_bw_GBps": copy_bw, "iters": iters, "min_us": fastest * 1e6,
                     "algorithm": (world.choose_algorithm(nbytes) if name == "auto" else
                                   "hier-shared" if name == "shared" else name)})
        print_row(world, rows[-1])
    return rows


def _max():
    from mpi4py import MPI  # on use: loads MPI
    return MPI.MAX


def summarize(rows):
    """Per size: the best hpcdl algorithm against the faster peer, and auto
    against MPI_Allreduce (speedups > 1 mean hpcdl is faster)."""
    out = []
    for nbytes in sorted({r["bytes"] for r in rows}):
        at = {r["impl"]: r for r in rows if r["bytes"] == nbytes}
        mine = [at[i] for i in HPCDL_IMPLS if i in at]
        peers = [at[i] for i in PEERS if i in at]
        s = {"bytes": nbytes, "floor_us": next(iter(at.values()))["floor_us"]}  # per size
        if mine:
            best = min(mine, key=lambda r: r["time_us"])
            s.update(best=best["impl"], best_us=best["time_us"],
                     best_over_floor=best["time_us"] / s["floor_us"])
        if peers:
            peer = min(peers, key=lambda r: r["time_us"])
            s.update(peer=peer["impl"], peer_us=peer["time_us"])
        if mine and peers:
            s["speedup"] = peer["time_us"] / best["time_us"]
        if "auto" in at and "mpi4py" in at:
            s["auto_vs_mpi4py"] = at["mpi4py"]["time_us"] / at["auto"]["time_us"]
        for base in ("async", "hvd", "auto"):  # > 1: the torch path is slower
            if "torch" in at and base in at:
                s["torch_over_" + base] = at["torch"]["time_us"] / at[base]["time_us"]
                s["torch_over_%s_min" % base] = at["torch"]["min_us"] / at[base]["min_us"]
        out.append(s)
    return out


# ----------------------------------------------------------------------------
# printing (rank 0)

COLUMNS = "#%13s %12s %8s %6s %7s %11s %11s %11s %11s %7s"
ROW = " %13d %12d %8s %6s %7s %11.1f %11.3f %11.3f %11.1f %7d"


def auto_ranges(world, sizes):
    """'mpi for 4 B..16 KiB, hier for 64 KiB..256 MiB' (what auto picks)."""
    groups = []
    for b in sizes:
        algo = world.choose_algorithm(b)
        if groups and groups[-1][0] == algo:
            groups[-1][2] = b
        else:
            groups.append([algo, b, b])
    return ", ".join("%s for %s..%s" % (a, format_size(lo), format_size(hi))
                     for a, lo, hi in groups)


def job_lines(job):
    """The header lines that say where a benchmark ran (describe_job's dict)."""
    hosts = "%d (%s)" % (len(job["hosts"]), ", ".join(job["hosts"]))
    return ["#  %s" % job["version"],
            "#  ranks %d | hosts %s | MPI: %s | cores %d | oversubscribed: %s"
            % (job["ranks"], hosts, job["mpi_library"], job["cores"],
               "YES" if job["oversubscribed"] else "no"),
            "#  load average (1 min) at start: %.2f (other processes on these cores make "
            "times noisy)" % job["load_avg_1min"]] + (
                ["#  " + job["vcluster"]] if job.get("vcluster") else [])


def print_header(world, job, opts, sizes, impls, copy_bw, notes):
    print0("# hpcdl bench allreduce: %s on the same buffers" % ", ".join(impls))
    for line in job_lines(job):
        print0(line)
    if job["oversubscribed"]:
        print0("#  WARNING: more ranks than cores: busy-polling ranks share cores, "
               "times are not representative")
    print0("#  dtype %s | op sum | in place | sizes %s..%s (x%d) | iters <= %d, warmup "
           "<= %d, adaptive to ~%.1f s per row" % (opts.dtype, format_size(sizes[0]),
                                                    format_size(sizes[-1]), opts.factor,
                                                    opts.iters, opts.warmup, opts.budget_s))
    print0("#  time = median over iterations of the slowest rank (barrier before each);"
           " busbw = algbw * 2(N-1)/N")
    print0("#  hpcdl agreement check: %s (--no-check or HPCDL_CHECK=0 turns it off)"
           % ("on" if world.check else "OFF"))
    print0("#  aggregate copy bandwidth: %.2f GB/s (np.copyto of %s on every rank at once, "
           "read + write bytes of all ranks)" % (copy_bw, format_size(HEADER_COPY_BYTES)))
    if opts.device == "cpu":  # on cuda a note gives the staging floor instead
        print0("#  floor = 2*N*size / copy bandwidth measured at that size (L3 makes small "
               "sizes copy faster): the time to copy every rank's buffer twice. A path that "
               "moves fewer bytes than copies do (shared: ranks add straight from each "
               "other's shared memory) can beat it")
    if net_floor.header_line(world.cross_size):
        print0("#  " + net_floor.header_line(world.cross_size))
    print0("#  auto picks: %s" % auto_ranges(world, sizes))
    for note in notes:
        print0("#  " + note)
    print0("#")
    print0(COLUMNS % ("size", "count", "type", "redop", "impl", "time", "algbw", "busbw",
                      "floor", "#wrong"))
    print0(COLUMNS % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "(us)", ""))


def print_row(world, r):
    print0(ROW % (r["bytes"], r["count"], r["type"], r["redop"], r["impl"], r["time_us"],
                  r["algbw"], r["busbw"], r["floor_us"], r["wrong"]))


def print_footer(world, wrong, summary):
    print0("# Out of bounds values : %d %s" % (wrong, "OK" if not wrong else "FAILED"))
    print0("#")
    print0("# best hpcdl algorithm vs the faster peer (speedup = peer time / hpcdl time)")
    print0("#%13s %6s %11s %7s %11s %8s %11s %8s %9s" % (
        "size(B)", "best", "time(us)", "peer", "time(us)", "speedup", "floor(us)",
        "x floor", "auto/mpi4py"))
    for s in summary:
        print0(" %13d %6s %11s %7s %11s %8s %11.1f %8s %9s" % (
            s["bytes"], s.get("best", "-"), _fmt(s.get("best_us"), "%.1f"),
            s.get("peer", "-"), _fmt(s.get("peer_us"), "%.1f"),
            _fmt(s.get("speedup"), "%.2fx"), s["floor_us"],
            _fmt(s.get("best_over_floor"), "%.2f"), _fmt(s.get("auto_vs_mpi4py"), "%.2fx")))
    print0("#  auto/mpi4py = MPI_Allreduce time / auto time (>= 1: auto is as fast)")
    bases = [b for b in ("async", "hvd", "auto") if any("torch_over_" + b in s for s in summary)]
    if bases:
        print0("#\n# the torch path (torch.distributed.all_reduce on backend hpcdl) over "
               "hpcdl's own: time ratio (1.10 = 10% overhead per call), of the medians "
               "and of the fastest iterations (less hit by other processes)")
        keys = [(b, "") for b in bases] + [(b, "_min") for b in bases]
        print0("#%13s" % "size(B)" + "".join(" %14s" % ("torch/%s%s" % k) for k in keys))
        for s in summary:
            print0(" %13d" % s["bytes"] + "".join(
                " %14s" % _fmt(s.get("torch_over_%s%s" % k), "%.3f") for k in keys))


def _fmt(value, spec):
    return "-" if value is None else spec % value


# ----------------------------------------------------------------------------
# files (rank 0): json, csv, plot

def write_json(path, job, copy_bw, check, rows, summary):
    doc = dict(job, copy_bw_GBps=copy_bw, copy_bw_bytes=HEADER_COPY_BYTES,
               check=check, rows=rows, summary=summary)
    atomic.write_json(path, doc, indent=1)


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def write_plot(path, job, check, rows):
    """busbw against size (log x), one line per implementation, and the copy
    bound: the busbw of an all-reduce that took as long as the floor (every
    rank's buffer copied twice at np.copyto's measured bandwidth)."""
    import matplotlib  # on use: loads matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # on use: loads matplotlib
    n = job["ranks"]
    fig, ax = plt.subplots(figsize=(8.5, 5.6))
    for impl in dict.fromkeys(r["impl"] for r in rows):
        mine = [r for r in rows if r["impl"] == impl]
        ax.plot([r["bytes"] for r in mine], [r["busbw"] for r in mine], marker="o",
                ms=3, label=impl + (" (peer)" if impl in PEERS else ""),
                ls="--" if impl in PEERS else "-")
    first = [r for r in rows if r["impl"] == rows[0]["impl"]]
    copy_floor = all(abs(r["floor_us"] - 2 * n * r["bytes"] / (r["copy_bw_GBps"] * 1e3))
                     <= 1e-6 * r["floor_us"] for r in first)  # else another floor (header)
    ax.plot([r["bytes"] for r in first],
            [busbw(r["bytes"] / r["floor_us"] / 1e3, n) for r in first],
            color="gray", ls=":", lw=2,
            label="copy bound (np.copyto)" if copy_floor else "floor (see the table header)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = sorted({r["bytes"] for r in rows})
    ax.set_xticks(sizes, [format_size(b).replace(" ", "").replace("iB", "")
                          for b in sizes], rotation=45)
    ax.set_xlabel("message size per rank")
    ax.set_ylabel("bus bandwidth, GB/s (log) = size / time x 2(N-1)/N")
    hosts = job["hosts"]
    ax.set_title("hpcdl bench allreduce: %d ranks on %d host%s (%s)%s\n%s, %s sum in place, "
                 "hpcdl agreement check %s, load average %.1f at start" % (
                     n, len(hosts), "" if len(hosts) == 1 else "s", ", ".join(hosts[:4])
                     + (", ..." if len(hosts) > 4 else ""),
                     ", OVERSUBSCRIBED" if job["oversubscribed"] else "",
                     job["mpi_library"], rows[0]["type"], "on" if check else "off",
                     job.get("load_avg_1min", float("nan"))), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=9)
    fig.text(0.01, 0.01, textwrap.fill(
        "Higher is faster; peers are dashed. " + (
            "Copy bound: the bandwidth of an all-reduce that took as long as copying every "
            "rank's buffer twice with np.copyto (the floor column). A curve above it moves "
            "fewer bytes than those copies: 'shared' adds straight from the other ranks' "
            "shared memory." if copy_floor else
            "Floor: the bandwidth of an all-reduce that took as long as the table's floor "
            "column (its header says what it is)."), 150),
        fontsize=7.5, color="dimgray", va="bottom")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------
# the benchmark

def setup(opts):
    """Collective: (world, job, impls, notes) with MPI, hpcdl and gloo up."""
    world = comm.init()
    if not opts.check:
        world.set_check(False)
    job = describe_job(world.mpi)
    job["version"] = code_version() if world.rank == 0 else ""
    impls, notes = list(dict.fromkeys(opts.impls)), []
    if opts.device == "cuda":  # collective: a rank without a usable GPU stops them all
        world.raise_if_any(dev.unavailable("cuda"), EveryRankError)
        dev.select_gpu(world.local_rank)
        impls, notes = dev.skipped_impls(impls)
        notes.append("buffers: CUDA tensors; floor = the slowest rank's D2H + H2D copy of "
                     "the buffer through pinned memory (what staging must move)")
    if opts.expect_ranks and opts.expect_ranks != world.size:
        notes.append("NOTE: -n %d given, but this job has %d ranks; using %d"
                     % (opts.expect_ranks, world.size, world.size))
    if "gloo" in impls:
        err = start_gloo(world.mpi, job)
        if err:
            impls.remove("gloo")
            notes.append("gloo skipped: %s" % err)
        else:
            notes.append("gloo: torch.distributed init_process_group('gloo') via %s:%s"
                         % (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]))
    if "torch" in impls:
        _TORCH_GROUP[:] = [start_hpcdl_group()]
        notes.append("torch: torch.distributed.all_reduce on a group of backend 'hpcdl'; "
                     "async: Communicator.allreduce_async(...).wait(); hvd: "
                     "hpcdl.torch.allreduce_ (the Horovod API, with its shape-check round)")
    return world, job, impls, notes


def run(opts):
    """Runs the benchmark on the ranks of this MPI job; returns the exit status
    (0, or 1 when any value was wrong). Rank 0 prints and writes files."""
    validate(opts)
    world, job, impls, notes = setup(opts)
    sizes = size_list(opts.min_bytes, opts.max_bytes, opts.factor,
                      np.dtype(DTYPES[opts.dtype]).itemsize)
    copy_bw = measure_copy_bw(world.mpi, HEADER_COPY_BYTES, opts)
    print_header(world, job, opts, sizes, impls, copy_bw, notes)
    rows = []
    for nbytes in sizes:
        rows += bench_size(world, nbytes, impls, opts)
    wrong = sum(r["wrong"] for r in rows)
    summary = summarize(rows)
    print_footer(world, wrong, summary)
    if world.rank == 0:
        for path, write in ((opts.json, lambda p: write_json(p, job, copy_bw, world.check,
                                                              rows, summary)),
                            (opts.csv, lambda p: write_csv(p, rows)),
                            (opts.plot, lambda p: write_plot(p, job, world.check, rows))):
            if path:
                write(path)
                print0("# wrote %s" % path)
    teardown(impls)
    return 1 if wrong else 0


def teardown(impls):
    if "gloo" in impls or "torch" in impls:
        import torch.distributed as dist  # on use: loads torch
        dist.destroy_process_group()
        _TORCH_GROUP[:] = []
    comm.shutdown()

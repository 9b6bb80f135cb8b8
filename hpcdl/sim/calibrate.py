"""calibrate.py - `hpcdl bench calibrate`: measures alpha and beta on the
machine or allocation it runs on, so the cost model speaks about this network.

    mpirun -n 2 python -m hpcdl bench calibrate      (or: hpcdl bench calibrate -n 2)

1. Ping-pong between rank 0 and a partner (MPI_Send / MPI_Recv of m bytes
   through mpi4py, sizes 0 .. 64 MiB): one-way time = round trip / 2, the
   fastest of the timed iterations (the median is reported beside it).
   The partner is the next rank on rank 0's host ("intra") and, when the job
   spans hosts, the first rank on another host ("inter"). A least-squares fit
   of t = alpha + beta m (relative errors, see fit.py) gives alpha and beta.
2. The reduction's cost gamma (seconds per byte): np.add of two float32
   buffers in place on rank 0, fitted the same way.
3. With --allreduce: hpcdl's ring all-reduce (algorithm="ring") on all ranks
   at the same sizes, against the model's prediction from 1 and 2, and its
   own fit of 2(N-1) alpha + 2((N-1)/N) m beta. Results are checked with
   rank- and position-dependent data (#wrong must be 0). Then the host CPU
   it costs: each rank's CPU time (getrusage, user + sys, all threads) over
   a few all-reduces of the largest size, per byte all-reduced
   (cpu_per_byte, what `hpcdl sim step`'s cpu term charges to backward), and
   cores_per_rank: a machine's cores over the ranks on it (machines told
   apart by the kernel's boot id, so `hpcdl vcluster` hosts count as one).

Ranks outside the measured pair wait in a barrier meanwhile.
"""
import json
import os
import resource
import socket
import time
from dataclasses import dataclass

import numpy as np

from . import cost, fit
from .units import format_beta, format_time
from ..bench import allreduce as ar
from .. import comm
from ..utils.atomic import write_json

DEFAULT_MAX_BYTES = 64 << 20


@dataclass
class Options:
    """What one calibration run measures (hpcdl/cli/bench_calibrate.py fills it)."""
    min_bytes: int = 0
    max_bytes: int = DEFAULT_MAX_BYTES
    factor: int = 4
    iters: int = 50          # most timed iterations per size
    warmup: int = 5          # most untimed iterations per size
    budget_s: float = 0.25   # rough time of one size's timed loop
    allreduce: bool = False  # also measure hpcdl's ring all-reduce
    predict_from: str = None  # a calibration JSON: skip 1-2, predict 3 from it
    json: str = None
    expect_ranks: int = None


def check_ranks(n):
    """ValueError unless there are two ranks to send messages between."""
    if n < 2:
        raise ValueError("calibration needs at least 2 ranks (it times messages between "
                         "two of them; got %d): run 'hpcdl bench calibrate -n 2' or start "
                         "it under 'mpirun -n 2'" % n)


def validate(opts):
    if opts.min_bytes < 0 or opts.max_bytes < 1 or opts.min_bytes > opts.max_bytes:
        raise ValueError("need 0 <= --min-bytes <= --max-bytes and --max-bytes >= 1 "
                         "(got %d and %d)" % (opts.min_bytes, opts.max_bytes))
    if opts.factor < 2:
        raise ValueError("--factor must be an integer >= 2 (got %d)" % opts.factor)
    if opts.iters < 1 or opts.warmup < 0 or opts.budget_s <= 0:
        raise ValueError("--iters must be >= 1, --warmup >= 0 and --time-budget > 0")
    if opts.predict_from:
        load_calibration(opts.predict_from)


def load_calibration(path):
    """The document `hpcdl bench calibrate --json` wrote; ValueError if unusable."""
    try:
        with open(path) as f:
            doc = json.load(f)
        if not (doc["alpha"] >= 0 and doc["beta"] >= 0):
            raise ValueError("negative alpha or beta")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError("cannot read alpha and beta from %s (%s): give the JSON written by "
                         "'hpcdl bench calibrate --json FILE'" % (path, e))
    return doc


def sizes(opts):
    """0 (when min is 0), then 4 B or min, x factor, up to max."""
    out = [0] if opts.min_bytes == 0 else []
    b = max(opts.min_bytes, 4)
    while b <= opts.max_bytes:
        out.append(b)
        b *= opts.factor
    return out


def whole_floats(sizes_):
    """The sizes rounded down to whole float32 elements, 0 and duplicates dropped."""
    return sorted({m // 4 * 4 for m in sizes_ if m >= 4})


# ----------------------------------------------------------------------------
# where the ranks are

def hosts_of(world):
    """Collective: per world rank (host name, cores of that host)."""
    return world.allgather_object((socket.gethostname(), os.cpu_count() or 1))


def pairs(hosts):
    """{'intra': partner, 'inter': partner}: rank 0's partner on its own host
    and on another host, for those that exist."""
    out = {}
    for r, (host, _) in enumerate(hosts[1:], start=1):
        key = "intra" if host == hosts[0][0] else "inter"
        out.setdefault(key, r)
    return out


def timeshare(hosts):
    """Ranks per core on the most crowded host (>= 1). Above 1, ranks take turns
    on the cores and every step of a collective waits for a descheduled peer."""
    per_host = {}
    for host, cores in hosts:
        per_host.setdefault(host, [0, cores])[0] += 1
    return max(1.0, max(n / c for n, c in per_host.values()))


# ----------------------------------------------------------------------------
# MPI as the measured peer: the one place calibration holds mpi4py itself.
# The cost model is fitted to MPI_Send / MPI_Recv and to the timing loops of
# hpcdl.bench.allreduce, which take mpi4py communicators (bench measures MPI
# as a peer); everything else goes through the hpcdl Communicator.

def peer_mpi(world):
    """The mpi4py communicator under world, for timing MPI itself."""
    return world.mpi


def pingpong(world, partner, sizes_, opts):
    """Collective on world: (fastest, median) one-way seconds between rank 0
    and partner, per size, on rank 0 (None elsewhere). The others wait in a barrier."""
    from mpi4py import MPI  # on use: loads MPI
    mpi = peer_mpi(world)
    pair = mpi.Split(0 if mpi.rank in (0, partner) else MPI.UNDEFINED, mpi.rank)
    times = None
    if pair != MPI.COMM_NULL:
        times = [_pingpong_size(pair, m, opts) for m in sizes_]
        pair.Free()
    mpi.Barrier()
    return times


def _pingpong_size(pair, nbytes, opts):
    buf = np.zeros(nbytes, np.uint8)
    if pair.rank == 0:
        def op():
            pair.Send(buf, 1, tag=7)
            pair.Recv(buf, 1, tag=7)
    else:
        def op():
            pair.Recv(buf, 0, tag=7)
            pair.Send(buf, 0, tag=7)
    median, fastest, _ = ar.timed_loop(pair, op, None, opts)
    return fastest / 2, median / 2


def reduce_times(sizes_, opts):
    """(fastest, median) seconds of np.add(a, b, out=a) on float32 buffers,
    timed by bench's loop on MPI_COMM_SELF (this rank alone)."""
    from mpi4py import MPI  # on use: loads MPI
    out = []
    for m in sizes_:
        a, b = np.ones(m // 4, np.float32), np.ones(m // 4, np.float32)
        median, fastest, _ = ar.timed_loop(MPI.COMM_SELF, lambda: np.add(a, b, out=a),
                                           None, opts)
        out.append((fastest, median))
    return out


def allreduce_times(world, sizes_, opts):
    """Collective: (fastest, median, #wrong) of hpcdl's ring all-reduce per size."""
    out = []
    for m in sizes_:
        count = m // 4
        send = np.empty(count, np.float32)
        ar.fill_send(send, world.rank)
        work = np.empty_like(send)
        run = ar.bind("ring", world, work)
        wrong = ar.count_wrong(peer_mpi(world), run, work, send,
                               ar.expected_sum(count, np.float32, world.size))
        median, fastest, _ = ar.timed_loop(peer_mpi(world), run,
                                           lambda: np.copyto(work, send), opts)
        out.append((fastest, median, wrong))
    return out


def predict_ring(n, nbytes, doc, share=1.0):
    """The model's ring all-reduce time of nbytes over n ranks from a
    calibration document (what run() returns or writes as JSON): alpha and
    beta of the slowest link measured (inter-host when there was one), the
    measured gamma, times share = the predicted job's timeshare()."""
    return share * cost.ring_allreduce(n, nbytes, doc["alpha"], doc["beta"],
                                       doc.get("gamma", 0.0))


# ----------------------------------------------------------------------------
# the calibration: measure, fit, print (rank 0), one document for every rank

LINK_COLUMNS = "#%13s %12s %12s %12s %9s %10s"
LINK_ROW = " %13d %12.2f %12.2f %12.2f %8.1f%% %10.3f"


def fitted_rows(sizes_, times, f):
    """Rows of a fitted table: bytes, fastest and median times, the model's
    time (us) and its error against the fastest."""
    return [{"bytes": m, "time_us": t[0] * 1e6, "median_us": t[1] * 1e6,
             "model_us": fm * 1e6, "error": e}
            for m, t, fm, e in zip(sizes_, times, f.model, f.rel_errors)]


def print_fitted(say, rows):
    say(LINK_COLUMNS % ("size(B)", "time(us)", "median(us)", "model(us)", "error", "GB/s"))
    for r in rows:
        rate = r["bytes"] / r["time_us"] / 1e3 if r["time_us"] > 0 else 0.0
        say(LINK_ROW % (r["bytes"], r["time_us"], r["median_us"], r["model_us"],
                        100 * r["error"], rate))


def fit_summary(name, coef_names, f, rows):
    worst = rows[f.worst]
    return ("# fit %s: %s, R^2 = %.4f, largest error %+.0f%% at %d B"
            % (name, ", ".join(coef_names), f.r2, 100 * worst["error"], worst["bytes"]))


def measure_link(world, kind, partner, hosts, sizes_, opts, say):
    """Collective: the ping-pong table and fit of one link (dict on every rank)."""
    say("#\n# link %s: rank 0 (%s) <-> rank %d (%s), MPI_Send + MPI_Recv via mpi4py, "
        "one-way time = round trip / 2" % (kind, hosts[0][0], partner, hosts[partner][0]))
    times = pingpong(world, partner, sizes_, opts)
    link = None
    if world.rank == 0:
        f = fit.fit_alpha_beta(sizes_, [t[0] for t in times])
        two = None  # across hosts only: on one host a poor fit is noise, not a shaper
        if kind == "inter" and f.r2 < 0.9:
            two = fit.fit_two_regimes(sizes_, [t[0] for t in times])
        if two is not None:  # a shaped link: large messages decide beta
            say("# one line fits %s badly (R^2 = %.2f): alpha from the sizes within 2x the "
                "smallest messages' time, beta from those >= 1000x it (a token-bucket "
                "shaper such as `hpcdl vcluster --link` passes messages below its burst at "
                "the wire's speed)" % (kind, f.r2))
            f = two
        link = {"partner": partner, "host": hosts[partner][0], "alpha": f.coef[0],
                "beta": f.coef[1], "r2": f.r2, "rows": fitted_rows(sizes_, times, f)}
        print_fitted(say, link["rows"])
        say(fit_summary(kind, ["alpha = %s" % format_time(f.coef[0]),
                               "beta = %s" % format_beta(f.coef[1])], f, link["rows"]))
    return world.bcast_object(link, root=0)


def measure_reduce(world, sizes_, opts, say):
    """Collective: gamma from np.add on rank 0 (the others wait)."""
    sizes_ = whole_floats(sizes_)
    say("#\n# reduction: np.add(a, b, out=a) on float32, rank 0 alone; "
        "time per byte of one buffer = gamma")
    doc = None
    if world.rank == 0:
        times = reduce_times(sizes_, opts)
        f = fit.fit_alpha_beta(sizes_, [t[0] for t in times])
        doc = {"gamma": max(f.coef[1], 0.0), "overhead": f.coef[0], "r2": f.r2,
               "rows": fitted_rows(sizes_, times, f)}
        print_fitted(say, doc["rows"])
        say(fit_summary("reduction", ["per-call overhead %s" % format_time(f.coef[0]),
                                      "gamma = %s" % format_beta(f.coef[1])], f, doc["rows"]))
    world.barrier()
    return world.bcast_object(doc, root=0)


ALLREDUCE_COLUMNS = "#%13s %12s %12s %14s %8s %13s %7s"
ALLREDUCE_ROW = " %13d %12.2f %12.2f %14.2f %8.2f %13.2f %7d"


def measure_allreduce(world, doc, sizes_, opts, say=lambda line: None, share=None):
    """Collective: hpcdl's ring all-reduce on this job's ranks against the
    prediction from the calibration doc (measured here or in another job);
    share: this job's timeshare() (None: the doc's, for the same job)."""
    sizes_ = whole_floats(sizes_)
    n = world.size
    share = doc["timeshare"] if share is None else share
    say("#\n# ring all-reduce: hpcdl, algorithm='ring', float32 sum, %d ranks; predicted = "
        "%s%s + ((N-1)/N)M*gamma" % (n, "%.3g x " % share if share > 1 else "",
                                    cost.FORMULAS["ring"]))
    measured = allreduce_times(world, sizes_, opts)
    f = fit.fit_ring(n, sizes_, [t for t, _, _ in measured])
    rows = []
    say(ALLREDUCE_COLUMNS % ("size(B)", "time(us)", "median(us)", "predicted(us)", "ratio",
                             "ring fit(us)", "#wrong"))
    for m, (t, med, wrong), fm in zip(sizes_, measured, f.model):
        p = predict_ring(n, m, doc, share)
        rows.append({"bytes": m, "time_us": t * 1e6, "median_us": med * 1e6,
                     "predicted_us": p * 1e6, "ratio": t / p, "fit_us": fm * 1e6,
                     "wrong": wrong})
        say(ALLREDUCE_ROW % (m, t * 1e6, med * 1e6, p * 1e6, t / p, fm * 1e6, wrong))
    say("# ratio = time / predicted; fit ring: alpha = %s, beta = %s, R^2 = %.4f"
        % (format_time(f.coef[0]), format_beta(f.coef[1]), f.r2))
    return {"ranks": n, "alpha": f.coef[0], "beta": f.coef[1], "r2": f.r2, "rows": rows}


CPU_REPS = 3   # all-reduces of the largest size timed for their CPU cost


def _cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)   # every thread of this rank
    return r.ru_utime + r.ru_stime


def boot_id():
    """The running kernel's id: ranks that share it share the machine's cores."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def cores_per_rank(machines):
    """The fewest cores a rank has: a machine's cores / its ranks, from
    [(boot id, cores)] per rank."""
    per = {}
    for machine, cores in machines:
        per.setdefault(machine, [0, cores])[0] += 1
    return min(cores / n for n, cores in per.values())


def measure_cpu(world, nbytes, say=lambda line: None):
    """Collective: host CPU seconds per byte of hpcdl's ring all-reduce, per
    rank (its CPU time over CPU_REPS all-reduces of nbytes / (CPU_REPS x
    nbytes)), with the wall time beside it; the same dict on every rank."""
    count = nbytes // 4
    work = np.empty(count, np.float32)
    ar.fill_send(work, world.rank)
    run = ar.bind("ring", world, work)
    run()                                   # warm: buffers, connections
    world.barrier()
    c0, t0 = _cpu_seconds(), time.perf_counter()
    for _ in range(CPU_REPS):
        run()
    cpu, wall = _cpu_seconds() - c0, time.perf_counter() - t0
    every = world.allgather_object(cpu / (CPU_REPS * 4 * count))
    doc = {"bytes": 4 * count, "reps": CPU_REPS, "per_rank": every,
           "cpu_per_byte": float(np.mean(every)), "wall_per_byte": wall / (CPU_REPS * 4 * count),
           "cores_per_rank": cores_per_rank(world.allgather_object(
               (boot_id(), os.cpu_count() or 1)))}
    say("#\n# host CPU of the ring all-reduce (%s, %d times): %.3g ns of CPU per byte per "
        "rank (ranks: %s), %.3g ns of wall time per byte; %.3g core(s) per rank"
        % (ar.format_size(doc["bytes"]), CPU_REPS, 1e9 * doc["cpu_per_byte"],
           " ".join("%.3g" % (1e9 * c) for c in every), 1e9 * doc["wall_per_byte"],
           doc["cores_per_rank"]))
    return doc


def measure(world, opts, say=lambda line: None, job=None):
    """Collective: the whole calibration as one document, the same on every
    rank. say(line) is called on rank 0 with each printed line; job is
    hpcdl.bench.allreduce.describe_job's dict (made here when None)."""
    check_ranks(world.size)
    job = job or ar.describe_job(peer_mpi(world))
    hosts = hosts_of(world)
    doc = dict(job, timeshare=timeshare(hosts), links={})
    szs = sizes(opts)
    for kind, partner in sorted(pairs(hosts).items(), key=lambda kv: kv[0] != "intra"):
        doc["links"][kind] = measure_link(world, kind, partner, hosts, szs, opts, say)
    slowest = doc["links"].get("inter") or doc["links"]["intra"]
    doc.update(alpha=slowest["alpha"], beta=slowest["beta"])
    if "intra" in doc["links"]:
        doc.update(alpha_intra=doc["links"]["intra"]["alpha"],
                   beta_intra=doc["links"]["intra"]["beta"])
    doc["reduce"] = measure_reduce(world, szs, opts, say)
    doc["gamma"] = doc["reduce"]["gamma"]
    if opts.allreduce:
        doc["allreduce"] = measure_allreduce(world, doc, szs, opts, say)
        if whole_floats(szs):
            doc["cpu"] = measure_cpu(world, whole_floats(szs)[-1], say)
            doc.update(cpu_per_byte=doc["cpu"]["cpu_per_byte"],
                       cores_per_rank=doc["cpu"]["cores_per_rank"])
    return doc


def measure_against(world, opts, say=lambda line: None, job=None):
    """Collective: no ping-pong; the ring all-reduce on this job's ranks against
    the calibration in opts.predict_from (made on other ranks, e.g. 2)."""
    check_ranks(world.size)
    cal = load_calibration(opts.predict_from)
    job = job or ar.describe_job(peer_mpi(world))
    doc = dict(job, timeshare=timeshare(hosts_of(world)), links={},
               calibration=opts.predict_from, alpha=cal["alpha"], beta=cal["beta"],
               gamma=cal.get("gamma", 0.0))
    say("#\n# predicting from %s (%d ranks): alpha = %s, beta = %s, gamma = %s"
        % (opts.predict_from, cal.get("ranks", 0), format_time(doc["alpha"]),
           format_beta(doc["beta"]), format_beta(doc["gamma"])))
    doc["allreduce"] = measure_allreduce(world, doc, sizes(opts), opts, say)
    return doc


def print_header(say, world, job, opts, szs):
    if opts.predict_from:
        say("# hpcdl bench calibrate --predict-from: hpcdl's ring all-reduce on these ranks "
            "against a calibration made before")
    else:
        say("# hpcdl bench calibrate: alpha (latency) and beta (time per byte) of this "
            "machine's links, gamma of its reduction")
    for line in ar.job_lines(job):  # version, ranks and hosts, load
        say(line)
    say("#  sizes %s..%s (x%d) | iters <= %d, warmup <= %d, adaptive to ~%.2g s per size"
        % (ar.format_size(szs[0]), ar.format_size(szs[-1]), opts.factor, opts.iters,
           opts.warmup, opts.budget_s))
    say("#  time = fastest timed iteration (barrier before each; the slowest rank's "
        "time); the fits use it: other jobs on the cores stretch some iterations, "
        "the fastest is the undisturbed one")
    say("#  fits minimise relative errors; error = (model - time) / time")
    if opts.expect_ranks and opts.expect_ranks != world.size:
        say("#  NOTE: -n %d given, but this job has %d ranks; using %d"
            % (opts.expect_ranks, world.size, world.size))


def print_footer(say, doc):
    say("#")
    if doc["links"]:
        say("# alpha = %s, beta = %s (%s link), gamma = %s"
            % (format_time(doc["alpha"]), format_beta(doc["beta"]),
               "inter-host" if "inter" in doc["links"] else "same-host",
               format_beta(doc["gamma"])))
    if "inter" in doc["links"] and "intra" in doc["links"]:
        say("# alpha-intra = %s, beta-intra = %s"
            % (format_time(doc["alpha_intra"]), format_beta(doc["beta_intra"])))
    if "allreduce" in doc:
        wrong = sum(r["wrong"] for r in doc["allreduce"]["rows"])
        say("# Out of bounds values : %d %s" % (wrong, "OK" if not wrong else "FAILED"))


def run(opts):
    """Runs the calibration on the ranks of this MPI job; returns the exit
    status (1 when an all-reduce result was wrong). Rank 0 prints and writes
    the JSON (the document measure() returns)."""
    validate(opts)
    world = comm.init()
    check_ranks(world.size)
    say = comm.print0  # rank 0 prints the table
    job = ar.describe_job(peer_mpi(world))
    job["version"] = ar.code_version() if world.rank == 0 else ""
    print_header(say, world, job, opts, sizes(opts))
    doc = (measure_against if opts.predict_from else measure)(world, opts, say, job)
    print_footer(say, doc)
    if world.rank == 0 and opts.json:
        write_json(opts.json, doc, indent=1)
        say("# wrote %s" % opts.json)
    comm.shutdown()
    wrong = sum(r["wrong"] for r in doc.get("allreduce", {}).get("rows", []))
    return 1 if wrong else 0

"""settings.py - every HPCDL_* environment variable a user may set, in one
table: its name, the kind of value it takes, its default and what it does.
Python code reads its variables through get(); the C core reads its own
(src_c: shm.c, stall.c, dispatch.c, ...) with the same defaults, and
check_environment() refuses a bad value of any of them in one line before
the core or a launcher ever sees it (issue 38: `HPCDL_CHECK=abc` was taken
silently as "on", `HPCDL_STALL_SHUTDOWN_TIME_SECONDS=10m` as the default).

    kind      accepts                                  get() returns
    flag      0 or 1                                   bool
    count     a whole number >= its least              int
    bytes     a whole number of bytes >= its least     int
    seconds   a number of seconds >= 0, no unit        float
    choice    one of the listed words (any case)       str (as listed)
    text      anything (a path, a command)             str

A variable that is unset or empty takes its default. README's table says
the same (tests/test_settings.py holds the two together).
"""
import math
import os
from collections import namedtuple

Setting = namedtuple("Setting", "name kind default doc least choices")
FLAG, COUNT, BYTES, SECONDS, CHOICE, TEXT = "flag", "count", "bytes", "seconds", "choice", "text"


def _s(name, kind, default, doc, least=0, choices=()):
    return Setting(name, kind, default, doc, least, choices)


TABLE = [
    # collectives: read by the C core (src_c), except HPCDL_CHECK, HPCDL_LOCAL_SIZE
    # and HPCDL_CHUNK_BYTES, which hpcdl.comm hands to it
    _s("HPCDL_CHECK", FLAG, "1", "cross-rank agreement check before each collective"),
    _s("HPCDL_LOCAL_SIZE", COUNT, "0", "ranks per virtual node, 0 = split by shared memory"),
    _s("HPCDL_CHUNK_BYTES", BYTES, None, "ring pipelining chunk (unset: the core decides)",
       least=1),
    _s("HPCDL_SHM_SLOT_BYTES", BYTES, str(4 << 20), "shared-memory staging slot per rank",
       least=1),
    _s("HPCDL_AUTO_RING_ABOVE", BYTES, str(2 << 20), "one node: the ring above this many bytes"),
    _s("HPCDL_AUTO_MPI_BELOW", BYTES, str(64 << 10), "across nodes: MPI's all-reduce below this"),
    _s("HPCDL_SMALL_BYTES", BYTES, str(8 << 10), "all-reduces this small ride in the agreement "
                                                 "check's exchange (0 = off)"),
    _s("HPCDL_SHM_TIMEOUT_SECONDS", COUNT, "600", "a shared-memory wait lasting longer fails "
                                                  "while the stall inspector is off", least=1),
    _s("HPCDL_MPI_CUDA_AWARE", CHOICE, None, "override the CUDA-aware MPI query",
       choices=("0", "1", "force")),
    _s("HPCDL_CUDA_STAGE_BYTES", BYTES, str(8 << 20), "piece of the staged CUDA path"),
    _s("HPCDL_CUDA_IPC", FLAG, "1", "CUDA IPC between the GPUs of a node"),
    _s("HPCDL_CUDA_IPC_READ", CHOICE, "auto", "how CUDA IPC reads a peer's block",
       choices=("auto", "kernel", "copy")),
    _s("HPCDL_WAIT", CHOICE, "auto", "how a blocking collective waits for MPI",
       choices=("auto", "yield", "spin")),
    _s("HPCDL_ENGINE_POLITE", FLAG, "1", "the engine thread sleeps between polls"),
    _s("HPCDL_ENGINE_SLICE_US", COUNT, "100", "scheduler slice the engine thread asks for"),
    _s("HPCDL_STALL_CHECK_TIME_SECONDS", SECONDS, "60", "stall inspector: warn after this"),
    _s("HPCDL_STALL_SHUTDOWN_TIME_SECONDS", SECONDS, "300",
       "stall inspector: end the job after this, 0 = never"),
    _s("HPCDL_STALL_CHECK_DISABLE", FLAG, "0", "1 = no stall inspector thread"),
    # the Python side
    _s("HPCDL_ABORT_ON_EXCEPTION", FLAG, "1", "an uncaught exception ends the whole job"),
    _s("HPCDL_FUSION_THRESHOLD", BYTES, str(25 << 20), "DistributedOptimizer bucket bytes",
       least=1),
    _s("HPCDL_SHARED_BUCKETS", FLAG, "1", "CPU fusion buckets in node shared memory"),
    _s("HPCDL_ZERO_IN_FLIGHT", COUNT, "2", "ZeRO 2/3: buckets in flight during backward",
       least=1),
    _s("HPCDL_DATA_CACHE_BYTES", BYTES, str(64 << 20), "shard reader's in-memory cache"),
    _s("HPCDL_TIMELINE", TEXT, None, "Chrome trace of the optimizer's communication"),
    _s("HPCDL_LOG_LEVEL", CHOICE, "WARNING", "level of hpcdl's logger",
       choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")),
    _s("HPCDL_CACHE", TEXT, None, "where generated data is cached"),
    # launching
    _s("HPCDL_MPIRUN", TEXT, None, "launcher for hpcdl run and hpcdl train -n"),
    _s("HPCDL_SRUN_MPI", TEXT, "pmix", "srun's --mpi plugin inside an allocation"),
    _s("HPCDL_SLURM_TEMPLATES", TEXT, None, "a folder of more sbatch templates"),
    _s("HPCDL_ELASTIC_DIR", TEXT, None, "elastic runs' commit folder"),
]
BY_NAME = {s.name: s for s in TABLE}


class SettingError(ValueError):
    """A variable of TABLE set to a value it does not take (its one line)."""


def _expects(s):
    if s.kind == FLAG:
        return "0 or 1"
    if s.kind in (COUNT, BYTES):
        return "a whole number%s, %s" % (" of bytes" if s.kind == BYTES else "",
                                         "%d or more" % s.least)
    if s.kind == SECONDS:
        return "a number of seconds, 0 or more, without a unit"
    return "one of " + ", ".join(s.choices)


def parse(s, text):
    """text, the value of s, as s's kind; SettingError when it is not one."""
    value = text.strip()
    if s.kind == FLAG and value in ("0", "1"):
        return value == "1"
    if s.kind in (COUNT, BYTES) and value.isdigit() and int(value) >= s.least:
        return int(value)
    if s.kind == SECONDS:
        try:
            x = float(value)
        except ValueError:
            x = -1.0
        if x >= 0 and math.isfinite(x):
            return x
    if s.kind == CHOICE:
        for c in s.choices:
            if value.upper() == c.upper():
                return c
    if s.kind == TEXT:
        return text
    raise SettingError("%s=%s: expected %s (%s; default %s)" % (
        s.name, text, _expects(s), s.doc, "unset" if s.default is None else s.default))


def get(name, environ=None):
    """The value of name (a variable of TABLE): its default when unset or empty
    (None when it has none), else the value parsed; SettingError when bad."""
    s = BY_NAME[name]
    text = (os.environ if environ is None else environ).get(name, "")
    if text.strip() == "":
        return None if s.default is None else parse(s, s.default)
    return parse(s, text)


def check_environment(environ=None):
    """One line per variable of TABLE set to a value it does not take (empty
    when all are good): what hpcdl run and hpcdl.comm.init refuse at start."""
    problems = []
    for s in TABLE:
        try:
            get(s.name, environ)
        except SettingError as e:
            problems.append(str(e))
    return problems

"""mnist1d.py - MNIST-1D (Greydanus 2020) made on this machine by its own
generator (pip package mnist1d, `mnist1d.data.make_dataset`; never its
download path) at any size, cached on disk so that it is made only once.

    mnist1d[:N]   N samples in all (default DEFAULT_N): a fixed test set of
                  min(N // 5, 40,000) and N minus that to train. 200k, 1M work too.

How the N samples are made: in chunks of CHUNK = 5,000 (the package's own
default size, 500 per class), each one call of make_dataset with its own seed:
train chunk i has seed 2i, test chunk j seed 2j + 1, so the two streams never
share a sample. The training set is the first n_train samples of the train
stream and the test set the first n_test of the test stream: a larger N keeps
every sample of a smaller one, and every N >= 200,000 has the same 40,000 test
samples, so accuracies compare across N. The data does not depend on
`hpcdl train --seed` (seeds vary the model and the shuffles, not the data).
make_dataset standardises each chunk by its own mean and std (one scalar
each, as it does for any MNIST-1D set); the trainer then standardises each of
the 40 features with the training set's statistics (train/data.py).

Cache: one .npz per chunk (x float32 (5000, 40), y int64 (5000,)) in
$HPCDL_CACHE/mnist1d/<key>/ (default ~/.cache/hpcdl/mnist1d/<key>/), key = a
hash of the package version, its generator arguments and this layout. Files
are written to a temporary name and renamed (os.replace), so a reader sees a
whole chunk or none; an interrupted generation keeps its finished chunks. One
process generates at a time (an exclusive lock file in the key's directory):
ranks that start together wait for it, then read. A chunk that does not read
back (bad zip CRC, wrong shape or labels) is generated again, with a warning.
Cost: about 0.15 ms of CPU a sample here (200,000: 27 s); workers > 1 generate chunks
in parallel (spawned processes, one chunk each at a time).
"""
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
import fcntl
import multiprocessing
import random

import numpy as np

from ..utils.atomic import atomic_open
from .manifest import DataError

PACKAGE = "mnist1d"
PACKAGE_PIN = "mnist1d==0.0.2.post1"
CHUNK = 5000               # samples per cached file (one make_dataset call)
TEST_MAX = 40_000          # the fixed test set: the test stream's first 40,000
DEFAULT_N = 1_000_000      # 960,000 to train: 117 steps an epoch at batch 8192
MIN_N = 1000
MAX_N = 50_000_000         # 8 GB of float32 in memory; ask for more and it says so
LENGTH = 40                # samples are 40-value sequences (final_seq_length)
NUM_CLASSES = 10
LAYOUT = 1                 # bump when the chunking or the seeds change


# ---------------------------------------------------------------- the spec
def parse(spec):
    """N of 'mnist1d' / 'mnist1d:N' (N: digits, or with a k / M suffix), None if
    spec is not an MNIST-1D spec. ValueError saying what to write if N is bad."""
    if spec != "mnist1d" and not spec.startswith("mnist1d:"):
        return None
    if spec == "mnist1d":
        return DEFAULT_N
    text = spec.split(":", 1)[1].strip().replace("_", "")
    scale = {"k": 1000, "K": 1000, "m": 1_000_000, "M": 1_000_000}.get(text[-1:], 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit():
        raise ValueError("%s: N must be a whole number of samples, e.g. mnist1d:200000 or "
                         "mnist1d:1M (default %d)" % (spec, DEFAULT_N))
    n = int(digits) * scale
    if not MIN_N <= n <= MAX_N:
        raise ValueError("%s: N is %d; give between %d and %d samples (train and test "
                         "together)" % (spec, n, MIN_N, MAX_N))
    return n


def split_sizes(n):
    """(n_train, n_test) of N samples: the test set is a fifth, at most TEST_MAX."""
    n_test = min(n // 5, TEST_MAX)
    return n - n_test, n_test


def chunks_of(n):
    """{"train": chunk count, "test": chunk count} that N samples need."""
    n_train, n_test = split_sizes(n)
    return {"train": -(-n_train // CHUNK), "test": -(-n_test // CHUNK)}


def chunk_seed(split, i):
    return 2 * i + (split == "test")


# ---------------------------------------------------------------- where it lives
def cache_root():
    """$HPCDL_CACHE/mnist1d, else $XDG_CACHE_HOME/hpcdl/mnist1d, else ~/.cache/hpcdl/mnist1d."""
    base = os.environ.get("HPCDL_CACHE")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                               ".cache")
        base = os.path.join(xdg, "hpcdl")
    return os.path.join(base, "mnist1d")


def _package():
    try:
        from importlib.metadata import version
        import mnist1d.data
        return mnist1d.data, version(PACKAGE)
    except ImportError as e:
        raise DataError("--data mnist1d needs the mnist1d package (%s); install it with "
                        "`pip install %s` (make setup does)" % (e, PACKAGE_PIN))


def generator_args(seed=0):
    """make_dataset's arguments for one chunk: the package's defaults, CHUNK
    samples, seed, and no train/test split (we keep whole chunks)."""
    package, _ = _package()
    args = package.get_dataset_args()
    args.num_samples, args.seed, args.train_split = CHUNK, seed, 1.0
    return args


def key():
    """Names the cache directory: package version + generator arguments + layout."""
    _, version = _package()
    args = dict(vars(generator_args()))
    for name in ("seed", "url"):
        args.pop(name, None)
    text = json.dumps({"version": version, "args": args, "chunk": CHUNK, "layout": LAYOUT},
                      sort_keys=True)
    return "v%d-%s" % (LAYOUT, hashlib.sha256(text.encode()).hexdigest()[:16])


def directory():
    return os.path.join(cache_root(), key())


def chunk_path(folder, split, i):
    return os.path.join(folder, "%s-%05d.npz" % (split, i))


# ---------------------------------------------------------------- one chunk
def make_chunk(split, i):
    """(x float32 (CHUNK, LENGTH), y int64 (CHUNK,)) of chunk i of split, by
    make_dataset. It reseeds numpy's and random's global generators: their
    states are put back, so the caller's draws do not change."""
    package, _ = _package()
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        d = package.make_dataset(generator_args(chunk_seed(split, i)))
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    return d["x"].astype(np.float32), d["y"].astype(np.int64)


def _write_chunk(folder, split, i):
    """Generates chunk i of split into its file (temporary name, then os.replace)."""
    x, y = make_chunk(split, i)
    path = chunk_path(folder, split, i)
    with atomic_open(path) as f:
        np.savez(f, x=x, y=y)
    return split, i


def read_chunk(path):
    """(x, y) of a chunk file; ValueError saying why if it is not a whole chunk."""
    try:
        with np.load(path, allow_pickle=False) as z:
            x, y = z["x"], z["y"]  # reading a member whole checks its zip CRC-32
    except Exception as e:  # zipfile.BadZipFile, OSError, EOFError, KeyError, ValueError
        raise ValueError("does not read (%s: %s)" % (type(e).__name__, e))
    if x.shape != (CHUNK, LENGTH) or x.dtype != np.float32 or y.shape != (CHUNK,):
        raise ValueError("holds x %s %s, y %s; expected x (%d, %d) float32, y (%d,)"
                         % (x.shape, x.dtype, y.shape, CHUNK, LENGTH, CHUNK))
    if y.dtype != np.int64 or y.min() < 0 or y.max() >= NUM_CLASSES:
        raise ValueError("has labels outside 0..%d" % (NUM_CLASSES - 1))
    if not np.isfinite(x).all():
        raise ValueError("has values that are not finite")
    return x, y


# ---------------------------------------------------------------- generating the missing
def _log(msg):
    print("hpcdl: MNIST-1D: " + msg, file=sys.stderr, flush=True)


def _clock(seconds):
    m, s = divmod(int(round(seconds)), 60)
    return "%dm%02ds" % (m, s) if m else "%ds" % s


def default_workers():
    """CPUs to generate with: 1 inside an MPI rank, whose child processes
    inherit its launcher's environment and fail to start under Open MPI
    (orte_init: BrokenProcessPool; the launcher, `hpcdl train -n N`,
    generates with every CPU before the ranks start)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8))


def _generate(folder, todo, workers, log):
    """Writes the chunks todo [(split, i)], workers at a time, with progress lines."""
    workers = max(1, min(workers, len(todo)))
    log("generating %d chunk(s) of %d samples into %s with %d process(es) (about %s of CPU "
        "in all); later runs read them" % (len(todo), CHUNK, folder, workers,
                                          _clock(len(todo) * CHUNK * 0.15e-3)))
    start = last = time.monotonic()
    done = 0

    def tick():
        nonlocal last
        now = time.monotonic()
        if now - last >= 10 or done == len(todo):
            left = (now - start) / done * (len(todo) - done)
            log("%d/%d chunks (%d%%), %s, about %s left" % (
                done, len(todo), 100 * done // len(todo), _clock(now - start), _clock(left)))
            last = now
    if workers == 1:
        for split, i in todo:
            _write_chunk(folder, split, i)
            done += 1
            tick()
        return
    # spawn, not fork: the caller may be an MPI rank, whose copy by fork is unsafe
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        for f in as_completed([ex.submit(_write_chunk, folder, s, i) for s, i in todo]):
            f.result()
            done += 1
            tick()


class _Lock:
    """An exclusive lock on folder/.lock (flock; a file system without flock
    runs unlocked: two generators then write the same bytes twice)."""

    def __init__(self, folder):
        self.path, self.f = os.path.join(folder, ".lock"), None

    def __enter__(self):
        self.f = open(self.path, "a")
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX)
        except OSError:
            pass
        return self

    def __exit__(self, *exc):
        self.f.close()  # releases the lock


def _missing(folder, needed, log):
    """The (split, i) of needed whose files are absent or do not read whole."""
    out = []
    for split, i in needed:
        path = chunk_path(folder, split, i)
        if not os.path.exists(path):
            out.append((split, i))
            continue
        try:
            read_chunk(path)
        except ValueError as e:
            log("cache file %s %s; generating it again" % (path, e))
            out.append((split, i))
    return out


def ensure(n, workers=None, log=_log, check=False):
    """Makes sure the cache holds every chunk N samples need; returns the
    number of chunks generated (0: all were there). check: read every file
    (under the lock) and generate again those that do not read whole, instead
    of trusting the ones present. DataError if the cache cannot be written."""
    folder = directory()
    counts = chunks_of(n)
    needed = [(s, i) for s in ("train", "test") for i in range(counts[s])]
    if not check and all(os.path.exists(chunk_path(folder, *c)) for c in needed):
        return 0  # load() checks each file as it reads it
    try:
        os.makedirs(folder, exist_ok=True)
        with _Lock(folder):
            todo = _missing(folder, needed, log)  # under the lock: others may have made some
            if todo:
                _generate(folder, todo, workers or default_workers(), log)
    except OSError as e:
        raise DataError("cannot write the MNIST-1D cache in %s (%s); set HPCDL_CACHE to a "
                        "writable directory" % (folder, e.strerror or e))
    return len(todo)


# ---------------------------------------------------------------- the data set
def load(n, workers=None, log=_log):
    """{"x_train", "y_train", "x_test", "y_test"} (float32 (n, 40), int64) of N
    samples, generating what the cache lacks. The arrays are make_dataset's
    (each chunk standardised by itself); no further standardisation here."""
    ensure(n, workers, log)
    out, bad = _read(n)
    if bad:  # a file that does not read whole: generated again, with a warning
        ensure(n, workers, log, check=True)
        out, bad = _read(n)
    if bad:
        raise DataError("MNIST-1D cache file %s %s, even after generating it again; remove "
                        "%s and retry" % (bad[0][0], bad[0][1], directory()))
    return out


def _read(n):
    """(arrays, [(path, why)] of the chunk files that did not read)."""
    folder, out, bad = directory(), {}, []
    for split, count in zip(("train", "test"), split_sizes(n)):
        x = np.empty((count, LENGTH), dtype=np.float32)
        y = np.empty(count, dtype=np.int64)
        for i in range(chunks_of(n)[split]):
            path = chunk_path(folder, split, i)
            try:
                cx, cy = read_chunk(path)
            except ValueError as e:
                bad.append((path, e))
                continue
            rows = slice(i * CHUNK, min(count, (i + 1) * CHUNK))
            x[rows], y[rows] = cx[:rows.stop - rows.start], cy[:rows.stop - rows.start]
        out["x_" + split], out["y_" + split] = x, y
    return out, bad

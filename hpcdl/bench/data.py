"""data.py - `hpcdl bench data`: samples/s of H5ShardDataset through a torch
DataLoader against naive random access to one HDF5 file and against an
in-memory array: the same samples, the same DataLoader settings, one run.

    hpcdl bench data                          # digits, batch 128, 2 workers
    hpcdl bench data --source synthetic --samples 50000 --shape 3,32,32

Rows (every loader yields (float32 tensor, int) per sample, random order
from DistributedShardSampler with the same seed):
    memory           numpy arrays in memory (the ceiling)
    naive-h5         one HDF5 file, same chunks and filter as the shards,
                     one h5py read per sample
    naive-h5-contig  one HDF5 file, contiguous and unfiltered, one read per sample
    shards           H5ShardDataset: chunk reads, chunk cache, batched __getitems__
    shards-grouped   the same with chunk-grouped sampling (chunk_window)
and a consumer row: the MLP train step on the same batches (one thread, as
`hpcdl train` runs), what the loader has to keep up with. After the timed
epochs, one more epoch of each loader is compared sample by sample with the
in-memory arrays (#wrong); the exit status is 1 if any sample differs.
"""
import os
import shutil
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..data import (DistributedShardSampler, H5ShardDataset, SampleBatch, _mpi, collate,
                    sources, writer)
from .allreduce import code_version, describe_job
from ..utils.log import print0
from .. import models
from ..train.config import TrainConfig
from ..utils.atomic import write_json


@dataclass
class Options:
    source: str = "digits"      # digits | synthetic
    data: str = None            # an existing shard directory (its train split)
    samples: int = 50000        # synthetic only
    shape: tuple = (3, 32, 32)  # synthetic only
    batch: int = 128
    workers: int = 2
    shards: int = 4
    chunk_rows: int = 0         # 0: the writer's automatic choice
    compression: str = "gzip"
    window: int = 4             # chunk_window of the shards-grouped row
    budget_s: float = 2.0       # timed seconds per row
    dir: str = None             # where the benchmark writes its files
    json: str = None


class MemoryDataset(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i].astype(np.float32)), int(self.y[i])

    def __getitems__(self, indices):  # one fancy-indexed copy per batch: the ceiling
        return SampleBatch(self.x[indices], self.y[indices])


class NaiveH5Dataset(torch.utils.data.Dataset):
    """The usual first attempt: one file, one h5py read per sample; file and
    datasets opened once, lazily, in each worker (so HDF5's own chunk cache
    stays warm)."""

    def __init__(self, path, n):
        self.path, self.n, self.xy = path, n, None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.xy is None:
            import h5py  # on use: loads h5py
            f = h5py.File(self.path, "r")
            self.xy = f["x"], f["y"]
        x, y = self.xy
        return torch.from_numpy(x[i].astype(np.float32)), int(y[i])

    def __getstate__(self):
        return dict(self.__dict__, xy=None)


# ---------------------------------------------------------------- the data
def prepare(opts, workdir):
    """(shard directory, description) with the data written: rank 0 only."""
    if opts.data:
        return opts.data, "shards in " + opts.data
    if opts.source == "digits":
        source = sources.open_source("digits")
    else:
        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, size=(opts.samples,) + tuple(opts.shape), dtype=np.uint8)
        y = rng.integers(0, 10, size=opts.samples)
        source = sources.Source("synthetic uint8", {"train": sources.array_part(
            x, y, "synthetic")}, [str(k) for k in range(10)])
    out = os.path.join(workdir, "shards")
    writer.write_shards(source, out, writer.ShardOptions(
        shards=opts.shards, compression=opts.compression, chunk_rows=opts.chunk_rows))
    return out, source.description


def write_naive(ds, x, y, workdir):
    """The same samples in the same order in one file, twice: chunked and
    filtered as the shards, and contiguous without a filter."""
    import h5py  # on use: loads h5py
    paths = {}
    filt = {} if ds.manifest.doc["compression"] == "none" else {
        "compression": ds.manifest.doc["compression"]}
    for name, kw in (("naive-h5", dict(chunks=(min(ds.chunk_rows, len(y)),) + x.shape[1:],
                                       **filt)), ("naive-h5-contig", {})):
        paths[name] = os.path.join(workdir, name + ".h5")
        with h5py.File(paths[name], "w") as f:
            f.create_dataset("x", data=x, **kw)
            f.create_dataset("y", data=y)
    return paths


def load_all(ds):
    """The split as in-memory arrays (x as stored, y), read from the shards."""
    x = np.stack([ds.get_raw(i)[0] for i in range(len(ds))])
    y = ds.read_field("y")
    return x, y


# ---------------------------------------------------------------- timing
def loader_for(ds, opts, rank, size, window=0):
    sampler = DistributedShardSampler(ds, num_replicas=size, rank=rank, seed=1,
                                      chunk_window=window)
    loader = torch.utils.data.DataLoader(ds, batch_size=opts.batch, sampler=sampler,
                                         num_workers=opts.workers, collate_fn=collate,
                                         persistent_workers=opts.workers > 0)
    return loader, sampler


def time_loader(loader, sampler, opts):
    """(samples, seconds, CPU seconds of this process and its workers): the
    batches after a warm-up of two per worker, until the time budget is spent
    (epochs continue through set_epoch; the last one may stop part way)."""
    def batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1
    stream = batches()
    for _ in range(2 * max(1, opts.workers)):
        next(stream)
    samples, cpu0, t0 = 0, cpu_seconds(loader), time.perf_counter()
    while time.perf_counter() - t0 < opts.budget_s:
        samples += len(next(stream)[1])
    seconds = time.perf_counter() - t0
    return samples, seconds, cpu_seconds(loader) - cpu0


def cpu_seconds(loader):
    """User + system CPU seconds of this process and the loader's live workers.
    The worker processes are reached through torch's private _iterator._workers
    (kept alive by persistent_workers): the one place this module does so."""
    total = sum(os.times()[:2])
    it = getattr(loader, "_iterator", None)
    for w in getattr(it, "_workers", []) or []:
        try:
            with open("/proc/%d/stat" % w.pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return float("nan")  # no /proc: no CPU column
    return total


def count_wrong(loader, sampler, x, y):
    """Samples of one more epoch that differ from the in-memory truth."""
    sampler.set_epoch(10 ** 6)
    idx = np.asarray(list(sampler))
    wrong, pos = 0, 0
    for xb, yb in loader:
        want = idx[pos:pos + len(yb)]
        pos += len(yb)
        same_x = (xb.reshape(len(yb), -1).numpy() ==
                  x[want].reshape(len(want), -1).astype(np.float32)).all(axis=1)
        wrong += int((~same_x | (yb.numpy() != y[want])).sum())
    return wrong + abs(len(idx) - pos)


def consumer_rate(x, opts):
    """samples/s of the MLP train step (hpcdl train's model, one thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        features = int(np.prod(x.shape[1:]))
        model = models.build("mlp", features, 10, hidden=TrainConfig.hidden)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        xb = torch.randn(opts.batch, features)
        yb = torch.randint(0, 10, (opts.batch,))
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < min(1.0, opts.budget_s):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            steps += 1
        return steps * opts.batch / (time.perf_counter() - t0), features
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------- the run
def run(opts):
    from mpi4py import MPI  # on use: loads MPI
    mpi = MPI.COMM_WORLD
    job = describe_job(mpi)
    workdir = _mpi.on_root(mpi, lambda: tempfile.mkdtemp(prefix="hpcdl-bench-data-",
                                                         dir=opts.dir))
    try:
        return _run(opts, mpi, job, workdir)
    finally:
        mpi.Barrier()
        if mpi.rank == 0:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(opts, mpi, job, workdir):
    shard_dir, description = _mpi.on_root(mpi, lambda: prepare(opts, workdir))
    ds = H5ShardDataset(shard_dir, "train")
    if ds.encoding != "raw":
        raise ValueError("bench data needs arrays; shard image folders with --decode")
    x, y = load_all(ds)
    naive = _mpi.on_root(mpi, lambda: write_naive(ds, x, y, workdir))
    say = print0  # rank 0 prints the table
    say("# hpcdl bench data: samples/s through a torch DataLoader, same data, same run")
    say("#  %s" % code_version())
    say("#  data: %s: %d samples of %s %s, %d shards, %s, %d rows per chunk"
        % (description, len(ds), "x".join(map(str, ds.sample_shape)), x.dtype,
           len(ds._paths), ds.manifest.doc["compression"], ds.chunk_rows))
    say("#  ranks %d | cores %s | load average %.1f | DataLoader: batch %d, %d worker(s) per "
        "rank, random order, %.1f s per row after 2 warm-up batches per worker"
        % (mpi.size, job["cores"], job["load_avg_1min"], opts.batch, opts.workers,
           opts.budget_s))
    datasets = [("memory", MemoryDataset(x, y), 0), ("naive-h5",
                NaiveH5Dataset(naive["naive-h5"], len(y)), 0),
                ("naive-h5-contig", NaiveH5Dataset(naive["naive-h5-contig"], len(y)), 0),
                ("shards", ds, 0), ("shards-grouped", ds, opts.window)]
    rows = []
    for name, data, window in datasets:
        loader, sampler = loader_for(data, opts, mpi.rank, mpi.size, window)
        mpi.Barrier()
        n, seconds, cpu = time_loader(loader, sampler, opts)
        wrong = mpi.allreduce(count_wrong(loader, sampler, x, y))
        rate = mpi.allreduce(n / seconds)  # every rank reads its own part
        rows.append(dict(loader=name, window=window, samples=mpi.allreduce(n),
                         seconds=mpi.allreduce(seconds, op=max_op()), samples_per_s=rate,
                         cpu_us_per_sample=1e6 * mpi.allreduce(cpu) / mpi.allreduce(n),
                         wrong=wrong))
        del loader  # its workers end here
    return report(opts, rows, consumer_rate(x, opts), say, mpi, job)


def report(opts, rows, consumer, say, mpi, job):
    by = {r["loader"]: r for r in rows}
    naive = max(by["naive-h5"]["samples_per_s"], by["naive-h5-contig"]["samples_per_s"])
    naive_cpu = min(by["naive-h5"]["cpu_us_per_sample"],
                    by["naive-h5-contig"]["cpu_us_per_sample"])
    say("#\n# %16s %7s %6s %9s %7s %10s %8s %8s %8s %6s" % (
        "loader", "workers", "batch", "samples", "time(s)", "samples/s", "vs naive",
        "cpu(us)", "cpu/naive", "#wrong"))
    for r in rows:
        say("  %16s %7d %6d %9d %7.2f %10.0f %8.2f %8.1f %8.2f %6d" % (
            r["loader"], opts.workers, opts.batch, r["samples"], r["seconds"],
            r["samples_per_s"], r["samples_per_s"] / naive, r["cpu_us_per_sample"],
            r["cpu_us_per_sample"] / naive_cpu, r["wrong"]))
    say("#  cpu(us): CPU time per sample of the main process and its workers together")
    rate, features = consumer
    rate *= mpi.size
    say("#  consumer: MLP %d-%s-10 train step, 1 thread per rank, batch %d: %.0f samples/s"
        % (features, "-".join(map(str, _hidden())), opts.batch, rate))
    for name in ("shards", "shards-grouped"):
        got = by[name]["samples_per_s"]
        say("# target: %s >= 2x naive HDF5 random access (the faster naive row): %.2fx %s; "
            "> the MLP step: %.2fx %s" % (name, got / naive, "MET" if got >= 2 * naive
                                           else "NOT MET", got / rate,
                                           "MET" if got > rate else "NOT MET"))
    wrong = sum(r["wrong"] for r in rows)
    say("# Wrong or missing samples: %d %s" % (wrong, "OK" if wrong == 0 else "FAILED"))
    if opts.json and mpi.rank == 0:
        write_json(opts.json, dict(job=job, rows=rows, consumer_samples_per_s=rate,
                                   batch=opts.batch, workers=opts.workers), indent=1)
    return 1 if wrong else 0


def _hidden():
    return TrainConfig.hidden


def max_op():
    from mpi4py import MPI  # on use: loads MPI
    return MPI.MAX

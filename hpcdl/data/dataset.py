"""dataset.py - H5ShardDataset: one split of a shard directory as a PyTorch
map-style dataset.

    ds = H5ShardDataset("shards/digits", split="train")
    x, y = ds[0]          # x: torch.float32 tensor of ds.sample_shape, y: int
    ds.num_classes, ds.class_names, ds.sample_shape

Every sample comes back the same way: (torch.float32 tensor, int label). The
tensor holds the stored values unchanged (uint8 pixels become 0.0..255.0; no
scaling); encoded images are decoded first to (C, H, W). `transform`, if
given, is applied to that tensor. Global index i runs over the split's
shards in manifest order (shard 0's rows, then shard 1's, ...).

    loader = DataLoader(ds, batch_size=B, sampler=..., num_workers=2, collate_fn=collate)

Reads: a sample is read with its whole chunk (chunk_rows rows, the HDF5
chunk), which stays in a per-process ChunkCache; a shard's labels are read
once, when the shard opens. __getitems__ (DataLoader's call for a batch) reads
each chunk a batch touches once and returns the batch as numpy arrays; collate
makes the float32 / int64 tensors of it, after the trip from a worker. Files
open lazily, in the process that reads, so DataLoader workers (num_workers > 0)
open their own handles. Errors name the file, the rows / sample and the field.
"""
import os
from collections.abc import Sequence

import numpy as np
import torch

from . import images
from .cache import ChunkCache
from .manifest import DataError, Manifest, block_digest
from .stage import stage_shards


class SampleBatch(Sequence):
    """What __getitems__ returns: a batch as numpy arrays, x (B, *sample_shape)
    in the stored dtype and y (B,) int64, that also reads as the sequence of its
    samples (float32 tensor, int), so torch's default collate works on it too."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.from_numpy(np.asarray(self.x[i], dtype=np.float32)), int(self.y[i])


class _WireBatch:
    """A batch leaving a DataLoader worker: x still in the stored dtype (uint8
    pixels are a quarter of float32), as plain numpy bytes through the worker's
    pipe, which costs far less CPU than torch's shared-memory hand-over of each
    tensor for batches up to a few MiB; larger ones go through shared memory.
    It arrives in the main process as the (x float32, y int64) tensors."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __reduce__(self):
        x = self.x if self.x.nbytes <= WIRE_PIPE_MAX_BYTES else torch.from_numpy(self.x)
        return (_tensors, (x, self.y))


WIRE_PIPE_MAX_BYTES = 4 << 20


def _tensors(x, y):
    x = x.numpy() if isinstance(x, torch.Tensor) else x
    return torch.from_numpy(np.asarray(x, dtype=np.float32)), torch.from_numpy(y)


def collate(batch):
    """DataLoader collate_fn for H5ShardDataset: a SampleBatch becomes the
    batch's (x float32, y int64) tensors in one step (in a worker, on arrival
    in the main process); anything else goes through torch's default_collate."""
    if isinstance(batch, SampleBatch):
        if torch.utils.data.get_worker_info() is not None:
            return _WireBatch(batch.x, batch.y)
        return _tensors(batch.x, batch.y)
    return torch.utils.data.default_collate(batch)


class H5ShardDataset(torch.utils.data.Dataset):
    """One split of a shard directory written by `hpcdl data shard`.

    directory: the shard directory; split: "train" or "val" (see the manifest).
    transform: callable on the float32 tensor of each sample.
    stage_to: a node-local folder ($TMPDIR, /dev/shm): the split's shards are
      copied there once per node (collective over comm; see stage.py) and read
      from there. comm: mpi4py communicator for staging (default: the job's).
    cache_bytes: size of the in-memory chunk cache per process
      (default $HPCDL_DATA_CACHE_BYTES or 64 MiB).
    verify_reads: check each chunk read from a file against the manifest's
      checksums (about 0.25 ms per MiB read; cached chunks cost nothing).
    """

    def __init__(self, directory, split="train", transform=None, stage_to=None,
                 cache_bytes=None, comm=None, verify_reads=True):
        if stage_to is not None:
            directory = stage_shards(directory, stage_to, splits=(split,), comm=comm)
        m = self.manifest = Manifest(directory)
        self.directory, self.split, self.transform = m.directory, split, transform
        self.num_classes, self.class_names = m.num_classes, m.class_names
        self.sample_shape, self.encoding = m.sample_shape, m.encoding
        self.chunk_rows, self.verify_reads = m.chunk_rows, verify_reads
        self._shards = m.split(split)["shards"]
        self._paths = [m.shard_path(s) for s in self._shards]
        counts = [s["num_samples"] for s in self._shards]
        self._offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._check_files()
        self._cache = ChunkCache(cache_bytes)
        self._files, self._pid, self._inherited = {}, os.getpid(), []

    def __len__(self):
        return int(self._offsets[-1])

    def __repr__(self):
        return ("H5ShardDataset(%r, split=%r: %d samples in %d shards, sample_shape %s, "
                "%d classes)" % (self.directory, self.split, len(self), len(self._paths),
                                 self.sample_shape, self.num_classes))

    # ------------------------------------------------------------ files
    def _check_files(self):
        """Cheap checks of every shard (one stat each, no HDF5 open): present, and
        of the size the manifest recorded."""
        for path, s in zip(self._paths, self._shards):
            if not os.path.exists(path):
                raise DataError("%s: missing (listed in %s/manifest.json); restore it or "
                                "shard again" % (path, self.directory))
            size = os.path.getsize(path)
            if size != s["bytes"]:
                raise DataError("%s: %d bytes, the manifest says %d (truncated or replaced "
                                "since it was written); run 'hpcdl data verify %s', then "
                                "restore the file or shard again"
                                % (path, size, s["bytes"], self.directory))

    def _open(self, s):
        """(h5py.File, its x dataset, all its labels) of shard s, opened in this
        process on first use: the layout is checked and the labels (8 bytes a
        sample) are read and checked once, so a chunk read is one HDF5 read."""
        if self._pid != os.getpid():  # a forked DataLoader worker: own handles
            self._inherited.append(self._files)  # never closed here: the parent's
            self._files, self._pid = {}, os.getpid()
        shard = self._files.get(s)
        if shard is None:
            import h5py  # on use: loads h5py
            try:
                f = h5py.File(self._paths[s], "r")
            except OSError as e:
                raise DataError("%s: does not open as HDF5 (%s); the file is truncated or "
                                "corrupted: restore it or shard again" % (self._paths[s], e))
            try:
                self._check_layout(f, s)
                shard = self._files[s] = (f, f["x"], self._read_labels(f, s))
            except DataError:
                f.close()
                raise
        return shard

    def _read_labels(self, f, s):
        n = self._shards[s]["num_samples"]
        y = self._read(f["y"], s, "y", 0, n)
        if self.verify_reads:
            for c, lo in enumerate(range(0, n, self.chunk_rows)):
                hi = min(n, lo + self.chunk_rows)
                self._check_digest(s, "y", c, y[lo:hi], lo, hi)
        bad = np.flatnonzero((y < 0) | (y >= self.num_classes))
        if len(bad):
            row = int(bad[0])
            raise DataError("%s: label %d at row %d (sample %d of split %r) is outside "
                            "0..%d (%d classes in the manifest)"
                            % (self._paths[s], y[row], row, self._offsets[s] + row, self.split,
                               self.num_classes - 1, self.num_classes))
        return y

    def _check_layout(self, f, s):
        """The file's datasets against the manifest: fields, rows, shape, dtype."""
        n, path = self._shards[s]["num_samples"], self._paths[s]
        for field in ("x", "y"):
            if field not in f:
                raise DataError("%s: field %r missing; the file is not a shard of this "
                                "manifest: restore it or shard again" % (path, field))
            if f[field].shape[0] != n:
                raise DataError("%s: field %r has %d rows, the manifest says %d (the "
                                "manifest and the files disagree): restore the file or shard "
                                "again" % (path, field, f[field].shape[0], n))
        x = f["x"]
        if self.encoding == "raw" and (x.shape[1:] != self.sample_shape or
                                       x.dtype != self.manifest.dtype):
            raise DataError("%s: field 'x' holds %s %s samples, the manifest says %s %s"
                            % (path, x.dtype, x.shape[1:], self.manifest.dtype,
                               self.sample_shape))

    def close(self):
        for f, _, _ in self._files.values():
            f.close()
        self._files = {}

    def __getstate__(self):  # to DataLoader workers: no open files, an empty cache
        state = dict(self.__dict__)
        state.update(_files={}, _inherited=[], _cache=ChunkCache(self._cache.max_bytes))
        return state

    # ------------------------------------------------------------ chunks
    def locate(self, indices):
        """(shard, row) arrays of global indices (IndexError if out of range)."""
        idx = np.asarray(indices, dtype=np.int64)
        n = len(self)
        idx = np.where(idx < 0, idx + n, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = idx[(idx < 0) | (idx >= n)][0]
            raise IndexError("index %d is out of range for %d samples" % (bad, n))
        shard = np.searchsorted(self._offsets, idx, side="right") - 1
        return shard, idx - self._offsets[shard]

    def chunk_spans(self):
        """(num_chunks, 2) int64: [start, stop) global indices of every chunk, in order."""
        spans = []
        for s in range(len(self._paths)):
            lo, hi = self._offsets[s], self._offsets[s + 1]
            starts = np.arange(lo, hi, self.chunk_rows)
            spans.append(np.stack([starts, np.minimum(starts + self.chunk_rows, hi)], 1))
        return np.concatenate(spans).astype(np.int64)

    def _chunk(self, s, c):
        """(x rows, labels) of chunk c of shard s: x through the cache."""
        return (self._cache.get((s, c), lambda: self._read_chunk(s, c)),
                self._open(s)[2][c * self.chunk_rows:(c + 1) * self.chunk_rows])

    def _read_chunk(self, s, c):
        _, xs, _ = self._open(s)
        lo = c * self.chunk_rows
        hi = min(lo + self.chunk_rows, self._shards[s]["num_samples"])
        x = self._read(xs, s, "x", lo, hi)
        if self.verify_reads:
            self._check_digest(s, "x", c, x, lo, hi)
        return x, (sum(len(b) for b in x) if x.dtype == object else x.nbytes)

    def _read(self, dset, s, field, lo, hi):
        try:
            return dset[lo:hi]
        except (OSError, ValueError) as e:
            raise DataError("%s: field %r, rows %d..%d (samples %d..%d of split %r) do not "
                            "read (%s); the file is corrupted: restore it or shard again"
                            % (self._paths[s], field, lo, hi - 1, self._offsets[s] + lo,
                               self._offsets[s] + hi - 1, self.split, e))

    def _check_digest(self, s, field, c, values, lo, hi):
        """A block freshly read from a file against the manifest's checksum:
        corruption the HDF5 filter cannot see (no filter, or a changed value)
        is an error, not a wrong sample."""
        want = self._shards[s]["checksums"][field]
        if c >= len(want) or block_digest(values) != want[c]:
            raise DataError("%s: field %r, rows %d..%d (samples %d..%d of split %r): "
                            "checksum differs from the manifest; the file is corrupted or "
                            "was changed: restore it or shard again"
                            % (self._paths[s], field, lo, hi - 1, self._offsets[s] + lo,
                               self._offsets[s] + hi - 1, self.split))

    # ------------------------------------------------------------ samples
    def _decoded(self, s, row, x):
        """x as an array: encoded image bytes are decoded (error names the row)."""
        if self.encoding != "image":
            return x
        try:
            return images.decode(x, self.manifest.channels)
        except ValueError as e:
            raise DataError("%s: row %d (sample %d of split %r): %s"
                            % (self._paths[s], row, self._offsets[s] + row, self.split, e))

    def _sample(self, s, row, x):
        t = torch.from_numpy(np.asarray(self._decoded(s, row, x), dtype=np.float32))
        return self.transform(t) if self.transform is not None else t

    def __getitem__(self, i):
        shard, row = self.locate([i])
        s, r = int(shard[0]), int(row[0])
        xs, ys = self._chunk(s, r // self.chunk_rows)
        k = r % self.chunk_rows
        return self._sample(s, r, xs[k]), int(ys[k])

    def __getitems__(self, indices):
        """A batch (DataLoader calls this with a batch's indices): each chunk it
        touches is read, or found in the cache, once. Returns a SampleBatch
        (numpy arrays in the stored dtype that also read as a sequence of
        samples) that hpcdl.data.collate turns into the batch's tensors in one
        step; with a transform or images of mixed sizes, a list of samples."""
        shard, row = self.locate(indices)
        key = shard * (1 << 40) + row // self.chunk_rows
        groups = []
        for k in np.unique(key):
            members = np.flatnonzero(key == k)
            s, c = int(shard[members[0]]), int(row[members[0]] // self.chunk_rows)
            groups.append((s, members, row[members], self._chunk(s, c)))
        if self.transform is not None or self.sample_shape is None:
            out = [None] * len(shard)
            for s, members, rows, (xs, ys) in groups:
                for m, r in zip(members, rows):
                    out[m] = (self._sample(s, int(r), xs[r % self.chunk_rows]),
                              int(ys[r % self.chunk_rows]))
            return out
        dtype = self.manifest.dtype if self.encoding == "raw" else np.uint8
        x = np.empty((len(shard),) + self.sample_shape, dtype=dtype)
        y = np.empty(len(shard), dtype=np.int64)
        for s, members, rows, (xs, ys) in groups:
            local = rows % self.chunk_rows
            if self.encoding == "raw":
                x[members] = xs[local]
            else:
                for m, r, j in zip(members, rows, local):
                    x[m] = self._decoded(s, int(r), xs[j])
            y[members] = ys[local]
        return SampleBatch(x, y)

    def get_raw(self, i):
        """(x as stored: a numpy array, or encoded image bytes as uint8; label)."""
        shard, row = self.locate([i])
        s, r = int(shard[0]), int(row[0])
        xs, ys = self._chunk(s, r // self.chunk_rows)
        return xs[r % self.chunk_rows], int(ys[r % self.chunk_rows])

    def read_field(self, field):
        """A small per-sample field ("y" or "source_index") for the whole split."""
        if field == "y":  # read and checked when each shard opens
            return np.concatenate([self._open(s)[2] for s in range(len(self._paths))])
        parts = []
        for s in range(len(self._paths)):
            f = self._open(s)[0]
            if field not in f:
                raise DataError("%s: field %r missing" % (self._paths[s], field))
            parts.append(self._read(f[field], s, field, 0, self._shards[s]["num_samples"]))
        return np.concatenate(parts)

    def feature_stats(self):
        """(mean, std) float64 arrays of sample_shape over the split, for
        standardising (std 0 is returned as 1)."""
        if self.sample_shape is None:
            raise DataError("%s: images of mixed sizes have no per-feature statistics"
                            % self.directory)
        total, squares = np.zeros(self.sample_shape), np.zeros(self.sample_shape)
        for s in range(len(self._paths)):
            n = self._shards[s]["num_samples"]
            for c in range(-(-n // self.chunk_rows)):
                xs, _ = self._chunk(s, c)
                rows = range(c * self.chunk_rows, c * self.chunk_rows + len(xs))
                v = np.stack([self._decoded(s, r, x) for r, x in zip(rows, xs)]) \
                    if self.encoding == "image" else xs
                v = v.astype(np.float64)
                total += v.sum(0)
                squares += (v * v).sum(0)
        mean = total / len(self)
        std = np.sqrt(np.maximum(squares / len(self) - mean * mean, 0))
        std[std == 0] = 1.0
        return mean, std

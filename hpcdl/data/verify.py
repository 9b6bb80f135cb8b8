"""verify.py - `hpcdl data verify` and `hpcdl data inspect` as functions.

verify_shard reads one shard file in full and checks it against the manifest:
present, its size, opens as HDF5, every field with its rows, shape and dtype,
every block's checksum, labels in range, and (encoded images) that every image
decodes. The first problem is returned as one line naming the file, the field
and the rows. Under MPI the ranks divide the shard files.
"""
import os

import numpy as np

from . import _mpi, images
from .manifest import FIELDS, DataError, Manifest, block_digest


def verify_shard(m, shard):
    """None if the shard is sound, else one line saying what is wrong where."""
    import h5py  # on use: loads h5py
    path = m.shard_path(shard)
    if not os.path.exists(path):
        return "%s: missing" % path
    size = os.path.getsize(path)
    if size != shard["bytes"]:
        return "%s: %d bytes, the manifest says %d" % (path, size, shard["bytes"])
    try:
        with h5py.File(path, "r") as f:
            for field in FIELDS:
                problem = _check_field(m, shard, path, f, field)
                if problem:
                    return problem
    except OSError as e:
        return "%s: does not open as HDF5 (%s)" % (path, e)
    return None


def _check_field(m, shard, path, f, field):
    n, rows = shard["num_samples"], m.chunk_rows
    if field not in f:
        return "%s: field %r missing" % (path, field)
    d = f[field]
    if d.shape[0] != n:
        return "%s: field %r has %d rows, the manifest says %d" % (path, field, d.shape[0], n)
    if field == "x" and m.encoding == "raw" and (d.shape[1:] != m.sample_shape or
                                                 d.dtype != m.dtype):
        return "%s: field 'x' holds %s %s, the manifest says %s %s" % (
            path, d.dtype, d.shape[1:], m.dtype, m.sample_shape)
    digests = shard["checksums"].get(field, [])
    if len(digests) != -(-n // rows):
        return "%s: field %r: the manifest has %d checksums for %d blocks" % (
            path, field, len(digests), -(-n // rows))
    for b, lo in enumerate(range(0, n, rows)):
        hi = min(n, lo + rows)
        try:
            block = d[lo:hi]
        except (OSError, ValueError) as e:
            return "%s: field %r rows %d..%d do not read (%s)" % (path, field, lo, hi - 1, e)
        if block_digest(block) != digests[b]:
            return "%s: field %r rows %d..%d: checksum differs from the manifest" % (
                path, field, lo, hi - 1)
        problem = _check_values(m, path, field, block, lo)
        if problem:
            return problem
    return None


def _check_values(m, path, field, block, lo):
    if field == "y":
        bad = np.flatnonzero((block < 0) | (block >= m.num_classes))
        if len(bad):
            return "%s: field 'y' row %d: label %d is outside 0..%d" % (
                path, lo + bad[0], block[bad[0]], m.num_classes - 1)
    if field == "x" and m.encoding == "image":
        for k, data in enumerate(block):
            try:
                images.decode(data, m.channels)
            except ValueError as e:
                return "%s: field 'x' row %d: %s" % (path, lo + k, e)
    return None


def verify(directory, comm=None):
    """[(split, file, samples, problem or None)] for every shard, on every rank
    (collective over comm; the ranks divide the files). DataError if the
    manifest itself is bad."""
    rank, size = _mpi.rank_and_size(comm)
    m = Manifest(directory)
    shards = [(name, s) for name in sorted(m.splits) for s in m.split(name)["shards"]]
    mine = {k: verify_shard(m, s) for k, (_, s) in enumerate(shards) if k % size == rank}
    if comm is not None and size > 1:
        for got in comm.allgather(mine):
            mine.update(got)
    return [(name, s["file"], s["num_samples"], mine[k]) for k, (name, s) in enumerate(shards)]


# ---------------------------------------------------------------- inspect
def summary(directory):
    """The lines `hpcdl data inspect` prints: the manifest's facts, a row per
    split (with its class balance) and a row per shard."""
    m = Manifest(directory)
    d = m.doc
    shape = "x".join(map(str, m.sample_shape)) if m.sample_shape else "mixed sizes"
    names = ", ".join(m.class_names[:10]) + (", ..." if m.num_classes > 10 else "")
    out = ["# %s  (format %s v%d, written by hpcdl %s: %s on %d rank(s))"
           % (m.directory, d["format"], d["format_version"], d.get("hpcdl_version", "?"),
              d["written_by"]["io"], d["written_by"]["ranks"]),
           "# source: %s" % d["source"],
           "# samples: %s %s, %s; %s; chunks of %d rows; checksums: %s"
           % (shape, m.dtype, "encoded images (decoded when read)" if m.encoding == "image"
              else "arrays", d["compression"], m.chunk_rows, d["checksum"]),
           "# %d classes: %s" % (m.num_classes, names),
           "#",
           "# %-6s %7s %10s %12s  %s" % ("split", "shards", "samples", "MiB",
                                         "samples per class (min..max)")]
    for name in sorted(m.splits):
        shards = m.split(name)["shards"]
        out.append("  %-6s %7d %10d %12.2f  %s" % (
            name, len(shards), m.split(name)["num_samples"],
            sum(s["bytes"] for s in shards) / 2**20, _balance(m, name)))
    out += ["#", "# %-32s %10s %12s %7s" % ("shard", "samples", "bytes", "chunks")]
    for name in sorted(m.splits):
        for s in m.split(name)["shards"]:
            out.append("  %-32s %10d %12d %7d" % (s["file"], s["num_samples"], s["bytes"],
                                                  -(-s["num_samples"] // m.chunk_rows)))
    return out


def _balance(m, split):
    from .dataset import H5ShardDataset  # on use: loads torch and tqdm
    try:
        y = H5ShardDataset(m.directory, split).read_field("y")
    except DataError as e:
        return "labels unreadable (%s); run hpcdl data verify" % e
    counts = np.bincount(y, minlength=m.num_classes)
    return "%d..%d" % (counts.min(), counts.max())

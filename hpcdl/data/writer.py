"""writer.py - write_shards: a Source into K HDF5 shard files per split plus
manifest.json (see manifest.py for the file layout).

Order of work, the same on every rank:
  1. split: the source's own splits, or a stratified --val-fraction split of it
  2. shuffle each split once (seeded), so every chunk is a random sample of its
     split and chunk-grouped reading still mixes classes
  3. cut each split into K near-equal shards (fewer if it has fewer samples)
  4. write. Under MPI with a parallel h5py, every shard file is opened by all
     ranks (driver='mpio') and each rank writes whole chunks of it with
     collective I/O. Otherwise (serial h5py, or encoded images, which HDF5
     cannot write in parallel) the ranks divide the shard files and each
     writes its files alone; a single process writes them all.
  5. rank 0 writes manifest.json last: an interrupted run leaves no manifest.
Errors on any rank become the same DataError on every rank (no hang).
"""
import glob
import os
import time

import numpy as np

from .. import __version__
from . import _mpi
from .manifest import (FIELDS, FORMAT, FORMAT_VERSION, MANIFEST, DataError, block_digests,
                       shard_name, write_manifest)
from .split import stratified_split  # the trainer's digits split too

COMPRESSIONS = ("gzip", "lzf", "none")
CHUNK_TARGET_BYTES = 1 << 20   # auto chunk_rows aims at ~1 MiB chunks
MAX_AUTO_CHUNK_ROWS = 1024
SLAB_TARGET_BYTES = 64 << 20   # rows a rank holds in memory per write


class ShardOptions:
    """Settings of one shard run (the CLI's flags)."""

    def __init__(self, shards=4, compression="gzip", chunk_rows=0, val_fraction=None,
                 seed=0, decode=False, collective=True, force=False):
        if shards < 1:
            raise ValueError("--shards must be at least 1 (got %d)" % shards)
        if compression not in COMPRESSIONS:
            raise ValueError("--compression %r: use one of %s"
                             % (compression, ", ".join(COMPRESSIONS)))
        if chunk_rows < 0:
            raise ValueError("--chunk-rows must be positive (or 0 for automatic)")
        if val_fraction is not None and not 0 < val_fraction < 1:
            raise ValueError("--val-fraction must be between 0 and 1 (got %g)" % val_fraction)
        self.shards, self.compression, self.chunk_rows = shards, compression, chunk_rows
        self.val_fraction, self.seed, self.decode = val_fraction, seed, decode
        self.collective, self.force = collective, force


def h5py_has_mpi():
    import h5py  # on use: loads h5py
    return bool(h5py.get_config().mpi)


# ---------------------------------------------------------------- plan
def split_and_shuffle(source, opts):
    """{split: (part, source indices in written order)}: steps 1 and 2."""
    parts = dict(source.parts)
    if opts.val_fraction is not None:
        if "val" in parts:
            raise DataError("%s brings its own validation split; drop --val-fraction"
                            % source.description)
        train, val = stratified_split(parts["train"].y, opts.val_fraction, opts.seed)
        plan = {"train": (parts["train"], train), "val": (parts["train"], val)}
    else:
        plan = {name: (part, np.arange(len(part))) for name, part in parts.items()}
    for k, (name, (part, idx)) in enumerate(sorted(plan.items())):
        if len(idx) == 0:
            raise DataError("split %r of %s would be empty; change --val-fraction"
                            % (name, source.description))
        rng = np.random.default_rng([opts.seed, k])
        plan[name] = (part, idx[rng.permutation(len(idx))])
    return plan


def auto_chunk_rows(sample_shape, dtype, encoding):
    if encoding == "image":
        return 64  # variable-length rows: a chunk holds 64 references
    row = max(1, int(np.prod(sample_shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    return int(min(MAX_AUTO_CHUNK_ROWS, max(1, CHUNK_TARGET_BYTES // row)))


def read_rows(part, ids):
    """part's samples ids (any order), read in sorted order (kinder to files)."""
    order = np.argsort(ids, kind="stable")
    data = part.read(ids[order])
    if isinstance(data, list):
        out = [None] * len(ids)
        for k, o in enumerate(order):
            out[o] = data[k]
        return out
    out = np.empty_like(data)
    out[order] = data
    return out


# ---------------------------------------------------------------- images
def settle_images(plan, opts, comm):
    """For image parts: every rank decodes its share of the images once (a
    broken image fails here, named); returns (channels, sample_shape or None)."""
    rank, size = _mpi.rank_and_size(comm)
    channels, sizes, error = set(), {}, None
    try:
        for part in {id(p): p for p, _ in plan.values()}.values():
            c, s = part.scan(np.arange(len(part))[rank::size])
            channels |= c
            for hw, path in s.items():
                sizes.setdefault(hw, path)
    except DataError as e:
        error = e
    _mpi.agree(comm, error)
    if comm is not None and comm.size > 1:
        for c, s in comm.allgather((channels, sizes)):
            channels |= c
            for hw, path in s.items():
                sizes.setdefault(hw, path)
    c = 3 if 3 in channels else 1
    if len(sizes) > 1:
        (hw1, p1), (hw2, p2) = sorted(sizes.items())[:2]
        if opts.decode:
            raise DataError("--decode needs images of one size: %s is %dx%d, %s is %dx%d; "
                            "resize them first or keep them encoded (no --decode)"
                            % (p1, hw1[0], hw1[1], p2, hw2[0], hw2[1]))
        return c, None
    (h, w), = sizes
    return c, (c, h, w)


# ---------------------------------------------------------------- the run
def write_shards(source, out, opts, comm=None):
    """Writes source into out (collective over comm when given). Returns the manifest dict."""
    t0 = time.perf_counter()
    rank, size = _mpi.rank_and_size(comm)
    _mpi.on_root(comm, lambda: prepare_out(out, opts.force))
    plan = split_and_shuffle(source, opts)
    layout = _layout(source, plan, opts, comm)
    collective = (opts.collective and size > 1 and layout["encoding"] == "raw"
                  and h5py_has_mpi())
    io = ("mpio-collective" if collective else "per-file") if size > 1 else "serial"
    entries, error, g = {}, None, 0
    for name, (part, idx) in sorted(plan.items()):
        pieces = np.array_split(idx, min(opts.shards, len(idx)))
        for k, ids in enumerate(pieces):
            path = os.path.join(out, shard_name(name, k, len(pieces)))
            if collective:
                entries[(name, k)] = _write_collective(comm, path, part, ids, layout)
            elif g % size == rank and error is None:
                try:
                    entries[(name, k)] = _write_alone(path, part, ids, layout)
                except (DataError, OSError) as e:
                    error = e if isinstance(e, DataError) else DataError("%s: %s" % (path, e))
            g += 1
    if not collective:
        _mpi.agree(comm, error)
        if size > 1:
            for got in comm.allgather(entries):
                entries.update(got)

    def finish():
        doc = _manifest(source, plan, opts, layout, entries, out, io, size)
        write_manifest(out, doc)
        return doc
    doc = _mpi.on_root(comm, finish)
    doc["seconds"] = time.perf_counter() - t0
    return doc


def _layout(source, plan, opts, comm):
    """What every shard shares: encoding, dtype, sample shape, chunking, filter."""
    part0 = plan["train"][0]
    channels = None
    if hasattr(part0, "scan"):
        channels, shape = settle_images(plan, opts, comm)
        for part, _ in plan.values():
            part.decode_to = shape if opts.decode else None
        dtype = np.dtype(np.uint8)
    else:
        shape, dtype = part0.sample_shape, part0.dtype
        for name, (part, _) in plan.items():
            if part.sample_shape != shape or part.dtype != dtype:
                raise DataError("split %r of %s has samples %s %s, train has %s %s"
                                % (name, source.description, part.dtype, part.sample_shape,
                                   dtype, shape))
    encoding = part0.encoding
    rows = opts.chunk_rows or auto_chunk_rows(shape or (1,), dtype, encoding)
    return dict(encoding=encoding, sample_shape=shape, dtype=dtype, channels=channels,
                chunk_rows=rows, compression=opts.compression)


def prepare_out(out, force):
    """Makes out; an existing shard directory is replaced only with force."""
    os.makedirs(out, exist_ok=True)
    old = glob.glob(os.path.join(out, "*-of-*.h5"))
    if os.path.exists(os.path.join(out, MANIFEST)) or old:
        if not force:
            raise DataError("%s already holds shards; give --force to replace them, or "
                            "another --out" % out)
        if os.path.exists(os.path.join(out, MANIFEST)):
            os.remove(os.path.join(out, MANIFEST))  # first: the old set is now invalid
        for f in old:
            os.remove(f)


def _manifest(source, plan, opts, layout, entries, out, io, ranks):
    splits = {}
    for name in sorted(plan):
        shards = [entries[key] for key in sorted(k for k in entries if k[0] == name)]
        for s in shards:
            s["bytes"] = os.path.getsize(os.path.join(out, s["file"]))
        splits[name] = dict(num_samples=sum(s["num_samples"] for s in shards), shards=shards)
    shape = layout["sample_shape"]
    return dict(format=FORMAT, format_version=FORMAT_VERSION, hpcdl_version=__version__,
                source=source.description, num_classes=len(source.class_names),
                class_names=source.class_names,
                sample_shape=None if shape is None else list(shape),
                dtype=layout["dtype"].name, encoding=layout["encoding"],
                channels=layout["channels"], compression=layout["compression"],
                chunk_rows=layout["chunk_rows"], seed=opts.seed,
                val_fraction=opts.val_fraction,
                checksum="crc32 of each block of chunk_rows rows, per field",
                written_by=dict(io=io, ranks=ranks), splits=splits)


# ---------------------------------------------------------------- one shard
def _create(f, n, layout, split, index, count):
    """The three datasets of a shard of n rows, and its attributes."""
    import h5py  # on use: loads h5py
    rows = min(layout["chunk_rows"], n)
    filt = {} if layout["compression"] == "none" else {"compression": layout["compression"]}
    if layout["compression"] == "gzip":
        filt["compression_opts"] = 4
    if layout["encoding"] == "image":
        # JPEG/PNG bytes are compressed already; a filter would only see references
        f.create_dataset("x", (n,), dtype=h5py.vlen_dtype(np.uint8), chunks=(rows,))
    else:
        shape = tuple(layout["sample_shape"])
        f.create_dataset("x", (n,) + shape, dtype=layout["dtype"], chunks=(rows,) + shape,
                         **filt)
    for field in ("y", "source_index"):
        f.create_dataset(field, (n,), dtype=np.int64, chunks=(rows,), **filt)
    f.attrs.update(format=FORMAT, format_version=FORMAT_VERSION, split=split, shard=index,
                   num_shards=count)


def _parse_name(path):
    base = os.path.basename(path)[:-len(".h5")]
    split, index, _, count = base.split("-")
    return split, int(index), int(count)


def _write_alone(path, part, ids, layout):
    """One process writes the whole shard file (serial h5py driver)."""
    import h5py  # on use: loads h5py
    n, rows = len(ids), layout["chunk_rows"]
    digests = {f: [] for f in FIELDS}
    blocks_per_slab = max(1, SLAB_TARGET_BYTES // max(1, _row_bytes(layout) * rows))
    try:
        with h5py.File(path, "w") as f:
            _create(f, n, layout, *_parse_name(path))
            for lo in range(0, n, blocks_per_slab * rows):
                hi = min(n, lo + blocks_per_slab * rows)
                values = _values(part, ids, lo, hi)
                for field in FIELDS:
                    write_rows(f[field], lo, hi, values[field])
                    digests[field] += block_digests(values[field], rows)
    except DataError as e:
        raise DataError("writing %s: %s" % (path, e))
    return dict(file=os.path.basename(path), num_samples=n, checksums=digests)


def write_rows(dset, lo, hi, data):
    """dset[lo:hi] = data. Variable-length rows go through the low-level write:
    h5py's slice assignment turns equal-length byte strings into a 2-D array."""
    if data.dtype != object:
        dset[lo:hi] = data
        return
    import h5py  # on use: loads h5py
    fspace = dset.id.get_space()
    fspace.select_hyperslab((lo,), (hi - lo,))
    dset.id.write(h5py.h5s.create_simple((hi - lo,)), fspace, data)


def _row_bytes(layout):
    if layout["encoding"] == "image":
        return 1 << 17  # a guess at an encoded photo's size
    return int(np.prod(layout["sample_shape"], dtype=np.int64)) * layout["dtype"].itemsize


def _values(part, ids, lo, hi):
    x = read_rows(part, ids[lo:hi])
    if isinstance(x, list):
        import h5py  # on use: loads h5py
        xs = np.empty(len(x), dtype=h5py.vlen_dtype(np.uint8))
        for k, b in enumerate(x):  # one by one: equal lengths must not make a 2-D array
            xs[k] = b
        x = xs
    return {"x": x, "y": part.y[ids[lo:hi]], "source_index": ids[lo:hi].astype(np.int64)}


def _write_collective(comm, path, part, ids, layout):
    """All ranks write one shard file together (driver='mpio'): rank r owns a
    contiguous run of whole chunks and writes it in one collective call per
    field, so HDF5 can aggregate the ranks' pieces into large file writes."""
    import h5py  # on use: loads h5py
    n, rows = len(ids), layout["chunk_rows"]
    nblocks = -(-n // rows)
    mine = np.array_split(np.arange(nblocks), comm.size)[comm.rank]
    lo = int(mine[0]) * rows if len(mine) else n
    hi = min(n, (int(mine[-1]) + 1) * rows) if len(mine) else n
    error, values = None, None
    try:
        values = _values(part, ids, lo, hi)
    except DataError as e:
        error = DataError("writing %s: %s" % (path, e))
    _mpi.agree(comm, error)
    with h5py.File(path, "w", driver="mpio", comm=comm) as f:
        _create(f, n, layout, *_parse_name(path))
        for field in FIELDS:
            collective_write(f[field], lo, hi, values[field])
    parts = comm.gather({f: block_digests(values[f], rows) for f in FIELDS}, root=0)
    if comm.rank != 0:
        return None
    digests = {f: [d for p in parts for d in p[f]] for f in FIELDS}
    return dict(file=os.path.basename(path), num_samples=n, checksums=digests)


def collective_write(dset, lo, hi, data):
    """dset[lo:hi] = data as one collective MPI-IO write; a rank with nothing
    to write (lo == hi) still takes part, with an empty selection."""
    import h5py  # on use: loads h5py
    fspace = dset.id.get_space()
    shape = dset.shape[1:]
    if hi > lo:
        fspace.select_hyperslab((lo,) + (0,) * len(shape), (hi - lo,) + shape)
        buf = np.ascontiguousarray(data, dtype=dset.dtype)
        mspace = h5py.h5s.create_simple(buf.shape)
    else:
        fspace.select_none()
        buf = np.zeros((1,) + shape, dtype=dset.dtype)
        mspace = h5py.h5s.create_simple(buf.shape)
        mspace.select_none()
    dxpl = h5py.h5p.create(h5py.h5p.DATASET_XFER)
    dxpl.set_dxpl_mpio(h5py.h5fd.MPIO_COLLECTIVE)
    dset.id.write(mspace, fspace, buf, dxpl=dxpl)

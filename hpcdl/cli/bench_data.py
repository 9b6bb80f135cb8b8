"""bench_data.py - `hpcdl bench data`: the options of hpcdl/bench/data.py
(H5ShardDataset through a DataLoader against naive HDF5 random access and an
in-memory array).

    hpcdl bench data --workers 2 --batch 128
    hpcdl bench data --source synthetic --samples 50000 --shape 3,32,32
"""
from .bench_common import run_or_launch
from .errors import UsageError
from .run import add_launch_args


def register(sub):
    p = sub.add_parser(
        "data", help="HDF5 shard reading against naive HDF5 and memory",
        description="Writes the same samples as HDF5 shards, as one naive HDF5 file "
                    "(chunked like the shards, and contiguous) and keeps them in memory, "
                    "then times a torch DataLoader over each in random order "
                    "(DistributedShardSampler): samples/s, the ratio to the faster naive "
                    "file, and the MLP train step's rate for comparison. Every loader's "
                    "samples are checked against memory after the timed epochs (#wrong); "
                    "exit 1 on a wrong sample.",
        epilog="example: hpcdl bench data --workers 2 --batch 128 --json data.json")
    add_launch_args(p)
    p.add_argument("--source", default="digits", choices=["digits", "synthetic"],
                   help="data to write (default digits)")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="use this shard directory's train split instead of --source")
    p.add_argument("--samples", type=int, default=50000, help="synthetic: samples")
    p.add_argument("--shape", default="3,32,32", help="synthetic: sample shape (uint8)")
    p.add_argument("--batch", type=int, default=128, help="samples per batch (default 128)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    p.add_argument("--shards", type=int, default=4, help="shard files (default 4)")
    p.add_argument("--chunk-rows", type=int, default=0, help="rows per chunk (0: automatic)")
    p.add_argument("--compression", default="gzip", choices=["gzip", "lzf", "none"])
    p.add_argument("--window", type=int, default=4,
                   help="chunk_window of the shards-grouped row (default 4)")
    p.add_argument("--time-budget", type=float, default=2.0, metavar="SECONDS",
                   help="timed seconds per row (default 2)")
    p.add_argument("--dir", default=None, help="where to write the files (default $TMPDIR)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON")
    p.set_defaults(func=run)


def options(args):
    from ..bench import data  # on use: loads numpy and torch and tqdm
    try:
        shape = tuple(int(s) for s in args.shape.split(","))
    except ValueError:
        raise UsageError("--shape %r: give sizes like 3,32,32" % args.shape)
    for name in ("samples", "batch", "shards", "window"):
        if getattr(args, name) < 1:
            raise UsageError("--%s must be at least 1" % name)
    if args.workers < 0 or args.chunk_rows < 0 or args.time_budget <= 0:
        raise UsageError("--workers and --chunk-rows must be >= 0, --time-budget > 0")
    if args.n is not None and args.n < 1:
        raise UsageError("-n must be at least 1 (got %d)" % args.n)
    return data.Options(source=args.source, data=args.data, samples=args.samples,
                        shape=shape, batch=args.batch, workers=args.workers,
                        shards=args.shards, chunk_rows=args.chunk_rows,
                        compression=args.compression, window=args.window,
                        budget_s=args.time_budget, dir=args.dir, json=args.json)


def run(args):
    return run_or_launch(args, "data", ("source", "samples", "shape", "batch", "workers",
                                        "shards", "chunk_rows", "compression", "window",
                                        "time_budget", "data", "dir", "json"), options(args))

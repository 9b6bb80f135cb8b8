"""data.py - `hpcdl data shard | inspect | verify`: write a data set as HDF5
shards with a manifest, summarise a shard directory, check it in full.

    hpcdl data shard digits --out shards/digits --shards 4 --val-fraction 0.2
    hpcdl data shard mnist1d:200000 --out shards/mnist1d   # generated here, cached
    hpcdl run -n 4 -- hpcdl data shard data.npz --out shards/x   # collective writes
    hpcdl data inspect shards/digits
    hpcdl data verify shards/digits           # exit 1 naming the first bad file
"""
import sys

from .errors import UsageError
from .run import add_launch_args
from . import run as launcher


def register(sub):
    p = sub.add_parser(
        "data", help="HDF5 shards: write, inspect, verify",
        description="Write a data set as HDF5 shard files with a manifest, summarise a "
                    "shard directory, or check every byte of it. Training reads shards "
                    "with hpcdl.data.H5ShardDataset (docs/data.md).",
        epilog="example: hpcdl data shard digits --out shards/digits --val-fraction 0.2")
    sub2 = p.add_subparsers(dest="data_command", metavar="ACTION")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    _register_shard(sub2)
    _register_inspect(sub2)
    _register_verify(sub2)


# ---------------------------------------------------------------- shard
def _register_shard(sub):
    p = sub.add_parser(
        "shard", help="write SOURCE as HDF5 shards plus manifest.json",
        description="Write SOURCE into --out as K HDF5 shard files per split and a "
                    "manifest.json (counts, shape, dtype, classes, checksums, format "
                    "version). SOURCE: 'digits' (scikit-learn's built-in set), "
                    "'mnist1d[:N]' (MNIST-1D generated here by its package, N samples, "
                    "default 1,000,000, with its fixed test set as split val; cached in "
                    "$HPCDL_CACHE or ~/.cache/hpcdl), FILE.npz "
                    "(arrays x, y; optional x_val, y_val, class_names), X.npy with "
                    "--labels Y.npy, a CIFAR-10 python batches folder, or an image folder "
                    "(CLASS/*.jpg|png, or train/CLASS and val/CLASS). Each split is shuffled "
                    "once (--seed) before it is cut into shards. Under MPI (hpcdl run -n N "
                    "or -n N here) with a parallel h5py the ranks write every file together "
                    "with collective I/O; otherwise they divide the files.",
        epilog="examples: hpcdl data shard digits --out shards/digits --val-fraction 0.2; "
               "hpcdl data shard cifar-10-batches-py --out shards/cifar --shards 16; "
               "hpcdl run -n 4 -- hpcdl data shard x.npy --labels y.npy --out shards/x")
    add_launch_args(p)
    p.add_argument("source", metavar="SOURCE", help="digits | mnist1d[:N] | FILE.npz | X.npy "
                                                    "| DIR")
    p.add_argument("--out", required=True, metavar="DIR", help="shard directory to write")
    p.add_argument("--shards", type=int, default=4, metavar="K",
                   help="shard files per split (default 4; fewer if a split is smaller)")
    p.add_argument("--compression", default="gzip", help="gzip | lzf | none (default gzip)")
    p.add_argument("--chunk-rows", type=int, default=0, metavar="R",
                   help="samples per HDF5 chunk (default: about 1 MiB per chunk, at most "
                        "1024 rows)")
    p.add_argument("--val-fraction", type=float, default=None, metavar="F",
                   help="hold out this share of every class as split 'val' (sources with "
                        "their own val split: not allowed)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and the shuffle")
    p.add_argument("--labels", default=None, metavar="Y.npy", help="labels of a .npy SOURCE")
    p.add_argument("--class-names", default=None, metavar="A,B,...",
                   help="class names of array sources, label k = k-th name")
    p.add_argument("--decode", action="store_true",
                   help="image folders: store decoded uint8 (C,H,W) arrays instead of the "
                        "encoded files (all images must have one size)")
    p.add_argument("--no-collective", action="store_true",
                   help="under MPI, divide the files between ranks even when h5py has MPI")
    p.add_argument("--force", action="store_true", help="replace shards already in --out")
    p.set_defaults(func=run_shard)


def run_shard(args):
    from ..data import writer  # on use: loads numpy
    try:
        opts = writer.ShardOptions(
            shards=args.shards, compression=args.compression, chunk_rows=args.chunk_rows,
            val_fraction=args.val_fraction, seed=args.seed, decode=args.decode,
            collective=not args.no_collective, force=args.force)
    except ValueError as e:
        raise UsageError(str(e))
    if args.n is not None and not launcher.inside_parallel_job():
        return launcher.launch(args.n, _shard_argv(args),
                               **launcher.launch_options(args))
    from ..data import DataError, _mpi, sources  # on use: loads numpy
    comm = _mpi.job_comm()
    names = args.class_names.split(",") if args.class_names else None
    try:
        source = sources.open_source(args.source, labels=args.labels, class_names=names)
        doc = writer.write_shards(source, args.out, opts, comm=comm)
    except DataError as e:
        raise UsageError(str(e))
    if _mpi.rank_and_size(comm)[0] == 0:
        splits = "; ".join("%s: %d shards, %d samples" % (
            name, len(s["shards"]), s["num_samples"]) for name, s in sorted(
            doc["splits"].items()))
        print("hpcdl data shard: wrote %s to %s in %.2f s (%s, %d rank(s)); next: hpcdl data "
              "inspect %s" % (splits, args.out, doc["seconds"], doc["written_by"]["io"],
                              doc["written_by"]["ranks"], args.out), flush=True)
    return 0


def _shard_argv(args):
    """The shard command again for the launched ranks (everything but -n, -H)."""
    argv = ["shard", args.source, "--out", args.out, "--shards", str(args.shards),
            "--compression", args.compression, "--chunk-rows", str(args.chunk_rows),
            "--seed", str(args.seed)]
    for flag, value in (("--val-fraction", args.val_fraction), ("--labels", args.labels),
                        ("--class-names", args.class_names)):
        argv += [flag, str(value)] if value is not None else []
    for flag in ("decode", "no_collective", "force"):
        argv += ["--" + flag.replace("_", "-")] if getattr(args, flag) else []
    return [sys.executable, "-m", "hpcdl", "data"] + argv


# ---------------------------------------------------------------- inspect
def _register_inspect(sub):
    p = sub.add_parser(
        "inspect", help="summary of a shard directory",
        description="Print a shard directory's manifest as a summary: source, sample "
                    "shape and dtype, classes, compression and chunking, a row per split "
                    "(samples, size, class balance) and a row per shard.",
        epilog="example: hpcdl data inspect shards/digits")
    p.add_argument("directory", metavar="DIR")
    p.set_defaults(func=run_inspect)


def run_inspect(args):
    from ..data import DataError, verify  # on use: loads numpy
    try:
        print("\n".join(verify.summary(args.directory)))
    except DataError as e:
        raise UsageError(str(e))
    return 0


# ---------------------------------------------------------------- verify
def _register_verify(sub):
    p = sub.add_parser(
        "verify", help="check every shard against the manifest",
        description="Read every shard file in full and check it against the manifest: "
                    "present, size, opens as HDF5, each field's rows, shape and dtype, "
                    "every block's checksum, labels in range, every encoded image decodes. "
                    "Prints a row per shard and exits 1 naming the first bad file and field. "
                    "Under MPI (-n N) the ranks divide the files.",
        epilog="example: hpcdl data verify shards/digits")
    add_launch_args(p)
    p.add_argument("directory", metavar="DIR")
    p.set_defaults(func=run_verify)


def run_verify(args):
    if args.n is not None and not launcher.inside_parallel_job():
        return launcher.launch(args.n, [sys.executable, "-m", "hpcdl", "data", "verify",
                                        args.directory],
                               **launcher.launch_options(args))
    from ..data import DataError, _mpi, verify  # on use: loads numpy
    comm = _mpi.job_comm()
    try:
        rows = verify.verify(args.directory, comm)
    except DataError as e:
        raise UsageError(str(e))
    bad = [r for r in rows if r[3]]
    if _mpi.rank_and_size(comm)[0] == 0:
        print("# %-6s %-32s %10s  %s" % ("split", "shard", "samples", "status"))
        for split, name, n, problem in rows:
            print("  %-6s %-32s %10d  %s" % (split, name, n, "BAD" if problem else "ok"))
        print("# bad shards: %d of %d %s" % (len(bad), len(rows), "FAILED" if bad else "OK"),
              flush=True)
        if bad:
            print("hpcdl data verify: %s" % bad[0][3], file=sys.stderr, flush=True)
    return 1 if bad else 0

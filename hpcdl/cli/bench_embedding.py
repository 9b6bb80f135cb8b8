"""bench_embedding.py - `hpcdl bench embedding`: the options of
hpcdl/bench/embedding.py (ShardedEmbeddingBag's all-to-all lookup against
replicated tables and all-gathered tables, on backend hpcdl).

    hpcdl bench embedding -n 4 --rows 1000,10000,100000 --json emb.json
"""
from .bench_common import run_or_launch
from .errors import UsageError
from .run import add_launch_args


def register(sub):
    p = sub.add_parser(
        "embedding", help="sharded embedding tables (all-to-all) vs whole tables per rank",
        description="Times one training step (forward, backward, SGD) of T embedding tables "
                    "sharded table-wise and looked up by all-to-all (ShardedEmbeddingBag) "
                    "against every rank holding every table (gradient all-reduce) and against "
                    "all-gathering the tables each step (gradient reduce-scatter), on "
                    "torch.distributed backend hpcdl: step time and bytes each rank sends. "
                    "The three agree after one step from the same tables (#wrong; exit 1 "
                    "if not).",
        epilog="example: hpcdl bench embedding -n 4 --rows 1000,10000,100000 --json emb.json")
    add_launch_args(p)
    p.add_argument("--rows", default="1000,10000,100000",
                   help="rows per table, comma-separated, one measurement each")
    p.add_argument("--tables", type=int, default=8, help="number of tables (default 8)")
    p.add_argument("--dim", type=int, default=32, help="embedding dimension (default 32)")
    p.add_argument("--batch", type=int, default=256,
                   help="bags per table per rank (default 256)")
    p.add_argument("--pooling", type=int, default=8,
                   help="mean ids per bag; bags hold 0..2x this many (default 8)")
    p.add_argument("--methods", default="sharded,replicated,allgather",
                   help="comma-separated, of sharded,replicated,allgather (default all)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps (default 2)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank (0: cores / local ranks)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as JSON")
    p.set_defaults(func=run)


def options(args):
    from ..bench import embedding  # on use: loads MPI and numpy and torch and tqdm
    try:
        rows = tuple(int(s) for s in args.rows.split(","))
    except ValueError:
        raise UsageError("--rows %r: give row counts like 1000,10000" % args.rows)
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    unknown = [m for m in methods if m not in embedding.METHODS]
    if unknown or not methods or len(set(methods)) != len(methods):
        raise UsageError("--methods %r: give some of %s, each once"
                         % (args.methods, ",".join(embedding.METHODS)))
    if min(rows) < 1:
        raise UsageError("--rows must be at least 1 each")
    for name in ("tables", "dim", "batch", "pooling", "steps"):
        if getattr(args, name) < 1:
            raise UsageError("--%s must be at least 1" % name)
    if args.warmup < 0 or args.threads < 0:
        raise UsageError("--warmup and --threads must be >= 0")
    if args.n is not None and args.n < 1:
        raise UsageError("-n must be at least 1 (got %d)" % args.n)
    return embedding.Options(rows=rows, tables=args.tables, dim=args.dim, batch=args.batch,
                             pooling=args.pooling, methods=methods, steps=args.steps,
                             warmup=args.warmup, threads=args.threads, json=args.json)


def run(args):
    return run_or_launch(args, "embedding", ("rows", "tables", "dim", "batch", "pooling",
                                             "methods", "steps", "warmup", "threads", "json"),
                         options(args))

"""_types.py - the dtype, op and algorithm codes shared with the C core
(src_c/include/hpcdl.h must keep the same numbers)."""

DTYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int32": 4, "int64": 5}
DTYPE_SIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8}
OPS = {"sum": 0, "average": 1, "min": 2, "max": 3, "prod": 4}
ALGORITHMS = {"auto": 0, "ring": 1, "hier": 2, "mpi": 3}

# Horovod-style spellings accepted too
OP_ALIASES = {"avg": "average", "mean": "average", "product": "prod"}


def op_code(op):
    """'sum' | 'average' | 'min' | 'max' | 'prod' (any case, or an int code) -> code."""
    if isinstance(op, int) and op in OPS.values():
        return op
    name = str(op).lower()
    name = OP_ALIASES.get(name, name)
    if name not in OPS:
        raise ValueError("unknown reduction op %r; use one of %s" % (op, ", ".join(OPS)))
    return OPS[name]


def algo_code(algorithm):
    name = str(algorithm).lower()
    if name not in ALGORITHMS:
        raise ValueError("unknown algorithm %r; use one of %s"
                         % (algorithm, ", ".join(ALGORITHMS)))
    return ALGORITHMS[name]

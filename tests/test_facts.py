"""test_facts.py - facts written in two places agree. Read from the source
(nothing imported here starts MPI):

  - the C enums of src_c/include/hpcdl.h (dtypes, ops, algorithms) against
    hpcdl/comm/_types.py, which copies them for the Python side;
  - README's table of HPCDL_* environment variables against the code: each
    variable is read somewhere, and its stated default is the code's;
  - every HPCDL_* variable the code reads is named in README or docs/;
  - importing hpcdl.comm (or hpcdl.data) starts no MPI: init() does.
"""
import os
import re
import subprocess
import sys

import pytest

from hpcdl.comm import _types

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)


def read(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


def sources():
    """{relative path: text} of the code that reads settings: hpcdl/**/*.py
    and the C core (src_c/*.c, *.h, cuda/, python/), tests left out."""
    out = {}
    for top, exts in (("hpcdl", (".py",)), ("src_c", (".c", ".h"))):
        for base, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d not in ("tests", "build", "__pycache__")]
            for f in files:
                if f.endswith(exts):
                    path = os.path.join(base, f)
                    with open(path, errors="replace") as fh:
                        out[os.path.relpath(path, ROOT)] = fh.read()
    return out


SOURCES = sources()


# ---------------------------------------------------------------- C enums
def c_enum(typedef):
    """{NAME: value} of `typedef enum { ... } typedef;` in hpcdl.h."""
    header = read("src_c", "include", "hpcdl.h")
    m = re.search(r"typedef enum \{([^}]*)\} %s;" % typedef, header, re.S)
    assert m, "no enum %s in hpcdl.h" % typedef
    body = re.sub(r"//[^\n]*", "", m.group(1))
    return {name: int(value) for name, value in re.findall(r"(\w+)\s*=\s*(-?\d+)", body)}


@pytest.mark.parametrize("typedef, prefix, table, count", [
    ("hpcdl_dtype", "HPCDL_", _types.DTYPES, "HPCDL_NUM_DTYPES"),
    ("hpcdl_op", "HPCDL_", _types.OPS, "HPCDL_NUM_OPS"),
    ("hpcdl_algo", "HPCDL_ALGO_", _types.ALGORITHMS, "HPCDL_NUM_ALGOS"),
])
def test_c_enums_equal_types_py(typedef, prefix, table, count):
    enum = c_enum(typedef)
    n = enum.pop(count)
    from_c = {name[len(prefix):].lower(): value for name, value in enum.items()}
    assert from_c == table, "hpcdl.h %s and hpcdl/comm/_types.py differ" % typedef
    assert sorted(table.values()) == list(range(n))


def test_dtype_sizes_are_the_itemsizes():
    import numpy as np
    import torch
    for name, size in _types.DTYPE_SIZES.items():
        assert torch.empty(0, dtype=getattr(torch, name)).element_size() == size, name
        if name != "bfloat16":
            assert np.dtype(name).itemsize == size, name
    assert set(_types.DTYPE_SIZES) == set(_types.DTYPES)


# ---------------------------------------------------------------- README's variables
def readme_variables():
    """{HPCDL_X: default text} from README's environment-variable table."""
    rows = re.findall(r"^\| `(HPCDL_\w+)` \|.*\| ([^|]+) \|$", read("README.md"), re.M)
    assert len(rows) >= 15, "README's HPCDL_* table not found"
    return {name: default.strip() for name, default in rows}


README_VARS = readme_variables()


def c_number(expr):
    """'(size_t)8 << 10' -> 8192, '600' -> 600 (C integer expressions of the
    defaults: casts, shifts, products)."""
    expr = re.sub(r"\((?:size_t|long|double|int|uint64_t)\)", "", expr).strip()
    assert re.fullmatch(r"[\d\s<>*()+]+", expr), expr
    return int(eval(expr, {"__builtins__": {}}))  # digits and operators only


# Where a variable's default is written as code: a call that takes the
# variable's name and its default. `None`: no literal default in the code
# (the README's words say what happens); the reason is given.
PATTERNS = [
    r'env_(?:bytes|size|seconds)\("{name}",\s*([^;]+?)\);',            # C helpers
    r'getenv\("{name}"\);\s*\n[^\n]*\?[^:\n]*:\s*([^;\n]+);',           # C: e ? atoi(e) : 100
    r'environ\.get\("{name}",\s*"([^"]*)"\)',                          # Python, a string
    r'environ\.get\("{name}",\s*str\(([^)]*)\)\)',                     # Python, str(25 << 20)
    r'\benv\.get\("{name}",\s*"([^"]*)"\)',
    r'_s\("{name}",\s*\w+,\s*(?:str\()?"?([^",)]+)',                    # utils/settings.py's table
]
NO_LITERAL = {
    "HPCDL_CHUNK_BYTES": "set only when given; the core's default_chunk() (team.c) decides",
    "HPCDL_MPI_CUDA_AWARE": "unset: the MPI library is asked (MPIX_Query_cuda_support)",
    "HPCDL_ENGINE_POLITE": "only '0' turns it off (context.c)",
    "HPCDL_WAIT": "'yield' and 'spin' override; anything else is auto (team.c)",
    "HPCDL_TIMELINE": "a path; unset writes none",
    "HPCDL_STALL_CHECK_DISABLE": "only set to disable (stall.c)",
    "HPCDL_MPIRUN": "unset: the core's own launcher (hpcdl.utils.mpi_info)",
    "HPCDL_CACHE": "unset: $XDG_CACHE_HOME/hpcdl, else ~/.cache/hpcdl (data/mnist1d.py)",
}


def code_defaults(name):
    """[(path, default value as text)] of every place the code gives name a default."""
    found = []
    for path, text in SOURCES.items():
        for pattern in PATTERNS:
            for m in re.finditer(pattern.format(name=name), text):
                found.append((path, m.group(1).strip()))
    return found


def as_number(text):
    try:
        return c_number(text)
    except AssertionError:
        return text


@pytest.mark.parametrize("name", sorted(README_VARS))
def test_readme_variable_is_read_by_the_code(name):
    assert any('"%s"' % name in text for text in SOURCES.values()), \
        "README names %s but no code reads it" % name


@pytest.mark.parametrize("name", sorted(README_VARS))
def test_readme_default_is_the_codes(name):
    stated = README_VARS[name]
    defaults = code_defaults(name)
    if name in NO_LITERAL:
        return
    assert defaults, "no default for %s found in the code (README: %s); if it has no literal " \
                     "default, add it to NO_LITERAL with the reason" % (name, stated)
    first = re.match(r"-?\d+|\w+", stated).group(0)  # '2097152 (...)' -> '2097152'
    want = int(first) if first.lstrip("-").isdigit() else first
    for path, value in defaults:
        if name == "HPCDL_AUTO_RING_ABOVE" and as_number(value) == 0:
            continue  # dispatch.c's 'was it set?' probe, not a default
        assert as_number(value) == want, "%s: README says %s, %s uses %s" % (
            name, stated, path, value)


def test_auto_ring_above_under_mpich():
    # README: "2097152 (N under an MPICH-family MPI when the ranks fill the host's cores)"
    stated = re.search(r"\((\d+) under an MPICH", README_VARS["HPCDL_AUTO_RING_ABOVE"])
    assert stated, README_VARS["HPCDL_AUTO_RING_ABOVE"]
    m = re.search(r"#ifdef MPICH_VERSION.*?if \(t->full && !env_set\) return ([^;]+);",
                  SOURCES[os.path.join("src_c", "dispatch.c")], re.S)
    assert m, "dispatch.c's MPICH branch of one_node_ring_above not found"
    assert c_number(m.group(1)) == int(stated.group(1))


def test_smaller_facts_of_the_table():
    # the chunk's two defaults, from team.c's default_chunk(spans)
    m = re.search(r"return spans \? ([^:]+) : ([^;]+);", SOURCES[os.path.join("src_c", "team.c")])
    assert m, "team.c's default_chunk not found"
    assert README_VARS["HPCDL_CHUNK_BYTES"] == "%d on one host, %d when the job spans hosts" % (
        c_number(m.group(2)), c_number(m.group(1)))


# Variables the code reads that need no user-facing line: set by hpcdl itself
# for its own child processes, or debugging switches of one algorithm.
INTERNAL = {
    "HPCDL_ELASTIC_ATTEMPT": "set by the elastic driver for the ranks of each attempt",
    "HPCDL_SMALL_FLAT": "small.c's switch for its flat-exchange variant (benchmarks)",
    "HPCDL_CAUSES": "set by hpcdl run / hpcdl train for their ranks (utils/causes.py)",
}


def test_every_variable_the_code_reads_is_documented():
    read_by_code = set()
    for text in SOURCES.values():
        read_by_code.update(re.findall(r'"(HPCDL_[A-Z0-9_]+)"', text))
    docs = read("README.md") + "".join(
        read("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs"))) if f.endswith(".md"))
    missing = sorted(v for v in read_by_code - set(INTERNAL) if v not in docs)
    assert not missing, "read by the code but named nowhere in README or docs/: %s" % missing


# ---------------------------------------------------------------- MPI starts at init
@pytest.mark.parametrize("module", ["hpcdl.comm", "hpcdl.data", "hpcdl.torch",
                                    "hpcdl.torch.distributed", "hpcdl.train", "hpcdl.cli.main",
                                    "hpcdl.bench", "hpcdl.sim"])
def test_import_starts_no_mpi(module):
    code = "import %s, sys; print('mpi4py.MPI' in sys.modules)" % module
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr


# ---------------------------------------------------------------- what ran on a GPU
def test_readme_says_what_ran_on_a_gpu():
    """Issue 38 item 10: README said in one place that the CUDA path was
    compile-tested only and no GPU had run it, and in another that it had run on
    one H100. Every README paragraph about the CUDA path says what docs/cuda.md's
    status says: the staged path ran on one H100 (benchmarks/gpu.md), and
    GPU-direct did not."""
    status = " ".join(read("docs", "cuda.md").split())
    assert "**Status: run on one GPU (an H100 shared by 2 ranks)" in status
    assert "GPU-direct path did not run" in " ".join(read("benchmarks", "gpu.md").split())
    readme = read("README.md")
    for wrong in ("compile-tested only", "no GPU has run"):
        assert wrong not in readme, wrong
    about = [p for p in readme.split("\n\n") if "CUDA path" in p]
    assert len(about) >= 2, about
    for p in about:
        words = " ".join(p.split())
        assert "one H100" in words and "staged path" in words and "GPU-direct" in words, p
        assert "benchmarks/gpu.md" in words, p

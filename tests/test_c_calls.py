"""test_c_calls.py - the call graph between the C core's files, read from the
source (src_c/*.c, src_c/cuda/*.c and *.cu, src_c/python/*.c; nothing is
compiled): file A depends on file B when A names a function that B defines
and A does not (a call, or a function pointer in a table). Macros from the
headers count as what they expand to (the error-check macros name error.c's
functions). A name that A defines itself, also under another #if branch
(cuda_support.c's stubs of cuda_where.c without CUDA), is A's own.

Issue 40 wants the core drawn as a straight stack (context/team/shm below the
algorithms, agreement and small-message paths not calling back up): no cycle
between files. Today there are cycles, listed in KNOWN_CYCLES; the test lets
them shrink but fails on any file that joins one or any new cycle, and prints
every cycle it finds as a path (`pytest tests/test_c_calls.py -s` shows the
mutual calls and the edges of each loop).
"""
import glob
import os
import re

from test_architecture import _path_in, cycles

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "src_c")

# Each set: files that today call each other round a loop (issue 40 item 5).
# Remove a file when its loop is broken; never add one.
KNOWN_CYCLES = [
    # agree <-> small, context <-> engine, shm/shared -> fault -> engine
    # (hpcdl_team_check_peers, hpcdl_engine_stop), stall -> engine, and the
    # CUDA path: cuda_allreduce <-> cuda_where, cuda_ipc <-> cuda_allreduce
    {"agree.c", "context.c", "cuda/cuda_allreduce.c", "cuda/cuda_ipc.c", "cuda/cuda_where.c",
     "dispatch.c", "engine.c", "fault.c", "hierarchical.c", "mpi_coll.c", "ring.c", "shared.c",
     "shm.c", "small.c", "stall.c", "team.c"},
    # the binding: core_module's method table names collectives.c's functions,
    # which use core_module's hpcdl_py_ctx / hpcdl_py_raise / hpcdl_py_counts
    {"python/collectives.c", "python/core_module.c"},
]

_NOISE = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'", re.S)
# a definition starts at column 0 and its parameter list is followed by {
_DEF = re.compile(r"^(?!\s)[A-Za-z_][\w\s\*]*?\b([A-Za-z_]\w*)\s*\(([^;{}]*?)\)\s*\{",
                  re.M | re.S)
_MACRO = re.compile(r"^\s*#\s*define\s+(\w+)\s*\(([^)]*)\)((?:[^\n]*\\\n)*[^\n]*)", re.M)
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof"}


def _text(path):
    """The file without comments, and with every string literal emptied."""
    with open(path) as f:
        return _NOISE.sub(lambda m: " " if m.group(0)[0] == "/" else '""', f.read())


def _sources():
    pats = ("*.c", "cuda/*.c", "cuda/*.cu", "python/*.c")
    return sorted(p for pat in pats for p in glob.glob(os.path.join(SRC, pat)))


def _macros(paths):
    """{macro name: identifiers in its body} of every function-like macro."""
    out = {}
    for path in paths:
        for m in _MACRO.finditer(_text(path)):
            out[m.group(1)] = set(_IDENT.findall(m.group(3)))
    return out


def _names(text, macros):
    """Identifiers the text uses, macros expanded (to a fixed point)."""
    ids = set(_IDENT.findall(text))
    todo = [i for i in ids if i in macros]
    while todo:
        for j in macros[todo.pop()] - ids:
            ids.add(j)
            if j in macros:
                todo.append(j)
    return ids


def call_graph():
    """{file: [files it names a function of]}, paths relative to src_c/."""
    sources = _sources()
    macros = _macros(glob.glob(os.path.join(SRC, "**", "*.h"), recursive=True) + sources)
    texts = {os.path.relpath(p, SRC).replace(os.sep, "/"): _text(p) for p in sources}
    own, public = {}, {}  # file -> every name it defines; name -> files (non-static)
    for rel, text in texts.items():
        for m in _DEF.finditer(text):
            name = m.group(1)
            if name in _KEYWORDS:
                continue
            own.setdefault(rel, set()).add(name)
            if not re.search(r"\bstatic\b", text[m.start():m.start(1)]):
                public.setdefault(name, set()).add(rel)
    return {rel: sorted({other for name in _names(text, macros) - own.get(rel, set())
                         for other in public.get(name, ())})
            for rel, text in texts.items()}


def _report(graph, found):
    lines = []
    for comp in found:
        lines.append("%d files: %s" % (len(comp), _path_in(graph, comp)))
        members = set(comp)
        mutual = sorted("%s <-> %s" % (a, b) for a in comp for b in graph[a]
                        if b in members and a < b and a in graph[b])
        lines += ["  mutual: " + m for m in mutual]
    return "\n".join(lines)


def test_call_graph_is_read():
    """The reader is not vacuous: known calls and macro expansions are edges."""
    graph = call_graph()
    assert len(graph) > 20
    assert "engine.c" in graph["context.c"]          # hpcdl_engine_start
    assert "error.c" in graph["ring.c"]               # through the error-check macro
    assert "cuda/cuda_where.c" not in graph["cuda_support.c"]  # its own stubs
    assert graph["reduce.c"] == [] and graph["error.c"] == []
    assert cycles({"a.c": ["b.c"], "b.c": ["a.c"], "c.c": ["a.c"]}) == [["a.c", "b.c"]]


def test_no_new_cycle_between_c_files():
    graph = call_graph()
    found = cycles(graph)
    print("\ncycles between the C core's files:\n" + _report(graph, found))
    new = [c for c in found if not any(set(c) <= known for known in KNOWN_CYCLES)]
    assert not new, ("new cycle between src_c files (call down the stack only; issue 40 "
                     "item 5):\n" + _report(graph, new))
    stale = [sorted(k) for k in KNOWN_CYCLES
             if not any(set(c) & k for c in found)]
    assert not stale, "these loops are broken: drop them from KNOWN_CYCLES: %s" % stale

"""test_architecture.py - the layering rules of docs/architecture.md, read
from the source with `ast` (nothing is imported, so MPI never starts):

  (a) no import cycle among hpcdl's modules; imports inside functions count
      as much as those at the top (a cycle through a function-level import is
      still a cycle: it only fails later, and the reader still has to hold
      both modules in mind);
  (b) MPI has one door: no `.mpi` attribute (an hpcdl Communicator's mpi4py
      communicator) and no mpi4py import outside hpcdl/comm, hpcdl/ps and
      hpcdl/bench, except the places in ALLOWED_MPI, each with its reason;
  (c) the CLI is the top floor: nothing outside hpcdl/cli imports it;
  (d) hpcdl.comm stands on the C core and hpcdl.utils only, and the bottom
      utilities (launch, log, agree) on nothing above hpcdl.utils.

Package `__init__` modules: `import hpcdl.a.b` runs hpcdl/a/__init__.py
first, so an import is an edge to the module it names (`from hpcdl.a import
b` names hpcdl.a.b when b is a submodule, else hpcdl.a) AND to each package
above it that the importer does not lie in (hpcdl/a/__init__.py runs before
any module inside hpcdl.a, so for them it has already begun). A package
facade that imports its submodules is then no cycle with them, but it is one
with every module outside that reaches the package and that its submodules
reach back: torch/noise_scale.py -> zero/layout.py ran zero/__init__.py,
which loaded zero/optimizer.py -> torch/optimizer.py -> noise_scale.py.
`importlib.import_module("hpcdl.cli." + name)` is an edge to every module
whose name starts with the constant part (cli/main.py loads its subcommands
so). `from . import world` inside hpcdl/comm/alltoall.py names hpcdl.comm,
and it is a cycle when hpcdl/comm/__init__.py imports alltoall.
"""
import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
PACKAGE = os.path.join(ROOT, "hpcdl")

MPI_ROOMS = ("hpcdl/comm/", "hpcdl/ps/", "hpcdl/bench/")

# file -> why it may touch MPI itself. Keep this list short: anything else
# goes through hpcdl.comm (object collectives, any_rank, raise_if_any, wtime).
ALLOWED_MPI = {
    # hpcdl.data runs without hpcdl's core (a plain process is a job of one
    # rank) and takes a user's mpi4py communicator; importing hpcdl.comm would
    # start MPI. _mpi.py is the data package's one door: it finds the job's
    # communicator (hpcdl.comm's world when it is up) and splits per node.
    "hpcdl/data/_mpi.py": "hpcdl.data's own door: works without hpcdl.comm",
    # calibration times MPI_Send/Recv and MPI_Allreduce as the peer the cost
    # model is fitted against, like hpcdl/bench does; one function says so.
    "hpcdl/sim/calibrate.py": "measures MPI itself (ping-pong, MPI_Allreduce) as a peer",
    # compares the MPI the C core was built against with the one mpi4py
    # loaded (hpcdl.comm.init asks it before the core's first MPI call; the CLI
    # asks it without starting MPI).
    "hpcdl/utils/mpi_info.py": "checks the core's MPI against mpi4py's, before MPI is up",
    # `hpcdl info` reports the MPI library's version string and standard.
    "hpcdl/cli/info.py": "reports which MPI library this is",
    # `hpcdl bench`: MPI_Abort on a failed run (the measured peer is MPI itself).
    "hpcdl/cli/bench_common.py": "benchmark driver: aborts a failed run on every rank",
    "hpcdl/cli/bench_calibrate.py": "calibration driver: checks the rank count before "
                                    "hpcdl.comm is up",
}


# ------------------------------------------------------------------ reading
def _modules():
    """{dotted module name: path} of every .py file under hpcdl/."""
    mods = {}
    for base, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(base, f)
                rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                mods[".".join(rel)] = path
    return mods


MODULES = _modules()
KNOWN = set(MODULES) | {"hpcdl._core"}  # the C extension: a leaf


def _rel(path):
    return os.path.relpath(path, ROOT).replace(os.sep, "/")


def _tree(path):
    with open(path) as f:
        return ast.parse(f.read(), path)


def _package_of(name, path):
    return name if path.endswith("__init__.py") else name.rpartition(".")[0]


def _known_prefix(name):
    """The longest known module that name is or lies in (None outside hpcdl)."""
    while name and name not in KNOWN:
        name = name.rpartition(".")[0]
    return name or None


def _packages_run(importer, module):
    """The packages above module whose __init__ an import of it runs: those
    the importer does not lie in (its own were run before it)."""
    parts = module.split(".")
    above = (".".join(parts[:i]) for i in range(1, len(parts)))
    return [p for p in above
            if p in KNOWN and importer != p and not importer.startswith(p + ".")]


def _dynamic_imports(node):
    """Modules an importlib.import_module(...) call may load: the constant
    name, or every module starting with the constant part of 'prefix' + x."""
    f = node.func
    if not (isinstance(f, ast.Attribute) and f.attr == "import_module" and node.args):
        return []
    arg = node.args[0]
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add):
        arg = arg.left
    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
        return []
    return [m for m in sorted(KNOWN) if m.startswith(arg.value)]


def imports_of(name, path):
    """[(imported hpcdl module, line)] of module name: every import statement,
    at module level or inside functions and classes, with the packages whose
    __init__ it runs, and importlib.import_module calls."""
    out, package = [], _package_of(name, path)
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append((_known_prefix(a.name), node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                base = base + "." + node.module if node.module else base
            else:
                base = node.module
            for a in node.names:
                full = base + "." + a.name
                out.append((full if full in KNOWN else _known_prefix(base), node.lineno))
        elif isinstance(node, ast.Call):
            out += [(m, node.lineno) for m in _dynamic_imports(node)]
    out += [(p, line) for m, line in list(out) if m for p in _packages_run(name, m)]
    return [(m, line) for m, line in out if m and m != name]


def import_graph():
    return {name: sorted({m for m, _ in imports_of(name, path)})
            for name, path in MODULES.items()}


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _path_in(graph, comp):
    """One cycle through comp, as 'a -> b -> a', for the failure message."""
    start, members = comp[0], set(comp)
    prev, todo = {start: None}, [start]
    while todo:
        v = todo.pop(0)
        for w in graph[v]:
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return " -> ".join(reversed(path)) + " -> " + start
            if w in members and w not in prev:
                prev[w] = v
                todo.append(w)
    return ", ".join(comp)


# -------------------------------------------------------------------- rules
def mpi_reach_throughs(path):
    """[(line, what)] of `.mpi` attributes and mpi4py imports in the file."""
    out = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Attribute) and node.attr == "mpi":
            value = node.value
            if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                    and value.func.attr == "get_config"):
                continue  # h5py.get_config().mpi: h5py's build flag, not a communicator
            out.append((node.lineno, ".mpi"))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, "import " + a.name) for a in node.names
                    if a.name.split(".")[0] == "mpi4py"]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            if (node.module or "").split(".")[0] == "mpi4py":
                out.append((node.lineno, "from %s import" % node.module))
    return sorted(out)


def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    assert not found, ("import cycles in hpcdl/ (make imports run one way; see "
                       "docs/architecture.md):\n  " +
                       "\n  ".join(_path_in(graph, c) for c in found))


def test_mpi_has_one_door():
    bad = []
    for name, path in sorted(MODULES.items()):
        rel = _rel(path)
        if rel.startswith(MPI_ROOMS) or rel in ALLOWED_MPI:
            continue
        bad += ["%s:%d %s" % (rel, line, what) for line, what in mpi_reach_throughs(path)]
    assert not bad, ("MPI reached around hpcdl.comm (use the Communicator's object "
                     "collectives, any_rank, raise_if_any, wtime; or add the file to "
                     "ALLOWED_MPI with its reason):\n  " + "\n  ".join(bad))


def test_allowed_mpi_places_exist():
    # an allow-list entry for a file that no longer touches MPI is stale
    for rel in ALLOWED_MPI:
        path = os.path.join(ROOT, rel)
        assert os.path.exists(path), "ALLOWED_MPI names %s, which does not exist" % rel
        assert mpi_reach_throughs(path), "%s no longer touches MPI: drop it from ALLOWED_MPI" % rel


def test_nothing_imports_the_cli():
    bad = ["%s:%d imports %s" % (_rel(path), line, m)
           for name, path in sorted(MODULES.items())
           if not name.startswith("hpcdl.cli") and name != "hpcdl.__main__"  # python -m hpcdl
           for m, line in imports_of(name, path)
           if m == "hpcdl.cli" or m.startswith("hpcdl.cli.")]
    assert not bad, "the CLI is the top floor; nothing below imports it:\n  " + "\n  ".join(bad)


def _inside(module, *packages):
    """module is one of packages or lies in one of them."""
    return any(module == p or module.startswith(p + ".") for p in packages)


BOTTOM_UTILS = ("hpcdl.utils.launch", "hpcdl.utils.log", "hpcdl.utils.agree")


def test_comm_stands_on_the_core_and_utils():
    """hpcdl.comm imports only itself, the C core and hpcdl.utils; the bottom
    utilities import nothing of hpcdl outside hpcdl.utils (so the logger and
    the failure rule work without MPI, and comm can use them)."""
    graph = import_graph()
    bad = ["%s imports %s" % (name, m) for name, deps in sorted(graph.items())
           if name == "hpcdl.comm" or name.startswith("hpcdl.comm.") for m in deps
           if not _inside(m, "hpcdl.comm", "hpcdl._core", "hpcdl.utils")]
    bad += ["%s imports %s" % (name, m) for name in BOTTOM_UTILS for m in graph[name]
            if not _inside(m, "hpcdl.utils")]
    assert not bad, "a lower layer imports a higher one:\n  " + "\n  ".join(bad)


# --------------------------------------------------- the checker itself works
def test_checker_sees_cycles_and_reach_throughs(tmp_path):
    """The rules are not vacuous: a cycle through a function-level import and
    a `.mpi` reach-through are found."""
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["b"], "b": []}) == []
    src = tmp_path / "m.py"
    src.write_text("import h5py\nx = h5py.get_config().mpi\n"
                   "def f(comm):\n    from mpi4py import MPI\n    return comm.world().mpi\n")
    assert mpi_reach_throughs(str(src)) == [(4, "from mpi4py import"), (5, ".mpi")]


def test_imports_are_resolved():
    # relative, function-level and submodule imports all become edges
    graph = import_graph()
    assert "hpcdl.comm.communicator" in graph["hpcdl.comm"]
    assert "hpcdl._core" in graph["hpcdl.comm.communicator"]
    assert "hpcdl.comm" in graph["hpcdl.train.trainer"]
    # importing hpcdl.torch.zero.layout runs hpcdl/torch/zero/__init__.py, not
    # hpcdl/torch/__init__.py (noise_scale lies in hpcdl.torch: already run)
    assert _packages_run("hpcdl.torch.noise_scale", "hpcdl.torch.zero.layout") == [
        "hpcdl.torch.zero"]
    assert "hpcdl.torch.zero" in graph["hpcdl.torch.noise_scale"]
    assert "hpcdl.torch" not in graph["hpcdl.torch.noise_scale"]
    # importlib.import_module("hpcdl.cli." + name): every subcommand
    assert {"hpcdl.cli.run", "hpcdl.cli.bench"} <= set(graph["hpcdl.cli.main"])
    assert "hpcdl.cli.bench_calibrate" in graph["hpcdl.cli.bench"]
    assert len(MODULES) > 80


if __name__ == "__main__":
    pytest.main([__file__, "-q"])

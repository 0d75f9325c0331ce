"""Imports point one way (issue 44): no circle among a package's own
modules, counting every import, at module level or inside a function (a
function-level import of a sibling that imports back is still a circle in
the design, only hidden from the interpreter).  The core (ucxpy), shmem and
mpi_shim have none (``python ../shared/tools/import_circles.py ucxpy
mpi_shim shmem`` finds the same), and none may appear.  Function-level
imports remain only where they defer a heavy module on purpose, each with a
comment saying so."""
from __future__ import annotations

import ast
import os

from conftest import ROOT, run_job


def _modules(pkg: str) -> dict:
    """module name -> file, for every module of ``pkg``"""
    out = {}
    for root, dirs, files in os.walk(os.path.join(ROOT, pkg)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(root, f), ROOT)[:-3].replace(os.sep, ".")
                out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = \
                    os.path.join(root, f)
    return out


def _deps(name: str, path: str, known: dict) -> set:
    """The package's modules ``name`` imports, anywhere in its file."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def circles(pkg: str) -> list:
    """The strongly connected groups of more than one module (Tarjan)."""
    known = _modules(pkg)
    graph = {m: _deps(m, p, known) for m, p in known.items()}
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_core_has_no_import_circle():
    assert circles("ucxpy") == []


def test_shmem_has_no_import_circle():
    """The runtime imports no layer above it (team and ctx register their
    state's constructors with it), team runs its own collective rounds, a
    team makes its contexts through the runtime's registry."""
    assert circles("shmem") == []


def test_mpi_shim_has_no_import_circle():
    """The facade (MPI) imports the communicator kinds (intercomm, topo,
    dynproc, ulfm), which import the communicator (comm) and register what
    its methods make with them (comm.provide); the datatype family, the
    engine, the C calls' installer, pickling, sessions and the locks import
    nothing above them (there was one circle of 31 modules)."""
    assert circles("mpi_shim") == []


def test_the_rule_finds_a_circle(tmp_path, monkeypatch):
    """A function-level import back is a circle."""
    pkg = tmp_path / "pkgx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import g\n")
    (pkg / "c.py").write_text("import os\nfrom .b import f\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", str(tmp_path))
    assert circles("pkgx") == [["pkgx.a", "pkgx.b"]]


def _undeferred_imports(pkg: str) -> list:
    """``path:line`` of each import inside a function of ``pkg`` with no
    comment saying "deferred" on its lines or the line above (a comment over
    a run of consecutive imports covers the run)."""
    out = []
    for path in sorted(_modules(pkg).values()):
        with open(path) as f:
            src = f.read()
        lines = src.splitlines()
        inner = sorted({(n.lineno, n.end_lineno) for fn in ast.walk(ast.parse(src, path))
                        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                        for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))})
        covered = set()         # last lines of the imports that say why
        for first, last in inner:
            said = any("deferred" in line.partition("#")[2]
                       for line in lines[max(first - 2, 0):last])
            if said or first - 1 in covered:
                covered.add(last)
            else:
                out.append(f"{os.path.relpath(path, ROOT)}:{first}: {lines[first - 1].strip()}")
    return out


def test_function_level_imports_defer_on_purpose():
    """Function-level imports remain only where they defer a heavy or rarely
    needed module on purpose (numpy through mpi_shim.memory, a bootstrap
    that was not chosen, TLS, tracing, a tool's option), each with a comment
    saying so; every other import is at the top of its module (issue 44)."""
    found = [i for pkg in ("ucxpy", "mpi_shim", "shmem") for i in _undeferred_imports(pkg)]
    assert found == [], "imports inside functions with no '# deferred: <why>' comment:\n" + \
        "\n".join(found)


def test_the_rule_finds_an_undeferred_import(tmp_path, monkeypatch):
    """A comment elsewhere, or one not saying "deferred", does not count; one
    over a run of imports covers the run."""
    pkg = tmp_path / "pkgy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import os\n")
    (pkg / "a.py").write_text(
        "def f():\n"
        "    import json      # deferred: only f needs it\n"
        "    import shlex\n"
        "\n"
        "    # deferred: g is rarely called\n"
        "    import csv\n"
        "    import zlib\n"
        "    x = 1  # deferred\n"
        "\n"
        "    import glob\n"
        "\n"
        "\n"
        "def g():\n"
        "    import struct    # (cheap, loaded anyway)\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", str(tmp_path))
    where = os.path.join("pkgy", "a.py")
    assert _undeferred_imports("pkgy") == [f"{where}:10: import glob",
                                           f"{where}:14: import struct    # (cheap, loaded anyway)"]


#: what a user's first MPI program (import, one Barrier) must not import: the
#: modules that cost start-up most (issue 44; ``python -X importtime``)
_NOT_AT_START = ("numpy", "zmq", "mpi_shim.memory")


def test_a_first_mpi_program_imports_only_what_it_needs():
    """``from mpi_shim import MPI`` and a Barrier on 2 ranks under ucxpy-run
    import neither numpy (deferred: ucxpy.lazy) nor pyzmq (the rank speaks
    the launcher's protocol itself: ucxpy.bootstrap.zmtp); a first typed
    call brings numpy in, and the data is right."""
    prog = ("import sys\n"
            "from mpi_shim import MPI\n"
            "c = MPI.COMM_WORLD\n"
            "c.Barrier()\n"
            f"mods = {_NOT_AT_START!r}\n"
            "sys.stdout.write('loaded %r\\n' % [m for m in mods if m in sys.modules])\n"
            "import array\n"
            "a = array.array('d', [c.Get_rank() + 1.0])\n"
            "b = array.array('d', [0.0])\n"
            "c.Allreduce(a, b, op=MPI.SUM)\n"
            "sys.stdout.write('sum %s %s\\n' % (b[0], 'numpy' in sys.modules))\n")
    r = run_job(["python", "-c", prog], 2, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("loaded []") == 2, r.stdout
    assert r.stdout.count("sum 3.0 True") == 2, r.stdout

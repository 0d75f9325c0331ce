"""ucxpy-info: every mode runs, prints the key facts, and never shows a traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, transport_available

pytestmark = pytest.mark.timeout(60)


def info(*args, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("UCXPY_")}
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env)
    cp = subprocess.run([sys.executable, "-m", "ucxpy.tools.info", *args], env=e,
                        capture_output=True, text=True, timeout=50, cwd=ROOT)
    assert "Traceback" not in cp.stdout + cp.stderr, cp.stdout + cp.stderr
    return cp


def test_info_lists_every_transport():
    cp = info()
    assert cp.returncode == 0, cp.stderr
    assert "ucxpy version" in cp.stdout
    for name in ("self", "shm", "tcp", "verbs", "ofi"):
        assert any(line.startswith(name + " ") for line in cp.stdout.splitlines()), name
    assert "max_bcopy" in cp.stdout
    # every transport that is not available says why
    for line in cp.stdout.splitlines():
        if line.startswith("#   ") and ": not available" in line:
            assert line.split("not available:", 1)[1].strip()


def test_info_config():
    cp = info("-c", UCXPY_RNDV_THRESH="8K", UCXPY_TLS="tcp")
    assert cp.returncode == 0, cp.stderr
    assert "UCXPY_TLS=tcp" in cp.stdout
    assert "UCXPY_RNDV_THRESH=8K" in cp.stdout
    assert "UCXPY_SHM_RING_SIZE=" in cp.stdout


@pytest.mark.parametrize("tl", ["tcp", "shm"])
def test_info_protocols(tl):
    if not transport_available(tl):
        pytest.skip(f"transport {tl} unavailable")
    cp = info("-e", UCXPY_TLS=tl)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    out = cp.stdout
    assert "peer on this host: lane" in out
    assert "eager short" in out and "eager copy" in out
    assert "rendezvous" in out
    if tl == "tcp":
        assert "peer on another host: lane tcp" in out
        assert "rendezvous data frames" in out
    else:   # shm reaches only this host
        assert "peer on this host: lane shm" in out
        assert "peer on another host: unreachable" in out


def test_info_protocols_follow_thresholds():
    if not transport_available("tcp"):
        pytest.skip("tcp unavailable")
    cp = info("-e", UCXPY_TLS="tcp", UCXPY_RNDV_THRESH="0")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    tcp_part = cp.stdout.split("# transport tcp", 1)[1]
    assert "rndv_thresh=0" in tcp_part
    assert "eager" not in tcp_part


def test_info_devices():
    cp = info("-d")
    assert cp.returncode == 0, cp.stderr
    assert "127.0.0.1" in cp.stdout          # lo has an IPv4 address
    assert "/dev/shm" in cp.stdout
    assert "CMA permission:" in cp.stdout
    md = cp.stdout.split("# memory domains", 1)[1]
    assert "UCXPY_ATOMIC_MODE=auto: cpu atomics" in md
    rows = {line.split()[0]: line for line in md.splitlines()[3:] if line.strip()}
    assert "REG|RKEY_PTR" in rows["self"] and "load/store" in rows["self"]
    assert "active messages" in rows["tcp"]
    assert "ALLOC" in rows["shm"] and "cma" in rows["shm"] or "CMA permission: no" in cp.stdout


@pytest.mark.parametrize("args", [(), ("-e",), ("-c", "-d")])
def test_info_unavailable_transport_gives_reason(args):
    cp = info(*args, UCXPY_TLS="verbs")
    assert "verbs" in cp.stdout
    assert "not available" in cp.stdout or "no usable transport" in cp.stdout
    if "-e" in args:
        assert cp.returncode == 1
        assert "no usable transport for UCXPY_TLS=verbs" in cp.stdout


def test_info_unknown_transport_is_a_config_error():
    cp = info("-e", UCXPY_TLS="carrier-pigeon")
    assert "configuration error" in cp.stdout
    assert "carrier-pigeon" in cp.stdout


@pytest.mark.parametrize("tl", ["shm", "tcp"])
@pytest.mark.parametrize("split", [None, "20000"])
def test_info_protocols_are_what_transfers_use(tl, split):
    """``ucxpy-info -e``'s table comes from the selection functions the
    endpoint and the rendezvous receiver call: for every size on both sides
    of each boundary it prints, a real transfer over that transport is
    counted under the protocol (and rendezvous variant) the table names."""
    if not transport_available(tl):
        pytest.skip(f"transport {tl} unavailable")
    from ucxpy.tools.info import (EAGER_COPY, EAGER_SHORT, RNDV_NAMES, _INF,
                                  protocol_ranges)
    from conftest import Pair
    extra = {} if split is None else {"rndv_split_thresh": int(split)}
    p = Pair(tl, stats=True, **extra)
    try:
        w0, w1 = p.workers
        ep = p.eps[0][1]
        tep = ep.transport_endpoint()
        ranges = protocol_ranges(tep.iface.attrs, w0.config)
        sizes = sorted({z for lo, hi, _ in ranges for z in (lo, lo + 1, hi, hi - 1)
                        if 0 <= z < (3 << 20)} | {3 << 20})
        want = {}
        for size in sizes:
            name = next(n for lo, hi, n in ranges if lo <= size <= hi)
            want[size] = name
            before = dict(w0.stats()["worker"]), dict(w1.stats()["worker"])
            buf = bytearray(max(size, 1))
            r = w1.tag_recv_nb(buf, tag=5)
            s = ep.tag_send_nb(bytes(size), 5)
            p.wait(r, s)
            tx = {k: v - before[0].get(k, 0) for k, v in w0.stats()["worker"].items()}
            rx = {k: v - before[1].get(k, 0) for k, v in w1.stats()["worker"].items()}
            if name == EAGER_SHORT:
                assert tx.get("tx.tag.eager_short.msgs") == 1, (size, name, tx)
            elif name == EAGER_COPY:
                assert tx.get("tx.tag.eager_copy.msgs") == 1, (size, name, tx)
            else:
                assert tx.get("tx.tag.rndv.msgs") == 1, (size, name, tx)
                variant = {v: k for k, v in RNDV_NAMES.items()}[name]
                assert rx.get(f"rndv.{variant}.msgs") == 1, (size, name, rx)
        assert any(n == EAGER_SHORT for n in want.values())
        assert ranges[-1][1] == _INF
        if tl == "shm":
            assert any("split" in n for n in want.values()), ranges
    finally:
        p.close()


#: the layers built on the core and the libraries the bench compares it with
ABOVE_THE_CORE = ("mpi_shim", "shmem", "mpi4py", "shmem4py")


def _core_modules():
    """Every module under ucxpy/, by file: ``ucxpy.x.y`` -> path."""
    import pathlib
    mods = {}
    for path in sorted(pathlib.Path(ROOT, "ucxpy").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def test_the_core_imports_nothing_above_it():
    """Importing every module of the ``ucxpy`` package (tools included) loads
    neither of the layers built on it (mpi_shim, shmem) nor the reference
    libraries the bench compares with: the core can be shipped and read
    alone.  In a fresh interpreter, so nothing imported earlier counts; the
    walk must reach every module file under ucxpy/."""
    code = r'''
import importlib, json, pkgutil, sys
import ucxpy
seen, failed = ["ucxpy"], {}
def onerror(name):
    failed[name] = repr(sys.exc_info()[1])
for m in pkgutil.walk_packages(ucxpy.__path__, "ucxpy.", onerror=onerror):
    seen.append(m.name)
    try:
        importlib.import_module(m.name)
    except Exception as e:
        failed[m.name] = repr(e)
above = sorted(k for k in sys.modules if k.split(".")[0] in %r)
print(json.dumps({"seen": seen, "failed": failed, "above": above}))
''' % (ABOVE_THE_CORE,)
    env = dict(os.environ, PYTHONPATH=ROOT)
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=120, cwd=ROOT, env=env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    out = json.loads(cp.stdout.strip().splitlines()[-1])
    assert out["above"] == [], out["above"]
    # every Python module imported (a compiled extension, ucxpy._ofi say,
    # may lack its shared library here: it imports no Python module anyway)
    core = _core_modules()
    assert not {m: e for m, e in out["failed"].items() if m in core}, out["failed"]
    missing = sorted(set(core) - set(out["seen"]))
    assert not missing, f"not imported by the walk: {missing}"
    print(f"{len(out['seen'])} modules imported")


#: (file, module) imports of those names the core makes on purpose, inside
#: the one function that needs it: the MPI bootstrap rides on the MPI
#: library through mpi4py (a job started by mpiexec; mpi4py is a library
#: below us there, not a layer above).  ``ucxpy-run --as-mpi4py`` finds the
#: drop-in through the ``ucxpy.dropins`` entry points instead of importing it
ALLOWED_IMPORTS = {("ucxpy/bootstrap/mpi_boot.py", "mpi4py")}


def test_no_core_file_imports_above_it():
    """The static side of the same rule: no ``import``/``from ... import`` of
    mpi_shim, shmem, mpi4py or shmem4py anywhere under ucxpy/, function-local
    and conditional imports included (they run only on some paths, which the
    import walk above may not take), except ``ALLOWED_IMPORTS``."""
    import ast
    bad, allowed = [], set()
    for mod, path in _core_modules().items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue      # relative imports stay inside ucxpy
            rel = path.relative_to(ROOT).as_posix()
            for name in names:
                if name.split(".")[0] not in ABOVE_THE_CORE:
                    continue
                if (rel, name) in ALLOWED_IMPORTS:
                    allowed.add((rel, name))
                else:
                    bad.append(f"{rel}:{node.lineno}: imports {name}")
    assert not bad, "\n".join(bad)
    assert allowed == ALLOWED_IMPORTS, f"gone, trim ALLOWED_IMPORTS: {ALLOWED_IMPORTS - allowed}"


def test_the_layers_use_only_public_core_apis():
    """mpi_shim and shmem reach the core through its public modules: no
    ``ucxpy._native`` (they use :mod:`ucxpy.atomics`), no private names of
    a ucxpy module (``from ucxpy.x import _y`` or ``ucxpy.x._y``)."""
    import ast
    import pathlib
    bad = []
    for pkg in ("mpi_shim", "shmem"):
        for path in sorted(pathlib.Path(ROOT, pkg).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ucxpy"):
                    mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.Import):
                    mods = [a.name for a in node.names if a.name.startswith("ucxpy")]
                    names = []
                else:
                    continue
                private = [m for m in mods if any(p.startswith("_") for p in m.split(".")[1:])]
                private += [n for n in names if n.startswith("_")]
                if private:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {private}")
    assert not bad, "\n".join(bad)


def test_the_core_names_no_transport():
    """Outside the transport registry (context.py, config.py's default),
    the transports themselves and the tools that list them, no core module
    names a transport: RMA and the protocols choose by capability flags
    and the memory domains (MdCaps, GET_ZCOPY, ...), so a new transport needs
    no change in the core."""
    import ast
    import pathlib
    names = {"shm", "tcp", "ofi", "verbs", "self", "loopback"}
    root = pathlib.Path(ROOT, "ucxpy")
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in ("transports", "tools") or rel.name in ("context.py", "config.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                bad.append(f"ucxpy/{rel}:{node.lineno}: {node.value!r}")
    assert not bad, "\n".join(bad)

"""mpi_shim objects that need no peers (run in a one-rank job per test file
would be slow; these import mpi_shim.MPI in-process as a singleton job)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.timeout(120)

SNIPPET = r'''
import pickle
import numpy as np
from mpi_shim import MPI

# environment
assert MPI.Is_initialized() and not MPI.Is_finalized()
assert MPI.Get_version() >= (3, 0) and isinstance(MPI.Get_library_version(), str)
assert MPI.Wtime() > 0 and 0 < MPI.Wtick() < 1 and MPI.Get_processor_name()
assert MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) >= 32767
# datatypes
assert MPI.INT.Get_size() == 4 and MPI.DOUBLE.Get_extent() == (0, 8)
t = MPI.INT.Create_contiguous(3).Commit()
assert t.Get_size() == 12 and t.Get_extent() == (0, 12)
v = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()
assert v.Get_size() == 16 and v.Get_extent() == (0, 24)
t.Free(); v.Free()
assert MPI.Datatype.fromcode("d") == MPI.DOUBLE
# errors
e = MPI.Exception(MPI.ERR_TRUNCATE)
assert e.Get_error_class() == MPI.ERR_TRUNCATE and e == MPI.ERR_TRUNCATE
assert "truncated" in e.Get_error_string()     # MPICH's wording
# groups
g = MPI.COMM_WORLD.Get_group()
assert g.size == 1 and g.rank == 0
assert MPI.Group.Compare(g, g.Incl([0])) == MPI.IDENT
assert g.Excl([0]).size == 0 and g.Translate_ranks([0], g) == [0]
assert g.Union(g).size == 1 and g.Intersection(MPI.GROUP_EMPTY).size == 0
# requests, status
assert MPI.REQUEST_NULL.Wait() is True and MPI.Request().test() == (True, None)
s = MPI.Status(); assert (s.source, s.tag, s.error) == (MPI.ANY_SOURCE, MPI.ANY_TAG, 0)
# ops
assert MPI.SUM(2, 3) == 5 and MPI.MAXLOC((1, 5), (1, 2)) == (1, 2)
a = np.array([1, 2], "i"); b = np.array([3, 1], "i")
MPI.MAX.Reduce_local(a, b); assert list(b) == [3, 2]
# derived type through a self send
c = MPI.COMM_SELF
src = np.arange(6, dtype="d"); dst = np.zeros(6)
vt = MPI.DOUBLE.Create_vector(3, 1, 2).Commit()
c.Sendrecv([src, 1, vt], 0, 0, [dst, 1, vt], 0, 0)
assert list(dst) == [0, 0, 2, 0, 4, 0]
# pickling of predefined handles
assert pickle.loads(pickle.dumps(MPI.COMM_WORLD)) is MPI.COMM_WORLD
assert pickle.loads(pickle.dumps(MPI.SUM)) == MPI.SUM
print("UNIT OK")
'''


def test_mpi_unit_objects():
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", SNIPPET], env=env, capture_output=True,
                          text=True, timeout=100, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "UNIT OK" in proc.stdout


SIGNATURE_SNIPPET = r'''
import inspect, types
from mpi_shim import MPI, docsig

def shapes(a, b=1, /, c: "int" = 2, *args, d, e: "str" = "x", **kw) -> "None": pass
def kwonly(a, *, b, c=None): pass
def star(*a): pass
def posonly(a, /): pass
def nothing(): pass
def anything(**kw) -> "dict": pass
fns, seen = [shapes, kwonly, star, posonly, nothing, anything], set()
def visit(cls):
    if id(cls) in seen:
        return
    seen.add(id(cls))
    for m in vars(cls).values():
        if isinstance(m, (classmethod, staticmethod)):
            fns.append(m.__func__)
        elif isinstance(m, type):
            if m.__module__.startswith("mpi_shim"):
                visit(m)
        elif callable(m):
            fns.append(m)
for o in vars(MPI).values():
    if isinstance(o, type) and o.__module__.startswith("mpi_shim"):
        visit(o)
    elif isinstance(o, types.FunctionType):
        fns.append(o)
fast = 0
for f in fns:
    line = docsig._fast_signature(f)
    if line is None:
        continue
    fast += 1
    assert line == str(inspect.signature(f)), (f, line, str(inspect.signature(f)))
assert fast > 400, fast          # (what falls back to inspect is the exception)
assert MPI.Comm.Get_rank.__doc__.startswith("Get_rank(self)"), MPI.Comm.Get_rank.__doc__
print("SIGNATURES OK", fast)
'''


def test_embedded_signatures_read_from_code_match_inspect():
    """mpi_shim.docsig writes each docstring's signature line from the code
    object (inspect.signature cost every rank 20 ms of start-up): for every
    function and method of the MPI namespace, and for every parameter kind,
    the text is inspect's."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", SIGNATURE_SNIPPET], env=env,
                          capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SIGNATURES OK" in proc.stdout

REDUCE_SNIPPET = r'''
import numpy as np
from mpi_shim import MPI
from mpi_shim.cco import _operand
from ucxpy.coll import ScratchPool
from mpi_shim.op import store

# plain arrays: a read-only view of the send buffer (no copy), recvbuf itself as the target
a, b = np.arange(6.0).reshape(2, 3), np.zeros((2, 3))
x, rm, codec = _operand(a, b)
assert rm is b and np.shares_memory(x, a) and not x.flags.writeable and x.shape == (6,)
assert codec.dtype == np.float64 and codec.count == 6
x, rm, _ = _operand(MPI.IN_PLACE, b)
assert rm is b and np.shares_memory(x, b) and not x.flags.writeable
x, rm, _ = _operand(a, None)
assert rm is None and np.shares_memory(x, a)
# anything else is parsed: other dtypes or counts, big-endian, non-contiguous, read-only recvbuf
for send, recv in ((a, np.zeros(6, "f4")), (a, np.zeros(5)), (a.astype(">f8"), np.zeros(6)),
                   (a, np.zeros((3, 4))[:, :2]), ([a, MPI.DOUBLE], [b, MPI.DOUBLE])):
    try:
        x, rm, _ = _operand(send, recv)
    except (ValueError, BufferError, MPI.Exception):
        continue
    assert type(rm) is not np.ndarray, (send, recv)
ro = np.zeros(6); ro.flags.writeable = False
try:
    _operand(a, ro)
except (ValueError, BufferError, MPI.Exception, TypeError):
    pass
else:
    raise AssertionError("a read-only recvbuf was accepted")
# store into the array, skipping a copy onto itself
out = np.zeros((2, 3)); store(out, np.arange(6.0)); assert out.ravel().tolist() == list(range(6))
store(out, out.reshape(-1)); assert out.ravel().tolist() == list(range(6))
# combine_to: predefined ufuncs in place, user ops through combine
l, r, o = np.array([1, 5, 3]), np.array([4, 2, 6]), np.zeros(3, int)
MPI.SUM.combine_to(l, r, o); assert o.tolist() == [5, 7, 9]
MPI.MAX.combine_to(l, r, r); assert r.tolist() == [4, 5, 6]
MPI.MAXLOC  # (pairs: combine path, tested by the collectives)
def _mul(inbuf, inout, dt):
    io = np.frombuffer(inout, int); io *= np.frombuffer(inbuf, int)
op = MPI.Op.Create(_mul, commute=True)
op.combine_to(l, np.array([2, 2, 2]), o); assert o.tolist() == [2, 10, 6]
op.Free()
# scratch buffers are reused, big ones are not kept, and at most KEEP are
pool = ScratchPool()
s1 = pool.take(1000); assert len(s1) >= 1000
pool.give(s1); assert pool.take(500) is s1
pool.give(s1)
big = pool.take(ScratchPool.MAX_KEPT + 1); pool.give(big); assert all(f is not big for f in pool.free)
for _ in range(ScratchPool.KEEP + 3):
    pool.give(np.empty(8, np.uint8))
assert len(pool.free) == ScratchPool.KEEP
# a full pool of small buffers keeps a large one (in place of the smallest),
# and a take gets the smallest buffer that fits
large = np.empty(1 << 20, np.uint8); pool.give(large)
assert len(pool.free) == ScratchPool.KEEP and any(f is large for f in pool.free)
assert pool.take(8) is not large and pool.take(4096) is large
# the parser's plain path (whole contiguous arrays, bytes) gives what the
# general parser gives; anything else still goes through the general one
from mpi_shim import msgspec
def general(obj, writable):
    buf, o, count, displ, dtype = msgspec._simple(obj, writable)
    return msgspec._message(buf, o, count, displ * dtype._h.typemap.extent, dtype, writable)
objs = [(np.arange(n) % 2).astype(dt) for dt in ("i1", "u2", "i4", "i8", "f4", "f8", "c8", "c16", "?")
        for n in (1, 7)] + [np.zeros((3, 4), "f8"), b"abc", bytearray(b"xyz"),
                            np.zeros((4, 4))[:, 1], np.zeros(3, ">i4"), np.zeros(0), b""]
for obj in objs:
    for writable in (False, True):
        try:
            want = general(obj, writable)
        except Exception as e:
            want = type(e)
        try:
            got = msgspec.parse(obj, writable)
        except Exception as e:
            got = type(e)
        if isinstance(want, type):
            assert got is want, (obj, writable, got, want)
            continue
        assert (got.count, got.dtype, got.offset) == (want.count, want.dtype, want.offset), obj
        assert bytes(got.contig()) == bytes(want.contig()), obj
        assert got.obj is obj
fast = msgspec.parse(np.zeros(5))
assert fast.whole and fast.contig().nbytes == 40
assert not msgspec.parse([np.zeros(5), 3, MPI.DOUBLE]).whole
print("REDUCE OK")
'''


def test_reduction_fast_path_helpers():
    """The reduction operand fast path, store, Op.combine_to, the scratch
    pool and the message parser's plain path, in a one-rank job (the multi-rank results: tests/progs/mpi_coll.py)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", REDUCE_SNIPPET], env=env, capture_output=True,
                          text=True, timeout=100, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "REDUCE OK" in proc.stdout


def test_pytest_mpi_plugin_under_the_launcher():
    """The real pytest-mpi plugin on mpi_shim (drop-in mpi4py): marked tests run
    with --with-mpi under ucxpy-run, min_size is honoured, mpi_tmp_path is
    shared, and without --with-mpi the MPI tests skip."""
    import re
    from conftest import PROGS
    prog = os.path.join(PROGS, "mpi_marked_tests.py")
    env = dict(os.environ, PYTHONPATH=ROOT)
    base = [sys.executable, "-m", "ucxpy.bootstrap.launcher", "--as-mpi4py", "--timeout", "100"]
    pytest_args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", prog]
    proc = subprocess.run(base + ["-n", "4"] + pytest_args + ["--with-mpi"], env=env,
                          capture_output=True, text=True, timeout=130, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(re.findall(r"4 passed, 1 skipped", proc.stdout)) == 4, proc.stdout
    proc = subprocess.run(base + ["-n", "1"] + pytest_args, env=env, capture_output=True,
                          text=True, timeout=130, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 4 skipped" in proc.stdout, proc.stdout


@pytest.mark.parametrize("mode", ["pool", "spawn"])
def test_futures_example(mode):
    """examples/futures_pi.py, unmodified mpi4py.futures code on the drop-in:
    with ``python -m mpi4py.futures`` on 4 ranks (ranks 1..3 are the workers)
    and on 1 rank, where the workers are spawned through ucxpy-run."""
    prog = os.path.join(ROOT, "examples", "futures_pi.py")
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "ucxpy.bootstrap.launcher", "--as-mpi4py",
           "--timeout", "100"]
    if mode == "pool":
        cmd += ["-n", "4", sys.executable, "-m", "mpi4py.futures", prog]
    else:
        cmd += ["-n", "1", sys.executable, prog]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=130,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout and "pi ~ 3.14159265" in proc.stdout, proc.stdout


def test_dropin_packages_resolve_to_ucxpy():
    """``python -m mpi_shim.dropin --path`` names the directory whose mpi4py is
    the shim: mpi4py.MPI there is mpi_shim.MPI, mpi4py.rc and get_include work,
    and the shmem4py drop-in's shmem is ucxpy's."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    path = subprocess.run([sys.executable, "-m", "mpi_shim.dropin", "--path"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert path.returncode == 0, path.stderr
    dropin = path.stdout.strip()
    assert os.path.isdir(os.path.join(dropin, "mpi4py")), dropin
    code = ("import mpi4py, mpi_shim.MPI as S; mpi4py.rc.threads = True; "
            "from mpi4py import MPI; assert MPI is S, MPI; "
            "assert MPI.COMM_WORLD.Get_size() == 1; "
            "import os; assert os.path.isdir(mpi4py.get_include()); "
            "import shmem4py.shmem as sh, shmem; assert sh.my_pe is shmem.my_pe; "
            "print('DROPIN OK', MPI.Get_library_version().split()[0])")
    env["PYTHONPATH"] = os.pathsep.join([dropin, os.path.join(ROOT, "shmem", "dropin"), ROOT])
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "DROPIN OK" in proc.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_thread_multiple_four_threads_per_rank(n):
    """4 threads per rank exchange tagged messages on one communicator at
    once and run collectives on their own Dups (tests/progs/mpi_threads.py)."""
    from conftest import PROGS
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "ucxpy.bootstrap.launcher", "--as-mpi4py",
                           "--timeout", "100", "-n", str(n), sys.executable,
                           os.path.join(PROGS, "mpi_threads.py")],
                          env=env, capture_output=True, text=True, timeout=130, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("THREADS OK") == n, proc.stdout

"""Unit tests of the pieces of ``shmem`` that need no job: the deterministic
symmetric-heap allocator, size parsing, handle objects, the error hierarchy;
plus a single-PE job (singleton bootstrap, no launcher)."""
from __future__ import annotations

import random
import subprocess
import sys

import pytest

import ucxpy
from conftest import ROOT, run_job

pytestmark = pytest.mark.timeout(60)

shmem = pytest.importorskip("shmem")
from shmem.heap import MIN_ALIGN, Allocator  # noqa: E402
from shmem.runtime import heap_size_from_env, parse_size  # noqa: E402


def _script(seed, n=400):
    rng = random.Random(seed)
    ops, live = [], 0
    for _ in range(n):
        if live and rng.random() < 0.45:
            ops.append(("free", rng.randrange(live)))
            live -= 1
        else:
            ops.append(("alloc", rng.choice([0, 1, 7, 16, 100, 4096, 65536]),
                        rng.choice([None, 16, 64, 256, 4096])))
            live += 1
    return ops


def _replay(ops, size=1 << 24):
    a = Allocator(1024, size)
    live, trace = [], []
    for op in ops:
        if op[0] == "alloc":
            off = a.allocate(op[1], op[2] or MIN_ALIGN)
            live.append((off, op[1]))
            trace.append(off)
        else:
            off, _ = live.pop(op[1])
            a.release(off)
    return a, live, trace


@pytest.mark.parametrize("seed", range(5))
def test_allocator_is_deterministic_and_sound(seed):
    ops = _script(seed)
    a1, live, t1 = _replay(ops)
    _, _, t2 = _replay(ops)
    assert t1 == t2                                   # same sequence -> same offsets
    spans = sorted((off, off + max(n, 1)) for off, n in live)
    for (s0, e0), (s1, _) in zip(spans, spans[1:]):
        assert e0 <= s1                               # live blocks never overlap
    for (off, _), op in zip(live, [o for o in ops if o[0] == "alloc"]):
        assert off >= 1024 and off % MIN_ALIGN == 0


def test_allocator_coalesces_back_to_one_block():
    a = Allocator(0, 1 << 20)
    offs = [a.allocate(1000) for _ in range(50)]
    for off in offs[::2] + offs[1::2]:
        a.release(off)
    assert a.starts == [0] and a.lengths == [1 << 20]
    assert a.allocate((1 << 20) - 16) == 0


def test_allocator_errors():
    a = Allocator(0, 4096)
    off = a.allocate(100, 256)
    assert off % 256 == 0
    a.release(off)
    with pytest.raises(shmem.InvalidFree) as ei:
        a.release(off)
    assert isinstance(ei.value, KeyError) and "double free" in str(ei.value)
    with pytest.raises(shmem.SymmetricHeapExhausted) as ei:
        a.allocate(8192)
    assert isinstance(ei.value, MemoryError) and "UCXPY_SHMEM_HEAP_SIZE" in str(ei.value)


@pytest.mark.parametrize("text,size", [("64M", 64 << 20), ("1g", 1 << 30), ("512KB", 512 << 10),
                                       ("65536", 65536), ("1.5m", 3 << 19)])
def test_parse_size(text, size):
    assert parse_size(text) == size


def test_heap_size_env_precedence():
    assert heap_size_from_env({}) == 64 << 20
    assert heap_size_from_env({"SHMEM_SYMMETRIC_SIZE": "8M"}) == 8 << 20
    assert heap_size_from_env({"SHMEM_SYMMETRIC_SIZE": "8M",
                               "UCXPY_SHMEM_HEAP_SIZE": "2M"}) == 2 << 20
    with pytest.raises(ValueError):
        parse_size("lots")


def test_handles_without_init():
    assert shmem.Team() == shmem.TEAM_INVALID and not shmem.Team(None)
    assert shmem.Team(shmem.TEAM_WORLD) == shmem.TEAM_WORLD
    assert shmem.Team(shmem.TEAM_WORLD) is not shmem.TEAM_WORLD
    assert shmem.TEAM_WORLD != shmem.TEAM_SHARED and shmem.TEAM_WORLD != 1
    with pytest.raises(TypeError):
        shmem.Team(0)
    with pytest.raises(TypeError):
        shmem.Ctx("default")
    alias = shmem.Ctx(shmem.CTX_DEFAULT)
    alias.destroy()
    assert not alias and shmem.CTX_DEFAULT
    with pytest.raises(shmem.InvalidTeam):
        shmem.TEAM_INVALID.my_pe()
    assert f"{shmem.OP_SUM}_reduce" == "sum_reduce" and shmem.OP("max") is shmem.OP_MAX
    assert str(shmem.AMO_XOR) == "xor"


def test_not_initialized_is_clear():
    code = ("import shmem\ntry:\n    shmem.my_pe()\nexcept shmem.NotInitialized as e:\n"
            "    print('NI', isinstance(e, RuntimeError))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=30, cwd=ROOT, env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})
    assert "NI True" in r.stdout, r.stderr


def test_error_hierarchy():
    assert issubclass(shmem.ShmemError, ucxpy.UcxpyError)
    assert issubclass(shmem.InvalidPE, ucxpy.InvalidRank)
    for exc, base in ((shmem.NotSymmetric, ValueError), (shmem.InvalidArray, ValueError),
                      (shmem.DtypeMismatch, TypeError), (shmem.InvalidFree, KeyError),
                      (shmem.SymmetricHeapExhausted, MemoryError),
                      (shmem.InvalidTeam, RuntimeError), (shmem.InvalidContext, RuntimeError),
                      (shmem.NotInitialized, RuntimeError)):
        assert issubclass(exc, shmem.ShmemError) and issubclass(exc, base)


def test_single_pe_job_without_launcher():
    code = ("import numpy as np, shmem\nshmem.init()\n"
            "a = shmem.zeros(3, 'i8'); shmem.put(a, np.arange(3), 0); shmem.barrier_all()\n"
            "r = shmem.zeros(3, 'i8'); shmem.reduce(r, a); assert list(r) == [0, 1, 2]\n"
            "assert shmem.atomic_fetch_inc(a[:1], 0) == 0 and shmem.n_pes() == 1\n"
            "print('SINGLE OK', shmem.heap_info()['modes'])\nshmem.finalize()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=50, cwd=ROOT, env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin",
                                                  "UCXPY_SHMEM_HEAP_SIZE": "4M"})
    assert "SINGLE OK ['local']" in r.stdout, r.stdout + r.stderr


def test_heap_size_mismatch_is_reported():
    code = ("import os, shmem\n"
            "shmem.init(heap_size=(2 << 20) * (1 + int(os.environ['UCXPY_RANK'])))\n")
    r = run_job(["python", "-c", code], 2, timeout=60)
    assert r.returncode != 0 and "UCXPY_SHMEM_HEAP_SIZE" in r.stdout + r.stderr

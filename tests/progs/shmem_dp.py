"""shmem's calls through the native data plane and through the Python
reference (UCXPY_FASTPATH=y / n): a fixed sequence of put, get, quiet and
atomics on every PE pair, plain calls and the cases the data plane leaves to
Python (other formats, keywords, views, floats, bad arguments), each call's
outcome written down.  Every PE prints one digest of all outcomes, which must
be the same with and without the data plane, and what its data plane
executed (test_shmem_dp.py compares them)."""
import hashlib
import os

import numpy as np

import shmem

shmem.init()
me, n = shmem.my_pe(), shmem.n_pes()
outcomes = []


def note(what, fn):
    """Run ``fn()`` and write down its result or the error it raised."""
    try:
        r = fn()
        outcomes.append(f"{what}: {type(r).__name__} {r!r}")
    except Exception as e:               # the error's kind is part of the outcome
        outcomes.append(f"{what}: raised {type(e).__name__}")


heap = {dt: shmem.zeros(8, dtype=dt) for dt in ("i4", "u4", "i8", "u8", "f8", ">i8")}
word = {dt: shmem.zeros(1, dtype=dt) for dt in ("i4", "u4", "i8", "u8", "f8", "q")}
shmem.barrier_all()


def turn(step):
    """This PE's calls of one step (the PEs take turns: every outcome is
    deterministic)."""
    for pe in range(n):
        for dt, arr in heap.items():
            src = (np.arange(8) * (me + 1) + 100 * step).astype(dt)
            note(f"put {dt} {pe}", lambda: shmem.put(arr, src, pe))
            note(f"put-size {dt} {pe}", lambda: shmem.put(arr, src, pe, size=3))
            note(f"put-view {dt} {pe}", lambda: shmem.put(arr[2:5], src[:3], pe))
            note(f"put_nbi {dt} {pe}", lambda: shmem.put_nbi(arr, src[::-1].copy(), pe))
            note("quiet", shmem.quiet)
            back = np.zeros(8, dt)
            note(f"get_nbi {dt} {pe}", lambda: shmem.get_nbi(back, arr, pe))
            note("quiet", shmem.quiet)
            note(f"get {dt} {pe}", lambda: (shmem.get(back, arr, pe), back.tolist()))
        note(f"put-mixed {pe}", lambda: shmem.put(heap["i8"], np.zeros(8, "u8"), pe))
        note(f"put-local {pe}", lambda: shmem.put(np.zeros(8, "i8"), np.zeros(8, "i8"), pe))
        note(f"put-list {pe}", lambda: shmem.put(heap["i8"], [1, 2], pe))
        note(f"put-pe {pe}", lambda: shmem.put(heap["i8"], np.zeros(8, "i8"), pe + n))
        for dt, w in word.items():
            v = 3 + me
            note(f"fadd {dt} {pe}", lambda: shmem.atomic_fetch_add(w, v, pe))
            note(f"add {dt} {pe}", lambda: shmem.atomic_add(w, -1, pe))
            note(f"finc {dt} {pe}", lambda: shmem.atomic_fetch_inc(w, pe))
            note(f"inc {dt} {pe}", lambda: shmem.atomic_inc(w, pe))
            note(f"fand {dt} {pe}", lambda: shmem.atomic_fetch_and(w, 0xFFF, pe))
            note(f"and {dt} {pe}", lambda: shmem.atomic_and(w, 0x7FF, pe))
            note(f"for {dt} {pe}", lambda: shmem.atomic_fetch_or(w, 0x100, pe))
            note(f"or {dt} {pe}", lambda: shmem.atomic_or(w, 0x200, pe))
            note(f"fxor {dt} {pe}", lambda: shmem.atomic_fetch_xor(w, 5, pe))
            note(f"xor {dt} {pe}", lambda: shmem.atomic_xor(w, 5, pe))
            note(f"swap {dt} {pe}", lambda: shmem.atomic_swap(w, 1 << 40, pe))
            note(f"set {dt} {pe}", lambda: shmem.atomic_set(w, 17, pe))
            note(f"cswap {dt} {pe}", lambda: shmem.atomic_compare_swap(w, 17, -2, pe))
            note(f"cswap-miss {dt} {pe}", lambda: shmem.atomic_compare_swap(w, 17, 9, pe))
            note(f"fetch {dt} {pe}", lambda: shmem.atomic_fetch(w, pe))
            note(f"fadd-np {dt} {pe}", lambda: shmem.atomic_fetch_add(w, np.int64(2), pe))
            note(f"fadd-ctx {dt} {pe}", lambda: shmem.atomic_fetch_add(w, 1, pe, ctx=None))
            note(f"fetch-1 {dt}", lambda: shmem.atomic_fetch(w, -1))
            note(f"fetch-n {dt}", lambda: shmem.atomic_fetch(w, n))
            note(f"fadd-str {dt} {pe}", lambda: shmem.atomic_fetch_add(w, "1", pe))
        note(f"fadd-2 {pe}", lambda: shmem.atomic_fetch_add(heap["i8"][:2], 1, pe))
        note(f"fadd-local {pe}", lambda: shmem.atomic_fetch_add(np.zeros(1, "i8"), 1, pe))
    note("quiet", shmem.quiet)


for step in range(2):
    for actor in range(n):
        if actor == me:
            turn(step)
        shmem.barrier_all()
    for dt, arr in heap.items():
        note(f"final {dt}", lambda: arr.tolist())
    for dt, w in word.items():
        note(f"final word {dt}", lambda: w.tolist())
    shmem.barrier_all()

digest = hashlib.sha256("\n".join(outcomes).encode()).hexdigest()
if os.environ.get("SHMEM_DP_DUMP"):
    with open(f"{os.environ['SHMEM_DP_DUMP']}.{me}", "w") as f:
        f.write("\n".join(outcomes))
dp = shmem.runtime.current.worker.dp
counters = dp.counters() if dp is not None else {}
print(f"SHMEM-DP {me} digest={digest} calls={len(outcomes)} "
      f"put={counters.get('put', 0)} get={counters.get('get', 0)} "
      f"atomic={counters.get('atomic', 0)}", flush=True)
shmem.finalize()

"""Latency of small shmem operations between two same-host PEs.
Prints 'SHMEM-PERF <name> <microseconds>' lines from PE 0 (best of 5 runs)."""
import time

import numpy as np

import shmem

shmem.init()
me, n = shmem.my_pe(), shmem.n_pes()
peer = (me + 1) % n
src = np.ones(1, "i8")
dst = shmem.zeros(1, "i8")
ctr = shmem.zeros(1, "i8")
ITERS = 5000


def best(fn):
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) / ITERS * 1e6)
    return min(times)


def put_quiet():
    for _ in range(ITERS):
        shmem.put(dst, src, peer)
        shmem.quiet()


def get_():
    out = np.empty(1, "i8")
    for _ in range(ITERS):
        shmem.get(out, dst, peer)


def fetch_add():
    for _ in range(ITERS):
        shmem.atomic_fetch_add(ctr, 1, peer)


results = {}
shmem.barrier_all()
if me == 0:
    results = {"put8+quiet": best(put_quiet), "get8": best(get_),
               "atomic_fetch_add": best(fetch_add)}
shmem.barrier_all()
t0 = time.perf_counter()
for _ in range(200):
    shmem.barrier_all()
results["barrier_all"] = (time.perf_counter() - t0) / 200 * 1e6
if me == 0:
    modes = shmem.heap_info()["modes"]
    for k, v in results.items():
        print(f"SHMEM-PERF {k} {v:.2f} ({modes[peer]})", flush=True)
shmem.finalize()

"""Latency of small shmem operations between two same-host PEs.
Prints 'SHMEM-PERF <name> <microseconds> (<mode>)' lines from PE 0 (best of
5 runs), <mode> being the access mode each operation actually used: the
RMA access modes its run counted in worker.stats() (needs UCXPY_STATS=y;
"am", "cma", ... joined by "+"), or "mapped" when it issued no RMA operation
and the peer's heap is mapped (direct loads, stores and native atomics)."""
import os
import time

import numpy as np

import shmem

shmem.init()
me, n = shmem.my_pe(), shmem.n_pes()
peer = (me + 1) % n
src = np.ones(1, "i8")
dst = shmem.zeros(1, "i8")
ctr = shmem.zeros(1, "i8")
#: operations per timed run (SHMEM_PERF_ITERS: fewer where only the modes matter)
ITERS = int(os.environ.get("SHMEM_PERF_ITERS", "5000"))


worker = shmem.runtime.get().worker
peer_mode = shmem.heap_info()["modes"][peer]


def rma_modes():
    w = worker.stats()["worker"]
    return {k[len("rma.mode."):]: v for k, v in w.items() if k.startswith("rma.mode.")}


def mode_used(before, after):
    if not worker.stats()["enabled"]:
        return "unknown (run with UCXPY_STATS=y)"
    used = sorted(m for m in after if after[m] > before.get(m, 0))
    if used:
        return "+".join(used)
    return "mapped" if peer_mode == "mapped" else f"none ({peer_mode} peer, no RMA counted)"


def best(fn):
    times = []
    before = rma_modes()
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) / ITERS * 1e6)
    return min(times), mode_used(before, rma_modes())


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
results["barrier_all"] = ((time.perf_counter() - t0) / 200 * 1e6, "collective")
if me == 0:
    for k, (v, mode) in results.items():
        print(f"SHMEM-PERF {k} {v:.2f} ({mode})", flush=True)
shmem.finalize()

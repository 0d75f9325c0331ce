"""RMA on mapped memory, the core against mpi_shim, one process measuring.

Run as a 2-rank job on one host, once per path::

    UCXPY_TLS=shm ucxpy-run -n 2 python bench/rma_native.py            # native
    UCXPY_TLS=shm UCXPY_FASTPATH=n ucxpy-run -n 2 python bench/rma_native.py

Rank 0 opens a passive-target epoch on rank 1's ``MPI.Win.Allocate``
window and times, in alternating blocks of 2000 calls (the minimum over
the blocks, in µs per operation), 8 B accesses to it through ucxpy's
endpoint (the window's own remote key) and through mpi_shim:

  put   ``ep.put_nb`` + ``ep.flush``   vs ``Win.Put`` + ``Win.Flush``
  get   ``ep.get``                     vs ``Win.Get`` + ``Win.Flush``
  amo   ``ep.atomic_fetch("add")``     vs ``Win.Fetch_and_op(SUM)`` + ``Win.Flush``
  cas   ``ep.atomic_fetch("cswap")``   vs ``Win.Compare_and_swap`` + ``Win.Flush``

Prints one ``RMA_NATIVE {...}`` JSON line (docs/notes/performance-history.md).
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from mpi_shim import MPI  # noqa: E402

BLOCK = 2000
ROUNDS = int(os.environ.get("RMA_NATIVE_ROUNDS", "40"))


def loops(win, peer: int) -> dict:
    w = win._impl()
    ep, rkey = w.eps[peer], w.rkeys[peer]
    base = w.peers[peer][0]
    buf = np.ones(8, np.uint8)
    one, old = np.ones(1, np.int64), np.zeros(1, np.int64)
    cmp_ = np.zeros(1, np.int64)
    put_nb, get, flush, fetch = ep.put_nb, ep.get, ep.flush, ep.atomic_fetch
    Put, Get, Flush = win.Put, win.Get, win.Flush
    Fop, Cas, SUM = win.Fetch_and_op, win.Compare_and_swap, MPI.SUM
    ctr = 16                                    # the counter's byte displacement

    def core_put(n):
        for _ in range(n):
            put_nb(buf, base, rkey)
            flush()

    def core_get(n):
        for _ in range(n):
            get(buf, base, rkey)

    def core_amo(n):
        for _ in range(n):
            fetch("add", 1, base + ctr, rkey, 8)

    def core_cas(n):
        for _ in range(n):
            fetch("cswap", 1, base + ctr, rkey, 8, 0)

    def shim_put(n):
        for _ in range(n):
            Put(buf, peer)
            Flush(peer)

    def shim_get(n):
        for _ in range(n):
            Get(buf, peer)
            Flush(peer)

    def shim_amo(n):
        for _ in range(n):
            Fop(one, old, peer, ctr, SUM)
            Flush(peer)

    def shim_cas(n):
        for _ in range(n):
            Cas(one, cmp_, old, peer, ctr)
            Flush(peer)

    return {"put": (core_put, shim_put), "get": (core_get, shim_get),
            "amo": (core_amo, shim_amo), "cas": (core_cas, shim_cas)}


def main() -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() != 2:
        sys.exit("run with 2 ranks")
    peer = 1 - rank
    win = MPI.Win.Allocate(64, 1, comm=comm)
    comm.Barrier()
    if rank == 0:
        win.Lock(peer, MPI.LOCK_SHARED)
        fns = loops(win, peer)
        best = {(op, who): float("inf") for op in fns for who in ("ucxpy", "mpi_shim")}
        for _ in range(ROUNDS):
            for op, (core, shim) in fns.items():
                for who, fn in (("ucxpy", core), ("mpi_shim", shim)):
                    t = time.perf_counter()
                    fn(BLOCK)
                    best[op, who] = min(best[op, who], (time.perf_counter() - t) / BLOCK * 1e6)
        win.Unlock(peer)
        mode = win._impl().rkeys[peer].mode
        out = {"fastpath": os.environ.get("UCXPY_FASTPATH", "y"), "mode": mode,
               "us": {op: {who: round(best[op, who], 3) for who in ("ucxpy", "mpi_shim")}
                      for op in fns}}
        print("RMA_NATIVE " + json.dumps(out), flush=True)
    comm.Barrier()
    win.Free()


if __name__ == "__main__":
    main()

"""Where a small message's microseconds go (docs/notes/performance-history.md).

Run as a 2-rank job: ``ucxpy-run -n 2 python bench/budget.py [--shim]``.
Rank 0 ping-pongs 8 B messages with rank 1, first untimed-profiled for the
half round trip, then under ``cProfile`` to split its own CPU time by layer:
the MPI layer (``mpi_shim``), the core's request/matching/protocol code
(``ucxpy`` outside the transports), the shm transport (``ucxpy.transports``),
the native calls (cffi), the rest (numpy, the interpreter's builtins), and
``wait``: the polling loops' own time while the peer has its turn.
The profile inflates every Python call alike, so the shares, not its
absolute times, are applied to the unprofiled half round trip.  Prints one
``BUDGET {...}`` JSON line.
"""
from __future__ import annotations

import cProfile
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

SHIM = "--shim" in sys.argv
ITERS = int(os.environ.get("BUDGET_ITERS", "20000"))


#: the polling loops' own time: rank 0 spinning while the message travels
#: and rank 1 works (half of each round trip is the peer's turn)
WAIT_LOOPS = {"_wait", "_wait_loop", "wait_until", "_wait_traced", "_idle_sleep"}


def layer(filename: str, name: str) -> str:
    f = filename.replace("\\", "/")
    if name in WAIT_LOOPS and ("/ucxpy/" in f or "/mpi_shim/" in f):
        return "wait"
    if "/mpi_shim/" in f:
        return "mpi_shim"
    if "/ucxpy/transports/" in f:
        return "transport"
    if "/ucxpy/" in f:
        return "core"
    if filename == "~" and ("_native" in name or "_apilock" in name or "_dp" in name or "_cffi" in name or "ucxpy_" in name):
        return "native"
    return "other"


def main() -> int:
    if SHIM:
        from mpi_shim import MPI
        c = MPI.COMM_WORLD
        rank, send, recv = c.rank, c.Send, c.Recv
        barrier = c.Barrier
    else:
        import ucxpy.spmd as spmd
        w = spmd.init()
        rank, barrier = w.rank, w.barrier

        def send(buf, dest, tag):
            w.send(buf, dest, tag)

        def recv(buf, src, tag):
            w.recv(buf, src, tag)
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank % len(os.sched_getaffinity(0))]})
    peer = 1 - rank
    out, back = np.zeros(8, np.uint8), np.empty(8, np.uint8)

    def loop(n):
        for _ in range(n):
            if rank == 0:
                send(out, peer, 3)
                recv(back, peer, 3)
            else:
                recv(back, peer, 3)
                send(out, peer, 3)
    loop(2000)
    barrier()
    t0 = time.perf_counter()
    loop(ITERS)
    half = (time.perf_counter() - t0) / (2 * ITERS)
    barrier()
    prof = cProfile.Profile()
    if rank == 0:
        prof.enable()
    loop(ITERS // 4)
    if rank == 0:
        prof.disable()
        st = pstats.Stats(prof)
        by = {}
        for (fn, _line, name), (_cc, _nc, tt, _ct, _callers) in st.stats.items():
            k = layer(fn, name)
            by[k] = by.get(k, 0.0) + tt
        total = sum(by.values()) or 1.0
        share = {k: v / total for k, v in sorted(by.items())}
        # one round trip of rank 0 = one send + one receive (including its wait)
        per_rt = 2 * half
        print("BUDGET " + json.dumps({
            "api": "mpi_shim" if SHIM else "ucxpy", "half_rtt_us": round(half * 1e6, 3),
            "share": {k: round(v, 3) for k, v in share.items()},
            "us_per_round_trip": {k: round(v * per_rt * 1e6, 2) for k, v in share.items()},
            "calls_per_round_trip": round(sum(s[1] for s in st.stats.values()) / (ITERS // 4), 1),
        }), flush=True)
    barrier()
    if not SHIM:
        w.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())

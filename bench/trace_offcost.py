"""The price of tracing when it is off, measured (``make bench`` runs it).

Every trace and statistics hook in the core sits behind one read of
``worker.tr`` and an ``is not None`` test; with ``UCXPY_TRACE`` and
``UCXPY_STATS`` unset (the default) that test is all that is left.  This
program, run as a 2-rank job (``ucxpy-run -n 2 python bench/trace_offcost.py``),
measures the three numbers the price is made of, in one run:

1. ``reads``: how many times the job reads ``worker.tr`` per message of an
   8 B ping-pong (both ranks counted; ``Worker.tr`` is replaced by a counting
   property for this phase only, so every guard on every path is counted,
   including the ones passed while polling, which overstates the critical path);
2. ``guard_ns``: the time of one such read and test on a real worker
   (``timeit``, best of 5, loop overhead included: an overstatement too);
3. ``half_rtt_us``: the 8 B ping-pong's half round trip with tracing off.

Rank 0 prints one JSON line, ``TRACE-OFFCOST {...}``, with
``offcost_ns = reads * guard_ns`` and its share of the half round trip.
"""
from __future__ import annotations

import json
import os
import sys
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import ucxpy.spmd as spmd  # noqa: E402
from ucxpy.worker import Worker  # noqa: E402

ITERS = int(os.environ.get("OFFCOST_ITERS", "20000"))


def pingpong(w, n: int) -> float:
    """Seconds per half round trip of ``n`` 8 B round trips."""
    peer = 1 - w.rank
    out, back = np.zeros(8, np.uint8), np.empty(8, np.uint8)
    w.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        if w.rank == 0:
            w.send(out, peer, 7)
            w.recv(back, peer, 7)
        else:
            w.recv(back, peer, 7)
            w.send(out, peer, 7)
    return (time.perf_counter() - t0) / (2 * n)


def main() -> int:
    if os.environ.get("UCXPY_TRACE") or os.environ.get("UCXPY_STATS"):
        print("trace_offcost: run with tracing and statistics off", file=sys.stderr)
        return 2
    w = spmd.init()
    if w.size != 2:
        print("trace_offcost: needs exactly 2 ranks", file=sys.stderr)
        return 2
    pingpong(w, 2000)                                  # warm-up
    half_rtt = min(pingpong(w, ITERS) for _ in range(3))

    # 2. one guard on a real worker whose tr is None
    worker = w.worker
    assert worker.tr is None
    guard = min(timeit.repeat("if w.tr is not None: pass", globals={"w": worker},
                              number=200000, repeat=5)) / 200000

    # 1. count every read of worker.tr during the same ping-pong
    reads = [0]

    def _get(self, _d=Worker.__dict__):
        reads[0] += 1
        return self.__dict__["_tr_off"]

    def _set(self, value):
        self.__dict__["_tr_off"] = value

    worker.__dict__["_tr_off"] = worker.__dict__.pop("tr")
    Worker.tr = property(_get, _set)
    try:
        w.barrier()
        reads[0] = 0
        pingpong(w, ITERS)
        mine = reads[0]
    finally:
        del Worker.tr
        worker.__dict__["tr"] = worker.__dict__.pop("_tr_off")
    per_msg_mine = mine / (2 * ITERS)
    peer = 1 - w.rank
    buf = np.array([per_msg_mine])
    other = np.empty(1)
    w.barrier()
    if w.rank == 0:
        w.send(buf, peer, 9)
        w.recv(other, peer, 9)
    else:
        w.recv(other, peer, 9)
        w.send(buf, peer, 9)
    total = per_msg_mine + float(other[0])       # both ranks, per one-way message
    if w.rank == 0:
        cost = total * guard
        print("TRACE-OFFCOST " + json.dumps({
            "reads_per_message": round(total, 2), "guard_ns": round(guard * 1e9, 1),
            "offcost_ns": round(cost * 1e9, 1), "half_rtt_us": round(half_rtt * 1e6, 3),
            "share": round(cost / half_rtt, 4), "iters": ITERS}), flush=True)
    w.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())

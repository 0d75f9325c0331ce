"""``ucxpy-perf``: point-to-point latency and bandwidth, like ``ucx_perftest``.

An SPMD program for (at least) two ranks; ranks 0 and 1 measure, others wait::

    ucxpy-run -n 2 ucxpy-perf -t tag_lat,tag_bw --pin
    python -m ucxpy.bootstrap.launcher -n 2 python -m ucxpy.tools.perf
    mpiexec -n 2 python -m ucxpy.tools.perf --mpi4py      # the reference peer

Tests
-----
``tag_lat``  ping-pong; latency is half the round trip, bandwidth size/latency.
``tag_bw``   rank 0 posts a window of non-blocking sends, rank 1 a window of
             receives, then rank 1 answers a 1-byte ack; bandwidth is bytes of
             the window over the time per window, latency the time per message.

For every size one message is first echoed and compared (``--no-check`` skips
it), then warm-up iterations run untimed; their duration lets rank 0 shrink
the iteration count so that one size takes about ``--max-time`` seconds (rank
0 tells rank 1 the count).  ``--iters`` fixes the count instead.

Rank 0 prints one table per test (lines starting with ``#`` are comments; data
rows are ``size iters latency_us bandwidth_GB/s``) and writes ``--json``.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import numpy as np

TESTS = ("tag_lat", "tag_bw")
DEFAULT_SIZES = (8, 64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10,
                 1 << 20, 4 << 20)

TAG_LAT, TAG_BW, TAG_ACK, TAG_CTRL, TAG_CHECK = 0x10, 0x11, 0x12, 0x13, 0x14

#: iteration budgets before the time-based cap (bytes moved per size)
LAT_BYTES, LAT_MIN, LAT_MAX = 256 << 20, 20, 20000
BW_BYTES, BW_MIN, BW_MAX = 1 << 30, 3, 1000


def parse_sizes(text: str) -> list:
    from ..config import _parse_size
    return [_parse_size(t) for t in text.split(",") if t.strip()]


# ------------------------------------------------------------------ comms

class UcxpyComm:
    """Ranks 0/1 over ucxpy: endpoint sends, worker receives from a source."""

    impl = "ucxpy"

    def __init__(self):
        import ucxpy
        from ucxpy.tag import FULL_MASK
        self.world = ucxpy.init()
        self.rank, self.size = self.world.rank, self.world.size
        self._mask = FULL_MASK

    def bind(self, peer: int):
        """``(send, recv, isend, irecv)`` to/from ``peer`` with the per-call
        overhead of the public API and nothing more."""
        ep = self.world.ep(peer)
        worker = self.world.worker
        mask = self._mask

        def recv(buf, tag):
            return worker.tag_recv(buf, tag, mask, peer)

        def irecv(buf, tag):
            return worker.tag_recv_nb(buf, tag, mask, peer)
        return ep.tag_send, recv, ep.tag_send_nb, irecv

    @staticmethod
    def waitall(reqs):
        for r in reqs:
            r.wait()

    def barrier(self):
        self.world.barrier()

    def lane(self, peer: int) -> str:
        lane = self.world.ep(peer).lane
        return lane.name if lane is not None else "?"

    def finalize(self):
        self.world.finalize()


class Mpi4pyComm:
    """The same pattern over mpi4py buffer calls (the reference)."""

    impl = "mpi4py"

    def __init__(self):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def bind(self, peer: int):
        c = self.comm

        def send(buf, tag):
            c.Send(buf, peer, tag)

        def recv(buf, tag):
            c.Recv(buf, peer, tag)

        def isend(buf, tag):
            return c.Isend(buf, peer, tag)

        def irecv(buf, tag):
            return c.Irecv(buf, peer, tag)
        return send, recv, isend, irecv

    def waitall(self, reqs):
        self.MPI.Request.Waitall(reqs)

    def barrier(self):
        self.comm.Barrier()

    def lane(self, peer: int) -> str:
        words = self.MPI.Get_library_version().split("\n")[0].split()
        return f"{words[0]}-{words[-1]}" if words else "mpi"

    def finalize(self):
        pass


# ------------------------------------------------------------------ patterns

def _agree(comm, send, recv, value: int) -> int:
    """Rank 0's ``value`` becomes both ranks' value."""
    buf = np.zeros(1, np.int64)
    if comm.rank == 0:
        buf[0] = value
        send(buf, TAG_CTRL)
    else:
        recv(buf, TAG_CTRL)
    return int(buf[0])


def _check(comm, send, recv, size: int) -> None:
    """Echo one patterned message and compare: catches corruption before timing."""
    pattern = ((np.arange(size, dtype=np.int64) * 7 + size) % 251).astype(np.uint8)
    buf = np.zeros(size, np.uint8)
    if comm.rank == 0:
        send(pattern, TAG_CHECK)
        recv(buf, TAG_CHECK)
        if not np.array_equal(buf, pattern):
            bad = int(np.argmax(buf != pattern))
            raise RuntimeError(f"{size}-byte message corrupted at byte {bad}")
    else:
        recv(buf, TAG_CHECK)
        send(buf, TAG_CHECK)


def _plan(comm, send, recv, run, default: int, lo: int, fixed, max_time: float) -> int:
    """Warm up (untimed for the result) and agree on the timed iteration count."""
    if fixed:
        run(max(1, fixed // 10))
        return _agree(comm, send, recv, fixed)
    warm = max(2, min(default // 10, 200))
    t0 = time.perf_counter()
    run(warm)
    per_iter = (time.perf_counter() - t0) / warm
    n = default
    if per_iter > 0:
        n = min(default, max(lo, int(max_time / per_iter)))
    return _agree(comm, send, recv, n)


def tag_lat(comm, size: int, opts) -> dict:
    send, recv, _, _ = comm.bind(1 - comm.rank)
    buf = np.zeros(size, np.uint8)
    if comm.rank == 0:
        def run(n):
            for _ in range(n):
                send(buf, TAG_LAT)
                recv(buf, TAG_LAT)
    else:
        def run(n):
            for _ in range(n):
                recv(buf, TAG_LAT)
                send(buf, TAG_LAT)
    default = int(min(LAT_MAX, max(LAT_MIN, LAT_BYTES // max(size, 1))) * opts.scale)
    n = _plan(comm, send, recv, run, max(default, 1), LAT_MIN, opts.iters, opts.max_time)
    t0 = time.perf_counter()
    run(n)
    elapsed = time.perf_counter() - t0
    half_rtt = elapsed / n / 2
    return {"size": size, "iters": n, "latency_us": half_rtt * 1e6,
            "bandwidth_GBps": size / half_rtt / 1e9}


def tag_bw(comm, size: int, opts) -> dict:
    send, recv, isend, irecv = comm.bind(1 - comm.rank)
    window = opts.window
    buf = np.zeros(size, np.uint8)
    ack = np.zeros(1, np.uint8)
    waitall = comm.waitall
    if comm.rank == 0:
        def run(n):
            for _ in range(n):
                waitall([isend(buf, TAG_BW) for _ in range(window)])
                recv(ack, TAG_ACK)
    else:
        def run(n):
            for _ in range(n):
                waitall([irecv(buf, TAG_BW) for _ in range(window)])
                send(ack, TAG_ACK)
    default = int(min(BW_MAX, max(BW_MIN, BW_BYTES // max(size * window, 1))) * opts.scale)
    n = _plan(comm, send, recv, run, max(default, 1), BW_MIN, opts.iters, opts.max_time)
    t0 = time.perf_counter()
    run(n)
    elapsed = time.perf_counter() - t0
    per_msg = elapsed / (n * window)
    return {"size": size, "iters": n, "latency_us": per_msg * 1e6,
            "bandwidth_GBps": size / per_msg / 1e9}


PATTERNS = {"tag_lat": tag_lat, "tag_bw": tag_bw}


# ------------------------------------------------------------------ output

def format_table(test: str, rows, meta: dict) -> str:
    head = (f"# ucxpy-perf {test}  impl={meta['impl']}  lane={meta['lane']}  "
            f"ranks={meta['ranks']}  pinned={'yes' if meta['pinned'] else 'no'}")
    if test == "tag_bw":
        head += f"  window={meta['window']}"
    lines = [head, f"# {'size':>10} {'iters':>8} {'latency_us':>12} {'bandwidth_GB/s':>15}"]
    for r in rows:
        lines.append(f"  {r['size']:>10} {r['iters']:>8} {r['latency_us']:>12.3f} "
                     f"{r['bandwidth_GBps']:>15.6f}")
    return "\n".join(lines)


def parse_table(text: str) -> dict:
    """``{test: [{"size", "iters", "latency_us", "bandwidth_GBps"}]}`` from
    ucxpy-perf's output (used by bench/run_bench.py and the tests)."""
    tables, current = {}, None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("# ucxpy-perf "):
            current = tables.setdefault(s.split()[2], [])
        elif s and not s.startswith("#") and current is not None:
            parts = s.split()
            if len(parts) == 4 and parts[0].isdigit():
                current.append({"size": int(parts[0]), "iters": int(parts[1]),
                                "latency_us": float(parts[2]),
                                "bandwidth_GBps": float(parts[3])})
    return tables


def pin_self(rank: int) -> int:
    """Bind this process to one CPU of its allowed set, chosen by rank."""
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[rank % len(cpus)]
    os.sched_setaffinity(0, {cpu})
    return cpu


# ------------------------------------------------------------------ main

def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ucxpy-perf",
                                description="ucxpy point-to-point latency / bandwidth")
    p.add_argument("-t", "--test", default=",".join(TESTS),
                   help=f"comma-separated tests among {', '.join(TESTS)} (default: both)")
    p.add_argument("-s", "--sizes", type=parse_sizes, default=None,
                   help="comma-separated message sizes, e.g. 8,1K,4M "
                        "(default: 8 B, then powers of 4 from 64 B to 4 MiB)")
    p.add_argument("--max-size", type=lambda s: parse_sizes(s)[0], default=None,
                   help="drop default sizes above this")
    p.add_argument("-n", "--iters", type=int, default=0,
                   help="fixed timed iterations per size (default: scaled by size and time)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply the default iteration counts")
    p.add_argument("--max-time", type=float, default=1.0,
                   help="target seconds per size when iterations are not fixed")
    p.add_argument("-w", "--window", type=int, default=64, help="tag_bw window (default 64)")
    p.add_argument("--pin", action="store_true", help="pin each rank to its own CPU")
    p.add_argument("--json", metavar="FILE", help="rank 0 writes the results here")
    p.add_argument("--mpi4py", action="store_true",
                   help="run the same pattern over mpi4py (launch with mpiexec)")
    p.add_argument("--no-check", action="store_true", help="skip the per-size data check")
    opts = p.parse_args(argv)
    tests = [t.strip() for t in opts.test.split(",") if t.strip()]
    for t in tests:
        if t not in PATTERNS:
            p.error(f"unknown test {t!r}; choose from {', '.join(TESTS)}")
    sizes = opts.sizes or [s for s in DEFAULT_SIZES
                           if opts.max_size is None or s <= opts.max_size]
    if opts.window < 1:
        p.error("--window must be >= 1")

    comm = Mpi4pyComm() if opts.mpi4py else UcxpyComm()
    if comm.size < 2:
        sys.stderr.write("ucxpy-perf: needs at least 2 ranks "
                         "(ucxpy-run -n 2 ucxpy-perf ... or mpiexec -n 2 ...)\n")
        return 2
    cpu = pin_self(comm.rank) if opts.pin else None
    results, lane = {}, "?"
    comm.barrier()
    if comm.rank < 2:
        for test in tests:
            rows = []
            for size in sizes:
                if not opts.no_check:
                    send, recv, _, _ = comm.bind(1 - comm.rank)
                    _check(comm, send, recv, size)
                rows.append(PATTERNS[test](comm, size, opts))
            results[test] = rows
        lane = comm.lane(1 - comm.rank)
    comm.barrier()
    if comm.rank == 0:
        meta = {"impl": comm.impl, "lane": lane, "ranks": comm.size,
                "pinned": cpu is not None, "window": opts.window,
                "tls": os.environ.get("UCXPY_TLS", "") if comm.impl == "ucxpy" else "",
                "host": socket.gethostname(), "python": sys.version.split()[0],
                "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        for test in tests:
            print(format_table(test, results[test], meta), flush=True)
        if opts.json:
            with open(opts.json, "w") as f:
                json.dump({"meta": meta, "tests": results}, f, indent=1)
    comm.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())

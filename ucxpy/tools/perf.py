"""``ucxpy-perf``: latency and bandwidth, like ``ucx_perftest`` / the OSU tests.

An SPMD program for (at least) two ranks; ranks 0 and 1 measure, others wait
(``allreduce`` uses every rank)::

    ucxpy-run -n 2 ucxpy-perf -t tag_lat,tag_bw --pin
    ucxpy-run -n 2 ucxpy-perf -t put_lat,get_lat,put_bw,get_bw,amo_lat
    mpiexec -n 2 python -m ucxpy.tools.perf --drivers bench/perf_drivers.py --impl mpi4py

Drivers
-------
One implementation per run, ``--impl NAME`` among the registered drivers;
the core registers only ``ucxpy`` (its own API, :mod:`.perf_comms`, the
default).  ``--drivers FILE_OR_MODULE`` (repeatable) first imports a Python
file (a path ending in ``.py``, or any path with a ``/``) or a module by
name; importing it registers more drivers with::

    from ucxpy.tools.perf import register_driver
    register_driver(name, factory, tests)

``factory()`` is called once per rank and returns the *comm* (the protocol
of :class:`.perf_comms.UcxpyComm`: ``rank``, ``size``, ``bind``, ``waitall``,
``barrier``, ``lane``, ``rma_window``, ``finalize``; for the collective tests
also ``coll_case(test, size) -> (call, check)``, ``bcast_int`` and
``max_float``; an optional ``tls`` attribute overrides the ``UCXPY_TLS`` shown
in the JSON).  ``tests`` names the tests it runs.  The comparison drivers
(MPI and OpenSHMEM libraries, ours included) live outside the package, in
``bench/perf_drivers.py``, which documents its names.

Tests (``latency_us`` is per operation, ``bandwidth_GBps`` is size / latency)
------------------------------------------------------------------------------
``tag_lat``   ping-pong; latency is half the round trip.
``tag_lat_nb`` the same ping-pong with non-blocking calls: each rank posts
              its receive, then sends, then waits for both (MPI ``Irecv`` +
              ``Isend`` + ``Waitall``; ucxpy ``tag_recv_nb`` + ``tag_send_nb``
              + ``wait``).
``tag_bw``    rank 0 posts a window of non-blocking sends, rank 1 a window of
              receives, then rank 1 answers a 1-byte ack; latency is the time
              per message.
``put_lat``   rank 0 writes ``size`` bytes into rank 1's registered region and
              waits for remote completion; latency is the time of one
              put + flush (ucxpy ``put_nb`` + ``Endpoint.flush``; MPI ``Put`` +
              ``Flush(peer)`` inside one ``Lock(peer, SHARED)`` epoch; shmem
              ``put`` + ``quiet``).
``get_lat``   one blocking read of ``size`` bytes (ucxpy ``get``; MPI ``Get`` +
              ``Flush``; shmem ``get``).
``put_bw``    a window of non-blocking puts, then one flush (MPI: Puts then
              ``Flush``; shmem: ``put_nbi`` then ``quiet``); time per put.
``get_bw``    the same with gets.
``amo_lat``   one fetching atomic add on an 8-byte word (ucxpy
              ``atomic_fetch("add")``; MPI ``Fetch_and_op(SUM)`` + ``Flush``;
              shmem ``atomic_fetch_add``); reported at size 8 only.
``allreduce`` ``Allreduce`` of float64 arrays of ``size`` bytes on all ranks
              (drivers with ``coll_case`` only: none in the core); latency
              is the slowest rank's mean time per call, as the OSU
              benchmark reports.
``bcast``     ``Bcast`` of ``size`` bytes from rank 0 (likewise).
``alltoall``  ``Alltoall`` with ``size`` bytes per peer (OSU's convention;
              likewise).

RMA tests are one-sided: rank 1 is a passive target that waits in a barrier
(a blocking call, so it progresses where the access needs the target: ucxpy
AM mode over tcp, mpi_shim's lock manager and accumulates).  Only rank 0
times them; the window (ucxpy ``mem_map(length=...)``, ``MPI.Win.Allocate``,
symmetric arrays) is created once per test by every rank.

For every size the data is first checked (an echoed message, or a put read
back with a get; ``--no-check`` skips it), then warm-up iterations run
untimed; their duration lets rank 0 shrink the iteration count so that one
size takes about ``--max-time`` seconds.  ``--iters`` fixes the count.

Rank 0 prints one table per test (lines starting with ``#`` are comments; data
rows are ``size iters latency_us bandwidth_GB/s``) and writes ``--json``.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import socket
import sys
import time

import numpy as np

from ..config import parse_size, setting
from .perf_comms import UcxpyComm

TAG_TESTS = ("tag_lat", "tag_lat_nb", "tag_bw")
RMA_TESTS = ("put_lat", "get_lat", "put_bw", "get_bw", "amo_lat")
COLL_TESTS = ("allreduce", "bcast", "alltoall")
TESTS = TAG_TESTS + RMA_TESTS + COLL_TESTS
#: tests whose figure of merit is latency (lower is better); the others bandwidth
LATENCY_TESTS = ("tag_lat", "tag_lat_nb", "put_lat", "get_lat", "amo_lat", "allreduce", "bcast",
                 "alltoall")

DEFAULT_SIZES = (8, 64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10,
                 1 << 20, 4 << 20)
#: defaults per family when --sizes is not given
RMA_SIZES = (8, 64, 1 << 10, 16 << 10, 256 << 10, 1 << 20)
ALLREDUCE_SIZES = (8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)
AMO_SIZE = 8

TAG_LAT, TAG_BW, TAG_ACK, TAG_CTRL, TAG_CHECK = 0x10, 0x11, 0x12, 0x13, 0x14

#: iteration budgets before the time-based cap (bytes moved per size)
LAT_BYTES, LAT_MIN, LAT_MAX = 256 << 20, 20, 20000
BW_BYTES, BW_MIN, BW_MAX = 1 << 30, 3, 1000


def parse_sizes(text: str) -> list:
    return [parse_size(t) for t in text.split(",") if t.strip()]


def _pattern(size: int) -> np.ndarray:
    return ((np.arange(size, dtype=np.int64) * 7 + size) % 251).astype(np.uint8)


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
    pattern = _pattern(size)
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


def _plan(run, default: int, lo: int, fixed, max_time: float, agree=int) -> int:
    """Warm up (untimed for the result) and agree on the timed iteration count
    (``agree`` maps rank 0's count to every participant's)."""
    if fixed:
        run(max(1, fixed // 10))
        return agree(fixed)
    warm = max(2, min(default // 10, 200))
    t0 = time.perf_counter()
    run(warm)
    per_iter = (time.perf_counter() - t0) / warm
    n = default
    if per_iter > 0:
        n = min(default, max(lo, int(max_time / per_iter)))
    return agree(n)


def _row(size: int, n: int, per_op: float) -> dict:
    return {"size": size, "iters": n, "latency_us": per_op * 1e6,
            "bandwidth_GBps": size / per_op / 1e9 if per_op > 0 else 0.0}


def _lat_default(size: int, opts) -> int:
    return max(1, int(min(LAT_MAX, max(LAT_MIN, LAT_BYTES // max(size, 1))) * opts.scale))


def _bw_default(size: int, opts) -> int:
    return max(1, int(min(BW_MAX, max(BW_MIN, BW_BYTES // max(size * opts.window, 1)))
                      * opts.scale))


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
    n = _plan(run, _lat_default(size, opts), LAT_MIN, opts.iters, opts.max_time,
              lambda v: _agree(comm, send, recv, v))
    t0 = time.perf_counter()
    run(n)
    return _row(size, n, (time.perf_counter() - t0) / n / 2)


def tag_lat_nb(comm, size: int, opts) -> dict:
    send, recv, isend, irecv = comm.bind(1 - comm.rank)
    sbuf, rbuf = np.zeros(size, np.uint8), np.zeros(size, np.uint8)
    waitall = comm.waitall
    if comm.rank == 0:
        def run(n):
            for _ in range(n):
                r = irecv(rbuf, TAG_LAT)
                waitall([isend(sbuf, TAG_LAT), r])
    else:
        def run(n):
            for _ in range(n):
                waitall([irecv(rbuf, TAG_LAT)])
                waitall([isend(sbuf, TAG_LAT)])
    n = _plan(run, _lat_default(size, opts), LAT_MIN, opts.iters, opts.max_time,
              lambda v: _agree(comm, send, recv, v))
    t0 = time.perf_counter()
    run(n)
    return _row(size, n, (time.perf_counter() - t0) / n / 2)


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
    n = _plan(run, _bw_default(size, opts), BW_MIN, opts.iters, opts.max_time,
              lambda v: _agree(comm, send, recv, v))
    t0 = time.perf_counter()
    run(n)
    return _row(size, n, (time.perf_counter() - t0) / (n * window))


def _rma_check(win, size: int) -> None:
    """Put a pattern, read it back: catches corruption before timing."""
    put, get, *_ = win.bind(size)
    pattern = _pattern(size)
    back = np.zeros(size, np.uint8)
    put(pattern)
    get(back)
    if not np.array_equal(back, pattern):
        bad = int(np.argmax(back != pattern))
        raise RuntimeError(f"{size}-byte put/get corrupted at byte {bad}")


def rma_test(win, test: str, size: int, opts) -> dict:
    """One RMA test at one size, run by the initiator (rank 0) alone."""
    put, get, put_nb, get_nb, flush, fetch_add = win.bind(size)
    buf = np.zeros(size, np.uint8)
    window = opts.window
    if test == "put_lat":
        def run(n):
            for _ in range(n):
                put(buf)
    elif test == "get_lat":
        def run(n):
            for _ in range(n):
                get(buf)
    elif test == "put_bw":
        def run(n):
            for _ in range(n):
                for _ in range(window):
                    put_nb(buf)
                flush()
    elif test == "get_bw":
        def run(n):
            for _ in range(n):
                for _ in range(window):
                    get_nb(buf)
                flush()
    elif test == "amo_lat":
        def run(n):
            for _ in range(n):
                fetch_add()
    else:
        raise ValueError(test)
    bw = test.endswith("_bw")
    default = _bw_default(size, opts) if bw else _lat_default(size, opts)
    n = _plan(run, default, BW_MIN if bw else LAT_MIN, opts.iters, opts.max_time)
    t0 = time.perf_counter()
    run(n)
    return _row(size, n, (time.perf_counter() - t0) / (n * (window if bw else 1)))


def run_rma(comm, test: str, sizes, opts) -> list:
    """Collective: every rank creates the window; rank 0 measures while rank 1
    waits in the closing barrier (which progresses its side)."""
    sizes = [AMO_SIZE] if test == "amo_lat" else sizes
    win = comm.rma_window(sizes)
    rows = []
    comm.barrier()
    if comm.rank == 0:
        for size in sizes:
            win.begin()
            try:
                if not opts.no_check and test != "amo_lat":
                    _rma_check(win, size)
                rows.append(rma_test(win, test, size, opts))
            finally:
                win.end()
    comm.barrier()
    comm.rma_mode = win.mode
    win.close()
    return rows


def collective(comm, test: str, size: int, opts) -> dict:
    """One collective (see ``COLL_TESTS``) on every rank; the slowest rank's
    mean time per call."""
    call, check = comm.coll_case(test, size)
    if not opts.no_check:
        check()

    def run(k):
        for _ in range(k):
            call()
    k = _plan(run, _lat_default(size, opts), LAT_MIN, opts.iters, opts.max_time,
              comm.bcast_int)
    comm.barrier()
    t0 = time.perf_counter()
    run(k)
    per = comm.max_float((time.perf_counter() - t0) / k)
    return _row(size if test != "allreduce" else max(1, size // 8) * 8, k, per)


PATTERNS = {"tag_lat": tag_lat, "tag_lat_nb": tag_lat_nb, "tag_bw": tag_bw}


# ------------------------------------------------------------------ output

def format_table(test: str, rows, meta: dict) -> str:
    head = (f"# ucxpy-perf {test}  impl={meta['impl']}  lane={meta['lane']}  "
            f"ranks={meta['ranks']}  pinned={'yes' if meta['pinned'] else 'no'}")
    if test in ("tag_bw", "put_bw", "get_bw"):
        head += f"  window={meta['window']}"
    if test in RMA_TESTS and meta.get("rma_mode"):
        head += f"  mode={meta['rma_mode'].replace(' ', '_')}"
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

#: name -> (factory, tests): the implementations ``--impl`` chooses from
DRIVERS: dict = {}


def register_driver(name: str, factory, tests) -> None:
    """Make ``--impl name`` run ``factory()`` (a comm, see "Drivers" above)
    for ``tests``, a subset of :data:`TESTS`.  A second registration of a
    name replaces the first."""
    tests = tuple(tests)
    unknown = [t for t in tests if t not in TESTS]
    if unknown:
        raise ValueError(f"driver {name!r}: unknown tests {unknown}; choose from {TESTS}")
    DRIVERS[name] = (factory, tests)


def load_drivers(spec: str) -> None:
    """Import ``spec`` for the drivers it registers: a file (``*.py`` or a
    path with a separator) or a module name."""
    if spec.endswith(".py") or os.sep in spec:
        path = os.path.abspath(spec)
        if not os.path.isfile(path):
            raise ImportError(f"no such file: {spec}")
        name = "ucxpy_perf_drivers_" + os.path.splitext(os.path.basename(path))[0]
        mspec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mspec)
        sys.modules[name] = module
        mspec.loader.exec_module(module)
    else:
        importlib.import_module(spec)


register_driver("ucxpy", UcxpyComm, TAG_TESTS + RMA_TESTS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ucxpy-perf",
                                description="ucxpy latency / bandwidth (tag, RMA, collectives)")
    p.add_argument("-t", "--test", default=",".join(TAG_TESTS),
                   help=f"comma-separated tests among {', '.join(TESTS)} "
                        "(default: tag_lat,tag_bw)")
    p.add_argument("-s", "--sizes", type=parse_sizes, default=None,
                   help="comma-separated message sizes, e.g. 8,1K,4M (default per test "
                        "family: tag 8 B..4 MiB, RMA 8 B..1 MiB, collectives 8 B..16 MiB)")
    p.add_argument("--max-size", type=lambda s: parse_sizes(s)[0], default=None,
                   help="drop default sizes above this")
    p.add_argument("-n", "--iters", type=int, default=0,
                   help="fixed timed iterations per size (default: scaled by size and time)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply the default iteration counts")
    p.add_argument("--max-time", type=float, default=1.0,
                   help="target seconds per size when iterations are not fixed")
    p.add_argument("-w", "--window", type=int, default=64,
                   help="window of the *_bw tests (default 64)")
    p.add_argument("--pin", action="store_true", help="pin each rank to its own CPU")
    p.add_argument("--json", metavar="FILE", help="rank 0 writes the results here")
    p.add_argument("--drivers", metavar="FILE_OR_MODULE", action="append", default=[],
                   help="import this Python file or module first, for the drivers it "
                        "registers (repeatable; e.g. bench/perf_drivers.py)")
    p.add_argument("--impl", default="ucxpy",
                   help="the registered driver to run (default: ucxpy)")
    p.add_argument("--no-check", action="store_true", help="skip the per-size data check")
    opts = p.parse_args(argv)
    for spec in opts.drivers:
        try:
            load_drivers(spec)
        except ImportError as e:
            p.error(f"--drivers {spec}: {e}")
    if opts.impl not in DRIVERS:
        p.error(f"unknown implementation {opts.impl!r}; registered: {', '.join(DRIVERS)} "
                "(--drivers FILE_OR_MODULE registers more, e.g. bench/perf_drivers.py)")
    factory, supported = DRIVERS[opts.impl]
    tests = [t.strip() for t in opts.test.split(",") if t.strip()]
    for t in tests:
        if t not in TESTS:
            p.error(f"unknown test {t!r}; choose from {', '.join(TESTS)}")
        if t not in supported:
            p.error(f"test {t!r} is not available with {opts.impl} "
                    f"(it runs {', '.join(supported)})")
    if opts.window < 1:
        p.error("--window must be >= 1")

    def sizes_for(test):
        if opts.sizes:
            return opts.sizes
        base = (RMA_SIZES if test in RMA_TESTS else
                ALLREDUCE_SIZES if test in COLL_TESTS else DEFAULT_SIZES)
        return [s for s in base if opts.max_size is None or s <= opts.max_size]

    comm = factory()
    if comm.size < 2:
        sys.stderr.write("ucxpy-perf: needs at least 2 ranks "
                         "(ucxpy-run -n 2 ucxpy-perf ... or mpiexec -n 2 ...)\n")
        return 2
    cpu = pin_self(comm.rank) if opts.pin else None
    results, modes, lane = {}, {}, "?"
    comm.barrier()
    for test in tests:
        if test in RMA_TESTS:
            rows = run_rma(comm, test, sizes_for(test), opts)
            modes[test] = comm.rma_mode
        elif test in COLL_TESTS:
            rows = [collective(comm, test, size, opts) for size in sizes_for(test)]
        elif comm.rank < 2:
            rows = []
            for size in sizes_for(test):
                if not opts.no_check:
                    send, recv, _, _ = comm.bind(1 - comm.rank)
                    _check(comm, send, recv, size)
                rows.append(PATTERNS[test](comm, size, opts))
        else:
            rows = []
        results[test] = rows
    if comm.rank < 2:
        lane = comm.lane(1 - comm.rank)
    comm.barrier()
    if comm.rank == 0:
        tls = getattr(comm, "tls", None)
        meta = {"impl": opts.impl, "lane": lane, "ranks": comm.size,
                "pinned": cpu is not None, "window": opts.window,
                "tls": ",".join(setting("UCXPY_TLS")) if tls is None else tls,
                "rma_modes": modes,
                "host": socket.gethostname(), "python": sys.version.split()[0],
                "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        for test in tests:
            print(format_table(test, results[test], dict(meta, rma_mode=modes.get(test))),
                  flush=True)
        if opts.json:
            # written before finalize: some OpenSHMEMs crash in shmem_finalize
            with open(opts.json, "w") as f:
                json.dump({"meta": meta, "tests": results}, f, indent=1)
    comm.finalize()
    return 0


if __name__ == "__main__":
    # run the importable module's main, so that the drivers a --drivers file
    # registers through ``ucxpy.tools.perf`` are the ones this run sees
    from ucxpy.tools import perf
    sys.exit(perf.main())

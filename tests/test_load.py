"""Load: many ranks oversubscribed on few cores, many endpoints per worker,
thousands of outstanding requests, and a bounded soak with checksummed
messages.  Every message is verified (sequence, length, crc32); the counts of
sent / received / verified messages are printed and must match exactly.

Default sizes fit CI (a few minutes for the whole file on 2 cores); longer
variants: LOAD_RANKS (default 32), LOAD_SOAK_SECONDS (default 30),
LOAD_OUTSTANDING (default 4000).
"""
from __future__ import annotations

import os
import re
import time

import pytest

from conftest import PROGS, Pair, run_job, transport_available

RANKS = int(os.environ.get("LOAD_RANKS", "32"))
SOAK = float(os.environ.get("LOAD_SOAK_SECONDS", "30"))
OUTSTANDING = int(os.environ.get("LOAD_OUTSTANDING", "4000"))
STREAM = os.path.join(PROGS, "rel_stream.py")


def totals(proc, n):
    rows = re.findall(r"STREAM (\d+) sent=(\d+) received=(\d+) verified=(\d+) bytes=(\d+)",
                      proc.stdout)
    assert proc.returncode == 0 and len(rows) == n, \
        f"exit {proc.returncode}, {len(rows)}/{n} reports\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    sent, received, verified, nbytes = (sum(int(r[i]) for r in rows) for i in (1, 2, 3, 4))
    print(f"{n} ranks: sent={sent} received={received} verified={verified} bytes={nbytes}")
    assert sent == received == verified, (sent, received, verified)
    return sent


def shm_files(proc):
    """The /dev/shm segments left by the job's ranks (each names its
    creator's pid, and each rank printed its pid): other jobs may be
    running beside this one (``make test`` runs two pytest workers)."""
    pids = set(re.findall(r"STREAM \d+ .* pid=(\d+)", proc.stdout))
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    return [f for f in names if f.startswith("ucxpy-") and len(f.split("-")) > 2
            and f.split("-")[2] in pids]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("tls", ["shm", "tcp"])
def test_many_ranks_oversubscribed(tls):
    """RANKS ranks on 2 cores, each streaming to its next 3 ranks (6 endpoints
    per worker in use, every size class incl. rendezvous); small shm rings
    keep /dev/shm use at RANKS*6*2*64 KiB."""
    if tls == "shm" and not transport_available("shm"):
        pytest.skip("shm unavailable")
    t0 = time.monotonic()
    p = run_job(["python", STREAM, "--count", "60", "--fanout", "3", "--window", "4",
                 "--max-size", "40000", "--timeout", "200"], RANKS, timeout=300,
                env={"UCXPY_TLS": tls, "UCXPY_SHM_RING_SIZE": "64K", "UCXPY_BUSY_POLL": "0"})
    n = totals(p, RANKS)
    assert n == RANKS * 3 * 60
    print(f"{tls}: {RANKS} ranks in {time.monotonic() - t0:.1f} s")
    assert not shm_files(p), "shm segments leaked"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode,expect", [("auto", 1), ("n", 0)])
def test_allreduce_loop_8_ranks_oversubscribed(mode, expect):
    """8 ranks on this machine's cores, Allreduce in a loop (recursive doubling
    and the ring), every result checked: waiting with more ranks than cores
    must neither lose a wake-up nor crawl into the timeout.  "auto" detects
    the oversubscription (a sched_yield after each progress pass); "n"
    forces plain spinning, which must still finish (busy-poll then sleep)."""
    from ucxpy.worker import usable_cpus
    if usable_cpus() >= 8:
        pytest.skip("this machine has 8 or more CPUs: 8 ranks are not oversubscribed")
    t0 = time.monotonic()
    p = run_job(["python", os.path.join(PROGS, "mpi_allreduce_loop.py")], 8, timeout=240,
                env={"UCXPY_TLS": "shm", "UCXPY_OVERSUBSCRIBED": mode, "ARLOOP_ITERS": "200"})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    rows = re.findall(r"ARLOOP (\d+) ok iters=200 oversubscribed=(\d)", p.stdout)
    assert sorted(int(r) for r, _ in rows) == list(range(8)), out[-3000:]
    assert {int(f) for _, f in rows} == {expect}, rows
    print(f"8 ranks, {mode}: 200 allreduces in {time.monotonic() - t0:.1f} s (informative)")


def test_oversubscription_decision():
    """UCXPY_OVERSUBSCRIBED: y/n force; auto compares the launcher's local
    rank count with the usable CPUs, and says no outside a job."""
    import ucxpy
    from ucxpy.config import ConfigError
    from ucxpy.worker import usable_cpus

    class Boot:
        def __init__(self, local_size):
            self.local_size = local_size

    cpus = usable_cpus()
    assert cpus >= 1
    cases = [("y", None, True), ("n", Boot(cpus + 5), False), ("auto", None, False),
             ("auto", Boot(cpus), False), ("auto", Boot(cpus + 1), True), ("", Boot(cpus + 1), True)]
    for mode, boot, want in cases:
        ctx = ucxpy.Context(ucxpy.Config.from_env({"UCXPY_OVERSUBSCRIBED": mode}, tls="self"))
        w = ctx.create_worker()
        try:
            w.bootstrap = boot
            assert w.oversubscribed() is want, (mode, boot and boot.local_size)
        finally:
            w.close()
    with pytest.raises(ConfigError):
        ucxpy.Config.from_env({"UCXPY_OVERSUBSCRIBED": "sometimes"})


@pytest.mark.timeout(300)
def test_soak_checksummed():
    """SOAK seconds of mixed-size traffic (eager short/copy, rendezvous)
    among 4 ranks, each streaming to the 3 others with 16 sends and 16
    receives outstanding per peer: nothing lost, duplicated, reordered or
    corrupted."""
    p = run_job(["python", STREAM, "--count", "100000000", "--seconds", str(SOAK),
                 "--fanout", "3", "--window", "16", "--timeout", "60"], 4,
                timeout=int(SOAK) + 120, env={"UCXPY_TLS": "shm,tcp"})
    assert totals(p, 4) > 0


def _drive(workers, cond, timeout):
    deadline = time.monotonic() + timeout
    while not cond():
        for w in workers:
            w.progress()
        assert time.monotonic() < deadline, "not all requests completed"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tls", ["tcp", "shm"])
def test_thousands_outstanding_many_endpoints(tls):
    """8 workers in one process, each with endpoints to all others (56
    connections); OUTSTANDING receives posted before OUTSTANDING sends of
    mixed sizes, all outstanding at once; every one verified."""
    if tls == "shm" and not transport_available("shm"):
        pytest.skip("shm unavailable")
    import numpy as np
    pair = Pair(tls, n=8, shm_ring_size=1 << 16)
    try:
        ws, eps = pair.workers, pair.eps
        per = OUTSTANDING // (8 * 7)
        sizes = [0, 8, 300, 5000, 20000]
        recvs, sends = [], []
        for i, w in enumerate(ws):
            for j in range(8):
                if j == i:
                    continue
                for k in range(per):
                    n = sizes[k % len(sizes)]
                    buf = np.empty(n, np.uint8)
                    recvs.append((buf, i, j, k, w.tag_recv_nb(buf, tag=k, source=j)))
        for j, w in enumerate(ws):
            for i in range(8):
                if i == j:
                    continue
                for k in range(per):
                    n = sizes[k % len(sizes)]
                    data = np.full(n, (i * 31 + j * 7 + k) % 251, np.uint8)
                    sends.append((data, eps[j][i].tag_send_nb(data, k)))
        outstanding = sum(not r[-1].done for r in recvs) + sum(not s[1].done for s in sends)
        print(f"{tls}: {len(recvs)} receives + {len(sends)} sends posted, "
              f"{outstanding} outstanding at once")
        assert outstanding >= len(recvs) // 2
        _drive(ws, lambda: all(r[-1].done for r in recvs) and all(s[1].done for s in sends), 120)
        for buf, i, j, k, r in recvs:
            info = r.wait(0)
            assert info.source == j and info.length == buf.nbytes
            assert (buf == (i * 31 + j * 7 + k) % 251).all(), (i, j, k)
        for _data, s in sends:
            s.wait(0)
    finally:
        pair.close()

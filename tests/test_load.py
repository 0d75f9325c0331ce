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


def shm_files():
    try:
        return len([f for f in os.listdir("/dev/shm") if f.startswith("ucxpy-")])
    except OSError:
        return 0


@pytest.mark.timeout(400)
@pytest.mark.parametrize("tls", ["shm", "tcp"])
def test_many_ranks_oversubscribed(tls):
    """RANKS ranks on 2 cores, each streaming to its next 3 ranks (6 endpoints
    per worker in use, every size class incl. rendezvous); small shm rings
    keep /dev/shm use at RANKS*6*2*64 KiB."""
    if tls == "shm" and not transport_available("shm"):
        pytest.skip("shm unavailable")
    before = shm_files()
    t0 = time.monotonic()
    p = run_job(["python", STREAM, "--count", "60", "--fanout", "3", "--window", "4",
                 "--max-size", "40000", "--timeout", "200"], RANKS, timeout=300,
                env={"UCXPY_TLS": tls, "UCXPY_SHM_RING_SIZE": "64K", "UCXPY_BUSY_POLL": "0"})
    n = totals(p, RANKS)
    assert n == RANKS * 3 * 60
    print(f"{tls}: {RANKS} ranks in {time.monotonic() - t0:.1f} s")
    assert shm_files() <= before, "shm segments leaked"


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

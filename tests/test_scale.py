"""Big jobs on one host (issue 31): many more ranks than cores run an
all-to-all (Isend/Irecv to every peer, then Alltoall), Allreduce and a
shmem put/get ring, every byte checked (tests/progs/scale_job.py).

``make test`` runs 32 ranks; the 128-rank job is marked ``scale`` and runs
under ``make test-scale`` (``pytest --scale``)."""
from __future__ import annotations

import os
import sys
import time

import pytest

from conftest import PROGS, run_job

PROG = os.path.join(PROGS, "scale_job.py")


def check(p, n, took):
    lines = [("SCALE OK" + chunk).split("\n")[0].split() for chunk in
             p.stdout.split("SCALE OK")[1:]]
    assert p.returncode == 0 and sorted(int(f[2]) for f in lines) == list(range(n)), \
        f"exit {p.returncode} after {took:.0f} s, {len(lines)}/{n} ranks OK\n--- stdout\n" \
        f"{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}"
    for f in lines:
        assert f[3] == str(n) and f[4] == f"lanes=shm:{n - 1}", f


def run(n, timeout):
    t0 = time.monotonic()
    p = run_job([sys.executable, PROG], n, timeout=timeout)
    check(p, n, time.monotonic() - t0)


@pytest.mark.timeout(300)
def test_32_ranks_on_one_host():
    run(32, 240)


@pytest.mark.scale
@pytest.mark.timeout(900)
def test_128_ranks_on_one_host():
    run(128, 840)

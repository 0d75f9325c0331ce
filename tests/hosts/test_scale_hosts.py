"""Big jobs across namespace hosts (issue 31): 4 ranks per host, shm within
a host and tcp between hosts, running an all-to-all (Isend/Irecv to every
peer, then Alltoall), Allreduce and a shmem put/get ring, every byte checked
(tests/progs/scale_job.py).

``make test`` runs 16 ranks over 4 hosts; 64 ranks over 16 hosts is marked
``scale`` and runs under ``make test-scale`` (``pytest --scale``)."""
from __future__ import annotations

import time

import pytest

PER_HOST = 4


def run(make_cluster, hosts, timeout):
    c = make_cluster(hosts)
    n = hosts * PER_HOST
    t0 = time.monotonic()
    p = c.run_job("scale_job.py", per_host=PER_HOST, timeout=timeout)
    took = time.monotonic() - t0
    lines = [("SCALE OK" + chunk).split("\n")[0].split() for chunk in
             p.stdout.split("SCALE OK")[1:]]
    assert p.returncode == 0 and sorted(int(f[2]) for f in lines) == list(range(n)), \
        f"exit {p.returncode} after {took:.0f} s, {len(lines)}/{n} ranks OK\n--- stdout\n" \
        f"{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}"
    for f in lines:
        # the ranks of one host talk over shm, everyone else over tcp
        assert f[3] == str(n) and f[4] == f"lanes=shm:{PER_HOST - 1},tcp:{n - PER_HOST}", f


@pytest.mark.timeout(300)
def test_16_ranks_over_4_hosts(make_cluster):
    run(make_cluster, 4, 240)


@pytest.mark.scale
@pytest.mark.timeout(900)
def test_64_ranks_over_16_hosts(make_cluster):
    run(make_cluster, 16, 840)

"""Same-host small operations take the MAPPED path (a memmove / native atomic,
no target progress): each operation is labelled with the mode it actually
used, from the RMA counters of worker.stats() (an operation that went
through an AM-mode or CMA key is labelled so, not "mapped").  Latencies are printed (-s) for information only:
performance figures come from ``make bench``, never from timed assertions."""
from __future__ import annotations

import re

import pytest

from conftest import PROGS, run_job

pytestmark = pytest.mark.timeout(180)

OPS = ("put8+quiet", "get8", "atomic_fetch_add")


def test_small_ops_use_the_mapped_path():
    r = run_job(["python", f"{PROGS}/shmem_perf.py"], 2, timeout=150,
                env={"UCXPY_STATS": "y"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    found = dict(re.findall(r"SHMEM-PERF (\S+) ([0-9.]+) \(mapped\)", r.stdout))
    print(r.stdout)
    assert set(OPS) <= set(found), r.stdout


def test_small_ops_report_am_mode_without_shm():
    """The labels follow what ran: without shm every operation goes by AM
    (200 operations per run: the labels are checked, not the times)."""
    r = run_job(["python", f"{PROGS}/shmem_perf.py"], 2, timeout=150,
                env={"UCXPY_STATS": "y", "UCXPY_TLS": "self,tcp", "SHMEM_PERF_ITERS": "200"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    found = dict(re.findall(r"SHMEM-PERF (\S+) [0-9.]+ \((\S+)\)", r.stdout))
    assert {op: found.get(op) for op in OPS} == {op: "am" for op in OPS}, r.stdout

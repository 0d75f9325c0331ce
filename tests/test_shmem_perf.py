"""Same-host small operations take the MAPPED path (a memmove / native atomic,
no target progress).  Latencies are printed (-s) for information only:
performance figures come from ``make bench``, never from timed assertions."""
from __future__ import annotations

import re

import pytest

from conftest import PROGS, run_job

pytestmark = pytest.mark.timeout(180)

OPS = ("put8+quiet", "get8", "atomic_fetch_add")


def test_small_ops_use_the_mapped_path():
    r = run_job(["python", f"{PROGS}/shmem_perf.py"], 2, timeout=150)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    found = dict(re.findall(r"SHMEM-PERF (\S+) ([0-9.]+) \(mapped\)", r.stdout))
    print(r.stdout)
    assert set(OPS) <= set(found), r.stdout

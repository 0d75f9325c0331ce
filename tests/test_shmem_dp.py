"""shmem on the native data plane against its Python reference: the same
calls (tests/progs/shmem_dp.py: put, get, quiet and every integer atomic,
plain and the cases the data plane leaves to Python) give the same outcomes
on every PE with UCXPY_FASTPATH=y and =n, and only the first ran them in
the data plane (its counters)."""
from __future__ import annotations

import re

import pytest

from conftest import PROGS, run_job

pytestmark = pytest.mark.timeout(240)


def _outcomes(fastpath: str) -> dict:
    r = run_job(["python", f"{PROGS}/shmem_dp.py"], 3, timeout=150,
                env={"UCXPY_FASTPATH": fastpath})
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    rows = re.findall(r"SHMEM-DP (\d+) digest=(\w+) calls=(\d+) put=(\d+) get=(\d+) "
                      r"atomic=(\d+)", r.stdout)
    assert len(rows) == 3, r.stdout[-3000:]
    return {int(pe): (digest, int(calls), (int(p), int(g), int(a)))
            for pe, digest, calls, p, g, a in rows}


def test_data_plane_and_python_reference_agree():
    native, python = _outcomes("y"), _outcomes("n")
    for pe in range(3):
        assert native[pe][:2] == python[pe][:2], pe          # every outcome alike
        assert native[pe][1] > 900
        assert all(native[pe][2]), native[pe]                # the data plane ran them
        assert python[pe][2] == (0, 0, 0), python[pe]        # and only with y

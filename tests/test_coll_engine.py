"""ucxpy.coll, the collective engine under mpi_shim, shmem and the torch
backend: every algorithm against numpy in real jobs of 1-5 ranks
(tests/progs/coll_engine.py), with the fast path on and off."""
import os

import pytest

from conftest import run_job

PROG = ["python", os.path.join(os.path.dirname(__file__), "progs", "coll_engine.py")]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_every_collective_against_numpy(n):
    proc = run_job(PROG, n, timeout=150)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count("COLL OK") == n, out[-3000:]


@pytest.mark.timeout(200)
def test_pure_python_path():
    proc = run_job(PROG, 3, timeout=150, env={"UCXPY_FASTPATH": "n", "UCXPY_TLS": "tcp"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and out.count("COLL OK") == 3, out[-3000:]

"""MPI-IO (``MPI.File``) as real multi-process jobs.

tests/progs/mpi_io.py checks non-contiguous views written by several ranks
byte for byte, shared and ordered pointers, data representations, atomic
mode, access modes and error cases; examples/spawn_io.py has spawned
workers write one file through a vector view that their parent checks.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil

import pytest

from conftest import PROGS, ROOT, run_job, transport_available

pytestmark = pytest.mark.timeout(400)

HAVE_MPIEXEC = shutil.which("mpiexec") is not None
JOBS = [("ucxpy-run", 1, "self,shm,tcp"), ("ucxpy-run", 2, "shm"), ("ucxpy-run", 3, "tcp"),
        ("ucxpy-run", 4, "shm,tcp"), ("mpiexec", 2, "shm,tcp")]


def _skip_unless(launcher, tls):
    if launcher == "mpiexec":
        if importlib.util.find_spec("mpi4py") is None:
            pytest.skip("mpi4py not installed (pip install mpi4py mpich)")
        if not HAVE_MPIEXEC:
            pytest.skip("mpiexec not installed")
    for t in tls.split(","):
        if not transport_available(t):
            pytest.skip(f"transport {t} unavailable")


@pytest.mark.parametrize("launcher,n,tls", JOBS, ids=[f"{l}-{n}-{t}" for l, n, t in JOBS])
def test_mpi_io(launcher, n, tls):
    _skip_unless(launcher, tls)
    env = {"UCXPY_TLS": tls}
    if n == 4:
        env["MPI_IO_BIG"] = "1"            # the 64 MiB collective write and its memory check
    proc = run_job(["python", os.path.join(PROGS, "mpi_io.py")], n, timeout=300, env=env,
                   launcher=launcher)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert len(re.findall(r"MPI-IO OK \d+ ok", proc.stdout)) == n, out[-4000:]


@pytest.mark.parametrize("launcher", ["ucxpy-run", "mpiexec"])
def test_spawn_io_example(launcher):
    """A one-process job spawns 3 workers writing interleaved blocks; the parent
    checks every byte (mpiexec: the workers are started by Hydra, over PMI)."""
    _skip_unless(launcher, "shm,tcp")
    proc = run_job(["python", os.path.join(ROOT, "examples", "spawn_io.py")], 1, timeout=200,
                   launcher=launcher)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "SPAWN-IO OK 768000" in proc.stdout, out[-4000:]

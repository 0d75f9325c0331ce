"""MPI spawn (``Comm.Spawn_multiple``) through the launcher that runs the job:
ucxpy-run grows its own job, MPICH's mpiexec (Hydra) starts the children
through PMI-1 ``spawn``; Open MPI's mpirun (the mpi4py bootstrap) cannot,
and Spawn raises ERR_SPAWN at the call.  tests/progs/mpi_spawn.py checks
errcodes, APPNUM, the info's ``wdir`` and ``env`` and data both ways."""
from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

from conftest import PROGS, have_openmpi, run_job

pytestmark = pytest.mark.timeout(300)
PROG = os.path.join(PROGS, "mpi_spawn.py")
JOBS = [("ucxpy-run", 1), ("ucxpy-run", 2), ("mpiexec", 1), ("mpiexec", 2)]


def _need_mpiexec():
    if importlib.util.find_spec("mpi4py") is None or shutil.which("mpiexec") is None:
        pytest.skip("mpiexec not installed (pip install mpi4py mpich)")


@pytest.mark.parametrize("launcher,n", JOBS, ids=[f"{l}-{n}" for l, n in JOBS])
def test_spawn_multiple(launcher, n):
    if launcher == "mpiexec":
        _need_mpiexec()
    proc = run_job(["python", PROG], n, timeout=150, launcher=launcher)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert proc.stdout.count("SPAWN OK") == n, out[-4000:]
    assert proc.stdout.count("CHILD OK 0") == 1 and proc.stdout.count("CHILD OK 1") == 2, \
        out[-4000:]


def test_spawn_refused_under_openmpi():
    """The mpi4py bootstrap (Open MPI) cannot start processes: ERR_SPAWN, no hang."""
    if not have_openmpi() or importlib.util.find_spec("mpi4py") is None:
        pytest.skip("Debian's Open MPI not installed")
    proc = run_job(["python", PROG], 2, timeout=120, launcher="openmpi",
                   env={"SPAWN_EXPECT_ERROR": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert proc.stdout.count("SPAWN REFUSED") == 2, out[-4000:]
    assert "cannot start new processes" in proc.stdout, out[-4000:]

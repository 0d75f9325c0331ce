"""mpi_shim spec suites as real multi-process jobs, under both launchers.

Each program in tests/progs/mpi_*.py checks one area (point-to-point,
collectives, RMA) and prints '<MARKER> <rank> ok' per rank on success.
"""
from __future__ import annotations

import os
import re
import shutil

import pytest

from conftest import PROGS, run_job, transport_available

pytestmark = pytest.mark.timeout(400)

HAVE_MPIEXEC = shutil.which("mpiexec") is not None


def _mpi4py_ok():
    try:
        import mpi4py  # noqa: F401
        return True
    except ImportError:
        return False


def _skip_unless(launcher, tls):
    if launcher == "mpiexec" and not (HAVE_MPIEXEC and _mpi4py_ok()):
        pytest.skip("mpiexec or mpi4py not installed (pip install mpi4py mpich)")
    for t in tls.split(","):
        if not transport_available(t):
            pytest.skip(f"transport {t} unavailable")


def check(proc, n, marker):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert len(re.findall(re.escape(marker) + r" \d+ ok", proc.stdout)) == n, out[-4000:]


PROGRAMS = [("mpi_p2p.py", "MPI-P2P OK"), ("mpi_coll.py", "MPI-COLL OK"),
            ("mpi_rma.py", "MPI-RMA OK")]
JOBS = [("ucxpy-run", 1, "self,shm,tcp"), ("ucxpy-run", 2, "shm"), ("ucxpy-run", 3, "tcp"),
        ("ucxpy-run", 4, "shm,tcp"), ("mpiexec", 2, "shm,tcp"), ("mpiexec", 3, "tcp")]


@pytest.mark.parametrize("prog,marker", PROGRAMS, ids=[p for p, _ in PROGRAMS])
@pytest.mark.parametrize("launcher,n,tls", JOBS, ids=[f"{l}-{n}-{t}" for l, n, t in JOBS])
def test_mpi_spec(prog, marker, launcher, n, tls):
    _skip_unless(launcher, tls)
    proc = run_job(["python", os.path.join(PROGS, prog)], n, timeout=300,
                   env={"UCXPY_TLS": tls}, launcher=launcher)
    check(proc, n, marker)


def test_mpi_p2p_forced_rendezvous():
    """Every message through the rendezvous protocol (ssend acks, probes,
    matched probes and truncation on that path)."""
    _skip_unless("ucxpy-run", "shm")
    proc = run_job(["python", os.path.join(PROGS, "mpi_p2p.py")], 2, timeout=300,
                   env={"UCXPY_TLS": "shm", "UCXPY_RNDV_THRESH": "0", "MPI_P2P_BIG": "65536"})
    check(proc, 2, "MPI-P2P OK")


def test_mpi_smoke_single_process():
    """A plain `python prog.py` (no launcher) is a one-rank job."""
    import subprocess
    import sys
    from conftest import ROOT
    env = dict(os.environ, PYTHONPATH=ROOT)
    for k in [k for k in env if k.startswith(("UCXPY_RUN", "PMI_", "OMPI_", "HYDRA"))]:
        del env[k]
    proc = subprocess.run([sys.executable, os.path.join(PROGS, "mpi_smoke.py")], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MPI-SMOKE OK 0" in proc.stdout

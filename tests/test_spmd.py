"""Real multi-process jobs: both launchers, every transport, data verified."""
from __future__ import annotations

import os
import re
import shutil

import pytest

from conftest import PROGS, have_openmpi, run_job, transport_available

pytestmark = pytest.mark.timeout(400)

HAVE_MPIEXEC = shutil.which("mpiexec") is not None


def _mpi4py_ok():
    try:
        import mpi4py  # noqa: F401
        return True
    except ImportError:
        return False


def check(proc, n, marker):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # ranks share the launcher's stdout, so lines of two ranks may interleave
    oks = re.findall(re.escape(marker) + r" \d+ [a-z]+", proc.stdout)
    assert len(oks) == n, out[-4000:]
    return oks


JOBS = [("ucxpy-run", 2, "shm"), ("ucxpy-run", 2, "tcp"), ("ucxpy-run", 4, "shm,tcp"),
        ("ucxpy-run", 3, "tcp"), ("mpiexec", 2, "shm,tcp"), ("mpiexec", 2, "tcp"),
        ("openmpi", 2, "shm,tcp"), ("openmpi", 3, "tcp")]


def _skip_unless(launcher, tls):
    if launcher == "mpiexec" and not (HAVE_MPIEXEC and _mpi4py_ok()):
        pytest.skip("mpiexec or mpi4py not installed (pip install mpi4py mpich)")
    if launcher == "openmpi" and not (have_openmpi() and _mpi4py_ok()):
        pytest.skip("Debian Open MPI not installed (apt-get install openmpi-bin libopenmpi-dev)")
    for t in tls.split(","):
        if not transport_available(t):
            pytest.skip(f"transport {t} unavailable")


@pytest.mark.parametrize("launcher,n,tls", JOBS)
def test_tag_suite(launcher, n, tls):
    _skip_unless(launcher, tls)
    env = {"UCXPY_TLS": tls}
    if n > 2:
        env["TAG_SUITE_MAX"] = str((1 << 22) + 3)     # 64 MiB runs with 2 ranks
    proc = run_job(["python", os.path.join(PROGS, "tag_suite.py")], n, timeout=300,
                   env=env, launcher=launcher)
    oks = check(proc, n, "TAG-SUITE OK")
    if tls in ("shm", "tcp"):
        assert all(l.endswith(tls) for l in oks), oks


@pytest.mark.parametrize("rndv", ["0", "1024", "auto"])
def test_tag_suite_forced_protocols(rndv):
    """Force every message through rendezvous, or a low threshold, on shm."""
    _skip_unless("ucxpy-run", "shm")
    env = {"UCXPY_RNDV_THRESH": rndv, "TAG_SUITE_MAX": str(1 << 20), "UCXPY_TLS": "shm"}
    check(run_job(["python", os.path.join(PROGS, "tag_suite.py")], 2, timeout=200, env=env),
          2, "TAG-SUITE OK")


def test_tag_suite_shm_without_cma():
    """Large messages pipeline through the ring when single-copy is disabled."""
    _skip_unless("ucxpy-run", "shm")
    env = {"UCXPY_SHM_CMA": "n", "UCXPY_TLS": "shm", "TAG_SUITE_MAX": str((1 << 22) + 3)}
    check(run_job(["python", os.path.join(PROGS, "tag_suite.py")], 2, timeout=200, env=env),
          2, "TAG-SUITE OK")


RMA_JOBS = [("ucxpy-run", 3, "shm", "shared", "mapped"), ("ucxpy-run", 3, "shm", "user", "cma"),
            ("ucxpy-run", 3, "tcp", "shared", "am"), ("ucxpy-run", 4, "tcp", "user", "am"),
            ("mpiexec", 2, "shm,tcp", "shared", "mapped"),
            ("openmpi", 2, "shm,tcp", "user", "cma")]


@pytest.mark.parametrize("launcher,n,tls,region,mode", RMA_JOBS)
def test_rma_suite(launcher, n, tls, region, mode):
    _skip_unless(launcher, tls)
    env = {"UCXPY_TLS": tls, "RMA_REGION": region}
    proc = run_job(["python", os.path.join(PROGS, "rma_suite.py")], n, timeout=300,
                   env=env, launcher=launcher)
    oks = check(proc, n, "RMA-SUITE OK")
    assert all(l.endswith(mode) for l in oks), oks


def test_pingpong_example():
    proc = run_job(["python", os.path.join(os.path.dirname(PROGS), "..", "examples",
                                           "pingpong.py")], 4, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pingpong: 4 ranks OK" in proc.stdout


@pytest.mark.parametrize("tls", ["shm", "tcp"])
@pytest.mark.parametrize("mode", ["midway", "early"])
def test_dead_peer_is_reported(tls, mode):
    """A rank killed while another waits on it: the waiter gets ConnectionLost
    (PeerFailure) naming rank 1 within seconds; the launcher exits non-zero."""
    _skip_unless("ucxpy-run", tls)
    proc = run_job(["python", os.path.join(PROGS, "dead_peer.py"), mode], 2, timeout=60,
                   env={"UCXPY_TLS": tls})
    assert proc.returncode != 0
    m = re.search(r"DETECTED (\w+) peer=(\d+) after ([\d.]+)s", proc.stdout)
    assert m, proc.stdout + proc.stderr
    assert m.group(2) == "1" and float(m.group(3)) < 10
    assert "rank 1 exited" in proc.stderr

"""OpenSHMEM spec conformance of ``shmem``: one test per spec section, each a
real multi-process job (tests/progs/shmem_spec.py), under both launchers and
in both access modes (MAPPED over shm; AM over tcp, where targets progress)."""
from __future__ import annotations

import shutil

import pytest

from conftest import PROGS, run_job

pytestmark = pytest.mark.timeout(240)

SECTIONS = ["setup", "heap", "rma", "amo", "signal", "coll", "team", "ctx",
            "ordering", "p2p", "barrier", "lock", "errors"]
PROG = f"{PROGS}/shmem_spec.py"


def _check(r, section, n):
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    # ranks' lines may interleave: count occurrences, not lines
    assert r.stdout.count(f"SHMEM-SPEC OK {section} ") == n, out[-4000:]


@pytest.mark.parametrize("section", SECTIONS)
def test_spec_ucxpy_run(section):
    """3 PEs (not a power of two: exercises the collective fold-in paths)."""
    r = run_job(["python", PROG, section], 3, timeout=180, env={"EXPECT_NPES": "3"})
    _check(r, section, 3)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not installed")
@pytest.mark.parametrize("section", SECTIONS)
def test_spec_mpiexec(section):
    r = run_job(["python", PROG, section], 2, timeout=180, launcher="mpiexec",
                env={"EXPECT_NPES": "2"})
    _check(r, section, 2)


@pytest.mark.parametrize("section", SECTIONS)
def test_spec_am_mode(section):
    """No shm transport: every peer in AM mode (as PEs on other hosts are)."""
    r = run_job(["python", PROG, section], 2, timeout=180,
                env={"UCXPY_TLS": "self,tcp", "EXPECT_NPES": "2"})
    _check(r, section, 2)


def test_spec_all_sections_four_pes():
    r = run_job(["python", PROG] + SECTIONS, 4, timeout=200)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert r.stdout.count("SHMEM-SPEC OK") == 4 * len(SECTIONS), out[-4000:]

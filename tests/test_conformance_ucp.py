"""mpi4py's test suite on the real mpi4py wheel over ucxpy's ``libucp.so.0``,
in CI, with two MPI libraries (the released sdist's files are downloaded at
test time, never committed; a failed download skips):

* ``ucp``: MPICH (ch4:ucx, the mpich wheel), every file at 2 ranks under
  ``mpiexec``, held to ``conformance/mpi/baseline-ucp-np2.json``;
  ``make conformance-mpi4py-ucp`` runs the 1-4 rank matrix beside MPICH on
  the bundled real UCX;
* ``ompi-ucp``: Open MPI (the system's ``libmpi.so.40``, its UCX components:
  pml, osc), a fixed subset of the files at 2 ranks under Open MPI's
  ``/usr/bin/mpirun``, held to ``conformance/mpi/baseline-ompi-np2.json``;
  ``python conformance/mpi/run.py --impl ompi-ucp,ompi-ref --np 2`` runs every
  file beside Open MPI on the system UCX.

Both run in ``ucxpy-ucx``'s environment with every rank's
``UCXPY_UCP_REPORT`` report checked: any file doing worse than its baseline
fails, and so do ranks that ran on another UCX (the proof check)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import NamedTuple, Optional

import pytest

from conftest import ROOT, shared_cpus

from ucxpy.tools.ucx import LIBUCP
BIN = os.path.dirname(sys.executable)
OMPI_LIBMPI = "/usr/lib/x86_64-linux-gnu/libmpi.so.40"
OMPI_MPIRUN = "/usr/bin/mpirun"


class Setup(NamedTuple):
    impl: str
    baseline: str
    files: Optional[tuple]       # None: the whole suite
    per_file: int                # seconds per file (run.py's --timeout)
    timeout: int                 # seconds for the whole run
    missing: str                 # why it cannot run here ('' when it can)


def _baseline(name):
    return os.path.join(ROOT, "conformance", "mpi", name)


def _mpich_missing():
    path = BIN + os.pathsep + os.environ.get("PATH", "")
    return "" if shutil.which("mpiexec", path=path) else "no mpiexec (the mpich wheel)"


def _ompi_missing():
    return next((f"no Open MPI ({p})" for p in (OMPI_LIBMPI, OMPI_MPIRUN)
                 if not os.path.exists(p)), "")


SETUPS = [
    # per file, the slowest takes ~20 s at 2 ranks on MPICH, ~10 s on Open
    # MPI; the margins are for a loaded machine
    Setup("ucp", _baseline("baseline-ucp-np2.json"), None, 240, 1100, _mpich_missing()),
    Setup("ompi-ucp", _baseline("baseline-ompi-np2.json"), (
        "test_p2p_buf", "test_p2p_obj",                     # point-to-point
        "test_cco_buf", "test_cco_nb_vec", "test_cco_obj",  # collectives
        "test_rma", "test_win",                             # RMA, windows
        "test_datatype", "test_pack",                       # datatypes
        "test_comm", "test_comm_topo",                      # communicators, topologies
    ), 120, 500, _ompi_missing()),
]

pytestmark = [
    pytest.mark.timeout(1200),
    pytest.mark.skipif(not os.path.exists(LIBUCP), reason="ucxpy's libucp.so.0 is not built"),
]


@pytest.fixture(params=SETUPS, ids=["mpich", "openmpi"])
def setup(request):
    if request.param.missing:
        pytest.skip(request.param.missing)
    pytest.importorskip("mpi4py")
    return request.param


def _run(setup, *args, timeout=None, env=None):
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    if os.geteuid() == 0:       # Open MPI's launcher refuses root without both
        e.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        e.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    e.update(env or {})
    timeout = timeout or setup.timeout
    try:
        p = subprocess.run([sys.executable, os.path.join(ROOT, "conformance", "mpi", "run.py"),
                            "--impl", setup.impl, "--np", "2", *args], capture_output=True,
                           text=True, timeout=timeout, cwd=ROOT, env=e, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) \
            else exc.stdout or ""
        pytest.fail(f"the run did not finish in {timeout} s:\n{out[-3000:]}")
    out = p.stdout + p.stderr
    print(out)
    if p.returncode and "could not download" in out:
        pytest.skip("conformance suite could not be downloaded from PyPI")
    return p.returncode, out


def test_mpi4py_wheel_on_libucp_against_the_baseline(setup, tmp_path, request):
    """The files at 2 ranks on the MPI library over ucxpy's libucp: no file
    does worse than the baseline, and a job any of whose ranks did not run on
    ucxpy's libucp counts all its tests as errors."""
    out_json = tmp_path / "results.json"
    # beside another pytest worker, MPICH's and Open MPI's ranks spin in
    # their progress loops on CPUs another job needs: libucp yields the
    # CPU after a run of idle progress calls, as on an oversubscribed host
    env = {"UCXPY_OVERSUBSCRIBED": "y"} if shared_cpus(request.config) else None
    rc, out = _run(setup, "--timeout", str(setup.per_file), "-v", "--baseline", setup.baseline,
                   "--json", str(out_json), *(setup.files or ()), env=env)
    assert "REGRESSION" not in out and rc == 0, out[-4000:]
    with open(out_json) as f:
        results = json.load(f)[setup.impl]
    with open(setup.baseline) as f:
        baseline = json.load(f)[setup.impl]
    if setup.files is None:
        assert set(results) == set(baseline), "the suite's file list changed: refresh the baseline"
        return
    assert set(results) == {f"{m}@2" for m in setup.files}, sorted(results)
    assert set(results) <= set(baseline), "a subset file is not in the baseline"
    for key, r in results.items():
        assert r["proof"] == [], (key, r["proof"])
        assert r["counts"]["pass"] > 0, (key, r)


def test_the_proof_check_catches_ranks_on_the_real_ucx(setup, tmp_path):
    """Ranks that run the file on the real UCX (the mpich wheel's bundled one,
    the system's for Open MPI: each re-executes itself without ucxpy's lib
    directory, so everything passes but no report) must count as errors: a
    regression of test_address."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\n"
        "lib = os.path.join(os.environ.get('FALLBACK_ROOT', '/'), 'ucxpy', 'lib')\n"
        "paths = os.environ.get('LD_LIBRARY_PATH', '').split(':')\n"
        "if os.environ.get('UCXPY_UCP_REPORT') and lib in paths:\n"
        "    os.environ['LD_LIBRARY_PATH'] = ':'.join(p for p in paths if p != lib)\n"
        "    argv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')[:-1]\n"
        "    os.execv(sys.executable, [sys.executable] + [a.decode() for a in argv[1:]])\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT]), "FALLBACK_ROOT": ROOT}
    rc, out = _run(setup, "--timeout", "120", "-v", "--baseline", setup.baseline,
                   "test_address", env=env, timeout=300)
    assert rc != 0 and f"REGRESSION test_address@2 ({setup.impl})" in out, out[-3000:]
    assert "PROOF" in out and "0 of 2 ranks reported" in out, out[-3000:]

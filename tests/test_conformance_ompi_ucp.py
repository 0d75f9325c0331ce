"""mpi4py's test suite on the real mpi4py wheel and Open MPI (the system's
``libmpi.so.40``, its UCX components: pml, osc) over ucxpy's ``libucp.so.0``,
in CI: a fixed subset of the released sdist's files (downloaded at test time,
never committed; point-to-point, collectives, RMA, datatypes, communicators)
at 2 ranks under Open MPI's ``/usr/bin/mpirun`` in ``ucxpy-ucx``'s
environment, every rank's ``UCXPY_UCP_REPORT`` report checked, held to the
committed per-file baseline ``conformance/mpi/baseline-ompi-np2.json``: any
file doing worse fails.  ``python conformance/mpi/run.py --impl
ompi-ucp,ompi-ref --np 2`` runs every file beside Open MPI on the system UCX.
Skips without Open MPI or ucxpy's libucp; a failed download skips."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

LIBUCP = os.path.join(ROOT, "ucxpy", "lib", "libucp.so.0")
OMPI_LIBMPI = "/usr/lib/x86_64-linux-gnu/libmpi.so.40"
OMPI_MPIRUN = "/usr/bin/mpirun"
BASELINE = os.path.join(ROOT, "conformance", "mpi", "baseline-ompi-np2.json")

#: the CI subset, about 45 s at 2 ranks here (run.py's "seconds" per file)
SUBSET = (
    "test_p2p_buf", "test_p2p_obj",                     # point-to-point
    "test_cco_buf", "test_cco_nb_vec", "test_cco_obj",  # collectives
    "test_rma", "test_win",                             # RMA, windows
    "test_datatype", "test_pack",                       # datatypes
    "test_comm", "test_comm_topo",                      # communicators, topologies
)

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(not os.path.exists(LIBUCP), reason="ucxpy's libucp.so.0 is not built"),
    pytest.mark.skipif(not os.path.exists(OMPI_LIBMPI), reason=f"no Open MPI ({OMPI_LIBMPI})"),
    pytest.mark.skipif(not os.path.exists(OMPI_MPIRUN), reason=f"no Open MPI ({OMPI_MPIRUN})"),
]


def _run(*args, timeout=500, env=None):
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    if os.geteuid() == 0:       # Open MPI's launcher refuses root without both
        e.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        e.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    e.update(env or {})
    try:
        p = subprocess.run([sys.executable, os.path.join(ROOT, "conformance", "mpi", "run.py"),
                            *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                           env=e, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) \
            else exc.stdout or ""
        pytest.fail(f"the subset did not finish in {timeout} s:\n{out[-3000:]}")
    out = p.stdout + p.stderr
    print(out)
    if p.returncode and "could not download" in out:
        pytest.skip("conformance suite could not be downloaded from PyPI")
    return p.returncode, out


def test_mpi4py_wheel_on_openmpi_over_libucp_subset_against_the_baseline(tmp_path):
    """The subset at 2 ranks on Open MPI over ucxpy's libucp: no file does
    worse than the baseline, and a job any of whose ranks did not run on
    ucxpy's libucp counts all its tests as errors."""
    pytest.importorskip("mpi4py")
    out_json = tmp_path / "results.json"
    # per file: the slowest takes ~10 s at 2 ranks; the margin is for a loaded machine
    rc, out = _run("--impl", "ompi-ucp", "--np", "2", "--timeout", "120", "-v",
                   "--baseline", BASELINE, "--json", str(out_json), *SUBSET)
    assert "REGRESSION" not in out and rc == 0, out[-4000:]
    with open(out_json) as f:
        results = json.load(f)["ompi-ucp"]
    assert set(results) == {f"{m}@2" for m in SUBSET}, sorted(results)
    for key, r in results.items():
        assert r["proof"] == [], (key, r["proof"])
        assert r["counts"]["pass"] > 0, (key, r)
    with open(BASELINE) as f:
        baseline = json.load(f)["ompi-ucp"]
    assert set(results) <= set(baseline), "a subset file is not in the baseline"


def test_the_proof_check_catches_openmpi_ranks_on_the_system_ucx(tmp_path):
    """Ranks that run the file on the system UCX (each re-executes itself
    without ucxpy's lib directory: everything passes, but no report) must
    count as errors: a regression of test_address."""
    pytest.importorskip("mpi4py")
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\n"
        "lib = os.path.join(os.environ.get('FALLBACK_ROOT', '/'), 'ucxpy', 'lib')\n"
        "paths = os.environ.get('LD_LIBRARY_PATH', '').split(':')\n"
        "if os.environ.get('UCXPY_UCP_REPORT') and lib in paths:\n"
        "    os.environ['LD_LIBRARY_PATH'] = ':'.join(p for p in paths if p != lib)\n"
        "    argv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')[:-1]\n"
        "    os.execv(sys.executable, [sys.executable] + [a.decode() for a in argv[1:]])\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT]), "FALLBACK_ROOT": ROOT}
    rc, out = _run("--impl", "ompi-ucp", "--np", "2", "--timeout", "120", "-v",
                   "--baseline", BASELINE, "test_address", env=env, timeout=300)
    assert rc != 0 and "REGRESSION test_address@2 (ompi-ucp)" in out, out[-3000:]
    assert "PROOF" in out and "0 of 2 ranks reported" in out, out[-3000:]

"""mpi4py's whole test suite on the real mpi4py wheel and MPICH (ch4:ucx) over
ucxpy's ``libucp.so.0``, in CI: every file of the released sdist (downloaded at
test time, never committed) at 2 ranks under ``mpiexec`` in ``ucxpy-ucx``'s
environment, every rank's ``UCXPY_UCP_REPORT`` report checked, held to the
committed per-file baseline ``conformance/mpi/baseline-ucp-np2.json``: any file
doing worse fails.  ``make conformance-mpi4py-ucp`` runs the 1-4 rank matrix
beside MPICH on the bundled real UCX.  A failed download skips."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

LIBUCP = os.path.join(ROOT, "ucxpy", "lib", "libucp.so.0")
BASELINE = os.path.join(ROOT, "conformance", "mpi", "baseline-ucp-np2.json")
BIN = os.path.dirname(sys.executable)

pytestmark = [
    pytest.mark.timeout(1200),
    pytest.mark.skipif(not os.path.exists(LIBUCP), reason="ucxpy's libucp.so.0 is not built"),
    pytest.mark.skipif(shutil.which("mpiexec", path=BIN + os.pathsep + os.environ.get("PATH", ""))
                       is None, reason="no mpiexec (the mpich wheel)"),
]


def _run(*args, timeout=1100, env=None):
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    p = subprocess.run([sys.executable, os.path.join(ROOT, "conformance", "mpi", "run.py"), *args],
                       capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=e)
    out = p.stdout + p.stderr
    print(out)
    if p.returncode and "could not download" in out:
        pytest.skip("conformance suite could not be downloaded from PyPI")
    return p.returncode, out


def test_mpi4py_wheel_on_libucp_whole_suite_against_the_baseline(tmp_path):
    """Every mpi4py test file at 2 ranks on MPICH over ucxpy's libucp (about
    2 minutes here); no file does worse than the baseline, and a job any of
    whose ranks did not run on ucxpy's libucp counts all its tests as errors."""
    pytest.importorskip("mpi4py")
    out_json = tmp_path / "results.json"
    # per file: the slowest takes ~20 s at 2 ranks; the margin is for a loaded machine
    rc, out = _run("--impl", "ucp", "--np", "2", "--timeout", "240",
                   "--baseline", BASELINE, "--json", str(out_json))
    assert "REGRESSION" not in out and rc == 0, out[-4000:]
    with open(out_json) as f:
        results = json.load(f)["ucp"]
    with open(BASELINE) as f:
        baseline = json.load(f)["ucp"]
    assert set(results) == set(baseline), "the suite's file list changed: refresh the baseline"


def test_the_proof_check_catches_ranks_on_the_bundled_ucx(tmp_path):
    """Ranks that run the file on the real UCX the mpich wheel bundles (each
    re-executes itself without ucxpy's lib directory: everything passes, but
    no report) must count as errors: a regression of test_address."""
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
    rc, out = _run("--impl", "ucp", "--np", "2", "--timeout", "120", "-v",
                   "--baseline", BASELINE, "test_address", env=env, timeout=300)
    assert rc != 0 and "REGRESSION test_address@2 (ucp)" in out, out[-3000:]
    assert "PROOF" in out and "0 of 2 ranks reported" in out, out[-3000:]

"""MPICH's own C test suite (test/mpi of Debian 12's mpich 4.0.2 source
package, fetched with apt-get at test time, never committed) on the mpich
wheel's MPICH over ucxpy's ``libucp.so.0``, beside the bundled real UCX: the
fixed CI subset (about 20 small pt2pt, collective and RMA tests at 2-4 ranks,
every rank's ``UCXPY_UCP_REPORT`` checked by ``ucxpy-ucx --check``) held to
the committed baseline ``conformance/mpich/baseline-ci.json``: any test of ours
doing worse fails.  ``make conformance-mpich`` runs the whole default set.
A failed download (no network, no apt) skips."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

from ucxpy.tools.ucx import LIBUCP
RUNNER = os.path.join(ROOT, "conformance", "mpich", "run.py")
BASELINE = os.path.join(ROOT, "conformance", "mpich", "baseline-ci.json")
BIN = os.path.dirname(sys.executable)
PATH = BIN + os.pathsep + os.environ.get("PATH", "")

needs_libucp = pytest.mark.skipif(not os.path.exists(LIBUCP),
                                  reason="ucxpy's libucp.so.0 is not built")
needs_mpich = pytest.mark.skipif(shutil.which("mpicc", path=PATH) is None or
                                 shutil.which("mpiexec", path=PATH) is None,
                                 reason="no mpicc/mpiexec (the mpich wheel)")


def _runner():
    spec = importlib.util.spec_from_file_location("mpich_conformance_run", RUNNER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(*args, timeout=360, env=None):
    e = dict(os.environ)
    e["PATH"] = PATH
    e.update(env or {})
    try:
        p = subprocess.run([sys.executable, RUNNER, *args], capture_output=True, text=True,
                           timeout=timeout, cwd=ROOT, env=e, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the MPICH suite did not finish in {timeout} s:\n{(exc.stdout or '')[-3000:]}")
    out = p.stdout + p.stderr
    print(out)
    if p.returncode and "could not download" in out:
        pytest.skip("MPICH's source package could not be fetched with apt-get (no network?)")
    return p.returncode, out


@needs_libucp
@needs_mpich
@pytest.mark.timeout(400)
def test_mpich_ci_subset_against_the_baseline(tmp_path):
    """The CI subset (first run: fetch, configure and build, about 1.5
    minutes; then about 30 s) on ours and on the reference; no test of ours
    does worse than the baseline."""
    rc, out = _run("--subset", "ci", "--results", str(tmp_path), "--baseline", BASELINE)
    assert "REGRESSION" not in out and rc == 0, out[-4000:]
    with open(BASELINE) as f:
        baseline = json.load(f)["tests"]
    ran = {}
    for path in tmp_path.glob("*.json"):
        ran.update(json.loads(path.read_text())["tests"])
    assert set(ran) == set(baseline), "the CI subset changed: refresh baseline-ci.json"
    assert all("reference" in t for t in ran.values())


@needs_libucp
@needs_mpich
@pytest.mark.timeout(200)
def test_the_baseline_catches_ranks_on_the_bundled_ucx(tmp_path):
    """A test of ours whose ranks run on the real UCX the wheel bundles
    (LD_PRELOAD of its four libraries: the program passes, but no rank
    reports ucxpy's libucp) is a regression versus the baseline."""
    real = [os.path.realpath(os.path.join(BIN, "..", "lib", "mpich", f"lib{name}.so.0"))
            for name in ("ucm", "ucs", "uct", "ucp")]
    if not all(os.path.exists(p) for p in real):
        pytest.skip("the mpich wheel bundles no UCX")
    rc, out = _run("--subset", "ci", "--tests", "pt2pt/sendrecv2 2", "--impl", "ours",
                   "--results", str(tmp_path), "--baseline", BASELINE, timeout=180,
                   env={"LD_PRELOAD": " ".join(real)})
    assert rc != 0 and "REGRESSION pt2pt/sendrecv2 2: ours fail (check:" in out, out[-3000:]


def test_runtests_verdicts():
    """The verdict rules of MPICH's runtests, as run.py implements them."""
    judge = _runner().judge
    assert judge(" No Errors\n", 0, None) == (True, "")
    assert judge("No errors\nTest Passed\n", 0, None)[0]
    assert judge(" No Errors\n", 1, None) == (False, "exit 1")
    assert judge(" No Errors\n", -9, None) == (False, "signal 9")
    assert judge("", 0, None) == (False, "no ' No Errors'")
    assert judge(" No Errors\n No Errors\n", 0, None)[0] is False       # twice: unexpected
    assert judge("warning: x\n No Errors\n", 0, None)[1].startswith("unexpected output")
    assert judge("anything\n", 3, "TestErrFatal")[0]
    assert not judge("anything\n", 0, "TestStatus")[0]
    assert judge(" No Errors\n No Errors\n", 1, "TestStatusNoErrors")[0]
    assert not judge(" No Errors\n", 0, "TestStatusNoErrors")[0]


def test_testlist_parsing(tmp_path):
    """testlist lines: np, key=value options, skips (np>4, xfail, mem) and
    directory entries, the way runtests reads them."""
    run = _runner()
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "testlist").write_text(
        "# comment\n"
        "a 2\n"
        "b 4 arg=-n=3 env=X=1 timeLimit=30 resultTest=TestErrFatal\n"
        "c 8\n"
        "e 2 xfail=ticket1\n"
        "f 2 mem=100000\n"
        "g 1 ignored-word\n"
        "sub\n")
    (tmp_path / "d" / "sub" / "testlist").write_text("h 3\n")

    class Opts:
        maxnp, xfail, strict = 4, False, False
    entries, skipped = run.read_dir(str(tmp_path), "d", Opts)
    assert [e["id"] for e in entries] == [
        "d/a 2", "d/b 4 arg=-n=3 env=X=1 timeLimit=30 resultTest=TestErrFatal", "d/g 1",
        "d/sub/h 3"]
    b = entries[1]
    assert b["args"] == ["-n=3"] and b["envs"] == ["X=1"] and b["timeLimit"] == "30"
    assert b["resultTest"] == "TestErrFatal" and b["np"] == 4
    assert entries[3]["cwd"] == str(tmp_path / "d" / "sub") and entries[3]["dir"] == "d"
    assert {s["id"]: s["why"] for s in skipped} == {
        "d/c 8": "np>4", "d/e 2 xfail=ticket1": "xfail", "d/f 2 mem=100000": "mem"}

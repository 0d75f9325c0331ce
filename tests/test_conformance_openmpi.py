"""Real Open MPI / OSHMEM programs on ucxpy's ``libucp.so.0``: Open MPI's own
``examples/`` (Debian 12's openmpi 4.1.4 source package, fetched with apt-get at
test time into a cache, never committed), built with ``mpicc.openmpi``/``oshcc``
and run at 2 ranks under ``ucxpy-ucx --check``'s environment, each held
strictly (exit 0, every rank's report naming ucxpy's libucp, the output the
source's printf formats say); and the real shmem4py's tests (a fixed subset)
and demos at 2 PEs, held to the committed baseline
``conformance/openmpi/baseline-ci.json`` (a real run's outcomes of ours): any
test or demo of ours doing worse fails.  ``make conformance-openmpi`` runs
both at 2 and 4 ranks beside the system UCX.  No network (the download
fails), no Open MPI compilers or no libucp: skipped."""
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
RUNNER = os.path.join(ROOT, "conformance", "openmpi", "run.py")
BASELINE = os.path.join(ROOT, "conformance", "openmpi", "baseline-ci.json")

needs_libucp = pytest.mark.skipif(not os.path.exists(LIBUCP),
                                  reason="ucxpy's libucp.so.0 is not built")
needs_openmpi = pytest.mark.skipif(
    not all(shutil.which(p) for p in ("mpicc.openmpi", "oshcc", "/usr/bin/mpirun",
                                      "/usr/bin/oshrun")),
    reason="no Open MPI/OSHMEM (mpicc.openmpi, oshcc, mpirun, oshrun: "
           "apt-get install openmpi-bin libopenmpi-dev)")


def _runner():
    spec = importlib.util.spec_from_file_location("openmpi_conformance_run", RUNNER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(*args, timeout=360):
    try:
        p = subprocess.run([sys.executable, RUNNER, *args], capture_output=True, text=True,
                           timeout=timeout, cwd=ROOT, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"run.py did not finish in {timeout} s:\n{(exc.stdout or '')[-3000:]}")
    out = p.stdout + p.stderr
    print(out)
    if p.returncode == 2 and "could not download" in out:
        pytest.skip("a suite could not be downloaded (no network?): " + out.strip()[-300:])
    return p.returncode, out


@needs_libucp
@needs_openmpi
@pytest.mark.timeout(300)
def test_open_mpi_examples_on_libucp(tmp_path):
    """Every example of Open MPI 4.1.4 at 2 ranks on ucxpy's libucp (first
    run: fetch and build, about 15 s; then about 5 s): exit 0, proof of use,
    and the output its source prints."""
    out_json = tmp_path / "examples.json"
    rc, out = _run("--parts", "examples", "--np", "2", "--impl", "ours", "--timeout", "60",
                   "--json", str(out_json))
    assert rc == 0 and "no failure of ours" in out, out[-4000:]
    results = json.loads(out_json.read_text())["examples"]
    assert set(results) == {f"{p}@2" for p in _runner().EXAMPLES}
    for key, row in results.items():
        assert row["ours"]["ok"] and row["ours"]["match"] and not row["ours"]["check"], key
    # the expected lines come from the source: what ring_c's rank 0 prints
    assert "Process 0 decremented value: 0" in results["ring_c@2"]["expected"]


@needs_libucp
@needs_openmpi
@pytest.mark.timeout(400)
def test_shmem4py_subset_against_the_baseline(tmp_path):
    """The CI files of shmem4py's suite (test_sync left out: it hangs now and
    then on the reference too) and its demos (race_winner_test left out: it
    hangs on ours more often than not, README) at 2 PEs on OSHMEM over
    ucxpy's libucp, shmem_finalize from shmem4py's exit hook (about 20 s):
    no test or demo of ours does worse than the baseline, and every job of
    ours exits 0."""
    r = subprocess.run([sys.executable, "-c", "import shmem4py"], capture_output=True)
    if r.returncode:
        pytest.skip("shmem4py is not installed (OSHCC=oshcc pip install shmem4py)")
    out_json = tmp_path / "shmem4py.json"
    rc, out = _run("--parts", "shmem4py,demos", "--subset", "ci", "--np", "2", "--impl", "ours",
                   "--timeout", "30", "--baseline", BASELINE, "--json", str(out_json))
    assert "REGRESSION" not in out and rc == 0, out[-4000:]
    results = json.loads(out_json.read_text())
    with open(BASELINE) as f:
        baseline = json.load(f)
    assert set(results["shmem4py"]) == set(baseline["shmem4py"]), \
        "the CI files changed: refresh baseline-ci.json"
    assert set(results["demos"]) == set(baseline["demos"]), \
        "the demos changed: refresh baseline-ci.json"


# --- the runner's rules (no job) -------------------------------------------------------

SOURCE = r'''
#include <stdio.h>
/* printf("not this one %d\n", x); */
int main(int argc, char **argv) {
    printf("Hello, world, I am %d of %d, (%s, %d)\n", rank, size, version, len);
    printf("rank %-4d"
           " on %s\n", j, name);
    printf("%hd \t", target[i]);
    printf("\n");
}
'''


def test_expected_lines_from_printf_formats(tmp_path):
    run = _runner()
    assert run.printf_formats(SOURCE) == [
        "Hello, world, I am %d of %d, (%s, %d)\n", "rank %-4d on %s\n", "%hd \t", "\n"]
    assert run.c_format("rank %-4d on %s\n", 1, run.MASK) == "rank 1    on <*>\n"
    assert run.c_format("%hd \t%ld%%", 7, 8) == "7 \t8%"
    src = tmp_path / "x.c"
    src.write_text(SOURCE)
    F = run.Formats(str(src))
    assert F("Hello")(1, 2, run.MASK, run.MASK) == "Hello, world, I am 1 of 2, (<*>, <*>)\n"
    with pytest.raises(run.BuildError):
        F("Goodbye")                      # a source the model was not made for


def test_normalise_masks_and_sorts():
    run = _runner()
    want = ["Hello, world, I am 0 of 2, (<*>, <*>)", "Hello, world, I am 1 of 2, (<*>, <*>)"]
    got = run.normalise(["Hello, world, I am 1 of 2, (Open MPI v4.1.4, x, 87)",
                         "Hello, world, I am 0 of 2, (Open MPI v4.1.4, x, 87)"], want)
    assert got == sorted(want)
    bad = run.normalise(["Hello, world, I am 1 of 2, (v, 1)",
                         "Hello, world, I am 1 of 2, (v, 1)"], want)
    assert bad != sorted(want)
    assert "missing" in run.diff_lines(bad, sorted(want))


def _row(tests, rc=0, check=()):
    run = _runner()
    return {"rc": rc, "timeout": False, "check": list(check), "tests": tests,
            "counts": run.counts(tests)}


def test_file_verdicts():
    run = _runner()
    ok = {"t1": "pass", "t2": "skip"}
    assert run.file_verdict({"ours": _row(ok), "reference": _row(ok, rc=-11)}, ())[0] == "PASS"
    worse = {"ours": _row({"t1": "fail", "t2": "skip"}), "reference": _row(ok)}
    assert run.file_verdict(worse, ())[0] == "FAIL"
    assert run.file_verdict({"ours": _row(ok, rc=16), "reference": _row(ok)}, ())[0] == "FAIL"
    assert run.file_verdict({"ours": _row(ok, check=["0 of 2 ranks"]),
                             "reference": _row(ok)}, ())[0] == "FAIL"
    hung = {"t1": "pass", "t2": "hang"}
    both = {"ours": _row(hung, rc=110), "reference": _row(hung, rc=110)}
    assert run.file_verdict(both, ())[0] == "as-ref"


def test_the_baseline_catches_a_worse_test(tmp_path):
    run = _runner()
    base = {"date": "x", "examples": {}, "demos": {"hello.py@2": {"ours": "pass", "exit": "0"}},
            "shmem4py": {"test_x@2": {"exit": "0", "proof": True,
                                      "tests": {"t1": "pass", "t2": "fail"}}}}
    path = tmp_path / "b.json"
    path.write_text(json.dumps(base))
    same = {"shmem4py": {"test_x@2": {"ours": _row({"t1": "pass", "t2": "fail"})}},
            "demos": {"hello.py@2": {"ours": {"ok": True}, "why": []}}}
    assert run.check_baseline(same, str(path)) == []
    better = {"shmem4py": {"test_x@2": {"ours": _row({"t1": "pass", "t2": "pass"})}}}
    assert run.check_baseline(better, str(path)) == []
    worse = {"shmem4py": {"test_x@2": {"ours": _row({"t1": "hang", "t2": "fail"}, rc=110)}},
             "demos": {"hello.py@2": {"ours": {"ok": False}, "why": ["ours exit 16"]}}}
    bad = run.check_baseline(worse, str(path))
    assert any("t1: ours hang (baseline pass)" in b for b in bad)
    assert any("exit 110" in b for b in bad)
    assert any("demo hello.py@2" in b for b in bad)

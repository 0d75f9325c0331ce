"""Conformance: mpi4py's own test suite against mpi_shim.

Downloads mpi4py's released sdist from PyPI at run time (``pip download``
into a cache directory, never committed), then runs selected test modules
through ``tests/mpi4py_adapter`` (a stand-in ``mpi4py`` package whose ``MPI``
is ``mpi_shim.MPI``) under ``ucxpy-run`` with 1, 2 and 4 ranks, and prints
per-module pass/fail/error/skip counts.  A test passes when it passes on
every rank; tests a rank never finished (job killed at its timeout) count
as errors.

Usage: python conformance/mpi/run.py [--np 1,2,4] [--version 4.1.2]
       [--timeout 600] [--cache DIR] [MODULE ...]
Exit status: 0 when every target module reached --target percent (default 90).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TARGETS = ["test_p2p_obj", "test_p2p_buf", "test_status", "test_request", "test_cco_obj",
           "test_cco_buf", "test_comm", "test_rma", "test_win"]
EXTRA = ["test_group", "test_op", "test_datatype", "test_errorcode", "test_exceptions",
         "test_p2p_obj_matched", "test_p2p_buf_matched", "test_cco_nb_buf", "test_info",
         "test_msgspec", "test_rma_nb", "test_pickle", "test_environ"]
DEFAULT_VERSION = "4.1.2"


def fetch(version: str, cache: str) -> str:
    """Directory holding mpi4py-<version>/test, downloading the sdist if needed."""
    testdir = os.path.join(cache, f"mpi4py-{version}", "test")
    if os.path.isdir(testdir):
        return testdir
    os.makedirs(cache, exist_ok=True)
    sdist = os.path.join(cache, f"mpi4py-{version}.tar.gz")
    if not os.path.exists(sdist):
        # --no-binary for mpi4py only: the source release, while its build
        # backend (needed by pip to read the metadata) may come as wheels.
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                            "--no-binary", "mpi4py", f"mpi4py=={version}", "-d", cache],
                           capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"could not download mpi4py=={version}:\n{r.stdout}\n{r.stderr}")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(f"mpi4py-{version}/test/") and m.isfile()]
        tar.extractall(cache, members=members, filter="data")
    return testdir


def run_module(testdir, module, n, timeout, outdir):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("UCXPY_TLS", "self,shm,tcp")
    cmd = [sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", str(n),
           "--timeout", str(timeout), sys.executable, os.path.join(HERE, "runner.py"),
           testdir, module, outdir]
    try:
        proc = subprocess.run(cmd, env=env, cwd=testdir, capture_output=True, text=True,
                              timeout=timeout + 30)
        rc, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, log = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(
            e.stdout, bytes) else str(e.stdout or "")
    per_rank = []
    for r in range(n):
        path = os.path.join(outdir, f"{module}.{r}.json")
        try:
            with open(path) as f:
                per_rank.append(json.load(f))
        except (OSError, ValueError):
            per_rank.append({})
    tests = set().union(*per_rank) if per_rank else set()
    counts = {"pass": 0, "fail": 0, "error": 0, "skip": 0}
    bad = []
    for t in sorted(tests):
        states = [d.get(t, "error") for d in per_rank]
        if all(s == "skip" for s in states):
            counts["skip"] += 1
        elif all(s in ("pass", "skip") for s in states):
            counts["pass"] += 1
        else:
            kind = "fail" if "fail" in states else "error"
            counts[kind] += 1
            bad.append((t, states))
    return counts, rc, bad, log


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*")
    ap.add_argument("--np", default="1,2,4")
    ap.add_argument("--version", default=os.environ.get("MPI4PY_TEST_VERSION", DEFAULT_VERSION))
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--cache", default=os.environ.get(
        "UCXPY_CONFORMANCE_CACHE", os.path.join(tempfile.gettempdir(), "ucxpy-conformance")))
    ap.add_argument("--target", type=float, default=90.0)
    ap.add_argument("--extra", action="store_true", help="also run modules beyond the targets")
    ap.add_argument("-v", "--verbose", action="store_true", help="list failing tests")
    args = ap.parse_args(argv)
    modules = args.modules or (TARGETS + (EXTRA if args.extra else []))
    testdir = fetch(args.version, args.cache)
    nps = [int(x) for x in args.np.split(",")]
    print(f"mpi4py {args.version} test suite against mpi_shim ({testdir})")
    print(f"{'module':24} {'np':>3} {'pass':>5} {'fail':>5} {'error':>5} {'skip':>5} "
          f"{'rate':>7}  exit")
    ok = True
    for module in modules:
        if not os.path.exists(os.path.join(testdir, module + ".py")):
            print(f"{module:24} (not in this mpi4py release)")
            continue
        for n in nps:
            with tempfile.TemporaryDirectory() as outdir:
                counts, rc, bad, log = run_module(testdir, module, n, args.timeout, outdir)
            ran = counts["pass"] + counts["fail"] + counts["error"]
            rate = 100.0 * counts["pass"] / ran if ran else 0.0
            if module in TARGETS and rate < args.target:
                ok = False
            print(f"{module:24} {n:>3} {counts['pass']:>5} {counts['fail']:>5} "
                  f"{counts['error']:>5} {counts['skip']:>5} {rate:6.1f}%  {rc}", flush=True)
            if args.verbose:
                for t, states in bad:
                    print(f"      {t}: {states}")
                if rc not in (0,) and not bad:
                    print(log[-3000:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

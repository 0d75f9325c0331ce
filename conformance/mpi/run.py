"""Conformance: mpi4py's whole test suite against mpi_shim, beside the reference.

Downloads mpi4py's released sdist from PyPI at run time (``pip download``
into a cache directory, never committed) and runs **every** ``test_*.py``
file of its ``test/`` directory, once per rank count, twice:

* ``shim``: through the drop-in ``mpi4py`` package ``mpi_shim/dropin/mpi4py``
  (its ``MPI`` is ``mpi_shim.MPI``) under ``ucxpy-run`` (or ``mpiexec`` with
  ``--launcher mpiexec``);
* ``ref``: the same file on the real mpi4py and the ``mpich`` wheel under
  ``mpiexec`` (the reference, measured in the same run).

A test passes when it passes on every rank.  A job that does not end within
``--timeout`` is killed and flagged HANG; the tests it was running at that
moment count as ``hang``, those it never reached as ``error``.  A file is OK
when the shim has no failure, error or hang and no more skips than the
reference.

Usage: python conformance/mpi/run.py [--np 1,2,3,4] [--impl shim,ref]
       [--launcher ucxpy-run|mpiexec] [--timeout 300] [--json OUT]
       [--baseline FILE] [--version 4.1.2] [--cache DIR] [-v] [FILE ...]
Exit status: 0 when every file is OK (or, with ``--baseline``, when no file
does worse than the baseline says).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_VERSION = "4.1.2"
STATES = ("pass", "fail", "error", "skip", "hang")


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


def all_modules(testdir: str) -> list:
    return sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(testdir, "test_*.py")))


def mpiexec() -> str:
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep +
                       os.environ.get("PATH", ""))
    if exe is None:
        sys.exit("mpiexec not found (pip install mpich)")
    return exe


def command(impl, launcher, n, timeout, testdir, module, outdir):
    runner = [sys.executable, os.path.join(HERE, "runner.py"), impl, testdir, module, outdir]
    if impl == "shim" and launcher == "ucxpy-run":
        return [sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", str(n),
                "--timeout", str(timeout), *runner]
    return [mpiexec(), "-n", str(n), *runner]


def run_module(impl, launcher, testdir, module, n, timeout, outdir):
    """Run one file; returns (per-test state, exit code, log tail)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if impl == "shim":
        env.setdefault("UCXPY_TLS", "self,shm,tcp")
        # the drop-in mpi4py for every process, spawned ones included
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "mpi_shim", "dropin"),
                                             env["PYTHONPATH"]])
    env.pop("MPI4PY_LIBMPI", None) if impl == "ref" else None
    cmd = command(impl, launcher, n, timeout, testdir, module, outdir)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=testdir, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout + 20)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        log, _ = proc.communicate()
        rc = "timeout"
    elapsed = time.monotonic() - t0
    per_rank = []
    for r in range(n):
        try:
            with open(os.path.join(outdir, f"{module}.{r}.json")) as f:
                per_rank.append(json.load(f))
        except (OSError, ValueError):
            per_rank.append({})
    hung = rc == "timeout" or elapsed >= timeout      # killed by us or by the launcher
    tests = {}
    for t in sorted(set().union(*per_rank)):
        states = [d.get(t, "notrun") for d in per_rank]
        if "running" in states:
            tests[t] = "hang" if hung else "error"
        elif all(s == "skip" for s in states):
            tests[t] = "skip"
        elif all(s in ("pass", "skip") for s in states):
            tests[t] = "pass"
        elif "fail" in states:
            tests[t] = "fail"
        else:
            tests[t] = "error"
    if not tests and rc != 0:
        tests["<import>"] = "hang" if hung else "error"
    return tests, rc, hung, log.decode(errors="replace")[-4000:]


def counts(tests: dict) -> dict:
    out = dict.fromkeys(STATES, 0)
    for s in tests.values():
        out[s] += 1
    return out


def verdict(shim: dict, ref: dict | None) -> str:
    """HANG, FAIL, SKIPS, OK, or OK=REF: the shim fails only where the
    reference fails too (as many tests pass, no more skips)."""
    if shim["hang"]:
        return "HANG"
    if ref is not None and shim["skip"] > ref["skip"]:
        return "SKIPS"
    if shim["fail"] or shim["error"]:
        if ref is not None and shim["pass"] >= ref["pass"] and \
                shim["fail"] + shim["error"] <= ref["fail"] + ref["error"]:
            return "OK=REF"
        return "FAIL"
    return "OK"


def _fmt(c):
    return f"{c['pass']:>5} {c['fail']:>4} {c['error']:>4} {c['skip']:>4} {c['hang']:>3}"


def regressions(results: dict, baseline: dict) -> list:
    """Files whose shim counts are worse than the baseline's."""
    bad = []
    for key, base in baseline.get("shim", {}).items():
        now = results.get("shim", {}).get(key)
        if now is None:
            continue
        b, c = base["counts"], now["counts"]
        worse = (c["pass"] < b["pass"] or c["hang"] > b["hang"] or
                 c["fail"] + c["error"] > b["fail"] + b["error"] or
                 c["skip"] > b["skip"])
        if worse:
            bad.append((key, b, c))
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help="test files (default: all of them)")
    ap.add_argument("--np", default="1,2,3,4")
    ap.add_argument("--impl", default="shim,ref", help="shim, ref or both")
    ap.add_argument("--launcher", default="ucxpy-run", choices=("ucxpy-run", "mpiexec"),
                    help="launcher of the shim runs (the reference always uses mpiexec)")
    ap.add_argument("--version", default=os.environ.get("MPI4PY_TEST_VERSION", DEFAULT_VERSION))
    ap.add_argument("--timeout", type=int, default=300, help="seconds per file and rank count")
    ap.add_argument("--cache", default=os.environ.get(
        "UCXPY_CONFORMANCE_CACHE", os.path.join(tempfile.gettempdir(), "ucxpy-conformance")))
    ap.add_argument("--json", help="write every per-test result here")
    ap.add_argument("--baseline", help="fail only on regressions against this JSON baseline")
    ap.add_argument("-v", "--verbose", action="store_true", help="list failing tests")
    args = ap.parse_args(argv)
    testdir = fetch(args.version, args.cache)
    modules = args.modules or all_modules(testdir)
    impls = [i for i in args.impl.split(",") if i]
    nps = [int(x) for x in args.np.split(",")]
    print(f"mpi4py {args.version} test suite ({len(modules)} files): mpi_shim under "
          f"{args.launcher} vs the reference (mpi4py on the mpich wheel, mpiexec)")
    print(f"{'file':24} {'np':>2} | {'shim: pass fail  err skip hng':30} | "
          f"{'ref:  pass fail  err skip hng':30} | verdict")
    results = {i: {} for i in impls}
    verdicts = {}
    for module in modules:
        if not os.path.exists(os.path.join(testdir, module + ".py")):
            print(f"{module:24} (not in this mpi4py release)")
            continue
        for n in nps:
            key = f"{module}@{n}"
            line = {}
            for impl in impls:
                with tempfile.TemporaryDirectory() as outdir:
                    tests, rc, hung, log = run_module(impl, args.launcher, testdir, module,
                                                      n, args.timeout, outdir)
                c = counts(tests)
                results[impl][key] = {"counts": c, "tests": tests, "rc": str(rc)}
                line[impl] = (c, tests, rc, log)
            shim = line.get("shim")
            ref = line.get("ref")
            v = verdict(shim[0], ref[0] if ref else None) if shim else "-"
            verdicts[key] = v
            print(f"{module:24} {n:>2} | " +
                  (f"     {_fmt(shim[0])}" if shim else " " * 30) + "  | " +
                  (f"     {_fmt(ref[0])}" if ref else " " * 30) + f"  | {v}", flush=True)
            if args.verbose and shim and not v.startswith("OK"):
                for t, s in shim[1].items():
                    if s not in ("pass", "skip"):
                        print(f"      {s:5} {t}")
                if not any(s not in ("pass", "skip") for s in shim[1].values()) or \
                        "<import>" in shim[1]:
                    print("      " + shim[3][-2000:].replace("\n", "\n      "))
    if "shim" in results:
        tot = dict.fromkeys(STATES, 0)
        for r in results["shim"].values():
            for k in STATES:
                tot[k] += r["counts"][k]
        ok = sum(1 for v in verdicts.values() if v.startswith("OK"))
        print(f"TOTAL shim: {ok}/{len(verdicts)} file runs OK; tests " +
              ", ".join(f"{k} {tot[k]}" for k in STATES))
        hangs = sorted(k for k, v in verdicts.items() if v == "HANG")
        if hangs:
            print("HANGS:", " ".join(hangs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"version": args.version, "launcher": args.launcher, **results}, f,
                      indent=1, sort_keys=True)
    if args.baseline:
        with open(args.baseline) as f:
            bad = regressions(results, json.load(f))
        for key, b, c in bad:
            print(f"REGRESSION {key}: baseline {b} now {c}")
        return 1 if bad else 0
    return 0 if all(v.startswith("OK") for v in verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

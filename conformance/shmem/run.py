#!/usr/bin/env python3
"""Run shmem4py's released test suite against ucxpy's ``shmem``.

The shmem4py source distribution is fetched from PyPI at run time with
``pip download --no-deps --no-binary :all: shmem4py==VERSION`` into a cache
directory outside the repository (``--cache``, default
``$XDG_CACHE_HOME/ucxpy-conformance``); nothing from it is committed.  Its
``test/test_*.py`` files run unchanged: ``shmem/dropin/`` (the shipped shmem4py drop-in) is put first on
``PYTHONPATH`` so ``from shmem4py import shmem`` resolves to our ``shmem``.
Every file runs as a real job of 1, 2 and 4 PEs under the chosen launchers;
each PE records per-test outcomes (see ``unittest_runner.py``) and a test
passes when it passed on every PE.

    python conformance/shmem/run.py                     # ucxpy-run, 1/2/4 PEs
    python conformance/shmem/run.py --launcher both --np 1,2,4 --tls self,tcp
    python conformance/shmem/run.py --files test_rma,test_amo -v

Exit status: 0 when the pass rate (passed / (run - skipped)) reaches
``--target`` percent (default 90), else 1.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from conformance import harness  # noqa: E402
from ucxpy.tools import snapshot  # noqa: E402
from conformance.harness import locked  # noqa: E402

ADAPTER = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shmem", "dropin")
RUNNER = os.path.join(HERE, "unittest_runner.py")
DEFAULT_VERSION = "1.0.0"


def default_cache() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ucxpy-conformance")


def fetch_suite(version: str, cache: str) -> str:
    """Directory holding shmem4py's ``test/`` files, downloading once."""
    with locked(cache):
        return _fetch_suite(version, cache)


def _fetch_suite(version: str, cache: str) -> str:
    dest = os.path.join(cache, f"shmem4py-{version}")
    tests = os.path.join(dest, "test")
    done = os.path.join(dest, ".extracted")
    if os.path.exists(done):
        return tests
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "-q", "-d", tmp, f"shmem4py=={version}"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        sdists = glob.glob(os.path.join(tmp, "shmem4py-*.tar.gz"))
        if not sdists:
            # pip may fail to *prepare* the sdist (no OpenSHMEM here) after
            # saving it; only a missing archive is fatal
            sys.exit(f"could not download shmem4py=={version}:\n{r.stdout}\n{r.stderr}")
        with tarfile.open(sdists[0]) as tar:
            top = f"shmem4py-{version}/"
            members = [m for m in tar.getmembers() if m.isfile() and
                       (m.name.startswith(top + "test/") or m.name.startswith(top + "demo/"))]
            for m in members:
                m.name = m.name[len(top):]
            tar.extractall(dest, members=members, filter="data")
    open(done, "w").close()
    return tests


def run_file(path, npes, launcher, timeout, env):
    outdir = tempfile.mkdtemp(prefix="shmemconf-")
    try:
        if launcher == "ucxpy-run":
            cmd = [sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", str(npes),
                   "--timeout", str(timeout), sys.executable, RUNNER, path, outdir]
        else:
            cmd = ["mpiexec", "-n", str(npes), sys.executable, RUNNER, path, outdir]
        t0 = time.monotonic()
        rc, out, _, killed = harness.run_job(cmd, timeout=timeout + 30, env=env,
                                             cwd=os.path.dirname(path))
        out = out.decode(errors="replace")
        if killed:
            out += f"\n[run.py] killed after {timeout + 30} s"
        res = harness.pe_outcomes(harness.pe_records(outdir), npes)
        return res["tests"], res["details"], rc, out, time.monotonic() - t0
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


def run_demo(path, npes, launcher, timeout, env):
    """Run one of shmem4py's demo programs unmodified; (ok, seconds, output)."""
    if launcher == "ucxpy-run":
        cmd = [sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", str(npes),
               "--timeout", str(timeout), "--as-shmem4py", sys.executable, path]
    else:
        cmd = ["mpiexec", "-n", str(npes), sys.executable, path]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, cwd=os.path.dirname(path), capture_output=True,
                              text=True, timeout=timeout + 30)
        ok, out = proc.returncode == 0, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        ok, out = False, f"killed after {timeout + 30} s\n{e.stdout or ''}"
    return ok, time.monotonic() - t0, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", default=DEFAULT_VERSION, help="shmem4py release to test against")
    ap.add_argument("--cache", default=default_cache(), help="download/extract directory")
    ap.add_argument("--np", default="1,2,4", help="comma-separated PE counts")
    ap.add_argument("--launcher", default="ucxpy-run",
                    help="ucxpy-run, mpiexec, or both")
    ap.add_argument("--files", default="", help="comma-separated test file names (default all)")
    ap.add_argument("--tls", default="", help="UCXPY_TLS for the jobs (e.g. self,tcp)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per job")
    ap.add_argument("--target", type=float, default=90.0, help="required pass percentage")
    ap.add_argument("--demos", action="store_true",
                    help="also run every demo/*.py program (must exit 0)")
    ap.add_argument("--demos-only", action="store_true", help="run only the demo programs")
    ap.add_argument("-v", "--verbose", action="store_true", help="print failing tests")
    snapshot.add_option(ap, "conformance-shmem")
    args = ap.parse_args(argv)
    args.demos = args.demos or args.demos_only

    tests_dir = fetch_suite(args.version, args.cache)
    files = sorted(glob.glob(os.path.join(tests_dir, "test_*.py")))
    if args.files:
        wanted = {f if f.endswith(".py") else f + ".py" for f in args.files.split(",")}
        files = [f for f in files if os.path.basename(f) in wanted]
    if args.demos_only:
        files = []
    launchers = ["ucxpy-run", "mpiexec"] if args.launcher == "both" else args.launcher.split(",")
    nps = [int(x) for x in args.np.split(",")]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ADAPTER, ROOT] + [p for p in
                                         env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if args.tls:
        env["UCXPY_TLS"] = args.tls

    print(f"shmem4py {args.version} test suite against ucxpy shmem "
          f"({', '.join(launchers)}; PEs {args.np}{'; tls ' + args.tls if args.tls else ''})")
    print(f"{'file':<18}{'launcher':<11}{'PEs':>4}{'pass':>6}{'fail':>6}{'err':>5}"
          f"{'hang':>6}{'skip':>6}{'secs':>7}")
    totals = dict(passed=0, failed=0, errors=0, hung=0, skipped=0)
    rows = []
    for launcher in launchers:
        for npes in nps:
            for path in files:
                result, details, rc, out, secs = run_file(path, npes, launcher,
                                                          args.timeout, env)
                c = harness.counts(result.values(), harness.RANK)
                c["hang/crash"] = c["hang"] + c["not run"]   # (a PE crashed before it)
                if not result:
                    c["error"] = 1          # the file did not even start its tests
                print(f"{os.path.basename(path)[:-3]:<18}{launcher:<11}{npes:>4}"
                      f"{c['pass']:>6}{c['fail']:>6}{c['error']:>5}{c['hang/crash']:>6}"
                      f"{c['skip']:>6}{secs:>7.1f}", flush=True)
                rows.append({"file": os.path.basename(path)[:-3], "launcher": launcher,
                             "PEs": npes, "pass": c["pass"], "fail": c["fail"],
                             "error": c["error"], "hang/crash": c["hang/crash"],
                             "skip": c["skip"]})
                totals["passed"] += c["pass"]
                totals["failed"] += c["fail"]
                totals["errors"] += c["error"]
                totals["hung"] += c["hang/crash"]
                totals["skipped"] += c["skip"]
                if args.verbose:
                    for tid, v in sorted(result.items()):
                        if v not in ("pass", "skip"):
                            print(f"    {v}: {tid}")
                            if tid in details:
                                print("      " + details[tid].strip().replace("\n", "\n      "))
                    if not result:
                        print("    " + (details.get("<import>") or out[-3000:]).replace(
                            "\n", "\n    "))
    demo_bad = []
    if args.demos:
        demos = sorted(glob.glob(os.path.join(os.path.dirname(tests_dir), "demo", "**", "*.py"),
                                 recursive=True))
        for launcher in launchers:
            for npes in nps:
                for path in demos:
                    ok, secs, out = run_demo(path, npes, launcher, args.timeout, env)
                    name = os.path.relpath(path, os.path.dirname(tests_dir))
                    print(f"{name:<26}{launcher:<11}{npes:>4}  {'OK' if ok else 'FAIL':<5}"
                          f"{secs:>7.1f}", flush=True)
                    if not ok:
                        demo_bad.append(f"{name}@{npes}")
                        if args.verbose:
                            print("    " + out[-2000:].replace("\n", "\n    "))
        print(f"DEMOS: {len(demos) * len(nps) * len(launchers) - len(demo_bad)}/"
              f"{len(demos) * len(nps) * len(launchers)} ran OK"
              + (f"; failed: {' '.join(demo_bad)}" if demo_bad else ""))
    ran = totals["passed"] + totals["failed"] + totals["errors"] + totals["hung"]
    pct = 100.0 * totals["passed"] / ran if ran else 0.0
    print(f"TOTAL: {totals['passed']}/{ran} passed ({pct:.1f}%), {totals['failed']} failed, "
          f"{totals['errors']} errors, {totals['hung']} hung/crashed, "
          f"{totals['skipped']} skipped")
    snapshot.save(args, {"suite": f"shmem4py {args.version}", "rows": rows,
                         "totals": {**totals, "ran": ran}, "demos_failed": demo_bad})
    if args.demos_only:
        return 0 if not demo_bad else 1
    return 0 if pct >= args.target and not demo_bad else 1


if __name__ == "__main__":
    sys.exit(main())

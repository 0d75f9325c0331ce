"""Conformance: mpi4py's whole test suite against mpi_shim, beside the reference.

Downloads mpi4py's released sdist from PyPI at run time (``pip download``
into a cache directory, never committed) and runs **every** ``test_*.py``
file of its ``test/`` directory, once per rank count and implementation:

* ``shim``: through the drop-in ``mpi4py`` package ``mpi_shim/dropin/mpi4py``
  (its ``MPI`` is ``mpi_shim.MPI``) under ``ucxpy-run`` (or ``mpiexec`` with
  ``--launcher mpiexec``);
* ``ref``: the same file on the real mpi4py and the ``mpich`` wheel under
  ``mpiexec`` (the reference of ``shim``, measured in the same run);
* ``ucp``: the real mpi4py wheel and MPICH under ``mpiexec`` on ucxpy's
  ``libucp.so.0``, in the environment of ``ucxpy-ucx`` (MPICH's ch4:ucx for
  all traffic).  Every rank must prove it ran on ucxpy's libucp
  (``UCXPY_UCP_REPORT`` reports, ``ucxpy.tools.ucx.check_reports``): a job
  whose proof fails counts all its tests as errors;
* ``ref-ucx``: ``ref`` with the same MPICH variables (``ucxpy-ucx
  --reference``: MPICH's ch4:ucx on the real UCX the wheel bundles), the
  reference of ``ucp``, measured in the same run;
* ``ompi-ucp``: the same mpi4py wheel on Open MPI (``MPI4PY_LIBMPI`` =
  the system's ``libmpi.so.40``) under Open MPI's ``/usr/bin/mpirun``, on
  ucxpy's ``libucp.so.0`` in ``ucxpy-ucx``'s environment (Open MPI's UCX
  components forced: pml, osc, spml, atomic), each job proven as ``ucp``'s;
* ``ompi-ref``: ``ompi-ucp`` on the system's UCX (``ucxpy-ucx
  --reference``), its reference, measured in the same run.

A test passes when it passes on every rank.  A job that does not end within
``--timeout`` is killed and flagged HANG; the tests it was running at that
moment count as ``hang``, those it never reached as ``error``.  A file is OK
when the shim has no failure, error or hang and no more skips than the
reference.  ``ucp`` and ``ompi-ucp`` are held to their references exactly: OK
when their pass, fail, error, skip and hang counts are the reference's.

Usage: python conformance/mpi/run.py [--np 1,2,3,4]
       [--impl shim,ref|ucp,ref-ucx|ompi-ucp,ompi-ref]
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
sys.path.insert(0, ROOT)

from conformance import harness  # noqa: E402
from ucxpy.tools import snapshot  # noqa: E402
from conformance.harness import locked, merged  # noqa: E402

DEFAULT_VERSION = "4.1.2"
STATES = ("pass", "fail", "error", "skip", "hang")
IMPLS = ("shim", "ref", "ucp", "ref-ucx", "ompi-ucp", "ompi-ref")
#: (implementation under test, its reference)
PAIRS = (("shim", "ref"), ("ucp", "ref-ucx"), ("ompi-ucp", "ompi-ref"))
#: run in ``ucxpy-ucx``'s environment (ucxpy.tools.ucx.environment)
UCX_IMPLS = ("ucp", "ref-ucx", "ompi-ucp", "ompi-ref")
#: on ucxpy's libucp.so.0: every job's ranks must prove it (``proof``)
LIBUCP_IMPLS = ("ucp", "ompi-ucp")
#: references: on the real UCX (``reference=True``)
REFERENCE_IMPLS = ("ref-ucx", "ompi-ref")
#: the mpi4py wheel on Open MPI, under Open MPI's launcher
OPENMPI_IMPLS = ("ompi-ucp", "ompi-ref")
#: MPICH's launcher and library (the mpich wheel) for ucp and ref-ucx
MPICH_UCX_IMPLS = ("ucp", "ref-ucx")
#: Open MPI's library (the mpi4py wheel loads it instead of MPICH's) and launcher
OMPI_LIBMPI = "/usr/lib/x86_64-linux-gnu/libmpi.so.40"
OMPI_MPIRUN = "/usr/bin/mpirun"
#: Tests not run on ``ucp`` and ``ref-ucx`` (counted as skips on both, and
#: listed in the output): their outcome is decided by a race inside MPICH.
#: MPICH's ``MPIR_Dist_graph_create_impl`` probes MPI_ANY_SOURCE, then
#: receives MPI_ANY_SOURCE with the probed count.  Under MPIR_CVAR_NOLOCAL a
#: rank's message to itself goes through MPICH's own shared memory and every
#: other through the netmod; the probe asks shm first, then the netmod, and a
#: self message that MPICH's shm progress has not yet taken in lets the probe
#: return a peer's message (netmod) while the receive then matches the self
#: message (shm): wrong in-degree, then errors or a hang in the tests after it.
#: conformance/mpi/mpich_race.py shows the disagreement on ucxpy's libucp (a
#: few times in a thousand); on the real UCX the same program hangs in its
#: first round, as MPICH's ANY_SOURCE-with-self tests do there.
#: MPICH's only (ucp, ref-ucx): ompi-ucp and ompi-ref run these tests (both
#: pass on both at 2 ranks, 2026-12-05).
MPICH_RACES = {
    "test_comm_topo": ("TestTopoWorld.testDistgraphcomm", "TestTopoWorldDup.testDistgraphcomm"),
}
#: Tests not run on ``ompi-ucp`` and ``ompi-ref`` (counted as skips on both,
#: and listed in the output): their outcome is decided by a bug of Open MPI
#: 4.1.4's osc/ucx and the heap's layout, not by the UCX under it.  Its
#: MPI_Win_attach/MPI_Win_detach (Open MPI 4.1's source) keep the attached regions sorted by a binary
#: search over [0, count] (one past the end), so for some address orders of
#: the attached buffers a detach leaves a region (or a stale entry) behind and
#: MPI_Win_free then ucp_mem_unmap's a handle already unmapped or NULL:
#: a segfault that ends the file's job (every later test an error).  Which
#: order MPI_Alloc_mem's buffers come in depends on the process's heap (the
#: libucp loaded changes it), so either side may crash; with the buffers in
#: descending order both do, on the system UCX too (README.md's snippet).
OPENMPI_BUGS = {
    "test_win": ("TestWinCreateDynamicSelf.testAttachDetach",
                 "TestWinCreateDynamicWorld.testAttachDetach"),
}


def fetch(version: str, cache: str) -> str:
    """Directory holding mpi4py-<version>/test, downloading the sdist if needed."""
    with locked(cache):
        return _fetch(version, cache)


def _fetch(version: str, cache: str) -> str:
    testdir = os.path.join(cache, f"mpi4py-{version}", "test")
    done = os.path.join(cache, f"mpi4py-{version}", ".extracted")
    if os.path.exists(done):
        return testdir
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
    open(done, "w").close()
    return testdir


def all_modules(testdir: str) -> list:
    return sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(testdir, "test_*.py")))


def mpiexec() -> str:
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep +
                       os.environ.get("PATH", ""))
    if exe is None:
        sys.exit("mpiexec not found (pip install mpich)")
    return exe


def command(impl, launcher, n, timeout, testdir, module, outdir, env=None):
    runner = [sys.executable, os.path.join(HERE, "runner.py"), impl, testdir, module, outdir]
    if impl == "shim" and launcher == "ucxpy-run":
        return [sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", str(n),
                "--timeout", str(timeout), *runner]
    if impl in OPENMPI_IMPLS:
        # Open MPI's launcher: it kills the job itself at --timeout (its
        # ranks are in process groups of their own, out of killpg's reach);
        # 2 cores here: more ranks need --oversubscribe.  ucx.command adds
        # the -x forwards of ucxpy-ucx's variables.
        from ucxpy.tools.ucx import command as ucx_command
        argv = [OMPI_MPIRUN, "-n", str(n), *(["--oversubscribe"] if n > 2 else []),
                "--timeout", str(timeout), *runner]
        return ucx_command(argv, env if env is not None else os.environ)
    return [mpiexec(), "-n", str(n), *runner]


def proof(folder: str, n: int, require_ops: bool = True) -> list:
    """Problems with the ``ucp`` job's reports in ``folder`` (empty: every
    one of its ``n`` ranks ran on ucxpy's libucp.so.0).  ``require_ops``:
    some rank counted an operation (its final report), which a job that
    crashed or was killed cannot give: ``ompi-ucp`` asks it only of a job
    that exited 0, as ``ucxpy-ucx --check`` does; its ranks' first reports
    (made with the worker) still name the libucp they mapped.

    At one rank ``check_reports``' "no rank counted an operation" cannot be
    met: MPICH's ch4 delivers a process's messages to itself without its
    netmod (50 1 MB Sendrecv to self: 0 libucp operations), so a lone rank
    never calls ucp_tag_send; its report (this libucp.so.0, a worker
    created and destroyed) is the proof there."""
    from ucxpy.tools.ucx import check_reports
    problems = check_reports(folder, n, require_ops=require_ops)
    if n == 1:
        problems = [p for p in problems if p != "no rank counted an operation"]
    return problems


def ucp_stamp() -> tuple:
    """Identity of the files a ``ucp`` (or ``ompi-ucp``) job runs (libucp.so.0, its bridge
    extension, the adapter): a job during which one was rebuilt is rerun."""
    from ucxpy.tools.ucx import LIBUCP
    files = [LIBUCP,
             os.path.join(ROOT, "ucxpy", "capi.py"),
             *glob.glob(os.path.join(ROOT, "ucxpy", "_ucp_bridge*.so"))]
    out = []
    for path in files:
        try:
            st = os.stat(path)
            out.append((path, st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((path, None))
    return tuple(out)


def libucp_identity(commit: bool = True) -> dict:
    """The libucp.so.0 a ``ucp`` run measures: its sha256 and the tree's commit."""
    import hashlib
    from ucxpy.tools.ucx import LIBUCP
    try:
        with open(LIBUCP, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        digest = ""
    out = {"path": os.path.realpath(LIBUCP), "sha256": digest}
    if commit:
        out["commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"],
                                       capture_output=True, text=True).stdout.strip()
    return out


def run_module(impl, launcher, testdir, module, n, timeout, outdir):
    """Run one file; returns (per-test state, exit code, hung, log tail,
    proof problems: ``ucp`` and ``ompi-ucp`` only)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if impl in MPICH_UCX_IMPLS and module in MPICH_RACES:
        env["CONFORMANCE_EXCLUDE"] = ",".join(f"{module}.{t}" for t in MPICH_RACES[module])
    if impl in OPENMPI_IMPLS and module in OPENMPI_BUGS:
        env["CONFORMANCE_EXCLUDE"] = ",".join(f"{module}.{t}" for t in OPENMPI_BUGS[module])
    if impl == "shim":
        env.setdefault("UCXPY_TLS", "self,shm,tcp")
        # the drop-in mpi4py for every process, spawned ones included
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "mpi_shim", "dropin"),
                                             env["PYTHONPATH"]])
    elif impl in OPENMPI_IMPLS:
        # the mpi4py wheel's MPI on Open MPI's library instead of MPICH's
        env["MPI4PY_LIBMPI"] = OMPI_LIBMPI
        if os.geteuid() == 0:       # Open MPI's mpirun refuses root without both
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    else:
        env.pop("MPI4PY_LIBMPI", None)
    report_dir = None
    if impl in UCX_IMPLS:
        from ucxpy.tools.ucx import environment
        env = environment(reference=impl in REFERENCE_IMPLS, base=env)
        env.pop("UCXPY_UCP_REPORT", None)
        if impl in LIBUCP_IMPLS:
            # a fresh directory per job: only this job's ranks report there
            report_dir = tempfile.mkdtemp(prefix="ucxpy-ucp-", dir=outdir)
            env["UCXPY_UCP_REPORT"] = report_dir
    cmd = command(impl, launcher, n, timeout, testdir, module, outdir, env)
    t0 = time.monotonic()
    # Open MPI's mpirun ends its ranks itself on SIGTERM: a few seconds for it
    # before the whole session is killed
    rc, log, _, killed = harness.run_job(cmd, timeout=timeout + 20, env=env, cwd=testdir,
                                         terminate_first=10 if impl in OPENMPI_IMPLS else 0)
    if killed:
        rc = "timeout"
    elapsed = time.monotonic() - t0
    keep = os.environ.get("CONFORMANCE_KEEP_LOGS")
    if keep:                            # (debugging: each job's whole log, not its tail)
        os.makedirs(keep, exist_ok=True)
        with open(os.path.join(keep, f"{impl}-{module}-{n}-{os.getpid()}-{int(t0)}.log"),
                  "wb") as f:
            f.write(log)
        if report_dir is not None:      # (and what each rank carried)
            import shutil
            shutil.copytree(report_dir, os.path.join(keep, f"reports-{module}-{n}-{int(t0)}"),
                            dirs_exist_ok=True)
    per_rank = []
    for r in range(n):
        try:
            with open(os.path.join(outdir, f"{module}.{r}.json")) as f:
                per_rank.append(json.load(f))
        except (OSError, ValueError):
            per_rank.append({})
    hung = rc == "timeout" or elapsed >= timeout      # killed by us or by the launcher
    # (a test still running when its job ended hung if the job was killed,
    # else its rank died in it; one a rank never got to is an error here)
    died = {"running": "hang" if hung else "error", "notrun": "error"}

    def state(rank: dict, test: str) -> str:
        s = rank.get(test, "notrun")
        return died.get(s, s)
    tests = {t: merged([state(d, t) for d in per_rank]) for t in sorted(set().union(*per_rank))}
    if not tests and rc != 0:
        tests["<import>"] = "hang" if hung else "error"
    problems = []
    if report_dir is not None:
        problems = proof(report_dir, n, require_ops=impl not in OPENMPI_IMPLS or rc == 0)
        if problems:
            # not carried by ucxpy on every rank: nothing it ran counts
            tests = {t: s if s == "hang" else "error" for t, s in (tests or {"<job>": "error"}).items()}
    return tests, rc, hung, log.decode(errors="replace")[-4000:], problems


def counts(tests: dict) -> dict:
    return harness.counts(tests.values(), STATES)


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


def verdict_exact(ours: dict, ref: dict | None, problems=()) -> str:
    """``ucp`` against ``ref-ucx``, by counts: HANG, PROOF (a rank not on
    ucxpy's libucp), OK (exactly the reference's counts, no failure), OK=REF
    (exactly the reference's counts, failures included), OK>REF (no failure
    and no more skips, where the reference failed or hung), SKIPS (no failure,
    more skips) or FAIL."""
    if ours["hang"]:            # killed: its ranks could not report their counts either
        return "HANG"
    if problems:
        return "PROOF"
    if ref is None:
        return "FAIL" if ours["fail"] or ours["error"] else "OK"
    if ours == ref:
        return "OK=REF" if ours["fail"] or ours["error"] else "OK"
    if ours["fail"] or ours["error"]:
        return "FAIL"
    return "SKIPS" if ours["skip"] > ref["skip"] else "OK>REF"


def _short(c):
    """pass/fail/error/skip/hang counts as 'p/f/e/s/h'."""
    return "/".join(str(c[k]) for k in STATES)


def _fmt(c):
    return f"{c['pass']:>5} {c['fail']:>4} {c['error']:>4} {c['skip']:>4} {c['hang']:>3}"


def regressions(results: dict, baseline: dict, impl: str = "shim") -> list:
    """Files whose ``impl`` counts are worse than the baseline's."""
    bad = []
    for key, base in baseline.get(impl, {}).items():
        now = results.get(impl, {}).get(key)
        if now is not None and harness.counts_worse(now["counts"], base["counts"],
                                                    than="the baseline"):
            bad.append((key, base["counts"], now["counts"]))
    return bad


def table(path: str, subject: str = "ucp", reference: str = "ref-ucx") -> str:
    """The side-by-side Markdown table of a ``--json`` file of a ``ucp`` (or
    ``ompi-ucp``: ``subject``) run: one row per file, per rank count its and
    the reference's pass/fail/error/skip/hang, the cells that differ in bold."""
    with open(path) as f:
        data = json.load(f)
    ours, ref = data.get(subject, {}), data.get(reference, {})
    nps = sorted({int(k.rsplit("@", 1)[1]) for k in ours})
    files = sorted({k.rsplit("@", 1)[0] for k in ours})
    head = "| file | " + " | ".join(f"np {n}: {subject} | {reference}" for n in nps) + " |"
    rows = [head, "|---|" + "---|---|" * len(nps)]
    cell = lambda c: "/".join(str(c[k]) for k in STATES)
    for module in files:
        cells = []
        for n in nps:
            a = ours.get(f"{module}@{n}", {}).get("counts")
            b = ref.get(f"{module}@{n}", {}).get("counts")
            ca, cb = (cell(a) if a else "-"), (cell(b) if b else "-")
            if a and b and a != b:
                ca = f"**{ca}**"
            cells += [ca, cb]
        rows.append(f"| {module} | " + " | ".join(cells) + " |")
    cells = []
    for n in nps:
        for side in (ours, ref):
            tot = dict.fromkeys(STATES, 0)
            for k, v in side.items():
                if k.endswith(f"@{n}"):
                    for st in STATES:
                        tot[st] += v["counts"][st]
            cells.append(cell(tot))
    rows.append("| total | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help="test files (default: all of them)")
    ap.add_argument("--np", default="1,2,3,4")
    ap.add_argument("--impl", default="shim,ref",
                    help="comma-separated: shim, ref (shim's reference), ucp (the mpi4py "
                         "wheel on ucxpy's libucp.so.0), ref-ucx (ucp's reference), "
                         "ompi-ucp (the mpi4py wheel on Open MPI over ucxpy's libucp.so.0), "
                         "ompi-ref (ompi-ucp's reference: Open MPI on the system UCX)")
    ap.add_argument("--launcher", default="ucxpy-run", choices=("ucxpy-run", "mpiexec"),
                    help="launcher of the shim runs (the others always use mpiexec)")
    ap.add_argument("--version", default=os.environ.get("MPI4PY_TEST_VERSION", DEFAULT_VERSION))
    ap.add_argument("--timeout", type=int, default=300, help="seconds per file and rank count")
    ap.add_argument("--cache", default=os.environ.get(
        "UCXPY_CONFORMANCE_CACHE", os.path.join(tempfile.gettempdir(), "ucxpy-conformance")))
    ap.add_argument("--json", help="write every per-test result here")
    snapshot.add_option(ap, "conformance-mpi")
    ap.add_argument("--baseline", help="fail only on regressions against this JSON baseline")
    ap.add_argument("-v", "--verbose", action="store_true", help="list failing tests")
    ap.add_argument("--table", metavar="JSON",
                    help="print the ucp/ref-ucx (and ompi-ucp/ompi-ref) Markdown table "
                         "of a --json file, and exit")
    args = ap.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            present = set(json.load(f))
        tables = [table(args.table, s, r) for s, r in PAIRS
                  if s != "shim" and s in present]
        print("\n\n".join(tables or [table(args.table)]))
        return 0
    impls = [i for i in args.impl.split(",") if i]
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        ap.error(f"unknown --impl {','.join(unknown)} (choose from {', '.join(IMPLS)})")
    for impl in impls:
        if impl in LIBUCP_IMPLS:
            from ucxpy.tools.ucx import LIBUCP
            if not os.path.exists(LIBUCP):
                sys.exit(f"--impl {impl}: {LIBUCP} is not built (needs libucx-dev at install)")
        if impl in OPENMPI_IMPLS:
            for path in (OMPI_LIBMPI, OMPI_MPIRUN):
                if not os.path.exists(path):
                    sys.exit(f"--impl {impl}: no {path} (Open MPI)")
    # the library measured (at the start: others may rebuild it in this tree)
    identity = {"libucp": libucp_identity()} if set(impls) & set(LIBUCP_IMPLS) else {}
    testdir = fetch(args.version, args.cache)
    modules = args.modules or all_modules(testdir)
    nps = [int(x) for x in args.np.split(",")]
    # the (implementation, reference) pairs to print: one row each per file and rank count
    pairs = [(s, r) for s, r in PAIRS if s in impls or r in impls]
    if "shim" in impls or "ref" in impls:
        print(f"mpi4py {args.version} test suite ({len(modules)} files): mpi_shim under "
              f"{args.launcher} vs the reference (mpi4py on the mpich wheel, mpiexec)")
        print(f"{'file':24} {'np':>2} | {'shim: pass fail  err skip hng':30} | "
              f"{'ref:  pass fail  err skip hng':30} | verdict")
    if "ucp" in impls or "ref-ucx" in impls:
        print(f"mpi4py {args.version} test suite ({len(modules)} files): the mpi4py wheel on "
              f"MPICH over ucxpy's libucp.so.0 (ucp) vs over the bundled UCX (ref-ucx); "
              f"MPICH's ch4:ucx for all traffic, mpiexec")
        print(f"{'file':24} {'np':>2} | {'ucp: pass fail  err skip hng':30} | "
              f"{'ref-ucx: pass fail err skip hng':30} | verdict")
        races = [f"{m}.{t}" for m, ts in MPICH_RACES.items() if m in modules for t in ts]
        if races:
            print(f"not run on either (counted as skips; a race inside MPICH, see run.py): "
                  f"{' '.join(races)}")
    if "ompi-ucp" in impls or "ompi-ref" in impls:
        print(f"mpi4py {args.version} test suite ({len(modules)} files): the mpi4py wheel on "
              f"Open MPI ({OMPI_LIBMPI}) over ucxpy's libucp.so.0 (ompi-ucp) vs over the "
              f"system UCX (ompi-ref); Open MPI's UCX components, {OMPI_MPIRUN}")
        print(f"{'file':24} {'np':>2} | {'ompi-ucp: pass fail err skip hng':30} | "
              f"{'ompi-ref: pass fail err skip hng':30} | verdict")
        bugs = [f"{m}.{t}" for m, ts in OPENMPI_BUGS.items() if m in modules for t in ts]
        if bugs:
            print(f"not run on either (counted as skips; a bug of Open MPI's osc/ucx, see "
                  f"run.py): {' '.join(bugs)}")
    results = {i: {} for i in impls}
    verdicts = {s: {} for s, _ in pairs if s in impls}
    rows: list = []      # the per-file table of the snapshot
    for module in modules:
        if not os.path.exists(os.path.join(testdir, module + ".py")):
            print(f"{module:24} (not in this mpi4py release)")
            continue
        for n in nps:
            key = f"{module}@{n}"
            line = {}
            for impl in impls:
                for attempt in range(2):
                    t0 = time.monotonic()
                    stamp = ucp_stamp() if impl in LIBUCP_IMPLS else None
                    with tempfile.TemporaryDirectory() as outdir:
                        tests, rc, hung, log, problems = run_module(
                            impl, args.launcher, testdir, module, n, args.timeout, outdir)
                    if stamp is None or stamp == ucp_stamp() or attempt:
                        break
                    # others rebuild the library in this tree: what ran was neither
                    print(f"{module} @{n}: libucp.so.0 or its bridge changed during the "
                          f"job; running it again", flush=True)
                c = counts(tests)
                results[impl][key] = {"counts": c, "tests": tests, "rc": str(rc)}
                if impl in UCX_IMPLS:
                    results[impl][key]["seconds"] = round(time.monotonic() - t0, 1)
                if impl in LIBUCP_IMPLS:
                    results[impl][key]["proof"] = problems
                    results[impl][key]["libucp"] = libucp_identity(commit=False)["sha256"][:12]
                line[impl] = (c, tests, rc, log, problems)
            for subject, reference in pairs:
                mine, ref = line.get(subject), line.get(reference)
                if mine is None:
                    v = "-"
                elif subject == "shim":
                    v = verdict(mine[0], ref[0] if ref else None)
                else:
                    v = verdict_exact(mine[0], ref[0] if ref else None, mine[4])
                if mine is not None:
                    verdicts[subject][key] = v
                    rows.append({"file": module, "ranks": n, "subject": subject,
                                 "ours": _short(mine[0]),
                                 "reference": f"{reference} {_short(ref[0])}" if ref else "",
                                 "verdict": v})
                tag = f" ({subject})" if len(pairs) > 1 else ""
                print(f"{module:24} {n:>2} | " +
                      (f"     {_fmt(mine[0])}" if mine else " " * 30) + "  | " +
                      (f"     {_fmt(ref[0])}" if ref else " " * 30) + f"  | {v}{tag}",
                      flush=True)
                if args.verbose and mine and not v.startswith("OK"):
                    for msg in mine[4]:
                        print(f"      proof: {msg}")
                    for t, s in mine[1].items():
                        if s not in ("pass", "skip"):
                            print(f"      {s:5} {t}")
                    if ref and subject != "shim":
                        # the tests whose outcome differs from the reference's
                        for t in sorted(set(mine[1]) | set(ref[1])):
                            a, b = mine[1].get(t, "-"), ref[1].get(t, "-")
                            if a != b and a not in ("fail", "error", "hang"):
                                print(f"      {a:5} {t} ({reference}: {b})")
                    if not any(s not in ("pass", "skip") for s in mine[1].values()) or \
                            "<import>" in mine[1] or mine[4]:
                        print("      " + mine[3][-2000:].replace("\n", "\n      "))
    for subject, verd in verdicts.items():
        tot = dict.fromkeys(STATES, 0)
        for r in results[subject].values():
            for k in STATES:
                tot[k] += r["counts"][k]
        ok = sum(1 for v in verd.values() if v.startswith("OK"))
        print(f"TOTAL {subject}: {ok}/{len(verd)} file runs OK; tests " +
              ", ".join(f"{k} {tot[k]}" for k in STATES))
        hangs = sorted(k for k, v in verd.items() if v == "HANG")
        if hangs:
            print("HANGS:" if subject == "shim" else f"HANGS ({subject}):", " ".join(hangs))
    for subject, reference in pairs:
        if subject != "shim" and reference in results and subject in results:
            tot = dict.fromkeys(STATES, 0)
            for r in results[reference].values():
                for k in STATES:
                    tot[k] += r["counts"][k]
            print(f"TOTAL {reference}: tests " + ", ".join(f"{k} {tot[k]}" for k in STATES))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"version": args.version, "launcher": args.launcher, **identity, **results},
                      f, indent=1, sort_keys=True)
    snapshot.save(args, {"version": args.version, "launcher": args.launcher, **identity,
                         "columns": "pass/fail/error/skip/hang", "rows": rows,
                         "totals": {impl: {k: sum(r["counts"][k] for r in per.values())
                                           for k in STATES} for impl, per in results.items()}})
    if args.baseline:
        with open(args.baseline) as f:
            baseline = json.load(f)
        bad = [f"{key}{'' if subject == 'shim' else f' ({subject})'}: baseline {b} now {c}"
               for subject in verdicts for key, b, c in regressions(results, baseline, subject)]
        harness.report(bad)
        return 1 if bad else 0
    return 0 if all(v.startswith("OK") for verd in verdicts.values() for v in verd.values()) \
        else 1


if __name__ == "__main__":
    sys.exit(main())

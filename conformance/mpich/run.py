"""Conformance: MPICH's own C test suite (test/mpi) on ucxpy's libucp, beside the real UCX.

Fetches Debian 12's ``mpich`` source package (4.0.2) at run time with
``apt-get source --download-only`` through a private, temporary apt
configuration (nothing on the system changes, nothing is committed), extracts
``test/mpi`` from the upstream tarball into a cache directory, configures it
with the ``mpich`` wheel's ``mpicc`` and builds the programs of the selected
directories there (make is incremental: the builds stay cached per directory).

Every test line of the directories' ``testlist`` files then runs twice, with
the same binary:

* ``ours``:      ``ucxpy-ucx --check --ranks NP mpiexec -n NP ./prog ARGS``
  (MPICH's ch4:ucx on ucxpy's libucp.so.0; every rank must report it);
* ``reference``: ``ucxpy-ucx --reference mpiexec -n NP ./prog ARGS``
  (the same MPICH on the bundled real UCX).

A run's outcome follows MPICH's ``runtests`` script: it passes when it exits
0, prints " No Errors" once and nothing else but "Test Passed" lines (stdout
and stderr together); ``resultTest=TestStatus|TestErrFatal|TestStatusNoErrors``
lines need a non-zero exit instead.  As under runtests, mpiexec gets the time
limit (``--timeout``, default 60 s, or the line's ``timeLimit=``) as
``MPIEXEC_TIMEOUT`` and ends the job itself; a job it ends that way, or that
is still there 15 s later (then killed with its whole process tree), is a
``timeout`` (the worst outcome).  A run of ours whose ``--check`` fails is a
``fail`` (``check_only`` in the results when the program itself passed).
Lines asking for more than ``--maxnp`` (4) ranks, ``xfail=`` lines (MPICH's
default; ``--xfail`` runs them) and ``mem=`` beyond the machine are skipped and
counted.  ``basic/`` has no testlist: see BASIC_LIST.

Results: ``conformance/mpich/results/<dir>.json`` (every run's outcome,
reason, seconds, and the output tail of a non-pass), written after each test.

Usage: python conformance/mpich/run.py [--dirs a,b] [--tests PATTERN]
       [--subset ci] [--resume [--retry worse|failed]] [--budget SECONDS]
       [--timeout 60] [--maxnp 4] [--impl ours,reference] [--baseline FILE]
       [--write-baseline FILE] [--results DIR] [--cache DIR] [--list] [--report]
Exit status: 0 when no test of ours does worse than the reference (pass <
fail < timeout); with ``--baseline``, when no test of ours does worse than the
baseline records.  2: the suite could not be fetched or built.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import fnmatch
import glob
import json
import os
import re
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
from conformance.harness import load, locked, save  # noqa: E402
from ucxpy.tools.ucx import LIBUCP  # noqa: E402

VERSION = "4.0.2"
DEB_VERSION = "4.0.2-3"            # Debian 12 (bookworm)
SUITE = "bookworm"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
DEFAULT_DIRS = ("attr basic coll comm datatype errhan group info init io part pt2pt rma "
                "session spawn threads topo").split()
IMPLS = ("ours", "reference")
OUTCOMES = ("pass", "fail", "timeout")     # (their order: conformance.harness.RANK)

# The CI subset: small pt2pt, collective and RMA tests at 2-4 ranks (ids as
# printed by --list).
CI_SUBSET = (
    "pt2pt/sendrecv2 2", "pt2pt/anyall 2", "pt2pt/eagerdt 2", "pt2pt/isendrecv 4",
    "pt2pt/mprobe 2", "pt2pt/huge_underflow 2", "pt2pt/icsend 4",
    "coll/allred 4 arg=-count=10", "coll/allredmany 4", "coll/bcasttest 4", "coll/redscat 4",
    "coll/scantst 4", "coll/nonblocking 4", "coll/ibarrier 2 timeLimit=30",
    "rma/test1 2", "rma/accfence2 4", "rma/lockcontention 3", "rma/getgroup 4",
    "rma/putfidx 4", "rma/winname 2",
)

# basic/ has no testlist (MPICH's top-level list comments it out) and its
# programs print no " No Errors": this list runs them (self at 1 rank: it
# sends to rank 0 only) and asks only for exit status 0 (netpipe and adapt are
# benchmarks, not run).
BASIC_LIST = ["self 1 resultTest=ExitZero", "simple 2 resultTest=ExitZero",
              "sendrecv 2 resultTest=ExitZero", "srtest 2 resultTest=ExitZero",
              "wtime 2 resultTest=ExitZero", "patterns 2 resultTest=ExitZero"]


class FetchError(Exception):
    """The suite could not be configured or built."""


class DownloadError(FetchError):
    """apt-get could not fetch the source package (no network, no apt)."""


def log(msg):
    print(msg, flush=True)


def venv_bin(name: str) -> str:
    """A tool of this environment (the mpich wheel's, ucxpy's), or of PATH."""
    for d in (os.path.dirname(sys.executable), *os.environ.get("PATH", "").split(os.pathsep)):
        p = os.path.join(d, name)
        if d and os.access(p, os.X_OK):
            return p
    raise FetchError(f"{name} not found (pip install mpich / pip install -e .)")


# --- fetching the suite ----------------------------------------------------

def _deb_src_line() -> str:
    """A bookworm deb-src line for main, from the system's Debian sources
    (one-line sources.list or deb822 .sources), else deb.debian.org."""
    uris = []
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        with contextlib.suppress(OSError), open(path) as f:
            for line in f:
                words = re.sub(r"\[[^]]*\]", "", line.split("#")[0]).split()
                if len(words) >= 3 and words[0] in ("deb", "deb-src") and words[2] == SUITE:
                    uris.append(words[1])
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        with contextlib.suppress(OSError), open(path) as f:
            text = f.read()
        for stanza in re.split(r"\n\s*\n", text):
            fields = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.split()
            if SUITE in fields.get("suites", []) and fields.get("enabled", ["yes"]) != ["no"]:
                uris += fields.get("uris", [])
    uri = next((u for u in uris if "security" not in u), "http://deb.debian.org/debian")
    if not os.path.exists(KEYRING):
        raise DownloadError(f"{KEYRING} missing (apt-get install debian-archive-keyring)")
    return f"deb-src [signed-by={KEYRING}] {uri} {SUITE} main\n"


def _apt(cache: str, *args, timeout=600) -> None:
    apt = os.path.join(cache, "apt")
    for d in ("lists/partial", "cache/archives/partial"):
        os.makedirs(os.path.join(apt, d), exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".list", prefix="ucxpy-mpich-src-") as f:
        f.write(_deb_src_line())
        f.flush()
        opts = ["-o", f"Dir::Etc::SourceList={f.name}", "-o", "Dir::Etc::SourceParts=/dev/null",
                "-o", f"Dir::State::Lists={apt}/lists", "-o", f"Dir::Cache={apt}/cache",
                "-o", "Dir::State::status=/dev/null",
                "-q"]
        if os.getuid() == 0:        # the downloads land in a directory _apt may not reach
            opts += ["-o", "APT::Sandbox::User=root"]
        try:
            r = subprocess.run(["apt-get", *opts, *args], cwd=os.path.join(apt, ".."),
                               capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.SubprocessError) as e:
            raise DownloadError(f"apt-get {args[0]}: {e}") from None
    if r.returncode:
        raise DownloadError(f"apt-get {' '.join(args)} failed:\n"
                            f"{r.stdout[-2000:]}{r.stderr[-2000:]}")


def fetch(cache: str) -> str:
    """The directory holding the upstream tarball's test/mpi, extracted
    into ``cache`` (downloaded with apt-get source if needed)."""
    top = os.path.join(cache, f"mpich-{VERSION}")
    testdir = os.path.join(top, "test", "mpi")
    if os.path.exists(os.path.join(top, ".extracted")):
        return testdir
    src = os.path.join(cache, "src")
    orig = os.path.join(src, f"mpich_{VERSION}.orig.tar.xz")
    if not os.path.exists(orig):
        if not shutil.which("apt-get"):
            raise DownloadError("no apt-get on this machine")
        log(f"fetching Debian's mpich {DEB_VERSION} source package (apt-get source) ...")
        _apt(cache, "update")
        os.makedirs(src, exist_ok=True)
        _apt(cache, "source", "--download-only", f"mpich={DEB_VERSION}")
        # apt-get source downloads into the current directory: cache/
        for p in glob.glob(os.path.join(cache, f"mpich_{VERSION}*")):
            os.replace(p, os.path.join(src, os.path.basename(p)))
        if not os.path.exists(orig):
            raise DownloadError(f"apt-get source left no {os.path.basename(orig)}")
    shutil.rmtree(top, ignore_errors=True)
    prefix = f"mpich-{VERSION}/test/mpi/"
    with tarfile.open(orig) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(cache, members=members, filter="tar")
    open(os.path.join(top, ".extracted"), "w").close()
    return testdir


# --- configuring and building ----------------------------------------------

def _stamp() -> dict:
    mpicc = venv_bin("mpicc")
    show = subprocess.run([mpicc, "-show"], capture_output=True, text=True).stdout.strip()
    ver = subprocess.run([venv_bin("mpichversion")], capture_output=True, text=True).stdout
    return {"mpicc": mpicc, "show": show, "mpich": ver.splitlines()[0] if ver else "",
            "configure": configure_args()}


def configure_args() -> list:
    return [f"CC={venv_bin('mpicc')}", f"MPICC={venv_bin('mpicc')}",
            f"MPIEXEC={venv_bin('mpiexec')}", "--disable-fortran", "--disable-cxx",
            "--enable-threads=multiple"]


def configure(cache: str, testdir: str) -> None:
    """Configure test/mpi with the wheel's compilers and build its helper
    libraries (util, dtpools); redone from a fresh tree when MPICH changes."""
    marker = os.path.join(testdir, ".ucxpy-configured")
    stamp = _stamp()
    with contextlib.suppress(OSError, ValueError), open(marker) as f:
        if json.load(f) == stamp:
            return
    if os.path.exists(os.path.join(testdir, "config.status")):
        log("MPICH or its compiler changed: re-extracting the suite")
        os.remove(os.path.join(os.path.dirname(os.path.dirname(testdir)), ".extracted"))
        testdir = fetch(cache)
    log(f"configuring MPICH {VERSION} test/mpi with {stamp['mpicc']} ...")
    logfile = os.path.join(cache, "configure.log")
    with open(logfile, "w") as out:
        for cmd in (["./configure", *stamp["configure"]], ["make", "-j2", "-C", "util"],
                    ["make", "-j2", "-C", "dtpools"]):
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            r = subprocess.run(cmd, cwd=testdir, stdout=out, stderr=subprocess.STDOUT,
                               timeout=1800)
            if r.returncode:
                raise FetchError(f"{' '.join(cmd)} failed in {testdir}: see {logfile}")
    with open(marker, "w") as f:
        json.dump(stamp, f)


def build(testdir: str, cache: str, entries: list) -> None:
    """make -k the programs of ``entries`` (their ``built`` flag is set)."""
    by_dir = {}
    for e in entries:
        by_dir.setdefault(e["cwd"], set()).add(e["exe"])
    logdir = os.path.join(cache, "build-logs")
    os.makedirs(logdir, exist_ok=True)
    for cwd, progs in sorted(by_dir.items()):
        missing = sorted(p for p in progs if not os.access(os.path.join(cwd, p), os.X_OK))
        if missing:
            rel = os.path.relpath(cwd, testdir)
            log(f"building {len(missing)} programs in {rel} ...")
            with open(os.path.join(logdir, rel.replace("/", "_") + ".log"), "a") as out:
                subprocess.run(["make", "-k", "-j2", *missing], cwd=cwd, stdout=out,
                               stderr=subprocess.STDOUT, timeout=3600)
    for e in entries:
        e["built"] = os.access(os.path.join(e["cwd"], e["exe"]), os.X_OK)


# --- the testlists -----------------------------------------------------------

def _mpi_version() -> tuple:
    inc = os.path.join(os.path.dirname(os.path.dirname(venv_bin("mpicc"))), "include", "mpi.h")
    with contextlib.suppress(OSError), open(inc) as f:
        text = f.read()
        m, s = (re.search(rf"#define\s+MPI_{k}\s+(\d+)", text) for k in ("VERSION", "SUBVERSION"))
        if m and s:
            return int(m.group(1)), int(s.group(1))
    return (4, 0)


def _mem_total_gb() -> float:
    """runtests' memory budget (MPITEST_MEMORY_TOTAL, default 20 GB), capped
    at this machine's memory."""
    total = float(os.environ.get("MPITEST_MEMORY_TOTAL", 20))
    with contextlib.suppress(OSError, ValueError):
        total = min(total, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    return total


def parse_testlist(testdir: str, rel: str, lines, opts) -> tuple:
    """(entries, skipped) of one directory's testlist lines, recursing into
    directory entries the way runtests does (same list file name)."""
    entries, skipped = [], []
    mpiver = _mpi_version()
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("!"):          # !dir:target, support built first
            d, _, target = line[1:].partition(":")
            subprocess.run(["make", target], cwd=os.path.join(testdir, rel, d),
                           capture_output=True, timeout=1800)
            continue
        words = line.split()
        prog, np_ = words[0], (words[1] if len(words) > 1 else "2")
        path = os.path.join(testdir, rel, prog)
        if os.path.isdir(path):
            sub = os.path.join(rel, prog)
            e, s = read_dir(testdir, sub, opts)
            entries += e
            skipped += s
            continue
        t = {"args": [], "envs": [], "mpiexecargs": []}
        for w in words[2:]:
            if "=" not in w:
                continue                 # runtests ignores words without '='
            k, v = w.split("=", 1)
            if k in ("resultTest", "timeLimit", "xfail", "lock", "mem", "strict", "mpix",
                     "mpiversion", "init"):
                t[k] = v
            elif k == "arg":
                t["args"].append(v)
            elif k == "env":
                t["envs"].append(v)
            elif k == "mpiexecarg":
                t["mpiexecargs"].append(v)
            else:
                print(f"warning: unknown key {k} in {rel}/testlist", file=sys.stderr)
        tid = f"{rel}/{' '.join([prog, np_] + [w for w in words[2:] if '=' in w])}"
        np_ = int(np_) if np_.isdigit() else 2
        sub, exe = os.path.split(prog)
        entry = {"id": tid, "dir": rel.split("/")[0], "np": np_, "exe": exe,
                 "cwd": os.path.normpath(os.path.join(testdir, rel, sub)), **t}
        why = None
        if t.get("strict", "").lower() == "false" and opts.strict:
            why = "non-strict"
        elif t.get("xfail") and not opts.xfail:
            why = "xfail"
        elif np_ > opts.maxnp:
            why = f"np>{opts.maxnp}"
        elif t.get("mem") and float(t["mem"]) > _mem_total_gb():
            why = "mem"
        elif t.get("mpiversion"):
            want = tuple(int(x) for x in re.findall(r"\d+", t["mpiversion"])[:2])
            if want > mpiver:
                why = "mpiversion"
        if why:
            skipped.append({"id": tid, "why": why})
        else:
            entries.append(entry)
    return entries, skipped


def read_dir(testdir: str, rel: str, opts) -> tuple:
    path = os.path.join(testdir, rel)
    if rel == "basic" and os.path.isdir(path):
        return parse_testlist(testdir, rel, BASIC_LIST, opts)
    listfile = os.path.join(path, "testlist")
    if not os.path.exists(listfile):
        return [], []
    with open(listfile) as f:
        return parse_testlist(testdir, rel, f.read().splitlines(), opts)


def unique_ids(entries: list) -> None:
    seen = {}
    for e in entries:
        n = seen[e["id"]] = seen.get(e["id"], 0) + 1
        if n > 1:
            e["id"] += f" #{n}"


def select(entries: list, pattern: str | None, subset: str | None) -> list:
    if subset == "ci":
        entries = [e for e in entries if e["id"] in CI_SUBSET]
    if pattern:
        glob_ = any(c in pattern for c in "*?[")
        entries = [e for e in entries
                   if (fnmatch.fnmatch(e["id"], pattern) if glob_ else pattern in e["id"])]
    return entries


# --- running -----------------------------------------------------------------

NOERR = re.compile(r"^\s*No [Ee]rrors\s*$")
PASSED = re.compile(r"^\s*Test Passed\s*$")


def judge(output: str, rc: int, result_test: str | None) -> tuple:
    """(passed, reason): runtests' verdict on one run."""
    lines = [ln for ln in output.splitlines() if "FORTRAN STOP" not in ln]
    if result_test in ("TestStatus", "TestErrFatal"):
        return (rc != 0, "" if rc else "exit 0 where a non-zero status is required")
    if result_test == "ExitZero":                     # basic/ (ours, see BASIC_LIST)
        return (rc == 0, "" if rc == 0 else f"exit {rc}")
    found, unexpected = False, None
    for ln in lines:
        if result_test == "TestStatusNoErrors":
            found = found or bool(NOERR.match(ln))
            if not NOERR.match(ln) and not PASSED.match(ln) and unexpected is None:
                unexpected = ln
            continue
        if NOERR.match(ln) and not found:
            found = True
        elif re.match(r"^srun: error: .*: signal: Communication connection failure", ln):
            pass
        elif not (PASSED.match(ln) or re.search(r"(requesting checkpoint|checkpoint completed)\s*$",
                                                 ln)):
            unexpected = ln if unexpected is None else unexpected
    if unexpected is not None:
        return False, f"unexpected output: {unexpected.strip()[:160]}"
    if not found:
        return False, "no ' No Errors'"
    if result_test == "TestStatusNoErrors":
        return (rc != 0, "" if rc else "exit 0 where a non-zero status is required")
    if rc:
        return False, (f"signal {-rc}" if rc < 0 else f"exit {rc}")
    return True, ""


def command(impl: str, e: dict) -> list:
    ucx = venv_bin("ucxpy-ucx")
    job = [venv_bin("mpiexec"), "-n", str(e["np"]), *e["mpiexecargs"], "./" + e["exe"],
           *e["args"]]
    if impl == "ours":
        return [ucx, "--check", "--ranks", str(e["np"]), *job]
    return [ucx, "--reference", *job]


HYDRA_TIMEOUT = "APPLICATION TIMED OUT"
NONZERO_TESTS = ("TestStatus", "TestErrFatal", "TestStatusNoErrors")
GRACE = 15        # seconds after hydra's own timeout before the whole tree is killed


def run_one(impl: str, e: dict, timeout: float, logdir: str) -> dict:
    env = dict(os.environ)
    # as runtests: mpiexec (hydra) ends the job after the time limit itself
    # (init/timeout relies on it); the runner kills what is left GRACE s later
    env["MPIEXEC_TIMEOUT"] = str(int(timeout))
    for kv in e["envs"]:
        k, _, v = kv.partition("=")
        env[k] = v
    # a private TMPDIR, removed afterwards: what a killed job leaves there
    # (ucxpy-ucx --check's report folder among others) goes with it
    env["TMPDIR"] = tmp = tempfile.mkdtemp(prefix="ucxpy-mpich-run-")
    cmd = command(impl, e)
    t0 = time.monotonic()
    with tempfile.TemporaryFile(dir=logdir) as out, contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, True)
        rc, _, _, _ = harness.run_job(cmd, timeout=timeout + GRACE, env=env, cwd=e["cwd"],
                                      stdout=out)
        secs = round(time.monotonic() - t0, 2)
        out.seek(0)
        output = out.read().decode(errors="replace")
    res = {"rc": rc, "secs": secs}
    if rc is None:
        res.update(outcome="timeout", reason=f"killed after {timeout + GRACE:g} s")
    elif HYDRA_TIMEOUT in output and e.get("resultTest") not in NONZERO_TESTS:
        res.update(outcome="timeout", reason=f"mpiexec's timeout ({timeout:g} s)")
    else:
        lines = output.splitlines()
        checks = [ln for ln in lines if ln.startswith("ucxpy-ucx --check:")]
        if impl == "ours" and checks:
            # the program's own verdict, without ucxpy-ucx's lines and its exit 3
            rest = "\n".join(ln for ln in lines if not ln.startswith("ucxpy-ucx --check:"))
            ok, _ = judge(rest, 0 if rc == 3 else rc, e.get("resultTest"))
            res["check_only"] = ok               # the program itself passed
            ok, why = False, "check: " + checks[0][len("ucxpy-ucx --check:"):].strip()
        else:
            ok, why = judge(output, rc, e.get("resultTest"))
        res.update(outcome="pass" if ok else "fail", reason=why)
    if res["outcome"] != "pass":
        res["output"] = output[-3000:]
    return res


# --- results -------------------------------------------------------------------

def results_path(results: str, d: str) -> str:
    return os.path.join(results, f"{d}.json")


def worse(t: dict) -> bool:
    o, r = t.get("ours"), t.get("reference")
    return bool(o and r and harness.worse(o["outcome"], r["outcome"]))


def retry(how: str | None, t: dict) -> bool:
    """Whether --retry runs the recorded test ``t`` again."""
    if how == "worse":
        return worse(t)
    if how == "failed":
        return t.get("ours", {}).get("outcome", "pass") != "pass"
    return False


#: the columns of the per-directory table (summarize)
SUMMARY_HEAD = ("dir", "tests", "skipped", "ours p/f/t", "reference p/f/t", "worse",
                "check-only")


def summarize(dirs: list, data: dict, show_missing: bool = True) -> tuple:
    """Print the per-directory table; returns (rows, worse tests)."""
    head = SUMMARY_HEAD
    rows, bad = [], []
    tot = {"tests": 0, "skipped": 0, "ours": [0, 0, 0], "reference": [0, 0, 0], "worse": 0,
           "check": 0}
    for d in dirs:
        res = data.get(d)
        if res is None:
            if show_missing:
                rows.append((f"{d} (not run)", "-", "-", "-", "-", "-", "-"))
            continue
        tests = res["tests"]
        counts = {}
        for impl in IMPLS:
            c = harness.counts((t[impl]["outcome"] for t in tests.values() if impl in t),
                               OUTCOMES)
            counts[impl] = c = list(c.values())
            tot[impl] = [a + b for a, b in zip(tot[impl], c)]
        w = [tid for tid, t in tests.items() if worse(t)]
        bad += [(tid, tests[tid]) for tid in w]
        sk = {}
        for s in res["skipped"]:
            sk[s["why"]] = sk.get(s["why"], 0) + 1
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(sk.items())) or "0"
        if res.get("note"):
            skipped = res["note"]
        tot["tests"] += len(tests)
        tot["skipped"] += len(res["skipped"])
        tot["worse"] += len(w)
        check = sum(1 for t in tests.values() if t.get("ours", {}).get("check_only"))
        tot["check"] += check
        rows.append((d + ("" if res.get("complete") else " (partial)"), str(len(tests)), skipped,
                     "/".join(map(str, counts["ours"])), "/".join(map(str, counts["reference"])),
                     str(len(w)), str(check)))
    rows.append(("total", str(tot["tests"]), str(tot["skipped"]), "/".join(map(str, tot["ours"])),
                 "/".join(map(str, tot["reference"])), str(tot["worse"]), str(tot["check"])))
    print()
    print(harness.text_table(head, rows, left=3))
    print("(p/f/t: pass/fail/timeout; worse: tests where ours does worse than the reference;\n"
          " check-only: ours failed only because ucxpy-ucx --check did, the program passed)")
    return rows, bad


def markdown_table(rows: list) -> str:
    return harness.markdown_table(
        ("dir", "tests", "skipped", "ours pass/fail/timeout", "reference pass/fail/timeout",
         "ours worse", "ours failed --check only"), rows)


def report_worse(bad: list) -> None:
    if bad:
        print("\ntests where ours does worse than the reference:")
        for tid, t in bad:
            o, r = t["ours"], t["reference"]
            print(f"  {tid}: ours {o['outcome']} ({o.get('reason', '')}), reference {r['outcome']}")


def check_baseline(data: dict, baseline_file: str, selected: set) -> int:
    """Regressions of ours against the baseline's recorded outcomes (the
    baseline's tests outside this run's selection are left out)."""
    with open(baseline_file) as f:
        base = json.load(f)["tests"]
    got = {tid: t for res in data.values() for tid, t in res["tests"].items()}
    if set(base) - selected:
        print(f"note: {len(set(base) - selected)} tests of the baseline are not selected")
    base = {tid: want for tid, want in base.items() if tid in selected}
    ours = {tid: t["ours"]["outcome"] for tid, t in got.items() if "ours" in t}
    bad, better, new = harness.compare(ours, {tid: w["ours"] for tid, w in base.items()})
    harness.report(
        [f"{tid}: " + (f"ours {now} ({got[tid]['ours'].get('reason', '')}), baseline {was}"
                       if tid in ours else f"not run (baseline: ours {was})")
         for tid, now, was in bad],
        [f"{tid}: ours {now}, baseline {was}" for tid, now, was in better])
    for tid, want in base.items():
        r = got.get(tid, {}).get("reference")
        if r and want.get("reference") and r["outcome"] != want["reference"]:
            print(f"note       {tid}: reference {r['outcome']}, baseline {want['reference']}")
    for tid in new:
        print(f"note       {tid}: not in the baseline")
    print(f"baseline {os.path.relpath(baseline_file, ROOT)}: {len(base)} tests, "
          f"{len(bad)} regressions")
    return len(bad)


def write_baseline(data: dict, path: str) -> None:
    tests = {}
    for res in data.values():
        for tid, t in res["tests"].items():
            tests[tid] = {impl: t[impl]["outcome"] for impl in IMPLS if impl in t}
            if "ours" in t and t["ours"]["outcome"] != "pass":
                tests[tid]["ours_reason"] = t["ours"].get("reason", "")
    with open(path, "w") as f:
        json.dump({"suite": f"mpich {VERSION} test/mpi (Debian {DEB_VERSION})",
                   "date": datetime.date.today().isoformat(), "tests": tests}, f, indent=1)
        f.write("\n")
    print(f"wrote {path} ({len(tests)} tests)")


# --- main ------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dirs", help="directories of test/mpi, comma-separated (default: "
                   + ",".join(DEFAULT_DIRS) + "; with --subset ci, the subset's)")
    p.add_argument("--tests", help="run tests whose id contains PATTERN (or matches a glob)")
    p.add_argument("--subset", choices=["ci"], help="the fixed CI subset")
    p.add_argument("--resume", action="store_true",
                   help="keep the recorded results of directories (and tests) already run")
    p.add_argument("--retry", choices=["worse", "failed"],
                   help="with --resume: run again the recorded tests where ours did worse "
                   "than the reference, or did not pass (after a fix of libucp)")
    p.add_argument("--timeout", type=float, default=60, help="seconds per run (timeLimit= wins)")
    p.add_argument("--maxnp", type=int, default=4)
    p.add_argument("--impl", default=",".join(IMPLS), help="ours,reference")
    p.add_argument("--xfail", action="store_true", help="run xfail= lines too")
    p.add_argument("--strict", action="store_true", help="skip strict=false lines")
    p.add_argument("--baseline", help="fail only on regressions of ours versus this file")
    p.add_argument("--write-baseline", metavar="FILE", help="record the outcomes as a baseline")
    p.add_argument("--results", help="results directory (default conformance/mpich/results, "
                   "with --subset ci its ci/ subdirectory)")
    p.add_argument("--cache", default=os.environ.get(
        "UCXPY_MPICH_TESTS_CACHE", os.path.expanduser("~/.cache/ucxpy/mpich-tests")))
    p.add_argument("--list", action="store_true", help="list the selected tests and exit")
    p.add_argument("--build-only", action="store_true",
                   help="fetch, configure and build the selected tests, run none (make test "
                        "does so before its workers start)")
    p.add_argument("--report", action="store_true",
                   help="print the table of the recorded results only (runs nothing)")
    p.add_argument("--budget", type=float, default=0,
                   help="start no test after this many seconds (the directory stays partial)")
    p.add_argument("--markdown", action="store_true", help="also print the table as markdown")
    p.add_argument("-v", "--verbose", action="store_true", help="print every run")
    snapshot.add_option(p, "conformance-mpich")
    opts = p.parse_args(argv)
    impls = [i for i in opts.impl.split(",") if i]
    if set(impls) - set(IMPLS):
        p.error(f"--impl: {', '.join(IMPLS)}")
    if opts.dirs:
        dirs = [d for d in opts.dirs.split(",") if d]
    elif opts.subset == "ci":
        dirs = [d for d in DEFAULT_DIRS if any(t.startswith(d + "/") for t in CI_SUBSET)]
    else:
        dirs = list(DEFAULT_DIRS)
    cache = os.path.abspath(opts.cache)
    results = opts.results or os.path.join(HERE, "results", *(["ci"] if opts.subset else []))
    os.makedirs(results, exist_ok=True)
    logdir = os.path.join(cache, "run-logs")
    if opts.report:
        data = {d: r for d in dirs if (r := load(results_path(results, d)))}
        rows, bad = summarize(dirs, data)
        if opts.markdown:
            print()
            print(markdown_table(rows))
        report_worse(bad)
        return 1 if bad else 0
    if "ours" in impls and not os.path.exists(LIBUCP):
        print("ucxpy/lib/libucp.so.0 is not built (make install with libucx-dev)", file=sys.stderr)
        return 2

    try:
        with locked(cache):
            testdir = fetch(cache)
            configure(cache, testdir)
            plan = {}
            for d in dirs:
                entries, skipped = read_dir(testdir, d, opts)
                unique_ids(entries)
                entries = select(entries, opts.tests, opts.subset)
                skipped = [s for s in skipped if select([s], opts.tests, opts.subset)]
                plan[d] = (entries, skipped)
            if opts.list:
                for d, (entries, skipped) in plan.items():
                    for e in entries:
                        print(e["id"])
                    for s in skipped:
                        print(f"{s['id']}    [skipped: {s['why']}]")
                return 0
            todo = [e for entries, _ in plan.values() for e in entries]
            build(testdir, cache, todo)
            if opts.build_only:
                built = sum(1 for e in todo if e["built"])
                print(f"MPICH {VERSION} test suite: {built} of {len(todo)} selected programs "
                      f"built in {cache}")
                return 0
    except DownloadError as exc:
        print(f"could not download the MPICH {VERSION} source package: {exc}", file=sys.stderr)
        return 2
    except FetchError as exc:
        print(f"could not build the MPICH {VERSION} test suite: {exc}", file=sys.stderr)
        return 2
    os.makedirs(logdir, exist_ok=True)

    data, t_start = {}, time.monotonic()
    key = {"filter": opts.tests, "subset": opts.subset, "maxnp": opts.maxnp,
           "timeout": opts.timeout, "xfail": opts.xfail}
    for d in dirs:
        entries, skipped = plan[d]
        if (opts.tests or opts.subset) and not entries and not skipped:
            continue
        path = results_path(results, d)
        old = load(path) if opts.resume else None
        if old and all(old.get(k) == v for k, v in key.items()):
            if old.get("complete") and not any(retry(opts.retry, t)
                                               for t in old["tests"].values()):
                log(f"{d}: done before ({len(old['tests'])} tests), kept (--resume)")
                data[d] = old
                continue
        else:
            old = None
        res = {"dir": d, "suite": f"mpich {VERSION} test/mpi", **key, "complete": False,
               "started": datetime.datetime.now().isoformat(timespec="seconds"),
               "skipped": skipped, "tests": {}}
        if not os.path.isdir(os.path.join(testdir, d)):
            res["note"] = f"not in MPICH {VERSION}"
        data[d] = res
        log(f"{d}: {len(entries)} tests, {len(skipped)} skipped")
        for e in entries:
            if opts.budget and time.monotonic() - t_start > opts.budget:
                log(f"{d}: --budget of {opts.budget:g} s spent, stopping (resume with --resume)")
                break
            prev = (old or {}).get("tests", {}).get(e["id"])
            if prev and all(i in prev for i in impls) and not retry(opts.retry, prev):
                res["tests"][e["id"]] = prev
                continue
            t = {"np": e["np"], "at": datetime.datetime.now().isoformat(timespec="seconds")}
            for impl in impls:
                if not e["built"]:
                    t[impl] = {"outcome": "fail", "reason": "build failed", "rc": None, "secs": 0}
                    continue
                limit = float(e["timeLimit"]) if e.get("timeLimit", "").isdigit() else opts.timeout
                t[impl] = run_one(impl, e, limit, logdir)
            res["tests"][e["id"]] = t
            line = "  ".join(f"{impl} {t[impl]['outcome']:<7} {t[impl]['secs']:6.1f}s"
                             for impl in impls)
            flag = "  WORSE" if worse(t) else ""
            if opts.verbose or flag or any(t[i]["outcome"] != "pass" for i in impls):
                why = "; ".join(f"{i}: {t[i]['reason']}" for i in impls if t[i].get("reason"))
                log(f"  {e['id']:<50} {line}{flag}" + (f"  [{why}]" if why else ""))
            save(path, res)
        else:
            res["complete"] = True
            res["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
        save(path, res)
        if not res["complete"]:
            break

    rows, bad = summarize(dirs, data, not (opts.tests or opts.subset))
    if opts.markdown:
        print()
        print(markdown_table(rows))
    report_worse(bad)
    snapshot.save(opts, {"suite": f"mpich {VERSION} test/mpi (Debian {DEB_VERSION})",
                         "impls": IMPLS, "rows": [dict(zip(SUMMARY_HEAD, r)) for r in rows],
                         "worse": [tid for tid, _ in bad]})
    print(f"\n{time.monotonic() - t_start:.0f} s; results in {os.path.relpath(results, ROOT)}/")
    if opts.write_baseline:
        write_baseline(data, opts.write_baseline)
    if opts.baseline:
        selected = {e["id"] for entries, _ in plan.values() for e in entries}
        return 1 if check_baseline(data, opts.baseline, selected) else 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

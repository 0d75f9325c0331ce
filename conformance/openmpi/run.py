"""Conformance: real Open MPI / OSHMEM programs on ucxpy's libucp, beside the real UCX.

Two sets of external programs, obtained at run time into caches outside the
repository (nothing of them is committed):

1. **Open MPI's ``examples/``** from Debian 12's ``openmpi`` source package
   (4.1.4), fetched with ``apt-get source --download-only`` through a
   private, temporary apt configuration (a deb-src list given to apt with
   ``-o Dir::Etc::SourceList=``; nothing on the system changes), only
   ``examples/`` extracted from the upstream tarball, into
   ``~/.cache/ucxpy/openmpi-src``.  The C programs (EXAMPLES) are built with
   ``mpicc.openmpi`` / ``oshcc`` and run under ``mpirun`` / ``oshrun``.  Ours
   passes when the job exits 0, every rank proves it ran on ucxpy's libucp
   (``ucxpy-ucx --check``'s reports) and its output is what the source says
   it prints: the expected lines are made from the ``printf`` formats read
   out of the source (MODELS say with which values each rank prints them),
   host names and version strings masked, compared as sorted lines (the
   ranks' order is free).  The reference's exit status and match are
   recorded, and its sorted normalised lines are compared with ours.

2. **shmem4py's own test suite and demos** on OSHMEM with the real shmem4py
   (installed in this environment, built against Open MPI's ``oshcc``): the
   released sdist of the installed version is fetched with ``pip download``
   (as ``conformance/shmem/run.py`` does; its cache is shared), and every
   ``test/test_*.py`` runs under ``oshrun`` through ``shmem4py_runner.py``
   (per-test outcomes per PE; no adapter on ``PYTHONPATH``), every
   ``demo/**.py`` unmodified.  On the reference (OSHMEM on the system UCX
   1.13, which may crash in ``shmem_finalize``) a test counts with the
   outcome its PEs recorded before the crash; ours must also exit 0 and pass
   ``--check``.  A file's verdict is FAIL when any test of ours does worse
   than the reference's (pass < skip < fail < error < not run < hang), or
   ours exits non-zero or fails the proof.

Every job runs as ``ucxpy-ucx --check`` (ours) / ``ucxpy-ucx --reference``
would run it (``ucxpy.tools.ucx.environment`` and ``command``: Open MPI's
UCX components forced, the variables forwarded with ``-x``), with
``--oversubscribe``, Open MPI's own ``--timeout`` and a hard timeout after
which the job's whole process tree is killed.

Usage: python conformance/openmpi/run.py [--parts examples,shmem4py,demos]
       [--np 2,4] [--impl ours,reference] [--timeout 120] [--subset ci]
       [--files test_rma,...] [--programs hello_c,...] [--finalize atexit|explicit]
       [--numpy 'numpy<2'|installed] [--json FILE] [--baseline FILE]
       [--write-baseline FILE] [--markdown JSON] [-v]
Exit status: 0 when every example of ours passes and no shmem4py file or demo
of ours is worse than the reference (with ``--baseline``: than the baseline's
records); 1 otherwise; 2 when a suite could not be fetched ("could not
download") or built.
"""
from __future__ import annotations

import argparse
import codecs
import contextlib
import datetime
import glob
import importlib.util
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
from conformance.harness import locked  # noqa: E402
from ucxpy.tools import ucx  # noqa: E402

OMPI_VERSION = "4.1.4"
OMPI_DEB_VERSION = "4.1.4-3"        # Debian 12 (bookworm)
MPIRUN = "/usr/bin/mpirun"
OSHRUN = "/usr/bin/oshrun"
MPICC = "mpicc.openmpi"
OSHCC = "oshcc"
RUNNER = os.path.join(HERE, "shmem4py_runner.py")
DROPIN = os.path.join(ROOT, "shmem", "dropin")
IMPLS = ("ours", "reference")

# The CI subset (tests/test_conformance_openmpi.py): every example at 2
# ranks, these shmem4py files and the demos at 2 PEs, ours only.  Left out:
# test_sync (its TestWait.testSome hangs now and then on ours and on the
# reference alike) and demo race_winner_test.py (hangs on ours more often
# than not: a put or atomic to a PE that polls with shmem_test lands only
# when that PE progresses; README).
CI_FILES = ("test_alloc test_amo test_buf test_coll test_ctx test_info test_lock test_prof "
            "test_ptr test_query test_rc test_reduce test_rma test_signal test_team").split()
CI_DEMOS_LEFT_OUT = ("race_winner_test.py",)


def log(msg=""):
    print(msg, flush=True)


def cache_home() -> str:
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class DownloadError(Exception):
    """A suite could not be downloaded (no network, no apt, no PyPI)."""


class BuildError(Exception):
    """A program could not be built."""


# --- Open MPI's examples: fetching ------------------------------------------

def fetch_examples(cache: str) -> str:
    """``examples/`` of Open MPI 4.1.4's upstream tarball, extracted into
    ``cache`` (Debian's source package downloaded with apt-get if needed)."""
    with locked(cache):
        return _fetch_examples(cache)


def _fetch_examples(cache: str) -> str:
    top = os.path.join(cache, f"openmpi-{OMPI_VERSION}")
    examples = os.path.join(top, "examples")
    if os.path.exists(os.path.join(top, ".extracted")):
        return examples
    src = os.path.join(cache, "src")
    orig = os.path.join(src, f"openmpi_{OMPI_VERSION}.orig.tar.xz")
    if not os.path.exists(orig):
        if not shutil.which("apt-get"):
            raise DownloadError("no apt-get on this machine")
        # the temporary deb-src list and private apt state of the MPICH suite's
        # runner (conformance/mpich/run.py): -o Dir::Etc::SourceList=<tmpfile>,
        # SourceParts=/dev/null, lists and archives under the cache
        mpich = _load("mpich_conformance_run", os.path.join(ROOT, "conformance", "mpich",
                                                            "run.py"))
        log(f"fetching Debian's openmpi {OMPI_DEB_VERSION} source package (apt-get source) ...")
        os.makedirs(src, exist_ok=True)
        try:
            mpich._apt(cache, "update")
            try:
                mpich._apt(cache, "source", "--download-only", f"openmpi={OMPI_DEB_VERSION}")
            except mpich.DownloadError:
                mpich._apt(cache, "source", "--download-only", "openmpi")
        except mpich.DownloadError as e:
            raise DownloadError(str(e)) from None
        # apt-get source downloads into its working directory: the cache
        for p in glob.glob(os.path.join(cache, f"openmpi_{OMPI_VERSION}*")):
            os.replace(p, os.path.join(src, os.path.basename(p)))
        if not os.path.exists(orig):
            raise DownloadError(f"apt-get source left no {os.path.basename(orig)}")
    shutil.rmtree(top, ignore_errors=True)
    prefix = f"openmpi-{OMPI_VERSION}/examples/"
    with tarfile.open(orig) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
        tar.extractall(cache, members=members, filter="data")
    open(os.path.join(top, ".extracted"), "w").close()
    return examples


# --- Open MPI's examples: what they print -------------------------------------

MASK = object()         # a value the comparison ignores (host name, version string)
MASKED = "<*>"
_CONV = re.compile(r"%([-+ #0]*)(\d*)(?:\.(\d+))?(hh|h|ll|l|z|j|t)?([diouxXcsfeEgGp%])")


def printf_formats(source: str) -> list:
    """The format strings of the ``printf`` calls in C ``source`` (adjacent
    literals joined, escapes decoded), in order."""
    text = re.sub(r"/\*.*?\*/", "", source, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    fmts = []
    for m in re.finditer(r'\bprintf\s*\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)', text):
        lit = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
        fmts.append(codecs.decode(lit, "unicode_escape"))
    return fmts


def c_format(fmt: str, *args) -> str:
    """``fmt`` formatted as C's printf would (the conversions these programs
    use); a MASK argument prints as MASKED."""
    out, pos, it = [], 0, iter(args)
    for m in _CONV.finditer(fmt):
        out.append(fmt[pos:m.start()])
        pos = m.end()
        flags, width, prec, _, conv = m.groups()
        if conv == "%":
            out.append("%")
            continue
        value = next(it)
        if value is MASK:
            out.append(MASKED)
            continue
        spec = "%" + flags + width + (f".{prec}" if prec else "") + \
            ("d" if conv in "iu" else conv)
        out.append(spec % value)
    out.append(fmt[pos:])
    rest = list(it)
    if rest:
        raise ValueError(f"{len(rest)} arguments too many for {fmt!r}")
    return "".join(out)


class Formats:
    """The printf formats of one example, looked up by how they begin."""

    def __init__(self, source_path: str):
        with open(source_path) as f:
            self.fmts = printf_formats(f.read())
        self.name = os.path.basename(source_path)

    def __call__(self, start: str):
        found = [f for f in self.fmts if f.startswith(start)]
        if len(set(found)) != 1:
            raise BuildError(f"{self.name}: {len(set(found))} printf formats begin with "
                             f"{start!r} (the source is not the one the model was made for)")
        fmt = found[0]
        return lambda *args: c_format(fmt, *args)


# Per program: the launcher, the arguments, whether its job counts operations
# (hello_c sends nothing: MPI_Init/Finalize only, and Open MPI's UCX pml
# connects lazily; its ranks prove themselves by the library they mapped),
# and the model: per rank, the text the source prints (MODELS).
EXAMPLES = {
    "hello_c": dict(cc=MPICC, launcher=MPIRUN, args=[], ops=False),
    "ring_c": dict(cc=MPICC, launcher=MPIRUN, args=[], ops=True),
    "connectivity_c": dict(cc=MPICC, launcher=MPIRUN, args=["-v"], ops=True),
    "hello_oshmem_c": dict(cc=OSHCC, launcher=OSHRUN, args=[], ops=True),
    "ring_oshmem_c": dict(cc=OSHCC, launcher=OSHRUN, args=[], ops=True),
    "oshmem_shmalloc": dict(cc=OSHCC, launcher=OSHRUN, args=[], ops=True),
    "oshmem_circular_shift": dict(cc=OSHCC, launcher=OSHRUN, args=[], ops=True),
    "oshmem_max_reduction": dict(cc=OSHCC, launcher=OSHRUN, args=[], ops=True),
    "oshmem_strided_puts": dict(cc=OSHCC, launcher=OSHRUN, args=[], ops=True),
    "oshmem_symmetric_data": dict(cc=OSHCC, launcher=OSHRUN, args=[], ops=True),
}


def _model_hello_c(F, n):
    # printf("Hello, world, I am %d of %d, (%s, %d)\n", rank, size, version, len)
    return [F("Hello, world, I am")(r, n, MASK, MASK) for r in range(n)]


def _model_ring_c(F, n):
    # rank 0 starts the message at 10 (tag 201) and decrements it each lap
    zero = F("Process 0 sending")(10, 1 % n, 201, n) + F("Process 0 sent to")(1 % n)
    zero += "".join(F("Process 0 decremented value")(m) for m in range(9, -1, -1))
    return [zero + F("Process %d exiting")(0)] + \
        [F("Process %d exiting")(r) for r in range(1, n)]


def _model_connectivity_c(F, n):
    # -v: rank i prints a line per higher rank j (%-4d), then rank 0 the verdict
    out = ["".join(F("checking connection between")(i, MASK, j) for j in range(i + 1, n))
           for i in range(n)]
    out[0] += F("Connectivity test on")(n)
    return out


def _model_hello_oshmem_c(F, n):
    # printf("Hello, world, I am %d of %d: %s (version: %d.%d)\n", ...)
    return [F("Hello, world, I am")(r, n, MASK, MASK, MASK) for r in range(n)]


def _model_ring_oshmem_c(F, n):
    zero = F("Process 0 puts message")(10, 1 % n, n)
    zero += "".join(F("Process 0 decremented value")(m) for m in range(9, -1, -1))
    return [zero + F("Process %d exiting")(0)] + \
        [F("Process %d exiting")(r) for r in range(1, n)]


def _model_oshmem_shmalloc(F, n):
    return [""] * n


def _model_oshmem_circular_shift(F, n):
    return [F("Process %d gets message")(r, (r + 1) % n, n) + F("Process %d exiting")(r)
            for r in range(n)]


def _model_oshmem_max_reduction(F, n):
    # src[i] = pe + i; dst = max over the PEs = n - 1 + i, for i < N = 3
    return [F("%d/%d dst =")(r, n) + "".join(F(" %ld")(n - 1 + i) for i in range(3)) + F("\n")()
            for r in range(n)]


def _model_oshmem_strided_puts(F, n):
    # PE 0 iputs source[0, 2, 4, 6, 8] = 1 3 5 7 9 into PE 1's target
    return [F("target on PE")(1, 1, 3, 5, 7, 9) if r == 1 else "" for r in range(n)]


def _model_oshmem_symmetric_data(F, n):
    # PE 0 puts 0..15 into every other PE's target
    return [F("Target on PE")(r) + "".join(F("%hd \t")(i) for i in range(16)) + F("\n")()
            if r else "" for r in range(n)]


MODELS = {name: globals()["_model_" + name] for name in EXAMPLES}


def expected_lines(source_path: str, program: str, n: int) -> list:
    """The lines ``program`` prints at ``n`` ranks, from its source's
    formats (masked values as MASKED)."""
    F = Formats(source_path)
    text = "".join(MODELS[program](F, n))
    return text.splitlines()


def _pattern(line: str):
    return re.compile(".+?".join(re.escape(p) for p in line.split(MASKED)) + r"\Z", re.S)


def normalise(lines: list, expected: list) -> list:
    """``lines`` sorted, each one that an expected line matches (masked
    parts aside) replaced by that line, so masked values compare equal."""
    pool = [(e, _pattern(e)) for e in sorted(set(expected))]
    out = []
    for line in lines:
        for e, pat in pool:
            if pat.match(line):
                line = e
                break
        out.append(line)
    return sorted(out)


def output_lines(text: str) -> list:
    return [line.rstrip("\r") for line in text.splitlines()]


def diff_lines(got: list, want: list, limit=6) -> str:
    """A short account of two sorted line lists' differences."""
    extra, missing = list(got), []
    for w in want:
        if w in extra:
            extra.remove(w)
        else:
            missing.append(w)
    parts = [f"missing {m!r}" for m in missing[:limit]] + \
        [f"unexpected {x!r}" for x in extra[:limit]]
    return "; ".join(parts)


def build_examples(examples: str, build: str, programs: list) -> None:
    """Each program compiled from ``examples`` into ``build`` (again when
    the compiler's command line or the source changed)."""
    os.makedirs(build, exist_ok=True)
    stamp = {}
    for cc in {EXAMPLES[p]["cc"] for p in programs}:
        if not shutil.which(cc):
            raise BuildError(f"{cc} not found (apt-get install libopenmpi-dev)")
        stamp[cc] = subprocess.run([cc, "--showme"], capture_output=True, text=True).stdout
    marker = os.path.join(build, ".stamp.json")
    with contextlib.suppress(OSError, ValueError), open(marker) as f:
        old = json.load(f)
        for cc in stamp:
            if old.get(cc) != stamp[cc]:
                for p in programs:
                    if EXAMPLES[p]["cc"] == cc:
                        with contextlib.suppress(OSError):
                            os.remove(os.path.join(build, p))
    for p in programs:
        src, exe = os.path.join(examples, p + ".c"), os.path.join(build, p)
        if os.path.exists(exe) and os.path.getmtime(exe) >= os.path.getmtime(src):
            continue
        r = subprocess.run([EXAMPLES[p]["cc"], "-O2", "-o", exe, src], capture_output=True,
                           text=True, timeout=300)
        if r.returncode:
            raise BuildError(f"{EXAMPLES[p]['cc']} {p}.c failed:\n{r.stdout}{r.stderr}")
    with open(marker, "w") as f:
        json.dump(stamp, f)


# --- running a job -------------------------------------------------------------

def job_env(impl: str, extra=None, pythonpath=()) -> dict:
    """The job's environment: ucxpy-ucx's (ours) or its reference's, for
    root, with ``pythonpath`` first on PYTHONPATH and no drop-in adapter."""
    base = dict(os.environ)
    if os.getuid() == 0:
        base.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        base.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    # the real shmem4py, never the drop-in adapter of conformance/shmem
    paths = list(pythonpath) + [p for p in base.get("PYTHONPATH", "").split(os.pathsep)
                                if p and os.path.realpath(p) != os.path.realpath(DROPIN)]
    if paths:
        base["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        base.pop("PYTHONPATH", None)
    base.update(extra or {})
    return ucx.environment(reference=(impl == "reference"), base=base)


def run_job(impl: str, launcher: str, n: int, prog: list, cwd: str, timeout: int,
            require_ops: bool = True, extra_env=None, pythonpath=()) -> dict:
    """One job of ``n`` ranks: exit status, ``out`` (the ranks' stdout, each
    rank's whole, in rank order), ``err`` (the launcher's stdout and stderr:
    the ranks' stderr and Open MPI's messages), seconds, ``timeout`` (ended
    by Open MPI's --timeout or killed by us), and for ours the proof's
    problems (``check``).  Each rank's stdout is read from the file
    ``--output-filename`` gives it: through the launcher's own output two
    ranks' lines can interleave (a rank's pty passes a line and its newline
    separately)."""
    env = job_env(impl, extra_env, pythonpath)
    folder = None
    if impl == "ours":
        folder = tempfile.mkdtemp(prefix="ucxpy-ompi-report-")
        env["UCXPY_UCP_REPORT"] = folder
    outputs = tempfile.mkdtemp(prefix="ucxpy-ompi-output-")
    argv = [launcher, "--oversubscribe", "--timeout", str(timeout),
            "--output-filename", outputs, "-n", str(n), *prog]
    cmd = ucx.command(argv, env)
    t0 = time.monotonic()
    try:
        rc, out, err, killed = harness.run_job(cmd, timeout=timeout + 20, env=env, cwd=cwd,
                                               stderr=subprocess.PIPE)
        err = out.decode(errors="replace") + err.decode(errors="replace")
        if killed:
            err += f"\n[run.py] killed after {timeout + 20} s"
        ranks = []
        for r in range(n):
            found = glob.glob(os.path.join(outputs, "*", f"rank.{r}", "stdout"))
            text = ""
            if found:
                with open(found[0], "rb") as f:
                    text = f.read().decode(errors="replace")
            ranks.append(text)
        out = "".join(t if not t or t.endswith("\n") else t + "\n" for t in ranks)
        res = {"rc": rc, "out": out, "err": err, "secs": round(time.monotonic() - t0, 1),
               "timeout": killed or "time limit for job execution has been reached" in err}
        if folder is not None:
            res["check"] = ucx.check_reports(folder, n, require_ops=require_ops and rc == 0)
        return res
    finally:
        shutil.rmtree(outputs, ignore_errors=True)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def rc_text(res) -> str:
    if res.get("timeout"):
        return "T/O"
    rc = res["rc"]
    return f"sig{-rc}" if rc is not None and rc < 0 else str(rc)


# --- part 1: the examples --------------------------------------------------------

def run_examples(opts, examples: str, build: str) -> dict:
    results = {}
    log(f"\n## Open MPI {OMPI_VERSION} examples/ (ours: ucxpy-ucx --check; "
        f"reference: ucxpy-ucx --reference, the system UCX)\n")
    hdr = (f"{'program':<24}{'np':>3} | {'ours':<4} {'rc':>4} {'proof':<6} {'output':<7}"
           f"{'secs':>5} | {'ref rc':>6} {'output':<7} {'=ours':<6}")
    log(hdr)
    log("-" * len(hdr))
    for n in opts.nps:
        for p in opts.programs:
            spec = EXAMPLES[p]
            want = expected_lines(os.path.join(examples, p + ".c"), p, n)
            row = {"expected": want}
            for impl in opts.impls:
                res = run_job(impl, spec["launcher"], n, [os.path.join(build, p), *spec["args"]],
                              build, opts.timeout, require_ops=spec["ops"])
                got = normalise(output_lines(res["out"]), want)
                res["lines"] = got
                res["match"] = got == sorted(want)
                res["diff"] = "" if res["match"] else diff_lines(got, sorted(want))
                if impl == "ours":
                    res["ok"] = res["rc"] == 0 and not res["timeout"] and \
                        not res["check"] and res["match"]
                row[impl] = res
            if "ours" in row and "reference" in row:
                row["same"] = row["ours"]["lines"] == row["reference"]["lines"]
            results[f"{p}@{n}"] = row
            o, r = row.get("ours"), row.get("reference")
            line = f"{p:<24}{n:>3} | "
            line += (f"{'PASS' if o['ok'] else 'FAIL':<4} {rc_text(o):>4} "
                     f"{'ok' if not o['check'] else 'FAIL':<6} "
                     f"{'match' if o['match'] else 'DIFFER':<7}{o['secs']:>5.1f} | ") if o \
                else f"{'-':<4} {'':>4} {'':<6} {'':<7}{'':>5} | "
            line += (f"{rc_text(r):>6} {'match' if r['match'] else 'DIFFER':<7} "
                     f"{('same' if row['same'] else 'differ') if o else '-':<6}") if r else "-"
            log(line)
            for impl in opts.impls:
                res = row[impl]
                bad = (impl == "ours" and not res["ok"]) or not res["match"]
                if bad and (opts.verbose or impl == "ours"):
                    if res.get("check"):
                        log(f"      {impl} proof: {'; '.join(res['check'])}")
                    if res["diff"]:
                        log(f"      {impl} output: {res['diff']}")
                    if res["rc"] != 0 or res["timeout"]:
                        tail = (res["err"] or res["out"]).strip().splitlines()[-6:]
                        log("      " + f"{impl} stderr: " + "\n      ".join(tail))
    return results


# --- part 2: shmem4py ----------------------------------------------------------------

COLS = ("pass", "fail", "error", "skip", "hang", "not run")


def shmem4py_version() -> str:
    r = subprocess.run([sys.executable, "-c", "import shmem4py; print(shmem4py.__version__)"],
                       capture_output=True, text=True, env=job_env("reference"), cwd="/")
    if r.returncode:
        raise BuildError("shmem4py is not installed: OSHCC=oshcc pip install shmem4py\n"
                         + r.stderr[-1000:])
    return r.stdout.strip()


def numpy_path(spec: str, cache: str) -> list:
    """[a directory holding numpy ``spec``] (pip install --target, once), or
    [] for ``installed``.  shmem4py 1.0.0 predates NumPy 2: under it, on any
    OSHMEM, its ``shmem.array`` (``np.array(copy=False)``) and tests filling
    unsigned arrays with -1 raise, whole test classes and demos erroring."""
    if spec == "installed":
        return []
    dest = os.path.join(cache, "pydeps-" + re.sub(r"[^\w.]+", "_", spec))
    with locked(cache):
        _install_target(spec, dest)
    return [dest]


def _install_target(spec: str, dest: str) -> None:
    if not os.path.exists(os.path.join(dest, ".installed")):
        log(f"installing {spec} for the shmem4py jobs into {dest} ...")
        shutil.rmtree(dest, ignore_errors=True)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                            "--only-binary", ":all:", "--target", dest, spec],
                           capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise DownloadError(f"pip install --target {dest} {spec} failed "
                                f"(could not download?):\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
        open(os.path.join(dest, ".installed"), "w").close()


def fetch_shmem4py(version: str) -> str:
    """shmem4py's sdist ``test/`` and ``demo/``, downloaded as
    conformance/shmem/run.py does (its cache)."""
    shmem = _load("shmem_conformance_run", os.path.join(ROOT, "conformance", "shmem", "run.py"))
    try:
        return os.path.dirname(shmem.fetch_suite(version, shmem.default_cache()))
    except SystemExit as e:
        raise DownloadError(str(e)) from None


def counts(tests: dict) -> dict:
    return harness.counts(tests.values(), COLS)


def run_test_file(impl: str, path: str, n: int, opts) -> dict:
    outdir = tempfile.mkdtemp(prefix="ucxpy-ompi-shmem4py-")
    try:
        res = run_job(impl, OSHRUN, n, [sys.executable, RUNNER, path, outdir],
                      os.path.dirname(path), opts.timeout,
                      extra_env={"UCXPY_RUNNER_FINALIZE": opts.finalize},
                      pythonpath=opts.pythonpath)
        res.update(harness.pe_outcomes(harness.pe_records(outdir), n))
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    res["counts"] = counts(res["tests"])
    if not res["tests"]:
        res["counts"]["error"] += 1        # the file did not even start its tests
    if any(m.startswith(os.path.realpath(DROPIN)) for m in res["modules"]):
        res.setdefault("check", []).append("a PE imported the shmem4py drop-in adapter")
    return res


def file_verdict(row: dict, impls) -> tuple:
    """(verdict, reasons) of one file's row: FAIL when a test of ours does
    worse than the reference's, a count of ours is worse, the proof fails, or
    ours does not exit 0 -- unless the reference ended the same way with the
    same outcomes (a defect of the suite or of OSHMEM, not ours): ``as-ref``."""
    o = row.get("ours")
    if o is None:
        return "-", []
    why = []
    if o.get("check"):
        why.append("proof: " + "; ".join(o["check"]))
    r = row.get("reference")
    if o["rc"] != 0 or o["timeout"]:
        if r is not None and rc_text(r) == rc_text(o) and r["tests"] == o["tests"] \
                and not why:
            return "as-ref", [f"ours exit {rc_text(o)}, as the reference's, with the same "
                              f"outcomes"]
        why.append(f"ours exit {rc_text(o)}")
    if r is not None:
        ref = dict(r["tests"], **dict.fromkeys(set(o["tests"]) - set(r["tests"]), "not run"))
        bad, _, _ = harness.compare(o["tests"], ref)
        why += [f"{tid}: ours {a}, reference {b}" for tid, a, b in bad]
        why += harness.counts_worse(o["counts"], r["counts"], skips=False)
    return ("FAIL" if why else "PASS"), why


def _cells(res) -> str:
    if res is None:
        return "   -    -    -    -    -    -      -"
    c = res["counts"]
    return (f"{c['pass']:>4} {c['fail']:>4} {c['error']:>4} {c['skip']:>4} {c['hang']:>4} "
            f"{c['not run']:>4} {rc_text(res):>6}")


def run_shmem4py_files(opts, suite: str) -> dict:
    results = {}
    files = sorted(glob.glob(os.path.join(suite, "test", "test_*.py")))
    if opts.files:
        files = [f for f in files if os.path.basename(f)[:-3] in opts.files]
    log(f"\n## shmem4py {opts.shmem4py_version} test suite on OSHMEM (per file: tests that "
        f"passed / failed / errored / skipped / hung / never ran, and the job's exit)\n")
    hdr = (f"{'file':<16}{'np':>3} | {'ours pass fail  err skip hang n/r     rc':<41}| "
           f"{'ref  pass fail  err skip hang n/r     rc':<41}| verdict")
    log(hdr)
    log("-" * len(hdr))
    for n in opts.nps:
        for path in files:
            name = os.path.basename(path)[:-3]
            row = {}
            for impl in opts.impls:
                row[impl] = run_test_file(impl, path, n, opts)
            verdict, why = file_verdict(row, opts.impls)
            row["verdict"], row["why"] = verdict, why
            results[f"{name}@{n}"] = row
            log(f"{name:<16}{n:>3} |     {_cells(row.get('ours'))} |     "
                f"{_cells(row.get('reference'))} | {verdict}")
            if verdict == "FAIL" or opts.verbose:
                for w in why[:8]:
                    log(f"      {w}")
                o = row.get("ours")
                if o is not None and (verdict == "FAIL" or opts.verbose):
                    for tid, outcome in sorted(o["tests"].items()):
                        if outcome not in ("pass", "skip") and opts.verbose:
                            log(f"      ours {outcome}: {tid}")
                            if tid in o["details"]:
                                log("        " + o["details"][tid].strip().splitlines()[-1])
                    if o["rc"] != 0 or o["timeout"] or not o["tests"]:
                        tail = (o["err"] + o["out"]).strip().splitlines()[-5:]
                        log("      ours: " + "\n      ".join(tail))
    return results


# demos whose output is not fixed: who wins a race, the order a lock is taken in
DEMO_MASKS = {
    "race_winner.py": (r"\d+", "N"),
    "race_winner_test.py": (r"\d+", "N"),
    "lock.py": (r"count is \d+", "count is N"),
    "lock_oo.py": (r"count is \d+", "count is N"),
}
DEMO_ERROR = re.compile(r"Traceback|\bERROR\b")


def demo_lines(name: str, text: str) -> list:
    pat = DEMO_MASKS.get(name)
    lines = output_lines(text)
    if pat:
        lines = [re.sub(pat[0], pat[1], line) for line in lines]
    return sorted(lines)


def run_demos(opts, suite: str) -> dict:
    results = {}
    demo = os.path.join(suite, "demo")
    paths = sorted(glob.glob(os.path.join(demo, "**", "*.py"), recursive=True))
    if opts.subset == "ci":
        paths = [p for p in paths if os.path.relpath(p, demo) not in CI_DEMOS_LEFT_OUT]
    log(f"\n## shmem4py {opts.shmem4py_version} demos, unmodified (ours: exit 0, proof, no "
        f"error printed; the reference's output compared with ours)\n")
    hdr = f"{'demo':<24}{'np':>3} | {'ours':<4} {'rc':>4} {'proof':<6}| {'ref rc':>6} {'output':<8}"
    log(hdr)
    log("-" * len(hdr))
    for n in opts.nps:
        for path in paths:
            name = os.path.relpath(path, demo)
            row = {}
            for impl in opts.impls:
                res = run_job(impl, OSHRUN, n, [sys.executable, path],
                              os.path.dirname(path), opts.timeout, pythonpath=opts.pythonpath)
                res["lines"] = demo_lines(os.path.basename(name), res["out"])
                res["clean"] = not DEMO_ERROR.search(res["out"] + res["err"])
                res["ok"] = res["rc"] == 0 and not res["timeout"] and res["clean"] and \
                    not res.get("check")
                row[impl] = res
            o, r = row.get("ours"), row.get("reference")
            why = []
            if o is not None:
                if o["rc"] != 0 or o["timeout"]:
                    why.append(f"ours exit {rc_text(o)}")
                if o["check"]:
                    why.append("proof: " + "; ".join(o["check"]))
                if not o["clean"]:
                    why.append("ours printed an error")
                if r is not None:
                    row["same"] = o["lines"] == r["lines"]
                    if not row["same"] and r["rc"] == 0 and r["clean"]:
                        why.append("output differs from the reference's: "
                                   + diff_lines(o["lines"], r["lines"], 3))
            row["verdict"] = ("FAIL" if why else "PASS") if o is not None else "-"
            row["why"] = why
            results[f"{name}@{n}"] = row
            line = f"{name:<24}{n:>3} | "
            line += (f"{row['verdict']:<4} {rc_text(o):>4} "
                     f"{'ok' if not o['check'] else 'FAIL':<6}| ") if o else f"{'-':<17}| "
            if r is not None:
                same = ("same" if row["same"] else "differs") if o else "-"
                line += f"{rc_text(r):>6} {same:<8}"
            log(line)
            if why and (opts.verbose or o is not None):
                for w in why:
                    log(f"      {w}")
                if o is not None and (o["rc"] != 0 or not o["clean"]):
                    tail = (o["err"] + o["out"]).strip().splitlines()[-3:]
                    log("      ours: " + "\n      ".join(tail))
    return results


# --- baseline -------------------------------------------------------------------------

def baseline_of(data: dict) -> dict:
    """What a baseline keeps: ours' outcome per example, per test of each
    shmem4py file, the file's exit, and each demo's verdict."""
    out = {"date": data["date"], "examples": {}, "shmem4py": {}, "demos": {}}
    for key, row in data.get("examples", {}).items():
        if "ours" in row:
            out["examples"][key] = "pass" if row["ours"]["ok"] else "fail"
    for key, row in data.get("shmem4py", {}).items():
        if "ours" in row:
            o = row["ours"]
            out["shmem4py"][key] = {"exit": rc_text(o), "proof": not o["check"],
                                    "tests": o["tests"], "counts": o["counts"]}
            if "reference" in row:
                out["shmem4py"][key]["reference"] = {"exit": rc_text(row["reference"]),
                                                     "counts": row["reference"]["counts"]}
    for key, row in data.get("demos", {}).items():
        if "ours" in row:
            out["demos"][key] = {"ours": "pass" if row["ours"]["ok"] else "fail",
                                 "exit": rc_text(row["ours"])}
    return out


def check_baseline(data: dict, path: str) -> list:
    """Regressions of ours against the baseline in ``path``."""
    with open(path) as f:
        base = json.load(f)
    bad, better = [], []
    for key, row in data.get("examples", {}).items():
        if "ours" in row and not row["ours"]["ok"]:
            bad.append(f"example {key}: ours fails")
    for key, row in data.get("shmem4py", {}).items():
        if "ours" not in row:
            continue
        o, b = row["ours"], base["shmem4py"].get(key)
        if b is None:
            bad.append(f"shmem4py {key}: not in the baseline")
            continue
        if b["exit"] == "0" and rc_text(o) != "0":
            bad.append(f"shmem4py {key}: ours exit {rc_text(o)} (baseline 0)")
        if b["proof"] and o["check"]:
            bad.append(f"shmem4py {key}: proof: {'; '.join(o['check'])}")
        worse, improved, new = harness.compare(o["tests"], b["tests"])
        bad += [f"shmem4py {key} {tid}: ours {now} (baseline {was})" for tid, now, was in worse]
        better += [f"shmem4py {key} {tid}: ours {now} (baseline {was})"
                   for tid, now, was in improved]
        bad += [f"shmem4py {key} {tid}: ours {o['tests'][tid]} (not in the baseline)"
                for tid in new if o["tests"][tid] not in ("pass", "skip")]
    for key, row in data.get("demos", {}).items():
        if "ours" not in row:
            continue
        b = base["demos"].get(key)
        ok = row["ours"]["ok"]
        if b is None:
            bad.append(f"demo {key}: not in the baseline")
        elif b["ours"] == "pass" and not ok:
            bad.append(f"demo {key}: ours fails (baseline pass): {'; '.join(row['why'])}")
        elif b["ours"] == "fail" and ok:
            better.append(f"demo {key}: ours passes (baseline fail)")
    harness.report(bad, better, log)
    return bad


def _strip(data):
    """Results for JSON: the outputs of a job that did not end well cut to
    their tails, the others left out."""
    def cut(res):
        res = dict(res)
        good = res.get("rc") == 0 and not res.get("timeout") and res.get("ok", True)
        for k in ("out", "err"):
            if k in res:
                res[k] = "" if good else res[k][-1500:]
        res.pop("details", None) if good else None
        return res
    out = {}
    for part, rows in data.items():
        if not isinstance(rows, dict):
            out[part] = rows
            continue
        out[part] = {key: {k: (cut(v) if k in IMPLS else v) for k, v in row.items()}
                     for key, row in rows.items()}
    return out


def markdown(data: dict) -> str:
    """The tables of a results JSON (``--json``) in Markdown: a row per
    program, file or demo, ours beside the reference at each rank count."""
    nps = data["nps"]

    def grouped(rows):
        names = {}
        for key, row in rows.items():
            name, n = key.rsplit("@", 1)
            names.setdefault(name, {})[int(n)] = row
        return sorted(names.items())

    def head(first, cols):
        return ["| " + " | ".join([first] + cols) + " |",
                "|" + "---|" * (len(cols) + 1)]

    out = [f"Run of {data['date']}; ranks {', '.join(map(str, nps))}.", ""]
    if data.get("examples"):
        out += head("example", [f"{who} np={n}" for n in nps for who in ("ours", "reference")])
        for name, by_n in grouped(data["examples"]):
            cells = []
            for n in nps:
                row = by_n.get(n, {})
                o, r = row.get("ours"), row.get("reference")
                if o is None:
                    cells.append("-")
                elif o["ok"]:
                    cells.append("PASS")
                else:
                    cells.append("FAIL (" + ", ".join(
                        [f"exit {rc_text(o)}"] * (o["rc"] != 0 or o["timeout"]) +
                        ["proof"] * bool(o["check"]) + ["output"] * (not o["match"])) + ")")
                cells.append(f"exit {rc_text(r)}, output "
                             f"{'matches' if r['match'] else 'differs'}" if r else "-")
            out.append("| " + " | ".join([name] + cells) + " |")
        out.append("")

    def counts_cell(res):
        if res is None:
            return "-"
        k = res["counts"]
        return "/".join(str(k[x]) for x in COLS) + f", exit {rc_text(res)}"

    if data.get("shmem4py"):
        out += [f"shmem4py {data.get('shmem4py_version', '')} tests ({data.get('numpy', '')}): "
                "pass/fail/error/skip/hang/not run, and the job's exit.", ""]
        out += head("file", [c for n in nps for c in (f"ours np={n}", f"reference np={n}",
                                                       f"verdict np={n}")])
        for name, by_n in grouped(data["shmem4py"]):
            cells = []
            for n in nps:
                row = by_n.get(n, {})
                cells += [counts_cell(row.get("ours")), counts_cell(row.get("reference")),
                          row.get("verdict", "-")]
            out.append("| " + " | ".join([name] + cells) + " |")
        out.append("")
    if data.get("demos"):
        out += head("demo", [c for n in nps for c in (f"ours np={n}", f"reference np={n}")])
        for name, by_n in grouped(data["demos"]):
            cells = []
            for n in nps:
                row = by_n.get(n, {})
                o, r = row.get("ours"), row.get("reference")
                cells.append(f"{row.get('verdict', '-')}, exit {rc_text(o)}" if o else "-")
                same = ("" if not o else ", output as ours" if row.get("same")
                        else ", output differs")
                cells.append(f"exit {rc_text(r)}{same}" if r else "-")
            out.append("| " + " | ".join([name] + cells) + " |")
        out.append("")
    return "\n".join(out)


# --- main --------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="examples,shmem4py,demos",
                    help="comma-separated: examples, shmem4py (test files), demos")
    ap.add_argument("--np", default="2,4", help="comma-separated rank counts")
    ap.add_argument("--impl", default="ours,reference", help="ours, reference or both")
    ap.add_argument("--timeout", type=int, default=120,
                    help="seconds per job (Open MPI's --timeout; killed 20 s later)")
    ap.add_argument("--subset", choices=["ci"], help="the CI subset (CI_FILES)")
    ap.add_argument("--programs", default="", help="comma-separated examples (default all)")
    ap.add_argument("--files", default="", help="comma-separated shmem4py test files")
    ap.add_argument("--finalize", choices=["explicit", "atexit"], default="atexit",
                    help="shmem4py_runner.py leaves shmem_finalize to shmem4py's exit hook, "
                         "as the test files do when run alone (atexit), or calls "
                         "shmem.finalize() itself (explicit)")
    ap.add_argument("--numpy", default="numpy<2",
                    help="the numpy of the shmem4py jobs (a pip requirement installed into "
                         "the cache and put first on PYTHONPATH), or 'installed'")
    ap.add_argument("--cache", default=os.path.join(cache_home(), "ucxpy", "openmpi-src"),
                    help="where Open MPI's source package and the built examples go")
    ap.add_argument("--json", help="write the results here")
    snapshot.add_option(ap, "conformance-openmpi")
    ap.add_argument("--baseline", help="fail on any regression of ours against this file")
    ap.add_argument("--write-baseline", help="write ours' outcomes here as a baseline")
    ap.add_argument("--markdown", metavar="JSON",
                    help="print the tables of a --json results file in Markdown, and exit")
    ap.add_argument("-v", "--verbose", action="store_true")
    opts = ap.parse_args(argv)
    if opts.markdown:
        with open(opts.markdown) as f:
            print(markdown(json.load(f)))
        return 0
    parts = opts.parts.split(",")
    opts.nps = [int(x) for x in opts.np.split(",")]
    opts.impls = [i for i in IMPLS if i in opts.impl.split(",")]
    opts.programs = opts.programs.split(",") if opts.programs else list(EXAMPLES)
    opts.files = set(opts.files.split(",")) if opts.files else set()
    if opts.subset == "ci" and not opts.files:
        opts.files = set(CI_FILES)
    for p in opts.programs:
        if p not in EXAMPLES:
            ap.error(f"unknown example {p}")

    if "ours" in opts.impls and not os.path.exists(ucx.LIBUCP):
        log(f"{ucx.LIBUCP} is not built (needs libucx-dev at install)")
        return 2
    data = {"date": datetime.datetime.now().isoformat(timespec="minutes"),
            "nps": opts.nps, "impls": opts.impls}
    t0 = time.monotonic()
    try:
        if "examples" in parts:
            examples = fetch_examples(opts.cache)
            build = os.path.join(opts.cache, "build")
            with locked(opts.cache):
                build_examples(examples, build, opts.programs)
            data["examples"] = run_examples(opts, examples, build)
        if "shmem4py" in parts or "demos" in parts:
            opts.shmem4py_version = shmem4py_version()
            data["shmem4py_version"] = opts.shmem4py_version
            suite = fetch_shmem4py(opts.shmem4py_version)
            opts.pythonpath = numpy_path(opts.numpy, opts.cache)
            data["numpy"] = opts.numpy
            if "shmem4py" in parts:
                data["shmem4py"] = run_shmem4py_files(opts, suite)
            if "demos" in parts:
                data["demos"] = run_demos(opts, suite)
    except DownloadError as e:
        log(f"could not download a suite: {e}")
        return 2
    except BuildError as e:
        log(f"could not build: {e}")
        return 2

    bad, same = [], []
    for key, row in data.get("examples", {}).items():
        if "ours" in row and not row["ours"]["ok"]:
            bad.append(f"example {key}")
    for part in ("shmem4py", "demos"):
        for key, row in data.get(part, {}).items():
            if row.get("verdict") == "FAIL":
                bad.append(f"{part} {key}")
            elif row.get("verdict") == "as-ref":
                same.append(f"{part} {key}")
    log(f"\n{time.monotonic() - t0:.0f} s; "
        + (f"ours FAILS: {', '.join(bad)}" if bad else "no failure of ours")
        + (f"; ended as the reference did (not ours to fix): {', '.join(same)}"
           if same else ""))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(_strip(data), f, indent=1, sort_keys=True)
    snapshot.save(opts, _strip(data))
    if opts.write_baseline:
        with open(opts.write_baseline, "w") as f:
            json.dump(baseline_of(data), f, indent=1, sort_keys=True)
            f.write("\n")
    if opts.baseline:
        return 1 if check_baseline(data, opts.baseline) else 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

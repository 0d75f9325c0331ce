"""The conformance harness: what every runner shares.

Each runner (``mpi/run.py``: mpi4py's suite; ``mpich/run.py``: MPICH's C
suite; ``openmpi/run.py``: Open MPI's examples, shmem4py and its demos;
``shmem/run.py``: the OpenSHMEM suites) keeps only what is its suite's own:
fetching and building it, the command of one test or file, and how to read
an outcome from what the job printed.  Here is the rest:

- the download caches: one runner at a time fetches, extracts and builds
  into a cache (:func:`locked`), so that two runners started together
  (``make test`` runs two pytest workers) never read a half-written suite;
- running one job with a hard time limit, and killing all of it when it
  outlives it (:func:`run_job`, :func:`kill_tree`);
- outcomes and their order (:data:`RANK`), counts, and the comparisons:
  per test against the reference or a baseline (:func:`compare`), per file
  by counts (:func:`counts_worse`), reported one way (:func:`report`);
- tables (:func:`text_table`, :func:`markdown_table`) and results files
  (:func:`save`, :func:`load`).
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import signal
import subprocess
import time

# --- outcomes ---------------------------------------------------------------------

#: every outcome a runner reports, best first: a test does worse than another
#: run of it when its outcome ranks higher.  ``timeout`` (the job was ended
#: at its limit: MPICH's suite) and ``hang`` (a test started and never
#: stopped: the Python suites) are the same, the worst.
RANK = {"pass": 0, "skip": 1, "fail": 2, "error": 3, "not run": 4, "timeout": 5, "hang": 5}


def worse(now: str, was: str) -> bool:
    """Whether outcome ``now`` is worse than ``was``."""
    return RANK[now] > RANK[was]


def counts(outcomes, states) -> dict:
    """How many of ``outcomes`` (an iterable of outcome names) fall in each
    of ``states``."""
    out = dict.fromkeys(states, 0)
    for s in outcomes:
        out[s] += 1
    return out


def compare(now: dict, was: dict, missing: str = "not run") -> tuple:
    """Per test, ``now`` (test id -> outcome) against ``was`` (the
    reference's or a baseline's): ``(worse, better, new)``, the first two
    lists of ``(test id, now, was)`` over ``was``'s tests (one ``now``
    lacks counts as ``missing``), ``new`` the ids only ``now`` has."""
    bad, good = [], []
    for tid in sorted(was):
        a, b = now.get(tid, missing), was[tid]
        if RANK[a] > RANK[b]:
            bad.append((tid, a, b))
        elif RANK[a] < RANK[b]:
            good.append((tid, a, b))
    return bad, good, sorted(set(now) - set(was))


def counts_worse(c: dict, ref: dict, skips: bool = True, than: str = "the reference") -> list:
    """Why the counts ``c`` of a file's run are worse than ``ref``'s (the
    reference's, or a baseline's: ``than`` names it): fewer passes, more
    failures and errors together, more hangs (or timeouts), more tests not
    run, and (``skips``) more skips.  Empty when they are not."""
    why = []
    if c.get("pass", 0) < ref.get("pass", 0):
        why.append(f"fewer passes than {than} ({c.get('pass', 0)} < {ref.get('pass', 0)})")
    fe = lambda x: x.get("fail", 0) + x.get("error", 0)  # noqa: E731
    if fe(c) > fe(ref):
        why.append(f"more failures and errors than {than} ({fe(c)} > {fe(ref)})")
    for k in ("hang", "timeout", "not run") + (("skip",) if skips else ()):
        if c.get(k, 0) > ref.get(k, 0):
            why.append(f"more {k} than {than} ({c[k]} > {ref.get(k, 0)})")
    return why


def report(bad: list, better: list = (), log=print) -> None:
    """Print the improvements (``IMPROVED ...``: the baseline wants a
    refresh) and then the regressions (``REGRESSION ...``), one per line."""
    for msg in better:
        log(f"IMPROVED {msg} (refresh the baseline)")
    for msg in bad:
        log(f"REGRESSION {msg}")


def merged(outs: list) -> str:
    """One test's outcome over the ranks that ran it (each rank's outcome):
    a hang if any rank hung; skip if every rank skipped; pass if each passed
    or skipped; else an error, a failure or, worst for last, not run."""
    if "hang" in outs:
        return "hang"
    if all(o == "skip" for o in outs):
        return "skip"
    if all(o in ("pass", "skip") for o in outs):
        return "pass"
    return next((o for o in ("error", "fail") if o in outs), "not run")


def pe_records(outdir: str) -> dict:
    """The records of a Python suite's job: PE (or rank) -> its JSON lines
    from ``outdir/pe<N>.jsonl`` (``conformance/shmem/unittest_runner.py``
    and the runners built on it write them as tests start and stop; a line
    cut short by a crash is left out)."""
    recs = {}
    for path in glob.glob(os.path.join(outdir, "pe*.jsonl")):
        pe = int(os.path.basename(path)[2:-6])
        with open(path) as f:
            recs[pe] = [json.loads(line) for line in f if line.strip().endswith("}")]
    return recs


def pe_outcomes(recs: dict, n: int) -> dict:
    """Per-test outcomes over the PEs (a test passes when it passed or was
    skipped on every PE; a test started and never stopped is a hang, one
    never started on a PE that ran others is ``not run``), the details of
    failures, whether every PE wrote its ``done`` line, and the module file
    of the shmem4py each PE imported."""
    per, details, done, modules, ids = {}, {}, 0, set(), []
    for pe in range(n):
        seen, fixtures = {}, {}
        for r in recs.get(pe, []):
            ev = r["event"]
            if ev == "start":
                seen[r["test"]] = "hang"
            elif ev == "stop":
                seen[r["test"]] = r["outcome"]
            elif ev == "detail":
                details.setdefault(r["test"], f"PE {pe}: {r['error']}")
            elif ev == "import-error":
                details.setdefault("<import>", f"PE {pe}: {r['error']}")
            elif ev == "begin":
                ids = ids or r["tests"]
                modules.add(r.get("shmem4py", ""))
            elif ev == "fixture":
                fixtures[r["scope"]] = r["outcome"]
            elif ev == "done":
                done += 1
        for tid in ids:
            # a test of a class or module whose fixture skipped or failed
            scope = next((s for s in fixtures if tid.startswith(s + ".")), None)
            if tid not in seen and scope:
                seen[tid] = fixtures[scope]
        for tid, outcome in seen.items():
            per.setdefault(tid, {})[pe] = outcome
    tests = {tid: merged([by_pe.get(pe, "not run") for pe in range(n)])
             for tid, by_pe in per.items()}
    for tid in ids:
        tests.setdefault(tid, "not run")
    return {"tests": tests, "details": details, "complete": done == n and n > 0,
            "modules": sorted(modules)}


# --- tables and results files ------------------------------------------------------

def text_table(head: tuple, rows: list, left: int = 1) -> str:
    """A fixed-width table: its first ``left`` columns left-aligned, the
    others right-aligned."""
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    fmt = "  ".join(f"{{:{'<' if i < left else '>'}{w}}}" for i, w in enumerate(widths))
    return "\n".join(fmt.format(*map(str, r)) for r in [head, *rows])


def markdown_table(head: tuple, rows: list) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


def save(path: str, data: dict, **kw) -> None:
    """Write ``data`` as JSON to ``path`` atomically (a reader never sees
    half a file)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, **kw)
        f.write("\n")
    os.replace(tmp, path)


def load(path: str) -> dict | None:
    """The JSON in ``path``, or None when there is none (or half of one)."""
    with contextlib.suppress(OSError, ValueError), open(path) as f:
        return json.load(f)
    return None


# --- download caches -----------------------------------------------------------------

@contextlib.contextmanager
def locked(cache: str):
    """Hold ``cache``'s lock (an flock on ``cache/.lock``, created if needed)."""
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(cache, ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- jobs ------------------------------------------------------------------------------

def _stats() -> dict:
    """pid -> (parent pid, session id) of every process, from /proc."""
    out = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(stat.split("/")[2])] = (int(fields[1]), int(fields[3]))
    return out


def descendants(pid: int, stats: dict | None = None) -> list:
    """Every process below ``pid`` (children first), read from /proc."""
    children = {}
    for p, (ppid, _) in (stats if stats is not None else _stats()).items():
        children.setdefault(ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc) -> None:
    """SIGKILL a job started with ``start_new_session``: the launcher, every
    process under it, and every process left in its session or process group
    (hydra's proxies start groups of their own; Open MPI's ranks leave their
    launcher's group, not its session), twice, for what was being started
    the first time."""
    for _ in range(2):
        stats = _stats()
        doomed = {proc.pid, *descendants(proc.pid, stats)}
        doomed |= {p for p, (_, sid) in stats.items() if sid == proc.pid}
        for pid in doomed:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.2)


def run_job(cmd: list, *, timeout: float, env=None, cwd=None, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, terminate_first: float = 0) -> tuple:
    """Run one job in a session of its own; ``(returncode, stdout, stderr,
    killed)``: a job still running after ``timeout`` s is killed whole
    (:func:`kill_tree`; first SIGTERM and ``terminate_first`` s of grace
    when given: a launcher that ends its own ranks) and its return code is
    None.  ``stdout``/``stderr`` as :class:`subprocess.Popen`'s; what went
    to a pipe is returned as bytes."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=stderr, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        if terminate_first:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=terminate_first)
        kill_tree(proc)
        out, err = proc.communicate()
        return None, out, err, True

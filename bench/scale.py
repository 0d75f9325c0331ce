"""Scale benchmark (``make bench-scale``, part of ``make bench``): the same
mpi4py program on mpi_shim under ``ucxpy-run`` and on mpi4py + MPICH under
the mpich wheel's ``mpiexec``, at 8, 16, 32 and 64 ranks on this one host
(more ranks than cores: oversubscribed).

Per rank count and implementation:

``launch``   the same program stopped after its first Barrier: it imports
             numpy and MPI (mpi_shim's drop-in ``MPI`` or mpi4py's), passes
             one ``COMM_WORLD.Barrier`` and exits.  *launch* is the wall time
             from the driver starting the launcher until the last rank
             passed that Barrier (each rank prints ``time.time()`` after
             it); *wall* is launcher start to launcher exit.  Best of
             ``--launch-repeat`` jobs.
``main``     ``--main-repeat`` jobs (3; --quick 1) measuring, after their
             first Barrier:

             * all-to-all: each rank posts an ``Irecv`` from and an ``Isend``
               to every other rank (64 KiB, then 8 KiB), then ``Waitall``;
               a repeat's time is the slowest rank's, the median over
               ``A2A_REPEATS`` repeats (after ``A2A_WARM`` untimed ones)
               is reported;
             * ping-pong: 8 B ``Send``/``Recv`` between ranks 0 and 1 while
               every other rank waits in ``Barrier`` (half round trip, the
               median of 5 blocks);
             * memory: an all-to-all of 32 KiB to every peer, 100 times
               (wraps the shared-memory buffers), then each rank reads its
               own ``/proc/self/smaps_rollup`` while all are alive: PSS
               summed over the ranks (shared pages counted once), RSS summed
               and the largest rank's RSS.

The main jobs of the two implementations alternate (ours, MPICH; MPICH,
ours; ...), and each figure is the median over a rank count's main jobs: with
16-32 ranks per CPU one job's all-to-all varies by 2x and more with where
the scheduler puts its ranks (the same for both libraries: four jobs each at
32 ranks, 8 KiB, 2026-12-06, took 9.4-18.7 ms on ucxpy and 8.1-14.7 ms on
MPICH), so one job per side gave a ratio anywhere from 0.6x to 2.3x.  Each
job's all-to-all figures are printed as it ends, and kept in the JSON.

Prints each figure ours / MPICH and the growth from one rank count to the
next (so a superlinear step stands out), then the targets (issue 31) as
PASS/FAIL:

* the all-to-all <= 1.5x MPICH at every rank count, with 64 KiB and 8 KiB;
* launch and wall <= 1.5x MPICH at every rank count;
* the ping-pong while the others wait <= 1.5x MPICH at 32 and 64 ranks;
* PSS at 32 ranks <= 1.5x MPICH's, and PSS growing from 16 to 64 ranks by
  no more than MPICH's does.

First (``--first yes|no|only``), issue 44's start-up figures: a user's
first program exactly, with no numpy on either side,
``python -c "from mpi_shim import MPI; MPI.COMM_WORLD.Barrier()"`` under
``ucxpy-run`` against the same with mpi4py under ``mpiexec`` at 16 and 64
ranks (best of 3 jobs, the sides alternating), the import alone in one
process (best of 5), and ``import shmem; shmem.init();
shmem.barrier_all()`` against the same with shmem4py under ``oshrun`` (when
shmem4py is installed; OSHMEM over the system's UCX crashes in
``shmem_finalize`` here, so a job whose PEs all passed the barrier counts);
targets: each <= 1.5x its reference.

A target whose rank counts were not run (``--quick``, ``--ranks``) is N/A.
The project's modules are byte-compiled first (:func:`compile_sources`).
Every job has a hard timeout; on timeout its session is killed, and so is
every process still carrying the job's marker in its environment (ranks that
left the launcher's process group).  Results go to ``bench/results/scale.json``.

Usage::

    python bench/scale.py [--quick] [--ranks 8,16,32,64] [--repeat N]
                          [--launch-repeat N] [--main-repeat N] [--timeout S]
                          [--json FILE] [--impls ours,mpich] [--first yes|no|only]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(ROOT, "bench", "results")
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, ROOT)

from ucxpy.tools import snapshot  # noqa: E402

#: the targets of issue 31
FACTOR = 1.5
A2A_SIZES = (64 << 10, 8 << 10)
#: all-to-all repeats per size (--repeat), and the untimed ones before them:
#: on 2 CPUs one repeat of an oversubscribed job varies by 2x and more with
#: where the scheduler puts the ranks, and the first few run while the
#: job's connections and buffers are still being made (both libraries)
A2A_REPEATS, A2A_QUICK_REPEATS, A2A_WARM = 30, 10, 5
PINGPONG_TARGET_RANKS = (32, 64)
MEM_TARGET_RANKS = 32
MEM_GROWTH = (16, 64)
#: the memory phase: this many bytes to every peer, this many times
MEM_BYTES, MEM_ROUNDS = 32 << 10, 100
#: the environment variable that marks every process of a job (stray killing)
MARKER = "SCALE_BENCH_JOB"

IMPLS = {"ours": "mpi_shim under ucxpy-run", "mpich": "mpi4py + MPICH under mpiexec"}


def _say(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------ the rank program

def _smaps_rollup() -> dict:
    """Pss and Rss of this process in KiB (``/proc/self/smaps_rollup``)."""
    out = {}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("Pss", "Rss"):
                    out[k.lower()] = int(v.split()[0])
    except OSError:
        pass
    return out


def _alltoall(MPI, comm, np, size: int, reps: int, warm: int) -> list:
    """Seconds per repeat of this rank: Irecv from and Isend to every other
    rank, Waitall; the payload is checked once at the end."""
    rank, n = comm.Get_rank(), comm.Get_size()
    sbuf = np.full(size, rank % 251, dtype=np.uint8)
    rbuf = np.zeros((n, size), dtype=np.uint8)
    srcs = [(rank - k) % n for k in range(1, n)]
    dsts = [(rank + k) % n for k in range(1, n)]
    times = []
    for i in range(warm + reps):
        comm.Barrier()
        t0 = time.perf_counter()
        reqs = [comm.Irecv(rbuf[s], s, 7) for s in srcs]
        reqs += [comm.Isend(sbuf, d, 7) for d in dsts]
        MPI.Request.Waitall(reqs)
        if i >= warm:
            times.append(time.perf_counter() - t0)
    bad = [s for s in srcs if rbuf[s][0] != s % 251 or rbuf[s][-1] != s % 251]
    if bad:
        raise SystemExit(f"rank {rank}: all-to-all of {size} B: wrong data from {bad[:8]}")
    return times


def _pingpong(comm, np, blocks: int, block_time: float) -> list:
    """8 B ping-pong between ranks 0 and 1 while the others wait in
    Barrier; rank 0 returns the half round trip of each block (s)."""
    rank = comm.Get_rank()
    buf = np.zeros(8, dtype=np.uint8)
    out = []
    comm.Barrier()
    if rank == 0:
        for _ in range(blocks):
            k, t0 = 0, time.perf_counter()
            buf[0] = 1
            while True:
                comm.Send(buf, 1, 3)
                comm.Recv(buf, 1, 3)
                k += 1
                dt = time.perf_counter() - t0
                if dt >= block_time:
                    break
            out.append(dt / k / 2)
        buf[0] = 0
        comm.Send(buf, 1, 3)
    elif rank == 1:
        while True:
            comm.Recv(buf, 0, 3)
            if buf[0] == 0:
                break
            comm.Send(buf, 0, 3)
    comm.Barrier()        # the waiting ranks have been here all along
    return out


def rank_main(impl: str, mode: str, reps: int) -> int:
    # a program that moves arrays: numpy before MPI, in every mode (the
    # launch job is this same program, stopped after its first Barrier)
    import numpy as np
    if impl == "ours":
        from mpi_shim import MPI
    else:
        from mpi4py import MPI
    comm = MPI.COMM_WORLD
    comm.Barrier()
    t_barrier = time.time()
    rank, n = comm.Get_rank(), comm.Get_size()
    sys.stdout.flush()
    os.write(1, f"SCALE-BARRIER {rank} {t_barrier:.6f}\n".encode())   # one write: no interleaving
    if mode == "launch":
        return 0
    res: dict = {"alltoall": {}}
    for size in A2A_SIZES:
        times = _alltoall(MPI, comm, np, size, reps, A2A_WARM)
        per = comm.gather(times, root=0)
        if rank == 0:
            slowest = [max(col) for col in zip(*per)]
            res["alltoall"][str(size)] = {"median_s": statistics.median(slowest),
                                          "min_s": min(slowest), "reps": len(slowest)}
    if n >= 2:
        pp = _pingpong(comm, np, 5, 0.2)
        if rank == 0:
            res["pingpong"] = {"half_rtt_s": statistics.median(pp), "blocks": pp}
    t0 = time.perf_counter()
    _alltoall(MPI, comm, np, MEM_BYTES, MEM_ROUNDS, 0)
    mem_time = time.perf_counter() - t0
    comm.Barrier()
    mem = _smaps_rollup()
    comm.Barrier()        # nobody exits (and shifts the PSS shares) before all have read
    mems = comm.gather(mem, root=0)
    if rank == 0:
        pss = [m.get("pss", 0) for m in mems]
        rss = [m.get("rss", 0) for m in mems]
        res["memory"] = {"pss_sum_kib": sum(pss), "rss_sum_kib": sum(rss),
                         "rss_max_kib": max(rss), "seconds": mem_time}
        sys.stdout.flush()
        os.write(1, ("SCALE-RESULT " + json.dumps(res) + "\n").encode())
    return 0


# ------------------------------------------------------------------ running jobs

def _clean_env(token: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UCXPY_", "PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_CVAR_"))}
    env["PYTHONPATH"] = ROOT + (os.pathsep + os.environ["PYTHONPATH"]
                                if os.environ.get("PYTHONPATH") else "")
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env[MARKER] = token
    return env


def _marked_pids(token: str) -> list:
    """Processes whose environment carries ``MARKER=token``."""
    needle = f"{MARKER}={token}".encode()
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(d))
        except OSError:
            pass
    return pids


def _kill_marked(token: str) -> int:
    """SIGKILL every process of the job still alive; returns how many."""
    pids = _marked_pids(token)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(pids)


def compile_sources() -> None:
    """Byte-compile the project's packages, as an installed package has them.
    Where ``PYTHONDONTWRITEBYTECODE`` is set (this machine's sandbox sets it)
    nothing else writes them, and every rank would compile each changed
    module of an editable install at every start (0.1 s of CPU per rank)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0",
                    *(os.path.join(ROOT, d) for d in ("ucxpy", "mpi_shim", "shmem"))],
                   cwd=ROOT, stdout=subprocess.DEVNULL, timeout=300)


def launch_cmd(impl: str, n: int, mode: str, reps: int, timeout: float) -> list:
    prog = [sys.executable, os.path.abspath(__file__), "--rank", impl, mode, str(reps)]
    if impl == "ours":
        return [os.path.join(BIN, "ucxpy-run"), "-n", str(n), "--timeout",
                str(int(timeout)), *prog]
    return [os.path.join(BIN, "mpiexec"), "-n", str(n), *prog]


def run_job(impl: str, n: int, mode: str, reps: int, timeout: float) -> dict:
    """One job; returns launch/wall seconds, rank 0's results, or an error."""
    token = secrets.token_hex(8)
    env = _clean_env(token)
    cmd = launch_cmd(impl, n, mode, reps, timeout)
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout + 15)
        wall = time.time() - t0
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        strays = _kill_marked(token)
        proc.communicate()
        return {"error": f"timed out after {timeout + 15:.0f} s (killed, {strays} "
                         "stray process(es))"}
    strays = _kill_marked(token)
    barriers = {}
    result = None
    for line in out.splitlines():
        if line.startswith("SCALE-BARRIER "):
            f = line.split()
            if len(f) == 3:
                barriers[int(f[1])] = float(f[2])
        elif line.startswith("SCALE-RESULT "):
            result = json.loads(line.split(" ", 1)[1])
    if proc.returncode != 0 or len(barriers) != n or (mode == "main" and result is None):
        tail = " | ".join(ln for ln in err.strip().splitlines()[-4:])
        return {"error": f"exit {proc.returncode}, {len(barriers)}/{n} ranks passed the "
                         f"first Barrier: {tail[-600:]}"}
    out = {"launch_s": max(barriers.values()) - t0, "wall_s": wall}
    if strays:
        out["warning"] = f"{strays} process(es) outlived the launcher (killed)"
    if result is not None:
        out.update(result)
    return out


# ------------------------------------------------------------------ a first program

#: issue 44: a user's first run, exactly, with no numpy on either side
FIRST = {
    "ours": "from mpi_shim import MPI; MPI.COMM_WORLD.Barrier()",
    "mpich": "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()",
    "shmem": "import shmem; shmem.init(); shmem.barrier_all(); print('FIRST-OK')",
    "shmem4py": "from shmem4py import shmem; shmem.init(); shmem.barrier_all(); "
                "print('FIRST-OK')",
}
#: OSHMEM over the system's UCX (1.13) crashes in shmem_finalize here (signal
#: 11, with sshmem mmap or ucx alike): a shmem4py job whose every PE passed
#: the barrier counts, and its time is to the end of the job, crash included
FIRST_MARKED = ("shmem", "shmem4py")
FIRST_IMPORT = {"ours": "from mpi_shim import MPI", "mpich": "from mpi4py import MPI"}
FIRST_RANKS = (16, 64)
#: Open MPI's OSHMEM for shmem4py (as bench/run_bench.py runs it)
OMPI_LIBMPI = "/usr/lib/x86_64-linux-gnu/libmpi.so.40"
OMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def first_cmd(impl: str, n: int, timeout: float) -> list:
    prog = [sys.executable, "-c", FIRST[impl]]
    if impl in ("ours", "shmem"):
        return [os.path.join(BIN, "ucxpy-run"), "-n", str(n), "--timeout", str(int(timeout)),
                *prog]
    if impl == "mpich":
        return [os.path.join(BIN, "mpiexec"), "-n", str(n), *prog]
    return ["oshrun", "--oversubscribe", "--bind-to", "none", "-n", str(n),
            "-x", "LD_PRELOAD", *prog]


def _first_env(impl: str, token: str) -> dict:
    env = _clean_env(token)
    if impl == "shmem4py":
        env.update(OMPI_ENV)
        if os.path.exists(OMPI_LIBMPI):
            env["LD_PRELOAD"] = OMPI_LIBMPI
    return env


def _timed(cmd: list, env: dict, timeout: float, token: str, marked: int = 0):
    """Wall seconds of ``cmd`` run to its end, or an error string; with
    ``marked``, a job that printed ``FIRST-OK`` that many times counts
    whatever its exit status (see FIRST_MARKED)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        _kill_marked(token)
        proc.communicate()
        return f"timed out after {timeout:.0f} s"
    wall = time.perf_counter() - t0
    _kill_marked(token)
    if proc.returncode != 0 and not (marked and out.count("FIRST-OK") == marked):
        return f"exit {proc.returncode}: {' | '.join(err.strip().splitlines()[-3:])[-400:]}"
    return wall


def _best(runs: list):
    """The least of the times in ``runs``, or its last error when none ran."""
    times = [t for t in runs if not isinstance(t, str)]
    return min(times) if times else (runs[-1] if runs else None)


def first_program(counts, repeat: int, import_repeat: int, shmem: bool) -> dict:
    """Issue 44's start-up figures, each side alternating with its reference:
    the import alone in one process (best of ``import_repeat``) and the whole
    job at each rank count (best of ``repeat``); ``{key: {impl: seconds or
    error}}``."""
    token = secrets.token_hex(8)
    runs: dict = {}
    for i in range(import_repeat):
        for impl in (("ours", "mpich") if i % 2 == 0 else ("mpich", "ours")):
            runs.setdefault("import", {}).setdefault(impl, []).append(
                _timed([sys.executable, "-c", FIRST_IMPORT[impl]], _first_env(impl, token),
                       60, token))
    pairs = [("ours", "mpich")] + ([("shmem", "shmem4py")] if shmem else [])
    for n in counts:
        for ours, ref in pairs:
            key = f"{'job' if ours == 'ours' else 'shmem_job'}_{n}"
            for i in range(repeat):
                for impl in ((ours, ref) if i % 2 == 0 else (ref, ours)):
                    runs.setdefault(key, {}).setdefault(impl, []).append(
                        _timed(first_cmd(impl, n, 60 + 2 * n), _first_env(impl, token),
                               90 + 2 * n, token, n if impl in FIRST_MARKED else 0))
            _say(f"# first program, {n} ranks: " + "; ".join(
                f"{impl} " + ", ".join(t if isinstance(t, str) else f"{t:.2f} s" for t in ts)
                for impl, ts in runs[key].items()))
    return {key: {impl: _best(ts) for impl, ts in per.items()} for key, per in runs.items()}


def first_targets(first: dict, counts) -> list:
    """``[(name, PASS|FAIL|N/A, detail)]`` of issue 44's start-up targets."""
    res = []

    def ratio(name, key, ours, ref):
        got = first.get(key, {})
        o, r = got.get(ours), got.get(ref)
        if o is None and r is None:
            res.append((name, "N/A", "not run"))
        elif isinstance(o, str) or isinstance(r, str) or o is None or r is None:
            res.append((name, "FAIL", f"{ours}: {o}; {ref}: {r}"))
        else:
            res.append((name, "PASS" if o <= FACTOR * r else "FAIL",
                        f"{o:.3f} s vs {r:.3f} s ({o / r:.2f}x)"))

    ratio(f"from mpi_shim import MPI, one process, best of 5 <= {FACTOR:g}x mpi4py's",
          "import", "ours", "mpich")
    for n in counts:
        ratio(f"{n} ranks, import MPI + Barrier, best of 3 <= {FACTOR:g}x mpi4py+mpiexec",
              f"job_{n}", "ours", "mpich")
        ratio(f"{n} PEs, import shmem + barrier_all, best of 3 <= {FACTOR:g}x shmem4py+oshrun",
              f"shmem_job_{n}", "shmem", "shmem4py")
    return res


# ------------------------------------------------------------------ report

def _fmt_t(s) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _fmt_mem(kib) -> str:
    return "-" if kib is None else f"{kib / 1024:.0f} MiB"


def job_metrics(job: dict) -> dict:
    """Flat figures of one main job (those it measured)."""
    m = {}
    for size in A2A_SIZES:
        a = job.get("alltoall", {}).get(str(size))
        if a:
            m[f"a2a_{size >> 10}k"] = a["median_s"]
    if "pingpong" in job:
        m["pingpong"] = job["pingpong"]["half_rtt_s"]
    if "memory" in job:
        mem = job["memory"]
        m["pss"], m["rss_sum"], m["rss_max"] = mem["pss_sum_kib"], mem["rss_sum_kib"], \
            mem["rss_max_kib"]
    return m


def metrics(run: dict, per_job: list) -> dict:
    """Flat figures of one implementation at one rank count: launch and
    wall from the best launch job, the rest the median over ``per_job``
    (the :func:`job_metrics` of the main jobs that ended without error)."""
    m = {}
    la = run.get("launch") or {}
    if "launch_s" in la:
        m["launch"], m["wall"] = la["launch_s"], la["wall_s"]
    for key in {k for j in per_job for k in j}:
        m[key] = statistics.median(j[key] for j in per_job if key in j)
    return m


ROWS = [("a2a_64k", "all-to-all 64 KiB to every peer", _fmt_t),
        ("a2a_8k", "all-to-all 8 KiB to every peer", _fmt_t),
        ("launch", "launch to first Barrier", _fmt_t),
        ("wall", "whole job (launch to exit)", _fmt_t),
        ("pingpong", "8 B ping-pong 0<->1, others in Barrier (half RTT)", _fmt_t),
        ("pss", "PSS summed over ranks", _fmt_mem),
        ("rss_sum", "RSS summed over ranks", _fmt_mem),
        ("rss_max", "largest rank's RSS", _fmt_mem)]


def report(table: dict, counts: list, jobs: dict = None) -> list:
    """Print one block per figure (and with ``jobs``, ``{n: {impl: [job
    figures]}}``, the all-to-all of each main job); returns the printed lines."""
    lines = []
    for key, title, fmt in ROWS:
        have = [n for n in counts if table.get(n, {}).get("ours", {}).get(key) is not None
                or table.get(n, {}).get("mpich", {}).get(key) is not None]
        if not have:
            continue
        lines.append(f"\n== {title}")
        lines.append(f"{'ranks':>6} {'ours':>12} {'MPICH':>12} {'ours/MPICH':>11} "
                     f"{'ours growth':>12} {'MPICH growth':>13}")
        prev = None
        for n in have:
            o = table[n].get("ours", {}).get(key)
            r = table[n].get("mpich", {}).get(key)
            ratio = f"{o / r:.2f}x" if o is not None and r else "-"
            go = gr = "-"
            if prev is not None:
                po = table[prev].get("ours", {}).get(key)
                pr = table[prev].get("mpich", {}).get(key)
                if o is not None and po:
                    go = f"x{o / po:.2f}"
                if r is not None and pr:
                    gr = f"x{r / pr:.2f}"
            lines.append(f"{n:>6} {fmt(o):>12} {fmt(r):>12} {ratio:>11} {go:>12} {gr:>13}")
            prev = n
    for size in A2A_SIZES if jobs else ():
        key = f"a2a_{size >> 10}k"
        rows = []
        for n in counts:
            per = jobs.get(n, {})
            if sum(len(v) for v in per.values()) > len(per):
                rows.append(f"{n:>6}   " + "  |  ".join(
                    f"{impl}: " + " ".join(_fmt_t(j.get(key)) for j in per.get(impl, []))
                    for impl in IMPLS if impl in per))
        if rows:
            lines.append(f"\n== all-to-all {size >> 10} KiB, each main job (the table: their median)")
            lines += rows
    for ln in lines:
        print(ln)
    return lines


def targets(table: dict, counts: list) -> list:
    """``[(name, PASS|FAIL|N/A, detail)]``."""
    out = []

    def both(n, key):
        o = table.get(n, {}).get("ours", {}).get(key)
        r = table.get(n, {}).get("mpich", {}).get(key)
        return (o, r) if o is not None and r else (None, None)

    def ratio_target(name, key, ns, fmt):
        ns = [n for n in ns if n in counts]
        if not ns:
            out.append((name, "N/A", "rank counts not run"))
            return
        parts, worst, missing = [], 0.0, []
        for n in ns:
            o, r = both(n, key)
            if o is None:
                missing.append(n)
                continue
            worst = max(worst, o / r)
            parts.append(f"{n}: {fmt(o)} vs {fmt(r)} ({o / r:.2f}x)")
        if missing:
            out.append((name, "FAIL", f"no measurement at {missing}; " + "; ".join(parts)))
            return
        out.append((name, "PASS" if worst <= FACTOR else "FAIL",
                    "; ".join(parts) + f"; worst {worst:.2f}x"))

    every = [8, 16, 32, 64]
    for size in A2A_SIZES:
        ratio_target(f"all-to-all {size >> 10} KiB <= {FACTOR:g}x MPICH at every rank count",
                     f"a2a_{size >> 10}k", every, _fmt_t)
    ratio_target(f"launch to first Barrier <= {FACTOR:g}x MPICH at every rank count",
                 "launch", every, _fmt_t)
    ratio_target(f"whole-job wall time <= {FACTOR:g}x MPICH at every rank count",
                 "wall", every, _fmt_t)
    ratio_target(f"ping-pong while the others wait in Barrier <= {FACTOR:g}x MPICH at "
                 "32 and 64 ranks", "pingpong", list(PINGPONG_TARGET_RANKS), _fmt_t)
    ratio_target(f"PSS summed over ranks at {MEM_TARGET_RANKS} ranks <= {FACTOR:g}x MPICH",
                 "pss", [MEM_TARGET_RANKS], _fmt_mem)
    a, b = MEM_GROWTH
    name = f"PSS growth from {a} to {b} ranks no faster than MPICH's"
    if a in counts and b in counts:
        oa, ra = both(a, "pss")
        ob, rb = both(b, "pss")
        if None in (oa, ra, ob, rb):
            out.append((name, "FAIL", "missing measurement"))
        else:
            go, gr = ob / oa, rb / ra
            out.append((name, "PASS" if go <= gr else "FAIL",
                        f"ours {_fmt_mem(oa)} -> {_fmt_mem(ob)} (x{go:.2f}), MPICH "
                        f"{_fmt_mem(ra)} -> {_fmt_mem(rb)} (x{gr:.2f})"))
    else:
        out.append((name, "N/A", "rank counts not run"))
    return out


# ------------------------------------------------------------------ main

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="8 and 16 ranks, fewer repeats (development)")
    p.add_argument("--ranks", help="comma-separated rank counts (default 8,16,32,64)")
    p.add_argument("--repeat", type=int, help=f"all-to-all repeats per size (default "
                                               f"{A2A_REPEATS}; --quick {A2A_QUICK_REPEATS})")
    p.add_argument("--launch-repeat", type=int,
                   help="launch jobs per rank count, best kept (default 2; --quick 1)")
    p.add_argument("--main-repeat", type=int,
                   help="main jobs per rank count and implementation, alternating "
                        "between the implementations; figures are their median "
                        "(default 3; --quick 1)")
    p.add_argument("--timeout", type=float, default=0.0,
                   help="seconds per job (default 120 + 4 s per rank)")
    p.add_argument("--impls", default="ours,mpich", help="ours, mpich or both")
    p.add_argument("--json", default=os.path.join(RESULTS, "scale.json"))
    snapshot.add_option(p, "scale")
    p.add_argument("--first", choices=("yes", "no", "only"), default="yes",
                   help="issue 44's first-program figures (import MPI + Barrier; import "
                        "shmem + barrier_all) at 16 and 64 ranks: with the rest (yes), "
                        "not (no), or alone (only)")
    p.add_argument("--rank", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank:
        impl, mode, reps = args.rank
        return rank_main(impl, mode, int(reps))

    counts = [int(x) for x in args.ranks.split(",")] if args.ranks else \
        ([8, 16] if args.quick else [8, 16, 32, 64])
    reps = args.repeat or (A2A_QUICK_REPEATS if args.quick else A2A_REPEATS)
    lreps = args.launch_repeat or (1 if args.quick else 2)
    mreps = args.main_repeat or (1 if args.quick else 3)
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    for i in impls:
        if i not in IMPLS:
            p.error(f"unknown implementation {i!r} (ours, mpich)")
    started = time.monotonic()
    compile_sources()
    first, first_tg = {}, []
    if args.first != "no":
        fcounts = [n for n in FIRST_RANKS if n in counts] or list(FIRST_RANKS)
        shmem = shutil.which("oshrun") is not None and subprocess.run(
            [sys.executable, "-c", "import importlib.util as u, sys; "
             "sys.exit(u.find_spec('shmem4py') is None)"], timeout=60).returncode == 0
        _say(f"# first program (issue 44): {fcounts} ranks, best of 3 jobs; the import "
             f"alone best of 5{'' if shmem else '; no shmem4py here: shmem rows N/A'}")
        first = first_program(fcounts, 3, 5, shmem)
        first_tg = first_targets(first, fcounts)
        print("\n== targets (issue 44)")
        for name, verdict, detail in first_tg:
            print(f"{verdict:<5} {name}: {detail}")
        if args.first == "only":
            if args.json:
                os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
                with open(args.json, "w") as f:
                    json.dump({"time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                               "host": socket.gethostname(), "cpus": os.cpu_count(),
                               "first": first,
                               "first_targets": [{"name": a, "verdict": b, "detail": c}
                                                 for a, b, c in first_tg]}, f, indent=1)
            return 0
    _say(f"# scale: ranks {counts} on {os.cpu_count()} CPU(s), "
         f"{', '.join(IMPLS[i] for i in impls)}; all-to-all repeats {reps}, "
         f"launch jobs {lreps}, main jobs {mreps}")
    raw: dict = {}
    table: dict = {}
    jobs: dict = {}         # n -> impl -> [job_metrics of each main job without error]
    for n in counts:
        timeout = args.timeout or 120 + 4 * n
        runs = {impl: {"mains": []} for impl in impls}
        figures = jobs[n] = {impl: [] for impl in impls}
        for impl in impls:
            run = runs[impl]
            launches = []
            for i in range(lreps):
                _say(f"# {impl} n={n}: launch job {i + 1}/{lreps} ...")
                launches.append(run_job(impl, n, "launch", reps, timeout))
                _say("#   " + (launches[-1].get("error") or
                              f"launch {launches[-1]['launch_s']:.2f} s, "
                              f"wall {launches[-1]['wall_s']:.2f} s"))
            ok = [r for r in launches if "error" not in r]
            if ok:
                run["launch"] = min(ok, key=lambda r: r["wall_s"])
                run["launch"]["launch_s"] = min(r["launch_s"] for r in ok)
            run["launch_runs"] = launches
        for i in range(mreps):
            for impl in (impls if i % 2 == 0 else impls[::-1]):      # alternate who goes first
                _say(f"# {impl} n={n}: main job {i + 1}/{mreps} ...")
                t0 = time.monotonic()
                job = run_job(impl, n, "main", reps, timeout)
                runs[impl]["mains"].append(job)
                jm = job_metrics(job)
                if "error" not in job:
                    figures[impl].append(jm)
                a2a = ", ".join(f"all-to-all {size >> 10} KiB {_fmt_t(jm.get(f'a2a_{size >> 10}k'))}"
                                for size in A2A_SIZES)
                _say("#   " + (job.get("error") or
                              f"done in {time.monotonic() - t0:.0f} s: {a2a}") +
                     (f" ({job['warning']})" if "warning" in job else ""))
        for impl in impls:
            raw.setdefault(str(n), {})[impl] = runs[impl]
            table.setdefault(n, {})[impl] = metrics(runs[impl], figures[impl])
    _say(f"\nScale: {len(counts)} rank count(s) on one host with {os.cpu_count()} CPU(s), "
         f"{time.strftime('%Y-%m-%d %H:%M')}")
    lines = report(table, counts, jobs)
    print("\n== targets (issue 31)")
    tg = targets(table, counts)
    for name, verdict, detail in tg:
        print(f"{verdict:<5} {name}: {detail}")
    errors = [(n, i, j["error"]) for n, per in raw.items() for i, r in per.items()
              for j in r["mains"] if "error" in j]
    for n, i, e in errors:
        print(f"# {i} n={n}: {e}")
    data = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "host": socket.gethostname(), "cpus": os.cpu_count(),
            "ranks": counts, "repeat": reps, "launch_repeat": lreps, "main_repeat": mreps,
            "quick": args.quick, "raw": raw,
            "table": {str(n): v for n, v in table.items()},
            "report": lines,
            "targets": [{"name": a, "verdict": b, "detail": c} for a, b, c in tg],
            "first": first,
            "first_targets": [{"name": a, "verdict": b, "detail": c} for a, b, c in first_tg]}
    snapshot.save(args, data)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
        print(f"\n# saved {os.path.relpath(args.json, ROOT)} "
              f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

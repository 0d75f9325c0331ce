"""Benchmark driver (``make bench``): ucxpy, mpi_shim and shmem against
mpi4py on MPICH, shmem4py on Open MPI's OSHMEM, and a raw TCP socket ping-pong.

Every comparison is measured in the same run, two ranks pinned to distinct
CPUs (allreduce also on four ranks).  Suites (``--suites``, default all):

``tag``        ``tag_lat`` / ``tag_lat_nb`` / ``tag_bw``: ucxpy over each of ``--tls``
               (``UCXPY_TLS=shm``, ``tcp``, ``ofi``; ``tcp+tls`` is tcp with
               ``UCXPY_TCP_TLS=y``, the price of encryption) under ``ucxpy-run``,
               ``tag_lat`` once more on shm with ``UCXPY_TRACE`` set
               (``ucxpy-shm+trace``: the price of tracing; every other
               column runs with tracing off, the default path), and the
               price of tracing *off* from bench/trace_offcost.py (guards
               passed per message x the cost of one, against the 8 B
               latency),
               mpi_shim (under ``ucxpy-run``), mpi4py under ``mpiexec``, and a
               blocking Python socket ping-pong (the floor for tcp latency).
``rma``        ``put_lat get_lat put_bw get_bw amo_lat``: ucxpy RMA over each of
               ``--rma-tls`` (``mem_map`` + ``put_nb``/``get``/``flush``/
               ``atomic_fetch``), mpi_shim and mpi4py ``MPI.Win.Allocate``
               (``Lock``/``Put``/``Get``/``Fetch_and_op``/``Flush``).
``coll``       ``MPI.Allreduce`` (float64), ``Bcast`` and ``Alltoall`` (bytes per
               peer), 8 B .. 16 MiB on 2 and 4 ranks, and ``Allreduce`` 8 B ..
               64 KiB on 8 ranks (more ranks than cores): mpi_shim vs mpi4py
               (``allreduce`` is an old name of this suite).
``shmem``      the RMA tests through our ``shmem`` (``put``+``quiet``, ``get``,
               ``put_nbi``/``get_nbi``+``quiet``, ``atomic_fetch_add``) next to
               mpi_shim windows and shmem4py under ``oshrun`` (when shmem4py is
               importable; ``OSHCC=oshcc pip install shmem4py``).

Every job is repeated ``--repeat`` times and the best value per size is kept
(the machine is shared; the best run is the least disturbed one).  Prints one
table per test with ratios (latency: ours/reference, lower is better;
bandwidth: ours/reference, higher is better), the project's targets as
PASS/MISS (never fails), and saves ``bench/results/results.json`` and
``bench/results/bench.png``.  Figures only ever come from this driver.

The ucxpy, mpi_shim, mpi4py, shmem and shmem4py jobs are ``ucxpy-perf``
runs; all but ucxpy's own through its drivers in bench/perf_drivers.py
(``impl_args``).

Usage::

    python bench/run_bench.py [--quick] [--repeat N] [--max-time S]
                              [--tls shm,tcp,tcp+tls,ofi] [--rma-tls shm,tcp]
                              [--suites tag,rma,coll,shmem]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
#: ucxpy-perf's comparison drivers (mpi4py, mpi_shim, shmem, shmem4py)
PERF_DRIVERS = os.path.join(ROOT, "bench", "perf_drivers.py")
sys.path.insert(0, ROOT)

from ucxpy.tools import snapshot  # noqa: E402

#: the project's performance targets
SHM_LAT_FACTOR = 1.5     # ucxpy-shm latency at 8 B and 16-64 KiB <= 1.5x mpi4py
SHM_RATE_FACTOR = 0.8    # ucxpy-shm 8 B message rate (tag_bw, window 64) >= 0.8x mpi4py
SHM_BW_FACTOR = 1.2      # ucxpy-shm bandwidth from 1 MiB >= 1.2x mpi4py
SHIM_FACTOR = 1.2        # mpi_shim tag and put latency <= 1.2x ucxpy's own
SHIM_AMO_FACTOR = 1.5    # mpi_shim Fetch_and_op <= 1.5x the ucxpy atomic
SHMEM_WIN_FACTOR = 1.2   # shmem 8 B put/get/fetch-add <= 1.2x mpi_shim's window calls (issue 43)
SHIM_RATE_FACTOR = 0.9   # mpi_shim 8 B message rate >= 0.9x ucxpy-shm's (issue 32)
NB_LAT_FACTOR = 1.0      # ucxpy-shm 8 B Irecv+Isend+Waitall ping-pong <= 1.0x mpi4py (issue 32)
COLL_LAT_FACTOR = {2: 2.0, 4: 3.0}   # 8 B collectives <= this x mpi4py, per rank count
TCP_LAT_FACTOR = 1.5     # ucxpy-tcp small-message latency <= 1.5x raw socket
BIG = 1 << 20            # bandwidth target applies from this size up
SMALL = 8                # "small message" size for the latency targets

SUITES = ("tag", "rma", "coll", "shmem")
COLL_TESTS = ("allreduce", "bcast", "alltoall")
COLL_BW_FACTOR = 0.8     # a large allreduce moves >= 0.8x MPICH's bytes per second
TAG_TESTS = ("tag_lat", "tag_lat_nb", "tag_bw")
RMA_TESTS = ("put_lat", "get_lat", "put_bw", "get_bw", "amo_lat")
AR_RANKS = (2, 4)
#: more ranks than the 2 cores: Allreduce only, small sizes (waiting must yield)
OVERSUB_RANKS, OVERSUB_SIZES = 8, [8, 1024, 64 << 10]
OVERSUB_FACTOR = 3.0     # 8 B allreduce on 8 ranks <= this x mpi4py
#: sizes of --quick, per family
QUICK_SIZES = {"tag": [8, 1024, 64 << 10, 1 << 20, 4 << 20],
               "rma": [8, 1024, 64 << 10, 1 << 20],
               "coll": [8, 1024, 64 << 10, 1 << 20, 16 << 20]}
#: Open MPI's library, preloaded for shmem4py: a shmem4py built next to the
#: mpich wheel links both libmpi.so.12 and .40, and MPICH's MPI_* would win
OMPI_LIBMPI = "/usr/lib/x86_64-linux-gnu/libmpi.so.40"
OMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def _say(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------ running jobs

def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UCXPY_", "PMI_", "PMIX_", "OMPI_", "HYDRA_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_perf(label: str, cmd: list, env: dict, timeout: float) -> dict:
    """Run one ucxpy-perf job; returns its JSON results or ``{"error": ...}``.
    A job that wrote its results and then failed (in finalize) keeps its
    results, with a warning."""
    from ucxpy.tools.perf import parse_table
    os.makedirs(RESULTS, exist_ok=True)
    out = os.path.join(RESULTS, f"{label}.json")
    if os.path.exists(out):
        os.unlink(out)
    t0 = time.monotonic()
    try:
        cp = subprocess.run(cmd + ["--json", out], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    took = time.monotonic() - t0
    lines = [ln for ln in (cp.stderr or cp.stdout).strip().splitlines() if ln.strip()]
    tail = " | ".join(lines[-3:])
    if not os.path.exists(out):
        return {"error": f"exit {cp.returncode}: {tail}"}
    with open(out) as f:
        data = json.load(f)
    if cp.returncode != 0:
        # rank 0 wrote its results before finalize: a teardown failure does not
        # invalidate the measurement, but it is reported
        crash = next((ln.strip() for ln in lines if "Signal:" in ln), "")
        data["warning"] = (f"exit {cp.returncode} after writing its results"
                           + (f" ({crash})" if crash else f": {tail[-200:]}"))
    if not data.get("tests"):
        data["tests"] = parse_table(cp.stdout)
    data["seconds"] = took
    return data


def _report(run: dict) -> None:
    if "error" in run:
        _say(f"#   failed: {run['error']}")
    elif "warning" in run:
        _say(f"#   done in {run.get('seconds', 0):.0f} s; warning: {run['warning']}")
    else:
        _say(f"#   done in {run.get('seconds', 0):.0f} s")


def impl_args(impl: str) -> list:
    """ucxpy-perf's options that run the driver ``impl`` of bench/perf_drivers.py."""
    return ["--drivers", PERF_DRIVERS, "--impl", impl]


def perf_args(impl_flag: list, tests, sizes, max_time: float) -> list:
    args = impl_flag + ["--pin", "-t", ",".join(tests), "--max-time", str(max_time)]
    if sizes:
        args += ["--sizes", ",".join(map(str, sizes))]
    return args


def ucxpy_cmd(args: list, timeout: float, n: int = 2) -> list:
    return [sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", str(n), "--timeout",
            str(int(timeout)), sys.executable, "-m", "ucxpy.tools.perf"] + args


def mpi_cmd(args: list, n: int = 2) -> list:
    return ["mpiexec", "-n", str(n), sys.executable, "-m", "ucxpy.tools.perf"] + args


def oshrun_cmd(args: list, n: int = 2) -> list:
    return ["oshrun", "--oversubscribe", "--bind-to", "none", "-n", str(n),
            "-x", "PYTHONPATH", "-x", "LD_PRELOAD",
            sys.executable, "-m", "ucxpy.tools.perf"] + args


def shmem4py_env() -> dict:
    extra = dict(OMPI_ENV)
    if os.path.exists(OMPI_LIBMPI):
        extra["LD_PRELOAD"] = OMPI_LIBMPI
    return _clean_env(**extra)


def shmem4py_status() -> str:
    """'' when shmem4py can run here, else why not."""
    if shutil.which("oshrun") is None:
        return "oshrun not found (apt-get install openmpi-bin)"
    # only look for the package: loading OSHMEM outside oshrun may crash at exit
    cp = subprocess.run([sys.executable, "-c", "import importlib.util as u, sys; "
                         "sys.exit(u.find_spec('shmem4py') is None)"],
                        capture_output=True, text=True, env=_clean_env(), timeout=60)
    if cp.returncode != 0:
        return "shmem4py is not installed (OSHCC=oshcc pip install shmem4py)"
    return ""


def _better(test: str, row: dict, cur) -> bool:
    from ucxpy.tools.perf import LATENCY_TESTS
    if cur is None:
        return True
    if test.split("@")[0] in LATENCY_TESTS:
        return row["latency_us"] < cur["latency_us"]
    return row["bandwidth_GBps"] > cur["bandwidth_GBps"]


def best_of(runs: list) -> dict:
    """Merge repeated runs: lowest latency / highest bandwidth per (test, size)."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[-1]["error"] if runs else "not run"}
    merged = {"meta": ok[0]["meta"], "tests": {}, "runs": len(ok),
              "warnings": sorted({r["warning"] for r in ok if "warning" in r})}
    for test in ok[0]["tests"]:
        by_size = {}
        for r in ok:
            for row in r["tests"].get(test, []):
                if _better(test, row, by_size.get(row["size"])):
                    by_size[row["size"]] = row
        merged["tests"][test] = [by_size[s] for s in sorted(by_size)]
    return merged


def merge_into(impls: dict, errors: dict, label: str, data: dict, rename=None) -> None:
    """Add one job's merged results to ``impls[label]`` (tests renamed by
    ``rename``, e.g. allreduce -> allreduce@4); failures go to ``errors``."""
    if "error" in data:
        errors.setdefault(label, []).append(data["error"])
        return
    cur = impls.setdefault(label, {"meta": data["meta"], "tests": {}, "warnings": [],
                                   "lanes": {}})
    for test, rows in data["tests"].items():
        name = rename(test) if rename else test
        cur["tests"][name] = rows
        cur["lanes"][name] = data["meta"].get("lane")
        mode = (data["meta"].get("rma_modes") or {}).get(test)
        if mode:
            cur.setdefault("modes", {})[name] = mode
    cur["warnings"] += [w for w in data.get("warnings", []) if w not in cur["warnings"]]


# ------------------------------------------------------------------ raw socket reference

def _recv_exact(sock, view) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
        if k == 0:
            raise ConnectionError("peer closed")
        got += k


_HDR = struct.Struct("<QQ")   # size, iterations (0, 0 = done)


def raw_peer(port: int, cpu: int) -> None:
    """Child side of the raw ping-pong: echo what the parent asks for
    (pinned to ``cpu`` unless it is negative)."""
    if cpu >= 0:
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError:
            pass
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hdr = bytearray(_HDR.size)
        while True:
            _recv_exact(s, memoryview(hdr))
            size, n = _HDR.unpack(hdr)
            if n == 0:
                return
            buf = bytearray(size)
            mv = memoryview(buf)
            recv, send = _recv_exact, s.sendall
            for _ in range(n):
                recv(s, mv)
                send(mv)


def raw_tcp_pingpong(sizes, max_time: float, cpus, pin: bool = True) -> list:
    """Blocking socket ping-pong between this process and a child, TCP_NODELAY,
    over 127.0.0.1; half round trip per size.

    Pinned to two CPUs every wake-up crosses cores, which in a VM can cost
    far more than the context switch of two unpinned processes sharing a
    core; the caller measures both and keeps the better (the floor)."""
    from ucxpy.tools.perf import LAT_BYTES, LAT_MAX, LAT_MIN
    old = os.sched_getaffinity(0)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--raw-peer",
                              str(port), str(cpus[1 % len(cpus)] if pin else -1)],
                             env=_clean_env())
    rows = []
    try:
        if pin:
            os.sched_setaffinity(0, {cpus[0]})
        lsock.settimeout(30)
        s, _ = lsock.accept()
        s.settimeout(None)     # truly blocking, as a plain socket program would be
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with s:
            for size in sizes:
                buf = bytearray(size)
                mv = memoryview(buf)

                def run(n):
                    s.sendall(_HDR.pack(size, n))
                    for _ in range(n):
                        s.sendall(mv)
                        _recv_exact(s, mv)
                default = min(LAT_MAX, max(LAT_MIN, LAT_BYTES // size))
                warm = max(2, min(default // 10, 200))
                t0 = time.perf_counter()
                run(warm)
                per = (time.perf_counter() - t0) / warm
                n = min(default, max(LAT_MIN, int(max_time / per))) if per > 0 else default
                t0 = time.perf_counter()
                run(n)
                half = (time.perf_counter() - t0) / n / 2
                rows.append({"size": size, "iters": n, "latency_us": half * 1e6,
                             "bandwidth_GBps": size / half / 1e9})
            s.sendall(_HDR.pack(0, 0))
    finally:
        os.sched_setaffinity(0, old)
        lsock.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return rows


# ------------------------------------------------------------------ report

def _col(data: dict, test: str, key: str) -> dict:
    if not data or "error" in data:
        return {}
    return {r["size"]: r[key] for r in data.get("tests", {}).get(test, [])}


def _fmt(v, spec) -> str:
    return format(v, spec) if v is not None else "-"


def _short(label: str) -> str:
    return label[len("ucxpy-"):] if label.startswith("ucxpy-") else label


def combined_table(test: str, impls: dict, ratios=None, title=None) -> tuple:
    """Text table and rows for one test.  impls: label -> merged run data (in
    column order); ratios: ``[(label, reference label)]``, default every
    ``ucxpy-*`` and ``mpi_shim`` column over ``mpi4py``."""
    from ucxpy.tools.perf import LATENCY_TESTS
    lat = test.split("@")[0] in LATENCY_TESTS
    key = "latency_us" if lat else "bandwidth_GBps"
    unit = ("latency us (lower is better)" if lat else "bandwidth GB/s (higher is better)")
    cols = {label: _col(d, test, key) for label, d in impls.items()}
    labels = [label for label in impls if cols[label]]
    if ratios is None:
        ratios = [(lb, "mpi4py") for lb in labels if lb.startswith("ucxpy-") or lb == "mpi_shim"]
    ratios = [(a, b) for a, b in ratios if a in labels and b in labels]
    sizes = sorted({s for c in cols.values() for s in c})
    width = max([11] + [len(lb) for lb in labels])
    head = [f"{'size':>9}"] + [f"{lb:>{width}}" for lb in labels]
    rnames = [f"{_short(a)}/{_short(b)}" for a, b in ratios]
    head += [f"{n:>{max(12, len(n))}}" for n in rnames]
    lines = [f"== {title or test}: {unit}", " ".join(head)]
    rows = []
    spec = ".2f" if lat else ".4f"
    for s in sizes:
        vals = {lb: cols[lb].get(s) for lb in labels}
        cells = [f"{s:>9}"] + [f"{_fmt(vals[lb], spec):>{width}}" for lb in labels]
        row = {"size": s, **vals}
        for (a, b), n in zip(ratios, rnames):
            r = vals[a] / vals[b] if vals.get(a) is not None and vals.get(b) else None
            row[n] = r
            cells.append(f"{_fmt(r, '.2f'):>{max(12, len(n))}}")
        lines.append(" ".join(cells))
        rows.append(row)
    if not labels:
        lines.append("  (no measurements)")
    return "\n".join(lines), rows


def ucx_perftest_run(sizes, cpus, timeout: float = 120) -> dict:
    """UCX's own ``ucx_perftest`` (Debian's ucx-utils: the C limit of the same
    protocol family) for tag_lat and tag_bw, server and client pinned to two
    CPUs like every other column; one run in the driver's row format."""
    exe = shutil.which("ucx_perftest")
    if exe is None:
        return {"error": "ucx_perftest not installed (apt-get install ucx-utils)"}
    pin = (["taskset", "-c", str(cpus[0])], ["taskset", "-c", str(cpus[-1])]) \
        if len(cpus) > 1 and shutil.which("taskset") else ([], [])
    tests = {}
    for test in ("tag_lat", "tag_bw"):          # (its own tests of that name)
        rows = []
        for size in sizes:
            with socket.socket() as probe:          # a free port for its out-of-band setup
                probe.bind(("127.0.0.1", 0))
                port = str(probe.getsockname()[1])
            iters = "20000" if size <= 65536 else "2000"
            args = ["-t", test, "-s", str(max(size, 1)), "-n", iters, "-p", port]
            srv = subprocess.Popen(pin[0] + [exe] + args, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
            try:
                out = ""
                for _ in range(50):                 # the server needs a moment to listen
                    p = subprocess.run(pin[1] + [exe, "127.0.0.1"] + args, capture_output=True,
                                       text=True, timeout=timeout)
                    out = p.stdout
                    if p.returncode == 0 and "Final:" in out:
                        break
                    time.sleep(0.1)
            finally:
                try:
                    srv.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    srv.kill()
            line = next((ln for ln in out.splitlines() if ln.startswith("Final:")), None)
            if line is None:
                return {"error": f"ucx_perftest {test} {size}: no result"}
            f = line.split()
            # Final: iters  lat50 lat_avg lat_overall  bw_avg bw_overall(MB/s)  rate_avg rate_overall
            lat, bw = float(f[3]), float(f[6]) * (1 << 20) / 1e9
            rows.append({"size": size, "iters": int(f[1]), "latency_us": lat,
                         "bandwidth_GBps": bw})
        tests[test] = rows
    return {"meta": {"impl": "ucx-c", "lane": "ucx_perftest"}, "tests": tests}


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else \
        f"{n >> 10} KiB" if n >= 1024 and not n % 1024 else f"{n} B"


def trace_offcost(timeout: float) -> dict:
    """Run bench/trace_offcost.py (2 ranks, shm, tracing off): the guards
    passed per message, the cost of one, and their share of the 8 B latency."""
    _say("# running the trace off-cost probe (bench/trace_offcost.py) ...")
    cmd = [sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", "2", "--timeout",
           str(int(timeout)), sys.executable, os.path.join(ROOT, "bench", "trace_offcost.py")]
    try:
        p = subprocess.run(cmd, env=_clean_env(UCXPY_TLS="shm"), capture_output=True,
                           text=True, timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        return {"error": "trace off-cost probe timed out"}
    for line in p.stdout.splitlines():
        if line.startswith("TRACE-OFFCOST "):
            OFFCOST.update(json.loads(line.split(" ", 1)[1]))
            return OFFCOST
    return {"error": f"trace off-cost probe: exit {p.returncode}: "
                     f"{(p.stderr or p.stdout)[-300:].strip()}"}


#: the probe's figures of this run (filled by trace_offcost)
OFFCOST: dict = {}
TRACE_OFF_SHARE = 0.02   # tracing off costs <= 2% of the 8 B half round trip


def check_targets(impls: dict, raw_by_pin=None) -> list:
    """``[(name, PASS|MISS|N/A, detail)]`` for the project's targets."""
    shm_lat = _col(impls.get("ucxpy-shm"), "tag_lat", "latency_us")
    tcp_lat = _col(impls.get("ucxpy-tcp"), "tag_lat", "latency_us")
    mpi_lat = _col(impls.get("mpi4py"), "tag_lat", "latency_us")
    raw_lat = _col(impls.get("raw-tcp"), "tag_lat", "latency_us")
    shm_bw = _col(impls.get("ucxpy-shm"), "tag_bw", "bandwidth_GBps")
    mpi_bw = _col(impls.get("mpi4py"), "tag_bw", "bandwidth_GBps")
    out = []

    def ratio_target(name, ours, ref, sizes, limit, higher=False, unit="us"):
        have = [z for z in sizes if z in ours and z in ref]
        if not have:
            out.append((name, "N/A", "missing measurement"))
            return
        ratios = {z: ours[z] / ref[z] for z in have}
        worst = (min if higher else max)(ratios, key=ratios.get)
        ok = ratios[worst] >= limit if higher else ratios[worst] <= limit
        detail = ", ".join(f"{_size(z)}: {ours[z]:.3g} vs {ref[z]:.3g} {unit}" for z in have)
        out.append((name, "PASS" if ok else "MISS", f"{detail}; worst {ratios[worst]:.2f}x"))

    ratio_target(f"shm {SMALL} B latency <= {SHM_LAT_FACTOR:g}x mpi4py", shm_lat, mpi_lat,
                 [SMALL], SHM_LAT_FACTOR)
    ratio_target(f"shm 16-64 KiB latency <= {SHM_LAT_FACTOR:g}x mpi4py", shm_lat, mpi_lat,
                 [16 << 10, 64 << 10], SHM_LAT_FACTOR)
    ratio_target(f"shm {SMALL} B message rate >= {SHM_RATE_FACTOR:g}x mpi4py", shm_bw, mpi_bw,
                 [SMALL], SHM_RATE_FACTOR, higher=True, unit="GB/s")
    ratio_target(f"shm {SMALL} B non-blocking ping-pong <= {NB_LAT_FACTOR:g}x mpi4py",
                 _col(impls.get("ucxpy-shm"), "tag_lat_nb", "latency_us"),
                 _col(impls.get("mpi4py"), "tag_lat_nb", "latency_us"), [SMALL], NB_LAT_FACTOR)
    ratio_target(f"shm bandwidth >= {SHM_BW_FACTOR:g}x mpi4py for sizes >= {BIG >> 20} MiB",
                 shm_bw, mpi_bw, sorted(z for z in shm_bw if z >= BIG), SHM_BW_FACTOR,
                 higher=True, unit="GB/s")
    shim = impls.get("mpi_shim")
    ratio_target(f"mpi_shim Send/Recv {SMALL} B <= {SHIM_FACTOR:g}x ucxpy's tag latency",
                 _col(shim, "tag_lat", "latency_us"), shm_lat, [SMALL], SHIM_FACTOR)
    ratio_target(f"mpi_shim Isend/Irecv+Waitall {SMALL} B <= {SHIM_FACTOR:g}x ucxpy's "
                 "non-blocking ping-pong",
                 _col(shim, "tag_lat_nb", "latency_us"),
                 _col(impls.get("ucxpy-shm"), "tag_lat_nb", "latency_us"), [SMALL], SHIM_FACTOR)
    ratio_target(f"mpi_shim {SMALL} B message rate >= {SHIM_RATE_FACTOR:g}x ucxpy's",
                 _col(shim, "tag_bw", "bandwidth_GBps"), shm_bw, [SMALL], SHIM_RATE_FACTOR,
                 higher=True, unit="GB/s")
    shm_rma = impls.get("ucxpy-shm")
    ratio_target(f"mpi_shim Win Put+Flush {SMALL} B <= {SHIM_FACTOR:g}x ucxpy's put",
                 _col(shim, "put_lat", "latency_us"), _col(shm_rma, "put_lat", "latency_us"),
                 [SMALL], SHIM_FACTOR)
    ratio_target(f"mpi_shim Win Get+Flush {SMALL} B <= {SHIM_FACTOR:g}x ucxpy's get",
                 _col(shim, "get_lat", "latency_us"), _col(shm_rma, "get_lat", "latency_us"),
                 [SMALL], SHIM_FACTOR)
    ratio_target(f"mpi_shim Fetch_and_op <= {SHIM_AMO_FACTOR:g}x ucxpy's atomic",
                 _col(shim, "amo_lat", "latency_us"), _col(shm_rma, "amo_lat", "latency_us"),
                 [SMALL], SHIM_AMO_FACTOR)
    shmem = impls.get("shmem")
    for test, call in (("put_lat", "put+quiet vs Put+Flush"), ("get_lat", "get vs Get+Flush"),
                       ("amo_lat", "fetch-add vs Fetch_and_op")):
        ratio_target(f"shmem {SMALL} B {call} <= {SHMEM_WIN_FACTOR:g}x mpi_shim's window",
                     _col(shmem, test, "latency_us"), _col(shim, test, "latency_us"),
                     [SMALL], SHMEM_WIN_FACTOR)
    for n, limit in COLL_LAT_FACTOR.items():
        for t in COLL_TESTS:
            ratio_target(f"{t} {SMALL} B on {n} ranks <= {limit:g}x mpi4py",
                         _col(shim, f"{t}@{n}", "latency_us"),
                         _col(impls.get("mpi4py"), f"{t}@{n}", "latency_us"), [SMALL], limit)

    ratio_target(f"allreduce {SMALL} B on {OVERSUB_RANKS} ranks (2 cores) <= "
                 f"{OVERSUB_FACTOR:g}x mpi4py",
                 _col(shim, f"allreduce@{OVERSUB_RANKS}", "latency_us"),
                 _col(impls.get("mpi4py"), f"allreduce@{OVERSUB_RANKS}", "latency_us"),
                 [SMALL], OVERSUB_FACTOR)

    name = f"tcp {SMALL} B latency <= {TCP_LAT_FACTOR:g}x raw socket ping-pong"
    if SMALL in tcp_lat and SMALL in raw_lat:
        r = tcp_lat[SMALL] / raw_lat[SMALL]
        detail = f"{tcp_lat[SMALL]:.2f} us vs {raw_lat[SMALL]:.2f} us = {r:.2f}x"
        pinned = (raw_by_pin or {}).get(("pinned", SMALL))
        if pinned and pinned != raw_lat[SMALL]:
            detail += f" (vs pinned raw {pinned:.2f} us: {tcp_lat[SMALL] / pinned:.2f}x)"
        out.append((name, "PASS" if r <= TCP_LAT_FACTOR else "MISS", detail))
    else:
        out.append((name, "N/A", "missing measurement"))

    for n in AR_RANKS:
        ours = _col(impls.get("mpi_shim"), f"allreduce@{n}", "latency_us")
        ref = _col(impls.get("mpi4py"), f"allreduce@{n}", "latency_us")
        name = f"allreduce >= {BIG >> 20} MiB on {n} ranks at >= {COLL_BW_FACTOR:g}x " \
               "mpi4py's bandwidth"
        big = sorted(s for s in ours if s >= BIG and s in ref)
        if big:
            ratios = {s: ref[s] / ours[s] for s in big}       # time ratio = bandwidth ratio
            worst = min(ratios, key=ratios.get)
            detail = ", ".join(f"{s >> 20} MiB: {ours[s]:.0f} vs {ref[s]:.0f} us" for s in big)
            out.append((name, "PASS" if ratios[worst] >= COLL_BW_FACTOR else "MISS",
                        f"{detail}; worst {ratios[worst]:.2f}x"))
        else:
            out.append((name, "N/A", "missing measurement"))

    if OFFCOST:
        name = f"tracing off costs <= {TRACE_OFF_SHARE:.0%} of the {SMALL} B half round trip"
        o = OFFCOST
        detail = (f"{o['reads_per_message']:g} guards per message x {o['guard_ns']:g} ns = "
                  f"{o['offcost_ns']:g} ns of {o['half_rtt_us']:.2f} us = {o['share']:.2%}")
        out.append((name, "PASS" if o["share"] <= TRACE_OFF_SHARE else "MISS", detail))
    return out


PLOT_PANELS = ("tag_lat", "tag_bw", "put_lat", "get_lat", "put_bw", "get_bw",
               "allreduce@2", "allreduce@4", "bcast@4", "alltoall@4")


def plot(impls: dict, path: str, title: str = "") -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no plot: {e}"
    from ucxpy.tools.perf import LATENCY_TESTS
    panels = [t for t in PLOT_PANELS if any(_col(d, t, "latency_us") for d in impls.values())]
    if not panels:
        return "no plot: nothing measured"
    ncol = min(4, len(panels))
    nrow = (len(panels) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.8 * nrow), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    colors = {label: f"C{i % 10}" for i, label in enumerate(impls)}   # one per impl
    for ax, test in zip(axes.flat, panels):
        lat = test.split("@")[0] in LATENCY_TESTS
        key = "latency_us" if lat else "bandwidth_GBps"
        for label, data in impls.items():
            col = _col(data, test, key)
            if col:
                xs = sorted(col)
                ax.plot(xs, [col[x] for x in xs], marker="o", ms=3, label=label,
                        color=colors[label])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes")
        ax.set_ylabel("latency (us)" if lat else "bandwidth (GB/s)")
        ax.set_title(test.replace("@", ", ranks="))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"ucxpy vs mpi4py (MPICH) / shmem4py (OSHMEM), ranks pinned, "
                 f"{title or 'host ' + socket.gethostname()}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# ------------------------------------------------------------------ main

def _repeat_job(label, tag, cmd_fn, env, repeat, timeout) -> dict:
    runs = []
    for i in range(repeat):
        _say(f"# running {label} {tag} (run {i + 1}/{repeat}) ...")
        runs.append(run_perf(f"{label}-{tag}-{i}".replace("@", "np"), cmd_fn(), env,
                             timeout + 30))
        _report(runs[-1])
    return best_of(runs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="ucxpy / mpi_shim / shmem vs mpi4py, "
                                            "shmem4py and raw sockets")
    p.add_argument("--tls", default="shm,tcp,tcp+tls,ofi", help="ucxpy transports for the tag suite")
    p.add_argument("--rma-tls", default="shm,tcp", help="ucxpy transports for the rma suite")
    p.add_argument("--suites", default=",".join(SUITES),
                   help=f"comma-separated among {', '.join(SUITES)} (default: all)")
    p.add_argument("--repeat", type=int, default=None,
                   help="runs per job, best kept (default 2; 1 with --quick)")
    p.add_argument("--max-time", type=float, default=0.4, help="seconds per size and run")
    p.add_argument("--quick", action="store_true", help="fewer sizes, shorter runs")
    p.add_argument("--skip-mpi", action="store_true", help="do not run the mpi4py reference")
    p.add_argument("--skip-trace", action="store_true",
                   help="do not run the traced ucxpy-shm tag_lat job")
    p.add_argument("--only-trace", action="store_true",
                   help="tag suite: run only ucxpy-shm and ucxpy-shm+trace tag_lat (a smoke "
                        "of the tracing cost)")
    p.add_argument("--skip-shmem4py", action="store_true", help="do not run shmem4py")
    p.add_argument("--timeout", type=float, default=240, help="seconds per job")
    snapshot.add_option(p, "bench")
    p.add_argument("--raw-peer", nargs=2, type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.raw_peer:
        raw_peer(*args.raw_peer)
        return 0
    suites = [("coll" if s.strip() == "allreduce" else s.strip())
              for s in args.suites.split(",") if s.strip()]
    for s in suites:
        if s not in SUITES:
            p.error(f"unknown suite {s!r}; choose from {', '.join(SUITES)}")

    from ucxpy.config import Config
    from ucxpy.context import load_transport
    from ucxpy.tools.perf import DEFAULT_SIZES

    started = time.monotonic()
    repeat = args.repeat or (1 if args.quick else 2)
    max_time = min(args.max_time, 0.2) if args.quick else args.max_time
    sizes = {fam: (QUICK_SIZES[fam] if args.quick else None) for fam in QUICK_SIZES}
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        _say("# note: fewer than 2 CPUs available; ranks share a core (numbers will suffer)")
    T = args.timeout
    impls: dict = {}
    errors: dict = {}
    notes = []

    def job(label, tag, cmd_fn, env, rename=None):
        merge_into(impls, errors, label, _repeat_job(label, tag, cmd_fn, env, repeat, T),
                   rename)

    def usable(tl) -> bool:
        cls, avail = load_transport(tl, Config.from_env({}))
        if cls is None or not avail.available:
            errors.setdefault(f"ucxpy-{tl}", []).append(f"transport unavailable: {avail.reason}")
            _say(f"# ucxpy-{tl}: skipped ({avail.reason})")
            return False
        return True

    tls = [t.strip() for t in args.tls.split(",") if t.strip()]
    rma_tls = [t.strip() for t in args.rma_tls.split(",") if t.strip()]
    if args.only_trace:
        tls, rma_tls, suites, args.skip_mpi = ["shm"], [], ["tag"], True
    # -- ucxpy's own API, per transport
    for tl in dict.fromkeys((tls if "tag" in suites else []) +
                            (rma_tls if "rma" in suites else [])):
        # "tcp+tls": tcp with UCXPY_TCP_TLS=y, to price encryption against plain tcp
        base, _, extra = tl.partition("+")
        if not usable(base):
            continue
        if extra == "tls" and base == "tcp" and shutil.which("openssl") is None:
            errors.setdefault(f"ucxpy-{tl}", []).append("no openssl command (certificates)")
            continue
        env = _clean_env(UCXPY_TLS=base, **({"UCXPY_TCP_TLS": "y"} if extra == "tls" else {}))
        if "tag" in suites and tl in tls:
            a = perf_args([], TAG_TESTS, sizes["tag"], max_time)
            job(f"ucxpy-{tl}", "tag", lambda a=a: ucxpy_cmd(a, T), env)
        if "rma" in suites and tl in rma_tls:
            a = perf_args([], RMA_TESTS, sizes["rma"], max_time)
            job(f"ucxpy-{tl}", "rma", lambda a=a: ucxpy_cmd(a, T), env)

    # -- the price of tracing: shm tag_lat again with UCXPY_TRACE (the ring of
    # UCXPY_TRACE_EVENTS=200000 fills and evicts, as in a long traced run)
    if "tag" in suites and "shm" in tls and not args.skip_trace and "ucxpy-shm" in impls:
        import tempfile
        with tempfile.TemporaryDirectory(prefix="ucxpy-bench-trace-") as tdir:
            env = _clean_env(UCXPY_TLS="shm", UCXPY_TRACE=tdir, UCXPY_TRACE_EVENTS="200000")
            a = perf_args([], ("tag_lat",), sizes["tag"], max_time)
            job("ucxpy-shm+trace", "tag", lambda a=a: ucxpy_cmd(a, T), env)
        offcost = trace_offcost(T)
        if "error" in offcost:
            errors.setdefault("trace-off", []).append(offcost["error"])

    # -- the same mpi4py code: mpi_shim under ucxpy-run, mpi4py on MPICH under mpiexec
    mpi_impls = [("mpi_shim", impl_args("mpi_shim"), lambda a, n: ucxpy_cmd(a, T, n),
                  _clean_env())]
    if not args.skip_mpi:
        mpi_impls.append(("mpi4py", impl_args("mpi4py"), lambda a, n: mpi_cmd(a, n),
                          _clean_env()))
    if args.only_trace:
        mpi_impls = []
    for label, flag, launch, env in mpi_impls:
        if "tag" in suites:
            a = perf_args(flag, TAG_TESTS, sizes["tag"], max_time)
            job(label, "tag", lambda a=a: launch(a, 2), env)
        if "rma" in suites or "shmem" in suites:
            a = perf_args(flag, RMA_TESTS, sizes["rma"], max_time)
            job(label, "rma", lambda a=a: launch(a, 2), env)
        if "coll" in suites:
            for n in AR_RANKS:
                a = perf_args(flag, COLL_TESTS, sizes["coll"], max_time)
                job(label, f"coll@{n}", lambda a=a, n=n: launch(a, n), env,
                    rename=lambda t, n=n: f"{t}@{n}")
            a = perf_args(flag, ("allreduce",), OVERSUB_SIZES, max_time)
            n = OVERSUB_RANKS
            job(label, f"coll@{n}", lambda a=a, n=n: launch(a, n), env,
                rename=lambda t, n=n: f"{t}@{n}")

    # -- OpenSHMEM: ours, and shmem4py on Open MPI's OSHMEM
    if "shmem" in suites:
        a = perf_args(impl_args("shmem"), RMA_TESTS, sizes["rma"], max_time)
        job("shmem", "rma", lambda a=a: ucxpy_cmd(a, T), _clean_env())
        why = "skipped (--skip-shmem4py)" if args.skip_shmem4py else shmem4py_status()
        if why:
            notes.append(f"shmem4py: {why}; its column is left out")
            _say(f"# {notes[-1]}")
        else:
            a = perf_args(impl_args("shmem4py"), RMA_TESTS, sizes["rma"], max_time)
            job("shmem4py", "rma", lambda a=a: oshrun_cmd(a), shmem4py_env())
            if any("after writing" in w for w in impls.get("shmem4py", {}).get("warnings", [])):
                notes.append("shmem4py: Open MPI's OSHMEM crashed in shmem_finalize after "
                             "the results were written; the figures (printed before the "
                             "crash) are valid")

    # -- raw socket floor for tcp latency
    raw_by_pin = {}
    if "tag" in suites and "tcp" in tls:
        _say("# running raw TCP socket ping-pong ...")
        raw_runs = []
        raw_sizes = sizes["tag"] or list(DEFAULT_SIZES)
        for _ in range(repeat):
            for pin in (True, False):
                try:
                    rows = raw_tcp_pingpong(raw_sizes, max_time, cpus, pin)
                    raw_runs.append({"meta": {"impl": "raw-tcp", "lane": "socket"},
                                     "tests": {"tag_lat": rows}})
                    for r in rows:
                        k = ("pinned" if pin else "unpinned", r["size"])
                        raw_by_pin[k] = min(raw_by_pin.get(k, float("inf")), r["latency_us"])
                except (OSError, ConnectionError) as e:
                    raw_runs.append({"error": f"{type(e).__name__}: {e}"})
        merge_into(impls, errors, "raw-tcp", best_of(raw_runs))

    # -- UCX in C: the physical limit of this protocol family on this machine
    if "tag" in suites and "shm" in tls and not args.only_trace:
        _say("# running ucx_perftest (UCX in C) ...")
        ucx_sizes = sizes["tag"] or list(DEFAULT_SIZES)
        merge_into(impls, errors, "ucx-c",
                   best_of([ucx_perftest_run(ucx_sizes, cpus) for _ in range(repeat)]))

    # -- tables
    print()
    tables = {}

    def show(key, test, labels, ratios=None, title=None):
        text, rows = combined_table(test, {lb: impls[lb] for lb in labels if lb in impls},
                                    ratios, title)
        tables[key] = rows
        print(text + "\n")

    ucx_tag = [f"ucxpy-{t}" for t in tls]
    ucx_rma = [f"ucxpy-{t}" for t in rma_tls]
    if "tag" in suites:
        show("tag_lat", "tag_lat", ucx_tag + ["mpi_shim", "mpi4py", "ucx-c", "raw-tcp"])
        show("tag_lat_nb", "tag_lat_nb", ucx_tag + ["mpi_shim", "mpi4py"],
             title="tag_lat_nb (ping-pong by Irecv + Isend + Waitall; ucxpy: tag_recv_nb + "
                   "tag_send_nb + wait)")
        show("tag_bw", "tag_bw", ucx_tag + ["mpi_shim", "mpi4py", "ucx-c"])
        if "ucxpy-shm+trace" in impls:
            show("trace tag_lat", "tag_lat", ["ucxpy-shm+trace", "ucxpy-shm"],
                 [("ucxpy-shm+trace", "ucxpy-shm")],
                 title="tag_lat: shm with UCXPY_TRACE on against off (the default path)")
        if "tcp" in tls and "tcp+tls" in tls:
            for t in ("tag_lat", "tag_bw"):
                show(f"tls {t}", t, ["ucxpy-tcp+tls", "ucxpy-tcp"],
                     [("ucxpy-tcp+tls", "ucxpy-tcp")],
                     title=f"{t}: tcp with TLS (UCXPY_TCP_TLS=y) against plain tcp")
    if "rma" in suites:
        for t in RMA_TESTS:
            show(t, t, ucx_rma + ["mpi_shim", "mpi4py"],
                 title=f"{t} (ucxpy RMA / MPI.Win, rank 0 -> passive rank 1)")
    if "coll" in suites:
        for n in AR_RANKS:
            for t, what in (("allreduce", "float64"), ("bcast", "bytes from rank 0"),
                            ("alltoall", "bytes per peer")):
                show(f"{t}@{n}", f"{t}@{n}", ["mpi_shim", "mpi4py"],
                     title=f"{t} ({what}), {n} ranks")
        n = OVERSUB_RANKS
        show(f"allreduce@{n}", f"allreduce@{n}", ["mpi_shim", "mpi4py"],
             title=f"allreduce (float64), {n} ranks on 2 cores")
    if "shmem" in suites:
        for t in RMA_TESTS:
            show(f"shmem {t}", t, ["shmem", "mpi_shim", "shmem4py"],
                 [("shmem", "mpi_shim"), ("shmem", "shmem4py")],
                 title=f"shmem {t} (shmem / mpi_shim windows / shmem4py on OSHMEM)")

    for label, d in impls.items():
        lanes = sorted({v for v in d.get("lanes", {}).values() if v})
        modes = sorted(set(d.get("modes", {}).values()))
        print(f"# {label}: lane {', '.join(lanes) or '?'}"
              + (f"; RMA access {', '.join(modes)}" if modes else ""))
    if raw_by_pin:
        print(f"# raw-tcp = best of pinned and unpinned blocking ping-pong; {SMALL} B: " +
              ", ".join(f"{how} {raw_by_pin[(how, SMALL)]:.2f} us"
                        for how in ("pinned", "unpinned") if (how, SMALL) in raw_by_pin))
    for label, errs in errors.items():
        for e in errs:
            print(f"# {label}: {e}")
    for label, d in impls.items():
        for w in d.get("warnings", []):
            print(f"# {label}: warning: {w}")
    for n in notes:
        print(f"# note: {n}")
    print("\n== targets")
    targets = check_targets(impls, raw_by_pin)
    for name, verdict, detail in targets:
        print(f"{verdict:<5} {name}: {detail}")

    os.makedirs(RESULTS, exist_ok=True)
    summary = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": socket.gethostname(),
               "cpus": len(cpus), "repeat": repeat, "max_time": max_time, "quick": args.quick,
               "suites": suites, "impls": impls, "tables": tables, "errors": errors,
               "notes": notes,
               "raw_tcp_by_pinning": {f"{h}/{sz}": v for (h, sz), v in raw_by_pin.items()},
               "trace_offcost": OFFCOST,
               "targets": [{"name": n, "verdict": v, "detail": d} for n, v, d in targets]}
    jpath = os.path.join(RESULTS, "results.json")
    with open(jpath, "w") as f:
        json.dump(summary, f, indent=1)
    snapshot.save(args, summary)
    ppath = plot(impls, os.path.join(RESULTS, "bench.png"))
    print(f"\n# saved {os.path.relpath(jpath, ROOT)} and "
          f"{os.path.relpath(ppath, ROOT) if os.path.isabs(ppath) else ppath}"
          f"  ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark driver (``make bench``): ucxpy over shm and tcp against mpi4py
and a raw TCP socket ping-pong.

Runs, each with two ranks pinned to distinct CPUs:

* ``ucxpy-perf`` under ``ucxpy-run`` with ``UCXPY_TLS=shm`` and ``UCXPY_TLS=tcp``;
* ``ucxpy-perf --mpi4py`` under ``mpiexec -n 2`` (the reference);
* a blocking Python TCP socket ping-pong (TCP_NODELAY), the floor for tcp.

Every run is repeated ``--repeat`` times and the best value per size is kept
(the machine is shared; the best run is the least disturbed one).  Prints one
combined table per test, the project's targets as PASS/MISS (never fails),
and saves ``bench/results/results.json`` and ``bench/results/bench.png``.

Usage::

    python bench/run_bench.py [--quick] [--repeat N] [--max-time S] [--tls shm,tcp]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
sys.path.insert(0, ROOT)

#: the project's performance targets
SHM_LAT_FACTOR = 3.0     # ucxpy-shm small-message latency <= 3x mpi4py
TCP_LAT_FACTOR = 1.5     # ucxpy-tcp small-message latency <= 1.5x raw socket
BIG = 1 << 20            # bandwidth target applies from this size up
SMALL = 8                # "small message" size for the latency targets


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
    """Run one ucxpy-perf job; returns its JSON results or ``{"error": ...}``."""
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
    tail = " | ".join((cp.stderr or cp.stdout).strip().splitlines()[-3:])
    if not os.path.exists(out):
        return {"error": f"exit {cp.returncode}: {tail}"}
    with open(out) as f:
        data = json.load(f)
    if cp.returncode != 0:
        # rank 0 wrote its results before finalize: a teardown failure does not
        # invalidate the measurement, but it is reported
        data["warning"] = f"exit {cp.returncode} after measuring: {tail}"
    if not data.get("tests"):
        data["tests"] = parse_table(cp.stdout)
    data["seconds"] = took
    return data


def _report(run: dict) -> None:
    if "error" in run:
        _say(f"#   failed: {run['error']}")
    elif "warning" in run:
        _say(f"#   warning: {run['warning']}")
    else:
        _say(f"#   done in {run.get('seconds', 0):.0f} s")


def ucxpy_cmd(perf_args: list, timeout: float) -> list:
    return [sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", "2", "--timeout",
            str(int(timeout)), sys.executable, "-m", "ucxpy.tools.perf", "--pin"] + perf_args


def mpi_cmd(perf_args: list) -> list:
    return ["mpiexec", "-n", "2", sys.executable, "-m", "ucxpy.tools.perf", "--mpi4py",
            "--pin"] + perf_args


def best_of(runs: list) -> dict:
    """Merge repeated runs: lowest latency / highest bandwidth per (test, size)."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[-1]["error"] if runs else "not run"}
    merged = {"meta": ok[0]["meta"], "tests": {}, "runs": len(ok),
              "warnings": [r["warning"] for r in ok if "warning" in r]}
    for test in ok[0]["tests"]:
        by_size = {}
        for r in ok:
            for row in r["tests"].get(test, []):
                cur = by_size.get(row["size"])
                key = "latency_us" if test == "tag_lat" else "bandwidth_GBps"
                better = (cur is None or
                          (row[key] < cur[key] if key == "latency_us" else row[key] > cur[key]))
                if better:
                    by_size[row["size"]] = row
        merged["tests"][test] = [by_size[s] for s in sorted(by_size)]
    return merged


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


def combined_table(test: str, impls: dict) -> tuple:
    """Text table and rows for one test.  impls: label -> merged run data."""
    key = "latency_us" if test == "tag_lat" else "bandwidth_GBps"
    unit = "latency us (lower is better)" if test == "tag_lat" else "bandwidth GB/s (higher is better)"
    cols = {label: _col(d, test, key) for label, d in impls.items()}
    labels = [label for label in impls if cols[label]]
    sizes = sorted({s for c in cols.values() for s in c})
    ratio_of = [label for label in labels if label.startswith("ucxpy-")]
    ref = "mpi4py" if "mpi4py" in labels else None
    head = [f"{'size':>9}"] + [f"{label:>11}" for label in labels]
    if ref:
        head += [f"{label.split('-')[1] + '/mpi4py':>12}" for label in ratio_of]
    lines = [f"== {test}: {unit}", " ".join(head)]
    rows = []
    spec = ".2f" if test == "tag_lat" else ".4f"
    for s in sizes:
        vals = {label: cols[label].get(s) for label in labels}
        cells = [f"{s:>9}"] + [f"{_fmt(vals[label], spec):>11}" for label in labels]
        row = {"size": s, **vals}
        if ref:
            for label in ratio_of:
                a, b = vals.get(label), vals.get(ref)
                r = a / b if a is not None and b else None
                row[f"{label}/mpi4py"] = r
                cells.append(f"{_fmt(r, '.2f'):>12}")
        lines.append(" ".join(cells))
        rows.append(row)
    return "\n".join(lines), rows


def check_targets(impls: dict, raw_by_pin=None) -> list:
    """``[(name, PASS|MISS|N/A, detail)]`` for the project's targets."""
    shm_lat = _col(impls.get("ucxpy-shm"), "tag_lat", "latency_us")
    tcp_lat = _col(impls.get("ucxpy-tcp"), "tag_lat", "latency_us")
    mpi_lat = _col(impls.get("mpi4py"), "tag_lat", "latency_us")
    raw_lat = _col(impls.get("raw-tcp"), "tag_lat", "latency_us")
    shm_bw = _col(impls.get("ucxpy-shm"), "tag_bw", "bandwidth_GBps")
    mpi_bw = _col(impls.get("mpi4py"), "tag_bw", "bandwidth_GBps")
    out = []

    name = f"shm {SMALL} B latency <= {SHM_LAT_FACTOR:g}x mpi4py"
    if SMALL in shm_lat and SMALL in mpi_lat:
        r = shm_lat[SMALL] / mpi_lat[SMALL]
        out.append((name, "PASS" if r <= SHM_LAT_FACTOR else "MISS",
                    f"{shm_lat[SMALL]:.2f} us vs {mpi_lat[SMALL]:.2f} us = {r:.2f}x"))
    else:
        out.append((name, "N/A", "missing measurement"))

    name = f"shm bandwidth >= mpi4py for sizes >= {BIG >> 20} MiB"
    big = sorted(s for s in shm_bw if s >= BIG and s in mpi_bw)
    if big:
        ratios = {s: shm_bw[s] / mpi_bw[s] for s in big}
        worst = min(ratios, key=ratios.get)
        detail = ", ".join(f"{s >> 20} MiB: {shm_bw[s]:.2f} vs {mpi_bw[s]:.2f} GB/s" for s in big)
        out.append((name, "PASS" if ratios[worst] >= 1.0 else "MISS",
                    f"{detail}; worst {ratios[worst]:.2f}x"))
    else:
        out.append((name, "N/A", "missing measurement"))

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
    return out


def plot(impls: dict, path: str) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no plot: {e}"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, test, key, ylabel in ((axes[0], "tag_lat", "latency_us", "latency (us, half round trip)"),
                                  (axes[1], "tag_bw", "bandwidth_GBps", "bandwidth (GB/s)")):
        for label, data in impls.items():
            col = _col(data, test, key)
            if col:
                xs = sorted(col)
                ax.plot(xs, [col[x] for x in xs], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        ax.set_title(test)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"ucxpy point-to-point, 2 ranks pinned, host {socket.gethostname()}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ------------------------------------------------------------------ main

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="ucxpy vs mpi4py vs raw sockets")
    p.add_argument("--tls", default="shm,tcp", help="ucxpy transports to measure")
    p.add_argument("--repeat", type=int, default=2, help="runs per configuration (best kept)")
    p.add_argument("--max-time", type=float, default=1.0, help="seconds per size and run")
    p.add_argument("--quick", action="store_true", help="fewer sizes, shorter runs")
    p.add_argument("--skip-mpi", action="store_true", help="do not run the mpi4py reference")
    p.add_argument("--timeout", type=float, default=240, help="seconds per job")
    p.add_argument("--raw-peer", nargs=2, type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.raw_peer:
        raw_peer(*args.raw_peer)
        return 0

    from ucxpy.config import Config
    from ucxpy.context import load_transport
    from ucxpy.tools.perf import DEFAULT_SIZES

    started = time.monotonic()
    perf_args = ["--max-time", str(args.max_time)]
    sizes = list(DEFAULT_SIZES)
    if args.quick:
        sizes = [8, 1024, 64 << 10, 1 << 20, 4 << 20]
        perf_args = ["--max-time", str(min(args.max_time, 0.3)), "--sizes",
                     ",".join(map(str, sizes))]
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        _say("# note: fewer than 2 CPUs available; ranks share a core (numbers will suffer)")

    impls: dict = {}
    errors = {}
    for tl in [t.strip() for t in args.tls.split(",") if t.strip()]:
        label = f"ucxpy-{tl}"
        cls, avail = load_transport(tl, Config.from_env({}))
        if cls is None or not avail.available:
            errors[label] = f"transport unavailable: {avail.reason}"
            _say(f"# {label}: skipped ({avail.reason})")
            continue
        runs = []
        for i in range(args.repeat):
            _say(f"# running {label} (run {i + 1}/{args.repeat}) ...")
            runs.append(run_perf(f"{label}-{i}", ucxpy_cmd(perf_args, args.timeout),
                                 _clean_env(UCXPY_TLS=tl), args.timeout + 30))
            _report(runs[-1])
        impls[label] = best_of(runs)

    if not args.skip_mpi:
        runs = []
        for i in range(args.repeat):
            _say(f"# running mpi4py under mpiexec (run {i + 1}/{args.repeat}) ...")
            runs.append(run_perf(f"mpi4py-{i}", mpi_cmd(perf_args), _clean_env(),
                                 args.timeout + 30))
            _report(runs[-1])
        impls["mpi4py"] = best_of(runs)

    _say("# running raw TCP socket ping-pong ...")
    raw_runs, raw_by_pin = [], {}
    for _ in range(args.repeat):
        for pin in (True, False):
            try:
                rows = raw_tcp_pingpong(sizes, args.max_time, cpus, pin)
                raw_runs.append({"meta": {"impl": "raw-tcp", "lane": "socket"},
                                 "tests": {"tag_lat": rows}})
                for r in rows:
                    k = ("pinned" if pin else "unpinned", r["size"])
                    raw_by_pin[k] = min(raw_by_pin.get(k, float("inf")), r["latency_us"])
            except (OSError, ConnectionError) as e:
                raw_runs.append({"error": f"{type(e).__name__}: {e}"})
    impls["raw-tcp"] = best_of(raw_runs)

    for label, d in impls.items():
        if "error" in d:
            errors[label] = d["error"]
    print()
    tables = {}
    for test in ("tag_lat", "tag_bw"):
        text, rows = combined_table(test, {k: v for k, v in impls.items()
                                           if not (test == "tag_bw" and k == "raw-tcp")})
        tables[test] = rows
        print(text + "\n")
    lanes = {k: v.get("meta", {}).get("lane") for k, v in impls.items() if "error" not in v}
    print("# lanes: " + ", ".join(f"{k}={v}" for k, v in lanes.items() if v))
    if raw_by_pin:
        print(f"# raw-tcp = best of pinned and unpinned blocking ping-pong; {SMALL} B: " +
              ", ".join(f"{how} {raw_by_pin[(how, SMALL)]:.2f} us"
                        for how in ("pinned", "unpinned") if (how, SMALL) in raw_by_pin))
    for label, err in errors.items():
        print(f"# {label}: {err}")
    for label, d in impls.items():
        for w in d.get("warnings", []):
            print(f"# {label}: warning: {w}")
    print("\n== targets")
    targets = check_targets(impls, raw_by_pin)
    for name, verdict, detail in targets:
        print(f"{verdict:<5} {name}: {detail}")

    os.makedirs(RESULTS, exist_ok=True)
    summary = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": socket.gethostname(),
               "cpus": len(cpus), "repeat": args.repeat, "max_time": args.max_time,
               "impls": impls, "tables": tables, "errors": errors,
               "raw_tcp_by_pinning": {f"{h}/{sz}": v for (h, sz), v in raw_by_pin.items()},
               "targets": [{"name": n, "verdict": v, "detail": d} for n, v, d in targets]}
    jpath = os.path.join(RESULTS, "results.json")
    with open(jpath, "w") as f:
        json.dump(summary, f, indent=1)
    ppath = plot(impls, os.path.join(RESULTS, "bench.png"))
    print(f"\n# saved {os.path.relpath(jpath, ROOT)} and {os.path.relpath(ppath, ROOT) if os.path.isabs(ppath) else ppath}"
          f"  ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

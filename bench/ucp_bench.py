"""MPICH over ucxpy's libucp.so.0, beside MPICH over the real UCX and ucxpy's own API.

All in one run, 2 ranks on one host, each pinned to its own CPU:

* ``mpich+ucxpy``  bench/c/mpi_pingpong.c (MPICH's C API) under ``ucxpy-ucx --check``
* ``mpich+ucx``    the same binary on the UCX the mpich wheel bundles (the
                   physical limit of this path: C all the way down)
* ``ucxpy``        ucxpy's own API: ``ucxpy-perf -t tag_lat,tag_bw`` over shm
                   (``ucxpy-nb``: tag_lat_nb, a posted receive and progress, the
                   pattern MPICH's blocking receive has on UCP)
* ``mpi4py+ucxpy`` / ``mpi4py+ucx``  the real mpi4py wheel running the OSU
                   latency port of mpi4py's sdist (demo/osu_latency.py)
* the per-call cost of libucp (bench/c/ucp_calls.c, CPU time) beside the same
  operations on ucxpy's Python API, one process, endpoint to itself.

Targets (issue: MPICH on ucxpy), from the C ping-pong:
8 B latency of mpich+ucxpy <= 2x ucxpy's; bandwidth at >= 1 MiB >= 0.9x ucxpy's.

Usage: python bench/ucp_bench.py [--max-time 0.3] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, ROOT)

from ucxpy.tools import snapshot, ucx  # noqa: E402

SIZES = [8, 64, 1024, 16384, 65536, 1 << 20, 4 << 20]


def _run(cmd, env=None, timeout=600) -> str:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}...: exit {p.returncode}\n{p.stderr[-2000:]}")
    return p.stdout


def pingpong_rows(out: str) -> dict:
    """bench/c/mpi_pingpong.c's JSON lines: size -> {lat_us, bw_MBps}."""
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {r["size"]: {"lat_us": r["lat_us"], "bw_MBps": r["bw_MBps"]} for r in rows}


def perf_rows(tests: dict) -> dict:
    """The tag_lat / tag_bw rows of ucxpy-perf's JSON (or of
    run_bench.ucx_perftest_run): size -> {lat_us, bw_MBps}."""
    res = {}
    for row in tests.get("tag_lat", ()):
        res.setdefault(row["size"], {})["lat_us"] = row["latency_us"]
    for row in tests.get("tag_bw", ()):
        res.setdefault(row["size"], {})["bw_MBps"] = row["bandwidth_GBps"] * 1000
    return res


def c_pingpong(exe: str, reference: bool, max_time: float) -> dict:
    env = ucx.environment(reference)
    cmd = [os.path.join(BIN, "ucxpy-ucx")] + (["--reference"] if reference else ["--check"])
    return pingpong_rows(_run(cmd + [os.path.join(BIN, "mpiexec"), "-n", "2", exe,
                                     str(max_time)], env=env))


def ucxpy_perf(max_time: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "perf.json")
        sizes = ",".join(str(s) for s in SIZES)
        _run([os.path.join(BIN, "ucxpy-run"), "-n", "2", os.path.join(BIN, "ucxpy-perf"),
              "-t", "tag_lat,tag_lat_nb,tag_bw", "-s", sizes, "--pin", "--max-time", str(max_time),
              "--json", out], env=dict(os.environ, UCXPY_TLS="shm"))
        with open(out) as f:
            tests = json.load(f)["tests"]
    nb = {row["size"]: {"lat_us": row["latency_us"]} for row in tests.get("tag_lat_nb", [])}
    return perf_rows(tests), nb


def osu_latency(reference: bool) -> dict:
    """mpi4py's demo/osu_latency.py (its sdist, fetched by the conformance runner)."""
    import tarfile
    sys.path.insert(0, os.path.join(ROOT, "conformance", "mpi"))
    from run import DEFAULT_VERSION, fetch
    cache = os.environ.get("UCXPY_CONFORMANCE_CACHE",
                           os.path.join(tempfile.gettempdir(), "ucxpy-conformance"))
    fetch(DEFAULT_VERSION, cache)                  # downloads the sdist if needed
    name = f"mpi4py-{DEFAULT_VERSION}/demo/osu_latency.py"
    demo = os.path.join(cache, name)
    if not os.path.exists(demo):
        with tarfile.open(os.path.join(cache, f"mpi4py-{DEFAULT_VERSION}.tar.gz")) as tar:
            tar.extractall(cache, members=[tar.getmember(name)], filter="data")
    cmd = [os.path.join(BIN, "ucxpy-ucx")] + (["--reference"] if reference else ["--check"])
    out = _run(cmd + [os.path.join(BIN, "mpiexec"), "-n", "2", "-bind-to", "core", sys.executable,
                      demo], env=ucx.environment(reference))
    res = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+([\d.]+)\s*$", line)
        if m:
            res[int(m.group(1))] = {"lat_us": float(m.group(2))}
    return res


def call_costs(tmp: str) -> dict:
    exe = os.path.join(tmp, "ucp_calls")
    lib = os.path.dirname(ucx.LIBUCP)
    _run(["cc", "-O2", "-o", exe, os.path.join(HERE, "c", "ucp_calls.c"), "-L" + lib, "-lucp",
          "-Wl,-rpath," + lib])
    env = dict(os.environ, UCXPY_TLS="shm")
    ours = dict((line.split()[0], float(line.split()[2]))
                for line in _run([exe, "50000"], env=env).splitlines() if line.strip())
    code = (
        "import time, ucxpy\n"
        "w = ucxpy.Context().create_worker(); ep = w.connect(w.address_bytes)\n"
        "b = bytearray(8); i = bytearray(8); n = 50000\n"
        "t = time.process_time()\n"
        "for _ in range(n): w.progress()\n"
        "print('progress_idle', (time.process_time() - t) / n * 1e9)\n"
        "t = time.process_time()\n"
        "for _ in range(n):\n"
        "    s = ep.tag_send_nb(b, 5)\n"
        "    while not s.done: w.progress()\n"
        "    r = w.tag_recv_nb(i, 5)\n"
        "    while not r.done: w.progress()\n"
        "print('send_recv_8B', (time.process_time() - t) / n * 1e9)\n")
    core = dict((line.split()[0], float(line.split()[1]))
                for line in _run([sys.executable, "-c", code], env=env).splitlines() if line.strip())
    return {k: {"libucp_ns": ours.get(k), "ucxpy_ns": core.get(k)} for k in ours}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-time", type=float, default=0.3, help="seconds per size and run")
    p.add_argument("--json", help="write the results here")
    snapshot.add_option(p, "ucp")
    args = p.parse_args(argv)
    if not os.path.exists(ucx.LIBUCP):
        print("libucp.so.0 is not built (libucx-dev): nothing to measure")
        return 0
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "impls": {}}
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "mpi_pingpong")
        _run([os.path.join(BIN, "mpicc"), "-O2", "-o", exe,
              os.path.join(HERE, "c", "mpi_pingpong.c")])
        impls = results["impls"]
        impls["mpich+ucx"] = c_pingpong(exe, True, args.max_time)
        impls["mpich+ucxpy"] = c_pingpong(exe, False, args.max_time)
        impls["ucxpy"], impls["ucxpy-nb"] = ucxpy_perf(args.max_time)
        for label, ref in (("mpi4py+ucx", True), ("mpi4py+ucxpy", False)):
            try:
                impls[label] = osu_latency(ref)
            except Exception as e:      # the sdist may be out of reach: say so, go on
                results.setdefault("errors", {})[label] = str(e)[:300]
        results["calls"] = call_costs(tmp)

    impls = results["impls"]
    labels = [k for k in ("mpich+ucxpy", "mpich+ucx", "ucxpy", "ucxpy-nb", "mpi4py+ucxpy",
                          "mpi4py+ucx") if k in impls]
    print("\nlatency, half round trip (us)")
    print(f"{'size':>8} " + " ".join(f"{k:>13}" for k in labels))
    for s in SIZES:
        print(f"{s:>8} " + " ".join(
            f"{impls[k].get(s, {}).get('lat_us', float('nan')):>13.2f}" for k in labels))
    bw_labels = [k for k in ("mpich+ucxpy", "mpich+ucx", "ucxpy") if k in impls]
    print("\nbandwidth, window of 64 (MB/s)")
    print(f"{'size':>8} " + " ".join(f"{k:>13}" for k in bw_labels))
    for s in SIZES:
        print(f"{s:>8} " + " ".join(
            f"{impls[k].get(s, {}).get('bw_MBps', float('nan')):>13.0f}" for k in bw_labels))
    print("\nper call, CPU time (ns): libucp from C vs ucxpy's Python API")
    for name, row in results["calls"].items():
        print(f"  {name:<16} {row['libucp_ns']:>8.0f} {row['ucxpy_ns']:>8.0f}  "
              f"({row['libucp_ns'] / row['ucxpy_ns']:.2f}x)")

    ours, own, ref = impls["mpich+ucxpy"], impls["ucxpy"], impls["mpich+ucx"]
    lat = ours[8]["lat_us"] / own[8]["lat_us"]
    big = [s for s in SIZES if s >= 1 << 20]
    bw = min(ours[s]["bw_MBps"] / own[s]["bw_MBps"] for s in big)
    results["targets"] = {
        "latency_8B_vs_ucxpy": {"ratio": lat, "limit": 2.0, "pass": lat <= 2.0},
        "bandwidth_1MiB_up_vs_ucxpy": {"ratio": bw, "limit": 0.9, "pass": bw >= 0.9},
    }
    print("\ntargets")
    print(f"  8 B latency, mpich+ucxpy / ucxpy      {lat:6.2f}x  [<= 2.0x]  "
          f"{'PASS' if lat <= 2.0 else 'MISS'}")
    if 8 in impls.get("ucxpy-nb", {}):
        print(f"  (8 B latency, mpich+ucxpy / ucxpy-nb  "
              f"{ours[8]['lat_us'] / impls['ucxpy-nb'][8]['lat_us']:6.2f}x)")
    print(f"  bandwidth >= 1 MiB, mpich+ucxpy / ucxpy {bw:6.2f}x  [>= 0.9x]  "
          f"{'PASS' if bw >= 0.9 else 'MISS'}")
    print(f"  (the real UCX's limit: 8 B latency mpich+ucxpy / mpich+ucx "
          f"{ours[8]['lat_us'] / ref[8]['lat_us']:.1f}x, bandwidth at 4 MiB "
          f"{ours[4 << 20]['bw_MBps'] / ref[4 << 20]['bw_MBps']:.2f}x)")
    for label, err in results.get("errors", {}).items():
        print(f"  note: {label} not measured: {err}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    snapshot.save(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

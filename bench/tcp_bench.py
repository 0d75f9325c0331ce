"""tcp, the multi-host path: ucxpy against MPICH over UCX's own tcp transport.

One run, 2 ranks on one host over loopback, each pinned to its own CPU:

* ``ucxpy``          ``ucxpy-perf -t tag_lat,tag_bw`` with ``UCXPY_TLS=tcp``
                     (``ucxpy-py``: the same with ``UCXPY_FASTPATH=n``, the
                     pure-Python path, for information)
* ``mpich+ucx-tcp``  bench/c/mpi_pingpong.c, built with the mpich wheel's
                     ``mpicc``, on MPICH over the UCX the wheel bundles with
                     ``UCX_TLS=tcp,self MPIR_CVAR_CH4_NETMOD=ucx
                     MPIR_CVAR_NOLOCAL=1``: C all the way down, the code our
                     users would otherwise run
* ``ucx_perftest``   UCX's own tag_lat/tag_bw over tcp (``UCX_TLS=tcp``),
                     where Debian's ucx-utils is installed

Targets (issue 32): latency from 8 B to 64 KiB <= 1.0x mpich+ucx-tcp;
bandwidth at >= 1 MiB >= 2x mpich+ucx-tcp.  Printed as PASS/MISS; the
results go to bench/results/tcp.json.

Across hosts, where network namespaces can be made (root, ``ip``:
tests/hosts/netns.py), the same latency between two namespace hosts joined
by veth links and a bridge: ucxpy's tcp (Python API, for information), and
the C ping-pong on MPICH over ucxpy's libucp (``mpich+ucxpy-tcp``, with
``UCXPY_TCP_NATIVE=y``) against
the same on MPICH over UCX's tcp, alternating, ``--hosts-repeat`` times,
medians: issue 43's target, 8 B latency <= 1.0x (``--no-hosts`` skips it).

Usage: python bench/tcp_bench.py [--max-time 0.3] [--json FILE] [--no-hosts]
"""
from __future__ import annotations

import argparse
import json
import statistics
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from ucxpy.tools import snapshot, ucx  # noqa: E402
from run_bench import ucx_perftest_run  # noqa: E402
from ucp_bench import _run, perf_rows, pingpong_rows  # noqa: E402

SIZES = [8, 64, 1024, 16384, 65536, 1 << 20, 4 << 20]
LAT_SIZES = [s for s in SIZES if s <= 65536]
BW_SIZES = [s for s in SIZES if s >= 1 << 20]
UCX_TCP = {"UCX_TLS": "tcp,self"}


def c_reference(exe: str, max_time: float) -> dict:
    env = dict(ucx.environment(reference=True), **UCX_TCP)
    return pingpong_rows(_run([os.path.join(BIN, "mpiexec"), "-n", "2", exe, str(max_time)],
                              env=env))


def ucxpy_perf(max_time: float, fastpath: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "perf.json")
        _run([os.path.join(BIN, "ucxpy-run"), "-n", "2", os.path.join(BIN, "ucxpy-perf"),
              "-t", "tag_lat,tag_bw", "-s", ",".join(map(str, SIZES)), "--pin",
              "--max-time", str(max_time), "--json", out],
             env=dict(os.environ, UCXPY_TLS="tcp", UCXPY_FASTPATH="y" if fastpath else "n"))
        with open(out) as f:
            return perf_rows(json.load(f)["tests"])


def perftest(cpus) -> dict:
    old = {k: os.environ.get(k) for k in UCX_TCP}
    os.environ.update({"UCX_TLS": "tcp"})
    try:
        run = ucx_perftest_run(SIZES, cpus)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if "error" in run:
        return {"error": run["error"]}
    return perf_rows(run["tests"])


HOST_SIZES = [8, 1024, 16384, 65536]


def across_hosts(exe: str, max_time: float, repeat: int = 3) -> dict:
    """Latency between two namespace hosts: ucxpy (ucxpy-run's host agent),
    and the C ping-pong on MPICH over ucxpy's libucp and over UCX's tcp
    (hydra's ssh launcher), those two alternating ``repeat`` times (medians
    per size; every run in ``runs``)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from hosts import netns
    why = netns.skip_reason()
    if why:
        return {"error": f"no namespace hosts here: {why}"}
    res = {}
    with netns.Cluster(2) as c, tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "perf.json")
        prog = os.path.join(tmp, "perf_main.py")       # ucxpy-perf, as the agent runs a file
        with open(prog, "w") as f:
            f.write("import sys\nfrom ucxpy.tools import perf\nsys.exit(perf.main())\n")
        argv = c.launcher_argv(prog,
                               ["-t", "tag_lat", "-s", ",".join(map(str, HOST_SIZES)),
                                "--max-time", str(max_time), "--json", out], timeout=300)
        _run(argv, env=c.env({"UCXPY_TLS": "tcp"}), timeout=330)
        with open(out) as f:
            res["ucxpy"] = perf_rows(json.load(f)["tests"])
        if exe:
            argv = netns.mpiexec_argv(c, exe)
            argv.remove(sys.executable)             # a C program, not a Python one
            envs = {
                "mpich+ucx-tcp": dict(ucx.environment(
                    reference=True, base=c.env({"UCXPY_NETNS_PREFIX": c.prefix})), **UCX_TCP),
                "mpich+ucxpy-tcp": ucx.environment(base=c.env({
                    "UCXPY_NETNS_PREFIX": c.prefix, "UCXPY_TLS": "tcp", "UCXPY_TCP_NATIVE": "y"})),
            }
            runs = res["runs"] = {k: [] for k in envs}
            for rep in range(repeat):
                for k in (list(envs) if rep % 2 == 0 else list(envs)[::-1]):
                    runs[k].append(pingpong_rows(_run(argv + [str(max_time)], env=envs[k],
                                                      timeout=300)))
            for k, rs in runs.items():
                res[k] = {size: {"lat_us": statistics.median(r[size]["lat_us"] for r in rs)}
                          for size in HOST_SIZES if all(size in r for r in rs)}
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-time", type=float, default=0.3, help="seconds per size and run")
    p.add_argument("--json", help="write the results here")
    snapshot.add_option(p, "tcp")
    p.add_argument("--no-hosts", action="store_true", help="skip the namespace-host run")
    p.add_argument("--hosts-repeat", type=int, default=3,
                   help="alternating runs of each MPICH side between the namespace hosts")
    args = p.parse_args(argv)
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "impls": {}, "errors": {}}
    impls = results["impls"]
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "mpi_pingpong")
        try:
            _run([os.path.join(BIN, "mpicc"), "-O2", "-o", exe,
                  os.path.join(HERE, "c", "mpi_pingpong.c")])
            impls["mpich+ucx-tcp"] = c_reference(exe, args.max_time)
        except Exception as e:          # no mpich wheel: say so, go on
            results["errors"]["mpich+ucx-tcp"] = str(e)[:300]
            exe = ""
        if not args.no_hosts:
            try:
                results["hosts"] = across_hosts(exe, args.max_time, args.hosts_repeat)
            except Exception as e:      # a harness problem: say so, go on
                results["hosts"] = {"error": str(e)[:300]}
    impls["ucxpy"] = ucxpy_perf(args.max_time, True)
    impls["ucxpy-py"] = ucxpy_perf(args.max_time, False)
    cpus = sorted(os.sched_getaffinity(0))
    pt = perftest(cpus[:2])
    if "error" in pt:
        results["errors"]["ucx_perftest"] = pt["error"]
    else:
        impls["ucx_perftest"] = pt

    labels = [k for k in ("ucxpy", "ucxpy-py", "mpich+ucx-tcp", "ucx_perftest") if k in impls]
    print("\ntcp latency, half round trip (us), 2 ranks over loopback")
    print(f"{'size':>8} " + " ".join(f"{k:>14}" for k in labels))
    for s in SIZES:
        print(f"{s:>8} " + " ".join(
            f"{impls[k].get(s, {}).get('lat_us', float('nan')):>14.2f}" for k in labels))
    print("\ntcp bandwidth, window of 64 (MB/s)")
    print(f"{'size':>8} " + " ".join(f"{k:>14}" for k in labels))
    for s in SIZES:
        print(f"{s:>8} " + " ".join(
            f"{impls[k].get(s, {}).get('bw_MBps', float('nan')):>14.0f}" for k in labels))

    targets = results["targets"] = {}
    ref = impls.get("mpich+ucx-tcp")
    ours = impls["ucxpy"]
    print("\ntargets (issue 32)")
    if ref:
        lat = max(ours[s]["lat_us"] / ref[s]["lat_us"] for s in LAT_SIZES)
        worst = max(LAT_SIZES, key=lambda s: ours[s]["lat_us"] / ref[s]["lat_us"])
        bw = min(ours[s]["bw_MBps"] / ref[s]["bw_MBps"] for s in BW_SIZES)
        targets["latency_8B_64KiB_vs_mpich_ucx_tcp"] = {"ratio": lat, "limit": 1.0,
                                                        "worst_size": worst, "pass": lat <= 1.0}
        targets["bandwidth_1MiB_up_vs_mpich_ucx_tcp"] = {"ratio": bw, "limit": 2.0,
                                                         "pass": bw >= 2.0}
        print(f"  tcp latency 8 B..64 KiB, ucxpy / mpich+ucx-tcp (worst: {worst} B) "
              f"{lat:5.2f}x  [<= 1.0x]  {'PASS' if lat <= 1.0 else 'MISS'}")
        print(f"  tcp bandwidth >= 1 MiB, ucxpy / mpich+ucx-tcp             "
              f"{bw:5.2f}x  [>= 2.0x]  {'PASS' if bw >= 2.0 else 'MISS'}")
    for label, err in results["errors"].items():
        print(f"  note: {label} not measured: {err}")
    hosts = results.get("hosts")
    if hosts and "error" in hosts:
        print(f"\nacross namespace hosts: not measured: {hosts['error']}")
    elif hosts:
        cols = [k for k in ("ucxpy", "mpich+ucxpy-tcp", "mpich+ucx-tcp") if k in hosts]
        print("\ntcp latency across two namespace hosts (veth + bridge; us; the MPICH "
              "columns: medians of alternating runs)")
        print(f"{'size':>8} " + " ".join(f"{k:>16}" for k in cols))
        for s in HOST_SIZES:
            print(f"{s:>8} " + " ".join(
                f"{hosts[k].get(s, {}).get('lat_us', float('nan')):>16.2f}" for k in cols))
        ours_h, ref_h = hosts.get("mpich+ucxpy-tcp", {}), hosts.get("mpich+ucx-tcp", {})
        if 8 in ours_h and 8 in ref_h:
            r = ours_h[8]["lat_us"] / ref_h[8]["lat_us"]
            targets["hosts_mpich_8B_latency_vs_ucx_tcp"] = {"ratio": r, "limit": 1.0,
                                                            "pass": r <= 1.0}
            print(f"  target (issue 43): MPICH over ucxpy's tcp / over UCX's tcp, 8 B latency "
                  f"between hosts {r:5.2f}x  [<= 1.0x]  {'PASS' if r <= 1.0 else 'MISS'}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    snapshot.save(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

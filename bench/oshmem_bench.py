"""Open MPI's OSHMEM over ucxpy's libucp.so.0, beside OSHMEM over the real UCX and ucxpy's own shmem.

All in one run, 2 PEs on one host, each bound to its own core:

* ``oshmem+ucxpy``  bench/c/oshmem_rma.c (OpenSHMEM's C API, Open MPI's
                    spml/ucx, atomic/ucx, sshmem/ucx) under ``ucxpy-ucx --check``
* ``oshmem+ucx``    the same binary on the system UCX (``--reference``); it may
                    crash in shmem_finalize after printing its figures (the
                    reference's own defect): its figures count, the exit is noted
* ``shmem``         ucxpy's own ``shmem`` from Python: ``ucxpy-perf --impl shmem``
                    (bench/perf_drivers.py) under ``ucxpy-run``, the same tests

Tests, as ``ucxpy-perf`` defines them: ``put_lat`` (put + quiet), ``get_lat``
(a blocking get), ``amo_lat`` (fetch-add, 8 B, on the symmetric heap),
``put_bw`` (64 non-blocking puts, one quiet: time per put).  Like
ucxpy-perf's (``np.zeros``), the C program's put source is memory never
written (the kernel's zero page: cache-resident at any size), so large puts
read faster than from ordinary memory in all three columns alike.

Targets (TARGETS): issue 43's, OSHMEM over ucxpy within 3x of OSHMEM over
the system UCX at 8 B (put, get, fetch-add) and at >= 0.9x its put bandwidth
from 1 MiB, ucxpy's shmem within 10x of it; and the earlier issue's, 8 B
latency of oshmem+ucxpy <= 2x shmem's, put bandwidth >= 0.9x shmem's.

Usage: python bench/oshmem_bench.py [--max-time 0.3] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, ROOT)

from ucxpy.tools import snapshot, ucx  # noqa: E402

TESTS = ("put_lat", "get_lat", "amo_lat", "put_bw")
#: (name, measured, against, test, limit): latencies at 8 B (at most limit
#: times), put bandwidth from 1 MiB (at least limit times).  Issue 43's
#: (the native data plane) against OSHMEM over the system UCX, and the
#: earlier ones against ucxpy's own shmem.
TARGETS = [
    ("put_lat 8 B (issue 43)", "oshmem+ucxpy", "oshmem+ucx", "put_lat", 3.0),
    ("get_lat 8 B (issue 43)", "oshmem+ucxpy", "oshmem+ucx", "get_lat", 3.0),
    ("amo_lat 8 B (issue 43)", "oshmem+ucxpy", "oshmem+ucx", "amo_lat", 3.0),
    ("put bandwidth >= 1 MiB (issue 43)", "oshmem+ucxpy", "oshmem+ucx", "put_bw", 0.9),
    ("shmem put_lat 8 B (issue 43)", "shmem", "oshmem+ucx", "put_lat", 10.0),
    ("shmem get_lat 8 B (issue 43)", "shmem", "oshmem+ucx", "get_lat", 10.0),
    ("shmem amo_lat 8 B (issue 43)", "shmem", "oshmem+ucx", "amo_lat", 10.0),
    ("put_lat 8 B", "oshmem+ucxpy", "shmem", "put_lat", 2.0),
    ("get_lat 8 B", "oshmem+ucxpy", "shmem", "get_lat", 2.0),
    ("amo_lat 8 B", "oshmem+ucxpy", "shmem", "amo_lat", 2.0),
    ("put bandwidth >= 1 MiB", "oshmem+ucxpy", "shmem", "put_bw", 0.9),
]
SIZES = (8, 64, 1024, 16384, 1 << 20, 4 << 20)
OSHRUN = "/usr/bin/oshrun"


def _env(reference: bool) -> dict:
    env = ucx.environment(reference)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def oshmem(exe: str, reference: bool, max_time: float) -> dict:
    """{(test, size): {"lat_us", "bw_GBps"}} of one oshmem_rma job (and a note
    when the job failed after printing its figures)."""
    cmd = [os.path.join(BIN, "ucxpy-ucx"), "--reference" if reference else "--check",
           OSHRUN, "-n", "2", "--bind-to", "core", exe, str(max_time)]
    p = subprocess.run(cmd, env=_env(reference), capture_output=True, text=True, timeout=900,
                       cwd=ROOT)
    rows = {}
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] in TESTS:
            rows[(parts[0], int(parts[1]))] = {"lat_us": float(parts[2]),
                                               "bw_GBps": float(parts[3])}
    if not rows:
        raise RuntimeError(f"{' '.join(cmd[:4])}...: exit {p.returncode}\n{p.stderr[-1500:]}")
    note = f"exit {p.returncode} after its figures" if p.returncode else ""
    if p.returncode and not reference:
        raise RuntimeError(f"oshmem+ucxpy failed (exit {p.returncode}):\n{p.stderr[-1500:]}")
    return {"rows": rows, "note": note}


def shmem(max_time: float) -> dict:
    """The same tests through ucxpy's own shmem (ucxpy-perf's shmem driver)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "perf.json")
        cmd = [os.path.join(BIN, "ucxpy-run"), "-n", "2", os.path.join(BIN, "ucxpy-perf"),
               "--drivers", os.path.join(HERE, "perf_drivers.py"), "--impl", "shmem",
               "-t", ",".join(TESTS), "-s", ",".join(map(str, SIZES)), "--pin",
               "--max-time", str(max_time), "--json", out]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
        if not os.path.exists(out):
            raise RuntimeError(f"shmem: exit {p.returncode}\n{p.stderr[-1500:]}")
        with open(out) as f:
            tests = json.load(f)["tests"]
    rows = {}
    for test, entries in tests.items():
        for r in entries:
            rows[(test, r["size"])] = {"lat_us": r["latency_us"], "bw_GBps": r["bandwidth_GBps"]}
    return {"rows": rows, "note": ""}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-time", type=float, default=0.3, help="seconds per test, size and run")
    p.add_argument("--json", help="write the results here")
    snapshot.add_option(p, "oshmem")
    args = p.parse_args(argv)
    oshcc = shutil.which("oshcc")
    if not os.path.exists(ucx.LIBUCP) or oshcc is None or not os.path.exists(OSHRUN):
        print("needs libucp.so.0 (libucx-dev) and Open MPI's OSHMEM (oshcc, oshrun): "
              "nothing to measure")
        return 0
    impls, errors = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "oshmem_rma")
        subprocess.run([oshcc, "-O2", "-o", exe, os.path.join(HERE, "c", "oshmem_rma.c")],
                       check=True, timeout=120)
        for label, run in (("oshmem+ucxpy", lambda: oshmem(exe, False, args.max_time)),
                           ("oshmem+ucx", lambda: oshmem(exe, True, args.max_time)),
                           ("shmem", lambda: shmem(args.max_time))):
            try:
                impls[label] = run()
            except Exception as e:
                errors[label] = str(e)[:1500]
    labels = [k for k in ("oshmem+ucxpy", "oshmem+ucx", "shmem") if k in impls]
    print(f"OSHMEM over ucxpy vs over UCX vs ucxpy's shmem, 2 PEs, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    for test in TESTS:
        lat = test.endswith("_lat")
        unit = "latency (us)" if lat else "bandwidth (GB/s), time per put in ()"
        print(f"\n{test}: {unit}")
        print(f"{'size':>8} " + " ".join(f"{k:>14}" for k in labels))
        for s in SIZES:
            cells = []
            for k in labels:
                r = impls[k]["rows"].get((test, s))
                cells.append(f"{'-':>14}" if r is None else
                             f"{r['lat_us']:>14.2f}" if lat else f"{r['bw_GBps']:>14.3f}")
            if any(c.strip() != "-" for c in cells):
                print(f"{s:>8} " + " ".join(cells))
    targets = {}
    print("\ntargets")
    for name, num, den, test, limit in TARGETS:
        if num not in impls or den not in impls:
            continue
        a, b = impls[num]["rows"], impls[den]["rows"]
        if test == "put_bw":
            big = [s for s in SIZES if s >= 1 << 20 and (test, s) in a and (test, s) in b]
            if not big:
                continue
            ratio = min(a[(test, s)]["bw_GBps"] / b[(test, s)]["bw_GBps"] for s in big)
            ok, cmp = ratio >= limit, ">="
        else:
            if (test, 8) not in a or (test, 8) not in b:
                continue
            ratio = a[(test, 8)]["lat_us"] / b[(test, 8)]["lat_us"]
            ok, cmp = ratio <= limit, "<="
        targets[name] = {"ratio": ratio, "limit": limit, "pass": ok}
        print(f"  {name:<44} {num} / {den} {ratio:6.2f}x  [{cmp} {limit}x]  "
              f"{'PASS' if ok else 'MISS'}")
    for label in labels:
        if impls[label]["note"]:
            print(f"  note: {label}: {impls[label]['note']}")
    for label, err in errors.items():
        print(f"  note: {label} not measured: {err}")
    data = {"date": time.strftime("%Y-%m-%d %H:%M"), "targets": targets, "errors": errors,
            "impls": {k: {"note": v["note"],
                          "rows": [{"test": t, "size": s, **r}
                                   for (t, s), r in sorted(v["rows"].items())]}
                      for k, v in impls.items()}}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    snapshot.save(args, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The protocol plug-in example under MPICH's C ping-pong through libucp:
what its C half buys over its Python half, beside the stock protocols, in
the same run.

MPICH's wheel (ch4:ucx, ``NOLOCAL``) under ``ucxpy-ucx --check``, two ranks
pinned, bench/c/mpi_pingpong.c (latency: half the round trip of blocking
Send/Recv; bandwidth: windows of 64 Isends), at 64 KiB, 1 MiB and 4 MiB.  Sides:

* ``stock``: no plug-in (eager copy in C below the rendezvous threshold, the
  data plane's CMA rendezvous above it);
* ``c-half``: ``UCXPY_PROTO_PLUGIN=pipelined-copy:64K-inf``, its C half
  (native/proto/pipelined_copy.c) running libucp's messages;
* ``python-half``: the same with ``UCXPY_PROTO_NATIVE=n`` (ucxpy/protocols.py
  runs every message, one Python frame handler per fragment).

The sides alternate ``--repeat`` times; each figure is the median of its
repeats, and each plug-in side is given as a ratio to ``stock``.

Usage: python bench/plugin_bench.py [--repeat 3] [--max-time 0.2] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import capi_bench  # noqa: E402  (its MPICH build and environment)
from ucxpy.tools import snapshot  # noqa: E402

SIDES = {
    "stock": {},
    "c-half": {"UCXPY_PROTO_PLUGIN": "pipelined-copy:64K-inf"},
    "python-half": {"UCXPY_PROTO_PLUGIN": "pipelined-copy:64K-inf", "UCXPY_PROTO_NATIVE": "n"},
}
SIZES = (64 << 10, 1 << 20, 4 << 20)      # (mpi_pingpong.c's sizes from 64 KiB)


def one_side(exe: str, extra: dict, max_time: float) -> dict:
    """size -> (latency µs, bandwidth MB/s) of one job."""
    env = capi_bench._env(False)
    env.update(extra)
    launcher = capi_bench.LIBS["mpich"][1]
    cmd = [os.path.join(capi_bench.BIN, "ucxpy-ucx"), "--check", launcher[0], "-n", "2",
           *launcher[1:], exe, str(max_time)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not rows:
        raise RuntimeError(f"{extra}: exit {p.returncode}\n{p.stdout[-1500:]}\n{p.stderr[-1500:]}")
    return {r["size"]: (r["lat_us"], r["bw_MBps"]) for r in rows if r["size"] in SIZES}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-time", type=float, default=0.2)
    ap.add_argument("--json", default=None)
    snapshot.add_option(ap, "plugin")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        exe = capi_bench.build("mpich", tmp)["pingpong"]
        runs = {side: [] for side in SIDES}
        for i in range(args.repeat):
            order = list(SIDES) if i % 2 == 0 else list(reversed(SIDES))
            for side in order:
                runs[side].append(one_side(exe, SIDES[side], args.max_time))
    med = {side: {n: tuple(statistics.median(r[n][k] for r in runs[side]) for k in (0, 1))
                  for n in SIZES} for side in SIDES}
    print(f"# plug-in bench, {time.strftime('%Y-%m-%d %H:%M')}, median of {args.repeat}")
    print(f"{'size':>8} {'side':>12} {'lat us':>9} {'x stock':>8} {'bw MB/s':>9} {'x stock':>8}")
    rows = []
    for n in SIZES:
        base = med["stock"][n]
        for side in SIDES:
            lat, bw = med[side][n]
            row = {"size": n, "side": side, "lat_us": lat, "bw_MBps": bw,
                   "lat_x_stock": round(lat / base[0], 2), "bw_x_stock": round(bw / base[1], 2)}
            rows.append(row)
            print(f"{n:>8} {side:>12} {lat:>9.1f} {row['lat_x_stock']:>8} {bw:>9.0f} "
                  f"{row['bw_x_stock']:>8}")
    data = {"date": time.strftime("%Y-%m-%d %H:%M"), "repeat": args.repeat, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    snapshot.save(args, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())

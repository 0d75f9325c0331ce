"""Issue 43's targets through the C ABI: MPICH and Open MPI on ucxpy's libucp.so.0,
each beside itself on the real UCX, in the same run.

Two ranks on one host, each pinned to its own CPU, by OSU's method (the
project's own C programs, bench/c/: OSU's sources are in no registry here):

* latency: mpi_pingpong.c's blocking ping-pong, 8 B (half round trip);
* bandwidth: mpi_pingpong.c's windows of 64 non-blocking sends, 1 and 4 MiB;
* message rate: mpi_rate.c mr, osu_mbw_mr's windows of 64 8 B
  MPI_Isend/MPI_Irecv and MPI_Waitall;
* Allreduce: mpi_rate.c allreduce, a timed loop after a barrier, 8 B (and
  64 KiB, reported) at 2 ranks, and at 4 (oversubscribed: reported only).

Sides: ``mpich+ucxpy`` (MPICH's wheel, ch4:ucx, ``NOLOCAL``, under
``ucxpy-ucx --check``) against ``mpich+ucx`` (the same binary on the UCX the
wheel bundles), and ``ompi+ucxpy`` (Debian's Open MPI, pml/osc ucx) against
``ompi+ucx`` (the same binary on the system UCX, ``pml_ucx_tls any``).  The
sides alternate, first one then the other, ``--repeat`` times; each figure
is the median of its repeats.  Ratios are ucxpy / UCX for times, UCX-relative
for rates; PASS/MISS against the issue's targets (TARGETS).

Usage: python bench/capi_bench.py [--repeat 3] [--max-time 0.3] [--json FILE]
       [--only mpich|ompi]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, ROOT)

from ucxpy.tools import snapshot, ucx  # noqa: E402

#: (library, figure, kind, limit): "time" figures pass at ours <= limit x
#: UCX's, "rate" figures at ours >= limit x UCX's; None: reported only
TARGETS = [
    ("mpich", "lat 8 B", "time", 1.5),
    ("mpich", "mr 8 B", "rate", 0.5),
    ("mpich", "allreduce 8 B x2", "time", 1.5),
    ("mpich", "allreduce 8 B x4", "time", None),
    ("mpich", "allreduce 64 KiB x2", "time", None),
    ("mpich", "bw 1 MiB", "rate", 0.9),
    ("mpich", "bw 4 MiB", "rate", 0.9),
    ("ompi", "lat 8 B", "time", 2.0),
    ("ompi", "mr 8 B", "rate", 0.3),
    ("ompi", "allreduce 8 B x2", "time", 2.0),
    ("ompi", "allreduce 8 B x4", "time", None),
    ("ompi", "allreduce 64 KiB x2", "time", None),
    ("ompi", "bw 1 MiB", "rate", 0.9),
    ("ompi", "bw 4 MiB", "rate", 0.9),
]

LIBS = {
    # name: (compiler, launcher argv prefix)
    "mpich": (os.path.join(BIN, "mpicc"), [os.path.join(BIN, "mpiexec"), "-bind-to", "core"]),
    "ompi": (shutil.which("mpicc.openmpi") or "", ["/usr/bin/mpirun", "--oversubscribe",
                                                    "--bind-to", "none"]),
}


def _env(reference: bool) -> dict:
    env = ucx.environment(reference)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def _run(lib: str, reference: bool, n: int, argv: list, timeout=600) -> list:
    """JSON lines of one job's rank 0."""
    launcher = LIBS[lib][1]
    cmd = [os.path.join(BIN, "ucxpy-ucx"), "--reference" if reference else "--check",
           launcher[0], "-n", str(n), *launcher[1:], *argv]
    p = subprocess.run(cmd, env=_env(reference), capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not rows:
        raise RuntimeError(f"{lib} {'reference' if reference else 'ucxpy'} {argv[0]}: exit "
                           f"{p.returncode}\n{p.stdout[-1500:]}\n{p.stderr[-1500:]}")
    return rows


def one_side(lib: str, exes: dict, reference: bool, max_time: float) -> dict:
    """Every figure of one library on one side: name -> value."""
    out = {}
    for row in _run(lib, reference, 2, [exes["pingpong"], str(max_time)]):
        if row["size"] == 8:
            out["lat 8 B"] = row["lat_us"]
        elif row["size"] == 1 << 20:
            out["bw 1 MiB"] = row["bw_MBps"]
        elif row["size"] == 4 << 20:
            out["bw 4 MiB"] = row["bw_MBps"]
    for row in _run(lib, reference, 2, [exes["rate"], "mr", str(max_time)]):
        out["mr 8 B"] = row["value"]
    for n in (2, 4):
        for row in _run(lib, reference, n, [exes["rate"], "allreduce", str(max_time)]):
            size = "8 B" if row["size"] == 8 else "64 KiB"
            out[f"allreduce {size} x{n}"] = row["value"]
    return out


def build(lib: str, tmp: str) -> dict:
    cc = LIBS[lib][0]
    exes = {}
    for name, src in (("pingpong", "mpi_pingpong.c"), ("rate", "mpi_rate.c")):
        exe = os.path.join(tmp, f"{lib}-{name}")
        subprocess.run([cc, "-O2", "-o", exe, os.path.join(HERE, "c", src)], check=True,
                       capture_output=True, text=True, timeout=120)
        exes[name] = exe
    return exes


def verdicts(results: dict) -> list:
    rows = []
    for lib, fig, kind, limit in TARGETS:
        sides = results.get(lib)
        if not sides or fig not in sides["ucxpy"] or fig not in sides["ucx"]:
            continue
        ours, ref = sides["ucxpy"][fig], sides["ucx"][fig]
        ratio = ours / ref if ref else float("inf")
        if limit is None:
            verdict = "(reported)"
        elif kind == "time":
            verdict = "PASS" if ratio <= limit else "MISS"
        else:
            verdict = "PASS" if ratio >= limit else "MISS"
        target = "" if limit is None else (f"<= {limit}x" if kind == "time" else f">= {limit}x")
        rows.append({"lib": lib, "figure": fig, "ucxpy": ours, "ucx": ref,
                     "ratio": round(ratio, 3), "target": target, "verdict": verdict})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--max-time", type=float, default=0.3, help="seconds per figure and run")
    p.add_argument("--only", choices=sorted(LIBS), action="append")
    p.add_argument("--json", help="write the results here")
    snapshot.add_option(p, "capi")
    args = p.parse_args(argv)
    libs = args.only or [lib for lib in LIBS if LIBS[lib][0] and os.path.exists(LIBS[lib][0])]
    results, raw = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for lib in libs:
            exes = build(lib, tmp)
            runs = {"ucxpy": [], "ucx": []}
            for rep in range(args.repeat):
                order = (False, True) if rep % 2 == 0 else (True, False)
                for reference in order:
                    side = "ucx" if reference else "ucxpy"
                    t = time.time()
                    runs[side].append(one_side(lib, exes, reference, args.max_time))
                    print(f"# {lib} {side} run {rep + 1}: {time.time() - t:.1f} s",
                          file=sys.stderr)
            raw[lib] = runs
            results[lib] = {side: {fig: statistics.median(r[fig] for r in rs)
                                   for fig in rs[0]} for side, rs in runs.items()}
    rows = verdicts(results)
    print(f"{'library':6s} {'figure':22s} {'ucxpy':>12s} {'UCX':>12s} {'ratio':>7s} "
          f"{'target':>8s}  verdict")
    for r in rows:
        print(f"{r['lib']:6s} {r['figure']:22s} {r['ucxpy']:12.3f} {r['ucx']:12.3f} "
              f"{r['ratio']:7.3f} {r['target']:>8s}  {r['verdict']}")
    print("(lat, allreduce: us; bw: MB/s; mr: messages/s; medians of "
          f"{args.repeat} alternating runs)")
    data = {"date": time.strftime("%Y-%m-%d %H:%M"), "repeat": args.repeat,
            "rows": rows, "runs": raw}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    snapshot.save(args, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Reference numbers from libfabric's own ``fi_pingpong`` (libfabric-bin).

Runs an fi_pingpong server and client on localhost with the same provider
the ofi transport uses (RDM endpoints) and prints / saves its latency per
size, to compare with ``ucxpy-perf`` over ``UCXPY_TLS=ofi``::

    python bench/fabtests_ref.py [-p "tcp;ofi_rxm"] [-S 8,65536,1048576] [-I 2000]

fi_pingpong reports ``usec/xfer`` for one ping-pong iteration: half of it is
the one-way latency.  Prints nothing but a note if fi_pingpong is missing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(output: str) -> dict:
    """fi_pingpong's table -> {size: {"usec_per_xfer": f, "mb_per_s": f}}."""
    res = {}
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    for line in output.splitlines():
        f = line.split()
        if len(f) < 7 or not f[0][:1].isdigit():
            continue
        try:
            size = int(f[0][:-1]) * mult[f[0][-1]] if f[0][-1] in mult else int(f[0])
            res[size] = {"usec_per_xfer": float(f[6]), "mb_per_s": float(f[5])}
        except (ValueError, KeyError):
            continue
    return res


def run(provider: str, size: int, iters: int, timeout: float = 120) -> dict:
    port = free_port()
    common = ["fi_pingpong", "-p", provider, "-e", "rdm", "-I", str(iters), "-S", str(size)]
    srv = subprocess.Popen(common + ["-B", str(port)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(0.3)
        cli = subprocess.run(common + ["-P", str(port), "127.0.0.1"], capture_output=True,
                             text=True, timeout=timeout)
        srv.wait(timeout=10)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    got = parse(cli.stdout)
    if cli.returncode != 0 or size not in got:
        return {"error": (cli.stdout + cli.stderr).strip()[-300:]}
    return got[size]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-p", "--provider", default=os.environ.get("UCXPY_OFI_PROVIDER",
                                                              "tcp;ofi_rxm"))
    p.add_argument("-S", "--sizes", default="8,4096,65536,1048576")
    p.add_argument("-I", "--iters", type=int, default=1000)
    p.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "fabtests.json"))
    args = p.parse_args(argv)
    if shutil.which("fi_pingpong") is None:
        print("fabtests_ref: fi_pingpong not installed (apt-get install libfabric-bin)")
        return 0
    results = {}
    print(f"# fi_pingpong -e rdm -p {args.provider} on localhost")
    print(f"{'bytes':>10} {'usec/xfer':>12} {'one-way us':>12} {'MB/s':>10}")
    for size in (int(s) for s in args.sizes.split(",")):
        r = run(args.provider, size, args.iters if size <= 65536 else max(args.iters // 10, 10))
        results[size] = r
        if "error" in r:
            print(f"{size:>10} error: {r['error']}")
        else:
            print(f"{size:>10} {r['usec_per_xfer']:>12.2f} {r['usec_per_xfer'] / 2:>12.2f} "
                  f"{r['mb_per_s']:>10.1f}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"provider": args.provider, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

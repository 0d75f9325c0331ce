"""NIXL over ucxpy's libucp against NIXL over its bundled UCX, two processes
on one host, measured in the same run (``make bench-nixl``, part of
``make bench``).

    python bench/nixl_bench.py [--repeat 3] [--json FILE]

Each repetition runs both sides, alternating which goes first: a target
process (registers a 64 MiB buffer, answers every notification with one of
its own) and an initiator process that measures, both under ``ucxpy-ucx``
(``--check``: ours; ``--reference``: NIXL's UCX):

* WRITE bandwidth at 1, 4, 16 and 64 MiB (post to DONE, repeated);
* a KV-cache transfer: 64 blocks of 16 KiB in one WRITE with a notification,
  post to the target's answer received (the transfer, its notification and
  one more notification back), and the WRITE alone (post to DONE).

Medians over the repetitions; targets (issue 45): bandwidth at least 0.8x
the reference's, the KV transfer at most 2x its time.  PASS/MISS per row.
Then the same across two network-namespace hosts (tcp between them;
tests/hosts/netns.py, root only), reported beside them.
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
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
from nixl_kv_disagg import get_file, put_file  # noqa: E402  (the metadata through files)
from ucxpy.tools import snapshot  # noqa: E402
BIN = os.path.dirname(sys.executable)
MIB = 1 << 20
SIZES = (1, 4, 16, 64)
BLOCKS, BLOCK = 64, 16 << 10
TIMEOUT = 120


def _agent(name):
    from nixl_cu12._api import nixl_agent, nixl_agent_config
    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def _notif(ag, peer, deadline):
    while True:
        got = ag.get_new_notifs().get(peer)
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"no notification from {peer}")


def target(d):
    import numpy as np
    ag = _agent("target")
    buf = np.zeros(64 * MIB, np.uint8)
    ag.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    put_file(os.path.join(d, "target.meta"), ag.get_agent_metadata())
    put_file(os.path.join(d, "target.addr"), str(buf.ctypes.data).encode())
    ag.add_remote_agent(get_file(os.path.join(d, "initiator.meta")))
    put_file(os.path.join(d, "target.ready"), b"")        # (both know each other)
    peer = int(get_file(os.path.join(d, "initiator.pid")))
    while True:
        got = ag.get_new_notifs().get("initiator", [])
        for msg in got:
            if msg == b"stop":
                return
            ag.send_notif("initiator", b"ack")
        if not got and not os.path.exists(f"/proc/{peer}"):
            print("target: the initiator is gone without its stop", file=sys.stderr)
            return


def initiator(d, out):
    import numpy as np
    ag = _agent("initiator")
    src = np.ones(64 * MIB, np.uint8)
    ag.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    put_file(os.path.join(d, "initiator.pid"), str(os.getpid()).encode())
    put_file(os.path.join(d, "initiator.meta"), ag.get_agent_metadata())
    ag.add_remote_agent(get_file(os.path.join(d, "target.meta")))
    raddr = int(get_file(os.path.join(d, "target.addr")))
    get_file(os.path.join(d, "target.ready"))

    def write(local, remote, notif=b""):
        h = ag.initialize_xfer("WRITE", ag.get_xfer_descs(local, "DRAM"),
                               ag.get_xfer_descs(remote, "DRAM"), "target", notif)
        t0 = time.perf_counter()
        state = ag.transfer(h)
        while state == "PROC":
            state = ag.check_xfer_state(h)
        t = time.perf_counter() - t0
        ag.release_xfer_handle(h)
        if state != "DONE":
            raise RuntimeError(f"WRITE ended in {state}")
        return t

    res = {}
    for mib in SIZES:
        n = mib * MIB
        iters = max(3, 256 // mib)
        write([(src.ctypes.data, n, 0)], [(raddr, n, 0)])          # (warm-up)
        t = min(write([(src.ctypes.data, n, 0)], [(raddr, n, 0)]) for _ in range(iters))
        res[f"write {mib} MiB"] = n / t / 1e9                      # GB/s, best of iters
    local = [(src.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(BLOCKS)]
    remote = [(raddr + i * BLOCK, BLOCK, 0) for i in range(BLOCKS)]
    times, posts = [], []
    for i in range(30):
        deadline = time.monotonic() + TIMEOUT
        t0 = time.perf_counter()
        posts.append(write(local, remote, b"kv"))
        _notif(ag, "target", deadline)
        times.append(time.perf_counter() - t0)
    res["kv 64 x 16 KiB"] = statistics.median(times[5:]) * 1e6     # us
    res["kv write alone"] = statistics.median(posts[5:]) * 1e6     # us: post to DONE
    ag.send_notif("target", b"stop")
    with open(out, "w") as f:
        json.dump(res, f)


def run_side(mode, hosts=None):
    """One side's run; ``hosts``: (target's namespace, initiator's, env) of
    two namespace hosts (tests/hosts/netns.py), else both on this host."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ) if hosts is None else dict(hosts[2])
        env.pop("UCXPY_AUTH_KEY", None)
        ucx = [os.path.join(BIN, "ucxpy-ucx"), mode]
        if mode == "--check":
            ucx += ["--key-file", os.path.join(d, "job.key")]
        me = [sys.executable, os.path.abspath(__file__)]
        ns = (["ip", "netns", "exec", hosts[0]], ["ip", "netns", "exec", hosts[1]]) \
            if hosts else ([], [])
        tlog = open(os.path.join(d, "target.log"), "w")
        t = subprocess.Popen(ns[0] + ucx + me + ["--role", "target", d], env=env,
                             stdout=tlog, stderr=subprocess.STDOUT)
        tlog.close()
        out = os.path.join(d, "result.json")
        try:
            r = subprocess.run(ns[1] + ucx + me + ["--role", "initiator", d, "--out", out],
                               env=env, capture_output=True, text=True, timeout=600)
            t.wait(timeout=30)
        except subprocess.TimeoutExpired:
            print(f"{mode}: the target did not end 30 s after the initiator",
                  file=sys.stderr)
        finally:
            if t.poll() is None:
                t.kill()
        # (the result is written before teardown: NIXL on its bundled UCX
        # sometimes dies of SIGSEGV in its teardown, after measuring)
        if not os.path.exists(out) or (r.returncode != 0 and mode == "--check"):
            with open(os.path.join(d, "target.log")) as f:
                tail = f.read()[-1500:]
            raise RuntimeError(f"{mode}: initiator failed ({r.returncode}):\n"
                               f"{r.stderr[-2000:]}\ntarget:\n{tail}")
        with open(out) as f:
            return json.load(f)


def cross_host(repeat):
    """Both sides with the target and the initiator on two namespace hosts
    (tcp between them), or None where namespaces cannot be made."""
    sys.path.insert(0, os.path.dirname(HERE))
    try:
        from tests.hosts import netns
    except ImportError:
        return None
    why = netns.skip_reason()
    if why:
        print(f"(no cross-host rows: {why})")
        return None
    runs = {"ours": [], "reference": []}
    with netns.Cluster(2) as c:
        # (tcp on both sides: the bundled UCX would reach across the namespaces
        # by shared memory, the same machine; UCX_TLS maps to ours too)
        env = c.env({"PATH": BIN + os.pathsep + os.environ.get("PATH", ""),
                     "UCX_TLS": "tcp,self"})
        for rep in range(repeat):
            order = ("ours", "reference") if rep % 2 == 0 else ("reference", "ours")
            for side in order:
                runs[side].append(run_side("--check" if side == "ours" else "--reference",
                                           (c.hosts[0], c.hosts[1], env)))
    return runs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    snapshot.add_option(ap, "nixl")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("dir", nargs="?", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "target":
        return target(args.dir)
    if args.role == "initiator":
        return initiator(args.dir, args.out)
    runs = {"ours": [], "reference": []}
    for rep in range(args.repeat):
        order = ("ours", "reference") if rep % 2 == 0 else ("reference", "ours")
        for side in order:
            runs[side].append(run_side("--check" if side == "ours" else "--reference"))
    cross = cross_host(args.repeat)
    rows, all_pass = [], True
    for key in runs["ours"][0]:
        o = statistics.median(r[key] for r in runs["ours"])
        ref = statistics.median(r[key] for r in runs["reference"])
        if key.startswith("write"):
            ratio, ok, unit, want = o / ref, o / ref >= 0.8, "GB/s", ">= 0.8x"
        else:
            ratio, ok, unit, want = o / ref, o / ref <= 2.0, "us", "<= 2x"
        all_pass &= ok
        rows.append({"what": key, "unit": unit, "ours": o, "reference": ref, "ratio": ratio,
                     "target": want, "verdict": "PASS" if ok else "MISS"})
    print(f"NIXL over ucxpy vs over its bundled UCX, two processes, medians of "
          f"{args.repeat} ({time.strftime('%Y-%m-%d %H:%M')})")
    print(f"{'':16} {'ours':>10} {'reference':>10} {'ratio':>7}  target")
    for r in rows:
        print(f"{r['what']:16} {r['ours']:>10.2f} {r['reference']:>10.2f} {r['ratio']:>6.2f}x  "
              f"{r['target']} {r['verdict']}  ({r['unit']})")
    if cross:
        print(f"across two namespace hosts over tcp (medians of {args.repeat}; beside the "
              f"rows above, no target):")
        for key in cross["ours"][0]:
            o = statistics.median(r[key] for r in cross["ours"])
            ref = statistics.median(r[key] for r in cross["reference"])
            print(f"{key:16} {o:>10.2f} {ref:>10.2f} {o / ref:>6.2f}x  "
                  f"({'GB/s' if key.startswith('write') else 'us'})")
    data = {"rows": rows, "runs": runs, "cross_host": cross}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    snapshot.save(args, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())

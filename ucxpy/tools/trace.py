"""ucxpy-trace: merge, summarize and plot the traces of ``UCXPY_TRACE=DIR``.

::

    ucxpy-trace merge DIR -o job.json     # Chrome / Perfetto trace-event JSON
    ucxpy-trace summary DIR [--json] [--plot OUTDIR]
    ucxpy-trace plot DIR OUTDIR           # msg_sizes.png, traffic.png

``merge`` aligns every rank's clock to rank 0's with the offsets measured at
wire-up (see :func:`ucxpy.trace.align_clocks`), puts each rank in its own
process (pid = rank) and each lane (transport) in its own thread, and links
the events of one message (send, arrival, match, rendezvous phases) by a
flow.  Open the file in https://ui.perfetto.dev or chrome://tracing.

``summary`` counts what each rank sent to each peer per protocol (messages
and bytes, from the send events), the rendezvous variants receivers chose and
the time each rank spent waiting.  ucxpy's own traffic (barriers, clock
alignment: tags with the reserved top byte) is listed apart from the
program's.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys

from ..trace import is_reserved_tag

#: ph values merge writes
PHASES = ("X", "i", "s", "t", "f", "M")


class TraceError(Exception):
    """The trace directory is missing, empty or malformed."""


def load(directory: str) -> list:
    """``[(header, events), ...]`` of every ``trace.*.jsonl`` in ``directory``,
    by rank."""
    if not os.path.isdir(directory):
        raise TraceError(f"{directory}: not a directory")
    paths = sorted(glob.glob(os.path.join(directory, "trace.*.jsonl")))
    if not paths:
        raise TraceError(f"{directory}: no trace.*.jsonl files (was UCXPY_TRACE set?)")
    out = []
    for path in paths:
        with open(path) as f:
            lines = f.read().splitlines()
        try:
            header = json.loads(lines[0]) if lines else None
            if not header or header.get("type") != "header":
                raise TraceError(f"{path}: first line is not a trace header")
            events = [json.loads(line) for line in lines[1:] if line.strip()]
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}: malformed line: {e}") from None
        out.append((header, events))

    def order(item):
        h = item[0]
        return (h.get("rank") is None, h.get("rank") or 0, h.get("pid", 0))
    out.sort(key=order)
    return out


def _pid(header, index: int) -> int:
    return header["rank"] if header.get("rank") is not None else 10_000 + index


# -- merge ------------------------------------------------------------------------

def merge(directory: str) -> dict:
    """The Chrome trace-event document of the traces in ``directory``."""
    ranks = load(directory)
    aligned = []
    for i, (h, events) in enumerate(ranks):
        off = int(h.get("clock_offset_ns") or 0)
        aligned.append((h, _pid(h, i), off, events))
    starts = [e["ts"] + off for _, _, off, events in aligned for e in events]
    base = min(starts) if starts else 0
    out, flows = [], collections.defaultdict(list)
    for h, pid, off, events in aligned:
        name = f"rank {h['rank']}" if h.get("rank") is not None else f"worker {h['worker_id']}"
        out.append({"name": "process_name", "ph": "M", "ts": 0, "pid": pid, "tid": 0,
                    "args": {"name": f"{name} ({h.get('host')} pid {h.get('pid')})"}})
        out.append({"name": "process_sort_index", "ph": "M", "ts": 0, "pid": pid, "tid": 0,
                    "args": {"sort_index": pid}})
        tids = {"": 0}
        for e in events:
            lane = e.get("lane", "")
            tid = tids.setdefault(lane, len(tids))
            ts = (e["ts"] + off - base) / 1000.0       # trace-event ts is in microseconds
            args = dict(e.get("args", {}))
            ev = {"name": e["name"], "cat": e["cat"], "ts": ts, "pid": pid, "tid": tid,
                  "args": args}
            key = args.get("msg")
            if e.get("dur"):
                ev["ph"], ev["dur"] = "X", e["dur"] / 1000.0
            elif key:
                ev["ph"], ev["dur"] = "X", 0        # a slice, so a flow can bind to it
            else:
                ev["ph"], ev["s"] = "i", "t"
            out.append(ev)
            if key:
                flows[key].append((ts, pid, tid))
        for lane, tid in tids.items():
            out.append({"name": "thread_name", "ph": "M", "ts": 0, "pid": pid, "tid": tid,
                        "args": {"name": lane or "worker"}})
    for fid, (key, points) in enumerate(sorted(flows.items()), 1):
        if len(points) < 2:
            continue                   # the other side is not in the trace
        points.sort()
        for j, (ts, pid, tid) in enumerate(points):
            ph = "s" if j == 0 else ("f" if j == len(points) - 1 else "t")
            ev = {"name": "message", "cat": "flow", "ph": ph, "id": fid, "ts": ts,
                  "pid": pid, "tid": tid, "args": {"msg": key}}
            if ph != "s":
                ev["bp"] = "e"
            out.append(ev)
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"ranks": len(ranks), "source": os.path.abspath(directory),
                          "dropped_events": sum(h.get("dropped", 0) for h, _ in ranks)}}


# -- summary ----------------------------------------------------------------------

def summarize(directory: str) -> dict:
    """Counts per (sender > receiver) and protocol, split into the program's
    traffic (``user``) and ucxpy's own (``internal``); rendezvous variants;
    waiting time per rank.  Protocols of active messages are prefixed ``am_``."""
    ranks = load(directory)
    traffic = {"user": {}, "internal": {}}
    variants = collections.defaultdict(collections.Counter)
    waits, sizes = {}, []
    for i, (h, events) in enumerate(ranks):
        me = _pid(h, i)
        wait = sleep = 0
        for e in events:
            cat, args = e["cat"], e.get("args", {})
            if cat == "send":
                kind = "tag" if e["name"] == "tag_send" else "am"
                internal = kind == "tag" and is_reserved_tag(args.get("tag"))
                proto = args["proto"] if kind == "tag" else "am_" + args["proto"]
                pair = f"{me}>{args['peer']}"
                row = traffic["internal" if internal else "user"].setdefault(pair, {}) \
                    .setdefault(proto, {"msgs": 0, "bytes": 0})
                row["msgs"] += 1
                row["bytes"] += args["size"]
                if not internal:
                    sizes.append((me, args["peer"], args["size"], proto))
            elif cat == "rndv" and e["name"].startswith("rndv_"):
                variants[f"{args.get('peer')}>{me}"][e["name"][5:]] += 1
            elif cat == "wait":
                wait += e.get("dur", 0)
                sleep += args.get("slept_ns", 0)
        waits[me] = {"wait_ns": wait, "sleep_ns": sleep, "busy_ns": wait - sleep,
                     "dropped_events": h.get("dropped", 0)}
    return {"ranks": [_pid(h, i) for i, (h, _) in enumerate(ranks)], "traffic": traffic,
            "rndv_variants": {k: dict(v) for k, v in sorted(variants.items())},
            "waiting": waits, "sizes": sizes}


def _fmt_ns(ns) -> str:
    return f"{ns / 1e6:.3f} ms"


def print_summary(s: dict, out=sys.stdout) -> None:
    for part, title in (("user", "program traffic"), ("internal", "ucxpy internal traffic")):
        print(f"{title} (sender>receiver, protocol, messages, bytes):", file=out)
        rows = s["traffic"][part]
        if not rows:
            print("  (none)", file=out)
        for pair in sorted(rows, key=lambda p: tuple(int(x) for x in p.split(">"))):
            for proto, c in sorted(rows[pair].items()):
                print(f"  {pair:>9}  {proto:<14} {c['msgs']:>8} {c['bytes']:>14}", file=out)
    if s["rndv_variants"]:
        print("rendezvous variants chosen by receivers (sender>receiver):", file=out)
        for pair, v in s["rndv_variants"].items():
            print(f"  {pair:>9}  " + ", ".join(f"{k} {n}" for k, n in sorted(v.items())),
                  file=out)
    print("time in blocking waits per rank (busy-poll + sleep):", file=out)
    for rank, w in sorted(s["waiting"].items()):
        extra = f", {w['dropped_events']} events dropped" if w["dropped_events"] else ""
        print(f"  rank {rank}: {_fmt_ns(w['wait_ns'])} (busy {_fmt_ns(w['busy_ns'])}, "
              f"sleep {_fmt_ns(w['sleep_ns'])}){extra}", file=out)


def plot(s: dict, outdir: str) -> list:
    """Message-size histogram and rank x rank traffic heat map (PNG files)."""
    try:
        import matplotlib               # deferred: matplotlib only for plots
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt     # deferred (as above)
    except ImportError:
        raise TraceError("plotting needs matplotlib (pip install matplotlib, "
                         "or the package's [bench] / [test] extra)") from None
    import numpy as np      # deferred: numpy only for plots
    os.makedirs(outdir, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    by_proto = collections.defaultdict(list)
    for _, _, size, proto in s["sizes"]:
        by_proto[proto].append(max(size, 1))
    if by_proto:
        top = max(max(v) for v in by_proto.values())
        bins = np.logspace(0, np.log2(max(top, 2)) + 1, num=24, base=2.0)
        ax.hist(list(by_proto.values()), bins=bins, label=list(by_proto), stacked=True)
        ax.set_xscale("log", base=2)
        ax.legend()
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("messages")
    ax.set_title("message sizes (program traffic)")
    fig.tight_layout()
    paths.append(os.path.join(outdir, "msg_sizes.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    ranks = sorted(r for r in s["ranks"] if r < 10_000)
    n = (max(ranks) + 1) if ranks else 1
    mat = np.zeros((n, n))
    for pair, rows in s["traffic"]["user"].items():
        src, dst = (int(x) for x in pair.split(">"))
        if src < n and dst < n:
            mat[src, dst] += sum(c["bytes"] for c in rows.values())
    fig, ax = plt.subplots(figsize=(5, 4.5))
    im = ax.imshow(mat, cmap="viridis")
    fig.colorbar(im, ax=ax, label="bytes")
    ax.set_xlabel("receiver rank")
    ax.set_ylabel("sender rank")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_title("traffic (program, bytes)")
    fig.tight_layout()
    paths.append(os.path.join(outdir, "traffic.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ucxpy-trace", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge", help="write one Chrome/Perfetto trace-event JSON file")
    m.add_argument("dir")
    m.add_argument("-o", "--output", default="job.json")
    s = sub.add_parser("summary", help="per-peer counts and bytes per protocol, waiting time")
    s.add_argument("dir")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    s.add_argument("--plot", metavar="OUTDIR", help="also draw PNG plots into OUTDIR")
    g = sub.add_parser("plot", help="message-size histogram and traffic heat map (PNG)")
    g.add_argument("dir")
    g.add_argument("outdir")
    return p


def main(argv=None) -> int:
    opts = build_parser().parse_args(argv)
    try:
        if opts.cmd == "merge":
            doc = merge(opts.dir)
            with open(opts.output, "w") as f:
                json.dump(doc, f)
            print(f"wrote {opts.output}: {len(doc['traceEvents'])} events of "
                  f"{doc['otherData']['ranks']} rank(s)")
            return 0
        s = summarize(opts.dir)
        outdir = opts.outdir if opts.cmd == "plot" else opts.plot
        if opts.cmd == "summary":
            if opts.json:
                json.dump({k: v for k, v in s.items() if k != "sizes"}, sys.stdout, indent=1,
                          sort_keys=True)
                print()
            else:
                print_summary(s)
        if outdir:
            for path in plot(s, outdir):
                print(f"wrote {path}", file=sys.stderr if opts.cmd == "summary" else sys.stdout)
        return 0
    except TraceError as e:
        print(f"ucxpy-trace: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Tracing and statistics (issue 17): traces of a job with known traffic,
their merge into Chrome/Perfetto JSON, the summary, plots, worker.stats(),
UCXPY_STATS at exit, and the cost of the hooks when off."""
from __future__ import annotations

import ast
import glob
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, Pair

EXAMPLE = os.path.join(ROOT, "examples", "trace_ring.py")
_RANK_VARS = ("UCXPY_RANK", "UCXPY_SIZE", "PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT",
              "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")


def clean_env(**extra):
    """The test's environment without any ucxpy setting or rank identity."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("UCXPY_") and k not in _RANK_VARS}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def launch(n, args, cwd, timeout=90, **env):
    cmd = [sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", str(n),
           "--timeout", str(timeout)] + args
    cp = subprocess.run(cmd, env=clean_env(**env), capture_output=True, text=True,
                        timeout=timeout + 30, cwd=cwd)
    assert cp.returncode == 0, f"stdout:\n{cp.stdout}\nstderr:\n{cp.stderr}"
    return cp


def tool(*args):
    cp = subprocess.run([sys.executable, "-m", "ucxpy.tools.trace", *args], env=clean_env(),
                        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "Traceback" not in cp.stderr, cp.stderr
    return cp


@pytest.fixture(scope="module")
def ring_trace(tmp_path_factory):
    """The 4-rank example, traced; ``(trace dir, expected traffic)``."""
    base = tmp_path_factory.mktemp("ring")
    tdir = base / "trace"
    cp = launch(4, ["--trace", str(tdir), sys.executable, EXAMPLE], cwd=str(base))
    lines = [l for l in cp.stdout.splitlines() if l.startswith("EXPECTED ")]
    assert len(lines) == 1, cp.stdout
    return tdir, json.loads(lines[0][len("EXPECTED "):])


@pytest.mark.timeout(180)
def test_one_file_per_rank_with_header(ring_trace):
    tdir, _ = ring_trace
    files = sorted(os.path.basename(p) for p in glob.glob(str(tdir / "*")))
    assert files == [f"trace.{r}.jsonl" for r in range(4)]
    for r in range(4):
        with open(tdir / f"trace.{r}.jsonl") as f:
            header = json.loads(f.readline())
        assert header["type"] == "header" and header["rank"] == r and header["size"] == 4
        assert header["pid"] > 0 and header["host"]
        assert isinstance(header["clock_offset_ns"], int)
        assert header["clock_rtt_ns"] is not None and header["clock_rtt_ns"] >= 0
        assert header["dropped"] == 0


@pytest.mark.timeout(180)
def test_merge_is_valid_chrome_trace(ring_trace, tmp_path):
    tdir, _ = ring_trace
    out = tmp_path / "job.json"
    cp = tool("merge", str(tdir), "-o", str(out))
    assert cp.returncode == 0, cp.stderr
    with open(out) as f:
        doc = json.load(f)
    assert doc["displayTimeUnit"] == "ns"
    events = doc["traceEvents"]
    assert events
    allowed = {"X", "i", "B", "E", "s", "t", "f", "M"}
    for e in events:
        for key in ("name", "ph", "ts", "pid", "tid"):
            assert key in e, e
        assert e["ph"] in allowed, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert e["dur"] >= 0
    starts = {e["id"] for e in events if e["ph"] == "s"}
    ends = {e["id"] for e in events if e["ph"] == "f"}
    assert starts and starts == ends
    steps = {e["id"] for e in events if e["ph"] == "t"}
    assert steps <= starts
    meta = [e for e in events if e["ph"] == "M"]
    assert {e["pid"] for e in meta if e["name"] == "process_name"} == {0, 1, 2, 3}
    assert any(e["name"] == "thread_name" and e["args"]["name"] == "worker" for e in meta)
    # every rendezvous of the pipeline is one flow from its send to its completion
    names = {e["name"] for e in events}
    assert {"tag_send", "match", "rts", "send_done", "recv_done"} <= names
    assert min(e["ts"] for e in events if e["ph"] != "M") >= 0


@pytest.mark.timeout(180)
def test_summary_matches_known_traffic(ring_trace):
    tdir, expected = ring_trace
    cp = tool("summary", str(tdir), "--json")
    assert cp.returncode == 0, cp.stderr
    s = json.loads(cp.stdout)
    assert s["traffic"]["user"] == expected
    # the example's own arithmetic: 6 ring steps of 8 KiB, 4 pipeline messages of 1 MiB
    for src in range(4):
        rows = s["traffic"]["user"][f"{src}>{(src + 1) % 4}"]
        assert sum(r["msgs"] for r in rows.values()) == 6 + 4
        assert sum(r["bytes"] for r in rows.values()) == 6 * 8192 + 4 * (1 << 20)
        assert rows["rndv"] == {"msgs": 4, "bytes": 4 << 20}
    variants = s["rndv_variants"]
    assert sorted(variants) == ["0>1", "1>2", "2>3", "3>0"]
    assert all(sum(v.values()) == 4 for v in variants.values())
    assert set(s["waiting"]) == {"0", "1", "2", "3"}
    text = tool("summary", str(tdir))
    assert text.returncode == 0 and "program traffic" in text.stdout
    assert "rank 3:" in text.stdout


@pytest.mark.timeout(180)
def test_plots_written(ring_trace, tmp_path):
    pytest.importorskip("matplotlib")
    tdir, _ = ring_trace
    cp = tool("summary", str(tdir), "--plot", str(tmp_path / "plots"))
    assert cp.returncode == 0, cp.stderr
    for name in ("msg_sizes.png", "traffic.png"):
        path = tmp_path / "plots" / name
        assert path.exists() and path.stat().st_size > 0
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(60)
def test_missing_trace_is_a_clear_error(tmp_path):
    cp = tool("summary", str(tmp_path))
    assert cp.returncode == 2 and "no trace" in cp.stderr


@pytest.mark.timeout(120)
def test_off_leaves_no_files_and_stats_print_at_exit(tmp_path):
    cp = launch(2, ["--stats", sys.executable, EXAMPLE], cwd=str(tmp_path))
    assert os.listdir(tmp_path) == []
    for r in range(2):
        assert f"ucxpy stats [rank {r} " in cp.stderr, cp.stderr
    # 2 ranks: 4 x 1 MiB by rendezvous (the 2 ring steps of 16 KiB are eager on
    # shm, whose eager limit is 64 KiB)
    if "shm" in cp.stderr:
        assert "tx.tag.rndv.msgs = 4" in cp.stderr
        assert f"tx.tag.rndv.bytes = {4 * (1 << 20)}" in cp.stderr
    cp = launch(2, [sys.executable, EXAMPLE], cwd=str(tmp_path))
    assert os.listdir(tmp_path) == [] and "ucxpy stats" not in cp.stderr


@pytest.mark.timeout(60)
def test_worker_stats_count_a_known_exchange():
    p = Pair("self", n=1, stats=True)
    try:
        w = p.workers[0]
        ep = p.eps[0][0]
        ep.transport_endpoint()
        sizes = [1, 2, ep.short_thresh + 1, ep.rndv_thresh, ep.rndv_thresh + 10]
        buf = bytearray(max(sizes))
        for i, n in enumerate(sizes):
            r = w.tag_recv_nb(buf, tag=i)
            s = ep.tag_send_nb(bytes(n), i)
            p.wait(r, s)
        # one unexpected: send first, then receive
        ep.tag_send_nb(b"abc", 99)
        p.drive(lambda: w.matcher.unexpected_depth() == 1)
        w.tag_recv(bytearray(3), 99, timeout=10)
        st = w.stats()
        t = st["worker"]
        assert st["enabled"] is True
        assert t["tx.tag.eager_short.msgs"] == 3 and t["tx.tag.eager_short.bytes"] == 6
        assert t["tx.tag.eager_copy.msgs"] == 1
        assert t["tx.tag.eager_copy.bytes"] == ep.short_thresh + 1
        assert t["tx.tag.rndv.msgs"] == 2
        assert t["tx.tag.rndv.bytes"] == 2 * ep.rndv_thresh + 10
        assert t["rx.tag.rndv.msgs"] == 2 and t["rx.tag.eager.msgs"] == 4
        assert t["unexpected.msgs"] == 1 and t["unexpected.hwm"] == 1
        assert t["match.unexpected"] == 1 and t["tag_recv.posted"] == 6
        assert st["endpoints"][w.id]["tx.tag.rndv.msgs"] == 2
        assert st["transports"]["self"]["tx.tag.eager_short.msgs"] == 3
    finally:
        p.close()


@pytest.mark.timeout(60)
def test_stats_off_by_default():
    p = Pair("self", n=1)
    try:
        w = p.workers[0]
        assert w.tr is None
        st = w.stats()
        assert st["enabled"] is False and st["worker"]["unexpected.depth"] == 0
    finally:
        p.close()


@pytest.mark.timeout(60)
def test_ring_buffer_is_bounded_and_sigusr1_snapshots(tmp_path):
    p = Pair("self", n=1, trace=str(tmp_path), trace_events=16)
    try:
        w, ep = p.workers[0], p.eps[0][0]
        for i in range(40):
            r = w.tag_recv_nb(bytearray(8), tag=i)
            ep.tag_send_nb(b"x", i)
            p.wait(r)
        assert len(w.tr.events) == 16 and w.tr.recorded > 16
        if signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGUSR1)
            assert glob.glob(str(tmp_path / "trace.*.jsonl"))
    finally:
        p.close()
    (path,) = glob.glob(str(tmp_path / "trace.*.jsonl"))
    with open(path) as f:
        lines = f.read().splitlines()
    header = json.loads(lines[0])
    assert header["kept"] == 16 == len(lines) - 1
    assert header["dropped"] == header["recorded"] - 16 > 0


def _guarded(node, parents) -> bool:
    """``node`` (a use of ``X.tr`` / ``tr``) sits under ``if <same> is not None``,
    or in a function only ever called behind one (``_*_traced``)."""
    for anc in parents:
        if isinstance(anc, ast.FunctionDef) and anc.name.endswith("_traced"):
            return True
        if isinstance(anc, ast.If):
            src = ast.unparse(anc.test)
            if "is not None" in src and ("tr" in src):
                return True
    return False


@pytest.mark.timeout(60)
def test_disabled_hooks_are_one_check():
    """Every use of the recorder in the core's hot modules is behind a single
    ``is not None`` test, so with tracing and stats off nothing else runs."""
    unguarded = []
    for mod in ("worker", "endpoint", "rndv", "am", "rma", "tag"):
        path = os.path.join(ROOT, "ucxpy", mod + ".py")
        tree = ast.parse(open(path).read())

        def visit(node, parents):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = node.func.value
                is_tr = (isinstance(target, ast.Name) and target.id == "tr") or \
                    (isinstance(target, ast.Attribute) and target.attr == "tr")
                if is_tr and not _guarded(node, parents):
                    unguarded.append(f"{mod}.py:{node.lineno}: {ast.unparse(node)[:60]}")
            for child in ast.iter_child_nodes(node):
                visit(child, parents + [node])
        visit(tree, [])
    assert not unguarded, unguarded
    # and off means off: no recorder, the default config has both options off
    from ucxpy.config import Config
    cfg = Config.from_env({})
    assert cfg.trace == "" and cfg.stats is False


@pytest.mark.timeout(60)
def test_public_span_api_is_a_noop_when_off():
    import ucxpy
    p = Pair("self", n=1)
    try:
        w = p.workers[0]
        with ucxpy.trace.span(w, "coll", "x", algorithm="y") as s:
            s.set(more=1)
        assert ucxpy.trace.span(w, "a", "b") is ucxpy.trace.NO_SPAN
        ucxpy.trace.end(ucxpy.trace.begin(w, "a", "b"))
        ucxpy.trace.mark(w, "a", "b")
    finally:
        p.close()


@pytest.mark.timeout(60)
def test_info_stats_section():
    cp = subprocess.run([sys.executable, "-m", "ucxpy.tools.info", "-s"], env=clean_env(),
                        capture_output=True, text=True, timeout=50, cwd=ROOT)
    assert cp.returncode == 0, cp.stderr
    assert "Traceback" not in cp.stdout + cp.stderr
    assert "unexpected.hwm" in cp.stdout and "loopback self-test" in cp.stdout
    assert "tx.tag.rndv.msgs" in cp.stdout


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layer", ["mpi_shim", "shmem"])
def test_layers_on_the_same_timeline(layer, tmp_path):
    tdir = tmp_path / "trace"
    launch(2, ["--trace", str(tdir), sys.executable,
               os.path.join(ROOT, "tests", "progs", "trace_layers.py"), layer], cwd=str(tmp_path))
    with open(tdir / "trace.0.jsonl") as f:
        events = [json.loads(l) for l in f.read().splitlines()[1:]]
    spans = [(e["cat"], e["name"], e.get("args", {})) for e in events if e.get("dur")]
    if layer == "mpi_shim":
        algos = [a.get("algorithm") for c, n, a in spans if c == "coll" and n == "Allreduce"]
        # the second blocking collective on COMM_WORLD forms its shared-memory team
        assert algos.count("allreduce_ring") == 2 and "shmteam_allreduce" in algos
        assert any(a.get("blocking") is False for c, n, a in spans if c == "coll")
        win = [n for c, n, a in spans if c == "win"]
        assert win.count("Fence") == 2 and "Lock" in win and "Unlock" in win
    else:
        names = {n for c, n, a in spans if c == "shmem"}
        assert {"quiet", "barrier_all"} <= names
        assert any(e["cat"] == "shmem" and e["name"] == "fence" for e in events)
    doc = tool("merge", str(tdir), "-o", str(tmp_path / "job.json"))
    assert doc.returncode == 0, doc.stderr


@pytest.mark.timeout(120)
def test_peer_failure_is_traced(tmp_path):
    """Rank 1 is SIGKILLed; rank 0's trace (written at its exit) shows it."""
    tdir = tmp_path / "trace"
    cmd = [sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", "2", "--timeout", "60",
           "--trace", str(tdir), sys.executable,
           os.path.join(ROOT, "tests", "progs", "dead_peer.py"), "midway"]
    cp = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=90,
                        cwd=str(tmp_path))
    assert "DETECTED" in cp.stdout, cp.stdout + cp.stderr
    with open(tdir / "trace.0.jsonl") as f:
        lines = f.read().splitlines()
    events = [json.loads(l) for l in lines[1:]]
    fails = [e for e in events if e["name"] == "peer_failure"]
    assert fails and fails[0]["args"]["peer"] == 1
    assert json.loads(lines[0])["stats"]["worker"]["peer.failures"] >= 1

"""conformance/harness.py: what every conformance runner shares (outcomes
and their order, the comparisons with a reference or a baseline, the per-PE
records of the Python suites, and jobs killed whole at their time limit)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from conftest import ROOT

sys.path.insert(0, ROOT)
from conformance import harness  # noqa: E402


def test_outcomes_are_ordered_best_first():
    assert harness.worse("fail", "pass") and harness.worse("hang", "error")
    assert not harness.worse("skip", "fail")
    assert harness.RANK["timeout"] == harness.RANK["hang"]     # MPICH's name for a hang
    assert harness.counts(["pass", "fail", "pass"], ("pass", "fail", "hang")) == \
        {"pass": 2, "fail": 1, "hang": 0}


def test_compare_per_test():
    was = {"a": "pass", "b": "fail", "c": "pass"}
    now = {"a": "fail", "b": "pass", "d": "error"}          # c missing: not run
    bad, better, new = harness.compare(now, was)
    assert bad == [("a", "fail", "pass"), ("c", "not run", "pass")]
    assert better == [("b", "pass", "fail")] and new == ["d"]
    assert harness.compare(was, was) == ([], [], [])


def test_counts_worse_by_file():
    ref = {"pass": 5, "fail": 1, "error": 0, "skip": 1, "hang": 0}
    assert harness.counts_worse(dict(ref), ref) == []
    # a failure that became an error is no worse by counts
    assert harness.counts_worse(dict(ref, fail=0, error=1), ref) == []
    why = harness.counts_worse(dict(ref, skip=2, hang=1, **{"pass": 3}), ref)
    assert any("fewer passes" in w for w in why) and any("more hang" in w for w in why)
    assert any("more skip" in w for w in why)
    assert not any("skip" in w for w in harness.counts_worse(dict(ref, skip=2), ref,
                                                               skips=False))


def _recs(*events):
    return [dict(e) for e in events]


def test_per_test_outcomes_over_the_pes():
    """A test passes when it passed on every PE; started and never stopped
    is a hang; a class fixture's skip covers its tests; a test never reached
    is 'not run'."""
    ids = ["m.A.t1", "m.A.t2", "m.B.t3", "m.C.t4"]
    pe0 = _recs({"event": "begin", "tests": ids}, {"event": "start", "test": "m.A.t1"},
                {"event": "stop", "test": "m.A.t1", "outcome": "pass"},
                {"event": "start", "test": "m.A.t2"},
                {"event": "stop", "test": "m.A.t2", "outcome": "fail"},
                {"event": "fixture", "scope": "m.B", "outcome": "skip"},
                {"event": "start", "test": "m.C.t4"})
    pe1 = _recs({"event": "begin", "tests": ids}, {"event": "start", "test": "m.A.t1"},
                {"event": "stop", "test": "m.A.t1", "outcome": "pass"},
                {"event": "start", "test": "m.A.t2"},
                {"event": "stop", "test": "m.A.t2", "outcome": "pass"},
                {"event": "fixture", "scope": "m.B", "outcome": "skip"})
    s = harness.pe_outcomes({0: pe0, 1: pe1}, 2)
    assert s["tests"] == {"m.A.t1": "pass", "m.A.t2": "fail", "m.B.t3": "skip",
                          "m.C.t4": "hang"}
    assert not s["complete"]
    s = harness.pe_outcomes({0: pe0[:3]}, 1)
    assert s["tests"]["m.C.t4"] == "not run"


def test_pe_records_leave_out_a_cut_line(tmp_path):
    (tmp_path / "pe0.jsonl").write_text('{"event": "start", "test": "t"}\n{"event": "st')
    (tmp_path / "pe1.jsonl").write_text('{"event": "begin", "tests": []}\n')
    recs = harness.pe_records(str(tmp_path))
    assert recs == {0: [{"event": "start", "test": "t"}], 1: [{"event": "begin", "tests": []}]}


def test_a_job_past_its_time_is_killed_whole(tmp_path):
    """The launcher, its children, and a grandchild that left the process
    group for a group of its own (as hydra's proxies do) all die."""
    pidfile = tmp_path / "pid"
    child = (f"import os, time; os.setpgid(0, 0); open({str(pidfile)!r}, 'w')"
             f".write(str(os.getpid())); time.sleep(60)")
    cmd = [sys.executable, "-c",
           f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
           f"print('up', flush=True); time.sleep(60)"]
    rc, out, _, killed = harness.run_job(cmd, timeout=3)
    assert killed and rc is None and b"up" in out
    pid = int(pidfile.read_text())
    for _ in range(50):                 # (reaped by init once killed)
        if not os.path.exists(f"/proc/{pid}") or \
                open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"pid {pid} outlived its job")
    rc, out, _, killed = harness.run_job([sys.executable, "-c", "print('ok')"], timeout=30)
    assert (rc, out.strip(), killed) == (0, b"ok", False)
    rc, _, _, _ = harness.run_job(["false"], timeout=30, stdout=subprocess.DEVNULL)
    assert rc == 1

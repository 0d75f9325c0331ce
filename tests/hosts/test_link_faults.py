"""Faults between hosts: delay and loss on the links, a link cut silently, a
rank killed mid-transfer, a "host crash" (cut, then killed).  Transfers under
delay/loss complete and verify; a vanished peer surfaces as ConnectionLost /
PeerFailure on the affected requests within a bounded time
(UCXPY_PEER_TIMEOUT), never as a hang or corrupted data, and the surviving
ranks keep exchanging verified messages afterwards."""
from __future__ import annotations

import os
import re
import signal
import time

import pytest

from tests.hosts import netns

pytestmark = pytest.mark.timeout(180)

PEER_TIMEOUT = 3.0
DETECTED = re.compile(r"DETECTED (\d+) peer=(\d+) op=(\w+) exc=(\w+) wall=([\d.]+) peer_attr=(\S+)")


def stream_totals(out: str):
    rows = re.findall(r"STREAM (\d+) sent=(\d+) received=(\d+) verified=(\d+) bytes=(\d+)", out)
    return [tuple(map(int, r)) for r in rows]


@pytest.mark.parametrize("delay,loss", [(0.005, 0.02), (0.02, 0.0), (0.0, 0.05)],
                         ids=["5ms-2pct", "20ms", "5pct-loss"])
def test_stream_completes_and_verifies_under_delay_and_loss(make_cluster, delay, loss):
    """2 hosts x 2 ranks, every rank streams to the other three (shm inside a
    host, tcp across the impaired links); counts match, every message verified."""
    c = make_cluster(2, "impairable")
    for h in range(2):
        c.impair(h, delay=delay, loss=loss)
    t0 = time.monotonic()
    p = c.run_job("rel_stream.py", ["--count", 150, "--fanout", 3, "--window", 8,
                                    "--timeout", 60], per_host=2, timeout=150)
    rows = stream_totals(p.stdout)
    assert p.returncode == 0 and len(rows) == 4, p.stdout[-3000:] + p.stderr[-3000:]
    sent = sum(r[1] for r in rows)
    received = sum(r[2] for r in rows)
    verified = sum(r[3] for r in rows)
    assert sent == received == verified == 4 * 3 * 150, rows
    print(f"delay {delay * 1e3:g} ms loss {loss:.0%}: {sent} messages sent/received/verified "
          f"in {time.monotonic() - t0:.1f} s; link {c.link_stats(0)}")


def test_wire_up_retries_while_the_route_is_missing(make_cluster):
    """Each host has no route to the other for the first seconds (an
    'unreachable' route: connect fails at once with EHOSTUNREACH, as it does
    when a lossy link eats the ARP exchange).  tcp retries with backoff
    within UCXPY_PEER_TIMEOUT instead of failing, so the job completes and
    verifies once the route appears."""
    c = make_cluster(2)
    for h in range(2):
        netns.sh("ip", "-n", c.hosts[h], "route", "add", "unreachable", f"{c.ip(1 - h)}/32")
    p = c.start_job("rel_stream.py", ["--count", 20, "--fanout", 1, "--window", 4,
                                      "--timeout", 60], per_host=1, timeout=90,
                    env={"UCXPY_PEER_TIMEOUT": "20"})
    time.sleep(3)
    for h in range(2):
        netns.sh("ip", "-n", c.hosts[h], "route", "del", "unreachable", f"{c.ip(1 - h)}/32")
    out = netns.finish(p, 80)
    rows = stream_totals(out)
    assert p.returncode == 0 and len(rows) == 2, out[-3000:]
    assert all(r[1] == r[2] == r[3] == 20 for r in rows), rows


def run_fault(cluster, action, victim=1, args=(), env=None):
    """Start rel_cut.py on every host, wait until all ranks are ARMED, apply
    ``action(pids)``; returns (wall time of the action, full output, exit code)."""
    p = cluster.start_job("rel_cut.py", [victim, *args], per_host=1, timeout=90, grace=60,
                          env=dict({"UCXPY_PEER_TIMEOUT": str(PEER_TIMEOUT)}, **(env or {})))
    out = []
    try:
        while sum("ARMED" in l for l in out) < cluster.n:
            out += netns.lines_until(p, "ARMED", 60)
    except netns.HarnessError:
        netns.dump_stacks(cluster)
        time.sleep(1)
        p.kill()
        raise AssertionError("ranks did not start exchanging:\n" + "".join(out)
                             + netns.finish(p, 10))
    pids = {int(r): int(pid) for r, pid in re.findall(r"ARMED (\d+) (\d+)", "".join(out))}
    t = time.time()
    action(pids)
    try:
        rest = netns.finish(p, 60)
    except Exception:
        netns.dump_stacks(cluster)
        time.sleep(1)
        p.kill()
        raise AssertionError("job hung after the fault:\n" + "".join(out)
                             + netns.finish(p, 10))
    return t, "".join(out) + rest, p.returncode


def detections(out, t0):
    """{(rank, peer): (seconds after the fault, exception name, exc.peer)}"""
    d = {}
    for rank, peer, op, exc, wall, attr in DETECTED.findall(out):
        d.setdefault((int(rank), int(peer)), (float(wall) - t0, exc, attr))
    return d


def check_survivors(out, n, victim):
    for r in range(n):
        if r != victim:
            assert f"SURVIVED {r}" in out, f"rank {r} did not keep working:\n{out}"
    assert "AssertionError" not in out and "Traceback" not in out, out


@pytest.mark.parametrize("link", ["veth", "emulated"])
def test_link_cut_detected_within_peer_timeout(make_cluster, link):
    """Host 1's link goes silent (no FIN, no RST): tcp keepalive /
    TCP_USER_TIMEOUT from UCXPY_PEER_TIMEOUT=3 fail the requests on both
    sides of the cut in ~3 s; ranks 0 and 2 carry on."""
    if link == "emulated" and not netns.tap_available():
        pytest.skip("no /dev/net/tun")
    c = make_cluster(3, link)
    t0, out, rc = run_fault(c, lambda pids: c.cut(1))
    d = detections(out, t0)
    pairs = {(0, 1), (2, 1), (1, 0), (1, 2)}
    assert pairs <= set(d), out
    for pair in pairs:
        secs, exc, attr = d[pair]
        assert exc == "ConnectionLost" and attr == str(pair[1]), (pair, d[pair], out)
        assert PEER_TIMEOUT * 0.5 <= secs <= PEER_TIMEOUT * 2 + 2, (pair, secs, out)
    assert not any(pair not in pairs for pair in d), d     # 0<->2 never failed
    check_survivors(out, 3, victim=1)
    assert rc == 0, out


@pytest.mark.parametrize("notices", [True, False], ids=["launcher+transport", "transport-only"])
def test_rank_killed_mid_transfer(make_cluster, notices):
    """SIGKILL of rank 1 while 1 MiB rendezvous messages flow both ways: the
    kernel closes its sockets, so survivors fail the affected requests at
    once (well under a second), with or without the launcher's notice."""
    c = make_cluster(3)
    args = [] if notices else ["--no-launcher-notices"]
    t0, out, rc = run_fault(c, lambda pids: os.kill(pids[1], signal.SIGKILL), args=args)
    d = detections(out, t0)
    for r in (0, 2):
        assert (r, 1) in d, out
        secs, exc, attr = d[(r, 1)]
        assert exc in ("ConnectionLost", "PeerFailure") and attr == "1", (d, out)
        assert secs < 2.0, (r, secs, out)
    assert set(d) == {(0, 1), (2, 1)}, d
    check_survivors(out, 3, victim=1)
    assert rc == 128 + signal.SIGKILL, out   # the launcher reports the dead rank's status


@pytest.mark.parametrize("notices", [True, False], ids=["launcher-notice", "transport-only"])
def test_host_crash(make_cluster, notices):
    """Host 1 vanishes (link cut, then its rank killed: no FIN ever arrives).
    With the launcher's notices the survivors get PeerFailure within about
    a second; without them tcp's own timeout reports it within
    UCXPY_PEER_TIMEOUT."""
    c = make_cluster(3)

    def crash(pids):
        c.cut(1)
        os.kill(pids[1], signal.SIGKILL)

    args = [] if notices else ["--no-launcher-notices"]
    t0, out, rc = run_fault(c, crash, args=args)
    d = detections(out, t0)
    for r in (0, 2):
        assert (r, 1) in d, out
        secs, exc, attr = d[(r, 1)]
        assert attr == "1", (d, out)
        if notices:
            assert exc == "PeerFailure" and secs < 2.0, (r, d[(r, 1)], out)
        else:
            assert exc == "ConnectionLost" and secs <= PEER_TIMEOUT * 2 + 2, (r, d[(r, 1)], out)
    check_survivors(out, 3, victim=1)

"""Faults on one machine (no namespaces needed): a rank SIGKILLed in the
middle of rendezvous transfers, over tcp and over shm, with and without the
launcher's failure notices.  Survivors get ConnectionLost / PeerFailure on
the requests that depend on the dead rank within a bounded time, keep
exchanging verified messages with each other, and nothing hangs.
Link cuts, delay and loss need separate hosts: tests/hosts/."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import PROGS, ROOT, run_job, transport_available

DETECTED = re.compile(r"DETECTED (\d+) peer=(\d+) op=(\w+) exc=(\w+) wall=([\d.]+)")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("notices", [True, False], ids=["launcher", "transport-only"])
@pytest.mark.parametrize("tls", ["tcp", "shm"])
def test_rank_killed_mid_transfer(tls, notices):
    if not transport_available(tls):
        pytest.skip(f"{tls} unavailable")
    env = dict(os.environ, UCXPY_TLS=tls, UCXPY_PEER_TIMEOUT="3", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    args = [] if notices else ["--no-launcher-notices"]
    p = subprocess.Popen([sys.executable, "-m", "ucxpy.bootstrap.launcher", "-n", "3",
                          "--timeout", "90", "--grace", "60", "--tag-output",
                          sys.executable, os.path.join(PROGS, "rel_cut.py"), "1", *args],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
                         text=True)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from hosts.netns import finish, lines_until
    try:
        out = []
        while sum("ARMED" in l for l in out) < 3:
            out += lines_until(p, "ARMED", 60)
        pids = dict(re.findall(r"ARMED (\d+) (\d+)", "".join(out)))
        t0 = time.time()
        os.kill(int(pids["1"]), signal.SIGKILL)
        text = "".join(out) + finish(p, 60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    found = {}
    for rank, peer, _op, exc, wall in DETECTED.findall(text):
        found.setdefault((int(rank), int(peer)), (exc, float(wall) - t0))
    assert set(found) == {(0, 1), (2, 1)}, text
    for exc, secs in found.values():
        assert exc in ("ConnectionLost", "PeerFailure") and secs < 2.0, text
    assert "SURVIVED 0" in text and "SURVIVED 2" in text and "Traceback" not in text, text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tls,mode", [("shm", "close"), ("shm", "exit"), ("tcp", "close")])
def test_frames_of_a_peer_that_left_are_delivered(tls, mode):
    """A peer's first frames on a new connection, sent right before it
    closed (or died), arrive although its other connection closed first:
    the worker waits a short grace for the connection being accepted, and
    shm keeps the unmapped segment for the peer (regression: ConnectionLost)."""
    if not transport_available(tls):
        pytest.skip(f"{tls} unavailable")
    r = run_job(["python", os.path.join(PROGS, "close_race.py"), mode], 2, timeout=40,
                env={"UCXPY_TLS": tls})
    assert "RACE OK hello" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.timeout(60)
def test_a_dead_progress_thread_fails_the_waits_instead_of_hanging():
    """A progress callback (or handler) that raises kills the background
    progress thread; waits that leave progress to the thread (shmem's) check
    the worker through check_peers, which raises ProgressThreadError with
    the cause from then on, instead of waiting forever for progress nobody
    makes (this hung a shmem job until its timeout)."""
    import ucxpy
    ctx = ucxpy.Context(ucxpy.Config.from_env({}, tls="self"))
    w = ctx.create_worker()
    try:
        w.start_progress_thread()

        def broken():
            raise KeyError("boom")
        w.add_progress_callback(broken)
        deadline = time.monotonic() + 10
        with pytest.raises(ucxpy.ProgressThreadError, match="progress thread died") as ei:
            while time.monotonic() < deadline:      # a waiter that does not progress
                w.check_peers()
                time.sleep(0.001)
        assert isinstance(ei.value.__cause__, KeyError)
        with pytest.raises(ucxpy.ProgressThreadError):   # and every wait after it
            w.wait_until(lambda: False, timeout=30)
    finally:
        w.remove_progress_callback(broken)
        w.close()


@pytest.mark.timeout(60)
def test_shmem_job_with_a_dead_progress_thread_ends():
    """The same in a 2-PE shmem job over ofi (its PEs leave progress to the
    thread): the job fails fast with the rank's error instead of hanging."""
    if not transport_available("ofi"):
        pytest.skip("ofi unavailable")
    code = ("import numpy as np, shmem\n"
            "shmem.init()\n"
            "if shmem.my_pe() == 0:\n"
            "    shmem.runtime.get().worker.add_progress_callback(lambda: 1 // 0)\n"
            "x = shmem.zeros(10)\n"
            "shmem.barrier_all()\n")
    t0 = time.monotonic()
    r = run_job(["python", "-c", code], 2, timeout=50,
                env={"UCXPY_TLS": "self,ofi", "UCXPY_OFI_PROVIDER": "tcp;ofi_rxm"})
    assert r.returncode != 0 and time.monotonic() - t0 < 40, r.stdout + r.stderr
    assert "ProgressThreadError" in r.stderr and "ZeroDivisionError" in r.stderr, r.stderr[-3000:]

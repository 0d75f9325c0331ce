"""The background progress thread (``Worker.start_progress_thread``): every
public method of Worker and Endpoint either takes the worker's lock or is
named lock-free with a reason (ucxpy/progress_thread.py), and a receive
posted by the application thread while the thread delivers is never lost.

The race this guards against: ``tag_recv_any_nb`` was not locked, so the
progress thread could queue a message as unexpected between the receive's
look at the unexpected queue and its posting; both then waited for ever
(shmem's collectives under Slurm hung about once in fifteen runs)."""
from __future__ import annotations

import sys
import time

import pytest

from conftest import Pair, transport_available
from ucxpy.endpoint import Endpoint
from ucxpy.progress_thread import ENDPOINT_API, WORKER_API, WORKER_LOCK_FREE
from ucxpy.worker import Worker


def _public(cls):
    return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}


@pytest.mark.parametrize("cls,locked,free", [(Worker, WORKER_API, WORKER_LOCK_FREE),
                                              (Endpoint, ENDPOINT_API, set())],
                         ids=["Worker", "Endpoint"])
def test_every_public_method_is_locked_or_named_lock_free(cls, locked, free):
    public = _public(cls)
    assert not public - set(locked) - free, \
        "public methods neither locked under a progress thread nor named lock-free"
    assert not set(locked) & free
    assert free <= public, "a lock-free name that is gone"
    assert set(n for n in locked if not n.startswith("_")) <= public, "a locked name that is gone"


@pytest.mark.parametrize("tl", ["shm", "tcp"])
@pytest.mark.parametrize("post", ["tag_recv_nb", "tag_recv_any_nb"])
def test_receives_posted_while_the_thread_delivers_all_complete(tl, post):
    if not transport_available(tl):
        pytest.skip(f"{tl} unavailable")
    n = 20000
    p = Pair(tl)
    old = sys.getswitchinterval()
    try:
        a, b = p.workers
        ep = p.eps[0][1]
        r = b.tag_recv_nb(bytearray(4), 1 << 40, source=0)   # wire-up before the thread starts
        ep.tag_send_nb(b"wire", 1 << 40)
        p.wait(r)
        b.start_progress_thread()
        sys.setswitchinterval(1e-6)                      # switch threads as often as possible
        reqs, bufs = [], []
        for i in range(n):
            ep.tag_send_nb(i.to_bytes(4, "little"), i)
            if post == "tag_recv_nb":
                bufs.append(bytearray(4))
                reqs.append(b.tag_recv_nb(bufs[-1], i, source=0))
            else:
                reqs.append(b.tag_recv_any_nb(i, source=0))
            a.progress()
        deadline = time.monotonic() + 30
        while not all(r.done for r in reqs) and time.monotonic() < deadline:
            a.progress()
            time.sleep(0.001)
        lost = [i for i, r in enumerate(reqs) if not r.done]
        assert not lost, f"{len(lost)} receives never completed (first: tag {lost[0]}); " \
                         f"{b.matcher.unexpected_depth()} messages unexpected"
        got = bufs or [r.buf for r in reqs]
        assert all(bytes(g) == i.to_bytes(4, "little") for i, g in enumerate(got))
        b.stop_progress_thread()
    finally:
        sys.setswitchinterval(old)
        p.close()

"""Workers of different jobs number themselves alike (a spawned child's rank
0 and its parent's rank 0): a worker gives a colliding peer a local alias,
so both stay reachable and their messages carry distinct sources."""
from __future__ import annotations

import pytest

from conftest import drive, wait_all

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("tl", ["tcp", "shm"])
def test_colliding_worker_ids_get_distinct_local_ids(tl):
    import ucxpy
    from ucxpy.worker import ALIAS_BASE
    from conftest import transport_available
    if not transport_available(tl):
        pytest.skip(f"{tl} unavailable")
    ctx = ucxpy.Context(tls=[tl])
    hub = ctx.create_worker(worker_id=0)
    a = ctx.create_worker(worker_id=1)          # "job A, rank 1"
    b = ctx.create_worker(worker_id=1)          # "job B, rank 1": the same id
    ws = [hub, a, b]
    try:
        ea, eb = hub.connect(a.address_bytes), hub.connect(b.address_bytes)
        assert ea is not eb and ea.remote_id == 1 and eb.remote_id >= ALIAS_BASE
        assert hub.connect(b.address_bytes) is eb          # same worker: same endpoint
        # messages from both arrive with the sender's local id as source
        bufs = [bytearray(3), bytearray(3)]
        reqs = [hub.tag_recv_nb(bufs[0], 7, source=ea.remote_id),
                hub.tag_recv_nb(bufs[1], 7, source=eb.remote_id)]
        wait_all(ws, [a.connect(hub.address_bytes).tag_send_nb(b"aaa", 7),
                      b.connect(hub.address_bytes).tag_send_nb(b"bbb", 7)])
        wait_all(ws, reqs)
        assert bufs == [bytearray(b"aaa"), bytearray(b"bbb")]
        assert [r.result.source for r in reqs] == [ea.remote_id, eb.remote_id]
        # and sends reach each of them
        got = bytearray(2)
        r = b.tag_recv_nb(got, 9)
        wait_all(ws, [eb.tag_send_nb(b"hi", 9)])
        drive(ws, lambda: r.done)
        assert got == b"hi"
    finally:
        for w in ws:
            w.close()

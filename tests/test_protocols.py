"""Protocol plug-ins (ucxpy/protocols.py, UCXPY_PROTO_PLUGIN): the shipped
pipelined-copy rendezvous and a plug-in written here, on shm and tcp
between two workers: every size across the plug-in's boundary with data
checked, offers matched in MPI's order with the stock protocols' messages
(expected, unexpected, wildcards, probe and matched probe, a receive of any
size), truncation, synchronous sends, a peer's failure, and the
configuration's errors.  The same plug-in under MPICH through libucp is in
tests/test_ucp_capi.py."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import Pair, transport_available
from ucxpy import protocols
from ucxpy.config import ConfigError
from ucxpy.errors import TruncationError
from ucxpy.tag import ANY_SOURCE

TLS = [t for t in ("shm", "tcp") if transport_available(t)]


@pytest.fixture(params=TLS)
def plugged(request):
    p = Pair(request.param, proto_plugin="pipelined-copy:1K-inf")
    for w in p.workers:
        w.protocol.frag = 4096
    yield p
    p.close()


def data(n, seed=0):
    return (np.arange(n, dtype=np.uint32) * 2654435761 + seed).astype(np.uint8)


def test_every_size_across_the_boundary_arrives_whole(plugged):
    a, b = plugged.workers
    ep = plugged.eps[0][1]
    for n in (0, 8, 1023, 1024, 1025, 4096, 4097, 3 * 4096, 100_000):
        src, dst = data(n, n), np.full(n, 0xEE, np.uint8)
        r = b.tag_recv_nb(dst, n)
        s = ep.tag_send_nb(src, n)
        plugged.wait(r, s)
        assert (dst == src).all() and r.result.length == n and r.result.tag == n
    c = a.protocol.counts
    assert c["offers"] == 6 and c["fragments"] == 1 + 1 + 1 + 2 + 3 + 25
    assert b.protocol.counts["received"] == 6


def test_offers_keep_mpi_order_with_eager_messages(plugged):
    """Small (eager) and large (plug-in) messages of one tag, sent before any
    receive is posted, are received in the order they were sent; so are
    they with receives posted first, and with a wildcard."""
    a, b = plugged.workers
    ep = plugged.eps[0][1]
    sizes = [8, 5000, 16, 2048, 0, 70_000, 1]
    sends = [ep.tag_send_nb(data(n, i), 3) for i, n in enumerate(sizes)]
    plugged.drive(lambda: b.matcher.unexpected_depth() == len(sizes))
    for i, n in enumerate(sizes):
        dst = np.zeros(max(n, 1), np.uint8)
        r = b.tag_recv_nb(dst, 3, source=ANY_SOURCE)
        plugged.wait(r)
        assert r.result.length == n and (dst[:n] == data(n, i)).all()
    plugged.wait(*sends)
    dsts = [np.zeros(max(n, 1), np.uint8) for n in sizes]
    recvs = [b.tag_recv_nb(d, 4, 0xFF) for d in dsts]
    sends = [ep.tag_send_nb(data(n, i), 4) for i, n in enumerate(sizes)]
    plugged.wait(*recvs, *sends)
    for i, n in enumerate(sizes):
        assert (dsts[i][:n] == data(n, i)).all()


def test_probe_matched_probe_and_a_receive_of_any_size(plugged):
    a, b = plugged.workers
    ep = plugged.eps[0][1]
    s = ep.tag_send_nb(data(9000, 1), 7)
    plugged.drive(lambda: b.tag_probe_nb(7) is not None)
    info = b.tag_peek(7)
    assert info.length == 9000 and info.tag == 7
    msg = b.tag_peek(7, remove=True)
    assert msg is not None and b.tag_peek(7) is None
    dst = np.zeros(9000, np.uint8)
    r = b.tag_recv_message_nb(dst, msg)
    plugged.wait(r, s)
    assert (dst == data(9000, 1)).all()
    s = ep.tag_send_nb(data(5000, 2), 8)
    r = b.tag_recv_any_nb(8)
    plugged.wait(r, s)
    assert bytes(r.buf) == data(5000, 2).tobytes()


def test_truncation_fails_the_receive_and_releases_the_sender(plugged):
    a, b = plugged.workers
    ep = plugged.eps[0][1]
    r = b.tag_recv_nb(bytearray(2000), 5)
    s = ep.tag_send_nb(data(3000), 5)
    plugged.drive(lambda: r.done and s.done)
    assert isinstance(r.exc, TruncationError) and r.exc.size == 3000
    assert s.exc is None and not a.protocol.sends


def test_a_synchronous_send_completes_after_the_match(plugged):
    a, b = plugged.workers
    ep = plugged.eps[0][1]
    s = ep.tag_send_sync_nb(data(4000), 6)
    for _ in range(200):
        a.progress()
        b.progress()
    assert not s.done                      # nothing matched it yet
    dst = np.zeros(4000, np.uint8)
    r = b.tag_recv_nb(dst, 6)
    plugged.wait(r, s)
    assert (dst == data(4000)).all()


def test_a_failed_peer_fails_what_waits_on_it(plugged):
    a, b = plugged.workers
    ep = plugged.eps[0][1]
    s = ep.tag_send_nb(data(5000), 1)      # never matched
    plugged.drive(lambda: b.matcher.unexpected_depth() == 1)
    ep.fail(ConnectionError("gone"))
    assert s.done and s.exc is not None and not a.protocol.sends


class Counting(protocols.PipelinedCopy):
    """A plug-in of the test's own (module:Class): the shipped one, counting
    its frames by kind."""
    name = "counting"
    seen = {}

    def on_frame(self, ep, kind, header, payload):
        Counting.seen[kind] = Counting.seen.get(kind, 0) + 1
        super().on_frame(ep, kind, header, payload)


def test_a_plug_in_by_module_and_class():
    Counting.seen.clear()
    p = Pair(TLS[0], proto_plugin="test_protocols:Counting:100-200")
    try:
        a, b = p.workers
        assert type(a.protocol) is Counting and a.protocol.sizes == ((100, 200),)
        for n in (99, 100, 200, 201):
            dst = np.zeros(n, np.uint8)
            r = b.tag_recv_nb(dst, 2)
            s = p.eps[0][1].tag_send_nb(data(n), 2)
            p.wait(r, s)
            assert (dst == data(n)).all()
        assert Counting.seen == {protocols.OFFER: 2, protocols.CTS: 2, protocols.FRAG: 2}
    finally:
        p.close()


@pytest.mark.parametrize("spec,why", [
    ("pipelined-copy", "name:sizes"),
    ("pipelined-copy:", "no sizes"),
    ("pipelined-copy:none", "no sizes"),
    ("no-such:1K-inf", "no protocol"),
    ("ucxpy.tag:TagMatcher:1K-inf", "is not a ucxpy.protocols.Protocol"),
])
def test_a_bad_plug_in_is_a_clear_error(spec, why):
    import ucxpy
    with pytest.raises(ConfigError, match=why):
        ucxpy.Context(ucxpy.Config.from_env({}, tls=TLS[0], proto_plugin=spec)).create_worker()


def test_a_plug_in_frame_where_none_is_configured_fails_that_connection():
    """Ranks that disagree on UCXPY_PROTO_PLUGIN: the receiver's endpoint
    fails with a protocol error naming the variable, the sender's send with
    the lost connection; never a hang."""
    import ucxpy
    from conftest import drive
    from ucxpy.errors import ProtocolError
    ctx_a = ucxpy.Context(ucxpy.Config.from_env({}, tls=TLS[0],
                                                proto_plugin="pipelined-copy:1K-inf"))
    ctx_b = ucxpy.Context(ucxpy.Config.from_env({}, tls=TLS[0]))
    a, b = ctx_a.create_worker(worker_id=0), ctx_b.create_worker(worker_id=1)
    try:
        ep = a.connect(b.address_bytes)
        b.connect(a.address_bytes)
        s = ep.tag_send_nb(data(5000), 1)
        b.tag_recv_nb(np.zeros(5000, np.uint8), 1)
        drive([a, b], lambda: s.done, timeout=20)
        assert s.exc is not None
        (peer,) = b.endpoints.values()
        assert isinstance(peer.failed, ProtocolError) and "UCXPY_PROTO_PLUGIN" in str(peer.failed)
    finally:
        for w in (a, b):
            for e in list(w.endpoints.values()):
                e.abort()
            w.close()


def test_ucxpy_info_prints_who_runs_the_plug_ins_sizes():
    import os
    import subprocess
    import sys
    env = dict(os.environ, UCXPY_PROTO_PLUGIN="pipelined-copy:64K-1M")
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ucxpy-info"), "-e"],
                         env=env, capture_output=True, text=True, timeout=60).stdout
    rows = [line for line in out.splitlines() if "plug-in pipelined-copy" in line]
    assert rows and all("64K .. 1M" in r for r in rows), out
    # its Python half everywhere; its C half too where the data plane reads
    # the inbox (shm), for libucp's messages
    assert all(r.rstrip().endswith("Python") for r in rows if " shm " not in r), out
    shm = [r for r in rows if " shm " in r]
    assert shm and all(r.rstrip().endswith("C half for libucp's") for r in shm), out
    env["UCXPY_PROTO_NATIVE"] = "n"
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ucxpy-info"), "-e"],
                         env=env, capture_output=True, text=True, timeout=60).stdout
    rows = [line for line in out.splitlines() if "plug-in pipelined-copy" in line]
    assert rows and all(r.rstrip().endswith("Python") for r in rows), out

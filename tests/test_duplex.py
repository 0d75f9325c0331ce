"""One tcp connection per pair of workers (``TransportEndpoint.duplex``).

A worker answers a peer on the connection the peer opened; when both
connected at once, the side with the larger uuid moves to the other's
connection (``Endpoint._move_to``: LANE_MOVE on the old one, WIREUP(MOVED) on
the new), and the peer holds what arrives on the new connection until the
old one's LANE_MOVE (``Worker._peer_moved``).  Checked with real workers and
sockets, with the hold's orderings driven by hand, and across processes.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from conftest import PROGS, Pair, drive, run_job, wait_all
from ucxpy import wire
from ucxpy.errors import ConnectionLost

pytestmark = pytest.mark.timeout(120)


def tcp_conns(worker) -> int:
    """Established connections of ``worker``'s tcp interface."""
    tcp = next(i for i in worker.ifaces if i.name == "tcp")
    return sum(1 for t in tcp._by_fd.values() if t._state == 2)


def settle(p: Pair, timeout=10.0):
    drive(p.workers, lambda: all(tcp_conns(w) == 1 for w in p.workers), timeout)


@pytest.fixture
def tcp_pair():
    p = Pair("tcp")
    yield p
    p.close()


def test_reply_goes_back_on_the_peers_connection(tcp_pair):
    p = tcp_pair
    (w0, w1), ep01, ep10 = p.workers, p.eps[0][1], p.eps[1][0]
    buf = bytearray(5)
    r = w1.tag_recv_nb(buf, 1)
    ep01.tag_send_nb(b"hello", 1)
    wait_all(p.workers, [r])
    r = w0.tag_recv_nb(buf, 2)
    ep10.tag_send_nb(b"world", 2)
    assert wait_all(p.workers, [r])[0].length == 5 and bytes(buf) == b"world"
    assert ep10._tep in ep10.incoming           # w1 answers on w0's connection
    assert ep01._tep in ep01.incoming           # w0 receives on its own
    assert tcp_conns(w0) == tcp_conns(w1) == 1


@pytest.mark.parametrize("rounds", [1, 3])
def test_simultaneous_connect_moves_once_and_keeps_order(tcp_pair, rounds):
    """Both send streams before either has progressed: two connections are
    opened, one side moves mid-stream, every message arrives in order (eager
    and rendezvous alike), and one connection is left."""
    p = tcp_pair
    sizes = [8, 3000, 70000, 8, 200000, 16] * 10
    reqs, bufs = [], {}
    for rnd in range(rounds):
        for a, b in ((0, 1), (1, 0)):
            for i, n in enumerate(sizes):
                data = np.full(n, (a * 97 + rnd * 31 + i) % 251, np.uint8)
                data[:4] = np.frombuffer(np.int32(rnd * 1000 + i).tobytes(), np.uint8)
                reqs.append(p.eps[a][b].tag_send_nb(data, 9))
                buf = np.zeros(n, np.uint8)
                bufs[(b, rnd, i)] = buf
                reqs.append(p.workers[b].tag_recv_nb(buf, 9, source=p.workers[a].id))
        wait_all(p.workers, reqs)
    for (b, rnd, i), buf in bufs.items():
        a = 1 - b
        assert int(np.frombuffer(buf[:4].tobytes(), np.int32)[0]) == rnd * 1000 + i, (b, rnd, i)
        assert (buf[4:] == (a * 97 + rnd * 31 + i) % 251).all(), (b, rnd, i)
    settle(p)
    big, small = sorted(p.workers, key=lambda w: w.uuid, reverse=True)
    mover = p.eps[p.workers.index(big)][p.workers.index(small)]
    assert mover._tep in mover.incoming and len(mover.incoming) == 1


class FakeConn:
    """A stand-in transport endpoint to drive the hold by hand."""

    duplex = True
    held = None
    owner_ep = None

    def __init__(self, iface):
        self.iface = iface

    def can_send(self):
        return True


def hold_setup(p: Pair):
    """(worker, its endpoint to the peer, the connection the peer moved to,
    the one it left) with the peer's WIREUP already seen on the old one."""
    w, peer = p.workers
    iface = next(i for i in w.ifaces if i.name == "tcp")
    new, old = FakeConn(iface), FakeConn(iface)
    w.recv_frame(old, wire.AmId.WIREUP, b"", peer.address_bytes)
    return w, old.owner_ep, new, old


def eager(w, conn, tag, data):
    w.recv_frame(conn, wire.AmId.TAG_EAGER, wire.EAGER.pack(tag), data)


def test_hold_until_the_old_connections_move(tcp_pair):
    w, ep, new, old = hold_setup(tcp_pair)
    bufs = [bytearray(5) for _ in range(3)]
    reqs = [w.tag_recv_nb(b, 4, source=ep.remote_id) for b in bufs]
    w.recv_frame(new, wire.AmId.WIREUP, wire.MOVED, tcp_pair.workers[1].address_bytes)
    eager(w, new, 4, b"third")              # read first, sent last
    assert new.held is not None and not any(r.done for r in reqs)
    eager(w, old, 4, b"first")
    eager(w, old, 4, b"secnd")
    assert reqs[0].done and not reqs[2].done
    w.recv_frame(old, wire.AmId.LANE_MOVE, b"", b"")
    assert new.held is None and all(r.done for r in reqs)
    assert [bytes(b) for b in bufs] == [b"first", b"secnd", b"third"]
    assert ep.incoming == {new}


def test_move_read_before_the_new_wireup_holds_nothing(tcp_pair):
    w, ep, new, old = hold_setup(tcp_pair)
    w.recv_frame(old, wire.AmId.LANE_MOVE, b"", b"")
    w.recv_frame(new, wire.AmId.WIREUP, wire.MOVED, tcp_pair.workers[1].address_bytes)
    assert new.held is None and not w._holding
    buf = bytearray(2)
    r = w.tag_recv_nb(buf, 4, source=ep.remote_id)
    eager(w, new, 4, b"ok")
    assert r.done and bytes(buf) == b"ok"


def held_late(p: Pair):
    """hold_setup, a receive posted, and a message held on the new
    connection: (worker, endpoint, new, old, the receive, its buffer)."""
    w, ep, new, old = hold_setup(p)
    buf = bytearray(4)
    r = w.tag_recv_nb(buf, 4, source=ep.remote_id)
    w.recv_frame(new, wire.AmId.WIREUP, wire.MOVED, p.workers[1].address_bytes)
    eager(w, new, 4, b"late")
    assert not r.done
    return w, ep, new, old, r, buf


def test_old_connection_dying_releases_the_held(tcp_pair):
    w, ep, new, old, r, buf = held_late(tcp_pair)
    w.conn_failed(old, ConnectionLost("gone"))
    assert r.done and bytes(buf) == b"late" and ep.failed is None


def test_a_move_that_never_completes_fails_the_endpoint(tcp_pair):
    w, ep, new, old, r, buf = held_late(tcp_pair)
    w._holding[ep] = (new, time.monotonic() - 1)         # its peer_timeout is over
    w.progress()
    assert isinstance(ep.failed, ConnectionLost) and "never delivered the move" in str(ep.failed)
    assert r.done and isinstance(r.exc, ConnectionLost) and new.held is None


def test_barriers_and_streams_across_processes():
    """Real ranks: every pair ends with one tcp connection, both ways."""
    prog = os.path.join(PROGS, "tcp_duplex.py")
    proc = run_job(["python", prog], 4, timeout=90, env={"UCXPY_TLS": "tcp"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count("DUPLEX OK") == 4, out[-3000:]


def test_a_side_that_cannot_reach_the_other_answers_on_its_connection(tcp_pair):
    """The mover's own connection never gets through its handshake (it
    reached something that never answers): what it queued there moves whole
    to the peer's connection (``hand_over``) once the peer's WIREUP arrives
    on it, and nothing waits for a LANE_MOVE."""
    import socket
    from ucxpy.transports import tcp as tcp_mod
    p = tcp_pair
    big, small = sorted(p.workers, key=lambda w: w.uuid, reverse=True)
    ib, i_s = p.workers.index(big), p.workers.index(small)
    iface = next(i for i in big.ifaces if i.name == "tcp")
    real_connect = iface.connect
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(4)              # the kernel completes the connect; nobody answers

    def unreachable(raddr):
        ips, port, nonce = tcp_mod.unpack_address(raddr)
        return real_connect(tcp_mod.pack_address(["127.0.0.1"], mute.getsockname()[1], nonce))
    iface.connect = unreachable
    first = np.arange(16, dtype=np.uint8)
    sent = p.eps[ib][i_s].tag_send_nb(first, 3)        # queued on a connection going nowhere
    drive(p.workers, lambda: True)
    stuck = p.eps[ib][i_s]._tep
    assert stuck._state in (tcp_mod.CONNECTING, tcp_mod.HANDSHAKE)
    got = np.zeros(16, np.uint8)
    r = small.tag_recv_nb(got, 3)
    wait_all(p.workers, [p.eps[i_s][ib].tag_send_nb(b"ping", 4)])
    wait_all(p.workers, [r, sent])
    assert (got == first).all()
    assert stuck._state == tcp_mod.CLOSED and not small._holding
    assert p.eps[ib][i_s]._tep in p.eps[ib][i_s].incoming
    buf = bytearray(4)
    r = small.tag_recv_nb(buf, 5)
    wait_all(p.workers, [p.eps[ib][i_s].tag_send_nb(b"more", 5), r])
    assert bytes(buf) == b"more" and p.eps[ib][i_s].failed is None
    mute.close()


def test_a_wireup_with_an_unknown_header_closes_the_connection(tcp_pair):
    w, peer = tcp_pair.workers
    iface = next(i for i in w.ifaces if i.name == "tcp")
    conn = FakeConn(iface)
    closed = []
    conn.close = lambda: closed.append(True)
    w.recv_frame(conn, wire.AmId.WIREUP, b"X", peer.address_bytes)
    assert closed and conn.owner_ep is None and not w._holding

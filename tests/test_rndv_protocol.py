"""The rendezvous protocol (ucxpy/rndv.py) in-process, without workers or
transports: the mutation suite of ucxpy.rndv.

Two :class:`RendezvousProtocol` objects, a sender's and a receiver's, are
wired through stand-in endpoints that queue the frames each side sends and
deliver them in order; one-sided get/put copy between buffers registered in
a small stand-in "memory".  Each scenario checks the bytes that landed, how
both requests completed, the frames on the wire and the trace calls, exactly.
"""
from __future__ import annotations

import collections
import itertools
from types import SimpleNamespace

import pytest

from ucxpy import wire
from ucxpy.errors import ConnectionLost, ProtocolError, RemoteAccessError
from ucxpy.rndv import RendezvousProtocol, RtsInfo, _Recv, SendState, rndv_variant
from ucxpy.transports.base import Caps
from ucxpy.wire import AmId

pytestmark = pytest.mark.timeout(60)

GET, PUT = Caps.GET_ZCOPY, Caps.PUT_ZCOPY


# -- rndv_variant ---------------------------------------------------------------------
def test_variant_without_one_sided_access_or_key_streams_frames():
    assert rndv_variant(0, 10 ** 6, 1000) == ("rtr", 0)
    assert rndv_variant(PUT, 10 ** 6, 1000) == ("rtr", 0)
    assert rndv_variant(GET | PUT, 10 ** 6, 1000, rkey=False) == ("rtr", 0)
    assert rndv_variant(GET, 10 ** 6, 1000, False) == ("rtr", 0)


def test_variant_get_and_split():
    assert rndv_variant(GET, 10 ** 6, 1000) == ("get", 0)
    assert rndv_variant(GET, 10 ** 6, 1000, True) == ("get", 0)
    assert rndv_variant(GET | PUT, 999, 1000) == ("get", 0)          # below the threshold
    assert rndv_variant(GET | PUT, 1000 * 8192, 8192) == ("split", 4096000)
    assert rndv_variant(GET | PUT, 8192, 8192) == ("split", 4096)    # at the threshold
    assert rndv_variant(GET | PUT, 8191, 0) == ("get", 0)            # half below a page
    assert rndv_variant(GET | PUT, 12287, 0) == ("split", 4096)      # half rounded down
    assert rndv_variant(GET | PUT, 16384, 0) == ("split", 8192)
    assert rndv_variant(GET | PUT | Caps(0), 20000, 20000) == ("split", 8192)
    for size in (8192, 8193, 10 ** 5, 3 * 4096 + 1, 2 ** 33 + 5):
        variant, at = rndv_variant(GET | PUT, size, 1)
        assert variant == "split" and at % 4096 == 0 and 0 < at <= size // 2 < at + 4096


def test_split_floor_is_where_the_variant_may_split():
    """``split_floor``: the size from which rndv_variant may split on a lane,
    NO_SPLIT where it never does; each interface of a worker carries its
    own (what the native rendezvous gets read below)."""
    from ucxpy.rndv import split_floor
    from ucxpy.transports.base import NO_SPLIT
    assert split_floor(GET | PUT, 1000) == 1000
    assert split_floor(GET, 1000) == split_floor(PUT, 1000) == split_floor(0, 1000) == NO_SPLIT
    for caps in (0, GET, PUT, GET | PUT):
        for size in (8192, 999_999, 10 ** 6, 2 ** 40):
            assert (rndv_variant(caps, size, 10 ** 6)[0] == "split") == \
                (size >= split_floor(caps, 10 ** 6))
    import ucxpy
    w = ucxpy.Worker(ucxpy.Context(ucxpy.Config.from_env({}, tls=("self", "shm", "tcp"),
                                                         rndv_split_thresh=300_000)))
    try:
        assert {i.name: i.split_floor for i in w.ifaces} == {
            i.name: split_floor(i.attrs.caps, 300_000) for i in w.ifaces}
        assert any(i.split_floor == 300_000 for i in w.ifaces)      # shm puts and gets
    finally:
        w.close()


# -- stand-ins ------------------------------------------------------------------------
class Tracer:
    """Records the trace calls; ``events`` None like a tracer without an event log."""

    def __init__(self, events=True):
        self.calls = []
        self.events = [] if events else None

    def rndv(self, name, lane, **args):
        self.calls.append(("rndv", name, lane, args))

    def rndv_done(self, **args):
        self.calls.append(("done", args))

    def count(self, key, nbytes, peer, lane):
        self.calls.append(("count", key, nbytes, peer, lane))

    def rndv_recv(self, rts, rreq_id, variant, nbytes):
        self.calls.append(("recv", rts.sreq_id, rreq_id, variant, nbytes))


class Req:
    def __init__(self):
        self.done = []

    def complete(self, result=None, exc=None):
        self.done.append((result, exc))


class Memory:
    """Registered buffers: address -> (view, key)."""

    def __init__(self):
        self.regions = {}
        self._next = itertools.count(1)

    def register(self, mv):
        addr = 0x10000 * next(self._next)
        key = b"key%d" % addr
        self.regions[addr] = (mv, key)
        return addr, key

    def lookup(self, addr, n, key):
        for base, (mv, k) in self.regions.items():
            if base <= addr and addr + n <= base + len(mv):
                assert k == key, "wrong key for the region"
                return mv[addr - base:addr - base + n]
        raise AssertionError(f"no region holds [{addr:#x}, +{n})")


class Net:
    """Both sides and the queue of frames and completions between them."""

    def __init__(self, caps=GET | PUT, max_frame=1000, split=1 << 30, tr=True, events=True,
                 immediate=True):
        self.caps, self.max_frame, self.immediate = caps, max_frame, immediate
        self.mem = Memory()
        self.queue = collections.deque()
        self.wire = []                     # (to, am id, header fields..., payload length)
        self.faults = set()
        self.str = Tracer(events) if tr else None
        self.rtr = Tracer(events) if tr else None
        cfg = SimpleNamespace(rndv_split_thresh=split)
        # (no data plane: dp None; the offer's stand-in lane takes it as given)
        self.S = RendezvousProtocol(SimpleNamespace(tr=self.str, config=cfg, dp=None))
        self.R = RendezvousProtocol(SimpleNamespace(tr=self.rtr, config=cfg, dp=None))
        self.sep = Ep(self, "R", remote_id=11)      # the sender's endpoint to the receiver
        self.rep = Ep(self, "S", remote_id=22)      # the receiver's endpoint to the sender
        self.step = Tep(self, "S", self.sep)        # the sender's lane
        self.rtep = Tep(self, "R", self.rep)        # the receiver's lane
        self.sep.tep = self.step
        self.rep.tep = self.rtep

    def later(self, fn, *args):
        self.queue.append((fn, args))

    def finish(self, cb, exc=None, op=None):
        """Complete a transport operation now (return True) or later
        (``immediate`` True/False, or a set of the operations that complete at once)."""
        now = self.immediate if isinstance(self.immediate, bool) else op in self.immediate
        if now and exc is None:
            return True
        self.later(cb, exc)
        return False

    def deliver(self, to, am_id, header, payload=b""):
        header, payload = bytes(header), bytes(payload)
        self.wire.append((to, AmId(am_id).name) + describe(am_id, header) +
                         ((len(payload),) if payload else ()))
        if to == "S":
            fn = {AmId.RNDV_RTR: self.S.on_rtr, AmId.RNDV_ATS: self.S.on_ats,
                  AmId.RNDV_RTP: self.S.on_rtp}[am_id]
            self.later(fn, self.step, header, payload)
        else:
            fn = {AmId.RNDV_DATA: self.R.on_data, AmId.RNDV_FIN: self.R.on_fin}[am_id]
            self.later(fn, self.rtep, header, payload)

    def pump(self):
        while self.queue:
            fn, args = self.queue.popleft()
            fn(*args)

    # a whole transfer
    def transfer(self, data, dest=None, sreq=None, rreq=None, result="ok"):
        mv = memoryview(bytearray(data))
        self.sreq, self.rreq = sreq or Req(), rreq or Req()
        self.dest = dest if dest is not None else bytearray(len(data))
        sreq_id, raddr, rkey = self.S.post_send(self.sep, self.step, mv, self.sreq)
        self.rts = RtsInfo(self.rtep, sreq_id, len(data), raddr, rkey)
        self.R.start_recv(self.rts, memoryview(self.dest), self.rreq, result)
        self.pump()
        return self


def describe(am_id, header):
    if am_id == AmId.RNDV_RTR:
        return wire.RTR.unpack(header)
    if am_id == AmId.RNDV_ATS:
        return wire.ATS.unpack(header)
    if am_id == AmId.RNDV_RTP:
        return wire.RTP.unpack(header[:wire.RTP.size]) + (header[wire.RTP.size:],)
    if am_id == AmId.RNDV_FIN:
        return wire.FIN.unpack(header)
    return wire.DATA.unpack(header)


class Ep:
    def __init__(self, net, to, remote_id):
        self.net, self.to, self.remote_id = net, to, remote_id

    def send_frame(self, am_id, header):
        if f"lost:{self.to}:{AmId(am_id).name}" in self.net.faults:
            raise ConnectionLost("peer gone")
        self.net.deliver(self.to, am_id, header)

    def transport_endpoint(self):
        return self.tep


class Tep:
    def __init__(self, net, side, owner_ep):
        self.net, self.side, self.owner_ep = net, side, owner_ep
        self.iface = SimpleNamespace(name="lane" + side,
                                     attrs=SimpleNamespace(caps=net.caps,
                                                           max_frame=net.max_frame))

    def pack_local_key(self, mv):
        return self.net.mem.register(mv)

    def send(self, am_id, header, payload, on_complete):
        net = self.net
        net.deliver("R", am_id, header, payload)
        if "fail_send" in net.faults:
            return net.finish(on_complete, ConnectionLost("frame lost"))
        return net.finish(on_complete, op="send")

    def get(self, dest, raddr, rkey, on_complete):
        net = self.net
        if "refuse_get" in net.faults:
            raise RemoteAccessError("get refused")
        if "fail_get" in net.faults:
            net.later(on_complete, RemoteAccessError("get failed"))
            return False
        if "break_get" in net.faults:
            net.later(on_complete, ConnectionLost("gone"))
            return False
        dest[:] = net.mem.lookup(raddr, len(dest), rkey)
        return net.finish(on_complete, op="get")

    def put(self, part, raddr, rkey, on_complete):
        net = self.net
        if "refuse_put" in net.faults:
            raise RemoteAccessError("put refused")
        if "crash_put" in net.faults:
            raise OSError("provider error")
        if "fail_put" in net.faults:
            net.later(on_complete, RemoteAccessError("put failed"))
            return False
        net.mem.lookup(raddr, len(part), rkey)[:] = part
        return net.finish(on_complete, op="put")


def payload(n):
    return bytes((7 * i + 3) % 251 for i in range(n))


def assert_done(net, data, result="ok"):
    assert bytes(net.dest[:len(data)]) == data
    assert net.rreq.done == [(result, None)]
    assert net.sreq.done == [(None, None)]
    assert net.S.sends == {} and net.R.recvs == {}


# -- whole transfers --------------------------------------------------------------------
@pytest.mark.parametrize("immediate", [True, False])
def test_get(immediate):
    data = payload(3000)
    net = Net(caps=GET | PUT, immediate=immediate).transfer(data)
    assert_done(net, data)
    assert net.wire == [("S", "RNDV_ATS", 1, wire.ATS_OK)]
    assert net.rtr.calls == [("recv", 1, 1, "get", 3000),
                             ("rndv", "get", "laneR", dict(rreq_id=1, offset=0, size=3000)),
                             ("done", dict(rreq_id=1))]
    assert net.str.calls == [("rndv", "ats", "laneS", dict(sreq_id=1, status=0)),
                             ("done", dict(sreq_id=1))]


@pytest.mark.parametrize("immediate", [True, False])
def test_rtr_streams_frames(immediate):
    data = payload(2500)
    net = Net(caps=0, max_frame=1000, immediate=immediate).transfer(data)
    assert_done(net, data)
    assert net.wire == [("S", "RNDV_RTR", 1, 1, 0, 2500),
                        ("R", "RNDV_DATA", 1, 0, 1000), ("R", "RNDV_DATA", 1, 1000, 1000),
                        ("R", "RNDV_DATA", 1, 2000, 500)]
    assert net.rtr.calls == [
        ("recv", 1, 1, "rtr", 2500),
        ("rndv", "data_in", "laneR", dict(rreq_id=1, offset=0, size=1000)),
        ("rndv", "data_in", "laneR", dict(rreq_id=1, offset=1000, size=1000)),
        ("rndv", "data_in", "laneR", dict(rreq_id=1, offset=2000, size=500)),
        ("done", dict(rreq_id=1))]
    assert net.str.calls == [
        ("rndv", "rtr", "laneS", dict(sreq_id=1, offset=0, length=2500)),
        ("count", "rndv.data_tx", 2500, 11, "laneS"),
        ("rndv", "data", "laneS", dict(sreq_id=1, offset=0, size=1000)),
        ("rndv", "data", "laneS", dict(sreq_id=1, offset=1000, size=1000)),
        ("rndv", "data", "laneS", dict(sreq_id=1, offset=2000, size=500)),
        ("done", dict(sreq_id=1))]


def test_frames_of_an_exact_multiple_and_of_one_byte():
    data = payload(2000)
    net = Net(caps=0, max_frame=1000).transfer(data)
    assert_done(net, data)
    assert [w[2:] for w in net.wire[1:]] == [(1, 0, 1000), (1, 1000, 1000)]
    net = Net(caps=0, max_frame=1000).transfer(b"z")
    assert_done(net, b"z")
    assert net.wire == [("S", "RNDV_RTR", 1, 1, 0, 1), ("R", "RNDV_DATA", 1, 0, 1)]


def test_without_events_no_per_frame_trace():
    data = payload(1500)
    net = Net(caps=0, events=False).transfer(data)
    assert_done(net, data)
    assert net.rtr.calls == [("recv", 1, 1, "rtr", 1500), ("done", dict(rreq_id=1))]
    assert net.str.calls == [
        ("rndv", "rtr", "laneS", dict(sreq_id=1, offset=0, length=1500)),
        ("count", "rndv.data_tx", 1500, 11, "laneS"), ("done", dict(sreq_id=1))]


def test_data_in_is_traced_with_events():
    net = Net(caps=0, max_frame=1000)
    net.R.recvs[5] = _Recv(memoryview(bytearray(10)), 10, Req(), "r", net.rep)
    net.R.on_data(net.rtep, wire.DATA.pack(5, 2), b"abc")
    assert net.rtr.calls == [("rndv", "data_in", "laneR", dict(rreq_id=5, offset=2, size=3))]


@pytest.mark.parametrize("immediate", [True, False])
def test_split(immediate):
    data = payload(3 * 4096 + 100)
    net = Net(caps=GET | PUT, split=8192, immediate=immediate).transfer(data)
    assert_done(net, data)
    at = 4096
    (to, kind, sid, rid, length, laddr, lkey), *rest = net.wire
    assert (to, kind, sid, rid, length) == ("S", "RNDV_RTP", 1, 1, at)
    assert lkey == net.mem.regions[laddr][1] and len(net.mem.regions[laddr][0]) == at
    if immediate:       # the receiver's get completes at once, before the sender sees RTP
        assert rest == [("S", "RNDV_ATS", 1, 0), ("R", "RNDV_FIN", 1, at)]
    else:
        assert sorted(rest) == [("R", "RNDV_FIN", 1, at), ("S", "RNDV_ATS", 1, 0)]
    assert net.rtr.calls[:2] == [
        ("recv", 1, 1, "split", len(data)),
        ("rndv", "get", "laneR", dict(rreq_id=1, offset=at, size=len(data) - at))]
    assert sorted(map(repr, net.rtr.calls[2:])) == sorted(map(repr, [
        ("rndv", "fin", "laneR", dict(rreq_id=1, size=at)), ("done", dict(rreq_id=1))]))
    assert net.rtr.calls[-1] == ("done", dict(rreq_id=1))
    assert ("rndv", "rtp", "laneS", dict(sreq_id=1, length=at)) in net.str.calls
    assert ("rndv", "put", "laneS", dict(sreq_id=1, size=at)) in net.str.calls
    assert ("rndv", "ats", "laneS", dict(sreq_id=1, status=0)) in net.str.calls
    assert net.str.calls[-1] == ("done", dict(sreq_id=1)) and len(net.str.calls) == 4
    assert net.R.recvs == {} and net.S.sends == {}


def test_split_receiver_completes_only_with_both_parts():
    data = payload(20000)
    net = Net(caps=GET | PUT, split=8192, immediate=False)
    mv = memoryview(bytearray(data))
    net.sreq, net.rreq, net.dest = Req(), Req(), bytearray(len(data))
    sid, raddr, rkey = net.S.post_send(net.sep, net.step, mv, net.sreq)
    net.R.start_recv(RtsInfo(net.rtep, sid, len(data), raddr, rkey), memoryview(net.dest),
                     net.rreq, "ok")
    r = net.R.recvs[1]
    assert bytes(r.exposed) == bytes(8192) and len(r.exposed) == 8192
    # run the get only (the RTP frame waits): not done yet
    while net.queue and net.queue[0][0] != net.S.on_rtp:
        fn, args = net.queue.popleft()
        fn(*args)
    fn, args = net.queue.popleft()          # the RTP
    assert fn == net.S.on_rtp
    fn2, args2 = net.queue.popleft()        # the get's completion
    fn2(*args2)
    assert net.rreq.done == [] and r.received == 20000 - 8192
    fn(*args)
    net.pump()
    assert_done(net, data)


def test_zero_bytes_acks_at_once():
    net = Net(caps=GET | PUT)
    sreq, rreq = Req(), Req()
    sid, raddr, rkey = net.S.post_send(net.sep, net.step, memoryview(b""), sreq)
    assert (sid, raddr, rkey) == (1, 0, b"")                  # no key for an empty buffer
    net.R.start_recv(RtsInfo(net.rtep, sid, 0, 0, b""), memoryview(bytearray(4)), rreq, "r")
    assert rreq.done == [("r", None)] and net.R.recvs == {}
    assert net.wire == [("S", "RNDV_ATS", 1, wire.ATS_OK)]
    net.pump()
    assert sreq.done == [(None, None)] and net.S.sends == {}


def test_post_send_offers_a_key_only_with_get():
    net = Net(caps=PUT)
    assert net.S.post_send(net.sep, net.step, memoryview(b"abc"), Req()) == (1, 0, b"")
    net = Net(caps=GET)
    sid, raddr, rkey = net.S.post_send(net.sep, net.step, memoryview(b"abc"), Req())
    assert (sid, raddr, rkey) == (1, 0x10000, b"key65536")
    s = net.S.sends[1]
    assert (s.ep, bytes(s.mv), s.reading, s.busy) == (net.sep, b"abc", True, 0)
    assert net.S.post_send(net.sep, net.step, memoryview(b"d"), Req())[0] == 2


def test_ids_are_shared_by_sends_and_receives():
    net = Net(caps=0)
    data = payload(10)
    net.transfer(data)
    net.transfer(data)
    assert [w[2:4] for w in net.wire if w[1] == "RNDV_RTR"] == [(1, 1), (2, 2)]
    # one counter per protocol for both directions
    assert net.R.post_send(net.rep, net.rtep, memoryview(b"x"), Req())[0] == 3
    assert net.S.post_send(net.sep, net.step, memoryview(b"x"), Req())[0] == 3


def test_larger_receive_buffer_is_cut_to_the_message():
    data = payload(100)
    net = Net(caps=0).transfer(data, dest=bytearray(b"\xee" * 150))
    assert_done(net, data)
    assert net.dest[100:] == b"\xee" * 50
    net = Net(caps=GET).transfer(data, dest=bytearray(b"\xee" * 150))
    assert_done(net, data)
    assert net.dest[100:] == b"\xee" * 50


def test_no_tracer():
    for caps in (0, GET, GET | PUT):
        data = payload(9000)
        net = Net(caps=caps, split=8192, tr=False).transfer(data)
        assert_done(net, data)
    for fault in ("refuse_get", "fail_get", "refuse_put"):
        net = Net(caps=GET | PUT, split=8192, tr=False)
        net.faults.add(fault)
        net.transfer(payload(9000))
        assert_done(net, payload(9000))


# -- falling back to frames -----------------------------------------------------------------
def test_refused_get_asks_for_frames():
    data = payload(1200)
    net = Net(caps=GET)
    net.faults.add("refuse_get")
    net.transfer(data)
    assert_done(net, data)
    assert net.wire == [("S", "RNDV_RTR", 1, 1, 0, 1200),
                        ("R", "RNDV_DATA", 1, 0, 1000), ("R", "RNDV_DATA", 1, 1000, 200)]
    assert net.rtr.calls == [
        ("recv", 1, 1, "get", 1200),
        ("rndv", "get", "laneR", dict(rreq_id=1, offset=0, size=1200)),
        ("rndv", "fallback", "laneR", dict(rreq_id=1, part="get")),
        ("rndv", "data_in", "laneR", dict(rreq_id=1, offset=0, size=1000)),
        ("rndv", "data_in", "laneR", dict(rreq_id=1, offset=1000, size=200)),
        ("done", dict(rreq_id=1))]


def test_failed_get_asks_for_frames():
    data = payload(1200)
    net = Net(caps=GET)
    net.faults.add("fail_get")
    net.transfer(data)
    assert_done(net, data)
    assert net.wire[0] == ("S", "RNDV_RTR", 1, 1, 0, 1200)
    assert net.rtr.calls[:3] == [
        ("recv", 1, 1, "get", 1200),
        ("rndv", "get", "laneR", dict(rreq_id=1, offset=0, size=1200)),
        ("rndv", "fallback", "laneR", dict(rreq_id=1, part="get"))]


def test_failed_get_of_a_receive_already_gone_only_tells_the_sender():
    net = Net(caps=GET)
    net.faults.add("fail_get")
    data = payload(100)
    mv = memoryview(bytearray(data))
    sreq, rreq = Req(), Req()
    sid, raddr, rkey = net.S.post_send(net.sep, net.step, mv, sreq)
    net.R.start_recv(RtsInfo(net.rtep, sid, 100, raddr, rkey), memoryview(bytearray(100)),
                     rreq, "ok")
    net.R.fail_peer(net.rep, ConnectionLost("x"))
    net.pump()
    # no frames asked for: ATS(ERROR) lets the sender go; the receive stays failed once
    assert net.wire == [("S", "RNDV_ATS", 1, wire.ATS_ERROR)]
    assert len(rreq.done) == 1 and isinstance(rreq.done[0][1], ConnectionLost)
    assert ("rndv", "fallback", "laneR", dict(rreq_id=1, part="get")) not in net.rtr.calls


def test_broken_get_fails_the_receive_and_tells_the_sender():
    net = Net(caps=GET)
    net.faults.add("break_get")
    net.transfer(payload(100))
    (res, exc), = net.rreq.done
    assert res is None and isinstance(exc, ConnectionLost)
    assert net.wire == [("S", "RNDV_ATS", 1, wire.ATS_ERROR)]
    (res, exc), = net.sreq.done
    assert isinstance(exc, ConnectionLost) and exc.peer == 11
    assert str(exc) == "receiver failed to read the message"
    assert net.S.sends == {} and net.R.recvs == {}


def test_split_with_refused_get_streams_the_rest():
    data = payload(9000)
    net = Net(caps=GET | PUT, split=8192)
    net.faults.add("refuse_get")
    net.transfer(data)
    assert_done(net, data)
    kinds = [(w[0], w[1]) + w[2:5] for w in net.wire]
    assert kinds[:2] == [("S", "RNDV_RTP", 1, 1, 4096), ("S", "RNDV_RTR", 1, 1, 4096)]
    assert net.wire[1] == ("S", "RNDV_RTR", 1, 1, 4096, 9000 - 4096)
    assert ("rndv", "fallback", "laneR", dict(rreq_id=1, part="get")) in net.rtr.calls


def test_refused_put_streams_the_part():
    data = payload(9000)
    net = Net(caps=GET | PUT, split=8192, max_frame=4000)
    net.faults.add("refuse_put")
    net.transfer(data)
    assert_done(net, data)
    assert [w for w in net.wire if w[1] == "RNDV_DATA"] == [
        ("R", "RNDV_DATA", 1, 0, 4000), ("R", "RNDV_DATA", 1, 4000, 96)]
    assert not [w for w in net.wire if w[1] == "RNDV_FIN"]
    assert ("rndv", "fallback", "laneS", dict(sreq_id=1, part="put")) in net.str.calls
    assert ("count", "rndv.data_tx", 4096, 11, "laneS") in net.str.calls


def test_failed_put_fails_the_send():
    data = payload(9000)
    net = Net(caps=GET | PUT, split=8192)
    net.faults.add("fail_put")
    net.transfer(data)
    (res, exc), = net.sreq.done
    assert isinstance(exc, RemoteAccessError) and net.S.sends == {}
    assert not [w for w in net.wire if w[1] == "RNDV_FIN"]
    assert net.rreq.done == [] and 1 in net.R.recvs     # the receiver waits for its peer


def test_crashing_put_fails_the_send():
    net = Net(caps=GET | PUT, split=8192)
    net.faults.add("crash_put")
    net.transfer(payload(9000))
    (res, exc), = net.sreq.done
    assert isinstance(exc, OSError) and str(exc) == "provider error"
    assert net.S.sends == {}
    assert net.str.calls[-1] == ("done", dict(sreq_id=1))


def test_rtp_on_a_lane_without_put_streams_frames():
    net = Net(caps=GET, max_frame=5000)
    mv = memoryview(bytearray(payload(9000)))
    sreq = Req()
    net.S.post_send(net.sep, net.step, mv, sreq)
    net.R.recvs[1] = _Recv(memoryview(bytearray(9000)), 9000, Req(), "ok", net.rep)
    net.S.on_rtp(net.step, wire.RTP.pack(1, 1, 4096, 0x999) + b"k", b"")
    assert net.wire == [("R", "RNDV_DATA", 1, 0, 4096)]
    assert net.str.calls == [("rndv", "rtp", "laneS", dict(sreq_id=1, length=4096)),
                             ("count", "rndv.data_tx", 4096, 11, "laneS"),
                             ("rndv", "data", "laneS", dict(sreq_id=1, offset=0, size=4096))]
    assert sreq.done == [] and net.S.sends[1].busy == 0 and net.S.sends[1].reading


# -- the sender's bookkeeping ------------------------------------------------------------
def test_sender_completes_after_ats_and_its_own_part():
    net = Net(caps=GET | PUT, immediate=False)
    sreq = Req()
    net.S.post_send(net.sep, net.step, memoryview(bytearray(payload(5000))), sreq)
    net.R.recvs[1] = _Recv(memoryview(bytearray(5000)), 5000, Req(), "ok", net.rep)
    net.mem.register(net.R.recvs[1].dest)
    net.S.on_rtp(net.step, wire.RTP.pack(1, 1, 3000, 0x20000) + b"key131072", b"")
    s = net.S.sends[1]
    assert s.busy == 1 and s.reading
    net.S.on_ats(net.step, wire.ATS.pack(1, wire.ATS_OK), b"")
    assert not s.reading and sreq.done == [] and 1 in net.S.sends     # its put is out
    fn, args = net.queue.popleft()                                    # put completes
    fn(*args)
    assert sreq.done == [(None, None)] and net.S.sends == {}
    assert net.wire == [("R", "RNDV_FIN", 1, 3000)]


def test_sender_completes_when_the_last_frame_is_out():
    net = Net(caps=0, max_frame=10, immediate=False)
    sreq = Req()
    net.S.post_send(net.sep, net.step, memoryview(bytearray(payload(25))), sreq)
    net.R.recvs[1] = _Recv(memoryview(bytearray(25)), 25, Req(), "ok", net.rep)
    net.S.on_rtr(net.step, wire.RTR.pack(1, 1, 0, 25), b"")
    s = net.S.sends[1]
    assert s.busy == 3 and not s.reading and sreq.done == []
    callbacks = [q for q in net.queue if q[0] != net.R.on_data]
    for k, (fn, args) in enumerate(callbacks):
        fn(*args)
        assert s.busy == 2 - k
        assert sreq.done == ([] if k < 2 else [(None, None)])


def test_failed_frame_fails_the_send_once():
    net = Net(caps=0, max_frame=10, immediate=False)
    sreq = Req()
    net.S.post_send(net.sep, net.step, memoryview(bytearray(payload(25))), sreq)
    net.S.on_rtr(net.step, wire.RTR.pack(1, 1, 0, 25), b"")
    s = net.S.sends[1]
    err = ConnectionLost("frame lost")
    net.S._part_done(1, s, err)
    assert sreq.done == [(None, err)] and net.S.sends == {}
    net.S._part_done(1, s, None)
    net.S._part_done(1, s, ConnectionLost("again"))
    assert sreq.done == [(None, err)]
    assert net.str.calls.count(("done", dict(sreq_id=1))) == 1


def test_rtr_of_part_of_the_send():
    net = Net(caps=0, max_frame=100)
    sreq = Req()
    net.S.post_send(net.sep, net.step, memoryview(bytearray(payload(300))), sreq)
    net.S.on_rtr(net.step, wire.RTR.pack(1, 9, 120, 180), b"")
    assert net.wire == [("R", "RNDV_DATA", 9, 120, 100), ("R", "RNDV_DATA", 9, 220, 80)]
    assert sreq.done == [(None, None)]


@pytest.mark.parametrize("off,length", [(0, 301), (300, 1), (200, 101)])
def test_rtr_beyond_the_send_is_a_protocol_error(off, length):
    net = Net(caps=0)
    net.S.post_send(net.sep, net.step, memoryview(bytearray(300)), Req())
    with pytest.raises(ProtocolError, match=rf"\[{off}, {off + length}\) of a 300-byte"):
        net.S.on_rtr(net.step, wire.RTR.pack(1, 1, off, length), b"")
    net.S.on_rtr(net.step, wire.RTR.pack(1, 1, off, 300 - off), b"")   # up to the end: fine
    assert sum(w[4] for w in net.wire if w[1] == "RNDV_DATA") == 300 - off


def test_rtp_beyond_the_send_is_a_protocol_error():
    net = Net(caps=GET | PUT)
    net.S.post_send(net.sep, net.step, memoryview(bytearray(300)), Req())
    with pytest.raises(ProtocolError, match="RTP asks for 301 bytes of a 300-byte send"):
        net.S.on_rtp(net.step, wire.RTP.pack(1, 1, 301, 0) + b"k", b"")
    dest = bytearray(300)
    addr, key = net.mem.register(memoryview(dest))
    net.S.on_rtp(net.step, wire.RTP.pack(1, 1, 300, addr) + key, b"")
    assert net.wire == [("R", "RNDV_FIN", 1, 300)]


def test_replies_for_unknown_sends_are_dropped():
    net = Net(caps=GET | PUT)
    net.S.on_rtr(net.step, wire.RTR.pack(7, 1, 0, 10), b"")
    net.S.on_rtp(net.step, wire.RTP.pack(7, 1, 10, 0), b"")
    net.S.on_ats(net.step, wire.ATS.pack(7, wire.ATS_OK), b"")
    assert net.wire == [] and net.str.calls == [] and net.S._send_of(7) is None


@pytest.mark.parametrize("status", [wire.ATS_OK, wire.ATS_DROPPED])
def test_ats_completes_the_send(status):
    net = Net(caps=GET)
    sreq = Req()
    net.S.post_send(net.sep, net.step, memoryview(b"abc"), sreq)
    net.S.on_ats(net.step, wire.ATS.pack(1, status), b"")
    assert sreq.done == [(None, None)] and net.S.sends == {}
    assert net.str.calls == [("rndv", "ats", "laneS", dict(sreq_id=1, status=status)),
                             ("done", dict(sreq_id=1))]


def test_settle_waits_for_reading_and_busy():
    net = Net(caps=GET)
    sreq = Req()
    net.S.post_send(net.sep, net.step, memoryview(b"abc"), sreq)
    s = net.S.sends[1]
    net.S._settle(1, s)
    assert sreq.done == []
    s.reading, s.busy = False, 1
    net.S._settle(1, s)
    assert sreq.done == []
    s.busy = 0
    net.S._settle(1, s)
    assert sreq.done == [(None, None)]


# -- the receiver's bookkeeping -----------------------------------------------------------
def test_drop_answers_ats_dropped():
    net = Net(caps=GET)
    sreq = Req()
    sid, raddr, rkey = net.S.post_send(net.sep, net.step, memoryview(b"abcdef"), sreq)
    net.R.drop(RtsInfo(net.rtep, sid, 6, raddr, rkey))
    assert net.wire == [("S", "RNDV_ATS", 1, wire.ATS_DROPPED)]
    net.pump()
    assert sreq.done == [(None, None)]


def test_ack_to_a_vanished_sender_is_ignored():
    net = Net(caps=GET)
    net.faults.add("lost:S:RNDV_ATS")
    RendezvousProtocol._ack(net.rep, 1, wire.ATS_OK)
    assert net.wire == []
    rreq = Req()
    net.R.start_recv(RtsInfo(net.rtep, 1, 0, 0, b""), memoryview(bytearray(1)), rreq, "r")
    assert rreq.done == [("r", None)]


def test_rtr_to_a_vanished_sender_fails_the_receive():
    net = Net(caps=0)
    net.faults.add("lost:S:RNDV_RTR")
    rreq = Req()
    net.R.start_recv(RtsInfo(net.rtep, 4, 10, 0, b""), memoryview(bytearray(10)), rreq, "r")
    (res, exc), = rreq.done
    assert isinstance(exc, ConnectionLost) and net.R.recvs == {}
    assert net.wire == []


def test_rtp_to_a_vanished_sender_fails_the_receive_with_ats_error():
    net = Net(caps=GET | PUT, split=8192)
    net.faults.add("lost:S:RNDV_RTP")
    rreq = Req()
    net.R.start_recv(RtsInfo(net.rtep, 4, 9000, 0x10000, b"key65536"),
                     memoryview(bytearray(9000)), rreq, "r")
    (res, exc), = rreq.done
    assert isinstance(exc, ConnectionLost) and net.R.recvs == {}
    assert net.wire == [("S", "RNDV_ATS", 4, wire.ATS_ERROR)]


def test_fin_and_data_checks():
    net = Net(caps=0)
    rreq = Req()
    r = net.R.recvs[3] = _Recv(memoryview(bytearray(10)), 10, rreq, "res", net.rep)
    with pytest.raises(ProtocolError, match="FIN of 11 bytes for unknown or smaller receive 3"):
        net.R.on_fin(net.rtep, wire.FIN.pack(3, 11), b"")
    with pytest.raises(ProtocolError, match="FIN of 1 bytes for unknown or smaller receive 4"):
        net.R.on_fin(net.rtep, wire.FIN.pack(4, 1), b"")
    with pytest.raises(ProtocolError, match=r"fragment \[8, 11\) for unknown or smaller "
                                            r"receive 3"):
        net.R.on_data(net.rtep, wire.DATA.pack(3, 8), b"abc")
    with pytest.raises(ProtocolError, match=r"fragment \[0, 1\) for unknown or smaller "
                                            r"receive 9"):
        net.R.on_data(net.rtep, wire.DATA.pack(9, 0), b"a")
    net.R.on_data(net.rtep, wire.DATA.pack(3, 7), b"abc")          # up to the end exactly
    assert bytes(r.dest) == bytes(7) + b"abc" and r.received == 3
    net.R.on_fin(net.rtep, wire.FIN.pack(3, 7), b"")               # the rest, exactly
    assert rreq.done == [("res", None)] and net.R.recvs == {}
    assert net.rtr.calls == [("rndv", "data_in", "laneR", dict(rreq_id=3, offset=7, size=3)),
                             ("rndv", "fin", "laneR", dict(rreq_id=3, size=7)),
                             ("done", dict(rreq_id=3))]


def test_fin_after_some_bytes():
    net = Net(caps=0)
    r = net.R.recvs[3] = _Recv(memoryview(bytearray(10)), 10, Req(), "res", net.rep)
    r.received = 4
    with pytest.raises(ProtocolError):
        net.R.on_fin(net.rtep, wire.FIN.pack(3, 7), b"")
    net.R.on_fin(net.rtep, wire.FIN.pack(3, 6), b"")
    assert r.req.done == [("res", None)]


def test_landed_completes_once_at_the_exact_size():
    net = Net(caps=0)
    rreq = Req()
    r = net.R.recvs[2] = _Recv(memoryview(bytearray(10)), 10, rreq, "res", net.rep)
    net.R._landed(2, r, 9)
    assert rreq.done == [] and r.received == 9
    net.R._landed(2, r, 1)
    assert rreq.done == [("res", None)]
    net.R._landed(2, r, 0)
    assert rreq.done == [("res", None)] and net.rtr.calls == [("done", dict(rreq_id=2))]


def test_data_dest():
    net = Net(caps=0)
    dest = memoryview(bytearray(10))
    net.R.recvs[3] = _Recv(dest, 10, Req(), "res", net.rep)
    d = net.R.data_dest(wire.DATA.pack(3, 4), 6)
    assert d.obj is dest.obj and len(d) == 6
    d[:] = b"UVWXYZ"
    assert bytes(dest) == bytes(4) + b"UVWXYZ"
    assert net.R.data_dest(wire.DATA.pack(3, 4), 7) is None
    assert net.R.data_dest(wire.DATA.pack(3, 0), 10) is not None
    assert net.R.data_dest(wire.DATA.pack(5, 0), 1) is None


def test_data_received_in_place_is_not_copied_again():
    net = Net(caps=0)
    dest = memoryview(bytearray(10))
    r = net.R.recvs[3] = _Recv(dest, 10, Req(), "res", net.rep)
    view = net.R.data_dest(wire.DATA.pack(3, 0), 10)
    view[:] = b"0123456789"
    net.R.on_data(net.rtep, wire.DATA.pack(3, 0), view)
    assert bytes(dest) == b"0123456789" and r.req.done == [("res", None)]
    # a memoryview of another buffer is copied
    r = net.R.recvs[4] = _Recv(memoryview(bytearray(3)), 3, Req(), "res", net.rep)
    net.R.on_data(net.rtep, wire.DATA.pack(4, 0), memoryview(b"xyz"))
    assert bytes(r.dest) == b"xyz"


def test_in_place_check_skips_the_copy():
    net = Net(caps=0)
    buf = bytearray(6)
    dest = memoryview(buf)
    r = net.R.recvs[3] = _Recv(dest, 6, Req(), "res", net.rep)

    class NoWrite:
        """A dest whose slice assignment would be noticed."""
        obj = buf

        def __getitem__(self, k):
            return dest[k]

        def __setitem__(self, k, v):
            raise AssertionError("copied a fragment already in place")
    r.dest = NoWrite()
    net.R.on_data(net.rtep, wire.DATA.pack(3, 0), memoryview(buf)[0:6])
    assert r.req.done == [("res", None)]


def test_fail_peer_completes_only_that_peers_transfers():
    net = Net(caps=GET)
    other = Ep(net, "R", remote_id=99)
    s1, s2, r1, r2 = Req(), Req(), Req(), Req()
    net.S.post_send(net.sep, net.step, memoryview(b"a"), s1)
    net.S.post_send(other, net.step, memoryview(b"b"), s2)
    net.R.recvs[10] = _Recv(memoryview(bytearray(1)), 1, r1, "x", net.rep)
    net.R.recvs[11] = _Recv(memoryview(bytearray(1)), 1, r2, "y", other)
    err = ConnectionLost("down")
    net.S.fail_peer(net.sep, err)
    net.R.fail_peer(net.rep, err)
    assert s1.done == [(None, err)] and r1.done == [(None, err)]
    assert s2.done == [] and r2.done == []
    assert list(net.S.sends) == [2] and list(net.R.recvs) == [11]
    net.R._fail_recv(10, err)
    assert r1.done == [(None, err)]
    net.R._fail_recv(11, err)
    assert r2.done == [(None, err)] and net.R.recvs == {}


def test_state_objects():
    s = SendState("ep", "mv", "req")
    assert (s.ep, s.mv, s.req, s.reading, s.busy) == ("ep", "mv", "req", True, 0)
    r = _Recv("dest", 5, "req", "res", "ep")
    assert (r.dest, r.size, r.received, r.req, r.result, r.ep, r.exposed) == \
        ("dest", 5, 0, "req", "res", "ep", None)
    i = RtsInfo("tep", 1, 2, 3, b"k")
    assert (i.tep, i.sreq_id, i.size, i.raddr, i.rkey) == ("tep", 1, 2, 3, b"k")
    p = RendezvousProtocol("w")
    assert (p.worker, p.sends, p.recvs, next(p._ids)) == ("w", {}, {}, 1)


def run_until(net, name):
    """Run queued work up to (not including) the first callback called ``name``;
    returns that callback, taken out of the queue."""
    held = None
    while net.queue:
        fn, args = net.queue.popleft()
        if held is None and getattr(fn, "__name__", "") == name:
            held = (fn, args)
            continue
        fn(*args)
    return held


@pytest.mark.parametrize("immediate", [False, {"send"}])
def test_split_send_waits_for_its_put_and_its_frames(immediate):
    """RTP (put in flight) and then RTR for the rest (the receiver's get was
    refused): the send completes only when the put is done too."""
    data = payload(9000)
    net = Net(caps=GET | PUT, split=8192, max_frame=1000, immediate=immediate)
    net.faults.add("refuse_get")
    mv = memoryview(bytearray(data))
    net.sreq, net.rreq, net.dest = Req(), Req(), bytearray(len(data))
    sid, raddr, rkey = net.S.post_send(net.sep, net.step, mv, net.sreq)
    net.R.start_recv(RtsInfo(net.rtep, sid, len(data), raddr, rkey), memoryview(net.dest),
                     net.rreq, "ok")
    put = run_until(net, "put_done")
    assert put is not None
    assert net.sreq.done == [] and net.S.sends[1].busy == 1 and not net.S.sends[1].reading
    assert net.rreq.done == [] and net.R.recvs[1].received == 9000 - 4096
    put[0](*put[1])
    net.pump()
    assert_done(net, data)


def test_rtr_before_rtp_still_counts_both_parts():
    """Handlers driven in the other order (frames in flight on the sender):
    the put's part adds to what is outstanding."""
    net = Net(caps=GET | PUT, max_frame=1000, immediate=False)
    sreq = Req()
    net.S.post_send(net.sep, net.step, memoryview(bytearray(payload(9000))), sreq)
    dest = bytearray(9000)
    addr, key = net.mem.register(memoryview(dest))
    net.R.recvs[1] = _Recv(memoryview(dest), 9000, Req(), "ok", net.rep)
    net.S.on_rtr(net.step, wire.RTR.pack(1, 1, 4096, 9000 - 4096), b"")
    assert net.S.sends[1].busy == 5
    net.S.on_rtp(net.step, wire.RTP.pack(1, 1, 4096, addr) + key, b"")
    assert net.S.sends[1].busy == 6
    put = run_until(net, "put_done")
    assert sreq.done == [] and net.S.sends[1].busy == 1
    put[0](*put[1])
    assert sreq.done == [(None, None)]


def test_failed_frame_send_fails_the_send():
    net = Net(caps=0, max_frame=1000)
    net.faults.add("fail_send")
    net.transfer(payload(1500))
    (res, exc), = net.sreq.done
    assert isinstance(exc, ConnectionLost) and str(exc) == "frame lost"
    assert net.S.sends == {}
    assert net.str.calls.count(("done", dict(sreq_id=1))) == 1


def test_receiver_uses_its_split_threshold():
    data = payload(20000)
    net = Net(caps=GET | PUT, split=30000).transfer(data)
    assert_done(net, data)
    assert net.wire == [("S", "RNDV_ATS", 1, wire.ATS_OK)]          # get, not split
    net = Net(caps=GET | PUT, split=20000).transfer(data)
    assert_done(net, data)
    assert net.wire[0][:5] == ("S", "RNDV_RTP", 1, 1, 8192)


def test_offer_without_a_key_is_streamed():
    net = Net(caps=GET | PUT, split=1)
    rreq = Req()
    net.R.start_recv(RtsInfo(net.rtep, 4, 9000, 0, b""), memoryview(bytearray(9000)),
                     rreq, "r")
    assert net.wire == [("S", "RNDV_RTR", 4, 1, 0, 9000)]
    assert net.rtr.calls == [("recv", 4, 1, "rtr", 9000)]


# -- offer: the RTS pushed by the data plane's lane ----------------------------------------
class Lane:
    """A stand-in ``_dp.Lane``: ``rts`` records the offer and answers ``rc``
    (0 pushed, 1 pushed and the peer sleeps, -1 declined)."""

    def __init__(self, rc=0, check=None):
        self.rc, self.check, self.pushed = rc, check, []

    def rts(self, dp, tag, sid, mv):
        self.pushed.append((tag, sid, mv))
        if self.check is not None:
            self.check(sid)
        return self.rc


def test_an_offer_registers_the_send_and_pushes_its_rts():
    net = Net(tr=False)
    lane = Lane()
    mv = memoryview(bytearray(100))
    req = net.S.offer(net.sep, mv, 7, lane)
    (tag, sid, view), = lane.pushed
    assert (tag, view) == (7, mv) and not req.done and req.worker is net.S.worker
    s = net.S.sends[sid]
    assert (s.ep, s.mv, s.req, s.reading, s.busy) == (net.sep, mv, req, True, 0)
    net.S.on_ats(None, wire.ATS.pack(sid, wire.ATS_OK), b"")    # completes as any send
    assert req.done and req.exc is None and not net.S.sends
    again = net.S.offer(net.sep, mv, 8, lane)
    assert lane.pushed[1][1] == sid + 1 and not again.done


def test_an_offer_to_a_sleeping_peer_wakes_it():
    net = Net(tr=False)
    woken = []
    net.sep._tep = SimpleNamespace(wake_peer=lambda: woken.append(1))
    assert not net.S.offer(net.sep, memoryview(b"x" * 10), 1, Lane(rc=1)).done
    assert woken == [1]


def test_an_offer_the_lane_cannot_push_leaves_nothing_registered():
    net = Net(tr=False)
    seen = []
    lane = Lane(rc=-1, check=lambda sid: seen.append(sid in net.S.sends))
    assert net.S.offer(net.sep, memoryview(b"x"), 1, lane) is None
    assert seen == [True] and not net.S.sends


# -- the sends a C caller (libucp) offered through the data plane ----------------------
class Dp:
    """A stand-in data plane holding C callers' offered sends (id -> bytes):
    what ``rndv_adopt`` hands over, and what was answered or failed."""

    def __init__(self, sends):
        self.sends, self.answers, self.failed = dict(sends), [], []

    def rndv_adopt(self, sid):
        data = self.sends.pop(sid, None)
        return None if data is None else memoryview(data)

    def rndv_answered(self, sid, status):
        self.answers.append((sid, status))
        return True

    def rndv_fail_peer(self, peer):
        self.failed.append(peer)


EXT = wire.RNDV_EXT_ID | 5


def test_a_c_callers_send_asked_for_frames_is_adopted_and_answered():
    """The receiver asks for frames (no key: RTR): the sender's protocol
    adopts the data plane's send (its bytes, the endpoint the RTR came
    from), streams it, and the ATS answers it to the data plane."""
    net = Net(tr=False)
    data = payload(300)
    net.S.worker.dp = dp = Dp({EXT: data})
    rreq, dest = Req(), bytearray(300)
    net.R.start_recv(RtsInfo(net.rtep, EXT, 300, 0, b""), memoryview(dest), rreq, "r")
    net.pump()
    assert bytes(dest) == data and rreq.done == [("r", None)]
    assert dp.answers == [(EXT, wire.ATS_OK)] and not net.S.sends and not dp.sends


def test_the_answer_to_a_c_callers_send_goes_to_the_data_plane():
    net = Net(tr=False)
    net.S.worker.dp = dp = Dp({})
    net.S.on_ats(net.step, wire.ATS.pack(EXT, wire.ATS_ERROR), b"")
    net.S.on_ats(net.step, wire.ATS.pack(3, wire.ATS_OK), b"")      # (one of ours, unknown)
    assert dp.answers == [(EXT, wire.ATS_ERROR)]


def test_a_request_for_a_c_callers_send_already_answered_is_dropped():
    net = Net(tr=False)
    net.S.worker.dp = dp = Dp({})
    net.S.on_rtr(net.step, wire.RTR.pack(EXT, 1, 0, 10), b"")
    assert not net.wire and not net.S.sends and not dp.answers


def test_a_failed_peer_fails_the_c_callers_sends_too():
    """fail_peer answers the data plane's sends to that peer (rndv_fail_peer)
    and fails an adopted one, which answers it with an error."""
    net = Net(tr=False, immediate=False)
    net.S.worker.dp = dp = Dp({EXT: payload(3000)})
    net.S.on_rtr(net.step, wire.RTR.pack(EXT, 1, 0, 3000), b"")     # adopted, frames pending
    assert EXT in net.S.sends
    net.S.fail_peer(net.sep, ConnectionLost("gone"))
    assert dp.failed == [11] and dp.answers == [(EXT, wire.ATS_ERROR)] and not net.S.sends

"""The verbs transport without a device: bindings, packing, the QP state
machine, and falling back cleanly where ibv_get_device_list finds nothing."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

verbs = pytest.importorskip("ucxpy.transports.verbs")

from conftest import ROOT, Pair  # noqa: E402
from ucxpy.config import Config  # noqa: E402
from ucxpy.errors import ProtocolError, RemoteAccessError, TransportUnavailable  # noqa: E402
from ucxpy.transports.verbs import (QP_ATTR, QP_TRANSITIONS, InvalidTransition,  # noqa: E402
                                    QpState, QueuePair, VerbsInterface, transition_mask,
                                    transition_params)

pytestmark = pytest.mark.timeout(60)
built = pytest.mark.skipif(verbs.lib is None, reason="ucxpy._verbs is not built")


def _has_device():
    return verbs.lib is not None and verbs.device_status()[0] > 0


# -- the cffi module ----------------------------------------------------------------

@built
def test_module_binds_the_real_libibverbs():
    ffi, lib = verbs.ffi, verbs.lib
    n = ffi.new("int *", -1)
    lst = lib.ibv_get_device_list(n)          # the real library call
    if lst != ffi.NULL:
        assert n[0] >= 0
        for i in range(n[0]):
            assert ffi.string(lib.ibv_get_device_name(lst[i]))
        lib.ibv_free_device_list(lst)
    else:
        assert ffi.errno != 0                  # e.g. ENOSYS: no RDMA in this kernel
    for name in ("uxv_open", "uxv_qp_create", "uxv_qp_modify", "uxv_reg_mr", "uxv_post_send",
                 "uxv_post_recv", "uxv_poll", "uxv_arm"):
        assert callable(getattr(lib, name))


@built
def test_abi_constants_match_the_header():
    lib = verbs.lib
    for name, bit in QP_ATTR.items():
        assert getattr(lib, "IBV_QP_" + name) == bit, name
    for s in QpState:
        assert getattr(lib, "IBV_QPS_" + s.name) == s.value
    assert (lib.IBV_ACCESS_LOCAL_WRITE, lib.IBV_ACCESS_REMOTE_WRITE, lib.IBV_ACCESS_REMOTE_READ,
            lib.IBV_ACCESS_REMOTE_ATOMIC) == (1, 2, 4, 8)
    assert lib.IBV_MTU_256 == 1 and lib.IBV_MTU_4096 == 5
    assert lib.IBV_LINK_LAYER_ETHERNET == verbs.LINK_LAYER_ETHERNET


# -- no device: unavailable with a reason, others still work --------------------------

@built
@pytest.mark.skipif(_has_device(), reason="an RDMA device exists here")
def test_query_without_device_gives_reason():
    avail = VerbsInterface.query(Config.from_env({}))
    assert not avail.available
    assert avail.reason.startswith("no RDMA devices found (ibv_get_device_list")
    with pytest.raises(TransportUnavailable):
        VerbsInterface(None, Config.from_env({}))


@pytest.mark.skipif(_has_device(), reason="an RDMA device exists here")
def test_context_falls_back_to_other_transports():
    import ucxpy
    ctx = ucxpy.Context(ucxpy.Config.from_env({}, tls="verbs,tcp"))
    assert "verbs" in ctx.unavailable and "no RDMA devices" in ctx.unavailable["verbs"] \
        or verbs.lib is None
    assert [c.name for c in ctx.transports] == ["self", "tcp"]
    with pytest.raises(TransportUnavailable, match="verbs"):
        ucxpy.Context(ucxpy.Config.from_env({}, tls="verbs"))
    p = Pair("verbs,tcp")
    try:
        r = p.workers[1].tag_recv_nb(buf := bytearray(5), tag=1)
        p.wait(r, p.eps[0][1].tag_send_nb(b"hello", 1))
        assert buf == b"hello" and p.eps[0][1].lane.name == "tcp"
    finally:
        p.close()


@pytest.mark.skipif(_has_device(), reason="an RDMA device exists here")
def test_info_shows_the_reason():
    cp = subprocess.run([sys.executable, "-m", "ucxpy.tools.info", "-d"], cwd=ROOT,
                        capture_output=True, text=True, timeout=50,
                        env={"PYTHONPATH": ROOT, "UCXPY_TLS": "verbs,tcp", "PATH": "/usr/bin"})
    assert "# verbs: not available:" in cp.stdout


# -- QP state machine (pure) -----------------------------------------------------------

def test_transition_masks():
    A = QP_ATTR
    assert transition_mask(QpState.RESET, QpState.INIT) == \
        A["STATE"] | A["PKEY_INDEX"] | A["PORT"] | A["ACCESS_FLAGS"]
    assert transition_mask(QpState.INIT, QpState.RTR) == \
        A["STATE"] | A["AV"] | A["PATH_MTU"] | A["DEST_QPN"] | A["RQ_PSN"] | \
        A["MAX_DEST_RD_ATOMIC"] | A["MIN_RNR_TIMER"]
    assert transition_mask(QpState.RTR, QpState.RTS) == \
        A["STATE"] | A["TIMEOUT"] | A["RETRY_CNT"] | A["RNR_RETRY"] | A["SQ_PSN"] | \
        A["MAX_QP_RD_ATOMIC"]
    for s in QpState:
        assert transition_mask(s, QpState.ERR) == A["STATE"]
    assert transition_mask(QpState.ERR, QpState.RESET) == A["STATE"]


@pytest.mark.parametrize("cur,nxt", [(QpState.RESET, QpState.RTR), (QpState.RESET, QpState.RTS),
                                     (QpState.INIT, QpState.RTS), (QpState.RTS, QpState.INIT),
                                     (QpState.ERR, QpState.RTS)])
def test_invalid_transitions_raise(cur, nxt):
    assert (cur, nxt) not in QP_TRANSITIONS
    with pytest.raises(InvalidTransition):
        transition_mask(cur, nxt)


LOCAL = dict(port=1, gid_index=3, mtu=5, max_rd_atomic=4, psn=0x123456)
REMOTE = dict(qpn=0x42, psn=0x654321, lid=7, gid=bytes(range(16)), mtu=3, **{"global": True})


def test_transition_params():
    p = transition_params(QpState.RESET, QpState.INIT, LOCAL)
    assert p == dict(qp_state=1, pkey_index=0, port=1, access=verbs.RC_ACCESS)
    p = transition_params(QpState.INIT, QpState.RTR, LOCAL, REMOTE)
    assert (p["qp_state"], p["dest_qpn"], p["rq_psn"], p["path_mtu"], p["dlid"],
            p["is_global"], p["dgid"], p["sgid_index"]) == \
        (2, 0x42, 0x654321, 3, 7, 1, bytes(range(16)), 3)          # mtu = min of both
    p = transition_params(QpState.RTR, QpState.RTS, LOCAL, REMOTE)
    assert (p["qp_state"], p["sq_psn"], p["rnr_retry"], p["max_rd_atomic"]) == \
        (3, 0x123456, 7, 4)
    with pytest.raises(InvalidTransition):
        transition_params(QpState.INIT, QpState.RTR, LOCAL, None)


def test_queue_pair_walks_reset_to_rts_and_fails_into_err():
    calls = []
    qp = QueuePair(lambda params, mask: calls.append((params["qp_state"], mask)) or 0)
    qp.connect(LOCAL, REMOTE)
    assert qp.state == QpState.RTS
    assert [c[0] for c in calls] == [1, 2, 3]
    assert [c[1] for c in calls] == [transition_mask(QpState.RESET, QpState.INIT),
                                     transition_mask(QpState.INIT, QpState.RTR),
                                     transition_mask(QpState.RTR, QpState.RTS)]
    bad = QueuePair(lambda params, mask: 22 if params["qp_state"] == 2 else 0)
    with pytest.raises(OSError):
        bad.connect(LOCAL, REMOTE)
    assert bad.state == QpState.ERR
    bad.move(QpState.RESET, LOCAL)      # ERR -> RESET is allowed: the QP can be reused


# -- packing ---------------------------------------------------------------------------

def test_address_roundtrip_and_malformed():
    gid = bytes(range(16))
    a = verbs.pack_address(1, 2, 5, 9, 40000, 123, 77, 0xABC, gid, ["10.0.0.1", "192.168.1.2"])
    d = verbs.unpack_address(a)
    assert (d["port"], d["link_layer"], d["mtu"], d["lid"], d["oob_port"], d["pid"], d["uuid"],
            d["guid"], d["gid"], d["ips"]) == \
        (1, 2, 5, 9, 40000, 123, 77, 0xABC, gid, ["10.0.0.1", "192.168.1.2"])
    for bad in (b"", a[:20], a + b"\0", b"XXXX" + a[4:]):
        with pytest.raises(ValueError):
            verbs.unpack_address(bad)


def test_rkey_roundtrip_and_malformed():
    k = verbs.pack_rkey(9, 0x1234, 0x7000, 100)
    assert verbs.unpack_rkey(k) == (9, 0x1234, 0x7000, 100)
    for bad in (k[:-2], b"ABCD" + k[4:]):
        with pytest.raises(RemoteAccessError):
            verbs.unpack_rkey(bad)


def test_oob_messages():
    gid = bytes(16)
    m = verbs.unpack_oob(verbs.pack_oob(verbs.OOB_REQ, 5, 0x99, 0x1234, 3, 5, False, gid))
    assert (m["kind"], m["uuid"], m["qpn"], m["psn"], m["lid"], m["mtu"], m["glob"]) == \
        (verbs.OOB_REQ, 5, 0x99, 0x1234, 3, 5, False)
    for bad in (b"short", verbs.pack_oob(9, 5, 1, 1, 1, 5, False, gid),
                verbs.pack_oob(verbs.OOB_REP, 5, 0, 1, 1, 5, False, gid),          # qpn 0
                verbs.pack_oob(verbs.OOB_REP, 5, 1, 1 << 24, 1, 5, False, gid),    # psn > 24 bit
                verbs.pack_oob(verbs.OOB_REP, 5, 1, 1, 1, 9, False, gid)):         # bad mtu
        with pytest.raises(ProtocolError):
            verbs.unpack_oob(bad)


# -- endpoint lifecycle and error paths, with a stand-in interface -------------------

class _FakeIface:
    """What VerbsEndpoint's queueing, failure and close paths use of its
    interface (no device, no QP: ``qp`` stays None)."""

    def __init__(self, caps=0):
        from ucxpy.transports.base import Caps, TransportAttrs
        self.attrs = TransportAttrs(Caps(caps), 256, 8192, 65536, 1e-6, 1e9)
        self._pending = set()
        self.forgotten, self.failed_rma, self.reported = [], [], []
        self.owner = self

    def _forget(self, ep):
        self.forgotten.append(ep)

    def _fail_rma_of(self, ep, exc):
        self.failed_rma.append((ep, exc))

    def conn_failed(self, ep, exc):
        self.reported.append((ep, exc))


def _endpoint(iface, uuid=77):
    ep = verbs.VerbsEndpoint.__new__(verbs.VerbsEndpoint)    # skips QP creation
    ep.iface, ep.index, ep.sock, ep.peer_uuid, ep.accepted = iface, 0, None, uuid, False
    ep.peer = {"uuid": uuid}
    ep.state, ep._exc, ep._closing = verbs.CONNECTING, None, False
    ep._queue, ep._rma_queue = verbs.collections.deque(), verbs.collections.deque()
    ep.qp, ep.qp_state, ep._rx_mr = None, None, None
    return ep


def test_endpoint_queues_until_established_and_fails_everything_once():
    from ucxpy.errors import ConnectionLost, MessageTooLarge
    from ucxpy.transports.base import ChunkedOp
    iface = _FakeIface()
    ep = _endpoint(iface)
    done, rma_done, released = [], [], []
    assert ep.send(1, b"h", b"small") is True                    # copied into the queue
    assert ep.send(1, b"h", bytearray(9000), done.append) is False   # by reference
    op = ChunkedOp(rma_done.append, 2, "get", release=lambda: released.append(1))
    ep._rma_queue.extend([(op, "piece 1"), (op, "piece 2")])
    assert ep.pending == 4 and ep in iface._pending
    with pytest.raises(MessageTooLarge):
        ep.send(1, b"h", bytes(65537))
    with pytest.raises(ValueError):
        ep.send(256, b"", b"")
    exc = ConnectionLost("peer gone")
    ep._fail(exc)
    ep._fail(ConnectionLost("again"))                              # once only
    assert done == [exc] and rma_done == [exc] and released == [1]
    assert iface.reported == [(ep, exc)] and iface.failed_rma == [(ep, exc)]
    assert ep.state == verbs.FAILED and ep.pending == 0 and iface.forgotten == [ep]
    with pytest.raises(ConnectionLost, match="peer gone"):
        ep.send(1, b"", b"")


def test_endpoint_close_is_graceful_and_not_a_failure():
    from ucxpy.errors import ConnectionLost
    iface = _FakeIface()
    ep = _endpoint(iface)
    ep.send(1, b"", b"queued")
    ep.close()
    ep.close()                                                     # idempotent
    assert ep.state == verbs.CONNECTING and ep._closing           # waits for the queue
    with pytest.raises(ConnectionLost):
        ep.send(1, b"", b"after close")
    ep._queue.clear()
    ep._shutdown()
    assert ep.state == verbs.CLOSED and iface.reported == []
    ep._fail(ConnectionLost("late"))                               # closed: nobody is told
    assert iface.reported == []


def test_one_sided_bad_input_raises_before_touching_the_device():
    iface = _FakeIface()
    ep = _endpoint(iface, uuid=5)
    key = verbs.pack_rkey(5, 0x1234, 0x10000, 4096)
    with pytest.raises(RemoteAccessError, match="outside"):
        ep.get(bytearray(16), 0x10000 + 4090, key, None)
    with pytest.raises(RemoteAccessError, match="outside"):
        ep.put(b"x", 0xFFFF, key, None)
    with pytest.raises(RemoteAccessError, match="another interface"):
        ep.get(bytearray(8), 0x10000, verbs.pack_rkey(6, 1, 0x10000, 4096), None)
    with pytest.raises(RemoteAccessError, match="no atomics"):
        ep.atomic64("add", 0x10000, key, 1, 0, lambda *a: None)
    iface.attrs.caps |= verbs.Caps.ATOMIC64
    with pytest.raises(RemoteAccessError, match="misaligned"):
        ep.atomic64("cswap", 0x10004, key, 1, 0, lambda *a: None)
    assert ep.get(bytearray(0), 0x10000, key, None) is True         # nothing to move


# -- authentication of the out-of-band exchange (no device: stand-in QPs) ------------

class _AuthIface(_FakeIface):
    def __init__(self, key, uuid):
        super().__init__()
        self.key, self.uuid, self.auth_failures = key, uuid, 0
        self.lid, self.mtu, self.use_grh, self.gid = 1, 5, False, bytes(16)
        self.slot_size = 4096
        self.frames = []
        self._poller = self

    def unregister(self, fd):
        pass

    def local_qp_info(self, psn):
        return {"psn": psn}

    def recv_frame(self, ep, am_id, header, payload):
        self.frames.append((am_id, bytes(payload)))


class _StandInQp:
    def __init__(self):
        self.connected_to = None

    def connect(self, local, remote):
        self.connected_to = remote


def _oob_endpoint(iface, sock, accepted, peer_uuid=0):
    ep = _endpoint(iface, peer_uuid)
    ep.sock, ep.accepted = sock, accepted
    ep.state = verbs.ACCEPTING if accepted else verbs.CONNECTING
    ep.qp_state, ep.qpn, ep.psn = _StandInQp(), 0x100 + accepted, 0x42
    ep._oob_in, ep.authed, ep._held, ep._req_body = b"", False, [], b""
    ep._nonce = os.urandom(16)
    ep._rx_view = memoryview(bytearray(4 * iface.slot_size))
    ep._post_recv = lambda slot: None
    return ep


def _handshake(ckey, akey):
    import socket
    s1, s2 = socket.socketpair()
    con_if, acc_if = _AuthIface(ckey, 11), _AuthIface(akey, 22)
    con = _oob_endpoint(con_if, s1, accepted=False, peer_uuid=22)
    acc = _oob_endpoint(acc_if, s2, accepted=True)
    # a frame reaches the accepted QP before the RTU: held, not delivered
    verbs.PREFIX.pack_into(acc._rx_view, 0, verbs.FRAME_MAGIC, 9, 0, 0, 0, 5)
    acc._rx_view[verbs._PSIZE:verbs._PSIZE + 5] = b"early"
    con._on_oob_connected()                 # REQ
    acc._on_oob_readable()                  # REP
    acc._on_recv(0, verbs._PSIZE + 5)
    assert acc_if.frames == [] and acc._held == [(0, verbs._PSIZE + 5)]
    con._on_oob_readable()                  # checks REP; RTU
    if con._exc is None:
        acc._on_oob_readable()              # checks RTU
    return con, acc, con_if, acc_if


def test_oob_handshake_proves_the_job_key():
    con, acc, con_if, acc_if = _handshake(b"k" * 32, b"k" * 32)
    assert con.state == acc.state == verbs.ESTABLISHED and con.authed and acc.authed
    assert acc_if.frames == [(9, b"early")]           # delivered once the RTU checked out
    assert con.qp_state.connected_to["qpn"] == acc.qpn


@pytest.mark.parametrize("wrong", ["acceptor", "connector"])
def test_oob_handshake_with_a_wrong_key_fails(wrong):
    from ucxpy.errors import ConnectionLost
    keys = (b"k" * 32, b"x" * 32) if wrong == "acceptor" else (b"x" * 32, b"k" * 32)
    con, acc, con_if, acc_if = _handshake(*keys)
    # the connector checks the acceptor's proof first: either way it fails
    assert isinstance(con._exc, ConnectionLost) and "authentication" in str(con._exc)
    assert con_if.auth_failures == 1 and con.qp_state.connected_to is None
    assert acc_if.frames == [] and not acc.authed          # nothing of it was delivered

"""A whole ucxpy transport in under 100 lines: "toy" carries frames between
the workers of one process through in-memory queues.

It has what ucxpy/transports/base.py asks for and nothing more: attrs (the
capabilities and size limits the core picks protocols by), an address, an
endpoint whose send() is FIFO and never blocks, progress() handing frames to
the owner, and a lost peer reported once through conn_failed.  Register it
(or name it in a package's ``ucxpy.transports`` entry point group) and select
it like any other: ``register_transport("toy", "toy_transport:ToyInterface")``,
then ``UCXPY_TLS=toy``.  tests/test_transport_contract.py runs on it the
contract suite that self, shm, tcp, ofi and verbs pass.
"""
import collections
import os

from ucxpy.errors import ConnectionLost, MessageTooLarge, TransportUnavailable
from ucxpy.transports.base import (MAX_HEADER, Availability, Caps, Interface, TransportAttrs,
                                   TransportEndpoint, byte_view)

_LIVE = {}      # interface id -> the live ToyInterface (this process only)


class ToyEndpoint(TransportEndpoint):
    def __init__(self, iface, peer_id):
        self.iface, self.peer_id, self.closed = iface, peer_id, False

    def send(self, am_id, header, payload=b"", on_complete=None):
        payload = byte_view(payload)
        if len(header) > MAX_HEADER or len(payload) > self.iface.attrs.max_frame:
            raise MessageTooLarge(f"toy: header {len(header)} B / payload {len(payload)} B")
        peer = _LIVE.get(self.peer_id)
        if self.closed or peer is None or self.iface.id not in _LIVE:
            raise ConnectionLost("toy: endpoint closed or peer interface gone")
        peer.inbox.append((self.iface.id, am_id, bytes(header), bytes(payload)))
        return True                       # copied: the caller may reuse the buffer now

    def close(self):
        self.closed = True


class ToyInterface(Interface):
    name = "toy"

    def __init__(self, owner, config):
        super().__init__(owner, config)
        self.attrs = TransportAttrs(caps=Caps.AM_SHORT | Caps.AM_BCOPY | Caps.CONNECT_TO_IFACE,
                                    max_short=256, max_bcopy=1 << 16, max_frame=1 << 30,
                                    latency=1e-6, bandwidth=2e9, overhead=1e-6)
        self.id, self.inbox, self.eps = os.urandom(8), collections.deque(), {}
        _LIVE[self.id] = self

    @classmethod
    def query(cls, config):
        return Availability(True, "frames between workers of one process", devices=["toy"])

    def address(self):
        return b"TOY" + self.id

    def is_reachable(self, address, host_id):
        return bytes(address[:3]) == b"TOY" and bytes(address[3:]) in _LIVE

    def connect(self, address):
        if not self.is_reachable(address, b""):
            raise TransportUnavailable("toy reaches live interfaces of this process only")
        return self._ep(bytes(address[3:]))

    def _ep(self, peer_id):
        if peer_id not in self.eps:
            self.eps[peer_id] = ToyEndpoint(self, peer_id)
        return self.eps[peer_id]

    def progress(self):
        n = len(self.inbox)               # not the frames handlers queue meanwhile
        for _ in range(n):
            src, am_id, header, payload = self.inbox.popleft()
            self.owner.recv_frame(self._ep(src), am_id, memoryview(header), memoryview(payload))
        for peer_id, ep in list(self.eps.items()):
            if peer_id not in _LIVE and not ep.closed:   # the peer closed: tell once
                ep.closed = True
                self.owner.conn_failed(ep, ConnectionLost("toy: peer interface closed"))
        return n

    def close(self):
        _LIVE.pop(self.id, None)
        self.inbox.clear()


if __name__ == "__main__":      # two workers of this process talk over toy
    import ucxpy
    ucxpy.context.register_transport("toy", f"{__name__}:ToyInterface")
    ctx = ucxpy.Context(ucxpy.Config.from_env({}, tls="toy"))
    a, b = ctx.create_worker(0), ctx.create_worker(1)
    buf = bytearray(5)
    req = b.tag_recv_nb(buf, tag=7)
    a.connect(b.address).tag_send_nb(b"hello", tag=7)
    while not req.test():
        a.progress()
        b.progress()
    print("worker 1 received", bytes(buf), "over", sorted(ctx.config.tls))

"""run: ucxpy-run -n 2 python docs/examples/research_protocol.py

The researcher's guide's protocol plug-in: a receiver-driven rendezvous.
The sender offers the message; once a receive matched the offer, the
receiver pulls it one chunk at a time (stop and wait: one chunk in flight),
and its last pull tells the sender that its buffer is free.  Both ranks load
it for messages of 4 KiB and more; smaller ones keep the stock protocols.
The program checks the data, the plug-in's frame counts, MPI's order
between eager and plug-in messages of one tag, and truncation.
"""
import itertools
import struct

from ucxpy.protocols import PluginOffer, Protocol
from ucxpy.request import Request

_OFFER = struct.Struct("<QQQ")      # tag, send id, size
_PULL = struct.Struct("<QQQ")       # send id, receive id, offset (== size: done)
_CHUNK = struct.Struct("<QQ")       # receive id, offset            payload: the chunk
OFFER, PULL, CHUNK = 1, 2, 3        # this plug-in's frame kinds (one byte)


class PullRendezvous(Protocol):
    """Offer, then chunks the receiver asks for one at a time."""

    name = "pull"
    chunk = 8192

    def __init__(self, worker, sizes):
        super().__init__(worker, sizes)
        self.ids = itertools.count(1)
        self.sends = {}             # send id -> (endpoint, bytes, request)
        self.recvs = {}             # receive id -> [endpoint, request, buffer, size, info, send id]
        self.counts = {"offers": 0, "chunks": 0}

    # -- the sender ----------------------------------------------------------------
    def send(self, ep, mv, tag):
        req, sid = Request(self.worker), next(self.ids)
        self.sends[sid] = (ep, mv, req)       # mv stays the caller's until req completes
        self.counts["offers"] += 1
        self.trace("offer", ep, tag=tag, size=mv.nbytes)
        self.frame(ep, OFFER, _OFFER.pack(tag, sid, mv.nbytes))
        return req

    def _pulled(self, sid, rid, off):
        ep, mv, req = self.sends[sid]
        if rid == 0 or off >= mv.nbytes:      # done, or dropped: the buffer is free
            del self.sends[sid]
            req.complete()
            return
        self.counts["chunks"] += 1
        self.frame(ep, CHUNK, _CHUNK.pack(rid, off), mv[off:off + self.chunk])

    # -- the receiver --------------------------------------------------------------
    def on_frame(self, ep, kind, header, payload):
        if kind == OFFER:
            tag, sid, size = _OFFER.unpack(header)
            self.offer(ep, tag, PluginOffer(self, ep, size, sid))   # the core matches it
        elif kind == PULL:
            self._pulled(*_PULL.unpack(header))
        elif kind == CHUNK:
            rid, off = _CHUNK.unpack(header)
            self._chunk(rid, off, payload)

    def start_recv(self, req, offer, info):
        rid = next(self.ids)
        if offer.size == 0:
            self.frame(offer.ep, PULL, _PULL.pack(offer.state, rid, 0))
            req.complete(info)
            return
        buf = memoryview(req.buf).cast("B")
        self.recvs[rid] = [offer.ep, req, buf, offer.size, info, offer.state]
        self.frame(offer.ep, PULL, _PULL.pack(offer.state, rid, 0))

    def _chunk(self, rid, off, payload):
        ep, req, buf, size, info, sid = self.recvs[rid]
        end = off + len(payload)
        buf[off:end] = payload                # payload is valid during the call only
        self.frame(ep, PULL, _PULL.pack(sid, rid, end))     # the next chunk, or "done"
        if end >= size:
            del self.recvs[rid]
            req.complete(info)

    def drop(self, offer):                    # matched a receive too small for it
        self.frame(offer.ep, PULL, _PULL.pack(offer.state, 0, 0))

    def fail_peer(self, ep, exc):             # the peer is gone: fail what it had in flight
        gone = [(self.sends, sid, entry[2]) for sid, entry in self.sends.items() if entry[0] is ep]
        gone += [(self.recvs, rid, entry[1]) for rid, entry in self.recvs.items() if entry[0] is ep]
        for table, key, req in gone:
            del table[key]
            req.complete(exc=exc)


def main():
    import numpy as np
    import ucxpy

    # what UCXPY_PROTO_PLUGIN=research_protocol:PullRendezvous:4K-inf in every
    # rank's environment does (this file's directory is on sys.path)
    world = ucxpy.init(proto_plugin="research_protocol:PullRendezvous:4K-inf")
    plugin = world.worker.protocol
    assert plugin.name == "pull" and plugin.covers(4096) and not plugin.covers(4095)
    peer = 1 - world.rank

    def data(n, seed):
        return ((np.arange(n) * 7 + seed) % 251).astype(np.uint8)

    # every size across the boundary, both directions at once
    sizes = [0, 100, 4095, 4096, 4097, 20_000, 100_000]
    dsts = [np.zeros(n, np.uint8) for n in sizes]
    recvs = [world.irecv(d, source=peer, tag=i) for i, d in enumerate(dsts)]
    sends = [world.isend(data(n, peer), dest=peer, tag=i) for i, n in enumerate(sizes)]
    for r in recvs + sends:
        r.wait()
    for n, d in zip(sizes, dsts):
        assert (d == data(n, world.rank)).all(), n
    big = [n for n in sizes if n >= 4096]
    assert plugin.counts["offers"] == len(big), plugin.counts
    assert plugin.counts["chunks"] == sum(-(-n // plugin.chunk) for n in big), plugin.counts

    # MPI's order: an eager message and plug-in messages of one tag, received
    # in the order they were sent (the offer travels in order with the rest)
    world.barrier()
    order = [5000, 8, 9000]
    if world.rank == 0:
        for i, n in enumerate(order):
            world.send(data(n, i), dest=1, tag=50)
    else:
        for i, n in enumerate(order):
            buf = np.zeros(10_000, np.uint8)
            info = world.recv(buf, source=0, tag=50)
            assert info.length == n and (buf[:n] == data(n, i)).all(), (i, info)

    # truncation: the receive fails, the sender is released (drop) and completes
    world.barrier()
    if world.rank == 0:
        world.send(data(6000, 0), dest=1, tag=60)
    else:
        try:
            world.recv(np.zeros(5000, np.uint8), source=0, tag=60)
        except ucxpy.TruncationError as e:
            assert e.size == 6000
        else:
            raise AssertionError("a 6000-byte message fit a 5000-byte receive")
    assert not plugin.sends and not plugin.recvs
    print(f"rank {world.rank}: {plugin.counts['offers']} offers, "
          f"{plugin.counts['chunks']} chunks sent by the pull plug-in")
    world.finalize()


if __name__ == "__main__":
    main()

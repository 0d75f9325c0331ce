"""ucxpy's own driver for ``ucxpy-perf`` (see "Drivers" in :mod:`ucxpy.tools.perf`).

A *comm* runs the two-sided tests between ranks 0 and 1 with one library:
``bind(peer)`` returns ``(send, recv, isend, irecv)`` closures so that the
timed loops measure the library call and nothing else.  Its
``rma_window(sizes)`` returns the matching one-sided *window*.  The drivers
of the libraries ucxpy is compared with follow the same protocol in
``bench/perf_drivers.py``, outside the package.
"""
from __future__ import annotations

import struct

import ucxpy


# ------------------------------------------------------------------ comms

class UcxpyComm:
    """Ranks 0/1 over ucxpy: endpoint sends, worker receives from a source."""

    impl = "ucxpy"

    def __init__(self):
        from ucxpy.tag import FULL_MASK     # deferred: the core loads only for the ucxpy driver
        self.world = ucxpy.init()
        self.rank, self.size = self.world.rank, self.world.size
        self._mask = FULL_MASK

    def bind(self, peer: int):
        """``(send, recv, isend, irecv)`` to/from ``peer`` with the per-call
        overhead of the public API and nothing more."""
        ep = self.world.ep(peer)
        worker = self.world.worker
        mask = self._mask

        def recv(buf, tag):
            return worker.tag_recv(buf, tag, mask, peer)

        def irecv(buf, tag):
            return worker.tag_recv_nb(buf, tag, mask, peer)
        return ep.tag_send, recv, ep.tag_send_nb, irecv

    @staticmethod
    def waitall(reqs):
        for r in reqs:
            r.wait()

    def barrier(self):
        self.world.barrier()

    def lane(self, peer: int) -> str:
        lane = self.world.ep(peer).lane
        return lane.name if lane is not None else "?"

    def rma_window(self, sizes) -> "UcxpyRma":
        return UcxpyRma(self, sizes)

    def finalize(self):
        self.world.finalize()


# ------------------------------------------------------------------ RMA windows
#
# ``bind(size)`` returns the operations of one size as closures with every
# argument prepared, so the loop measures the library call and nothing else:
# ``(put, get, put_nb, get_nb, flush, fetch_add)`` where put = put + remote
# completion, get = blocking read, *_nb issue only, flush completes them.
# ``begin()`` / ``end()`` open and close an access epoch (MPI passive target).

class UcxpyRma:
    def __init__(self, comm: UcxpyComm, sizes):
        w = comm.world
        self.peer = 1 - comm.rank if comm.rank < 2 else 0
        self.ctr_off = (max(sizes) + 7) // 8 * 8
        self.mh = w.worker.mem_map(length=self.ctr_off + 8)
        blobs = w.bootstrap.allgather(struct.pack("<Q", self.mh.address) + self.mh.pack_rkey())
        self.ep = w.ep(self.peer)
        self.addr = struct.unpack_from("<Q", blobs[self.peer])[0]
        self.rkey = self.ep.unpack_rkey(blobs[self.peer][8:])
        self.mode = self.rkey.mode

    def begin(self):
        pass

    def end(self):
        pass

    def bind(self, size: int):
        ep, addr, rkey = self.ep, self.addr, self.rkey
        ep_put_nb, ep_get, ep_get_nb, ep_flush = ep.put_nb, ep.get, ep.get_nb, ep.flush
        ctr = addr + self.ctr_off

        def put(buf):
            ep_put_nb(buf, addr, rkey)
            ep_flush()

        def get(buf):
            ep_get(buf, addr, rkey)

        def put_nb(buf):
            ep_put_nb(buf, addr, rkey)

        def get_nb(buf):
            ep_get_nb(buf, addr, rkey)

        def fetch_add():
            return ep.atomic_fetch("add", 1, ctr, rkey, 8)
        return put, get, put_nb, get_nb, ep_flush, fetch_add

    def close(self):
        self.mh.unmap()

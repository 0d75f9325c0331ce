"""The implementations ``ucxpy-perf`` measures (see :mod:`ucxpy.tools.perf`).

A *comm* runs the two-sided tests between ranks 0 and 1 with one library:
``bind(peer)`` returns ``(send, recv, isend, irecv)`` closures so that the
timed loops measure the library call and nothing else.  Its
``rma_window(sizes)`` returns the matching one-sided *window*.
"""
from __future__ import annotations

import struct

import numpy as np

from ..config import setting

# ------------------------------------------------------------------ comms

class UcxpyComm:
    """Ranks 0/1 over ucxpy: endpoint sends, worker receives from a source."""

    impl = "ucxpy"

    def __init__(self):
        import ucxpy
        from ucxpy.tag import FULL_MASK
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


class Mpi4pyComm:
    """The same pattern over mpi4py buffer calls (the reference), or over
    ``mpi_shim`` (``shim=True``), whose ``MPI`` is a drop-in for mpi4py's."""

    impl = "mpi4py"

    def __init__(self, shim: bool = False):
        if shim:
            from mpi_shim import MPI
            self.impl = "mpi_shim"
        else:
            from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def bind(self, peer: int):
        c = self.comm

        def send(buf, tag):
            c.Send(buf, peer, tag)

        def recv(buf, tag):
            c.Recv(buf, peer, tag)

        def isend(buf, tag):
            return c.Isend(buf, peer, tag)

        def irecv(buf, tag):
            return c.Irecv(buf, peer, tag)
        return send, recv, isend, irecv

    def waitall(self, reqs):
        self.MPI.Request.Waitall(reqs)

    def barrier(self):
        self.comm.Barrier()

    def lane(self, peer: int) -> str:
        if self.impl == "mpi_shim":
            try:
                from mpi_shim.request import ENGINE
                lane = ENGINE.world.ep(peer).lane
                return f"ucxpy-{lane.name if lane is not None else '?'}"
            except Exception:       # internals moved: the lane is informational only
                return "ucxpy"
        words = self.MPI.Get_library_version().split("\n")[0].split()
        return f"{words[0]}-{words[-1]}" if words else "mpi"

    def rma_window(self, sizes) -> "MpiRma":
        return MpiRma(self, sizes)

    def bcast_int(self, value: int) -> int:
        buf = np.array([value], np.int64)
        self.comm.Bcast(buf, 0)
        return int(buf[0])

    def max_float(self, value: float) -> float:
        out = np.zeros(1, np.float64)
        self.comm.Allreduce(np.array([value], np.float64), out, op=self.MPI.MAX)
        return float(out[0])

    def finalize(self):
        pass


class ShmemComm:
    """OpenSHMEM: our ``shmem`` or shmem4py's (``module="shmem4py"``); RMA only."""

    def __init__(self, module: str = "shmem"):
        if module == "shmem4py":
            from shmem4py import shmem
        else:
            import shmem
        self.impl = module
        self.shmem = shmem
        shmem.init()
        self.rank, self.size = shmem.my_pe(), shmem.n_pes()

    def barrier(self):
        self.shmem.barrier_all()

    def lane(self, peer: int) -> str:
        if self.impl == "shmem":
            tls = ",".join(setting("UCXPY_TLS"))
            mode = self.shmem.heap_info()["modes"][peer]
            return f"{tls}/{mode}"
        try:
            return "oshmem-" + ".".join(map(str, self.shmem.info_get_version()))
        except Exception:         # the lane is informational only
            return "oshmem"

    def rma_window(self, sizes) -> "ShmemRma":
        return ShmemRma(self, sizes)

    def finalize(self):
        self.shmem.finalize()


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


class MpiRma:
    def __init__(self, comm: Mpi4pyComm, sizes):
        MPI = self.MPI = comm.MPI
        self.peer = 1 - comm.rank if comm.rank < 2 else 0
        self.ctr_off = (max(sizes) + 7) // 8 * 8
        self.win = MPI.Win.Allocate(self.ctr_off + 8, 1, comm=comm.comm)
        # The window exists at every rank once all passed this barrier; MPI
        # does not require it, but it keeps the measurement off creation races.
        comm.comm.Barrier()
        self.mode = "Win.Allocate"
        if comm.impl == "mpi_shim":
            try:      # informational: the ucxpy access mode under the window
                self.mode += "/" + self.win._impl().rkeys[self.peer].mode
            except Exception:
                pass

    def begin(self):
        self.win.Lock(self.peer, self.MPI.LOCK_SHARED)

    def end(self):
        self.win.Unlock(self.peer)

    def bind(self, size: int):
        win, peer, MPI = self.win, self.peer, self.MPI
        Put, Get, Flush = win.Put, win.Get, win.Flush
        one = np.ones(1, np.int64)
        old = np.zeros(1, np.int64)
        ctr = self.ctr_off

        def put(buf):
            Put(buf, peer)
            Flush(peer)

        def get(buf):
            Get(buf, peer)
            Flush(peer)

        def put_nb(buf):
            Put(buf, peer)

        def get_nb(buf):
            Get(buf, peer)

        def flush():
            Flush(peer)

        def fetch_add():
            win.Fetch_and_op(one, old, peer, ctr, MPI.SUM)
            Flush(peer)
            return int(old[0])
        return put, get, put_nb, get_nb, flush, fetch_add

    def close(self):
        self.win.Free()


class ShmemRma:
    def __init__(self, comm: ShmemComm, sizes):
        sh = self.shmem = comm.shmem
        self.peer = 1 - comm.rank if comm.rank < 2 else 0
        # one symmetric array per size: whole arrays take every library's
        # plain path (slices may be checked, or refused, by some)
        self.targets = {s: sh.zeros(s, dtype="u1") for s in sorted(set(sizes))}
        self.ctr = sh.zeros(1, dtype="i8")
        sh.barrier_all()
        self.mode = "symmetric heap"

    def begin(self):
        pass

    def end(self):
        pass

    def bind(self, size: int):
        sh, peer, target, ctr = self.shmem, self.peer, self.targets[size], self.ctr
        sh_put, sh_get, sh_put_nbi, sh_get_nbi, quiet = (sh.put, sh.get, sh.put_nbi,
                                                         sh.get_nbi, sh.quiet)
        afa = sh.atomic_fetch_add

        def put(buf):
            sh_put(target, buf, peer)
            quiet()

        def get(buf):
            sh_get(buf, target, peer)

        def put_nb(buf):
            sh_put_nbi(target, buf, peer)

        def get_nb(buf):
            sh_get_nbi(buf, target, peer)

        def fetch_add():
            return int(afa(ctr, 1, peer))
        return put, get, put_nb, get_nb, quiet, fetch_add

    def close(self):
        sh = self.shmem
        sh.barrier_all()
        for a in list(self.targets.values()) + [self.ctr]:
            try:
                sh.free(a)
            except Exception:     # freeing is best effort at the end of a test
                pass

"""Comparison drivers for ``ucxpy-perf``: the libraries ucxpy is measured against.

``ucxpy-perf`` itself measures ucxpy only; loading this file registers four
more implementations (see "Drivers" in :mod:`ucxpy.tools.perf`)::

    mpiexec -n 2 python -m ucxpy.tools.perf --drivers bench/perf_drivers.py --impl mpi4py
    ucxpy-run -n 4 python -m ucxpy.tools.perf --drivers bench/perf_drivers.py \\
        --impl mpi_shim -t allreduce
    ucxpy-run -n 2 python -m ucxpy.tools.perf --drivers bench/perf_drivers.py \\
        --impl shmem -t put_lat,amo_lat
    oshrun -n 2 python -m ucxpy.tools.perf --drivers bench/perf_drivers.py \\
        --impl shmem4py -t put_lat                                   # Open MPI OSHMEM

``mpi4py`` and ``mpi_shim`` run the same mpi4py code, with ``from mpi4py
import MPI`` or ``from mpi_shim import MPI`` (every test, collectives
included); ``shmem`` / ``shmem4py`` run the OpenSHMEM code with our
``shmem`` or shmem4py (RMA tests only).  Each library is imported when its
driver is chosen, not when this file is loaded.
"""
from __future__ import annotations

import functools

import numpy as np

from ucxpy.config import setting
from ucxpy.tools.perf import RMA_TESTS, TESTS, register_driver

# ------------------------------------------------------------------ comms


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
            self.tls = ""           # not on ucxpy: UCXPY_TLS says nothing about it
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

    def coll_case(self, test: str, size: int):
        """``(call, check)`` for one collective test: ``call()`` runs it once on
        the benchmark buffers, ``check()`` raises if one run gave wrong data."""
        MPI, c, n, rank = self.MPI, self.comm, self.size, self.rank
        count = max(1, size // 8)
        if test == "allreduce":
            sbuf, rbuf = np.ones(count), np.zeros(count)
            Allreduce, SUM = c.Allreduce, MPI.SUM

            def check():
                src = np.arange(count, dtype=np.float64) + rank
                out = np.zeros(count)
                c.Allreduce(src, out, op=MPI.SUM)
                want = np.arange(count, dtype=np.float64) * n + n * (n - 1) / 2
                if not np.array_equal(out, want):
                    raise RuntimeError(f"Allreduce of {count} float64 returned a wrong sum")
            return (lambda: Allreduce(sbuf, rbuf, op=SUM)), check
        if test == "bcast":
            buf = np.zeros(max(size, 1), np.uint8)
            Bcast = c.Bcast

            def check():
                b = np.full(max(size, 1), 7 if rank == 0 else 0, np.uint8)
                c.Bcast(b, root=0)
                if not (b == 7).all():
                    raise RuntimeError(f"Bcast of {size} bytes delivered wrong data")
            return (lambda: Bcast(buf, root=0)), check
        if test == "alltoall":
            per = max(size, 1)
            sbuf, rbuf = np.zeros(per * n, np.uint8), np.zeros(per * n, np.uint8)
            Alltoall = c.Alltoall

            def check():
                src = np.repeat((np.arange(n) * 16 + rank).astype(np.uint8), per)
                out = np.zeros(per * n, np.uint8)
                c.Alltoall(src, out)
                want = np.repeat((rank * 16 + np.arange(n)).astype(np.uint8), per)
                if not np.array_equal(out, want):
                    raise RuntimeError(f"Alltoall of {per} bytes per peer delivered wrong data")
            return (lambda: Alltoall(sbuf, rbuf)), check
        raise ValueError(f"unknown collective test {test!r}")

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
# (the protocol of ucxpy.tools.perf_comms.UcxpyRma)

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


# ------------------------------------------------------------------ registration

register_driver("mpi4py", Mpi4pyComm, TESTS)
register_driver("mpi_shim", functools.partial(Mpi4pyComm, shim=True), TESTS)
register_driver("shmem", ShmemComm, RMA_TESTS)
register_driver("shmem4py", functools.partial(ShmemComm, module="shmem4py"), RMA_TESTS)

"""Bootstrap over MPI, for jobs started by ``mpirun``/``mpiexec``.

Works with any MPI that mpi4py was built against (tested with the ``mpich``
wheel's Hydra ``mpiexec``; Open MPI's ``mpirun`` sets the variables that
:func:`ucxpy.bootstrap.detect_mpi_launcher` looks for as well).

Every collective uses a private duplicate of ``COMM_WORLD`` and a
non-blocking MPI call (``Iallgather``, ``Iallgatherv``, ``Ibcast``,
``Ibarrier``) polled with ``Test`` and a short sleep, so a rank that never
arrives produces :class:`~ucxpy.bootstrap.BootstrapTimeout` instead of a hang.
MPI cannot say *which* ranks are missing, and an MPI collective cannot be
cancelled: after a timeout the bootstrap is unusable, and the right response
is :meth:`MpiBootstrap.abort`.

Failure detection: :meth:`MpiBootstrap.check_failures` is a no-op.  MPI
launchers kill the whole job when one rank exits abnormally (Hydra and Open
MPI both do by default), so the surviving ranks never need to be told.
"""
from __future__ import annotations

import os
import socket
import time
from array import array

from ..errors import BootstrapError
from .base import Bootstrap, BootstrapTimeout, resolve_timeout

__all__ = ["MpiBootstrap"]


def _import_mpi():
    try:
        from mpi4py import MPI      # deferred: an MPI library initializes at this import
    except ImportError as e:
        raise BootstrapError(f"MPI bootstrap needs mpi4py: {e}") from None
    return MPI


class MpiBootstrap(Bootstrap):
    """Bootstrap on top of an MPI communicator (default ``COMM_WORLD``)."""

    kind = "mpi"

    def __init__(self, comm=None):
        MPI = _import_mpi()
        self._MPI = MPI
        base = MPI.COMM_WORLD if comm is None else comm
        self._comm = base.Dup()     # our traffic never matches the user's
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        self.hostname = socket.gethostname()
        self.local_rank, self.local_size = self._local_placement()
        self._seq = 0

    def _local_placement(self):
        MPI = self._MPI
        try:
            node = self._comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
            try:
                return node.Get_rank(), node.Get_size()
            finally:
                node.Free()
        except (MPI.Exception, NotImplementedError, AttributeError):
            pass
        for r, s in (("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                     ("MPI_LOCALRANKID", "MPI_LOCALNRANKS")):
            if r in os.environ and s in os.environ:
                return int(os.environ[r]), int(os.environ[s])
        return 0, 1

    def _wait(self, request, what: str, timeout):
        """Poll ``request`` until done or ``timeout`` seconds have passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        nap = 0.0
        while not request.Test():
            if deadline is not None and time.monotonic() >= deadline:
                raise BootstrapTimeout(
                    f"rank {self.rank}: MPI {what} timed out after {timeout:g} s "
                    "(some rank did not join; MPI cannot say which)")
            if nap:
                time.sleep(nap)
            # back off from a quick re-test to 5 ms naps: cheap on a shared core
            nap = min(0.005, nap * 2 or 0.0001)

    def allgather(self, data: bytes, timeout=None) -> list:
        MPI = self._MPI
        timeout = resolve_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        what = f"allgather #{self._seq}"
        self._seq += 1
        data = bytes(data)
        sizes = array("q", [0]) * self.size
        self._wait(self._comm.Iallgather([array("q", [len(data)]), MPI.INT64_T],
                                         [sizes, MPI.INT64_T]), what, timeout)
        counts = list(sizes)
        displs = [0] * self.size
        for i in range(1, self.size):
            displs[i] = displs[i - 1] + counts[i - 1]
        recv = bytearray(sum(counts))
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        self._wait(self._comm.Iallgatherv([data, MPI.BYTE],
                                          [recv, (counts, displs), MPI.BYTE]), what, remaining)
        return [bytes(recv[d:d + c]) for d, c in zip(displs, counts)]

    def barrier(self, timeout=None) -> None:
        what = f"barrier #{self._seq}"
        self._seq += 1
        self._wait(self._comm.Ibarrier(), what, resolve_timeout(timeout))

    def bcast(self, data, root: int = 0, timeout=None) -> bytes:
        MPI = self._MPI
        self._check_root(root)
        timeout = resolve_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        what = f"bcast #{self._seq}"
        self._seq += 1
        if self.rank == root:
            if data is None:
                raise BootstrapError("bcast: the root must supply data")
            buf = bytearray(data)
        size = array("q", [len(buf) if self.rank == root else 0])
        self._wait(self._comm.Ibcast([size, MPI.INT64_T], root=root), what, timeout)
        if self.rank != root:
            buf = bytearray(size[0])
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        self._wait(self._comm.Ibcast([buf, MPI.BYTE], root=root), what, remaining)
        return bytes(buf)

    def job_key(self, timeout=None) -> bytes:
        """Rank 0 makes the job key (or takes ``UCXPY_AUTH_KEY``) and
        broadcasts it through the launcher (collective)."""
        return self._broadcast_job_key(timeout)

    def listen_address(self):
        return self._placement_listen_address()

    def check_failures(self) -> None:
        """No-op: the MPI launcher kills every rank when one fails."""

    def abort(self, message: str = "", errorcode: int = 1):
        """``MPI_Abort`` on ``COMM_WORLD`` (kills the job); does not return."""
        self._abort_and_exit(message, errorcode, self._MPI.COMM_WORLD.Abort)

    def close(self) -> None:
        comm, self._comm = self._comm, None
        if comm is not None and not self._MPI.Is_finalized():
            try:
                comm.Free()
            except self._MPI.Exception:
                pass

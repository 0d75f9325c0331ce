"""The shared file pointer of an open file, kept in memory of rank 0.

Theory of operation
-------------------
At ``File.Open`` the file's processes allocate an RMA window holding one
64-bit integer at rank 0 (``Win.Allocate`` on the file's communicator) and
open a shared passive-target epoch on it (``Lock(0, LOCK_SHARED)``) that
lasts until ``Close``.  The integer is the shared pointer, in etypes of the
current view.

* Independent accesses (``Read_shared``/``Write_shared`` and the ``I``
  forms) reserve their part of the file with one ``Fetch_and_op(SUM)`` and
  ``Flush(0)``: a word atomic on rank 0's memory, so concurrent callers get
  disjoint ranges in some order.  Rank 0 takes no part beyond ucxpy's
  progress (on one host the atomic is a CPU instruction on mapped memory;
  across hosts ucxpy serves it when rank 0 next progresses).
* Collective uses go through rank 0: ordered accesses gather the counts at
  rank 0, which advances the pointer once and scatters each rank's start
  (rank order); ``Seek_shared`` and ``Set_view`` compute the new value at
  rank 0 and broadcast the outcome, so every rank returns after the update.

Nothing lives in the file system (no sidecar file, no ``fcntl`` lock), so
the pointer is right on a directory shared by several hosts.
"""
from __future__ import annotations

import builtins

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from .datatype import INT64_T
from .exceptions import ERR_OTHER, Exception
from .op import REPLACE, SUM
from .win import LOCK_SHARED, Win


class SharedPointer:
    """The shared pointer of one file (see the module docstring)."""

    def __init__(self, comm, initial: int = 0):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.win = Win.Allocate(8 if self.rank == 0 else 0, 8, None, comm)
        if self.rank == 0:
            np.frombuffer(self.win._impl().view, np.int64)[0] = initial
        self.win.Lock(0, LOCK_SHARED)
        # rank 0 progresses in the barrier until every rank's lock is granted
        comm.Barrier()
        self._value = np.zeros(1, np.int64)
        self._old = np.zeros(1, np.int64)

    def _atomic(self, value: int, op) -> int:
        self._value[0] = value
        self.win.Fetch_and_op([self._value, INT64_T], [self._old, INT64_T], 0, 0, op)
        self.win.Flush(0)
        return int(self._old[0])

    def fetch_add(self, n: int) -> int:
        """Advance the pointer by ``n`` etypes; returns where it was."""
        return self._atomic(n, SUM)

    def get(self) -> int:
        """The pointer's value."""
        return self._atomic(0, SUM)

    def update(self, compute, entered: bool = False) -> int:
        """Set the pointer to ``compute(current value)`` (collective).

        ``compute`` runs at rank 0 once every member has called (``entered``:
        the caller has just agreed with all of them); an MPI.Exception it
        raises is raised at every rank.  Returns the new value.
        """
        if not entered:
            self.comm.Barrier()      # every earlier access of this pointer is done
        outcome = None
        if self.rank == 0:
            try:
                new = compute(self.get())
                self._atomic(new, REPLACE)
                outcome = (new, None)
            except Exception as e:
                outcome = (None, (e.Get_error_code(), e.message))
            except builtins.Exception as e:          # still tell the others, then raise
                outcome = (None, (ERR_OTHER, repr(e)))
                self.comm.bcast(outcome, 0)
                raise
        new, error = self.comm.bcast(outcome, 0)
        if error is not None:
            raise Exception(*error)
        return new

    def ordered(self, n: int) -> int:
        """Reserve ``n`` etypes for each rank in rank order (collective); returns
        where this rank's part starts."""
        counts = self.comm.gather(n, 0)
        starts = None
        if self.rank == 0:
            base = self.fetch_add(sum(counts))
            starts = list(np.cumsum([base] + counts[:-1]).tolist())
        return self.comm.scatter(starts, 0)

    def close(self) -> None:
        """End the epoch and free the window (collective)."""
        self.win.Unlock(0)
        self.win.Free()

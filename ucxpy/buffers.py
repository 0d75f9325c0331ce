"""Buffer views and the shared completed request: a leaf module.

The core's modules (worker, endpoint, active messages, RMA, rendezvous) all
turn user buffers into flat byte views and return one already-completed
request for operations done at once.  Those helpers live here, importing
nothing of the core but :mod:`.errors` and :mod:`.request`, so the modules
that use them import them at the top instead of inside hot functions.
"""
from __future__ import annotations

from ._pybuffer import BufferExporter
from .errors import InvalidBuffer
from .request import Request

__all__ = ["send_view", "recv_view", "COMPLETED", "BufferExporter"]

#: ``BufferExporter`` (native/pybuffer.c) is a base class whose Python
#: subclasses export a buffer through the buffer protocol from a
#: ``_buffer_target()`` method returns: how mpi_shim's ``MPI.buffer`` and window
#: memory hand out their bytes without a copy.


def send_view(buf) -> memoryview:
    """A flat byte view of any contiguous buffer-protocol object."""
    try:
        mv = buf if type(buf) is memoryview else memoryview(buf)
        if mv.format == "B" and mv.ndim == 1 and mv.c_contiguous:
            return mv
        return mv.cast("B")
    except TypeError as e:
        raise InvalidBuffer(f"cannot send {type(buf).__name__}: {e}") from None


def recv_view(buf) -> memoryview:
    """A flat writable byte view of a contiguous buffer."""
    try:
        mv = buf if type(buf) is memoryview else memoryview(buf)
        if mv.readonly:
            raise InvalidBuffer(f"receive buffer {type(buf).__name__} is read-only")
        if mv.format == "B" and mv.ndim == 1 and mv.c_contiguous:
            return mv
        return mv.cast("B")
    except TypeError as e:
        raise InvalidBuffer(f"cannot receive into {type(buf).__name__}: {e}") from None


class _Done(Request):
    """The shared already-completed request returned by operations done at once."""

    def __init__(self):
        super().__init__(None)
        self.done = True

    def complete(self, result=None, exc=None):  # never changes
        pass


COMPLETED = _Done()


class PayloadPool:
    """Reusable buffers for the payloads of unexpected eager messages.

    A message that arrives before its receive is copied out of the transport
    (a shm inbox is consumed in order) and kept until a receive matches it.
    Payloads of :attr:`MIN` bytes or more are copied into a buffer of this
    pool (a power-of-two size class; :meth:`copy` returns a view of the
    payload's length) and go back with :meth:`give` once delivered.  Made
    and freed each time, such copies made glibc hand the heap's top back to
    the system and fault it in again: 6 minor faults per rank and repeat of
    an 8-rank all-to-all of 64 KiB (2026-12-05).  At most :attr:`KEEP`
    buffers are kept per class."""

    MIN = 4096
    KEEP = 16

    def __init__(self):
        self._free = {}             # size class -> [bytearray]

    def copy(self, payload):
        """A copy of ``payload``: bytes below :attr:`MIN`, else a memoryview
        of a pool buffer (give it back with :meth:`give`)."""
        n = len(payload)
        if n < self.MIN:
            return bytes(payload)
        size = 1 << (n - 1).bit_length()
        free = self._free.get(size)
        view = memoryview(free.pop() if free else bytearray(size))[:n]
        view[:] = payload
        return view

    def give(self, data) -> None:
        """``data`` (from :meth:`copy`) was delivered: its buffer is free
        again.  Nothing is kept while another view still holds it."""
        if type(data) is not memoryview:
            return
        buf = data.obj
        try:
            data.release()
        except BufferError:         # exported further: not ours to reuse
            return
        free = self._free.setdefault(len(buf), [])
        if len(free) < self.KEEP:
            free.append(buf)

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

"""Buffered sends: ``Attach_buffer`` / ``Bsend`` / ``Detach_buffer``.

A buffered send completes locally: its data are copied into space of the
attached buffer (each message costs its size plus ``BSEND_OVERHEAD``), then
sent from there.  A message that does not fit raises ``ERR_BUFFER`` at the
call.  The space is given back when the transport is done with the copy;
``Detach_buffer`` and ``Flush_buffer`` wait for every buffered message to
leave.  Buffers attach to a communicator, a session or the process
(searched in that order); ``BUFFER_AUTOMATIC`` attaches unlimited space.
"""
from __future__ import annotations

from .engine import ENGINE
from .exceptions import ERR_BUFFER, Exception

BSEND_OVERHEAD = 96


from .msgspec import BUFFER_AUTOMATIC, BufferAutomaticType, byte_view  # noqa: E402,F401
from .ops import CondOp  # noqa: E402
from .request import Request  # noqa: E402


class BsendPool:
    """Space accounting of one attached buffer."""

    __slots__ = ("buf", "capacity", "pending", "used")

    def __init__(self, buf):
        self.buf = buf
        if buf is BUFFER_AUTOMATIC:
            self.capacity = None
        else:
            self.capacity = byte_view(buf)[0].nbytes
        self.pending = []            # (ucxpy request, bytes charged, copy)
        self.used = 0

    def reap(self):
        keep = []
        for item in self.pending:
            if item[0].done:
                self.used -= item[1]
            else:
                keep.append(item)
        self.pending = keep

    def charge(self, nbytes):
        self.reap()
        cost = nbytes + BSEND_OVERHEAD
        if self.capacity is not None and self.used + cost > self.capacity:
            raise Exception(ERR_BUFFER, f"buffered send of {nbytes} bytes does not fit in the "
                                        f"attached buffer ({self.capacity - self.used} of "
                                        f"{self.capacity} bytes free)")
        self.used += cost
        return cost


_process = {"pool": None}


def _scope(c):
    return c.locks if c is not None else _process


def attach(c, buf):
    scope = _scope(c)
    if scope.get("pool") is not None:
        raise Exception(ERR_BUFFER, "a buffer is already attached")
    if buf is not BUFFER_AUTOMATIC:
        try:
            byte_view(buf, writable=True)
        except Exception:
            raise BufferError("cannot attach a read-only buffer") from None
    scope["pool"] = BsendPool(buf)


def detach(c):
    scope = _scope(c)
    pool = scope.get("pool")
    if pool is None:
        raise Exception(ERR_BUFFER, "no buffer is attached")
    ENGINE.wait_until(lambda: all(r.done for r, _, _ in pool.pending))
    scope["pool"] = None
    return pool.buf


def flush(c):
    pool = _scope(c).get("pool")
    if pool is not None:
        ENGINE.wait_until(lambda: all(r.done for r, _, _ in pool.pending))
        pool.reap()


def iflush(c):
    pool = _scope(c).get("pool")
    if pool is None:
        return Request._done_request()
    reqs = [r for r, _, _ in pool.pending]
    return Request._from(CondOp(lambda: all(r.done for r in reqs)))


def pool_for(c) -> BsendPool:
    """The buffer a buffered send on ``c`` uses (communicator, session, process)."""
    pool = c.locks.get("pool")
    if pool is None:
        pool = _process["pool"]
    if pool is None:
        raise Exception(ERR_BUFFER, "buffered send without an attached buffer")
    return pool


def bsend(c, ep, data, tag):
    """Copy ``data`` into attached space and send it; completes locally."""
    pool = pool_for(c)
    copy = bytes(data)
    cost = pool.charge(len(copy))
    req = ep.tag_send_nb(copy, tag)
    if req.done:
        pool.used -= cost
        return req
    pool.pending.append((req, cost, copy))
    return req

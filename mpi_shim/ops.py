"""The internal operations behind ``MPI.Request``.

Theory of operation
-------------------
An ``MPI.Request`` refers to one *operation* with four methods:
``is_done()`` (no progress), ``finish(status)`` (fills the status, raises
``MPI.Exception`` on error, returns the pickle API's object), ``peek(status)``
(the status without completing) and ``cancel()``.  Blocking calls progress
the ucxpy worker until ``is_done()``.  After completion the request becomes
``REQUEST_NULL``; persistent requests become inactive instead.

Operations that need more than one ucxpy message (synchronous sends,
nonblocking collectives) advance
from ucxpy completion callbacks or from a hook run by every
``worker.progress()``, so they progress while the process is blocked in any
other call (MPI's progress rule).
"""
from __future__ import annotations

import pickle

import ucxpy
import ucxpy.coll
from ucxpy.errors import Canceled, TruncationError
from ucxpy.tag import RecvRequest

from .pickling import pickle as mpi_pickle
from .exceptions import ERR_REQUEST, ERR_TRUNCATE, Exception, translate
from .status import ANY_SOURCE, PROC_NULL, Status

UNDEFINED = -32766

from .engine import (CTX_BITS, CTX_MASK, CTX_SHIFT, ENGINE, FULL, KIND_ACK, KIND_CGRP,  # noqa: F401
                     KIND_COLL, KIND_CTRL, KIND_LOCAL, KIND_P2P, KIND_PART, MASK_ANY_TAG,
                     MASK_TAG, SEQ_MASK, SEQ_SHIFT, TAG_UB, USER_MASK)


def send_ack(ureq) -> None:
    """Receive-completion callback: acknowledge a synchronous send.  The
    tag matcher calls it for posted receives (ENGINE.attach); receives of a
    probed message and of a message taken at once add it themselves."""
    if ureq.exc is None:
        tag = ureq.result.tag
        if tag & SEQ_MASK:
            ENGINE.eps[ureq.result.source].tag_send_nb(
                b"", KIND_ACK | (tag & (CTX_MASK | SEQ_MASK)))


def _raise_recv(exc, status):
    if isinstance(exc, Canceled):
        if status is not None:
            status._set(ANY_SOURCE, -1, 0, cancelled=True)
        return
    if isinstance(exc, TruncationError):
        if status is not None:
            status.error = ERR_TRUNCATE
        raise Exception(ERR_TRUNCATE, str(exc)) from None
    raise translate(exc) from None


# -- operations -----------------------------------------------------------------
class _Op:
    __slots__ = ("_hid", "__weakref__")

    def is_done(self):
        return True

    def finish(self, status):
        if status is not None:
            status._clear()
        return None

    def peek(self, status):
        status._clear()

    def cancel(self):
        return False


class CondOp(_Op):
    """Done when ``cond()`` is true (local completion of a bookkeeping wait)."""
    __slots__ = ("cond",)

    def __init__(self, cond):
        self.cond = cond

    def is_done(self):
        return self.cond()


class DoneOp(_Op):
    """Completed at once (PROC_NULL, or data already delivered)."""
    __slots__ = ("source", "tag", "count", "obj")

    def __init__(self, source=PROC_NULL, tag=-1, count=0, obj=None):
        self.source, self.tag, self.count, self.obj = source, tag, count, obj

    def finish(self, status):
        if status is not None:
            status._set(self.source, self.tag, self.count)
        return self.obj

    def peek(self, status):
        status._set(self.source, self.tag, self.count)


class SendOp(_Op):
    """A send; synchronous sends also wait for the receiver's acknowledgement."""
    __slots__ = ("ureq", "ack", "keep")

    def __init__(self, ureq, ack=None, keep=None):
        self.ureq, self.ack, self.keep = ureq, ack, keep

    def is_done(self):
        return self.ureq.done and (self.ack is None or self.ack.done)

    def finish(self, status):
        for r in (self.ureq, self.ack):
            if r is not None and r.exc is not None and not isinstance(r.exc, Canceled):
                raise translate(r.exc) from None
        if status is not None:
            status._clear()
        return None

    def cancel(self):
        if self.ack is not None and not self.ureq.done:
            return self.ureq.cancel()
        return False


def _finish_recv(r, comm, status):
    """Finish the receive of ucxpy request ``r`` on ``comm``: raise its
    error, or fill ``status``."""
    if r.exc is not None:
        return _raise_recv(r.exc, status)
    if status is not None:
        info = r.result
        status._set(comm._source_rank(info.source), info.tag & USER_MASK, info.length)
    return None


def _peek_recv(r, comm, status):
    """The status of the receive of ucxpy request ``r`` on ``comm``, left as it is."""
    if r.exc is not None or r.result is None:
        status._clear()
        if isinstance(r.exc, Canceled):
            status._set(ANY_SOURCE, -1, 0, cancelled=True)
        return
    info = r.result
    status._set(comm._source_rank(info.source), info.tag & USER_MASK, info.length)


class RecvOp(_Op):
    """A buffer receive posted in ucxpy's tag matcher, of any datatype:
    ``staging`` (a contiguous copy, unpacked into ``msg`` at finish) or the
    buffer itself."""
    __slots__ = ("ureq", "comm", "msg", "staging")

    def __init__(self, ureq, comm, msg=None, staging=None):
        self.ureq, self.comm, self.msg, self.staging = ureq, comm, msg, staging

    def is_done(self):
        return self.ureq.done

    def finish(self, status):
        if self.staging is not None and self.ureq.exc is None:
            self.msg.unpack(self.staging, self.ureq.result.length)
        return _finish_recv(self.ureq, self.comm, status)

    def peek(self, status):
        _peek_recv(self.ureq, self.comm, status)

    def cancel(self):
        return self.ureq.cancel()


class PostedRecv(RecvRequest):
    """``Irecv``'s common case (a whole contiguous buffer of a predefined
    type): the operation is ucxpy's receive request itself, posted with
    ``request_class=PostedRecv``, with the communicator in a slot of its own
    (as UCP's ``request_size`` lets an MPI library keep its fields in UCP's
    request).  One object per receive instead of a RecvOp and its request;
    ``cancel()`` is the request's."""
    __slots__ = ("comm", "_hid")

    @property
    def ureq(self):
        return self

    def is_done(self):
        return self.done

    def finish(self, status):
        return _finish_recv(self, self.comm, status)

    def peek(self, status):
        _peek_recv(self, self.comm, status)


class PickleRecvOp(_Op):
    """A pickled receive: a receive of any size posted in ucxpy's tag
    matcher (:meth:`ucxpy.Worker.tag_recv_any_nb`: its buffer is made at
    the match, in order with every other receive), unpickled at finish.  A
    synchronous send is acknowledged by the matcher's notify hook
    (``ENGINE.attach``); a revoke or a peer's failure fails it as it fails
    any posted receive.  A caller's ``buf`` is not needed: the message
    always fits."""
    __slots__ = ("comm", "ureq")

    def __init__(self, comm, src, tag, mask, buf=None):
        self.comm = comm
        try:
            self.ureq = ENGINE.worker.tag_recv_any_nb(tag, mask, src)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None

    def is_done(self):
        return self.ureq.done

    def finish(self, status):
        r = self.ureq
        if r.exc is not None:
            return _raise_recv(r.exc, status)
        info = r.result
        if status is not None:
            status._set(self.comm._source_rank(info.source), info.tag & USER_MASK, info.length)
        return _loads(memoryview(r.buf)[:info.length]) if info.length else None

    peek = RecvOp.peek

    def cancel(self):
        return self.ureq.cancel()


def _loads(data):
    return mpi_pickle.loads(data)


def _coll_name(gen) -> str:
    """``g_allreduce`` / ``_g_Allreduce`` -> ``allreduce`` / ``Allreduce``."""
    name = getattr(gen, "__name__", "collective")
    return name[3:] if name.startswith("_g_") else name[2:] if name.startswith("g_") else name


def _algorithm(gen) -> str:
    """The innermost algorithm generator ``gen`` is running (``yield from``):
    mpi_shim's ``g_*`` ones, or the collective engine's (ucxpy.coll)."""
    g, algo = gen, _coll_name(gen)
    while getattr(g, "gi_yieldfrom", None) is not None:
        g = g.gi_yieldfrom
        name = getattr(g, "__name__", "")
        if name.startswith("g_"):
            algo = name[2:]
        elif getattr(g, "gi_code", None) is not None and \
                g.gi_code.co_filename == ucxpy.coll.__file__:
            algo = name
    return algo


def _trace_begin(gen, blocking):
    """A trace span for a collective (``ucxpy.trace.NO_SPAN`` when not tracing)."""
    w = ENGINE.worker
    if w is None or w.tr is None:
        return ucxpy.trace.NO_SPAN
    return ucxpy.trace.begin(w, "coll", _coll_name(gen), blocking=blocking)


class GenOp(_Op):
    """A nonblocking collective: the engine's :class:`ucxpy.coll.CollRequest`
    (the generator resumed from completion callbacks when all requests of
    its round are done), with its trace span and MPI's errors."""
    __slots__ = ("req",)

    def __init__(self, gen):
        span = _trace_begin(gen, False)
        traced = span is not ucxpy.trace.NO_SPAN
        started = []

        def start():                # (the first round is posted: the algorithm shows)
            started.append(True)
            span.set(algorithm=_algorithm(gen))
        try:
            # argument errors (raised before the first message) surface at the call
            self.req = ucxpy.coll.CollRequest(ENGINE.worker, gen, start if traced else None)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None
        if traced:
            if started:
                self.req.add_done_callback(lambda _r: ucxpy.trace.end(span))
            else:                   # (done without a message)
                ucxpy.trace.end(span, algorithm=_coll_name(gen))

    def is_done(self):
        return self.req.done

    def finish(self, status):
        if self.req.exc is not None:
            raise translate(self.req.exc) from None
        if status is not None:
            status._clear()
        return self.req.result


def run(gen):
    """Run a collective generator to completion, blocking."""
    span = _trace_begin(gen, True)
    try:
        reqs = gen.send(None)
        if span is not ucxpy.trace.NO_SPAN:
            span.set(algorithm=_algorithm(gen))
        while True:
            if not all(r.done for r in reqs):
                ENGINE.wait_until(lambda: all(r.done for r in reqs), on_events=True)
            exc = ucxpy.coll.round_error(reqs)
            reqs = gen.throw(exc) if exc is not None else gen.send(None)
    except StopIteration as e:
        return e.value
    except ucxpy.UcxpyError as e:
        span.set(error=type(e).__name__)
        raise translate(e) from None
    finally:
        ucxpy.trace.end(span)

"""The progress engine and the internal operations behind ``MPI.Request``.

Theory of operation
-------------------
An ``MPI.Request`` wraps one internal *operation* (``_op``) with three
methods: ``is_done()`` (no progress), ``finish(status)`` (fills the status,
raises ``MPI.Exception`` on error, returns the lowercase API's object) and
``cancel()``.  Blocking calls progress the ucxpy worker until ``is_done()``.
After completion the request becomes ``REQUEST_NULL`` (``_op is None``);
persistent requests become inactive instead.

Operations that need more than one ucxpy message (synchronous sends,
pickled receives whose size is unknown, nonblocking collectives) advance
from ucxpy completion callbacks or from a hook run by every
``worker.progress()``, so they progress while the process is blocked in any
other call (MPI's progress rule).
"""
from __future__ import annotations

import pickle

import ucxpy
from ucxpy.errors import Canceled, TruncationError

from .exceptions import ERR_REQUEST, ERR_TRUNCATE, Exception, translate
from .status import ANY_SOURCE, PROC_NULL, Status

UNDEFINED = -32766

# -- tag layout (64-bit ucxpy tags; the top byte 0xFF is ucxpy's) -------------
USER_BITS = 31
USER_MASK = (1 << USER_BITS) - 1                   # bits 0..30: MPI tag
CTX_SHIFT, CTX_BITS = 31, 20                       # bits 31..50: context id
CTX_MASK = ((1 << CTX_BITS) - 1) << CTX_SHIFT
SEQ_SHIFT, SEQ_BITS = 51, 9                        # bits 51..59: ssend sequence
SEQ_MASK = ((1 << SEQ_BITS) - 1) << SEQ_SHIFT
KIND_SHIFT = 60                                    # bits 60..62: traffic kind
KIND_P2P, KIND_COLL, KIND_ACK = 0, 1 << KIND_SHIFT, 2 << KIND_SHIFT
FULL = 0xFFFF_FFFF_FFFF_FFFF
MASK_TAG = FULL & ~SEQ_MASK                        # exact tag, any ssend sequence
MASK_ANY_TAG = FULL & ~SEQ_MASK & ~USER_MASK
TAG_UB = USER_MASK


class Engine:
    """Per-process state shared by all communicators."""

    def __init__(self):
        self.world = None
        self.worker = None
        self.eps = None
        self.probing = []            # pickled receives waiting for a message, in post order
        self.anysize = []            # collective receives of unknown size: [src, tag, ureq]

    def attach(self, world):
        self.world = world
        self.worker = world.worker
        self.eps = world.eps
        # Every progress call (blocking calls, Test, Request.wait) also serves
        # the receives that wait for a matching message to arrive.
        inner = self.worker.progress
        probes = self._progress_probes

        def progress():
            n = inner()
            if self.probing or self.anysize:
                n += probes()
            return n
        self.worker.progress = progress

    def _progress_probes(self) -> int:
        n = 0
        if self.probing:
            for op in list(self.probing):
                if op.try_match():
                    n += 1
        if self.anysize:
            for item in list(self.anysize):
                if self.match_anysize(item):
                    self.anysize.remove(item)
                    n += 1
        return n

    def recv_anysize(self, src: int, tag: int):
        """A ucxpy Request completing with a bytearray holding the message
        from world rank ``src`` with exactly ``tag``, whatever its size."""
        item = [src, tag, ucxpy.Request(self.worker)]
        if not self.match_anysize(item):
            self.anysize.append(item)
        return item[2]

    def match_anysize(self, item) -> bool:
        src, tag, req = item
        w = self.worker
        m = w.matcher.find_unexpected(src, tag, FULL, True)
        if m is None:
            return False
        buf = bytearray(m.length)
        if not m.length:
            req.complete(buf)
            return True
        r = w.tag_recv_message_nb(buf, ucxpy.TagMessage(m))
        r.add_done_callback(lambda r: req.complete(buf if r.exc is None else None, r.exc))
        return True

    def wait(self, op) -> None:
        if not op.is_done():
            try:
                self.worker.wait_until(op.is_done, None, "MPI request")
            except ucxpy.UcxpyError as e:
                raise translate(e) from None

    def wait_until(self, cond) -> None:
        if not cond():
            try:
                self.worker.wait_until(cond, None, "MPI request")
            except ucxpy.UcxpyError as e:
                raise translate(e) from None

    def progress(self) -> None:
        try:
            self.worker.progress()
        except ucxpy.UcxpyError as e:
            raise translate(e) from None


ENGINE = Engine()


def send_ack(ureq) -> None:
    """Receive-completion callback: acknowledge a synchronous send."""
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
    __slots__ = ()

    def is_done(self):
        return True

    def finish(self, status):
        if status is not None:
            status._clear()
        return None

    def cancel(self):
        return False


class DoneOp(_Op):
    """Completed at once (PROC_NULL, or data already delivered)."""
    __slots__ = ("source", "tag", "count", "obj")

    def __init__(self, source=PROC_NULL, tag=-1, count=0, obj=None):
        self.source, self.tag, self.count, self.obj = source, tag, count, obj

    def finish(self, status):
        if status is not None:
            status._set(self.source, self.tag, self.count)
        return self.obj


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


class RecvOp(_Op):
    """A buffer receive posted in ucxpy's tag matcher."""
    __slots__ = ("ureq", "comm", "msg", "staging")

    def __init__(self, ureq, comm, msg=None, staging=None):
        self.ureq, self.comm, self.msg, self.staging = ureq, comm, msg, staging
        ureq.add_done_callback(send_ack)

    def is_done(self):
        return self.ureq.done

    def finish(self, status):
        r = self.ureq
        if r.exc is not None:
            return _raise_recv(r.exc, status)
        info = r.result
        if self.staging is not None:
            self.msg.unpack(self.staging, info.length)
        if status is not None:
            status._set(self.comm._rank_of_world(info.source), info.tag & USER_MASK, info.length)
        return None

    def cancel(self):
        return self.ureq.cancel()


class PickleRecvOp(_Op):
    """A pickled receive: waits (in post order) for a matching message by
    matched probe, then receives it into a buffer of the right size."""
    __slots__ = ("comm", "src", "tag", "mask", "buf", "ureq", "info", "cancelled", "__weakref__")

    def __init__(self, comm, src, tag, mask, buf=None):
        self.comm, self.src, self.tag, self.mask, self.buf = comm, src, tag, mask, buf
        self.ureq = self.info = None
        self.cancelled = False
        if not ENGINE.probing and self.try_match():
            return
        ENGINE.probing.append(self)

    def try_match(self) -> bool:
        w = ENGINE.worker
        m = w.matcher.find_unexpected(self.src, self.tag, self.mask, True)
        if m is None:
            return False
        msg = ucxpy.TagMessage(m)
        n = msg.info.length
        buf = self.buf
        if buf is None or isinstance(buf, int) or memoryview(buf).nbytes < n:
            buf = bytearray(n)
        self.buf = buf
        self.info = msg.info
        self.ureq = w.tag_recv_message_nb(buf, msg) if n else None
        if self.ureq is None:
            send_ack(_FakeReq(msg.info))
        else:
            self.ureq.add_done_callback(send_ack)
        try:
            ENGINE.probing.remove(self)
        except ValueError:
            pass
        return True

    def is_done(self):
        return self.cancelled or (self.info is not None and (self.ureq is None or self.ureq.done))

    def finish(self, status):
        if self.cancelled:
            return _raise_recv(Canceled("cancelled"), status)
        if self.ureq is not None and self.ureq.exc is not None:
            return _raise_recv(self.ureq.exc, status)
        info = self.info
        if status is not None:
            status._set(self.comm._rank_of_world(info.source), info.tag & USER_MASK, info.length)
        return pickle.loads(memoryview(self.buf)[:info.length]) if info.length else None

    def cancel(self):
        if self.info is None:
            try:
                ENGINE.probing.remove(self)
            except ValueError:
                return False
            self.cancelled = True
            return True
        return False


class _FakeReq:
    __slots__ = ("exc", "result")

    def __init__(self, info):
        self.exc, self.result = None, info


class GenOp(_Op):
    """A nonblocking collective: a generator yielding lists of ucxpy requests,
    resumed from completion callbacks when all of them are done."""
    __slots__ = ("gen", "done", "exc", "result", "left", "reqs")

    def __init__(self, gen):
        self.gen, self.done, self.exc, self.result = gen, False, None, None
        self.left, self.reqs = 0, ()
        self._step()

    def _step(self):
        gen = self.gen
        try:
            exc = next((r.exc for r in self.reqs if r.exc is not None), None)
            reqs = gen.throw(exc) if exc is not None else gen.send(None)
            while True:
                pending = [r for r in reqs if not r.done]
                if pending:
                    self.reqs, self.left = reqs, len(pending)
                    for r in pending:
                        r.add_done_callback(self._one)
                    return
                exc = next((r.exc for r in reqs if r.exc is not None), None)
                reqs = gen.throw(exc) if exc is not None else gen.send(None)
        except StopIteration as e:
            self.result = e.value
        except BaseException as e:      # reported by Wait/Test
            self.exc = e
        self.done, self.reqs, self.gen = True, (), None

    def _one(self, _r):
        self.left -= 1
        if self.left == 0:
            self._step()

    def is_done(self):
        return self.done

    def finish(self, status):
        if self.exc is not None:
            raise translate(self.exc) from None
        if status is not None:
            status._clear()
        return self.result


def run(gen):
    """Run a collective generator to completion, blocking."""
    try:
        reqs = gen.send(None)
        while True:
            for r in reqs:
                if not r.done:
                    r.wait()
                elif r.exc is not None:
                    raise r.exc
            reqs = gen.send(None)
    except StopIteration as e:
        return e.value
    except ucxpy.UcxpyError as e:
        raise translate(e) from None


_INACTIVE = _Op()

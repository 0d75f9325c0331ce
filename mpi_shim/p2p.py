"""Point-to-point: the buffer API (``Send``/``Recv``...) and the pickle API
(``send``/``recv``...), as a mixin of :class:`~mpi_shim.comm.Comm`.

Ranks name processes of the communicator's peer group (the remote group of
an intercommunicator).  Synchronous sends carry a nonzero sequence number in
the tag; the receiver acknowledges it when the receive completes (ucxpy's
tag matcher calls :func:`.ops.send_ack` for such matches), and the send
completes only then.
Buffered sends copy into the attached buffer (:mod:`.bsend`).
"""
from __future__ import annotations

import warnings

import ucxpy

from .msgspec import parse
from ucxpy.buffers import COMPLETED

from . import bsend as _bsend
from .engine import (CTX_MASK, ENGINE, FULL, KIND_ACK, MASK_ANY_TAG, MASK_TAG, SEQ_MASK,
                     SEQ_SHIFT, TAG_UB, USER_MASK)
from .exceptions import ERR_RANK, ERR_REQUEST, ERR_TAG, Exception, translate
from .handle import Handle, register_family
from .msgspec import _PLAIN_FORMATS, _PLAIN_TYPES
from .ops import DoneOp, PickleRecvOp, PostedRecv, RecvOp, SendOp, send_ack
from .pickling import Pickle, pickle  # noqa: F401 - MPI.Pickle, MPI.pickle
from .request import Request, make_prequest
from .status import ANY_SOURCE, ANY_TAG, PROC_NULL

_ACK = bytearray(0)
#: the operation of every send the transport took at once (stateless, shared)
_SENT = SendOp(COMPLETED)




def _dumps(obj):
    return pickle.dumps(obj)


def _loads(data):
    return pickle.loads(data)


class MessageImpl:
    __slots__ = ("comm", "m", "predefined", "_hid", "__weakref__")

    def __init__(self, comm, m, predefined=False):
        self.comm, self.m, self.predefined = comm, m, predefined


class Message(Handle):
    """Matched message (from a matched probe: ``Mprobe``/``Improbe``)."""

    __slots__ = ()

    def __reduce__(self):
        if self._h is not None and not self._h.predefined:
            raise ValueError("cannot serialize a matched message")
        return super().__reduce__()

    def _take(self):
        h = self._h
        if h is None:
            raise Exception(ERR_REQUEST, "invalid message (MESSAGE_NULL)")
        if not self._const:
            self._h = None
        return h.comm, h.m

    def Recv(self, buf, status=None) -> None:
        """Blocking receive of the matched message."""
        self.Irecv(buf).Wait(status)

    def Irecv(self, buf):
        """Nonblocking receive of the matched message."""
        comm, m = self._take()
        if m is None:
            if buf is not None:
                parse(buf, writable=True)
            return Request._from(DoneOp())
        msg = parse(buf, writable=True)
        dst = msg.contig()
        staging = None
        if dst is None:
            staging = dst = bytearray(msg.nbytes)
        return Request._from(RecvOp(_recv_message(m, dst), comm, msg, staging))

    def recv(self, status=None):
        """Blocking receive of the matched message (pickled object)."""
        return self.irecv().wait(status)

    def irecv(self):
        """Nonblocking receive of the matched message (pickled object)."""
        comm, m = self._take()
        if m is None:
            return Request._from(DoneOp())
        buf = bytearray(m.info.length)
        return Request._from(_PickledMessageOp(_recv_message(m, buf), comm, buf))

    @classmethod
    def Probe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Blocking matched probe on ``comm``."""
        return comm.Mprobe(source, tag, status)

    @classmethod
    def Iprobe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Nonblocking matched probe on ``comm`` (None when nothing matches)."""
        return comm.Improbe(source, tag, status)

    @classmethod
    def probe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Blocking matched probe on ``comm`` (pickle API)."""
        return comm.mprobe(source, tag, status)

    @classmethod
    def iprobe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Nonblocking matched probe on ``comm`` (pickle API)."""
        return comm.improbe(source, tag, status)


def _recv_message(m, buf):
    try:
        ureq = ENGINE.worker.tag_recv_message_nb(buf, m)
    except ucxpy.UcxpyError as e:
        raise translate(e) from None
    ureq.add_done_callback(send_ack)        # (not a posted receive: see send_ack)
    return ureq


class _PickledMessageOp(RecvOp):
    __slots__ = ()

    def __init__(self, ureq, comm, buf):
        super().__init__(ureq, comm, None, None)
        self.msg = buf

    def finish(self, status):
        super().finish(status)
        n = self.ureq.result.length
        return _loads(memoryview(self.msg)[:n]) if n else None


MESSAGE_NULL = Message._constant(None)
MESSAGE_NO_PROC = Message._constant(MessageImpl(None, None, predefined=True))
register_family(Message)


class P2P:
    """Point-to-point methods of ``Comm``."""

    __slots__ = ()

    # -- addressing ------------------------------------------------------------
    def _dest(self, dest, tag):
        c = self._h
        if c is None or c.revoked:
            self._impl()
        if not (0 <= tag <= TAG_UB):
            raise Exception(ERR_TAG, f"invalid tag {tag}")
        try:
            if dest < 0:
                raise IndexError
            return c, c.eps[dest]
        except (IndexError, TypeError):
            raise Exception(ERR_RANK, f"invalid destination rank {dest}") from None

    def _match(self, source, tag):
        """(ucxpy tag, mask, source wid) of a receive."""
        c = self._h
        if c is None or c.revoked:
            self._impl()
        if tag == ANY_TAG:
            t, mask = c.p2p, MASK_ANY_TAG
        elif 0 <= tag <= TAG_UB:
            t, mask = c.p2p | tag, MASK_TAG
        else:
            raise Exception(ERR_TAG, f"invalid tag {tag}")
        if source == ANY_SOURCE:
            return t, mask, -1
        if 0 <= source < len(c.peers):
            return t, mask, c.peers[source]
        raise Exception(ERR_RANK, f"invalid source rank {source}")

    # -- sends -------------------------------------------------------------------
    def _isend(self, data, dest, tag, mode, keep=None):
        """``mode``: "" (standard/ready), "s" (synchronous), "b" (buffered)."""
        c, ep = self._dest(dest, tag)
        try:
            if not mode:
                return SendOp(ep.tag_send_nb(data, c.p2p | tag), None, keep)
            if mode == "b":
                _bsend.bsend(c, ep, data, c.p2p | tag)
                return DoneOp()
            c.ssend_seq = c.ssend_seq % 511 + 1
            seq = c.ssend_seq << SEQ_SHIFT
            ack = ENGINE.worker.tag_recv_nb(_ACK, KIND_ACK | c.p2p | seq, FULL, c.peers[dest])
            return SendOp(ep.tag_send_nb(data, c.p2p | seq | tag), ack, keep)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None

    def _send_op(self, buf, dest, tag, mode):
        if dest == PROC_NULL:
            self._impl()
            if buf is not None:
                parse(buf)
            return DoneOp()
        m = parse(buf)
        data = m.contig()
        if data is None:
            data = m.pack()
        return self._isend(data, dest, tag, mode, data)

    def _plain_send(self, buf, dest, tag):
        """The common case of a standard send in one pass, checking what
        parse() and _dest() would: a whole contiguous buffer of a predefined
        type to a rank goes straight to ucxpy (its request, and the buffer
        view it must keep), else None."""
        c = self._h
        if type(buf) in _PLAIN_TYPES and type(dest) is int and type(tag) is int \
                and c is not None and not c.revoked and 0 <= tag <= TAG_UB \
                and 0 <= dest < len(c.eps):
            mv = memoryview(buf)
            if mv.nbytes and mv.c_contiguous and _PLAIN_FORMATS.get(mv.format) is not None:
                try:
                    return c.eps[dest].tag_send_nb(mv, c.p2p | tag), mv
                except ucxpy.UcxpyError as e:
                    raise translate(e) from None
        return None

    def Send(self, buf, dest: int, tag: int = 0) -> None:
        """Blocking send."""
        sent = self._plain_send(buf, dest, tag)
        if sent is not None:
            if sent[0] is not COMPLETED:
                try:
                    sent[0].wait()
                except ucxpy.UcxpyError as e:
                    raise translate(e) from None
            return
        if dest == PROC_NULL:
            self._send_op(buf, dest, tag, "")
            return
        c, ep = self._dest(dest, tag)
        m = parse(buf)
        data = m.contig()
        if data is None:
            data = m.pack()
        try:
            ep.tag_send(data, c.p2p | tag)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None

    def Rsend(self, buf, dest: int, tag: int = 0) -> None:
        """Blocking send in ready mode."""
        self.Send(buf, dest, tag)

    def Bsend(self, buf, dest: int, tag: int = 0) -> None:
        """Blocking send in buffered mode."""
        self._send_op(buf, dest, tag, "b")

    def Ssend(self, buf, dest: int, tag: int = 0) -> None:
        """Blocking send in synchronous mode."""
        ENGINE.wait(op := self._send_op(buf, dest, tag, "s"))
        op.finish(None)

    def Isend(self, buf, dest: int, tag: int = 0):
        """Nonblocking send."""
        sent = self._plain_send(buf, dest, tag)
        if sent is not None:
            req, mv = sent
            return Request._wrap(_SENT if req is COMPLETED else SendOp(req, None, mv))
        return Request._from(self._send_op(buf, dest, tag, ""))

    def Irsend(self, buf, dest: int, tag: int = 0):
        """Nonblocking send in ready mode."""
        return self.Isend(buf, dest, tag)

    def Ibsend(self, buf, dest: int, tag: int = 0):
        """Nonblocking send in buffered mode."""
        return Request._from(self._send_op(buf, dest, tag, "b"))

    def Issend(self, buf, dest: int, tag: int = 0):
        """Nonblocking send in synchronous mode."""
        return Request._from(self._send_op(buf, dest, tag, "s"))

    # -- receives ------------------------------------------------------------------
    def _irecv_op(self, buf, source, tag, now=False):
        """The receive operation; ``now`` (a blocking receive) first tries
        ucxpy's native fast path, which takes the message at once when it is
        the next frame from ``source`` and nothing else could match it."""
        if source == PROC_NULL:
            self._impl()
            if buf is not None:
                parse(buf, writable=True)
            return DoneOp()
        t, mask, src = self._match(source, tag)
        m = parse(buf, writable=True)
        dst = m.contig()
        staging = None
        if dst is None:
            staging = dst = bytearray(m.nbytes)
        w = ENGINE.worker
        if now and src >= 0:
            info = w.tag_try_recv(dst, t, mask, src)
            if info is not None:
                ureq = ucxpy.Request(w)
                ureq.complete(info)
                send_ack(ureq)
                return RecvOp(ureq, self, m, staging)
        try:
            ureq = w.tag_recv_nb(dst, t, mask, src)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None
        return RecvOp(ureq, self, m, staging)

    def Recv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None) -> None:
        """Blocking receive."""
        c = self._h
        if type(buf) in _PLAIN_TYPES and type(source) is int and type(tag) is int \
                and c is not None and not c.revoked and 0 <= source < len(c.peers) \
                and (0 <= tag <= TAG_UB or tag == ANY_TAG):
            # the common case in one pass (what _match() and parse() check):
            # ucxpy's native fast path takes the message at once when it is
            # the next frame from ``source`` and nothing else could match it
            mv = memoryview(buf)
            if mv.nbytes and mv.c_contiguous and not mv.readonly \
                    and _PLAIN_FORMATS.get(mv.format) is not None:
                if tag == ANY_TAG:
                    info = ENGINE.worker.tag_try_recv(mv, c.p2p, MASK_ANY_TAG, c.peers[source])
                else:
                    info = ENGINE.worker.tag_try_recv(mv, c.p2p | tag, MASK_TAG, c.peers[source])
                if info is not None:
                    got = info.tag
                    if got & SEQ_MASK:          # a synchronous send: acknowledge it
                        _recv_ack(c, source, got)
                    if status is not None:
                        status._set(source, got & USER_MASK, info.length)
                    return
                _recv_wait(self, buf, source, tag, status)
                return
        op = self._irecv_op(buf, source, tag, now=True)
        ENGINE.wait(op)
        op.finish(status)

    def Irecv(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG):
        """Nonblocking receive."""
        c = self._h
        if type(buf) in _PLAIN_TYPES and type(source) is int and type(tag) is int \
                and c is not None and not c.revoked and 0 <= source < len(c.peers) \
                and 0 <= tag <= TAG_UB:
            # the common case in one pass (what _match() and parse() check)
            mv = memoryview(buf)
            if mv.nbytes and mv.c_contiguous and not mv.readonly \
                    and _PLAIN_FORMATS.get(mv.format) is not None:
                try:
                    op = ENGINE.worker.tag_recv_nb(mv, c.p2p | tag, MASK_TAG, c.peers[source],
                                                   PostedRecv)
                except ucxpy.UcxpyError as e:
                    raise translate(e) from None
                op.comm = self
                return Request._wrap(op)
        return Request._from(self._irecv_op(buf, source, tag))

    def Sendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status=None) -> None:
        """Send and receive a message."""
        sendbuf, recvbuf = _parse_pair(sendbuf, recvbuf)
        r = self._irecv_op(recvbuf, source, recvtag)
        s = self._send_op(sendbuf, dest, sendtag, "")
        ENGINE.wait_until(lambda: s.is_done() and r.is_done())
        s.finish(None)
        r.finish(status)

    def Isendrecv(self, sendbuf, dest: int, sendtag: int = 0, recvbuf=None,
                  source: int = ANY_SOURCE, recvtag: int = ANY_TAG):
        """Nonblocking send and receive."""
        sendbuf, recvbuf = _parse_pair(sendbuf, recvbuf)
        r = self._irecv_op(recvbuf, source, recvtag)
        s = self._send_op(sendbuf, dest, sendtag, "")
        return Request._from(_PairOp(s, r))

    def Sendrecv_replace(self, buf, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                         recvtag: int = ANY_TAG, status=None) -> None:
        """Send and receive a message, using one buffer for both."""
        self.Isendrecv_replace(buf, dest, sendtag, source, recvtag).Wait(status)

    def Isendrecv_replace(self, buf, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                          recvtag: int = ANY_TAG):
        """Nonblocking send and receive with one buffer."""
        m = parse(buf, writable=True)
        if dest != PROC_NULL:
            data = bytes(m.pack())
            s = self._isend(data, dest, sendtag, "", data)
        else:
            self._impl()
            s = DoneOp()
        r = self._irecv_op(buf, source, recvtag)
        return Request._from(_PairOp(s, r))

    # -- persistent ------------------------------------------------------------------
    def Send_init(self, buf, dest: int, tag: int = 0):
        """Create a persistent request for a standard send."""
        return self._persistent(lambda: self._send_op(buf, dest, tag, ""), buf, dest, tag)

    def Bsend_init(self, buf, dest: int, tag: int = 0):
        """Create a persistent request for a buffered send."""
        return self._persistent(lambda: self._send_op(buf, dest, tag, "b"), buf, dest, tag)

    def Rsend_init(self, buf, dest: int, tag: int = 0):
        """Create a persistent request for a ready send."""
        return self.Send_init(buf, dest, tag)

    def Ssend_init(self, buf, dest: int, tag: int = 0):
        """Create a persistent request for a synchronous send."""
        return self._persistent(lambda: self._send_op(buf, dest, tag, "s"), buf, dest, tag)

    def Recv_init(self, buf, source: int = ANY_SOURCE, tag: int = ANY_TAG):
        """Create a persistent request for a receive."""
        if source != PROC_NULL:
            self._match(source, tag)
        else:
            self._impl()
        if buf is not None:
            parse(buf, writable=True)
        return make_prequest(lambda: self._irecv_op(buf, source, tag))

    def _persistent(self, start, buf, dest, tag):
        if dest != PROC_NULL:
            self._dest(dest, tag)
        else:
            self._impl()
        if buf is not None:
            parse(buf)
        return make_prequest(start)

    # -- probes ----------------------------------------------------------------------
    def _status_of(self, info, status):
        if status is not None:
            status._set(self._h.srcmap.get(info.source, info.source), info.tag & TAG_UB,
                        info.length)

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        """Blocking test for a message."""
        if source == PROC_NULL:
            self._impl()
            if status is not None:
                status._set(PROC_NULL, ANY_TAG, 0)
            return True
        t, mask, src = self._match(source, tag)
        try:
            info = ENGINE.worker.tag_probe(t, mask, src) if ENGINE.lock is None else \
                _probe_unlocked(t, mask, src, False)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None
        self._status_of(info, status)
        return True

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None) -> bool:
        """Nonblocking test for a message."""
        if source == PROC_NULL:
            return self.Probe(source, tag, status)
        t, mask, src = self._match(source, tag)
        ENGINE.progress()
        info = ENGINE.worker.tag_peek(t, mask, src)
        if info is None:
            return False
        self._status_of(info, status)
        return True

    def Mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        """Blocking test for a matched message."""
        if source == PROC_NULL:
            self.Probe(source, tag, status)
            return Message(MESSAGE_NO_PROC)
        t, mask, src = self._match(source, tag)
        try:
            m = ENGINE.worker.tag_probe(t, mask, src, remove=True) if ENGINE.lock is None else \
                _probe_unlocked(t, mask, src, True)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None
        return self._message(m, status)

    def Improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        """Nonblocking test for a matched message."""
        if source == PROC_NULL:
            self.Probe(source, tag, status)
            return Message(MESSAGE_NO_PROC)
        t, mask, src = self._match(source, tag)
        ENGINE.progress()
        m = ENGINE.worker.tag_peek(t, mask, src, remove=True)
        return None if m is None else self._message(m, status)

    def _message(self, m, status):
        self._status_of(m.info, status)
        return Message._wrap(MessageImpl(self, m))

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        """Blocking test for a message (pickle API)."""
        return self.Probe(source, tag, status)

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        """Nonblocking test for a message (pickle API)."""
        return self.Iprobe(source, tag, status)

    def mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        """Blocking test for a matched message (pickle API)."""
        return self.Mprobe(source, tag, status)

    def improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        """Nonblocking test for a matched message (pickle API)."""
        return self.Improbe(source, tag, status)

    # -- pickle API ----------------------------------------------------------------
    def _isend_obj(self, obj, dest, tag, mode):
        if dest == PROC_NULL:
            self._impl()
            return Request._from(DoneOp())
        self._dest(dest, tag)
        data = _dumps(obj)
        return Request._from(self._isend(data, dest, tag, mode, data))

    def send(self, obj, dest: int, tag: int = 0) -> None:
        """Send a Python object."""
        self._isend_obj(obj, dest, tag, "").Wait()

    def bsend(self, obj, dest: int, tag: int = 0) -> None:
        """Send a Python object in buffered mode."""
        self._isend_obj(obj, dest, tag, "b").Wait()

    def ssend(self, obj, dest: int, tag: int = 0) -> None:
        """Send a Python object in synchronous mode."""
        self._isend_obj(obj, dest, tag, "s").Wait()

    def isend(self, obj, dest: int, tag: int = 0):
        """Nonblocking send of a Python object."""
        return self._isend_obj(obj, dest, tag, "")

    def ibsend(self, obj, dest: int, tag: int = 0):
        """Nonblocking send of a Python object in buffered mode."""
        return self._isend_obj(obj, dest, tag, "b")

    def issend(self, obj, dest: int, tag: int = 0):
        """Nonblocking send of a Python object in synchronous mode."""
        return self._isend_obj(obj, dest, tag, "s")

    def _irecv_obj(self, buf, source, tag):
        if source == PROC_NULL:
            self._impl()
            return DoneOp()
        t, mask, src = self._match(source, tag)
        return PickleRecvOp(self, src, t, mask, buf)

    def recv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG, status=None):
        """Receive a Python object."""
        if buf is not None:
            warnings.warn("recv(): the buf argument is ignored (received objects are "
                          "allocated to fit)", UserWarning, stacklevel=2)
        op = self._irecv_obj(buf, source, tag)
        ENGINE.wait(op)
        return op.finish(status)

    def irecv(self, buf=None, source: int = ANY_SOURCE, tag: int = ANY_TAG):
        """Nonblocking receive of a Python object."""
        return Request._from(self._irecv_obj(buf, source, tag))

    def sendrecv(self, sendobj, dest: int, sendtag: int = 0, recvbuf=None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status=None):
        """Send and receive a Python object."""
        r = self._irecv_obj(recvbuf, source, recvtag)
        s = self._isend_obj(sendobj, dest, sendtag, "")
        s.Wait()
        ENGINE.wait(r)
        return r.finish(status)

    def isendrecv(self, sendobj, dest: int, sendtag: int = 0, recvbuf=None,
                  source: int = ANY_SOURCE, recvtag: int = ANY_TAG):
        """Nonblocking send and receive of a Python object."""
        r = self._irecv_obj(recvbuf, source, recvtag)
        s = self._isend_obj(sendobj, dest, sendtag, "")._h
        return Request._from(_PairOp(s, r))


def _parse_pair(sendbuf, recvbuf):
    """Both messages of a send-receive, parsed before either is posted (a
    bad spec raises before anything is left behind)."""
    return (parse(sendbuf) if sendbuf is not None else None,
            parse(recvbuf, writable=True) if recvbuf is not None else None)


def _probe_unlocked(t, mask, src, remove):
    """Blocking probe that lets other threads progress meanwhile."""
    w = ENGINE.worker
    found = []

    def cond():
        with ENGINE.lock:
            m = w.tag_peek(t, mask, src, remove)
        if m is not None:
            found.append(m)
            return True
        return False
    ENGINE.wait_until(cond)
    return found[0]


class _PairOp:
    """A send and a receive completing as one request (the receive's result)."""
    __slots__ = ("s", "r")

    def __init__(self, s, r):
        self.s, self.r = s, r

    def is_done(self):
        return self.s.is_done() and self.r.is_done()

    def finish(self, status):
        self.s.finish(None)
        return self.r.finish(status)

    def cancel(self):
        return self.r.cancel()


def _recv_ack(c, source, got) -> None:
    """Acknowledge the synchronous send (its tag ``got``) received from
    ``source`` of communicator ``c``."""
    try:
        c.eps[source].tag_send_nb(b"", KIND_ACK | (got & (CTX_MASK | SEQ_MASK)))
    except ucxpy.UcxpyError as e:
        raise translate(e) from None


def _recv_wait(comm, buf, source, tag=ANY_TAG, status=None) -> None:
    """A blocking receive whose message the native fast path did not find."""
    op = comm._irecv_op(buf, source, tag)
    ENGINE.wait(op)
    op.finish(status)


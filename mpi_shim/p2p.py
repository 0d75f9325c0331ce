"""Point-to-point: the buffer API (``Send``/``Recv``...) and the pickle API
(``send``/``recv``...), as a mixin of :class:`~mpi_shim.comm.Comm`.

Synchronous sends carry a nonzero sequence number in the tag; the receiver
acknowledges it from the receive's completion callback (see
:func:`.request.send_ack`), and the send completes only then.
"""
from __future__ import annotations

import pickle as _pickle

import ucxpy

from .datatype import parse
from .exceptions import ERR_RANK, ERR_TAG, Exception, translate
from .request import (ENGINE, FULL, KIND_ACK, MASK_ANY_TAG, MASK_TAG, SEQ_SHIFT, TAG_UB,
                      DoneOp, PickleRecvOp, RecvOp, Request, SendOp, make_prequest)
from .status import ANY_SOURCE, ANY_TAG, PROC_NULL, Status


class Pickle:
    """``MPI.pickle``: the serializer of the lowercase API."""

    def __init__(self):
        self.PROTOCOL = _pickle.HIGHEST_PROTOCOL
        self.THRESHOLD = 256 * 1024
        self.dumps = lambda obj: _pickle.dumps(obj, self.PROTOCOL)
        self.loads = _pickle.loads


pickle = Pickle()
_ACK = bytearray(0)


class Message:
    """A message taken off the queue by a matched probe (``Mprobe``)."""

    __slots__ = ("_comm", "_m", "_proc_null", "__weakref__")

    def __init__(self, message=None):
        self._comm = self._m = None
        self._proc_null = False
        if message is not None:
            self._comm, self._m, self._proc_null = message._comm, message._m, message._proc_null

    def __eq__(self, other):
        if not isinstance(other, Message):
            return NotImplemented
        return self._m is other._m and self._proc_null == other._proc_null

    def __hash__(self):
        return id(self._m)

    def __bool__(self):
        return self._m is not None or self._proc_null

    def _take(self):
        comm, m = self._comm, self._m
        if m is None and not self._proc_null:
            from .exceptions import ERR_REQUEST
            raise Exception(ERR_REQUEST, "invalid message (MESSAGE_NULL)")
        self._m, self._proc_null = None, False
        return comm, m

    def Recv(self, buf, status=None):
        self.Irecv(buf).Wait(status)

    def Irecv(self, buf):
        comm, m = self._take()
        if m is None:
            return Request._from(DoneOp())
        msg = parse(buf, writable=True)
        dst = msg.contig()
        staging = None
        if dst is None:
            staging = dst = bytearray(msg.nbytes)
        return Request._from(RecvOp(_recv_message(m, dst), comm, msg, staging))

    def recv(self, status=None):
        return self.irecv().wait(status)

    def irecv(self):
        comm, m = self._take()
        if m is None:
            return Request._from(DoneOp())
        buf = bytearray(m.info.length)
        return Request._from(_PickledMessageOp(_recv_message(m, buf), comm, buf))

    @classmethod
    def Probe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return comm.Mprobe(source, tag, status)

    probe = Probe

    @classmethod
    def Iprobe(cls, comm, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return comm.Improbe(source, tag, status)

    iprobe = Iprobe


def _recv_message(m, buf):
    try:
        return ENGINE.worker.tag_recv_message_nb(buf, m)
    except ucxpy.UcxpyError as e:
        raise translate(e) from None


class _PickledMessageOp(RecvOp):
    __slots__ = ()

    def __init__(self, ureq, comm, buf):
        super().__init__(ureq, comm, None, None)
        self.msg = buf

    def finish(self, status):
        super().finish(status)
        n = self.ureq.result.length
        return _pickle.loads(memoryview(self.msg)[:n]) if n else None


MESSAGE_NULL = Message()
MESSAGE_NO_PROC = Message()
MESSAGE_NO_PROC._proc_null = True


class P2P:
    """Point-to-point methods of ``Comm``."""

    __slots__ = ()

    # -- addressing ------------------------------------------------------------
    def _dest(self, dest, tag):
        c = self._c
        if c is None:
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
        """(ucxpy tag, mask, world source) of a receive."""
        c = self._c
        if c is None:
            self._impl()
        if tag == ANY_TAG:
            t, mask = c.p2p, MASK_ANY_TAG
        elif 0 <= tag <= TAG_UB:
            t, mask = c.p2p | tag, MASK_TAG
        else:
            raise Exception(ERR_TAG, f"invalid tag {tag}")
        if source == ANY_SOURCE:
            return t, mask, -1
        if 0 <= source < c.size:
            return t, mask, c.ranks[source]
        raise Exception(ERR_RANK, f"invalid source rank {source}")

    # -- sends -------------------------------------------------------------------
    def _isend(self, data, dest, tag, sync, keep=None):
        c, ep = self._dest(dest, tag)
        try:
            if not sync:
                return SendOp(ep.tag_send_nb(data, c.p2p | tag), None, keep)
            c.ssend_seq = c.ssend_seq % 511 + 1
            seq = c.ssend_seq << SEQ_SHIFT
            ack = c.worker.tag_recv_nb(_ACK, KIND_ACK | c.p2p | seq, FULL, c.ranks[dest])
            return SendOp(ep.tag_send_nb(data, c.p2p | seq | tag), ack, keep)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None

    def Send(self, buf, dest, tag=0):
        if dest == PROC_NULL:
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

    Bsend = Rsend = Send

    def Ssend(self, buf, dest, tag=0):
        self.Issend(buf, dest, tag).Wait()

    def Isend(self, buf, dest, tag=0):
        if dest == PROC_NULL:
            return Request._from(DoneOp())
        m = parse(buf)
        data = m.contig()
        if data is None:
            data = m.pack()
        return Request._from(self._isend(data, dest, tag, False, data))

    Ibsend = Irsend = Isend

    def Issend(self, buf, dest, tag=0):
        if dest == PROC_NULL:
            return Request._from(DoneOp())
        m = parse(buf)
        data = m.contig()
        if data is None:
            data = m.pack()
        return Request._from(self._isend(data, dest, tag, True, data))

    # -- receives ------------------------------------------------------------------
    def _irecv_op(self, buf, source, tag):
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
        try:
            ureq = self._c.worker.tag_recv_nb(dst, t, mask, src)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None
        return RecvOp(ureq, self, m, staging)

    def Recv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        op = self._irecv_op(buf, source, tag)
        ENGINE.wait(op)
        op.finish(status)

    def Irecv(self, buf, source=ANY_SOURCE, tag=ANY_TAG):
        return Request._from(self._irecv_op(buf, source, tag))

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                 recvtag=ANY_TAG, status=None):
        r = self._irecv_op(recvbuf, source, recvtag)
        self.Send(sendbuf, dest, sendtag)
        ENGINE.wait(r)
        r.finish(status)

    def Isendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                  recvtag=ANY_TAG):
        r = self._irecv_op(recvbuf, source, recvtag)
        s = self.Isend(sendbuf, dest, sendtag)._op
        return Request._from(_PairOp(s, r))

    def Sendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG,
                         status=None):
        self.Isendrecv_replace(buf, dest, sendtag, source, recvtag).Wait(status)

    def Isendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG):
        m = parse(buf, writable=True)
        data = bytes(m.pack()) if dest != PROC_NULL else b""
        r = self._irecv_op(buf, source, recvtag)
        s = DoneOp() if dest == PROC_NULL else self._isend(data, dest, sendtag, False, data)
        return Request._from(_PairOp(s, r))

    # -- persistent ------------------------------------------------------------------
    def Send_init(self, buf, dest, tag=0):
        return make_prequest(lambda: self.Isend(buf, dest, tag)._op)

    Bsend_init = Rsend_init = Send_init

    def Ssend_init(self, buf, dest, tag=0):
        return make_prequest(lambda: self.Issend(buf, dest, tag)._op)

    def Recv_init(self, buf, source=ANY_SOURCE, tag=ANY_TAG):
        return make_prequest(lambda: self._irecv_op(buf, source, tag))

    # -- probes ----------------------------------------------------------------------
    def _status_of(self, info, status):
        if status is not None:
            status._set(self._c.w2c.get(info.source, info.source), info.tag & TAG_UB,
                        info.length)

    def Probe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        if source == PROC_NULL:
            self._impl()
            if status is not None:
                status._set(PROC_NULL, ANY_TAG, 0)
            return True
        t, mask, src = self._match(source, tag)
        try:
            info = self._c.worker.tag_probe(t, mask, src)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None
        self._status_of(info, status)
        return True

    def Iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        if source == PROC_NULL:
            return self.Probe(source, tag, status)
        t, mask, src = self._match(source, tag)
        info = self._c.worker.tag_probe_nb(t, mask, src)
        if info is None:
            return False
        self._status_of(info, status)
        return True

    def Mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        if source == PROC_NULL:
            self.Probe(source, tag, status)
            return Message(MESSAGE_NO_PROC)
        t, mask, src = self._match(source, tag)
        try:
            m = self._c.worker.tag_probe(t, mask, src, remove=True)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None
        return self._message(m, status)

    def Improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        if source == PROC_NULL:
            self.Probe(source, tag, status)
            return Message(MESSAGE_NO_PROC)
        t, mask, src = self._match(source, tag)
        m = self._c.worker.tag_probe_nb(t, mask, src, remove=True)
        return None if m is None else self._message(m, status)

    def _message(self, m, status):
        self._status_of(m.info, status)
        msg = Message()
        msg._comm, msg._m = self, m
        return msg

    probe, iprobe = Probe, Iprobe

    def mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Mprobe(source, tag, status)

    def improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Improbe(source, tag, status)

    # -- pickle API ----------------------------------------------------------------
    def send(self, obj, dest, tag=0):
        if dest == PROC_NULL:
            self._dest(0, tag) if self._c is None else None
            return
        self._isend_obj(obj, dest, tag, False).Wait()

    bsend = send

    def ssend(self, obj, dest, tag=0):
        if dest != PROC_NULL:
            self._isend_obj(obj, dest, tag, True).Wait()

    def _isend_obj(self, obj, dest, tag, sync):
        if dest == PROC_NULL:
            return Request._from(DoneOp())
        data = pickle.dumps(obj)
        return Request._from(self._isend(data, dest, tag, sync, data))

    def isend(self, obj, dest, tag=0):
        return self._isend_obj(obj, dest, tag, False)

    ibsend = isend

    def issend(self, obj, dest, tag=0):
        return self._isend_obj(obj, dest, tag, True)

    def _irecv_obj(self, buf, source, tag):
        if source == PROC_NULL:
            self._impl()
            return DoneOp()
        t, mask, src = self._match(source, tag)
        return PickleRecvOp(self, src, t, mask, buf)

    def recv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        if buf is not None:
            import warnings
            warnings.warn("recv(): the buf argument is ignored (received objects "
                          "are allocated to fit)", UserWarning, stacklevel=2)
        op = self._irecv_obj(buf, source, tag)
        ENGINE.wait(op)
        return op.finish(status)

    def irecv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG):
        return Request._from(self._irecv_obj(buf, source, tag))

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                 recvtag=ANY_TAG, status=None):
        r = self._irecv_obj(recvbuf, source, recvtag)
        s = self._isend_obj(sendobj, dest, sendtag, False)
        s.Wait()
        ENGINE.wait(r)
        return r.finish(status)

    def isendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                  recvtag=ANY_TAG):
        r = self._irecv_obj(recvbuf, source, recvtag)
        s = self._isend_obj(sendobj, dest, sendtag, False)._op
        return Request._from(_PairOp(s, r))


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

"""Partitioned point-to-point (MPI 4.0): ``Psend_init``/``Precv_init``,
``Pready*`` and ``Parrived``.

The send buffer is split into ``partitions`` equal parts.  Each ``Pready``
sends its part at once as one tagged message (traffic kind PART, the
communicator's context and the user tag) with a small header: the sender's
partition index and count.  Sender and receiver may use different partition
counts: receive partition ``i`` covers the fraction ``[i/pr, (i+1)/pr)`` of
the buffer and has arrived once every send partition overlapping it has
(so empty partitions arrive too, in order).  Messages of one (source, tag)
arrive in order, so the receiver takes exactly one epoch's messages per
``Start`` without knowing their number in advance: the first header tells.
"""
from __future__ import annotations

import struct

from .msgspec import parse
from .engine import ENGINE, KIND_PART, TAG_UB
from .exceptions import ERR_ARG, ERR_RANK, ERR_REQUEST, ERR_TAG, ERR_TRUNCATE, Exception, translate
from .ops import _Op
from .request import Prequest
from .status import ANY_SOURCE, ANY_TAG, PROC_NULL

_HDR = struct.Struct("<II")


def _overlap(i, pr, j, ps):
    """Whether receive partition i of pr and send partition j of ps overlap."""
    return i * ps < (j + 1) * pr and j * pr < (i + 1) * ps


class _PartOp(_Op):
    __slots__ = ("comm", "m", "parts", "peer", "tag", "active_", "data", "size")
    persistent = True

    def __init__(self, comm, buf, partitions, peer, tag, writable):
        c = comm._impl()
        if partitions < 1:
            raise Exception(ERR_ARG, f"invalid number of partitions {partitions}")
        if peer != PROC_NULL and not (0 <= peer < len(c.peers)):
            raise Exception(ERR_RANK, f"invalid rank {peer}")
        if not (0 <= tag <= TAG_UB):
            raise Exception(ERR_TAG, f"invalid tag {tag}")
        self.comm, self.parts, self.peer, self.tag = comm, partitions, peer, tag
        self.m = parse(buf, writable=writable)
        self.size = self.m.nbytes
        self.active_ = False

    def active(self):
        return self.active_

    def _range(self, j, n):
        lo = self.size * j // n
        return lo, self.size * (j + 1) // n

    def finish(self, status):
        if status is not None:
            status._clear()
        self.active_ = False
        return None

    def peek(self, status):
        status._clear()

    def ready(self, partitions):
        raise Exception(ERR_REQUEST, "Pready on a partitioned receive")

    def arrived(self, partition):
        raise Exception(ERR_REQUEST, "Parrived on a partitioned send")


class PsendOp(_PartOp):
    __slots__ = ("readied", "sends")

    def start(self):
        if self.active_:
            raise Exception(ERR_REQUEST, "partitioned request is already active")
        self.active_ = True
        self.readied = [False] * self.parts
        self.sends = []
        self.data = self.m.pack()

    def ready(self, partitions):
        if not self.active_:
            raise Exception(ERR_REQUEST, "Pready on an inactive partitioned request")
        for p in partitions:
            if not (0 <= p < self.parts):
                raise Exception(ERR_ARG, f"invalid partition {p}")
            if self.readied[p]:
                raise Exception(ERR_REQUEST, f"partition {p} is already ready")
            self.readied[p] = True
            if self.peer == PROC_NULL:
                continue
            lo, hi = self._range(p, self.parts)
            c = self.comm._impl()
            payload = _HDR.pack(p, self.parts) + bytes(memoryview(self.data)[lo:hi])
            try:
                self.sends.append(c.eps[self.peer].tag_send_nb(
                    payload, KIND_PART | c.p2p | self.tag))
            except Exception as e:
                raise translate(e) from None

    def is_done(self):
        return not self.active_ or (all(self.readied) and all(r.done for r in self.sends))

    def finish(self, status):
        for r in getattr(self, "sends", ()):
            if r.exc is not None:
                self.active_ = False
                raise translate(r.exc) from None
        return super().finish(status)


class PrecvOp(_PartOp):
    __slots__ = ("got", "nsend", "pending", "buf", "exc")

    def start(self):
        if self.active_:
            raise Exception(ERR_REQUEST, "partitioned request is already active")
        self.active_ = True
        self.got = []
        self.nsend = None
        self.exc = None
        contig = self.m.contig()
        self.buf = contig if contig is not None else bytearray(self.size)
        if self.peer == PROC_NULL:
            self.nsend = 0
            return
        self._post()

    def _post(self):
        c = self.comm._impl()
        req = ENGINE.recv_anysize(c.peers[self.peer], KIND_PART | c.p2p | self.tag)
        req.add_done_callback(self._arrived)

    def _arrived(self, req):
        if req.exc is not None:
            self.exc = req.exc
            return
        data = req.buf
        j, ps = _HDR.unpack_from(data)
        self.nsend = ps
        lo, hi = self.size * j // ps, self.size * (j + 1) // ps
        body = memoryview(data)[_HDR.size:]
        if len(body) != hi - lo:
            self.exc = Exception(ERR_TRUNCATE, "partitioned message does not match the "
                                               "receive buffer")
        else:
            self.buf[lo:hi] = body
        self.got.append(j)
        if len(self.got) < ps:
            self._post()

    def arrived(self, partition):
        if not (0 <= partition < self.parts):
            raise Exception(ERR_ARG, f"invalid partition {partition}")
        if not self.active_:
            return True
        if self.peer == PROC_NULL:
            return True
        ENGINE.progress()
        if self.nsend is None:
            return False
        got = set(self.got)
        return all(j in got for j in range(self.nsend)
                   if _overlap(partition, self.parts, j, self.nsend))

    def is_done(self):
        return not self.active_ or self.exc is not None or \
            (self.nsend is not None and len(self.got) >= self.nsend)

    def finish(self, status):
        exc = self.exc
        if self.active_ and self.m.contig() is None:
            self.m.unpack(self.buf)
        if exc is not None:
            self.active_ = False
            raise translate(exc) if not isinstance(exc, Exception) else exc
        if status is not None:
            status._set(self.peer, self.tag, self.size)
            self.active_ = False
            return None
        return super().finish(None)


def psend_init(comm, buf, partitions, dest, tag):
    return Prequest._wrap(PsendOp(comm, buf, partitions, dest, tag, False))


def precv_init(comm, buf, partitions, source, tag):
    if source == ANY_SOURCE or tag == ANY_TAG:
        raise Exception(ERR_ARG, "partitioned receives need an explicit source and tag")
    return Prequest._wrap(PrecvOp(comm, buf, partitions, source, tag, True))

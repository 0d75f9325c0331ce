"""Tag matching with MPI semantics.

Theory of operation
-------------------
A receive is posted with ``(source, tag, mask)``; ``source`` may be
``ANY_SOURCE`` and ``mask`` may clear bits to wildcard them (``mask=0``
matches any tag).  An arriving message ``(src, tag)`` matches a receive when
``req.source in (ANY_SOURCE, src)`` and ``tag & req.mask == req.tag & req.mask``.

MPI order rules, kept here:

* Posted receives are matched in posting order.  Receives with a specific
  source and a full mask sit in a hash keyed by ``(source, tag)``; so do,
  in a second hash keyed by ``(source, tag & bucket_mask)``, those whose
  mask is the layer's ``bucket_mask`` (mpi_shim's receives leave out its
  synchronous-send sequence bits); all others sit in one wildcard list.
  Every receive carries a sequence number, and an arriving message takes
  the lowest-sequence candidate of the three structures, so the earliest
  posted matching receive always wins.
* Messages that find no receive go to the unexpected queue in arrival order;
  a new receive (or probe) searches it oldest first.
* Transports deliver each peer's frames in order (see ``transports.base``),
  so messages from one source never overtake each other.

An unexpected message is either eager (its bytes are kept) or a rendezvous
request-to-send (only its descriptor is kept; data moves after the match).

A receive of any size (``buf`` None, :meth:`ucxpy.Worker.tag_recv_any_nb`)
matches like any other and gets a buffer of the message's size at the match
(:data:`ANY_SIZE` is its capacity); the native paths never take it.

A layer may ask to hear of some matches: when a posted receive is matched by
a message whose tag has bits of ``notify_mask`` where the receive's mask
ignores them, ``notify(req)`` runs when the receive completes (mpi_shim
acknowledges a synchronous send so).

Two implementations
-------------------
:class:`TagMatcher` here is the reference.  The native data plane's
``ucxpy._dp.TagMatcher`` (native/dp/tag.c, match.c) has the same interface
and is the worker's matcher when ``UCXPY_FASTPATH`` is on (the default): the
data plane then matches eager messages of the shm inbox in C, and every
other caller (the Python protocol handlers, probes, cancels, peer failure)
uses the same queues through this interface.  One worker uses one of them,
never both.  ``tests/test_dp_match.py`` holds them to the same outcomes.
"""
from __future__ import annotations

import collections

from . import _dp
from .errors import TruncationError, UcxpyError
from .request import Request, TagInfo

ANY_SOURCE = -1
FULL_MASK = 0xFFFF_FFFF_FFFF_FFFF
#: tags whose top byte is 0xFF are reserved for ucxpy's own collectives
RESERVED_TAG_BASE = 0xFF << 56
#: the capacity of a receive of any size (its buffer is made at the match)
ANY_SIZE = 1 << 62


class RecvRequest(_dp.RecvCore, Request):
    """A posted tagged receive: ``RecvRequest(worker, buf, source, tag,
    mask, cancel)`` (``buf`` None: a receive of any size, capacity
    :data:`ANY_SIZE`).  Its fields (``buf``, ``capacity``, ``source``,
    ``tag``, ``mask``, ``seq``, and Request's) and its ``__init__`` are C
    (``ucxpy._dp.RecvCore``): the data plane's matcher reads and completes it
    without attribute lookups.  ``handle`` is its C receive's address while
    it is posted in the data plane's matcher, else 0."""

    __slots__ = ()


class UnexpectedMessage:
    """A message that arrived before its receive.  ``data`` holds eager bytes;
    ``rts`` holds the rendezvous descriptor instead."""

    __slots__ = ("source", "tag", "length", "data", "rts")

    def __init__(self, source, tag, length, data=None, rts=None):
        self.source = source
        self.tag = tag
        self.length = length
        self.data = data
        self.rts = rts

    @property
    def info(self) -> TagInfo:
        return TagInfo(self.source, self.tag, self.length)


class TagMatcher:
    """Posted-receive structures plus the unexpected queue of one worker."""

    __slots__ = ("exact", "buckets", "bucket_mask", "notify_mask", "notify", "wild",
                 "unexpected", "_seq")

    def __init__(self):
        self.exact = {}                       # (source, tag) -> deque[RecvRequest]
        self.buckets = {}                     # (source, tag & bucket_mask) -> deque
        self.bucket_mask = None               # a layer's common mask (None: no buckets)
        self.notify_mask = 0                  # see the module's docstring
        self.notify = None
        self.wild = []                        # RecvRequest, in posting order
        self.unexpected = collections.deque()  # UnexpectedMessage, arrival order
        self._seq = 0

    # -- posted receives --------------------------------------------------
    def post(self, req: RecvRequest):
        """Post ``req``, or return the oldest unexpected message it matches,
        taken out of the queue (``req`` is then not posted: the caller
        delivers the message to it).  (The data plane's matcher may also
        return True: it delivered that message itself.)"""
        if self.unexpected:
            m = self.find_unexpected(req.source, req.tag, req.mask, True)
            if m is not None:
                return m
        self._post(req)
        return None

    def _post(self, req: RecvRequest) -> None:
        self._seq += 1
        req.seq = self._seq
        table, key = self._queue_of(req)
        if table is None:
            self.wild.append(req)
            return
        q = table.get(key)
        if q is None:
            table[key] = collections.deque((req,))
        else:
            q.append(req)

    def posted_count(self) -> int:
        return sum(len(q) for q in self.exact.values()) + \
            sum(len(q) for q in self.buckets.values()) + len(self.wild)

    def idle_for(self, source: int, tag: int, mask: int) -> bool:
        """Could a message from ``source`` with ``tag`` (under ``mask``) find
        nothing but a receive about to be posted for it?  No wildcard
        receive, no unexpected message, no posted receive of its key, and
        under a mask that is not the full one none at all of another kind
        (:meth:`ucxpy.Worker.tag_try_recv`'s condition)."""
        if self.wild or self.unexpected or \
                ((source, tag) in self.exact if mask == FULL_MASK else self.exact):
            return False
        return not self.buckets or (
            (mask == FULL_MASK or mask == self.bucket_mask)
            and (source, tag & self.bucket_mask) not in self.buckets)

    def deliver(self) -> int:
        """Complete receives matched elsewhere (the native matcher's; here
        every match completes at once): 0."""
        return 0

    def _queue_of(self, req: RecvRequest):
        """The hash and key ``req`` sits under, or (None, None) for the list."""
        if req.source == ANY_SOURCE:
            return None, None
        if req.mask == FULL_MASK:
            return self.exact, (req.source, req.tag)
        if req.mask == self.bucket_mask:
            return self.buckets, (req.source, req.tag & req.mask)
        return None, None

    def remove(self, req: RecvRequest) -> bool:
        """Withdraw a posted receive (cancel); False if it already matched."""
        table, key = self._queue_of(req)
        if table is not None:
            q = table.get(key)
            if q is not None and req in q:
                q.remove(req)
                if not q:
                    del table[key]
                return True
            return False
        try:
            self.wild.remove(req)
            return True
        except ValueError:
            return False

    def match_posted(self, source: int, tag: int):
        """Pop and return the earliest posted receive matching (source, tag)."""
        table, key = self.exact, (source, tag)
        q = table.get(key)
        cand = q[0] if q else None
        if self.buckets:
            bkey = (source, tag & self.bucket_mask)
            b = self.buckets.get(bkey)
            if b and (cand is None or b[0].seq < cand.seq):
                table, key, q, cand = self.buckets, bkey, b, b[0]
        if self.wild:
            for i, w in enumerate(self.wild):
                if cand is not None and w.seq > cand.seq:
                    break
                if (w.source == ANY_SOURCE or w.source == source) and \
                        (tag ^ w.tag) & w.mask == 0:
                    del self.wild[i]
                    return w
        if cand is not None:
            q.popleft()
            if not q:
                del table[key]
        return cand

    def first_for(self, source: int, tag: int):
        """The receive :meth:`match_posted` would give that message, left
        posted, or None."""
        table, key = self.exact, (source, tag)
        q = table.get(key)
        cand = q[0] if q else None
        if self.buckets:
            b = self.buckets.get((source, tag & self.bucket_mask))
            if b and (cand is None or b[0].seq < cand.seq):
                cand = b[0]
        for w in self.wild:
            if cand is not None and w.seq > cand.seq:
                break
            if (w.source == ANY_SOURCE or w.source == source) and (tag ^ w.tag) & w.mask == 0:
                return w
        return cand

    def requests_from(self, source: int):
        """Posted receives that name ``source`` explicitly (for peer failure)."""
        out = [r for t in (self.exact, self.buckets) for q in t.values() for r in q
               if r.source == source]
        out += [r for r in self.wild if r.source == source]
        return out

    def requests_matching(self, tag: int, mask: int):
        """Posted receives whose tag equals ``tag`` under ``mask``."""
        out = [r for t in (self.exact, self.buckets) for q in t.values() for r in q
               if (r.tag ^ tag) & mask == 0]
        out += [r for r in self.wild if (r.tag ^ tag) & mask == 0]
        return out

    # -- unexpected queue -------------------------------------------------
    def queue_unexpected(self, m: UnexpectedMessage) -> None:
        """A message no receive was posted for: last in the queue."""
        self.unexpected.append(m)

    def unexpected_depth(self) -> int:
        return len(self.unexpected)

    def counts(self) -> tuple:
        """(posted receives, unexpected messages)"""
        return self.posted_count(), len(self.unexpected)

    def find_unexpected(self, source: int, tag: int, mask: int, remove: bool):
        """Oldest unexpected message matching; removed from the queue if ``remove``."""
        for i, m in enumerate(self.unexpected):
            if (source == ANY_SOURCE or m.source == source) and (m.tag ^ tag) & mask == 0:
                if remove:
                    del self.unexpected[i]
                return m
        return None


def deliver_eager(req: RecvRequest, source: int, tag: int, payload) -> None:
    """Copy an eager payload into a matched receive and complete it."""
    n = len(payload)
    if n > req.capacity:
        req.complete(exc=TruncationError(
            f"message of {n} bytes from {source} (tag {tag:#x}) does not fit in "
            f"receive buffer of {req.capacity} bytes", n, req.capacity))
        return
    if req.buf is None:                 # a receive of any size
        req.buf = bytearray(payload)
    elif n:
        req.buf[:n] = payload
    req.complete(TagInfo(source, tag, n))


def handoff_matched(req: RecvRequest, source: int, tag: int, payload) -> None:
    """A receive the native matcher matched an eager message to but did not
    deliver (it does not fit, or its buffer is made at the match): delivered,
    or its error reported, here, with the notification its worker's matcher
    asks for.  ``payload`` None: the data plane had no memory to keep it."""
    m = req.worker.matcher
    if tag & m.notify_mask & ~req.mask:
        req.add_done_callback(m.notify)
    if payload is None:
        req.complete(exc=UcxpyError(
            f"out of memory keeping a message of {source} (tag {tag:#x}) for this receive"))
        return
    deliver_eager(req, source, tag, payload)

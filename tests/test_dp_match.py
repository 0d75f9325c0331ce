"""The data plane's matcher and protocols (native/dp) against the Python
reference (ucxpy.tag): random MPI-order operation sequences go to both, and
every outcome must be the same.  Deterministic (seeded) and in one process.

* match.c alone (the ``Matcher`` harness): posts with a source or
  ANY_SOURCE and full, bucketed, empty or odd masks; arrivals; probes,
  removing or not; cancels: which receive a message takes, which message a
  receive or probe takes, what stays queued.
* Whole sequences through a real inbox (below): receives of every kind,
  eager messages of every size injected as frames, rendezvous offers,
  probes, cancels, the blocking receive's shortcut, sizes handed to the
  Python protocol: each request's outcome and bytes, the notifications and
  the queues."""
from __future__ import annotations

import random

import pytest

from ucxpy import _dp
from ucxpy.tag import ANY_SOURCE, FULL_MASK, TagMatcher, UnexpectedMessage

pytestmark = pytest.mark.timeout(120)

#: mpi_shim's kind of bucket mask: the low byte (a sequence) left out
BUCKET = FULL_MASK & ~0xFF


class _Recv:
    __slots__ = ("source", "tag", "mask", "seq", "ident")

    def __init__(self, source, tag, mask, ident):
        self.source, self.tag, self.mask, self.ident, self.seq = source, tag, mask, ident, 0


class Reference:
    """What the core does with a TagMatcher, as the C Matcher's calls."""

    def __init__(self, bucket_mask=None):
        self.m = TagMatcher()
        self.m.bucket_mask = bucket_mask
        self.posted = {}

    def post(self, source, tag, mask, ident):
        u = self.m.find_unexpected(source, tag, mask, True)
        if u is not None:
            return u.data
        r = self.posted[ident] = _Recv(source, tag, mask, ident)
        self.m.post(r)
        return None

    def arrive(self, source, tag, ident):
        r = self.m.match_posted(source, tag)
        if r is not None:
            del self.posted[r.ident]
            return r.ident
        self.m.unexpected.append(UnexpectedMessage(source, tag, 0, data=ident))
        return None

    def probe(self, source, tag, mask, remove):
        u = self.m.find_unexpected(source, tag, mask, remove)
        return None if u is None else u.data

    def cancel(self, ident):
        r = self.posted.pop(ident, None)
        return r is not None and self.m.remove(r)

    def counts(self):
        return len(self.posted), len(self.m.unexpected)


def _tag(rng):
    # few distinct tags so that matches happen; high bits, bucket bits, low byte
    return rng.choice((0, 1, 7)) | (rng.choice((0, 1, 2)) << 8) | (rng.choice((0, 1)) << 63)


def _mask(rng):
    return rng.choice((FULL_MASK, FULL_MASK, BUCKET, BUCKET, 0, FULL_MASK & ~(1 << 63),
                       0xFF, FULL_MASK & ~0x100))


def _run(seed, ops=400, bucket=True):
    rng = random.Random(seed)
    ref, dp = Reference(BUCKET if bucket else None), _dp.Matcher()
    if bucket:
        dp.set_bucket_mask(BUCKET)
    idents, live = iter(range(1, 1 << 30)), []
    log = []
    for _ in range(ops):
        kind = rng.random()
        source = rng.choice((0, 1, 2))
        if kind < 0.35:
            src = ANY_SOURCE if rng.random() < 0.2 else source
            args = (src, _tag(rng), _mask(rng), next(idents))
            got = (ref.post(*args), dp.post(*args))
            if got[0] is None:
                live.append(args[3])
        elif kind < 0.75:
            args = (source, _tag(rng), next(idents))
            got = (ref.arrive(*args), dp.arrive(*args))
        elif kind < 0.9:
            src = ANY_SOURCE if rng.random() < 0.3 else source
            args = (src, _tag(rng), _mask(rng), rng.random() < 0.5)
            got = (ref.probe(*args), dp.probe(*args))
        else:
            if not live:
                continue
            args = (live.pop(rng.randrange(len(live))),)
            got = (ref.cancel(*args), dp.cancel(*args))
        log.append((kind, args, got))
        assert got[0] == got[1], f"seed {seed}: {args} -> python {got[0]}, C {got[1]}\n{log[-5:]}"
        assert ref.counts() == dp.counts(), f"seed {seed} after {args}"
    return log


@pytest.mark.parametrize("bucket", [True, False], ids=["bucket-mask", "no-bucket-mask"])
def test_c_matcher_equals_python_reference(bucket):
    matched = 0
    for seed in range(150):
        log = _run(seed, bucket=bucket)
        matched += sum(1 for _k, _a, got in log if got[0] not in (None, False))
    assert matched > 10000               # the sequences did match, not only queue


def test_many_posted_and_unexpected_grow_the_hashes():
    """Thousands of exact receives and messages (the hashes double several
    times) keep MPI order: each key's oldest first."""
    ref, dp = Reference(BUCKET), _dp.Matcher()
    dp.set_bucket_mask(BUCKET)
    rng = random.Random(7)
    ident = 0
    for _ in range(6000):
        ident += 1
        args = (rng.randrange(8), rng.randrange(64) << 8, FULL_MASK, ident)
        assert ref.post(*args) == dp.post(*args)
    for _ in range(9000):
        ident += 1
        args = (rng.randrange(8), rng.randrange(64) << 8, ident)
        assert ref.arrive(*args) == dp.arrive(*args)
    assert ref.counts() == dp.counts()
    for _ in range(4000):
        ident += 1
        args = (rng.randrange(8), rng.randrange(64) << 8, BUCKET, ident)
        assert ref.post(*args) == dp.post(*args)
    assert ref.counts() == dp.counts()


def test_bucket_mask_changes_only_while_nothing_is_posted():
    dp = _dp.Matcher()
    assert dp.post(0, 1, FULL_MASK, 1) is None
    with pytest.raises(RuntimeError):
        dp.set_bucket_mask(BUCKET)
    assert dp.cancel(1) and not dp.cancel(1)
    dp.set_bucket_mask(BUCKET)


# -- whole protocol sequences: frames injected through a real inbox ------------------
#
# The same random MPI-order sequence goes to two receivers: the native one
# (the data plane's TagMatcher, its Inbox over a real ring that the
# "senders" push frames into, and the Python handler for what the inbox
# leaves: rendezvous offers and the sizes handed to Python) and the
# reference (ucxpy.tag.TagMatcher with the Python handlers alone, fed the
# same frames in the same order).  Receives of every kind (a source or any,
# full, bucketed, odd or empty masks, a buffer or any size, too small ones),
# eager messages of every size, rendezvous offers, probes (removing or not),
# cancels and the blocking receive's shortcut go to both; after every step
# each request's state, result, error and bytes, the notifications and the
# queues' depths must be the same.

import mmap  # noqa: E402
import os  # noqa: E402
import struct  # noqa: E402

from ucxpy import _native  # noqa: E402
from ucxpy.errors import TruncationError  # noqa: E402
from ucxpy.request import TagInfo  # noqa: E402
from ucxpy.tag import RecvRequest, deliver_eager, handoff_matched  # noqa: E402
from ucxpy.wire import AmId  # noqa: E402

EAGER, RTS = int(AmId.TAG_EAGER), int(AmId.TAG_RTS)
SOURCES = (0, 1, 2)
CONN = {s: 1000 + s for s in SOURCES}
RING = 1 << 16


class _Owner:
    """What a request's worker is to handoff_matched: its matcher."""

    def __init__(self, m):
        self.matcher = m


class _Side:
    """One receiver: a matcher, the frames that arrived and not yet handled
    (a real ring for the native side, a list for the reference) and the
    Python handlers of ucxpy.worker (_on_tag_eager, _on_tag_rts, _post)."""

    def __init__(self, native, bucket, notify_mask, handed):
        self.native = native
        self.notified = []
        if native:
            self.dp = _dp.Worker()
            self.m = _dp.TagMatcher(self.dp, UnexpectedMessage, handoff_matched)
            ffi, lib = _native.ffi, _native.lib
            self.size = lib.UCXPY_RING_HDR_SIZE + RING
            self.mm = mmap.mmap(-1, self.size)
            base = ffi.from_buffer(self.mm)
            self._base = base
            assert lib.ucxpy_ring_init(base, self.size) == 0
            self.cons = ffi.new("ucxpy_ring_t *")
            assert lib.ucxpy_ring_attach(self.cons, base, self.size) == 0
            self.prod = {}
            for s in SOURCES:
                h = self.prod[s] = ffi.new("ucxpy_ring_t *")
                assert lib.ucxpy_ring_attach_producer(h, base, self.size, CONN[s],
                                                      os.getpid()) == 0
            self.out = ffi.new("uint64_t[]", lib.UCXPY_RING_PEEK_OUT)
            self.inbox = _dp.Inbox(self.m, int(ffi.cast("uintptr_t", self.cons)), EAGER)
            for s in SOURCES:
                self.inbox.add_conn(CONN[s], s)
            self.inbox.hand_sizes(handed)
        else:
            self.m = TagMatcher()
            self.frames = []
        self.handed = handed
        self.owner = _Owner(self.m)
        self.m.bucket_mask = bucket
        self.m.notify_mask = notify_mask
        self.m.notify = lambda r: self.notified.append(r.ident)

    # -- arrivals ----------------------------------------------------------------
    def arrive(self, src, am_id, tag, payload):
        if not self.native:
            self.frames.append((src, am_id, tag, payload))
            return
        lib = _native.lib
        rc = lib.ucxpy_ring_push(self.prod[src], am_id, struct.pack("<Q", tag), 8,
                                 payload, len(payload))
        assert rc in (0, 1), rc

    def progress(self):
        """Handle every frame that arrived, in order."""
        if not self.native:
            frames, self.frames = self.frames, []
            for f in frames:
                self._python_frame(*f)
            return
        lib, ffi = _native.lib, _native.ffi
        while True:
            self.inbox.dispatch(1 << 20, 0)
            if lib.ucxpy_ring_peek(self.cons, self.out) != 1:
                return
            out = self.out
            src = out[5] - 1000
            tag, = struct.unpack("<Q", ffi.buffer(self.cons.data + out[1], 8)[:])
            payload = ffi.buffer(self.cons.data + out[3], out[4])[:]
            self._python_frame(src, out[0], tag, payload)
            lib.ucxpy_ring_release(self.cons)

    def _python_frame(self, src, am_id, tag, payload):
        """Worker._on_tag_eager, or _on_tag_rts with the offer's data moved
        at once (the offer's payload stands for the sender's buffer)."""
        req = self.m.match_posted(src, tag)
        if req is None:
            self.m.queue_unexpected(
                UnexpectedMessage(src, tag, len(payload), data=payload) if am_id == EAGER
                else UnexpectedMessage(src, tag, len(payload), rts=payload))
            return
        if tag & self.m.notify_mask & ~req.mask:
            req.add_done_callback(self.m.notify)
        if am_id == EAGER:
            deliver_eager(req, src, tag, payload)
        else:
            self._rndv(req, src, tag, payload)

    @staticmethod
    def _rndv(req, src, tag, data):
        if req.buf is None:
            req.buf = bytearray(data)
        elif len(data) > req.capacity:
            req.complete(exc=TruncationError("truncated", len(data), req.capacity))
            return
        else:
            req.buf[:len(data)] = data
        req.complete(TagInfo(src, tag, len(data)))

    # -- receives ----------------------------------------------------------------
    def post(self, ident, src, tag, mask, cap):
        req = RecvRequest(self.owner, None if cap is None else memoryview(bytearray(cap)),
                          src, tag, mask, None)
        req.ident = ident
        m = self.m.post(req)
        if m is True:                      # (the data plane delivered it)
            return req
        if m is not None:                  # Worker._post's unexpected path
            if m.tag & self.m.notify_mask & ~mask:
                req.add_done_callback(self.m.notify)
            if m.rts is None:
                deliver_eager(req, m.source, m.tag, m.data)
            else:
                self._rndv(req, m.source, m.tag, m.rts)
        return req

    def try_recv(self, src, tag, mask, cap):
        """Worker.tag_try_recv on this side: (n, tag) or None."""
        if not self.m.idle_for(src, tag, mask):
            return None
        buf = bytearray(cap)
        if self.native:
            n, got = self.inbox.try_recv(CONN[src], tag, mask, buf, 0)
            return None if n < 0 else (n, got, bytes(buf[:n]))
        if not self.frames:
            return None
        fsrc, am_id, ftag, payload = self.frames[0]
        if fsrc != src or am_id != EAGER or (ftag ^ tag) & mask or len(payload) > cap \
                or any(lo <= len(payload) <= hi for lo, hi in self.handed):
            return None                    # (sizes handed to Python: not the shortcut's)
        del self.frames[0]
        buf[:len(payload)] = payload
        return len(payload), ftag, bytes(buf[:len(payload)])


class _Ident(RecvRequest):
    __slots__ = ("ident",)


RecvRequest = _Ident  # noqa: F811  (the harness's requests carry an ident)


def _state(r):
    exc = type(r.exc).__name__ if r.exc is not None else None
    res = tuple(r.result) if r.result is not None else None
    data = bytes(r.buf[:r.result.length]) if r.result is not None and r.buf is not None else None
    return r.done, res, exc, data


def _protocol_run(seed, ops=300):
    rng = random.Random(seed)
    bucket = BUCKET if seed % 2 else None
    nmask = 0x80 if seed % 3 == 0 else 0
    handed = rng.choice([(), ((0, 15),), ((100, 199), (250, 250)), ((0, 1 << 62),)])
    nat = _Side(True, bucket, nmask, handed)
    ref = _Side(False, bucket, nmask, handed)
    reqs, live, n_eager = {}, [], 0
    for step in range(ops):
        kind = rng.random()
        src = rng.choice(SOURCES)
        if kind < 0.3:
            ident = step
            rsrc = ANY_SOURCE if rng.random() < 0.2 else src
            tag, mask = _tag(rng), _mask(rng)
            cap = rng.choice((None, 0, 8, 64, 300))
            pair = (nat.post(ident, rsrc, tag, mask, cap), ref.post(ident, rsrc, tag, mask, cap))
            reqs[ident] = pair
            live.append(ident)
        elif kind < 0.6:
            am_id = EAGER if rng.random() < 0.8 else RTS
            tag = _tag(rng)
            payload = bytes([step & 0xFF]) * rng.choice((0, 1, 8, 9, 63, 150, 250, 299))
            nat.arrive(src, am_id, tag, payload)
            ref.arrive(src, am_id, tag, payload)
            n_eager += am_id == EAGER
        elif kind < 0.75:
            nat.progress()
            ref.progress()
        elif kind < 0.85:
            psrc = ANY_SOURCE if rng.random() < 0.3 else src
            args = (psrc, _tag(rng), _mask(rng), rng.random() < 0.5)
            a, b = nat.m.find_unexpected(*args), ref.m.find_unexpected(*args)
            assert (a is None) == (b is None), (seed, step, args)
            if a is not None:
                assert tuple(a.info) == tuple(b.info), (seed, step, args)
                if args[3]:                # removed: both receive it, as a matched probe
                    r1 = RecvRequest(nat.owner, memoryview(bytearray(300)), 0, 0, 0, None)
                    r2 = RecvRequest(ref.owner, memoryview(bytearray(300)), 0, 0, 0, None)
                    r1.ident = r2.ident = -step
                    for side, r, msg in ((nat, r1, a), (ref, r2, b)):
                        if msg.rts is None:
                            deliver_eager(r, msg.source, msg.tag, msg.data)
                        else:
                            side._rndv(r, msg.source, msg.tag, msg.rts)
                    assert _state(r1) == _state(r2), (seed, step)
        elif kind < 0.93:
            if live:
                ident = live.pop(rng.randrange(len(live)))
                a, b = reqs[ident]
                assert nat.m.remove(a) == ref.m.remove(b), (seed, step, ident)
        elif kind < 0.97:
            args = (src, _tag(rng), rng.choice((FULL_MASK, FULL_MASK ^ 0xFF)),
                    rng.choice((8, 300)))
            assert nat.try_recv(*args) == ref.try_recv(*args), (seed, step, args)
        else:
            # a quiet moment: everything taken or withdrawn on both sides,
            # then a message that the blocking receive's shortcut may take
            nat.progress()
            ref.progress()
            while True:
                a = nat.m.find_unexpected(ANY_SOURCE, 0, 0, True)
                b = ref.m.find_unexpected(ANY_SOURCE, 0, 0, True)
                assert (a is None) == (b is None) and (a is None or a.info == b.info)
                if a is None:
                    break
            for ident in live:
                a, b = reqs[ident]
                assert nat.m.remove(a) == ref.m.remove(b), (seed, step, ident)
            live.clear()
            tag = _tag(rng)
            payload = bytes([step & 0xFF]) * rng.choice((0, 8, 20))
            nat.arrive(src, EAGER, tag, payload)
            ref.arrive(src, EAGER, tag, payload)
            args = (src, tag ^ rng.choice((0, 0, 1)), rng.choice((FULL_MASK, FULL_MASK ^ 1)),
                    rng.choice((8, 300)))
            assert nat.try_recv(*args) == ref.try_recv(*args), (seed, step, args)
        for ident, (a, b) in reqs.items():
            assert _state(a) == _state(b), (seed, step, ident, _state(a), _state(b))
        assert nat.notified == ref.notified, (seed, step)
        assert nat.m.counts() == ref.m.counts(), (seed, step)
    nat.progress()
    ref.progress()
    for ident, (a, b) in reqs.items():
        assert _state(a) == _state(b), (seed, ident)
    return sum(1 for a, _b in reqs.values() if a.done), n_eager, nat.dp.counters()


def test_native_and_python_protocols_agree_on_random_sequences():
    """Every outcome of 120 seeded sequences is the same on both sides, and
    the native side really ran: the data plane delivered eager messages
    itself, handed some to Python, kept others unexpected."""
    done = 0
    total = dict.fromkeys(("tag_expected", "tag_unexpected", "tag_handoff", "tag_direct"), 0)
    for seed in range(120):
        n, _eager, counters = _protocol_run(seed)
        done += n
        for k in total:
            total[k] += counters[k]
    assert done > 3000
    assert all(v > 20 for v in total.values()), total

"""Both tag matchers, ucxpy.tag.TagMatcher (the Python reference) and the
data plane's ucxpy._dp.TagMatcher (native/dp/tag.c), against a reference
model: the MPI matching rules (earliest posted matching receive wins,
wildcards on source and on masked tag bits, oldest unexpected message first)
over random sequences of posts, cancels, arrivals and probes; plus
deliver_eager's copy and truncation.  Pure logic, no workers: fast enough to
be the mutation-testing suite of ucxpy/tag.py (make mutation)."""
from __future__ import annotations

import random

import pytest

from ucxpy import _dp
from ucxpy.errors import TruncationError
from ucxpy.request import TagInfo
from ucxpy.tag import (ANY_SOURCE, FULL_MASK, RecvRequest, TagMatcher, UnexpectedMessage,
                       deliver_eager)

TAGS = [0, 1, 2, 0x100, 0x101, FULL_MASK]
MASKS = [FULL_MASK, FULL_MASK ^ 0xFF, 0xFF, 0, FULL_MASK ^ 1]
SOURCES = [ANY_SOURCE, 0, 1, 2]


def req(source, tag, mask=FULL_MASK, size=8):
    return RecvRequest(None, bytearray(size), source, tag, mask, None)


def native_matcher():
    return _dp.TagMatcher(_dp.Worker(), UnexpectedMessage,
                          lambda req, src, tag, payload: deliver_eager(req, src, tag, payload))


@pytest.fixture(params=["python", "native"])
def make(request):
    """Each test runs on both implementations."""
    return TagMatcher if request.param == "python" else native_matcher


def matches(r, source, tag):
    return (r.source == ANY_SOURCE or r.source == source) and (tag ^ r.tag) & r.mask == 0


@pytest.mark.parametrize("seed", range(40))
def test_matcher_agrees_with_the_reference_model(seed, make):
    """Half the seeds hash the receives whose mask is FULL_MASK ^ 0xFF
    (one of MASKS) in buckets, as mpi_shim has its MASK_TAG receives
    hashed: the matching must be the same."""
    rnd = random.Random(seed)
    m = make()
    if seed % 2:
        m.bucket_mask = FULL_MASK ^ 0xFF
    posted = []                          # reference: posted receives in posting order
    for _ in range(300):
        op = rnd.random()
        if op < 0.45:
            r = req(rnd.choice(SOURCES), rnd.choice(TAGS), rnd.choice(MASKS))
            m.post(r)
            posted.append(r)
        elif op < 0.55 and posted:
            r = rnd.choice(posted + [req(1, 1)])          # sometimes one never posted
            assert m.remove(r) == (r in posted)
            if r in posted:
                posted.remove(r)
            assert m.remove(r) is False                    # a second cancel finds nothing
        else:
            src, tag = rnd.choice(SOURCES[1:]), rnd.choice(TAGS)
            want = next((r for r in posted if matches(r, src, tag)), None)
            assert m.first_for(src, tag) is want, (seed, src, tag)   # a look, no match
            assert m.posted_count() == len(posted)
            got = m.match_posted(src, tag)
            assert got is want, (seed, src, tag)
            if want is not None:
                posted.remove(want)
        for src in SOURCES[1:]:
            assert sorted(id(r) for r in m.requests_from(src)) == \
                sorted(id(r) for r in posted if r.source == src)
        assert m.posted_count() == len(posted)
        src, tag, mask = rnd.choice(SOURCES[1:]), rnd.choice(TAGS), rnd.choice(MASKS)
        if m.idle_for(src, tag, mask):  # never wrong (tag_try_recv trusts it)
            assert not any(matches(r, src, t) for r in posted
                           for t in TAGS + [tag] if (t ^ tag) & mask == 0)
    tag, mask = 0x100, FULL_MASK ^ 0xFF
    assert sorted(id(r) for r in m.requests_matching(tag, mask)) == \
        sorted(id(r) for r in posted if (r.tag ^ tag) & mask == 0)
    # drain: every remaining receive is found exactly once, in order
    while posted:
        r = posted[0]
        src = 0 if r.source == ANY_SOURCE else r.source
        want = next(x for x in posted if matches(x, src, r.tag))
        assert m.match_posted(src, r.tag) is want
        posted.remove(want)
    assert m.counts() == (0, 0)


def test_exact_and_wildcard_interleave_in_posting_order(make):
    m = make()
    a, w, b = req(0, 5), req(ANY_SOURCE, 5), req(0, 5)
    for r in (a, w, b):
        m.post(r)
    assert [m.match_posted(0, 5) for _ in range(3)] == [a, w, b]
    assert m.match_posted(0, 5) is None and m.posted_count() == 0
    w2, a2 = req(ANY_SOURCE, 5, mask=0), req(0, 5)
    m.post(w2)
    m.post(a2)
    assert m.match_posted(0, 5) is w2 and m.match_posted(0, 5) is a2
    assert m.match_posted(0, 5) is None


def test_masked_bits_and_sources(make):
    m = make()
    r = req(1, 0x1234, mask=FULL_MASK ^ 0xFF)
    m.post(r)
    assert m.match_posted(0, 0x1234) is None            # wrong source
    assert m.match_posted(1, 0x1334) is None            # an unmasked bit differs
    assert m.match_posted(1, 0x12AB) is r               # only masked bits differ
    m.post(r2 := req(2, 7))
    assert m.match_posted(2, 6) is None and m.match_posted(3, 7) is None
    assert m.match_posted(2, 7) is r2


def test_unexpected_queue_is_searched_oldest_first(make):
    m = make()
    msgs = [UnexpectedMessage(s, t, n, data=bytes(n)) for s, t, n in
            [(0, 1, 1), (1, 1, 2), (0, 2, 3), (0, 1, 4)]]
    for msg in msgs:
        m.queue_unexpected(msg)
    assert m.find_unexpected(0, 1, FULL_MASK, remove=False) is msgs[0]
    assert m.unexpected_depth() == 4                     # a probe keeps it
    assert m.find_unexpected(ANY_SOURCE, 1, FULL_MASK, remove=True) is msgs[0]
    assert m.find_unexpected(ANY_SOURCE, 1, FULL_MASK, remove=True) is msgs[1]
    assert m.find_unexpected(0, 0, 0, remove=False) is msgs[2]   # any tag
    assert m.find_unexpected(1, 1, FULL_MASK, remove=True) is None
    assert m.find_unexpected(0, 3, FULL_MASK ^ 1, remove=True) is msgs[2]   # 3 ~ 2
    assert m.unexpected_depth() == 1
    assert m.find_unexpected(ANY_SOURCE, 0, 0, remove=True) is msgs[3]
    assert msgs[3].info == TagInfo(0, 1, 4)
    r = req(0, 7)                       # a receive takes what arrived before it
    m.queue_unexpected(early := UnexpectedMessage(0, 7, 3, data=b"abc"))
    assert m.post(r) is early and m.counts() == (0, 0)


def test_remove_of_one_exact_receive_keeps_its_siblings(make):
    m = make()
    a, b = req(0, 1), req(0, 1)
    m.post(a)
    m.post(b)
    assert m.remove(a) and m.requests_from(0) == [b]
    assert m.remove(b) and m.posted_count() == 0
    assert not m.remove(b)
    w = req(ANY_SOURCE, 1)
    assert not m.remove(w)                               # never posted
    m.post(w)
    assert m.remove(w) and m.posted_count() == 0


@pytest.mark.parametrize("n,cap", [(0, 0), (0, 4), (3, 4), (4, 4)])
def test_deliver_eager_copies_exactly(n, cap):
    r = req(0, 9, size=cap)
    r.buf[:] = b"\xee" * cap
    deliver_eager(r, 3, 9, bytes(range(1, n + 1)))
    assert r.done and r.exc is None and r.result == TagInfo(3, 9, n)
    assert bytes(r.buf) == bytes(range(1, n + 1)) + b"\xee" * (cap - n)


def test_deliver_eager_truncation_names_the_sizes():
    r = req(0, 9, size=4)
    r.buf[:] = b"\xee" * 4
    deliver_eager(r, 3, 0x2A, b"12345")
    assert r.done and isinstance(r.exc, TruncationError)
    assert "5 bytes from 3 (tag 0x2a)" in str(r.exc) and "buffer of 4 bytes" in str(r.exc)
    assert bytes(r.buf) == b"\xee" * 4                  # nothing written


def test_sequence_numbers_grow_with_each_post():
    """(the Python matcher numbers its receives in the requests)"""
    m = TagMatcher()
    rs = [req(0, 1), req(ANY_SOURCE, 1), req(0, 2)]
    for r in rs:
        m.post(r)
    assert [r.seq for r in rs] == [1, 2, 3]


def test_a_fresh_receive_request_is_pending_and_cancellable():
    calls, seen = [], []
    worker = object()
    r = RecvRequest(worker, bytearray(5), 2, 7, FULL_MASK, lambda q: calls.append(q) or True)
    assert r.worker is worker and r.done is False and r.exc is None and r.result is None
    assert (r.capacity, r.source, r.tag, r.mask) == (5, 2, 7, FULL_MASK)
    r.add_done_callback(seen.append)
    assert r.cancel() and calls == [r]
    r.complete(TagInfo(2, 7, 0))
    assert seen == [r]


def test_truncation_error_carries_both_sizes():
    r = req(0, 1, size=2)
    deliver_eager(r, 0, 1, b"abc")
    assert (r.exc.size, r.exc.capacity) == (3, 2)


def test_unexpected_message_keeps_its_payload_or_descriptor():
    eager = UnexpectedMessage(1, 2, 3, data=b"xyz")
    rts = UnexpectedMessage(1, 2, 1 << 20, rts=("sreq", 9))
    assert (eager.data, eager.rts) == (b"xyz", None)
    assert (rts.data, rts.rts) == (None, ("sreq", 9))
    assert rts.info == TagInfo(1, 2, 1 << 20)


# -- idle_for: Worker.tag_try_recv's condition ---------------------------------------

def test_idle_for_only_when_nothing_else_could_take_the_message(make):
    m = make()
    assert m.idle_for(1, 7, FULL_MASK) and m.idle_for(1, 7, 0xFF)
    m.post(a := req(1, 7))
    assert not m.idle_for(1, 7, FULL_MASK)               # a receive of its key
    assert m.idle_for(1, 8, FULL_MASK) and m.idle_for(2, 7, FULL_MASK)
    assert not m.idle_for(1, 8, 0xFF)                    # masked: nothing else at all
    m.remove(a)
    m.post(w := req(ANY_SOURCE, 0, 0))
    assert not m.idle_for(2, 9, FULL_MASK)               # a wildcard receive
    m.remove(w)
    m.queue_unexpected(UnexpectedMessage(3, 3, 0, data=b""))
    assert not m.idle_for(1, 7, FULL_MASK)               # an unexpected message
    assert m.find_unexpected(3, 3, FULL_MASK, True) is not None
    assert m.idle_for(1, 7, FULL_MASK)


def test_idle_for_with_bucketed_receives(make):
    m = make()
    m.bucket_mask = FULL_MASK ^ 0xF0
    m.post(req(1, 0x107, m.bucket_mask))
    assert not m.idle_for(1, 0x1F7, FULL_MASK)           # the bucket takes it
    assert m.idle_for(1, 0x108, FULL_MASK) and m.idle_for(2, 0x107, FULL_MASK)
    assert not m.idle_for(1, 0x108, 0xFF)                # another mask than the bucket's
    assert m.idle_for(1, 0x108, m.bucket_mask)


def test_bucketed_receives_hash_by_source_and_masked_tag(make):
    """With a bucket_mask, receives from one source with exactly that mask
    match by (source, tag & mask), in posting order with the others."""
    m = make()
    m.bucket_mask = FULL_MASK ^ 0xF0
    a, b = req(1, 0x107, m.bucket_mask), req(1, 0x107, m.bucket_mask)
    anysrc, other = req(ANY_SOURCE, 0x107, m.bucket_mask), req(1, 0x107, 0xFF)
    m.post(a)
    m.post(b)
    assert m.requests_from(1) == [a, b]
    assert m.match_posted(1, 0x1F7) is a                 # masked-out bits differ
    assert m.match_posted(2, 0x107) is None               # another source
    assert m.match_posted(1, 0x108) is None               # a kept bit differs
    assert m.remove(b) and m.posted_count() == 0
    m.post(a)
    assert m.remove(a) and not m.remove(a) and m.posted_count() == 0
    m.post(anysrc)
    m.post(other)
    assert m.match_posted(1, 0x107) is anysrc and m.match_posted(1, 0x107) is other


def test_exact_bucketed_and_wildcard_receives_match_in_posting_order(make):
    m = make()
    m.bucket_mask = FULL_MASK ^ 0xF0
    first = req(1, 0x107, m.bucket_mask)
    exact = req(1, 0x107)
    later = req(1, 0x107, m.bucket_mask)
    for r in (first, exact, later):
        m.post(r)
    assert m.match_posted(1, 0x107) is first
    m.post(req(ANY_SOURCE, 0, 0))
    assert m.match_posted(1, 0x107) is exact
    assert m.match_posted(1, 0x107) is later
    assert m.match_posted(1, 0x107).source == ANY_SOURCE


def test_requests_from_and_matching_in_posting_order_per_queue(make):
    m = make()
    m.bucket_mask = FULL_MASK ^ 0xF0
    m.post(req(1, 0x107))
    m.post(req(1, 0x107, m.bucket_mask))
    m.post(req(1, 0x117))
    assert sorted(r.tag for r in m.requests_from(1)) == [0x107, 0x107, 0x117]
    assert sorted(r.tag for r in m.requests_matching(0x100, 0xF00)) == [0x107, 0x107, 0x117]
    assert m.requests_matching(0x200, 0xF00) == []


def test_a_receive_of_any_size_gets_a_buffer_of_the_message_size():
    """``buf`` None: capacity ANY_SIZE, and deliver_eager makes a bytearray
    of exactly the payload (empty included)."""
    from ucxpy.tag import ANY_SIZE
    for payload in (b"", b"xyz", bytes(range(200))):
        r = RecvRequest(None, None, 1, 9, FULL_MASK, None)
        assert r.capacity == ANY_SIZE and r.buf is None
        deliver_eager(r, 1, 9, memoryview(payload))
        assert r.done and type(r.buf) is bytearray and bytes(r.buf) == payload
        assert tuple(r.result) == (1, 9, len(payload))


def test_a_fresh_matcher_hashes_no_buckets_and_notifies_nobody(make):
    """A layer opts in (mpi_shim sets these at attach): by default no mask is
    bucketed and no match is reported."""
    m = make()
    assert m.bucket_mask is None and m.counts() == (0, 0)
    assert m.notify_mask == 0 and type(m.notify_mask) is int and m.notify is None


def test_the_native_bucket_mask_changes_only_while_nothing_is_posted():
    m = native_matcher()
    m.post(r := req(1, 2))
    with pytest.raises(RuntimeError, match="no receive is posted"):
        m.bucket_mask = 0xFF
    m.remove(r)
    m.bucket_mask = 0xFF
    assert m.bucket_mask == 0xFF


def test_first_for_prefers_the_earliest_of_exact_bucketed_and_wildcard(make):
    """first_for is match_posted without the match: of an exact, a bucketed
    and a wildcard receive that all take a message, the earliest posted wins;
    a wildcard posted after the candidate is not looked at."""
    m = make()
    m.bucket_mask = FULL_MASK ^ 0xFF
    assert m.first_for(1, 0x105) is None
    late_wild = req(ANY_SOURCE, 0x105)
    bucketed = req(1, 0x100, FULL_MASK ^ 0xFF)
    exact = req(1, 0x105)
    for r in (bucketed, exact, late_wild):
        m.post(r)
    assert m.first_for(1, 0x105) is bucketed            # earlier than the exact one
    assert m.first_for(2, 0x105) is late_wild           # only the wildcard takes source 2
    assert m.first_for(1, 0x1FF) is bucketed and m.first_for(1, 0x205) is None
    assert m.posted_count() == 3                          # nothing was taken
    assert m.match_posted(1, 0x105) is bucketed
    assert m.first_for(1, 0x105) is exact                # the wildcard came after it
    m.remove(exact)
    assert m.first_for(1, 0x105) is late_wild
    early_wild = req(1, 0x5, 0xF)
    m.post(early_wild)                                    # wildcard on tag bits, posted last
    assert m.first_for(1, 0x105) is late_wild            # the earlier wildcard still wins
    m.remove(late_wild)
    assert m.first_for(1, 0x105) is early_wild and m.first_for(2, 0x105) is None
    assert m.first_for(1, 0x15) is early_wild and m.first_for(1, 0x8) is None


def test_first_for_an_exact_receive_before_a_later_wildcard(make):
    m = make()
    exact, wild = req(3, 9), req(ANY_SOURCE, 9)
    m.post(exact)
    m.post(wild)
    assert m.first_for(3, 9) is exact and m.first_for(4, 9) is wild
    assert m.first_for(3, 8) is None


def test_the_python_matcher_completes_every_match_at_once():
    """deliver() completes the receives matched elsewhere: the Python
    matcher has none waiting, ever."""
    m = TagMatcher()
    m.post(r := req(1, 2))
    assert m.deliver() == 0
    assert m.match_posted(1, 2) is r and m.deliver() == 0


class _Worker:
    def __init__(self, matcher):
        self.matcher = matcher


@pytest.mark.parametrize("mask,notified", [(FULL_MASK, False), (FULL_MASK ^ 0xF0, True),
                                           (0xF, True), (FULL_MASK ^ 0xF, False)])
def test_handoff_matched_delivers_and_notifies_on_masked_notify_bits(mask, notified):
    """A match the data plane hands off is delivered here, and its worker's
    matcher hears of it when the message's tag has notify bits the receive
    did not name (a receive on a masked tag)."""
    from ucxpy.tag import handoff_matched
    m = TagMatcher()
    heard = []
    m.notify_mask = 0xF0
    m.notify = heard.append
    r = RecvRequest(_Worker(m), bytearray(8), 1, 0x10, mask, None)
    handoff_matched(r, 1, 0x10, memoryview(b"abc"))
    assert r.done and bytes(r.buf[:3]) == b"abc" and tuple(r.result) == (1, 0x10, 3)
    assert heard == ([r] if notified else [])


def test_handoff_matched_reports_a_message_too_large_or_not_kept():
    from ucxpy.errors import UcxpyError
    from ucxpy.tag import handoff_matched
    m = TagMatcher()
    r = RecvRequest(_Worker(m), bytearray(2), 1, 5, FULL_MASK, None)
    handoff_matched(r, 1, 5, memoryview(b"abcd"))
    assert r.done and isinstance(r.exc, TruncationError)
    assert r.exc.size == 4 and r.exc.capacity == 2
    r = RecvRequest(_Worker(m), bytearray(8), 1, 5, FULL_MASK, None)
    handoff_matched(r, 1, 5, None)
    assert r.done and isinstance(r.exc, UcxpyError)
    assert "out of memory" in str(r.exc) and "0x5" in str(r.exc)
    assert bytes(r.buf) == bytes(8)

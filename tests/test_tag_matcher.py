"""ucxpy.tag.TagMatcher against a reference model: the MPI matching rules
(earliest posted matching receive wins, wildcards on source and on masked
tag bits, oldest unexpected message first) over random sequences of posts,
cancels, arrivals and probes; plus deliver_eager's copy and truncation.
Pure logic, no workers: fast enough to be the mutation-testing suite of
ucxpy/tag.py (make mutation)."""
from __future__ import annotations

import random

import pytest

from ucxpy.errors import TruncationError
from ucxpy.request import TagInfo
from ucxpy.tag import (ANY_SOURCE, FULL_MASK, RecvRequest, TagMatcher, UnexpectedMessage,
                       deliver_eager)

TAGS = [0, 1, 2, 0x100, 0x101, FULL_MASK]
MASKS = [FULL_MASK, FULL_MASK ^ 0xFF, 0xFF, 0, FULL_MASK ^ 1]
SOURCES = [ANY_SOURCE, 0, 1, 2]


def req(source, tag, mask=FULL_MASK, size=8):
    return RecvRequest(None, bytearray(size), source, tag, mask, None)


def matches(r, source, tag):
    return (r.source == ANY_SOURCE or r.source == source) and (tag ^ r.tag) & r.mask == 0


@pytest.mark.parametrize("seed", range(40))
def test_matcher_agrees_with_the_reference_model(seed):
    """Half the seeds hash the receives whose mask is FULL_MASK ^ 0xFF
    (one of MASKS) in buckets, as mpi_shim has its MASK_TAG receives
    hashed: the matching must be the same."""
    rnd = random.Random(seed)
    m = TagMatcher()
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
            got = m.match_posted(src, tag)
            assert got is want, (seed, src, tag)
            if want is not None:
                posted.remove(want)
        for src in SOURCES[1:]:
            assert sorted(id(r) for r in m.requests_from(src)) == \
                sorted(id(r) for r in posted if r.source == src)
        for r in posted:                # sole_match: never wrong (the fast path trusts it)
            if r.source != ANY_SOURCE and m.sole_match(r):
                assert next(p for p in posted if matches(p, r.source, r.tag)) is r
                if r.mask not in (FULL_MASK, m.bucket_mask):
                    assert posted == [r]
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
    assert m.exact == {} and m.wild == []


def test_exact_and_wildcard_interleave_in_posting_order():
    m = TagMatcher()
    a, w, b = req(0, 5), req(ANY_SOURCE, 5), req(0, 5)
    for r in (a, w, b):
        m.post(r)
    assert [m.match_posted(0, 5) for _ in range(3)] == [a, w, b]
    assert m.match_posted(0, 5) is None and m.exact == {} and m.wild == []
    w2, a2 = req(ANY_SOURCE, 5, mask=0), req(0, 5)
    m.post(w2)
    m.post(a2)
    assert m.match_posted(0, 5) is w2 and m.match_posted(0, 5) is a2
    assert m.match_posted(0, 5) is None


def test_masked_bits_and_sources():
    m = TagMatcher()
    r = req(1, 0x1234, mask=FULL_MASK ^ 0xFF)
    m.post(r)
    assert m.match_posted(0, 0x1234) is None            # wrong source
    assert m.match_posted(1, 0x1334) is None            # an unmasked bit differs
    assert m.match_posted(1, 0x12AB) is r               # only masked bits differ
    m.post(r2 := req(2, 7))
    assert m.match_posted(2, 6) is None and m.match_posted(3, 7) is None
    assert m.match_posted(2, 7) is r2


def test_unexpected_queue_is_searched_oldest_first():
    m = TagMatcher()
    msgs = [UnexpectedMessage(s, t, n, data=bytes(n)) for s, t, n in
            [(0, 1, 1), (1, 1, 2), (0, 2, 3), (0, 1, 4)]]
    m.unexpected.extend(msgs)
    assert m.find_unexpected(0, 1, FULL_MASK, remove=False) is msgs[0]
    assert len(m.unexpected) == 4                        # a probe keeps it
    assert m.find_unexpected(ANY_SOURCE, 1, FULL_MASK, remove=True) is msgs[0]
    assert m.find_unexpected(ANY_SOURCE, 1, FULL_MASK, remove=True) is msgs[1]
    assert m.find_unexpected(0, 0, 0, remove=False) is msgs[2]   # any tag
    assert m.find_unexpected(1, 1, FULL_MASK, remove=True) is None
    assert m.find_unexpected(0, 3, FULL_MASK ^ 1, remove=True) is msgs[2]   # 3 ~ 2
    assert list(m.unexpected) == [msgs[3]]
    assert msgs[3].info == TagInfo(0, 1, 4)


def test_remove_of_one_exact_receive_keeps_its_siblings():
    m = TagMatcher()
    a, b = req(0, 1), req(0, 1)
    m.post(a)
    m.post(b)
    assert m.remove(a) and list(m.exact[(0, 1)]) == [b]
    assert m.remove(b) and (0, 1) not in m.exact
    assert not m.remove(b)
    w = req(ANY_SOURCE, 1)
    assert not m.remove(w)                               # never posted
    m.post(w)
    assert m.remove(w) and m.wild == []


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


# -- the native fast path's condition (Worker.recv_poller) --------------------------

class _W:
    def __init__(self):
        self.lock = None


def _req(source, tag, mask=FULL_MASK):
    return RecvRequest(_W(), memoryview(bytearray(8)), source, tag, mask, lambda r: True)


def test_sole_match_only_for_the_first_exact_receive_without_wildcards():
    m = TagMatcher()
    a, b, other = _req(1, 7), _req(1, 7), _req(2, 7)
    for r in (a, b, other):
        m.post(r)
    assert m.sole_match(a) and not m.sole_match(b) and m.sole_match(other)
    m.take(a)
    assert m.sole_match(b) and (1, 7) in m.exact
    m.take(b)
    assert (1, 7) not in m.exact and m.sole_match(other)
    wild = _req(ANY_SOURCE, 0, 0)
    m.post(wild)
    assert not m.sole_match(other)
    assert not TagMatcher().sole_match(_req(1, 7))


def test_sole_match_of_a_masked_receive_only_when_it_is_alone():
    m = TagMatcher()
    r = _req(1, 7, 0xFF)
    assert not m.sole_match(r)               # not posted
    m.post(r)
    assert m.sole_match(r)
    exact = _req(2, 9)
    m.post(exact)
    assert not m.sole_match(r)               # an exact receive could match it too
    m.take(exact)
    assert m.sole_match(r) and m.exact == {}
    other = _req(1, 8, 0xF0)
    m.post(other)
    assert not m.sole_match(r) and not m.sole_match(other)
    m.remove(other)
    m.take(r)
    assert m.wild == [] and not m.sole_match(r)


def test_bucketed_receives_hash_by_source_and_masked_tag():
    """With a bucket_mask, receives from one source with exactly that mask
    sit in ``buckets`` under (source, tag & mask), not in the wildcard list;
    others do not; matching, sole_match, take and remove use the bucket."""
    m = TagMatcher()
    m.bucket_mask = FULL_MASK ^ 0xF0
    a, b = _req(1, 0x107, m.bucket_mask), _req(1, 0x107, m.bucket_mask)
    anysrc, other = _req(ANY_SOURCE, 0x107, m.bucket_mask), _req(1, 0x107, 0xFF)
    m.post(a)
    m.post(b)
    assert list(m.buckets) == [(1, 0x107)] and list(m.buckets[(1, 0x107)]) == [a, b]
    assert m.wild == [] and m.exact == {}
    assert m.sole_match(a) and not m.sole_match(b)
    assert m.match_posted(1, 0x1F7) is a                 # masked-out bits differ
    assert m.match_posted(2, 0x107) is None               # another source
    assert m.match_posted(1, 0x108) is None               # a kept bit differs
    m.take(b)
    assert m.buckets == {}
    m.post(a)
    assert m.remove(a) and not m.remove(a) and m.buckets == {}
    m.post(anysrc)
    m.post(other)
    assert m.wild == [anysrc, other] and m.buckets == {}


def test_exact_bucketed_and_wildcard_receives_match_in_posting_order():
    m = TagMatcher()
    m.bucket_mask = FULL_MASK ^ 0xF0
    first = _req(1, 0x107, m.bucket_mask)
    exact = _req(1, 0x107)
    later = _req(1, 0x107, m.bucket_mask)
    for r in (first, exact, later):
        m.post(r)
    assert not m.sole_match(exact)        # the earlier bucketed receive takes 0x107 first
    assert m.sole_match(first)
    assert m.match_posted(1, 0x107) is first
    assert m.sole_match(exact)            # the bucketed one left is later
    m.post(_req(ANY_SOURCE, 0, 0))
    assert not m.sole_match(exact)        # a wildcard receive is posted
    assert m.match_posted(1, 0x107) is exact
    assert m.match_posted(1, 0x107) is later
    assert m.match_posted(1, 0x107).source == ANY_SOURCE


def test_sole_match_of_exact_and_bucketed_receives_against_each_other():
    m = TagMatcher()
    m.bucket_mask = FULL_MASK ^ 0xF0
    exact, bucketed = _req(1, 0x107), _req(1, 0x107, m.bucket_mask)
    m.post(exact)
    m.post(bucketed)
    assert m.sole_match(exact) and not m.sole_match(bucketed)
    m.take(exact)
    assert m.sole_match(bucketed) and m.exact == {}
    m.post(_req(1, 0x117))                # another tag: matches none of 0x107's messages
    assert m.sole_match(bucketed)
    m.post(_req(1, 0x107))                # a later exact one: the bucketed one is earlier
    assert m.sole_match(bucketed)
    assert [r.tag for r in m.requests_from(1)] == [0x117, 0x107, 0x107]
    assert [r.tag for r in m.requests_matching(0x100, 0xF00)] == [0x117, 0x107, 0x107]


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


def test_a_fresh_matcher_hashes_no_buckets_and_notifies_nobody():
    """A layer opts in (mpi_shim sets these at attach): by default no mask is
    bucketed and no match is reported."""
    m = TagMatcher()
    assert m.bucket_mask is None and m.buckets == {}
    assert m.notify_mask == 0 and type(m.notify_mask) is int and m.notify is None


def test_a_new_queue_is_the_spare_one():
    """post() files a new (source, tag) queue as the matcher's spare deque
    when it holds one (an emptied queue a fast wait kept): the spare is used
    once, then the next new queue is a new deque; receives then append."""
    import collections
    m = TagMatcher()
    assert m.spare is None
    spare = m.spare = collections.deque()
    a, b, c = req(0, 1), req(0, 1), req(0, 2)
    m.post(a)
    assert m.exact[(0, 1)] is spare and list(spare) == [a] and m.spare is None
    m.post(b)
    m.post(c)
    assert list(m.exact[(0, 1)]) == [a, b] and m.exact[(0, 2)] is not spare
    assert list(m.exact[(0, 2)]) == [c]

"""The data plane's matcher (native/dp/match.c) against the Python reference
(ucxpy.tag.TagMatcher): random MPI-order operation sequences (posts with a
source or ANY_SOURCE and full, bucketed, empty or odd masks; arrivals;
probes, removing or not; cancels) go to both, and every outcome must be the
same: which receive a message takes, which message a receive or probe takes,
what stays queued.  Deterministic (seeded) and in one process."""
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

"""The tcp transport's frame reader, driven with plain bytes (no sockets).

:class:`ucxpy.transports.tcp_frames.FrameReader` is sans-I/O, so these tests
feed it byte strings cut anywhere and check every delivered frame against
what was sent, which receive path it took (ring view, owner's buffer, big
buffer), how often the owner was asked for a buffer, and the exact limits at
which a frame is refused.  They are the mutation suite of tcp_frames.py
(``make mutation``); the fuzz test at the end throws random streams at it.
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ucxpy.errors import ProtocolError
from ucxpy.transports import tcp, tcp_frames as tf
from ucxpy.transports.base import MAX_HEADER

EP = object()


class Owner:
    """Records upcalls; ``dest(am_id, header, plen)`` answers recv_dest."""

    def __init__(self, direct=(), dest=None, on_frame=None):
        self.direct_am_ids = frozenset(direct)
        self.dest = dest or (lambda am_id, header, plen: bytearray(plen))
        self.on_frame = on_frame
        self.asked = []
        self.frames = []
        self.payloads = []

    def recv_dest(self, ep, am_id, header, plen):
        assert ep is EP
        self.asked.append((am_id, bytes(header), plen))
        return self.dest(am_id, header, plen)

    def recv_frame(self, ep, am_id, header, payload):
        assert ep is EP
        assert type(header) is memoryview and type(payload) is memoryview
        self.frames.append((am_id, bytes(header), bytes(payload), payload.obj))
        self.payloads.append(payload)
        if self.on_frame:
            self.on_frame(am_id)


def reader(owner, max_frame=1 << 40, max_buffered=1 << 30):
    return tf.FrameReader(owner, EP, max_frame, max_buffered)


def frames_of(owner):
    return [(a, h, p) for a, h, p, _obj in owner.frames]


def feed_chunks(r, data, size):
    n = 0
    for i in range(0, len(data), size):
        n += r.feed(data[i:i + size])
    return n


# ----------------------------------------------------------------- format

def test_prefix_bytes_are_pinned():
    assert tf.PREFIX.size == 16
    assert tf.pack_prefix(7, 3, 5) == bytes.fromhex("a7c5 07 00 0300 0000 0500000000000000")
    assert tf.pack_frame(9, b"hd", b"xyz") == tf.pack_prefix(9, 2, 3) + b"hdxyz"
    assert tf.pack_frame(1) == tf.pack_prefix(1, 0, 0)
    # the transport re-exports the format it sends with
    assert tcp.PREFIX is tf.PREFIX and tcp.FRAME_MAGIC == tf.FRAME_MAGIC == 0xC5A7


def test_frame_error_is_a_protocol_error():
    assert issubclass(tf.FrameError, ProtocolError)


# ----------------------------------------------------------------- ring path

def test_whole_frames_in_one_read():
    o = Owner()
    r = reader(o)
    data = tf.pack_frame(1, b"a", b"bc") + tf.pack_frame(2, b"", b"") + tf.pack_frame(3, b"hh", b"")
    assert r.feed(data) == 3
    assert frames_of(o) == [(1, b"a", b"bc"), (2, b"", b""), (3, b"hh", b"")]
    assert all(obj is r.buf for *_x, obj in o.frames)      # views into the ring
    assert o.asked == [] and r.buffered == 0 and r.pending is None


@pytest.mark.parametrize("size", [1, 2, 15, 16, 17, 100])
def test_any_cut_gives_the_same_frames(size):
    sent = [(i % 250, bytes([i]) * (i % 7), bytes([i ^ 0x5A]) * (i * 37 % 300)) for i in range(40)]
    data = b"".join(tf.pack_frame(*f) for f in sent)
    o = Owner()
    assert feed_chunks(reader(o), data, size) == len(sent)
    assert frames_of(o) == sent


def test_partial_frame_waits():
    o = Owner()
    r = reader(o)
    data = tf.pack_frame(4, b"hdr", b"payload")
    assert r.feed(data[:15]) == 0            # prefix incomplete
    assert r.feed(data[15:16]) == 0          # prefix complete, header missing
    assert r.feed(data[16:-1]) == 0          # payload one byte short
    assert r.buffered == len(data) - 1 and o.frames == []
    assert r.feed(data[-1:]) == 1
    assert frames_of(o) == [(4, b"hdr", b"payload")]


def test_space_is_the_free_end_and_empty_ring_rewinds():
    r = reader(Owner())
    assert r.space().nbytes == tf.RBUF_SIZE
    r.feed(tf.pack_frame(1, b"", b"x" * 10))
    assert (r.start, r.end) == (26, 26)
    assert r.space().nbytes == tf.RBUF_SIZE           # consumed everything: back to 0
    assert (r.start, r.end) == (0, 0)


def test_ring_compacts_only_when_the_reserve_is_reached():
    r = reader(Owner())
    first = tf.pack_frame(1, b"", b"f" * 100)
    tail = tf.pack_frame(2, b"", b"t" * 50)[:20]        # an incomplete frame stays behind
    fill = tf.RBUF_SIZE - tf.RESERVE - len(first) - len(tail)
    filler = tf.pack_frame(3, b"", b"z" * (fill - 16))
    r.feed(first + filler + tail)
    assert r.end == tf.RBUF_SIZE - tf.RESERVE             # exactly the reserve left: no move
    assert r.space().nbytes == tf.RESERVE and r.start == r.end - len(tail)
    r.feed(b"t" * 1)                                       # one byte into the reserve
    start, end = r.start, r.end
    room = r.space()                                       # now it compacts
    assert (r.start, r.end) == (0, end - start) and room.nbytes == tf.RBUF_SIZE - (end - start)
    assert bytes(r.buf[:r.end]) == tail + b"t"
    o = r.owner
    assert r.feed(b"t" * 44) == 0
    assert r.feed(b"t") == 1
    assert frames_of(o)[-1] == (2, b"", b"t" * 50)


def test_take_consumes_exactly_n():
    r = reader(Owner())
    r.feed(b"")
    r.end = 5
    r.buf[:5] = b"abcde"
    assert r.take(6) is None and r.start == 0
    assert r.take(2) == b"ab" and r.start == 2
    assert r.take(3) == b"cde" and r.buffered == 0
    assert r.take(1) is None


def test_reset_drops_buffered_and_pending():
    o = Owner(direct=[5])
    r = reader(o)
    r.feed(tf.pack_frame(5, b"h", b"p" * 100)[:30])
    assert r.pending is not None
    r.declined = True
    r.reset()
    assert (r.start, r.end, r.pending, r.declined) == (0, 0, None, False)


# ----------------------------------------------------------------- direct path

def test_direct_frame_lands_in_the_owners_buffer():
    bufs = []

    def dest(am_id, header, plen):
        bufs.append(bytearray(plen))
        return bufs[-1]
    o = Owner(direct=[7], dest=dest)
    r = reader(o)
    assert r.feed(tf.pack_frame(7, b"key", b"D" * 64) + tf.pack_frame(8, b"", b"R")) == 2
    assert o.asked == [(7, b"key", 64)]                  # only for the direct id
    assert frames_of(o) == [(7, b"key", b"D" * 64), (8, b"", b"R")]
    assert o.frames[0][3] is bufs[0] and bytes(bufs[0]) == b"D" * 64
    assert o.frames[1][3] is r.buf


@pytest.mark.parametrize("cut", [17, 20, 40, 80])
def test_direct_payload_read_straight_into_the_buffer(cut):
    dest = bytearray(1000)
    view = memoryview(dest)
    o = Owner(direct=[7], dest=lambda *a: view)
    r = reader(o)
    data = tf.pack_frame(7, b"k", bytes(range(250)) * 4)
    assert r.feed(data[:cut]) == 0
    assert r.pending is not None and (r.start, r.end) == (0, 0)
    assert r.pending[1] == cut - 17                       # what the ring held was copied
    room = r.space()
    assert room.obj is dest and room.nbytes == 1000 - (cut - 17)
    assert r.received(0) == 0
    assert r.feed(data[cut:]) == 1
    assert o.asked == [(7, b"k", 1000)] and r.pending is None
    assert o.frames == [(7, b"k", bytes(range(250)) * 4, dest)]
    assert o.payloads[0] is view                          # the owner's own view, not a copy


def test_direct_after_ring_frames_counts_every_frame():
    o = Owner(direct=[7])
    r = reader(o)
    data = tf.pack_frame(1, b"", b"a") + tf.pack_frame(7, b"", b"b") + tf.pack_frame(7, b"", b"c")
    assert r.feed(data) == 3
    assert frames_of(o) == [(1, b"", b"a"), (7, b"", b"b"), (7, b"", b"c")]


def test_refused_buffer_is_asked_once_then_ring():
    o = Owner(direct=[7], dest=lambda *a: None)
    r = reader(o)
    data = tf.pack_frame(7, b"h", b"x" * 300) + tf.pack_frame(7, b"i", b"y")
    assert feed_chunks(r, data, 10) == 2
    assert [a[1] for a in o.asked] == [b"h", b"i"]          # once per frame, not per read
    assert frames_of(o) == [(7, b"h", b"x" * 300), (7, b"i", b"y")]
    assert o.frames[0][3] is r.buf and not r.declined


def test_wrong_size_buffer_counts_as_refused():
    o = Owner(direct=[7], dest=lambda am, h, plen: bytearray(plen + 1))
    r = reader(o)
    assert r.feed(tf.pack_frame(7, b"", b"abc")) == 1
    assert o.frames[0][2] == b"abc" and o.frames[0][3] is r.buf


def test_direct_empty_payload():
    o = Owner(direct=[7], dest=lambda am, h, plen: bytearray(0))
    r = reader(o)
    assert r.feed(tf.pack_frame(7, b"h")) == 1
    assert frames_of(o) == [(7, b"h", b"")] and r.pending is None


# ----------------------------------------------------------------- big path

def ring_limit(hlen=0):
    """The largest payload that still waits in the ring."""
    return tf.RBUF_SIZE - tf.RESERVE - tf.PREFIX.size - hlen


@pytest.mark.parametrize("hlen", [0, 5])
def test_ring_or_big_at_the_exact_limit(hlen):
    o = Owner()
    r = reader(o)
    limit = ring_limit(hlen)
    for plen, big in ((limit, False), (limit + 1, True)):
        data = tf.pack_frame(3, b"h" * hlen, b"p" * plen)
        assert r.feed(data[:100]) == 0
        assert (r.pending is not None) == big
        assert r.buffered == (0 if big else 100)
        assert r.feed(data[100:]) == 1
        assert o.frames[-1][:3] == (3, b"h" * hlen, b"p" * plen)
        assert (o.frames[-1][3] is not r.buf) == big


def test_one_read_completes_a_big_frame_and_a_ring_frame():
    o = Owner(direct=[7])
    r = reader(o)
    big = b"B" * (tf.RBUF_SIZE + 100)
    assert r.feed(tf.pack_frame(1, b"h", big) + tf.pack_frame(7, b"", b"s")) == 2
    assert frames_of(o) == [(1, b"h", big), (7, b"", b"s")]
    assert o.asked == [(7, b"", 1)]                       # asked although a big frame came first


def test_refused_big_direct_frame_does_not_stick():
    o = Owner(direct=[7], dest=lambda am, h, plen: None if plen > 100 else bytearray(plen))
    r = reader(o)
    big = b"B" * (tf.RBUF_SIZE + 100)
    assert r.feed(tf.pack_frame(7, b"", big) + tf.pack_frame(7, b"", b"s")) == 2
    assert [a[2] for a in o.asked] == [len(big), 1]
    assert o.frames[1][3] is not r.buf                    # the second one went direct


def test_big_buffer_is_reused_up_to_the_cache_limit(monkeypatch):
    o = Owner()
    r = reader(o)
    size = tf.RBUF_SIZE + 10          # more than one read into the ring
    for _ in range(2):
        r.feed(tf.pack_frame(1, b"", b"q" * size))
    assert o.frames[0][3] is o.frames[1][3] is r.big.obj
    assert r.big.nbytes == max(size, tf.RBUF_SIZE * 4)
    kept = r.big
    r.feed(tf.pack_frame(1, b"", b"x" * kept.nbytes))    # exactly the cached size: reused
    assert r.big is kept and o.frames[-1][3] is kept.obj
    grown = tf.RBUF_SIZE * 4 + 1
    r.feed(tf.pack_frame(1, b"", b"g" * grown))
    assert r.big.nbytes == grown and o.frames[-1][3] is r.big.obj
    monkeypatch.setattr(tf, "BIG_CACHE", grown)
    r.feed(tf.pack_frame(1, b"", b"e" * grown))           # == the cache limit: still kept
    assert o.frames[-1][3] is r.big.obj
    kept = r.big
    r.feed(tf.pack_frame(1, b"", b"n" * (grown + 1)))     # above: a fresh buffer, cache kept
    assert o.frames[-1][3] is not kept.obj and r.big is kept
    assert o.frames[-1][2] == b"n" * (grown + 1)


# ----------------------------------------------------------------- limits

@pytest.mark.parametrize("field,value", [("magic", 0xC5A6), ("flags", 1), ("flags", 0x80)])
def test_bad_prefix_raises(field, value):
    fields = {"magic": tf.FRAME_MAGIC, "am": 1, "flags": 0, "hlen": 0, "plen": 0}
    fields[field] = value
    data = tf.PREFIX.pack(fields["magic"], fields["am"], fields["flags"], 0, 0)
    r = reader(Owner())
    with pytest.raises(tf.FrameError, match="bad frame prefix"):
        r.feed(data)


def test_header_limit_is_exact():
    o = Owner()
    r = reader(o)
    assert r.feed(tf.pack_frame(1, b"h" * MAX_HEADER, b"")) == 1
    with pytest.raises(tf.FrameError, match=f"header {MAX_HEADER + 1} B"):
        r.feed(tf.pack_prefix(1, MAX_HEADER + 1, 0))


def test_max_frame_is_exact():
    o = Owner()
    r = reader(o, max_frame=10)
    assert r.feed(tf.pack_frame(1, b"", b"x" * 10)) == 1
    with pytest.raises(tf.FrameError, match="payload 11 B"):
        r.feed(tf.pack_prefix(1, 0, 11))


def test_max_buffered_is_exact_for_frames_that_wait():
    o = Owner(direct=[2], dest=lambda *a: None)
    r = reader(o, max_buffered=100)
    assert r.feed(tf.pack_frame(1, b"", b"x" * 100)) == 1     # complete at once: fine
    assert r.feed(tf.pack_frame(1, b"", b"y" * 100)[:20]) == 0  # == limit: waits
    r.reset()
    with pytest.raises(tf.FrameError, match="payload length 101 exceeds the 100 B"):
        r.feed(tf.pack_frame(1, b"", b"z" * 101)[:20])
    r.reset()
    with pytest.raises(tf.FrameError):                         # refused direct too
        r.feed(tf.pack_frame(2, b"", b"z" * 101)[:20])


def test_direct_frames_are_not_bound_by_max_buffered():
    o = Owner(direct=[2])
    r = reader(o, max_buffered=10)
    data = tf.pack_frame(2, b"", b"d" * 500)
    assert r.feed(data[:30]) == 0 and r.feed(data[30:]) == 1
    assert o.frames[0][2] == b"d" * 500


def test_error_after_good_frames_keeps_them():
    o = Owner()
    r = reader(o)
    with pytest.raises(tf.FrameError):
        r.feed(tf.pack_frame(1, b"", b"ok") + b"\0" * 16)
    assert frames_of(o) == [(1, b"", b"ok")]


# ----------------------------------------------------------------- liveness

def test_closing_in_recv_frame_stops_delivery():
    r = None

    def close(am_id):
        if am_id == 2:
            r.live = False
    o = Owner(on_frame=close)
    r = reader(o)
    data = b"".join(tf.pack_frame(i, b"", b"x") for i in (1, 2, 3))
    assert r.feed(data) == 2
    assert [f[0] for f in o.frames] == [1, 2]


def test_closing_in_recv_dest_stops_delivery():
    r = None

    def dest(am_id, header, plen):
        r.live = False
        return bytearray(plen)
    o = Owner(direct=[2], dest=dest)
    r = reader(o)
    assert r.feed(tf.pack_frame(2, b"", b"x") + tf.pack_frame(1, b"", b"y")) == 0
    assert o.frames == [] and len(o.asked) == 1


def test_closing_in_a_direct_recv_frame_stops_delivery():
    r = None

    def close(am_id):
        r.live = False
    o = Owner(direct=[2], on_frame=close)
    r = reader(o)
    assert r.feed(tf.pack_frame(2, b"", b"x") + tf.pack_frame(2, b"", b"y")) == 1
    assert len(o.asked) == 1


def test_pending_completion_counts_one_frame():
    o = Owner(direct=[2])
    r = reader(o)
    data = tf.pack_frame(2, b"", b"x" * 40)
    r.feed(data[:20])
    room = r.space()
    room[:36] = data[20:]
    assert r.received(35) == 0 and r.received(1) == 1
    assert o.frames[0][2] == b"x" * 40


# ----------------------------------------------------------------- fuzzing

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
frame_st = st.tuples(st.integers(0, 255), st.binary(max_size=40), st.binary(max_size=3000))


@FUZZ
@given(st.lists(frame_st, max_size=12), st.lists(st.integers(1, 5000), min_size=1, max_size=8),
       st.sets(st.integers(0, 255), max_size=20), st.integers(0, 2))
def test_fuzz_frames_survive_any_cut_and_any_owner(sent, cuts, direct, mode):
    """Random frames, cut at random places, with the owner taking, refusing
    or mis-sizing direct buffers: exactly the frames sent come out, in order."""
    answers = {0: lambda am, h, plen: bytearray(plen), 1: lambda *a: None,
               2: lambda am, h, plen: bytearray(plen + 1) if plen % 2 else bytearray(plen)}
    o = Owner(direct=direct, dest=answers[mode])
    r = reader(o)
    data = b"".join(tf.pack_frame(*f) for f in sent)
    off, i = 0, 0
    while off < len(data):
        n = cuts[i % len(cuts)]
        r.feed(data[off:off + n])
        off += n
        i += 1
    assert frames_of(o) == [tuple(f) for f in sent]
    assert len(o.asked) == sum(1 for f in sent if f[0] in direct)


@FUZZ
@given(st.binary(min_size=1, max_size=400))
def test_fuzz_garbage_is_a_frame_error_or_frames(junk):
    """Arbitrary bytes either parse as frames or raise FrameError; nothing else."""
    o = Owner(direct=[1])
    r = reader(o, max_frame=1 << 20, max_buffered=1 << 16)
    try:
        r.feed(junk)
    except tf.FrameError:
        return
    for am_id, header, payload, _ in o.frames:
        assert len(header) <= MAX_HEADER


def test_pad_bytes_are_not_checked():
    # the pad bytes are not checked (they are reserved): a frame with them set
    # still parses, so old peers that leave garbage there keep working
    o = Owner()
    r = reader(o)
    raw = bytearray(tf.pack_frame(1, b"", b"z"))
    struct.pack_into("<H", raw, 6, 0xFFFF)
    assert r.feed(bytes(raw)) == 1

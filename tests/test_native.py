"""ucxpy._native: the shared-memory frame ring, atomics, fences and CMA."""
from __future__ import annotations

import errno
import mmap
import multiprocessing as mp
import os
import random
import secrets
import struct

import pytest

native = pytest.importorskip("ucxpy._native")
ffi, lib = native.ffi, native.lib

HDR = lib.UCXPY_RING_HDR_SIZE
OK, NOTIFY, FULL = lib.UCXPY_RING_OK, lib.UCXPY_RING_NOTIFY, lib.UCXPY_RING_FULL
TOOBIG, CORRUPT, CLOSED = lib.UCXPY_RING_TOOBIG, lib.UCXPY_RING_CORRUPT, lib.UCXPY_RING_CLOSED
BUSY, LOST = lib.UCXPY_RING_BUSY, lib.UCXPY_RING_LOST
PREFIX = lib.UCXPY_RING_PREFIX

pytestmark = pytest.mark.timeout(60)


# -- helpers ---------------------------------------------------------------------

class Ring:
    """A ring in an anonymous mapping with a producer (source 7) and a
    consumer handle."""

    def __init__(self, capacity=4096, mem=None):
        self.capacity = capacity
        self.size = HDR + capacity
        self.mm = mem if mem is not None else mmap.mmap(-1, self.size)
        self.base = ffi.from_buffer(self.mm)
        self.prod = ffi.new("ucxpy_ring_t *")
        self.cons = ffi.new("ucxpy_ring_t *")
        self.out = ffi.new("uint64_t[]", lib.UCXPY_RING_PEEK_OUT)

    def init(self):
        assert lib.ucxpy_ring_init(self.base, self.size) == 0
        return self.attach()

    def attach(self):
        assert lib.ucxpy_ring_attach_producer(self.prod, self.base, self.size, 7,
                                              os.getpid()) == 0
        assert lib.ucxpy_ring_attach(self.cons, self.base, self.size) == 0
        return self

    def producer(self, source, token=None):
        h = ffi.new("ucxpy_ring_t *")
        assert lib.ucxpy_ring_attach_producer(h, self.base, self.size, source,
                                              token or os.getpid()) == 0
        return h

    def push(self, am_id, hdr, payload):
        return lib.ucxpy_ring_push(self.prod, am_id, hdr, len(hdr), payload, len(payload))

    def pop(self):
        rc = lib.ucxpy_ring_peek(self.cons, self.out)
        if rc != 1:
            return rc
        o = self.out
        data = ffi.buffer(self.cons.data, self.capacity)
        frame = (o[0], bytes(data[o[1]:o[1] + o[2]]), bytes(data[o[3]:o[3] + o[4]]))
        lib.ucxpy_ring_release(self.cons)
        return frame

    def data_offset(self):
        """Byte position of the consumer's next frame in the data area."""
        return HDR + (self.cons.tail & (self.capacity - 1))


def _shm_file(size):
    path = f"/dev/shm/ucxpy-test-{os.getpid()}-{secrets.token_hex(6)}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    return path, fd


def _map(path, size):
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def _spawn(target, *args):
    p = mp.get_context("spawn").Process(target=target, args=args, daemon=True)
    p.start()
    return p


def _reap(*procs, timeout=30):
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


# -- ring ----------------------------------------------------------------------------

def test_ring_push_peek_release_roundtrip():
    r = Ring().init()
    assert r.pop() == 0
    assert r.push(7, b"head", b"payload") == OK
    assert r.push(255, b"", b"") == OK
    assert r.pop() == (7, b"head", b"payload")
    assert r.pop() == (255, b"", b"")
    assert r.pop() == 0


def test_ring_peek_is_idempotent_until_release():
    r = Ring().init()
    r.push(1, b"a", b"b")
    assert lib.ucxpy_ring_peek(r.cons, r.out) == 1
    first = list(r.out)
    assert lib.ucxpy_ring_peek(r.cons, r.out) == 1
    assert list(r.out) == first
    assert lib.ucxpy_ring_release(r.cons) == OK
    assert lib.ucxpy_ring_peek(r.cons, r.out) == 0


def test_ring_payload_is_8_byte_aligned():
    r = Ring().init()
    for hlen in range(0, 20):
        r.push(1, b"h" * hlen, b"p" * 3)
        assert lib.ucxpy_ring_peek(r.cons, r.out) == 1
        assert r.out[3] % 8 == 0 and r.out[1] % 8 == 0
        lib.ucxpy_ring_release(r.cons)


def test_ring_wraps_around_with_random_sizes():
    rng = random.Random(1234)
    r = Ring(4096).init()
    sent = []
    received = []
    for i in range(20000):
        hdr = bytes([i & 0xFF]) * rng.randrange(0, 40)
        payload = rng.randbytes(rng.randrange(0, 1500))
        while r.push(i & 0xFF, hdr, payload) == FULL:
            received.append(r.pop())
        sent.append((i & 0xFF, hdr, payload))
        if rng.random() < 0.3:
            f = r.pop()
            if f != 0:
                received.append(f)
    while True:
        f = r.pop()
        if f == 0:
            break
        received.append(f)
    assert received == sent
    assert r.cons.tail > 10 * r.capacity      # many laps were made


def test_ring_full_then_space_after_release():
    r = Ring(4096).init()
    n = 0
    while r.push(1, b"", b"x" * 496) == OK:
        n += 1
    assert n == 4096 // 512                   # 16-byte prefix + 496-byte payload
    assert r.push(1, b"", b"x" * 496) == FULL
    assert r.push(1, b"", b"") == FULL
    assert r.pop() == (1, b"", b"x" * 496)
    assert r.push(1, b"", b"x" * 496) == OK
    assert r.push(1, b"", b"x" * 496) == FULL


def test_ring_rejects_frames_that_can_never_fit():
    r = Ring(4096).init()
    assert lib.ucxpy_ring_max_payload(r.prod, 0) == 2048 - PREFIX
    assert r.push(1, b"", b"x" * (2048 - PREFIX)) == OK
    r.pop()
    assert r.push(1, b"", b"x" * (2048 - PREFIX + 1)) == TOOBIG
    assert r.push(256, b"", b"") == TOOBIG
    assert r.push(1, b"h" * 70000, b"") == TOOBIG


def test_ring_largest_frame_fits_at_any_position():
    r = Ring(4096).init()
    big = lib.ucxpy_ring_max_payload(r.prod, 0)
    for shift in range(0, 4096, 8 * 37):
        r.push(1, b"", b"y" * max(shift - PREFIX, 0))
        r.pop()
        assert r.push(2, b"", b"z" * big) == OK
        assert r.pop() == (2, b"", b"z" * big)


@pytest.mark.parametrize("field, value", [
    ("paylen", 1 << 31),       # longer than what was published
    ("paylen", 4000),          # longer than the bytes before the end of the ring
    ("hdrlen", 0xFFFF),
    ("kind", 9),               # unknown frame kind
])
def test_ring_corrupt_frame_prefix_is_rejected(field, value):
    r = Ring(4096).init()
    r.push(3, b"abc", b"defgh")
    off = r.data_offset()
    paylen, hdrlen, am_id, kind, _src = struct.unpack_from("<IHBBQ", r.mm, off)
    fields = dict(paylen=paylen, hdrlen=hdrlen, am_id=am_id, kind=kind)
    fields[field] = value
    struct.pack_into("<IHBBQ", r.mm, off, fields["paylen"], fields["hdrlen"],
                     fields["am_id"], fields["kind"], 7)
    assert lib.ucxpy_ring_peek(r.cons, r.out) == CORRUPT


def test_ring_corrupt_pad_and_indices_are_rejected():
    r = Ring(4096).init()
    # a PAD at position 0 claims to skip the whole ring, but only 8 bytes exist
    r.push(1, b"", b"")
    struct.pack_into("<IHBBQ", r.mm, r.data_offset(), 0, 0, 0, 2, 7)
    assert lib.ucxpy_ring_peek(r.cons, r.out) == CORRUPT
    # head runs more than a ring ahead of tail
    r = Ring(4096).init()
    struct.pack_into("<Q", r.mm, 128, 1 << 20)
    assert lib.ucxpy_ring_peek(r.cons, r.out) == CORRUPT
    # head not 8-aligned
    r = Ring(4096).init()
    struct.pack_into("<Q", r.mm, 128, 12)
    assert lib.ucxpy_ring_peek(r.cons, r.out) == CORRUPT
    # producer sees a tail ahead of its head
    r = Ring(4096).init()
    while r.push(1, b"", b"x" * 1000) == OK:
        pass
    struct.pack_into("<Q", r.mm, 256, 1 << 40)
    assert r.push(1, b"", b"x" * 1000) == CORRUPT


def test_ring_attach_validates_header():
    mm = mmap.mmap(-1, HDR + 4096)
    base = ffi.from_buffer(mm)
    h = ffi.new("ucxpy_ring_t *")
    assert lib.ucxpy_ring_attach(h, base, HDR + 4096) == -1       # no magic yet
    assert lib.ucxpy_ring_init(base, HDR + 4096) == 0
    assert lib.ucxpy_ring_attach(h, base, HDR + 4096) == 0
    assert lib.ucxpy_ring_attach(h, base, HDR + 2048) == -1       # size mismatch
    assert lib.ucxpy_ring_init(base, HDR + 3000) == -1            # not a power of two
    assert lib.ucxpy_ring_init(base + 8, HDR + 2048) == -1        # misaligned


def test_ring_close_record_follows_the_last_frame():
    r = Ring().init()
    r.push(1, b"", b"last")
    assert lib.ucxpy_ring_push_close(r.prod) == OK
    assert r.pop() == (1, b"", b"last")
    assert lib.ucxpy_ring_peek(r.cons, r.out) == 2 and r.out[5] == 7
    lib.ucxpy_ring_release(r.cons)
    assert lib.ucxpy_ring_peek(r.cons, r.out) == 0


def test_ring_closed_by_its_consumer_refuses_pushes():
    r = Ring().init()
    lib.ucxpy_ring_close_consumer(r.cons)
    assert lib.ucxpy_ring_is_closed(r.prod) == 1
    assert r.push(1, b"", b"x") == CLOSED
    assert lib.ucxpy_ring_check_header(r.cons) == -1


def test_ring_sleep_and_wake_flags():
    r = Ring().init()
    assert lib.ucxpy_ring_arm_consumer(r.cons) == 0          # empty: may sleep
    assert r.push(1, b"", b"a") == NOTIFY                       # exactly one wake-up
    assert r.push(1, b"", b"b") == OK
    assert lib.ucxpy_ring_arm_consumer(r.cons) == 1          # data: do not sleep
    lib.ucxpy_ring_disarm_consumer(r.cons)
    assert r.push(1, b"", b"c") == OK
    # producer waiting for space
    while r.push(1, b"", b"x" * 256) == OK:
        pass
    assert lib.ucxpy_ring_arm_producer(r.prod) < 264
    assert lib.ucxpy_ring_peek(r.cons, r.out) == 1
    assert lib.ucxpy_ring_release(r.cons) == NOTIFY
    lib.ucxpy_ring_peek(r.cons, r.out)
    assert lib.ucxpy_ring_release(r.cons) == OK


def test_ring_frames_carry_their_producers_source():
    r = Ring().init()
    a, b = r.producer(11), r.producer(22)
    lib.ucxpy_ring_push(a, 1, b"h", 1, b"from a", 6)
    lib.ucxpy_ring_push(b, 1, b"h", 1, b"from b", 6)
    srcs = []
    while lib.ucxpy_ring_peek(r.cons, r.out) == 1:
        srcs.append(r.out[5])
        lib.ucxpy_ring_release(r.cons)
    assert srcs == [11, 22]
    assert lib.ucxpy_ring_attach_producer(a, r.base, r.size, 0, 1) == -1   # sources are nonzero


def test_ring_lock_busy_and_dead_holder():
    r = Ring().init()
    shared_lock = 128 + 8                        # the producers' block: head, then lock
    struct.pack_into("<I", r.mm, shared_lock, 999999)
    assert lib.ucxpy_ring_lock_owner(r.cons) == 999999
    assert r.push(1, b"", b"x") == BUSY          # never waits
    assert lib.ucxpy_ring_break_lock(r.cons, 12345) == 0      # not the holder
    assert lib.ucxpy_ring_break_lock(r.cons, 999999) == 1
    assert r.push(1, b"", b"x") == OK and r.pop() == (1, b"", b"x")


def test_ring_waiters_are_named_to_the_consumer():
    r = Ring().init()
    a = r.producer(41)
    while lib.ucxpy_ring_push(a, 1, b"", 0, b"x" * 256, 256) == OK:
        pass
    assert lib.ucxpy_ring_arm_producer(a) < 300
    assert lib.ucxpy_ring_arm_producer(a) < 300          # listed once
    assert lib.ucxpy_ring_peek(r.cons, r.out) == 1
    assert lib.ucxpy_ring_release(r.cons) == NOTIFY
    out = ffi.new("uint64_t[]", lib.UCXPY_RING_WAITERS)
    assert lib.ucxpy_ring_take_waiters(r.cons, out, lib.UCXPY_RING_WAITERS) == 1
    assert out[0] == 41
    assert lib.ucxpy_ring_take_waiters(r.cons, out, lib.UCXPY_RING_WAITERS) == 0
    # more waiters than the table holds: the consumer is told to wake everyone
    hs = [r.producer(100 + i) for i in range(lib.UCXPY_RING_WAITERS + 1)]
    for h in hs:
        lib.ucxpy_ring_arm_producer(h)
    k = lib.ucxpy_ring_take_waiters(r.cons, out, lib.UCXPY_RING_WAITERS)
    assert k & lib.UCXPY_RING_WAITERS_LOST and k & 0xFFFF == lib.UCXPY_RING_WAITERS


def test_ring_reset_fails_only_the_producers_that_lost_frames():
    r = Ring().init()
    a, b, c = r.producer(1), r.producer(2), r.producer(3)
    lib.ucxpy_ring_push(a, 1, b"", 0, b"delivered", 9)
    assert r.pop() == (1, b"", b"delivered")
    lib.ucxpy_ring_push(b, 1, b"", 0, b"lost", 4)      # published, never consumed
    struct.pack_into("<B", r.mm, r.data_offset() + 7, 9)   # scribble: unknown kind
    assert lib.ucxpy_ring_peek(r.cons, r.out) == CORRUPT
    struct.pack_into("<Q", r.mm, 0, 0)                 # and the magic
    assert lib.ucxpy_ring_check_header(r.cons) == -1
    assert lib.ucxpy_ring_reset(r.cons, os.getpid()) == 1
    assert lib.ucxpy_ring_check_header(r.cons) == 0
    assert lib.ucxpy_ring_check_lost(b) == 1           # its frame was discarded
    assert lib.ucxpy_ring_check_lost(b) == 1           # for good: the connection fails
    assert lib.ucxpy_ring_push(b, 1, b"", 0, b"gap", 3) == LOST      # no push past a gap
    assert lib.ucxpy_ring_push(a, 1, b"", 0, b"after", 5) == OK      # nothing of a's lost
    assert lib.ucxpy_ring_push(c, 1, b"", 0, b"c", 1) == OK          # c never pushed
    assert r.pop() == (1, b"", b"after") and r.pop() == (1, b"", b"c")
    # a reset while the lock is held waits for it
    struct.pack_into("<I", r.mm, 128 + 8, 4242)
    assert lib.ucxpy_ring_reset(r.cons, os.getpid()) == 0
    # the push after a reset that lost its frames reports LOST instead of pushing
    lib.ucxpy_ring_break_lock(r.cons, 4242)
    lib.ucxpy_ring_push(a, 1, b"", 0, b"gone", 4)
    assert lib.ucxpy_ring_reset(r.cons, os.getpid()) == 1
    assert lib.ucxpy_ring_push(a, 1, b"", 0, b"x", 1) == LOST
    assert lib.ucxpy_ring_push(a, 1, b"", 0, b"x", 1) == LOST        # it sticks
    assert lib.ucxpy_ring_push_close(a) in (OK, NOTIFY)      # but the end is still told
    assert lib.ucxpy_ring_peek(r.cons, r.out) == 2 and r.out[5] == 1


EPOCH = 896                 # native/ring.c's ring_shared_t: the resets' count


def test_ring_scribbled_epoch_fails_no_producer():
    """A peer that scribbles on the shared epoch makes no connection fail:
    an epoch no reset recorded is ignored, and the consumer puts it back."""
    r = Ring().init()
    a = r.producer(1)
    lib.ucxpy_ring_push(a, 1, b"", 0, b"pending", 7)
    for bogus in (0x746006_4dd412ac79, 3, 1):
        struct.pack_into("<Q", r.mm, EPOCH, bogus)
        assert lib.ucxpy_ring_check_lost(a) == 0
        assert lib.ucxpy_ring_push(a, 1, b"", 0, b"more", 4) == OK
        late = r.producer(9)                          # attaching meanwhile
        assert lib.ucxpy_ring_check_header(r.cons) == 0       # put back ...
        assert struct.unpack_from("<Q", r.mm, EPOCH)[0] == 0
        assert lib.ucxpy_ring_check_lost(late) == 0
    assert r.pop()[2] == b"pending"
    while lib.ucxpy_ring_peek(r.cons, r.out) == 1:
        lib.ucxpy_ring_release(r.cons)
    # ... and a genuine reset afterwards still reaches whoever lost frames
    lib.ucxpy_ring_push(a, 1, b"", 0, b"lost", 4)
    struct.pack_into("<Q", r.mm, EPOCH, 77)           # (with the epoch scribbled again)
    assert lib.ucxpy_ring_reset(r.cons, os.getpid()) == 1
    assert struct.unpack_from("<Q", r.mm, EPOCH)[0] == 1
    assert lib.ucxpy_ring_check_lost(a) == 1
    assert lib.ucxpy_ring_check_lost(late) == 0


def _mpsc_producer(path, size, source, count, seed):
    mm = _map(path, size)
    r = Ring(size - HDR, mm)
    h = r.producer(source)
    rng = random.Random(seed)
    for i in range(count):
        payload = struct.pack("<II", source, i) * rng.randrange(0, 40)
        hdr = struct.pack("<Q", i)
        while True:
            rc = lib.ucxpy_ring_push(h, i & 0xFF, hdr, 8, payload, len(payload))
            if rc in (OK, NOTIFY):
                break
            assert rc in (FULL, BUSY), rc
    while lib.ucxpy_ring_push_close(h) not in (OK, NOTIFY):
        pass


def test_ring_many_producer_processes_keep_each_ones_order():
    size = HDR + 16384
    path, fd = _shm_file(size)
    procs = []
    try:
        mm = mmap.mmap(fd, size)
        os.close(fd)
        r = Ring(16384, mm)
        assert lib.ucxpy_ring_init(r.base, size) == 0
        assert lib.ucxpy_ring_attach(r.cons, r.base, size) == 0
        count, sources = 5000, (101, 202, 303)
        procs = [_spawn(_mpsc_producer, path, size, src, count, src) for src in sources]
        rngs = {src: random.Random(src) for src in sources}
        nxt = {src: 0 for src in sources}
        data = ffi.buffer(r.cons.data, 16384)
        open_ = set(sources)
        while open_:
            rc = lib.ucxpy_ring_peek(r.cons, r.out)
            if rc == 0:
                continue
            o = r.out
            src = o[5]
            if rc == 2:
                assert nxt[src] == count
                open_.discard(src)
            else:
                assert rc == 1
                i = nxt[src]
                assert data[o[1]:o[1] + o[2]] == struct.pack("<Q", i)
                assert data[o[3]:o[3] + o[4]] == \
                    struct.pack("<II", src, i) * rngs[src].randrange(0, 40)
                nxt[src] = i + 1
            lib.ucxpy_ring_release(r.cons)
        assert _reap(*procs) == [0, 0, 0]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        os.unlink(path)


def _ring_producer(path, size, count, seed):
    mm = _map(path, size)
    r = Ring(size - HDR, mm)
    assert lib.ucxpy_ring_attach_producer(r.prod, r.base, size, 7, os.getpid()) == 0
    rng = random.Random(seed)
    for i in range(count):
        payload = struct.pack("<I", i) * rng.randrange(0, 64)
        hdr = struct.pack("<Q", i)
        while lib.ucxpy_ring_push(r.prod, i & 0xFF, hdr, 8, payload, len(payload)) == FULL:
            pass
    lib.ucxpy_ring_push_close(r.prod)


def test_ring_across_processes_keeps_order_and_content():
    size = HDR + 8192
    path, fd = _shm_file(size)
    p = None
    try:
        mm = mmap.mmap(fd, size)
        os.close(fd)
        r = Ring(8192, mm)
        assert lib.ucxpy_ring_init(r.base, size) == 0
        assert lib.ucxpy_ring_attach(r.cons, r.base, size) == 0
        count = 50000
        p = _spawn(_ring_producer, path, size, count, 99)
        rng = random.Random(99)
        data = ffi.buffer(r.cons.data, 8192)
        i = 0
        while True:
            rc = lib.ucxpy_ring_peek(r.cons, r.out)
            if rc == 0:
                continue
            if rc == 2:
                break
            assert rc == 1
            o = r.out
            assert o[0] == i & 0xFF
            assert data[o[1]:o[1] + o[2]] == struct.pack("<Q", i)
            assert data[o[3]:o[3] + o[4]] == struct.pack("<I", i) * rng.randrange(0, 64)
            lib.ucxpy_ring_release(r.cons)
            i += 1
        assert i == count
        assert _reap(p) == [0]
    finally:
        if p is not None and p.is_alive():
            p.kill()
        os.unlink(path)


# -- atomics ----------------------------------------------------------------------

@pytest.mark.parametrize("bits", [32, 64])
def test_atomic_operations(bits):
    t = f"uint{bits}_t"
    mask = (1 << bits) - 1
    cell = ffi.new(f"{t}[2]")
    p = cell + 1
    f = lambda name: getattr(lib, f"ucxpy_atomic_{name}{bits}")  # noqa: E731
    f("store")(p, 10)
    assert f("load")(p) == 10
    f("add")(p, 5)
    assert cell[1] == 15
    assert f("fetch_add")(p, mask) == 15 and cell[1] == 14          # wraps: -1
    assert f("swap")(p, 0xF0) == 14 and cell[1] == 0xF0
    assert f("cswap")(p, 1, 2) == 0xF0 and cell[1] == 0xF0          # no swap
    assert f("cswap")(p, 0xF0, 0x3C) == 0xF0 and cell[1] == 0x3C
    f("and")(p, 0x0F)
    assert cell[1] == 0x0C
    f("or")(p, 0x30)
    assert cell[1] == 0x3C
    f("xor")(p, 0xFF)
    assert cell[1] == 0xC3
    assert f("fetch_and")(p, 0x0F) == 0xC3 and cell[1] == 0x03
    assert f("fetch_or")(p, 0x10) == 0x03 and cell[1] == 0x13
    assert f("fetch_xor")(p, 0x13) == 0x13 and cell[1] == 0
    f("store")(p, mask)
    f("add")(p, 1)
    assert cell[1] == 0 and cell[0] == 0                            # neighbour untouched


def _disassemble(func):
    """Instructions of one exported function of the built extension."""
    import platform
    import shutil
    import subprocess
    if platform.machine() not in ("x86_64", "AMD64") or shutil.which("objdump") is None:
        pytest.skip("instruction check written for x86-64 with objdump")
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", native.__file__],
                         capture_output=True, text=True, timeout=60).stdout
    body, inside = [], False
    for line in out.splitlines():
        if line.endswith(f"<{func}>:"):
            inside = True
        elif inside and not line.strip():
            break
        elif inside:
            body.append(line.split(":", 1)[-1].strip())
    assert body, f"{func} not found in {native.__file__}"
    return body


def _full_barrier(insns):
    return any(i.startswith("mfence") or i.startswith("lock ") or i.startswith("xchg")
               for i in insns)


@pytest.mark.parametrize("func", ["ucxpy_fence_seq_cst", "ucxpy_ring_arm_consumer",
                                  "ucxpy_ring_arm_producer", "ucxpy_ring_push",
                                  "ucxpy_ring_release"])
def test_store_load_fences_are_real_barriers(func):
    """x86 reorders a store before a later load (store buffering), so the
    sleeper/waker handshake of the ring (set my flag, then read the other
    side's index; Dekker style, see native/ring.c) needs a full barrier in
    the machine code, not just a compiler barrier: a seq_cst fence weakened
    to acquire/release would compile to nothing here and lose wake-ups
    without any Python-level test noticing."""
    insns = _disassemble(func)
    assert _full_barrier(insns), f"{func} has no full barrier:\n" + "\n".join(insns)


def _mp_writer(path, size, rounds):
    mm = _map(path, size)
    base = ffi.from_buffer(mm)
    data = ffi.cast("uint64_t *", base + 64)
    for i in range(1, rounds + 1):
        while lib.ucxpy_atomic_load64(base + 8) != i - 1:   # reader took round i-1
            pass
        for k in range(8):
            data[k] = i * 8 + k
        lib.ucxpy_fence_release()
        lib.ucxpy_atomic_swap64(base, i)                  # publish round i


def test_fences_order_a_message_between_processes():
    """Message passing: the writer fills 8 words, release-fences, publishes a
    round number; the reader sees the number, acquire-fences and must read
    exactly that round's words (never a mix of two rounds), 20000 rounds."""
    size, rounds = 4096, 20000
    path, fd = _shm_file(size)
    os.close(fd)
    try:
        mm = _map(path, size)
        base = ffi.from_buffer(mm)
        data = ffi.cast("uint64_t *", base + 64)
        p = _spawn(_mp_writer, path, size, rounds)
        for i in range(1, rounds + 1):
            spins = 0
            while lib.ucxpy_atomic_load64(base) != i:
                spins += 1
                if spins % 100000 == 0:
                    assert p.is_alive() or lib.ucxpy_atomic_load64(base) == i, \
                        f"writer died at round {i}"
                    os.sched_yield()
            lib.ucxpy_fence_acquire()
            got = [data[k] for k in range(8)]
            assert got == [i * 8 + k for k in range(8)], (i, got)
            lib.ucxpy_atomic_swap64(base + 8, i)
        p.join(10)
        assert p.exitcode == 0
    finally:
        os.unlink(path)


def _hammer(path, size, iters, slot):
    mm = _map(path, size)
    base = ffi.from_buffer(mm)
    for _ in range(iters):
        lib.ucxpy_atomic_fetch_add64(base, 1)
        lib.ucxpy_atomic_add32(base + 8, 3)
        while True:     # compare-and-swap increment loop
            old = lib.ucxpy_atomic_load64(base + 16)
            if lib.ucxpy_atomic_cswap64(base + 16, old, old + 1) == old:
                break
        lib.ucxpy_atomic_xor64(base + 24, 1 << slot)


def test_atomics_under_multiprocess_contention():
    size, nproc, iters = 4096, 4, 20000
    path, fd = _shm_file(size)
    os.close(fd)
    procs = []
    try:
        procs = [_spawn(_hammer, path, size, iters, k) for k in range(nproc)]
        assert _reap(*procs, timeout=50) == [0] * nproc
        mm = _map(path, size)
        counter, adds, cas, bits = struct.unpack_from("<QIxxxxQQ", mm)
        assert counter == nproc * iters
        assert adds == (3 * nproc * iters) & 0xFFFFFFFF
        assert cas == nproc * iters
        assert bits == 0                    # each slot flipped an even number of times
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        os.unlink(path)


# -- CMA -------------------------------------------------------------------------------

def _cma_target(conn):
    buf = bytearray(b"".join(b"%08d" % i for i in range(1 << 17)))   # 1 MiB
    c = ffi.from_buffer(buf)
    conn.send((int(ffi.cast("uintptr_t", c)), len(buf), lib.ucxpy_cma_probe_addr()))
    conn.recv()                             # parent wrote into us; report back
    conn.send(bytes(buf[:16]))
    conn.recv()


def test_cma_read_write_between_processes():
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_cma_target, args=(b,), daemon=True)
    p.start()
    try:
        assert a.poll(30)
        addr, n, probe = a.recv()
        rc = lib.ucxpy_cma_probe(p.pid, probe)
        if rc != 1:
            pytest.skip(f"CMA not permitted here: {os.strerror(-rc) if rc < 0 else rc}")
        expect = b"".join(b"%08d" % i for i in range(1 << 17))
        dst = bytearray(n)
        assert lib.ucxpy_cma_read(p.pid, ffi.from_buffer(dst), addr, n) == n
        assert dst == expect
        part = bytearray(8)
        assert lib.ucxpy_cma_read(p.pid, ffi.from_buffer(part), addr + 8 * 1000, 8) == 8
        assert part == b"00001000"
        assert lib.ucxpy_cma_write(p.pid, b"WRITTEN!", addr, 8) == 8
        a.send("check")
        assert a.poll(30)
        assert a.recv() == b"WRITTEN!00000001"
        assert lib.ucxpy_cma_read(p.pid, ffi.from_buffer(part), 16, 8) == -errno.EFAULT
        a.send("exit")
        assert _reap(p) == [0]
        assert lib.ucxpy_cma_probe(p.pid, probe) < 0              # gone (ESRCH)
    finally:
        if p.is_alive():
            p.kill()
            p.join()


def test_cma_probe_self():
    assert lib.ucxpy_cma_probe(os.getpid(), lib.ucxpy_cma_probe_addr()) in (1, -errno.EPERM,
                                                                            -errno.ENOSYS)


# -- ucxpy._apilock.serialized: a method called holding a lock ----------------------

def _lock(kind):
    import threading
    from ucxpy._apilock import ApiLock
    return {"rlock": threading.RLock, "lock": threading.Lock, "api": ApiLock}[kind]()


@pytest.mark.parametrize("kind", ["rlock", "api"])
def test_serialized_holds_the_lock_binds_and_keeps_the_metadata(kind):
    import functools
    import inspect
    from ucxpy._apilock import serialized
    lock = _lock(kind)

    class A:
        def f(self, x, y=2):
            """doc of f"""
            assert lock._is_owned()
            return self, x, y

        def boom(self):
            assert lock._is_owned()
            raise KeyError("k")

        @classmethod
        def c(cls, v):
            assert lock._is_owned()
            return cls, v

        @staticmethod
        def s(v):
            assert lock._is_owned()
            return v
    A.f = functools.update_wrapper(serialized(A.f, lock), A.f)
    A.boom = serialized(A.boom, lock)
    A.c = classmethod(serialized(vars(A)["c"].__func__, lock))
    A.s = staticmethod(serialized(vars(A)["s"].__func__, lock))
    a = A()
    assert a.f(1) == (a, 1, 2) and a.f(1, y=3) == (a, 1, 3) and A.f(a, 5) == (a, 5, 2)
    assert (A.f.__doc__, A.f.__name__, str(inspect.signature(A.f))) == \
        ("doc of f", "f", "(self, x, y=2)")
    assert A.c(4) == (A, 4) and a.s(7) == 7
    with pytest.raises(KeyError):
        a.boom()
    assert not lock._is_owned()                  # released after the exception too
    with pytest.raises(TypeError):
        serialized(42, lock)
    with pytest.raises(AttributeError):
        serialized(len, object())                # no acquire/release


@pytest.mark.parametrize("kind", ["lock", "api"])
def test_serialized_excludes_other_threads(kind):
    import threading
    from ucxpy._apilock import serialized
    lock = _lock(kind)
    inside, overlaps = [], []

    def body(i):
        inside.append(i)
        if len(inside) != 1:
            overlaps.append(list(inside))
        for _ in range(200):
            pass
        inside.pop()
    f = serialized(body, lock)
    ts = [threading.Thread(target=lambda: [f(i) for i in range(300)]) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert inside == [] and overlaps == []


# -- ucxpy._apilock.ApiLock: RLock's interface, taken by serialized in C ------------

def test_api_lock_is_reentrant_like_an_rlock():
    import threading
    from ucxpy._apilock import ApiLock
    lock = ApiLock()
    assert not lock._is_owned() and "unlocked" in repr(lock)
    with pytest.raises(RuntimeError):
        lock.release()
    assert lock.acquire() and lock.acquire(blocking=False) and lock.acquire(timeout=0.01)
    assert lock._is_owned() and "count=3" in repr(lock)
    state = lock._release_save()                 # Condition's protocol: all counts at once
    assert state[0] == 3 and not lock._is_owned()
    lock._acquire_restore(state)
    assert lock._is_owned() and "count=3" in repr(lock)
    for _ in range(3):
        lock.release()
    assert not lock._is_owned()
    with lock:
        with lock:
            assert lock._is_owned()
    assert not lock._is_owned()
    with pytest.raises(ValueError):
        lock.acquire(False, 1.0)
    with pytest.raises(ValueError):
        lock.acquire(timeout=-3)
    with pytest.raises(RuntimeError):
        lock._release_save()
    cond = threading.Condition(lock)             # usable as a Condition's lock
    with cond:
        assert not cond.wait(0.01)


def test_api_lock_excludes_and_times_out_across_threads():
    import threading
    import time
    from ucxpy._apilock import ApiLock
    lock = ApiLock()
    lock.acquire()
    seen = {}

    def other():
        seen["try"] = lock.acquire(blocking=False)
        t0 = time.monotonic()
        seen["timed"] = lock.acquire(timeout=0.05)
        seen["waited"] = time.monotonic() - t0
        with pytest.raises(RuntimeError):    # not this thread's to release
            lock.release()
        seen["got"] = lock.acquire(timeout=10)   # once the main thread lets go
        lock.release()
    t = threading.Thread(target=other)
    t.start()
    time.sleep(0.2)
    lock.release()
    t.join(10)
    assert seen["try"] is False and seen["timed"] is False and seen["waited"] >= 0.04, seen
    assert seen["got"] is True and not lock._is_owned()


def test_api_lock_counts_under_contention():
    import threading
    import time
    from ucxpy._apilock import ApiLock
    lock, n = ApiLock(), [0]

    def work():
        for i in range(3000):
            with lock:
                v = n[0]
                if i % 100 == 0:
                    time.sleep(0)                # let another thread want it meanwhile
                n[0] = v + 1
    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert n[0] == 12000


def test_threads_alive_counts_like_active_count():
    """The wait loops' lock-free thread count (ucxpy.progress_thread)."""
    import threading
    from ucxpy.progress_thread import threads_alive
    base = threading.active_count()
    assert threads_alive() == base
    ev = threading.Event()
    ts = [threading.Thread(target=ev.wait) for _ in range(3)]
    for t in ts:
        t.start()
    assert threads_alive() == threading.active_count() == base + 3
    ev.set()
    for t in ts:
        t.join()
    assert threads_alive() == base

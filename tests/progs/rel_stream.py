"""Checksummed message streams between ranks, for faults, load and soak tests.

Every rank streams messages to the next FANOUT ranks (rank+1 .. rank+FANOUT,
modulo size) and receives from the previous ones, keeping WINDOW sends and
WINDOW receives outstanding per peer.  Each message carries a 16-byte prefix
(sequence number, payload crc32, payload length) and a payload whose size
cycles through eager-short, eager-copy and rendezvous sizes.  The receiver
checks the sequence (nothing lost, duplicated or overtaken), the length and
the crc (nothing corrupted).  The stream ends after --count messages per peer
or --seconds, whichever comes first, with an END message carrying the count.

Prints 'STREAM <rank> sent=<n> received=<n> verified=<n> bytes=<n> secs=<t>'
and exits 0 only if every stream verified; any error prints 'STREAM-FAIL'.
"""
import argparse
import os
import struct
import sys
import time
import zlib

import numpy as np

import ucxpy

ap = argparse.ArgumentParser()
ap.add_argument("--count", type=int, default=1000, help="messages per peer (max)")
ap.add_argument("--seconds", type=float, default=0, help="stop sending after this long (0 = no limit)")
ap.add_argument("--fanout", type=int, default=1)
ap.add_argument("--window", type=int, default=16)
ap.add_argument("--max-size", type=int, default=200_000)
ap.add_argument("--timeout", type=float, default=120, help="no progress for this long = failure")
opts = ap.parse_args()

PREFIX = struct.Struct("<QII")
END = (1 << 64) - 1
TAG = 0x5EED

world = ucxpy.init()
rank, size, w = world.rank, world.size, world.worker
fanout = min(opts.fanout, size - 1)
dests = [(rank + i) % size for i in range(1, fanout + 1)]
srcs = [(rank - i) % size for i in range(1, fanout + 1)]
cycle = [0, 1, 200, 4000, 9000, 17000, 70000, opts.max_size - PREFIX.size]
cycle = [min(s, opts.max_size - PREFIX.size) for s in cycle]
_pools = {}


def pool(src):
    """Random bytes only ``src`` and its receivers know: payloads are slices."""
    if src not in _pools:
        _pools[src] = np.random.default_rng(src).integers(
            0, 256, opts.max_size + 4096, dtype=np.uint8).tobytes()
    return _pools[src]


def body_of(src, dest, seq):
    n = cycle[(seq + dest) % len(cycle)]
    off = (seq * 131 + dest * 17) % 4096
    return pool(src)[off:off + n]


def make(seq, dest):
    body = body_of(rank, dest, seq)
    return PREFIX.pack(seq, zlib.crc32(body), len(body)) + body


events = [0]


def bump(_req):
    events[0] += 1


class Out:
    def __init__(self, dest):
        self.dest, self.seq, self.inflight, self.ended = dest, 0, [], False


class In:
    def __init__(self, src):
        self.src, self.expect, self.posted, self.ended, self.verified = src, 0, [], False, 0


outs = [Out(d) for d in dests]
ins = [In(s) for s in srcs]
sent = received = verified = nbytes = 0
t0 = time.monotonic()
stop_at = t0 + opts.seconds if opts.seconds else float("inf")


def post_recv(st):
    buf = bytearray(opts.max_size)
    req = world.irecv(buf, source=st.src, tag=TAG)
    st.posted.append((buf, req))
    if req.done:
        events[0] += 1
    else:
        req.add_done_callback(bump)


# Warm-up barrier: it connects the pairs finalize's barrier uses, so no
# connection is first opened while peers are already closing (see the
# "incoming connection not yet accepted" race in docs/guide/failure-model.md).
world.barrier(timeout=opts.timeout)
for st in ins:
    for _ in range(opts.window):
        post_recv(st)

last_event = time.monotonic()
try:
    while not (all(o.ended and not o.inflight for o in outs) and all(i.ended for i in ins)):
        seen = events[0]
        now = time.monotonic()
        for o in outs:
            while o.inflight and o.inflight[0][1].done:
                _, req = o.inflight.pop(0)
                req.wait(0)                     # raises the send's error, if any
            while not o.ended and len(o.inflight) < opts.window:
                if o.seq >= opts.count or now >= stop_at:
                    msg = PREFIX.pack(END, 0, o.seq)
                    o.ended = True
                else:
                    msg = make(o.seq, o.dest)
                    o.seq += 1
                    sent += 1
                req = world.isend(msg, dest=o.dest, tag=TAG)
                o.inflight.append((msg, req))
                if not req.done:
                    req.add_done_callback(bump)
        for st in ins:
            while st.posted and st.posted[0][1].done:
                buf, req = st.posted.pop(0)
                info = req.wait(0)
                seq, crc, n = PREFIX.unpack_from(buf)
                if seq == END:
                    if n != st.expect:
                        raise AssertionError(f"from {st.src}: END says {n} messages, got {st.expect}")
                    st.ended = True
                    st.posted.clear()        # withdraw the spare receives
                    continue
                received += 1
                if seq != st.expect:
                    raise AssertionError(f"from {st.src}: message {seq} arrived, expected {st.expect}")
                body = bytes(buf[PREFIX.size:PREFIX.size + n])
                if info.length != n + PREFIX.size or zlib.crc32(body) != crc \
                        or body != body_of(st.src, rank, seq):
                    raise AssertionError(f"from {st.src}: message {seq} corrupted "
                                         f"(length {info.length}, crc {zlib.crc32(body):#x} != {crc:#x})")
                st.expect += 1
                st.verified += 1
                verified += 1
                nbytes += n
                post_recv(st)
        if events[0] != seen:
            last_event = time.monotonic()
            continue
        if time.monotonic() - last_event > opts.timeout:
            raise AssertionError(f"no progress for {opts.timeout} s: "
                                 + ", ".join(f"to {o.dest}: seq {o.seq} inflight {len(o.inflight)}"
                                             for o in outs) + "; "
                                 + ", ".join(f"from {i.src}: expect {i.expect}" for i in ins))
        try:
            w.wait_until(lambda: events[0] != seen, timeout=0.2, what="stream")
        except ucxpy.TimeoutError:
            pass
        # sends completed at once (eager) never bump: look at them again
        if any(o.inflight and o.inflight[0][1].done for o in outs) or \
                any(not o.ended and len(o.inflight) < opts.window for o in outs):
            events[0] += 1
except Exception as e:
    print(f"STREAM-FAIL {rank} {type(e).__name__}: {e}", flush=True)
    world.abort(str(e))
    sys.exit(1)
secs = time.monotonic() - t0
for st in ins:
    for _buf, req in st.posted:
        req.cancel()
print(f"STREAM {rank} sent={sent} received={received} verified={verified} bytes={nbytes} "
      f"secs={secs:.2f} pid={os.getpid()}", flush=True)
world.finalize(timeout=opts.timeout)

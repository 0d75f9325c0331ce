"""A peer vanishes mid-transfer: link cut or rank killed.

Usage: rel_cut.py VICTIM [--no-launcher-notices] [--size BYTES]

Every rank keeps one rendezvous-sized send and one receive outstanding with
every other rank, verifying each message.  Once every pair has moved a few
messages each rank prints 'ARMED <rank> <pid>'; the test then cuts VICTIM's
link or kills it.  Each request that fails prints
'DETECTED <rank> peer=<p> op=<send|recv> exc=<type> wall=<time.time()>'.
Survivors then keep exchanging with each other; after 20 more verified
messages per live peer they print 'SURVIVED <rank>' (and serve one more second).  Every rank ends with
'DONE <rank> verified=<n>' and exits 0 without finalize (a dead peer
cannot join a barrier).  --no-launcher-notices stops the worker from asking
ucxpy-run about dead ranks, so only the transport can notice.
"""
import faulthandler
import os
import signal
import struct
import sys
import time
import zlib

import numpy as np

import ucxpy

victim = int(sys.argv[1])
no_notices = "--no-launcher-notices" in sys.argv
size_arg = [a for a in sys.argv if a.startswith("--size=")]
MSG = int(size_arg[0].split("=")[1]) if size_arg else 1 << 20
HDR = struct.Struct("<QI")
TAG = 0xC07
world = ucxpy.init()
rank, size, w = world.rank, world.size, world.worker
if no_notices:
    w.bootstrap = None
peers = [p for p in range(size) if p != rank]
payload = {p: np.random.default_rng(rank * 100 + p).integers(0, 256, MSG, dtype=np.uint8).tobytes()
           for p in peers}
expect = {p: np.random.default_rng(p * 100 + rank).integers(0, 256, MSG, dtype=np.uint8).tobytes()
          for p in peers}
state = {p: {"seq": 0, "expect": 0, "send": None, "recv": None, "buf": bytearray(HDR.size + MSG),
             "dead": False, "after": 0, "moved": time.monotonic()} for p in peers}
verified = 0
armed = False
survived = 0.0
detected_victim = False
t_end = time.monotonic() + 120


def post_send(p):
    s = state[p]
    msg = HDR.pack(s["seq"], zlib.crc32(payload[p])) + payload[p]
    s["send"] = (msg, world.isend(msg, dest=p, tag=TAG))
    s["seq"] += 1


def post_recv(p):
    s = state[p]
    s["recv"] = world.irecv(s["buf"], source=p, tag=TAG)


def failed(p, op, exc):
    global detected_victim
    s = state[p]
    if survived:        # a survivor that finished first exits: not a fault
        s["dead"] = True
        return
    if not s["dead"]:
        print(f"DETECTED {rank} peer={p} op={op} exc={type(exc).__name__} wall={time.time():.3f} "
              f"peer_attr={getattr(exc, 'peer', None)} msg={exc}", flush=True)
    s["dead"] = True
    if p == victim:
        detected_victim = True


for p in peers:
    post_recv(p)
    post_send(p)

last_change, last_sig, reported = time.monotonic(), None, False


def stall_report():
    """What a stuck rank waits for (printed once after 10 s without progress)."""
    print(f"STALL {rank}: " + "; ".join(
        f"peer {p}: sent {state[p]['seq']} send_done={state[p]['send'][1].done} "
        f"got {state[p]['expect']} recv_done={state[p]['recv'].done} "
        f"tep={world.ep(p)._tep!r} pending={getattr(world.ep(p)._tep, 'pending', None)} "
        f"incoming={list(world.ep(p).incoming)}" for p in peers)
        + f"; rndv sends={len(w.rndv.sends)} recvs={len(w.rndv.recvs)} "
          f"unexpected={w.matcher.unexpected_depth()}", flush=True)


def on_usr1(*_):
    """The harness asks a (seemingly) hung rank what it is doing."""
    stall_report()
    faulthandler.dump_traceback()


signal.signal(signal.SIGUSR1, on_usr1)
while time.monotonic() < t_end:
    sig = tuple((state[p]["seq"], state[p]["expect"], state[p]["dead"]) for p in peers)
    if sig != last_sig:
        now = time.monotonic()
        for i, p in enumerate(peers):   # per peer: when did its pair last move?
            if last_sig is None or sig[i] != last_sig[i]:
                state[p]["moved"] = now
        last_sig = sig
    if not reported and any(now_ - state[p]["moved"] > 10 for p in peers if not state[p]["dead"]
                            for now_ in (time.monotonic(),)):
        reported = True
        stall_report()
    for p in peers:
        s = state[p]
        if s["dead"]:
            continue
        r = s["recv"]
        if r.done:
            if r.exc is not None:
                failed(p, "recv", r.exc)
                continue
            seq, crc = HDR.unpack_from(s["buf"])
            body = bytes(s["buf"][HDR.size:])
            assert seq == s["expect"], f"rank {rank}: from {p} got seq {seq}, expected {s['expect']}"
            assert zlib.crc32(body) == crc and body == expect[p], f"rank {rank}: corrupted from {p}"
            s["expect"] += 1
            verified += 1
            if detected_victim:
                s["after"] += 1
            post_recv(p)
        sreq = s["send"][1]
        if sreq.done:
            if sreq.exc is not None:
                failed(p, "send", sreq.exc)
                continue
            try:
                post_send(p)
            except ucxpy.ConnectionLost as e:     # documented: sends to a lost peer raise at once
                failed(p, "send", e)
    if not armed and all(state[p]["expect"] >= 3 for p in peers):
        armed = True
        print(f"ARMED {rank} {os.getpid()}", flush=True)
    live = [p for p in peers if not state[p]["dead"]]
    if rank == victim and not live:
        break
    if rank != victim and detected_victim and not survived \
            and all(state[p]["after"] >= 20 for p in live):
        print(f"SURVIVED {rank}", flush=True)
        survived = time.monotonic()
    if survived and (time.monotonic() - survived > 1.0 or not live):
        break       # kept serving a second so the other survivors reach 20 too
    try:
        w.wait_until(lambda: any(state[p]["recv"].done or state[p]["send"][1].done
                                 for p in peers if not state[p]["dead"]), timeout=0.5)
    except ucxpy.TimeoutError:
        pass
print(f"DONE {rank} verified={verified}", flush=True)
os._exit(0)

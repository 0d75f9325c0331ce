"""A peer sends on a brand-new connection and leaves at once.

Usage: close_race.py close|exit

Rank 0 opens 0->1 by sending, then sleeps without progressing.  Rank 1
receives it, sends 'hello' to rank 0 (its first frame on 1->0) and then
either closes its worker without any barrier ('close') or dies with
os._exit right after the send ('exit'; only meaningful where the send wrote
into shared memory before completing).  When rank 0 progresses again its
0->1 connection is already closed and 1->0 still waits to be accepted: the
'hello' must still be delivered ('RACE OK'), not lost to ConnectionLost.
"""
import os
import sys
import time

import ucxpy

mode = sys.argv[1]
world = ucxpy.init()
if world.rank == 0:
    world.send(b"x", 1, tag=1)
    time.sleep(1.0)
    buf = bytearray(5)
    try:
        world.recv(buf, 1, tag=2, timeout=20)
        print("RACE OK", bytes(buf).decode(), flush=True)
    except ucxpy.UcxpyError as e:
        print("RACE LOST", type(e).__name__, e, flush=True)
    os._exit(0)     # rank 1 is gone: no finalize barrier
else:
    world.recv(bytearray(1), 0, tag=1)
    world.send(b"hello", 0, tag=2)
    if mode == "close":
        world.worker.close()
    os._exit(0)

"""Rank 1 dies (SIGKILL) while rank 0 waits on it: rank 0 must get a clear
error naming rank 1 -- from the transport or from the launcher -- not hang."""
import os
import signal
import sys
import time

import ucxpy

world = ucxpy.init()
mode = sys.argv[1] if len(sys.argv) > 1 else "midway"
buf = bytearray(1 << 20)
if world.rank == 1:
    if mode == "midway":
        world.send(buf[:8], dest=0, tag=1)          # connection established, then die
        time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)
elif world.rank == 0:
    t0 = time.monotonic()
    try:
        if mode == "midway":
            world.recv(buf, source=1, tag=1, timeout=30)
        world.recv(buf, source=1, tag=2, timeout=30)   # never sent
    except ucxpy.ConnectionLost as e:
        print(f"DETECTED {type(e).__name__} peer={e.peer} after "
              f"{time.monotonic() - t0:.2f}s: {e}", flush=True)
        sys.exit(0)
    except ucxpy.TimeoutError:
        print("HUNG until timeout", flush=True)
        sys.exit(2)
    sys.exit("no error at all")
else:
    try:
        world.barrier(timeout=30)
    except ucxpy.UcxpyError as e:
        print(f"rank {world.rank}: {type(e).__name__}: {e}", flush=True)

"""run: ucxpy-run -n 2 python docs/examples/guide_spmd.py

The user guide's SPMD program: ucxpy.init() joins the job its launcher
started; tagged send and receive with MPI's matching rules, a cancelled
wildcard receive, a truncated message and a receive that times out.
"""
import numpy as np

import ucxpy

world = ucxpy.init()                        # wire-up through the launcher
assert world.size == 2, "run with 2 ranks"
peer = 1 - world.rank

# a blocking pair; the receive returns a TagInfo(source, tag, length)
if world.rank == 0:
    world.send(np.arange(10), dest=1, tag=7)
else:
    buf = np.empty(10, np.int64)
    info = world.recv(buf, source=0, tag=7)
    assert (info.source, info.tag, info.length) == (0, 7, 80) and (buf == np.arange(10)).all()

# messages from one source never overtake each other, whatever their size
big = np.ones(1 << 20, np.uint8)            # rendezvous-sized
first, second = bytearray(big.nbytes), bytearray(8)
r1 = world.irecv(first, source=peer, tag=1)
r2 = world.irecv(second, source=peer, tag=1)
world.isend(big, dest=peer, tag=1)
world.isend(b"smallmsg", dest=peer, tag=1)
r1.wait(timeout=10)
r2.wait(timeout=10)
assert first == big.tobytes() and second == b"smallmsg"

# a wildcard receive (any source, tags 0x500-0x5FF) withdrawn by cancel()
req = world.irecv(bytearray(8), source=ucxpy.ANY_SOURCE, tag=0x500, tag_mask=0xFF00)
assert req.cancel() and req.cancelled          # completed with ucxpy.Canceled

# a message larger than the buffer completes the receive with TruncationError
# (the sender completes normally)
sreq = world.isend(b"0123456789", dest=peer, tag=2)
try:
    world.recv(bytearray(4), source=peer, tag=2, timeout=10)
    raise AssertionError("expected a TruncationError")
except ucxpy.TruncationError:
    pass
sreq.wait(timeout=10)

# nothing is sent on tag 3: the receive is withdrawn, then TimeoutError raised
try:
    world.recv(bytearray(8), source=peer, tag=3, timeout=0.2)
    raise AssertionError("expected a TimeoutError")
except ucxpy.TimeoutError:
    pass

world.barrier()
print(f"rank {world.rank}: guide_spmd OK")
world.finalize()

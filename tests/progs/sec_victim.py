"""The job tests/test_security.py attacks (2 ranks, UCXPY_TLS=tcp or ofi).

Each rank writes what an attacker could have learned to ``$SEC_DIR`` (its
worker address, a mapped buffer's address and remote key: the worst case,
as if they had leaked), posts a wildcard receive and an AM handler, then
keeps progressing until the attacker is done (``$SEC_DIR/attacked``).
Then nothing of the attacker's may have arrived: no message, no active
message, no byte of RMA, no KV change, no abort; and the job's own tagged,
active-message and RMA traffic must still be delivered, verified.
Prints ``SEC OK <rank> <lane> <json counters>``."""
import json
import os
import sys
import time

import numpy as np

import ucxpy
from ucxpy import auth

SEC = os.environ["SEC_DIR"]
TAG, AM_ID = 0x5EC0, 40
N = 1 << 16

world = ucxpy.init()
rank, w, boot = world.rank, world.worker, world.bootstrap
peer = 1 - rank
lane = os.environ["UCXPY_TLS"]
got_am = []
w.set_am_handler(AM_ID, lambda msg: got_am.append((msg.source, bytes(msg.data or b""))))
mem = np.zeros(N, np.uint8)
mh = w.mem_map(mem)
if rank == 0:
    boot.put("victim", b"good")
world.barrier(timeout=60)            # both directions connected and authenticated
buf = bytearray(N)
req = w.tag_recv_nb(buf, tag=TAG, source=ucxpy.ANY_SOURCE)

leak = {"address": w.address_bytes.hex(), "mem": mh.address, "rkey": mh.pack_rkey().hex()}
with open(os.path.join(SEC, f"addr-{rank}.json.tmp"), "w") as f:
    json.dump(leak, f)
os.rename(os.path.join(SEC, f"addr-{rank}.json.tmp"), os.path.join(SEC, f"addr-{rank}.json"))

deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(SEC, "attacked")):
    w.progress()
    time.sleep(0.0002)
    if time.monotonic() > deadline:
        sys.exit("the attacker never finished")
settle = time.monotonic() + 1.0      # whatever is still in flight gets processed
while time.monotonic() < settle:
    w.progress()

assert not req.done, f"a message was delivered during the attack: {req} {req.exc!r} {req.info if req.exc is None else None}"
assert not got_am, f"active messages were delivered during the attack: {got_am}"
assert not mem.any(), "memory was written during the attack"
assert boot.get("victim", timeout=30) == b"good", "the attacker changed the KV"

# the job's own traffic, verified (only once both ranks have checked: the
# peer's legitimate message must not race with this rank's check above)
boot.barrier(timeout=60)
data = np.random.default_rng(rank).integers(0, 256, N, dtype=np.uint8)
world.ep(peer).tag_send(data, TAG, timeout=60)
info = req.wait(timeout=60)
expect = np.random.default_rng(peer).integers(0, 256, N, dtype=np.uint8)
assert info.source == peer and info.length == N, info
assert np.array_equal(np.frombuffer(buf, np.uint8), expect), "tagged data corrupted"
world.ep(peer).am_send_nb(AM_ID, b"h", b"legit %d" % rank).wait(timeout=60)
until = time.monotonic() + 60
while not got_am and time.monotonic() < until:
    w.progress()
assert got_am == [(peer, b"legit %d" % peer)], got_am
keys = boot.allgather(mh.address.to_bytes(8, "little") + mh.pack_rkey(), timeout=60)
ep = world.ep(peer)
ep.put(data, int.from_bytes(keys[peer][:8], "little"), ep.unpack_rkey(keys[peer][8:]),
       timeout=60)
ep.flush(timeout=60)
world.barrier(timeout=60)
assert np.array_equal(mem, expect), "RMA data corrupted"

counters = {"failures": dict(auth.failures)}
for iface in w.ifaces:
    if hasattr(iface, "rejected"):
        counters[f"{iface.name}_rejected"] = iface.rejected
    if hasattr(iface, "auth_failures"):
        counters[f"{iface.name}_auth_failures"] = iface.auth_failures
print(f"SEC OK {rank} {lane} {json.dumps(counters)}", flush=True)
world.finalize()

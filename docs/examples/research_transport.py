"""run: python docs/examples/research_transport.py

The researcher's guide's transport, seen from the core: the toy transport of
examples/toy_transport.py is registered under a name and selected, and the
core builds everything on its frames. Its attributes set the protocol
thresholds; tagged messages of every protocol, an active message and RMA
(by active messages: toy has no memory domain) all work over it; a peer
that goes away is reported once, and later sends fail.
"""
import os
import sys
import time

import numpy as np

import ucxpy
from ucxpy.context import Context, register_transport

# the transport's module must be importable by the name given to the registry
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
register_transport("toy", "toy_transport:ToyInterface")

# it is a transport like the others now: queried, selected by name
avail = dict(Context.query(ucxpy.Config.from_env({})))["toy"]
assert avail.available and avail.devices == ["toy"], avail
ctx = ucxpy.Context(ucxpy.Config.from_env({}, tls="toy"))
a, b = ctx.create_worker(0), ctx.create_worker(1)
ep = a.connect(b.address_bytes)
ep.transport_endpoint()                     # wire-up: choose the lane, set thresholds
attrs = ep.lane.attrs
print(f"{ep}: eager short <= {ep.short_thresh} B, rendezvous >= {ep.rndv_thresh} B")
assert ep.lane.name == "toy"
assert (ep.short_thresh, ep.rndv_thresh) == (attrs.max_short, attrs.max_bcopy + 1)


def wait(*reqs):
    while not all(r.done for r in reqs):
        a.progress()
        b.progress()
    return [r.wait() for r in reqs]


# tagged messages of every protocol: eager short, eager copy, and rendezvous,
# which moves as data frames (toy offers no one-sided get, Caps.GET_ZCOPY)
for n in (8, 4096, 1 << 20):
    src, dst = np.random.default_rng(n).integers(0, 255, n, np.uint8), np.zeros(n, np.uint8)
    info, _ = wait(b.tag_recv_nb(dst, tag=n), ep.tag_send_nb(src, tag=n))
    assert (dst == src).all() and info.length == n

# an active message: the handler runs from b's progress
got = []
b.set_am_handler(3, lambda msg: got.append(bytes(msg.data)))
wait(ep.am_send_nb(3, b"", b"over toy"))
while not got:
    b.progress()
assert got == [b"over toy"]

# RMA: without a memory domain on the lane, the target serves it by active messages
target = np.zeros(4, np.int64)
mh = b.mem_map(target)
rkey = ep.unpack_rkey(mh.pack_rkey())
assert rkey.mode == "am", rkey
wait(ep.put_nb(np.arange(4, dtype=np.int64), mh.address, rkey))
assert (target == np.arange(4)).all()
(old,) = wait(ep.atomic_fetch_nb("add", 10, mh.address, rkey))
assert old == 0 and target[0] == 10

# the peer goes away: the transport reports it once (conn_failed), sends then fail
# (after a short grace: frames of a peer that left may still be in flight)
b.close()
deadline = time.monotonic() + 5
while ep.failed is None and time.monotonic() < deadline:
    a.progress()
assert ep.failed is not None, ep
try:
    ep.tag_send_nb(b"late", tag=1).wait()
except ucxpy.ConnectionLost as e:
    print("after the peer closed:", type(e).__name__)
else:
    raise AssertionError("a send to a closed peer succeeded")
a.close()
print("the core ran tagged messages, active messages and RMA over toy")

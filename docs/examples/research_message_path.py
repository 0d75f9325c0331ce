"""run: python docs/examples/research_message_path.py

The researcher's guide's message path, observed: two workers of this
process send each other tagged messages over tcp and over shm, and the
workers' counters (Worker.stats(), on while tracing) show the protocol each
size took: eager short, eager copy, and the rendezvous variant the receiver
chose (data frames after RTR on tcp, a one-sided get or a split on shm).
A message sent before its receive is posted waits in the unexpected queue;
UCXPY_RNDV_THRESH moves the rendezvous threshold.
"""
import tempfile

import numpy as np

import ucxpy
from ucxpy.transports.base import Caps

KEY = ucxpy.auth.generate_key()      # both workers belong to one "job"
TRACE = tempfile.TemporaryDirectory()


def pair(tls, **settings):
    """Two workers of one context, the first connected to the second.
    Tracing (to a scratch directory) turns the counters on, and the native
    fast paths off: every message takes the Python protocols shown here."""
    cfg = ucxpy.Config.from_env({}, auth_key=KEY, tls=tls, trace=TRACE.name, **settings)
    ctx = ucxpy.Context(cfg)
    a, b = ctx.create_worker(0), ctx.create_worker(1)
    return a, b, a.connect(b.address_bytes)


def drive(a, b, *reqs):
    while not all(r.done for r in reqs):
        a.progress()
        b.progress()
    for r in reqs:
        r.wait()


def counted(worker, prefix):
    """The worker's message counters whose names start with ``prefix``."""
    return {k: v for k, v in worker.stats()["worker"].items()
            if k.startswith(prefix) and k.endswith(".msgs")}


def send(a, b, ep, n, tag=1, post_first=True):
    """Send ``n`` bytes from ``a`` to ``b``; return (the sender's protocol,
    the receiver's rendezvous variant or None)."""
    before_tx, before_rx = counted(a, "tx.tag."), counted(b, "rndv.")
    src = np.arange(n, dtype=np.uint32).astype(np.uint8)
    dst = np.zeros(n, np.uint8)
    if post_first:
        r = b.tag_recv_nb(dst, tag)
        s = ep.tag_send_nb(src, tag)
    else:                               # the message arrives first: unexpected
        s = ep.tag_send_nb(src, tag)
        while b.tag_probe_nb(tag) is None:
            a.progress()
        r = b.tag_recv_nb(dst, tag)
    drive(a, b, r, s)
    assert (dst == src).all() and r.result.length == n
    tx = [k.split(".")[2] for k, v in counted(a, "tx.tag.").items()
          if v != before_tx.get(k, 0)]
    rx = [k.split(".")[1] for k, v in counted(b, "rndv.").items()
          if v != before_rx.get(k, 0)]
    return tx[0], (rx[0] if rx else None)


# -- tcp: eager short, eager copy, rendezvous by data frames ---------------------------
a, b, ep = pair("tcp")
ep.transport_endpoint()                 # wire-up: the lane and its thresholds
print(f"{ep}: eager short <= {ep.short_thresh} B, rendezvous >= {ep.rndv_thresh} B")
assert send(a, b, ep, 8) == ("eager_short", None)
assert send(a, b, ep, 4096) == ("eager_copy", None)
assert send(a, b, ep, ep.rndv_thresh) == ("rndv", "rtr")     # no one-sided read on tcp
assert b.stats()["worker"]["unexpected.hwm"] == 0
assert send(a, b, ep, 4096, tag=2, post_first=False) == ("eager_copy", None)
assert b.stats()["worker"]["unexpected.hwm"] == 1               # it waited, then matched
a.close(), b.close()

# -- shm: the receiver reads the sender's buffer (get), or both copy half (split) -------
a, b, ep = pair("shm")
ep.transport_endpoint()
print(f"{ep}: eager short <= {ep.short_thresh} B, rendezvous >= {ep.rndv_thresh} B")
split = a.config.rndv_split_thresh              # UCXPY_RNDV_SPLIT_THRESH
if ep.lane.attrs.caps & Caps.GET_ZCOPY:          # CMA permitted (UCXPY_SHM_CMA, ptrace rules)
    assert send(a, b, ep, ep.rndv_thresh) == ("rndv", "get")
    assert send(a, b, ep, split) == ("rndv", "split")
else:                                            # no one-sided read: data frames, as on tcp
    assert send(a, b, ep, split) == ("rndv", "rtr")
a.close(), b.close()

# -- UCXPY_RNDV_THRESH (here as a Config override) moves the threshold ---------------------
a, b, ep = pair("tcp", rndv_thresh="1K")
assert send(a, b, ep, 1023) == ("eager_copy", None)
assert send(a, b, ep, 1024) == ("rndv", "rtr")
a.close(), b.close()
TRACE.cleanup()
print("every size took the protocol the thresholds chose")

"""Every rank streams numbered messages to every other at once (so pairs
connect simultaneously and one side of each moves mid-stream), checks they
arrive in order, then that one tcp connection per pair is left.
Prints ``DUPLEX OK <rank>``."""
import time

import numpy as np

import ucxpy

N = 300
w = ucxpy.init()
worker, me, size = w.worker, w.rank, w.size
peers = [r for r in range(size) if r != me]
sends, recvs = [], {}
for i in range(N):
    for r in peers:
        n = 100000 if i % 50 == 7 else 8 + i % 64     # an occasional rendezvous
        msg = np.full(n, (me + i) % 256, np.uint8)
        msg[:4] = np.frombuffer(np.int32(i).tobytes(), np.uint8)
        sends.append(w.ep(r).tag_send_nb(msg, 5))
        buf = np.zeros(n, np.uint8)
        recvs[(r, i)] = (buf, worker.tag_recv_nb(buf, 5, source=r))
worker.wait_all(sends + [req for _, req in recvs.values()])
for (r, i), (buf, _) in recvs.items():
    assert int(np.frombuffer(buf[:4].tobytes(), np.int32)[0]) == i, (me, r, i)
    assert (buf[4:] == (r + i) % 256).all(), (me, r, i)
w.barrier()
tcp = next(i for i in worker.ifaces if i.name == "tcp")
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    worker.progress()
    live = sum(1 for t in tcp._by_fd.values() if t._state == 2)
    if live == len(peers):
        break
assert live == len(peers), (me, live)
for r in peers:
    ep = w.ep(r)
    assert ep._tep in ep.incoming, (me, r)
w.barrier()
print("DUPLEX OK", me, flush=True)
w.finalize()

"""A job with exactly known traffic, to look at with ucxpy-trace.

Every rank ``i`` of ``N`` sends only to ``(i + 1) % N``:

* a ring allreduce (reduce-scatter then allgather, ``2 (N - 1)`` steps) of
  ``COUNT`` float64 values over tagged send/recv: ``2 (N - 1)`` messages of
  ``COUNT / N * 8`` bytes each;
* a pipeline of ``PIPELINE`` messages of ``LARGE`` bytes (rendezvous size).

Run it traced and summarize::

    ucxpy-run -n 4 --trace /tmp/tr python examples/trace_ring.py
    ucxpy-trace summary /tmp/tr
    ucxpy-trace merge /tmp/tr -o job.json      # open in ui.perfetto.dev

Rank 0 prints the expected traffic as one JSON line ``EXPECTED {...}``
(the protocol of each size as the endpoint's thresholds choose it).
"""
import json

import numpy as np

import ucxpy

COUNT = 4096            # float64 values reduced (a multiple of the ranks)
LARGE = 1 << 20         # bytes per pipeline message
PIPELINE = 4            # pipeline messages per rank
TAG_RING, TAG_PIPE = 100, 200


def protocol(ep, nbytes):
    """The protocol :meth:`ucxpy.Endpoint.send_message` picks for ``nbytes``."""
    ep.transport_endpoint()             # connects: the thresholds come from the lane
    if nbytes >= ep.rndv_thresh:
        return "rndv"
    return "eager_short" if nbytes <= ep.short_thresh else "eager_copy"


def ring_allreduce(world, x):
    """Sum ``x`` over all ranks in place (n blocks, 2 (n - 1) ring steps)."""
    n, r = world.size, world.rank
    if n == 1:
        return x
    blocks = np.array_split(x, n)
    right, left = (r + 1) % n, (r - 1) % n
    tmp = np.empty_like(blocks[0])
    for step in range(n - 1):            # reduce-scatter
        send_i, recv_i = (r - step) % n, (r - step - 1) % n
        req = world.irecv(tmp, source=left, tag=TAG_RING)
        world.send(blocks[send_i], right, TAG_RING)
        req.wait(60)
        blocks[recv_i] += tmp
    for step in range(n - 1):            # allgather
        send_i, recv_i = (r + 1 - step) % n, (r - step) % n
        req = world.irecv(blocks[recv_i], source=left, tag=TAG_RING)
        world.send(blocks[send_i], right, TAG_RING)
        req.wait(60)
    return x


def pipeline(world):
    """Each rank sends PIPELINE large messages to its right neighbour."""
    n, r = world.size, world.rank
    if n == 1:
        return
    data = np.full(LARGE, r, dtype=np.uint8)
    bufs = [bytearray(LARGE) for _ in range(PIPELINE)]
    recvs = [world.irecv(b, source=(r - 1) % n, tag=TAG_PIPE + k) for k, b in enumerate(bufs)]
    sends = [world.isend(data, (r + 1) % n, TAG_PIPE + k) for k in range(PIPELINE)]
    for q in recvs + sends:
        q.wait(60)
    assert all(b[0] == (r - 1) % n and b[-1] == (r - 1) % n for b in bufs)


def main():
    world = ucxpy.init()
    n, r = world.size, world.rank
    x = np.full(COUNT, float(r + 1))
    ring_allreduce(world, x)
    assert np.all(x == n * (n + 1) / 2), x[:4]
    pipeline(world)
    if r == 0 and n > 1:
        ep = world.ep(1 % n)
        chunk = COUNT // n * 8
        expected = {}
        for src in range(n):
            dst = (src + 1) % n
            rows = expected.setdefault(f"{src}>{dst}", {})
            for size, count in ((chunk, 2 * (n - 1)), (LARGE, PIPELINE)):
                key = protocol(ep, size)
                row = rows.setdefault(key, {"msgs": 0, "bytes": 0})
                row["msgs"] += count
                row["bytes"] += count * size
        print("EXPECTED " + json.dumps(expected, sort_keys=True), flush=True)
    world.finalize()


if __name__ == "__main__":
    main()

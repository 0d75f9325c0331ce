"""A big job's checks on every rank, data verified: an all-to-all of
Isend/Irecv to every other rank (then ``Alltoall``), ``Allreduce`` (sum and
max), and a shmem put/get ring.  Prints ``SCALE OK <rank> <n> lanes=...
<seconds>``; any wrong byte raises (the job fails).

Usage: ``ucxpy-run -n N python scale_job.py [BYTES]`` (BYTES per peer of the
all-to-all, default 4096).  ``lanes=`` counts the transports this rank's
endpoints used (``shm:30,tcp:33``), for the multi-host tests.
"""
import sys
import time

import numpy as np

from mpi_shim import MPI
from mpi_shim.engine import ENGINE

import shmem

t0 = time.monotonic()
comm = MPI.COMM_WORLD
rank, n = comm.Get_rank(), comm.Get_size()
size = int(sys.argv[1]) if len(sys.argv) > 1 else 4096


def pattern(src: int, dst: int, rnd: int, nbytes: int) -> np.ndarray:
    """What ``src`` sends ``dst`` in round ``rnd``: distinct per pair and round."""
    return ((np.arange(nbytes, dtype=np.uint32) * 7 + src * 131 + dst * 17 + rnd * 3)
            % 251).astype(np.uint8)


# -- all-to-all, point to point: every pair, both ways, twice
srcs = [(rank - k) % n for k in range(1, n)]
dsts = [(rank + k) % n for k in range(1, n)]
rbuf = np.zeros((n, size), dtype=np.uint8)
for rnd in range(2):
    sends = {d: pattern(rank, d, rnd, size) for d in dsts}
    reqs = [comm.Irecv(rbuf[s], s, 11 + rnd) for s in srcs]
    reqs += [comm.Isend(sends[d], d, 11 + rnd) for d in dsts]
    MPI.Request.Waitall(reqs)
    for s in srcs:
        if not np.array_equal(rbuf[s], pattern(s, rank, rnd, size)):
            bad = int(np.flatnonzero(rbuf[s] != pattern(s, rank, rnd, size))[0])
            raise SystemExit(f"rank {rank}: all-to-all round {rnd}: wrong byte {bad} from {s}")

# -- the collective all-to-all: block j of rank i holds (i, j)
blk = 16
send = np.empty((n, blk), dtype=np.int32)
for j in range(n):
    send[j] = rank * 100000 + j
recv = np.empty((n, blk), dtype=np.int32)
comm.Alltoall(send, recv)
want = (np.arange(n, dtype=np.int32) * 100000 + rank)[:, None]
if not (recv == want).all():
    raise SystemExit(f"rank {rank}: Alltoall: got {recv[:4, 0]}...")

# -- Allreduce: a vector sum (exact in float64) and an integer max
x = np.arange(1000, dtype=np.float64) + rank
out = np.empty_like(x)
comm.Allreduce(x, out, op=MPI.SUM)
if not np.array_equal(out, np.arange(1000, dtype=np.float64) * n + n * (n - 1) / 2):
    raise SystemExit(f"rank {rank}: Allreduce SUM: got {out[:3]}...")
m = np.array([rank * 3 + 1], dtype=np.int64)
mo = np.empty_like(m)
comm.Allreduce(m, mo, op=MPI.MAX)
if mo[0] != (n - 1) * 3 + 1:
    raise SystemExit(f"rank {rank}: Allreduce MAX: got {mo[0]}")

lanes = {}
for wid, ep in ENGINE.eps.items():
    if wid != rank and ep.lane is not None:
        lanes[ep.lane.name] = lanes.get(ep.lane.name, 0) + 1

# -- shmem: put my block into the next PE, get the previous PE's block back
shmem.init()
me, npes = shmem.my_pe(), shmem.n_pes()
assert (me, npes) == (rank, n), (me, npes, rank, n)
words = 512
src = shmem.zeros(words, dtype=np.int64)
dst = shmem.zeros(words, dtype=np.int64)
src[:] = np.arange(words, dtype=np.int64) + me * 1000003
shmem.barrier_all()
shmem.put(dst, src, (me + 1) % npes)
shmem.barrier_all()
left = (me - 1) % npes
if not np.array_equal(dst, np.arange(words, dtype=np.int64) + left * 1000003):
    raise SystemExit(f"PE {me}: put ring: got {dst[:3]}... from PE {left}")
got = np.zeros(words, dtype=np.int64)
right = (me + 1) % npes
shmem.get(got, src, right)
if not np.array_equal(got, np.arange(words, dtype=np.int64) + right * 1000003):
    raise SystemExit(f"PE {me}: get ring: got {got[:3]}... from PE {right}")
shmem.barrier_all()
shmem.free(src)
shmem.free(dst)

lane_text = ",".join(f"{k}:{v}" for k, v in sorted(lanes.items()))
print(f"SCALE OK {rank} {n} lanes={lane_text} {time.monotonic() - t0:.1f}", flush=True)
shmem.finalize()

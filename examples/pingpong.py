"""SPMD ping-pong and ring exchange over ucxpy's tag API.

Run with the built-in launcher:   ucxpy-run -n 4 python examples/pingpong.py
or under MPI:                     mpiexec -n 4 python examples/pingpong.py
"""
import time

import numpy as np

import ucxpy


def main():
    world = ucxpy.init()
    rank, size = world.rank, world.size

    # 1. a ring: every rank sends its rank-stamped buffer to the right neighbour
    n = 1 << 16
    out = np.full(n, rank, dtype=np.int32)
    inp = np.empty(n, dtype=np.int32)
    left, right = (rank - 1) % size, (rank + 1) % size
    rreq = world.irecv(inp, source=left, tag=1)
    world.send(out, dest=right, tag=1)
    rreq.wait()
    assert (inp == left).all(), f"rank {rank}: ring data corrupted"

    # 2. ping-pong latency between ranks 0 and 1, small and large messages
    if size >= 2 and rank < 2:
        peer = 1 - rank
        for nbytes in (8, 1 << 20):
            buf = np.zeros(nbytes, np.uint8)
            iters = 2000 if nbytes == 8 else 50
            t0 = time.perf_counter()
            for _ in range(iters):
                if rank == 0:
                    world.send(buf, dest=peer, tag=2)
                    world.recv(buf, source=peer, tag=2)
                else:
                    world.recv(buf, source=peer, tag=2)
                    world.send(buf, dest=peer, tag=2)
            half_rtt = (time.perf_counter() - t0) / iters / 2
            if rank == 0:
                lane = world.ep(peer).lane.name
                print(f"pingpong {nbytes:>8} B over {lane}: {half_rtt * 1e6:8.2f} us "
                      f"half round trip, {nbytes / half_rtt / 1e9:6.3f} GB/s", flush=True)
    world.barrier()
    if rank == 0:
        print(f"pingpong: {size} ranks OK", flush=True)
    world.finalize()


if __name__ == "__main__":
    main()

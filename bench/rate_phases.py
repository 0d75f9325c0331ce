"""Where the 8 B message rate goes (docs/notes/performance-history.md).

Run as ``UCXPY_TLS=shm ucxpy-run -n 2 taskset -c 0,1 python bench/rate_phases.py``:
the pattern of ``ucxpy-perf -t tag_bw`` (rank 0 sends windows of 64
non-blocking 8 B messages and waits for a 1-byte ack, rank 1 posts 64
``tag_recv_nb`` and waits for them) with each phase timed apart.  Each rank
prints the time per message overall and per phase: rank 0 ``send`` (posting
the window), ``wait`` (its sends), ``ack`` (waiting for the receiver);
rank 1 ``post`` (posting the receives), ``wait`` (completing them),
``ack`` (sending the ack).  The slower side's busy phases are the rate.
"""
import time

import numpy as np

import ucxpy
from ucxpy.tag import FULL_MASK

WINDOW, ROUNDS = 64, 4000


def main():
    w = ucxpy.init()
    rank, peer = w.rank, 1 - w.rank
    ep, wk = w.ep(peer), w.worker
    buf, ack = np.zeros(8, np.uint8), np.zeros(1, np.uint8)
    clock = time.perf_counter
    phases = [0.0, 0.0, 0.0]

    def run(n):
        for _ in range(n):
            t0 = clock()
            if rank == 0:
                reqs = [ep.tag_send_nb(buf, 5) for _ in range(WINDOW)]
            else:
                reqs = [wk.tag_recv_nb(buf, 5, FULL_MASK, peer) for _ in range(WINDOW)]
            t1 = clock()
            for r in reqs:
                r.wait()
            t2 = clock()
            if rank == 0:
                wk.tag_recv(ack, 6, FULL_MASK, peer)
            else:
                ep.tag_send(ack, 6)
            t3 = clock()
            phases[0] += t1 - t0
            phases[1] += t2 - t1
            phases[2] += t3 - t2

    run(100)
    w.barrier()
    phases[:] = [0.0, 0.0, 0.0]
    t = clock()
    run(ROUNDS)
    per = 1e6 / (ROUNDS * WINDOW)
    names = ("send", "wait", "ack") if rank == 0 else ("post", "wait", "ack")
    print(f"rank {rank}: {(clock() - t) * per:.3f} us/message; "
          + ", ".join(f"{n} {p * per:.3f}" for n, p in zip(names, phases)), flush=True)
    w.barrier()
    w.finalize()


if __name__ == "__main__":
    main()

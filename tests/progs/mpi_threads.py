"""THREAD_MULTIPLE for real: 4 threads per rank exchange tagged messages on one
communicator at once (thread t of every rank talks to thread t of the next and
previous ranks with tag t), plus concurrent collectives on per-thread Dups.
Every payload is checked; the job prints THREADS OK per rank."""
import threading

import numpy as np
from mpi4py import MPI

NTHREADS, ROUNDS = 4, 50
comm = MPI.COMM_WORLD
assert MPI.Query_thread() == MPI.THREAD_MULTIPLE, MPI.Query_thread()
assert MPI.Is_thread_main()
rank, size = comm.Get_rank(), comm.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size
dups = [comm.Dup() for _ in range(NTHREADS)]     # collective: made by the main thread
errors = []


def worker(t):
    try:
        out = np.empty(256, np.int64)
        for r in range(ROUNDS):
            payload = np.full(256, rank * 1_000_000 + t * 1000 + r, np.int64)
            req = comm.Isend(payload, dest=right, tag=t)
            comm.Recv(out, source=left, tag=t)
            req.Wait()
            assert (out == left * 1_000_000 + t * 1000 + r).all(), (t, r, out[:3])
            obj = comm.sendrecv(("obj", rank, t, r), dest=right, sendtag=100 + t,
                                source=left, recvtag=100 + t)
            assert obj == ("obj", left, t, r), obj
            assert not MPI.Is_thread_main()
        total = dups[t].allreduce(t + rank)
        assert total == size * t + size * (size - 1) // 2, total
    except BaseException as exc:  # reported by the main thread
        errors.append((t, repr(exc), str(exc)))


threads = [threading.Thread(target=worker, args=(t,)) for t in range(NTHREADS)]
for th in threads:
    th.start()
for th in threads:
    th.join(60)
assert not any(th.is_alive() for th in threads), "a thread never finished"
assert not errors, errors
comm.Barrier()
for d in dups:
    d.Free()
print(f"rank {rank}: THREADS OK", flush=True)

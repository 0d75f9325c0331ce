"""mpi_shim's calls with their common case in C (mpi_shim.accel) and without
it, against the ucxpy calls they stand on (docs/notes/performance-history.md).

Run as ``ucxpy-run -n 2 python bench/shim_calls.py`` (2 ranks on shm; pin
them with ``taskset`` for steadier figures).  Both ranks switch the C paths
on and off together (``mpi_shim.accel.switch``) and run, in each state:

- ``Send/Recv``: an 8 B ping-pong, half round trip;
- ``Isend/Irecv+Waitall``: the same with non-blocking calls (rank 0 posts
  its receive, then waits for its send and receive in one Waitall);
- ``Put+Flush``, ``Get+Flush``, ``Fetch_and_op+Flush``: rank 0 alone, on
  the peer's window (mapped memory), per call pair;

and the ucxpy calls of the same patterns (``ucxpy-perf``'s): ``tag_send`` /
``tag_recv``, ``tag_send_nb`` / ``tag_recv_nb`` + ``wait``, ``put_nb`` +
``flush``, ``get_nb`` + ``flush``, ``atomic_fetch``.  Each figure is the best
of ``--repeat`` runs of ``--iters`` iterations, in µs.  Rank 0 prints the
table: one column per state, with the ratio to ucxpy.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from mpi_shim import MPI, accel
from mpi_shim.engine import ENGINE

clock = time.perf_counter


def best(run, iters: int, repeat: int, barrier) -> float:
    """Best time per iteration of ``run(iters)`` over ``repeat`` runs, µs."""
    times = []
    for _ in range(repeat):
        barrier()
        t0 = clock()
        run(iters)
        times.append((clock() - t0) / iters * 1e6)
    return min(times)


def shim_cases(comm, win, peer: int, rank: int) -> dict:
    buf = np.zeros(1, np.int64)
    rbuf = np.zeros(1, np.int64)
    one, old = np.ones(1, np.int64), np.zeros(1, np.int64)
    Send, Recv, Isend, Irecv = comm.Send, comm.Recv, comm.Isend, comm.Irecv
    Waitall = MPI.Request.Waitall
    Put, Get, Flush, Fop = win.Put, win.Get, win.Flush, win.Fetch_and_op
    SUM = MPI.SUM

    def pingpong(n):
        for _ in range(n):
            if rank == 0:
                Send(buf, peer, 1)
                Recv(rbuf, peer, 1)
            else:
                Recv(rbuf, peer, 1)
                Send(buf, peer, 1)

    def pingpong_nb(n):
        for _ in range(n):
            if rank == 0:
                r = Irecv(rbuf, peer, 2)
                Waitall([Isend(buf, peer, 2), r])
            else:
                Waitall([Irecv(rbuf, peer, 2)])
                Waitall([Isend(buf, peer, 2)])

    def put(n):
        for _ in range(n):
            Put(buf, peer)
            Flush(peer)

    def get(n):
        for _ in range(n):
            Get(rbuf, peer)
            Flush(peer)

    def fop(n):
        for _ in range(n):
            Fop(one, old, peer, 8, SUM)
            Flush(peer)
    return {"Send/Recv": (pingpong, 2), "Isend/Irecv+Waitall": (pingpong_nb, 2),
            "Put+Flush": (put, 1), "Get+Flush": (get, 1), "Fetch_and_op+Flush": (fop, 1)}


def core_cases(world, rkey, base: int, peer: int, rank: int) -> dict:
    from ucxpy.tag import FULL_MASK
    ep, wk = world.ep(peer), world.worker
    buf, rbuf = np.zeros(1, np.int64), np.zeros(1, np.int64)
    send, recv, send_nb, recv_nb = ep.tag_send, wk.tag_recv, ep.tag_send_nb, wk.tag_recv_nb
    put_nb, get_nb, flush, fetch = ep.put_nb, ep.get_nb, ep.flush, ep.atomic_fetch

    def pingpong(n):
        for _ in range(n):
            if rank == 0:
                send(buf, 11)
                recv(rbuf, 11, FULL_MASK, peer)
            else:
                recv(rbuf, 11, FULL_MASK, peer)
                send(buf, 11)

    def pingpong_nb(n):
        for _ in range(n):
            if rank == 0:
                r = recv_nb(rbuf, 12, FULL_MASK, peer)
                for q in (send_nb(buf, 12), r):
                    q.wait()
            else:
                recv_nb(rbuf, 12, FULL_MASK, peer).wait()
                send_nb(buf, 12).wait()

    def put(n):
        for _ in range(n):
            put_nb(buf, base, rkey)
            flush()

    def get(n):
        for _ in range(n):
            get_nb(rbuf, base, rkey)
            flush()

    def fop(n):
        for _ in range(n):
            fetch("add", 1, base + 8, rkey, 8)
    return {"Send/Recv": (pingpong, 2), "Isend/Irecv+Waitall": (pingpong_nb, 2),
            "Put+Flush": (put, 1), "Get+Flush": (get, 1), "Fetch_and_op+Flush": (fop, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size != 2:
        raise SystemExit("bench/shim_calls.py runs on 2 ranks")
    peer = 1 - rank
    win = MPI.Win.Allocate(64, 1, comm=comm)
    world = ENGINE.world
    mh = world.worker.mem_map(length=64)         # the core's region (allocated: mapped)
    keys = comm.allgather((mh.address, mh.pack_rkey()))
    base = keys[peer][0]
    rkey = world.ep(peer).unpack_rkey(keys[peer][1])
    comm.Barrier()
    rows = {}
    core = core_cases(world, rkey, base, peer, rank)
    shim = shim_cases(comm, win, peer, rank)
    was = accel.enabled()
    try:
        for name, (run, per) in core.items():
            one_sided = per == 1
            if one_sided and rank != 0:
                comm.Barrier()
                continue
            rows.setdefault(name, {})["ucxpy"] = best(run, args.iters, args.repeat,
                                                      (lambda: None) if one_sided
                                                      else comm.Barrier) / per
            if one_sided:
                comm.Barrier()
        for state in (True, False):
            accel.switch(state and was)
            label = "mpi_shim, C calls" if state else "mpi_shim, Python"
            win.Lock(peer, MPI.LOCK_SHARED)
            for name, (run, per) in shim.items():
                one_sided = per == 1
                if one_sided and rank != 0:
                    continue
                rows[name][label] = best(run, args.iters, args.repeat,
                                         (lambda: None) if one_sided else comm.Barrier) / per
            win.Unlock(peer)
            comm.Barrier()
    finally:
        accel.switch(was)
    comm.Barrier()
    if rank == 0:
        cols = ["ucxpy", "mpi_shim, C calls", "mpi_shim, Python"]
        print(f"mpi_shim calls in C: {'on' if was else 'unavailable'}; 8 B, µs "
              f"(best of {args.repeat} x {args.iters}; ratio to ucxpy)")
        print("| call | " + " | ".join(cols) + " |")
        print("|---|" + "---|" * len(cols))
        for name, row in rows.items():
            u = row["ucxpy"]
            cells = [f"{u:.3f}"] + [f"{row[c]:.3f} ({row[c] / u:.2f}x)" for c in cols[1:]]
            print(f"| {name} | " + " | ".join(cells) + " |")
    mh.unmap()
    win.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Spawned workers write one file together through a non-contiguous view.

The parent (run it as a one-process job: ``ucxpy-run -n 1 python
examples/spawn_io.py``, or ``mpiexec -n 1 python examples/spawn_io.py``
under MPICH's mpiexec) spawns WORKERS processes.  The file is a sequence of
32-bit integers, integer ``i`` holding the value ``i``; it is cut into
blocks of BLOCK integers dealt out round robin: block ``k`` belongs to
worker ``k % WORKERS``.  Each worker sees only its own blocks, through a
file view whose filetype is a vector (one block every WORKERS blocks) and
whose displacement skips the blocks of the workers before it, and writes
them all with one collective ``Write_all``.  The parent then reads the
file back and checks every byte.

Prints ``SPAWN-IO OK <bytes>`` from the parent on success.
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

try:
    from mpi_shim import MPI
except ImportError:                        # the real mpi4py works as well
    from mpi4py import MPI

WORKERS = 3
BLOCK = 1000                    # integers per block
BLOCKS_PER_WORKER = 64


def worker(path: str) -> None:
    parent = MPI.Comm.Get_parent()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    # my blocks: k = rank, rank + size, rank + 2 * size ...
    blocks = rank + size * np.arange(BLOCKS_PER_WORKER)
    data = (blocks[:, None] * BLOCK + np.arange(BLOCK)[None, :]).astype(np.int32).ravel()
    filetype = MPI.INT32_T.Create_vector(BLOCKS_PER_WORKER, BLOCK, size * BLOCK).Commit()
    fh = MPI.File.Open(comm, path, MPI.MODE_WRONLY | MPI.MODE_CREATE)
    fh.Set_view(rank * BLOCK * 4, MPI.INT32_T, filetype)
    status = MPI.Status()
    fh.Write_all(data, status)
    fh.Close()
    filetype.Free()
    # tell the parent how much was written, then leave
    parent.gather(status.Get_count(MPI.BYTE), root=0)
    parent.Disconnect()


def main() -> None:
    path = os.path.join(tempfile.mkdtemp(prefix="spawn-io-"), "interleaved.dat")
    children = MPI.COMM_SELF.Spawn(sys.executable, [os.path.abspath(__file__), "worker", path],
                                   maxprocs=WORKERS)
    written = children.gather(None, root=MPI.ROOT)
    children.Disconnect()
    total = WORKERS * BLOCKS_PER_WORKER * BLOCK
    assert written == [BLOCKS_PER_WORKER * BLOCK * 4] * WORKERS, written
    fh = MPI.File.Open(MPI.COMM_SELF, path, MPI.MODE_RDONLY | MPI.MODE_DELETE_ON_CLOSE)
    assert fh.Get_size() == total * 4, fh.Get_size()
    got = np.empty(total, np.int32)
    fh.Read_at(0, got)
    fh.Close()
    os.rmdir(os.path.dirname(path))
    expected = np.arange(total, dtype=np.int32)
    bad = np.flatnonzero(got != expected)
    assert not len(bad), f"{len(bad)} wrong integers, first at {bad[0]}: {got[bad[0]]}"
    print(f"SPAWN-IO OK {got.nbytes}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker(sys.argv[2])
    else:
        main()

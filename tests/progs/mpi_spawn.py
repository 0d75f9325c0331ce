"""MPI spawn under whatever launcher runs this job (tests/test_mpi_spawn.py).

Parent: every rank of COMM_WORLD spawns, through Spawn_multiple at root 0,
two apps (1 and 2 processes) with a working directory and an environment
variable given in ``info``; checks the errcodes, the intercommunicator's
sizes, a Bcast of real data into the children and an Allreduce back, then
disconnects.  Children check APPNUM, the working directory, the variable,
and that COMM_WORLD holds just them.  With SPAWN_EXPECT_ERROR=1 the
launcher cannot spawn: Spawn must raise ERR_SPAWN at once.

Prints ``SPAWN OK`` per parent rank, ``CHILD OK <appnum>`` per child.
"""
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from mpi_shim import MPI  # noqa: E402


def child():
    parent = MPI.Comm.Get_parent()
    app = MPI.COMM_WORLD.Get_attr(MPI.APPNUM)
    assert MPI.COMM_WORLD.Get_size() == 3, MPI.COMM_WORLD.Get_size()
    assert parent.Get_remote_size() == int(os.environ["SPAWN_PARENTS"]), parent.Get_remote_size()
    assert os.environ.get("SPAWN_COLOUR") == ("blue" if app == 0 else "red"), os.environ
    assert os.path.realpath(os.getcwd()) == os.path.realpath(os.environ["SPAWN_WDIR"]), \
        (os.getcwd(), app)
    buf = np.zeros(1000, dtype="i8")
    parent.Bcast(buf, root=0)
    assert (buf == np.arange(1000) * 7).all()
    out = np.empty(1, dtype="i8")
    parent.Allreduce(np.array([MPI.COMM_WORLD.Get_rank() + 1], dtype="i8"), out, op=MPI.SUM)
    parent.Disconnect()
    print(f"CHILD OK {app}", flush=True)


def main():
    comm = MPI.COMM_WORLD
    if os.environ.get("SPAWN_EXPECT_ERROR"):
        try:
            comm.Spawn(sys.executable, [__file__], 1)
        except MPI.Exception as e:
            assert e.Get_error_class() == MPI.ERR_SPAWN, e
            print("SPAWN REFUSED", str(e), flush=True)
            return
        raise AssertionError("Spawn did not raise")
    wdir = tempfile.mkdtemp(prefix="ucxpy-spawn-") if comm.Get_rank() == 0 else None
    wdir = comm.bcast(wdir, root=0)
    infos = []
    for colour in ("blue", "red"):
        info = MPI.Info.Create()
        info.Set("wdir", wdir)
        info.Set("env", f"SPAWN_COLOUR={colour}\nSPAWN_WDIR={wdir}\n"
                        f"SPAWN_PARENTS={comm.Get_size()}")
        infos.append(info)
    errcodes = []
    inter = comm.Spawn_multiple([sys.executable, sys.executable], [[__file__], [__file__]],
                                [1, 2], infos, root=0, errcodes=errcodes)
    assert errcodes == [[MPI.SUCCESS], [MPI.SUCCESS, MPI.SUCCESS]], errcodes
    assert inter.Get_remote_size() == 3 and inter.Get_size() == comm.Get_size()
    data = np.arange(1000, dtype="i8") * 7
    inter.Bcast(data, root=MPI.ROOT if comm.Get_rank() == 0 else MPI.PROC_NULL)
    out = np.empty(1, dtype="i8")
    inter.Allreduce(np.array([0], dtype="i8"), out, op=MPI.SUM)
    assert out[0] == 1 + 2 + 3, out
    inter.Disconnect()
    comm.Barrier()
    print("SPAWN OK", flush=True)


if __name__ == "__main__":
    if MPI.Comm.Get_parent() != MPI.COMM_NULL:
        child()
    else:
        main()

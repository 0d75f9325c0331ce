"""A pytest file written for the pytest-mpi plugin (unmodified mpi4py code),
run as an SPMD job on mpi_shim through the drop-in mpi4py package."""
import pytest


@pytest.mark.mpi
def test_allreduce():
    from mpi4py import MPI
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.Get_size()


@pytest.mark.mpi(min_size=2)
def test_needs_two():
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    if r == 0:
        comm.send("ping", dest=1)
    elif r == 1:
        assert comm.recv(source=0) == "ping"


@pytest.mark.mpi(min_size=64)
def test_needs_many():
    raise AssertionError("must be skipped")


@pytest.mark.mpi
def test_shared_tmpdir(mpi_tmp_path):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    assert comm.allgather(str(mpi_tmp_path)) == [str(mpi_tmp_path)] * comm.Get_size()


def test_plain():
    assert True

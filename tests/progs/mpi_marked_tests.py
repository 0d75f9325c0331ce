"""A pytest file written in pytest-mpi style, run as an SPMD job on mpi_shim."""
import pytest


@pytest.mark.mpi
def test_allreduce(mpi_comm):
    assert mpi_comm.allreduce(1) == mpi_comm.Get_size()


@pytest.mark.mpi(min_size=2)
def test_needs_two(mpi_comm):
    r = mpi_comm.Get_rank()
    if r == 0:
        mpi_comm.send("ping", dest=1)
    elif r == 1:
        assert mpi_comm.recv(source=0) == "ping"


@pytest.mark.mpi(min_size=64)
def test_needs_many(mpi_comm):
    raise AssertionError("must be skipped")


def test_shared_tmpdir(mpi_tmpdir):
    assert mpi_tmpdir


def test_plain():
    assert True

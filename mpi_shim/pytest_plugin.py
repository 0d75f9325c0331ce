"""pytest-mpi style markers for programs on mpi_shim.

Load with ``-p mpi_shim.pytest_plugin`` and run the test file as an SPMD job::

    ucxpy-run -n 4 python -m pytest -p mpi_shim.pytest_plugin --with-mpi test_x.py

``@pytest.mark.mpi`` marks a test that needs MPI; ``@pytest.mark.mpi(min_size=N)``
one that needs at least N ranks.  Without ``--with-mpi`` such tests are
skipped (and unmarked ones run), as with the pytest-mpi plugin; with it, a
test whose ``min_size`` exceeds COMM_WORLD's size is skipped.  The fixtures
``mpi_comm`` (a private duplicate of COMM_WORLD) and ``mpi_tmpdir`` (one
directory shared by all ranks) are provided.
"""
from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption("--with-mpi", action="store_true", default=False,
                     help="run tests marked mpi (launch pytest under ucxpy-run or mpiexec)")


def pytest_configure(config):
    config.addinivalue_line("markers", "mpi(min_size=1): test needs MPI (and that many ranks)")


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("mpi")
    if marker is None:
        return
    if not item.config.getoption("--with-mpi"):
        pytest.skip("needs MPI: run with --with-mpi under a launcher")
    from . import MPI
    min_size = marker.kwargs.get("min_size", marker.args[0] if marker.args else 1)
    if MPI.COMM_WORLD.Get_size() < min_size:
        pytest.skip(f"needs at least {min_size} MPI ranks")


@pytest.fixture
def mpi_comm():
    from . import MPI
    comm = MPI.COMM_WORLD.Dup()
    yield comm
    comm.Free()


@pytest.fixture
def mpi_tmpdir(tmp_path_factory):
    import tempfile
    from . import MPI
    comm = MPI.COMM_WORLD
    path = tempfile.mkdtemp(prefix="mpi-") if comm.Get_rank() == 0 else None
    return comm.bcast(path, root=0)

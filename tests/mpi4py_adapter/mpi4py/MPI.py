"""``mpi4py.MPI`` is :mod:`mpi_shim.MPI` (the package aliases it at import)."""
from mpi_shim.MPI import *  # noqa: F401,F403

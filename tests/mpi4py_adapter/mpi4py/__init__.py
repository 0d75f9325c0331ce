"""A stand-in ``mpi4py`` package whose ``MPI`` is :mod:`mpi_shim.MPI`.

Put ``tests/mpi4py_adapter`` first on ``sys.path`` to run programs (or
mpi4py's own test suite) written for mpi4py against mpi_shim.  Only for
jobs started by ``ucxpy-run``: under ``mpiexec`` ucxpy's bootstrap needs
the real mpi4py.
"""
import sys
import types

from mpi_shim import MPI

sys.modules[__name__ + ".MPI"] = MPI

__version__ = "4.1.2"
rc = types.SimpleNamespace(initialize=True, threads=True, thread_level="multiple",
                           finalize=None, fast_reduce=True, recv_mprobe=True,
                           irecv_bufsz=32768, errors="exception")


def get_include():
    return ""


def get_config():
    return {}

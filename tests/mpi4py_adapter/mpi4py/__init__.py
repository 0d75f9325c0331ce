"""A stand-in ``mpi4py`` package whose ``MPI`` is :mod:`mpi_shim.MPI`.

Put ``tests/mpi4py_adapter`` first on ``sys.path`` to run programs (or
mpi4py's own test suite) written for mpi4py against mpi_shim.  The pure-Python
subpackages (``mpi4py.util``, ``mpi4py.futures`` ...) come from an installed
mpi4py, found at run time and imported on top of this ``MPI``.
"""
import importlib.machinery
import os
import sys
import types

from mpi_shim import MPI

sys.modules[__name__ + ".MPI"] = MPI


def _installed_mpi4py_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == os.path.dirname(here):
            continue
        spec = importlib.machinery.PathFinder.find_spec("mpi4py", [entry])
        if spec is not None and spec.submodule_search_locations:
            return list(spec.submodule_search_locations)[0]
    return None


_real = _installed_mpi4py_dir()
if _real is not None:
    __path__.append(_real)

__version__ = "4.1.2"
rc = types.SimpleNamespace(initialize=True, threads=True, thread_level="multiple",
                           finalize=None, fast_reduce=True, recv_mprobe=True,
                           irecv_bufsz=32768, errors="exception")


def get_include():
    return ""


def get_config():
    return {}

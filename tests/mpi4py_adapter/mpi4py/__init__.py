"""A stand-in ``mpi4py`` package whose ``MPI`` is :mod:`mpi_shim.MPI`.

Put ``tests/mpi4py_adapter`` first on ``sys.path`` to run programs (or
mpi4py's own test suite) written for mpi4py against mpi_shim.  As with the
real package, ``mpi4py.rc`` can be changed before ``mpi4py.MPI`` is first
imported (that import initializes MPI).  The pure-Python subpackages
(``mpi4py.util``, ``mpi4py.futures`` ...) come from an installed mpi4py,
found at run time and imported on top of this ``MPI``.
"""
import importlib
import importlib.abc
import importlib.machinery
import os
import sys

from mpi_shim import rc  # noqa: F401 - mpi4py.rc

sys.modules[__name__ + ".rc"] = rc

__version__ = "4.1.2"


class _MPIFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``import mpi4py.MPI`` load (and alias) ``mpi_shim.MPI``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == __name__ + ".MPI":
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module("mpi_shim.MPI")
        self._spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self._spec      # it stays mpi_shim.MPI


sys.meta_path.insert(0, _MPIFinder())


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


def get_include():
    return ""


def get_config():
    return {}

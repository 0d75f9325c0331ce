"""Drop-in ``mpi4py`` package: programs written for mpi4py run on mpi_shim.

Opt-in (a real mpi4py installed in the same environment is never shadowed
unless asked): ``ucxpy-run --as-mpi4py -n N python prog.py``, or put the
directory ``python -m mpi_shim.dropin --path`` prints first on
``PYTHONPATH`` (works under ``mpiexec`` too, where ucxpy wires up through
PMI).  ``from mpi4py import MPI`` then gives :mod:`mpi_shim.MPI`; as with
the real package, ``mpi4py.rc`` can be changed before ``mpi4py.MPI`` is
first imported (that import initializes MPI).  mpi4py's pure-Python modules
(``mpi4py.util``, ``mpi4py.futures``, ``mpi4py.run``, ``python -m mpi4py``)
are taken at run time from an installed mpi4py, if there is one, and run
on top of this ``MPI``; nothing of mpi4py is copied here.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import warnings

from mpi_shim import rc as _shim_rc

__version__ = "4.1.2"
__author__ = "ucxpy (drop-in for mpi4py)"


class Rc:
    """Runtime configuration options read when ``mpi4py.MPI`` is first imported.

    ``initialize``, ``threads``, ``thread_level``, ``finalize``,
    ``fast_reduce``, ``recv_mprobe``, ``irecv_bufsz``, ``errors``; unknown
    options raise TypeError.  Set them as attributes or call ``rc(name=value)``.
    """

    _OPTIONS = ("initialize", "threads", "thread_level", "finalize", "fast_reduce",
                "recv_mprobe", "irecv_bufsz", "errors")

    def __init__(self, **kwargs):
        for name in self._OPTIONS:
            object.__setattr__(self, name, getattr(_shim_rc, name))
        self(**kwargs)

    def __setattr__(self, name, value):
        if name not in self._OPTIONS:
            raise TypeError(f"object has no attribute {name!r}")
        object.__setattr__(self, name, value)
        if self is rc:                      # the module-level rc drives mpi_shim
            setattr(_shim_rc, name, value)

    def __call__(self, **kwargs):
        for name, value in kwargs.items():
            setattr(self, name, value)

    def __repr__(self):
        return f"<{__name__}.rc>"


rc = Rc()
sys.modules[__name__ + ".rc"] = rc


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
            loc = list(spec.submodule_search_locations)[0]
            if os.path.abspath(loc) != here:
                return loc
    return None


_REAL = _installed_mpi4py_dir()
if _REAL is not None:
    __path__.append(_REAL)


def get_include() -> str:
    """Return the directory of mpi4py's C headers (those of an installed mpi4py)."""
    if _REAL is not None and os.path.isdir(os.path.join(_REAL, "include")):
        return os.path.join(_REAL, "include")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def get_config() -> dict:
    """Return the build configuration (no MPI compiler: mpi_shim is Python)."""
    return {}


def profile(name: str, *, path=None) -> None:
    """Load a profiling library (``lib<name>.so``) into the process, as mpi4py does.

    ``path`` is a directory or a sequence of directories searched first.
    Raises ValueError when no such library exists; warns when it cannot be
    loaded.  (mpi_shim has no PMPI layer: the library is loaded, its MPI_*
    symbols are not called by this MPI.)
    """
    import ctypes       # deferred: only profile() needs ctypes, not `import mpi4py`
    if path is None:
        dirs = []
    elif isinstance(path, (str, bytes, os.PathLike)):
        dirs = [os.fsdecode(path)]
    else:
        dirs = [os.fsdecode(p) for p in path]
    if not dirs:
        dirs = [""]
    candidates = []
    for d in dirs:
        for fname in (name, f"lib{name}.so", f"{name}.so"):
            full = os.path.join(d, fname) if d else fname
            candidates.append(full)
    found = None
    for full in candidates:
        if os.path.isabs(full) or os.sep in full:
            if os.path.isfile(full):
                found = full
                break
        elif not os.sep in name and _in_ld_path(full):
            found = full
            break
    if found is None:
        raise ValueError(f"profiling library {name!r} not found")
    try:
        ctypes.CDLL(found, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        warnings.warn(f"cannot load profiling library {found!r}: {e}", UserWarning,
                      stacklevel=2)


def _in_ld_path(fname) -> bool:
    import ctypes.util      # deferred: ctypes.util imports subprocess and shutil
    base = fname[3:-3] if fname.startswith("lib") and fname.endswith(".so") else fname
    return ctypes.util.find_library(base) is not None

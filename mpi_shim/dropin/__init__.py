"""Drop-in packages: ``mpi4py`` (on mpi_shim) and ``shmem4py`` (on ucxpy's shmem).

They are opt-in: nothing is installed under those names.  A program runs
on them unmodified when their directories come first on ``sys.path``:

* ``ucxpy-run --as-mpi4py`` / ``--as-shmem4py`` does it for the ranks;
* ``python -m mpi_shim.dropin --path [mpi4py|shmem4py]`` prints the
  directory to prepend to ``PYTHONPATH`` (for ``mpiexec``, batch scripts);
* :func:`activate` does it in-process, before the program imports them.
"""
from __future__ import annotations

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATHS = {
    "mpi4py": os.path.join(_ROOT, "mpi_shim", "dropin"),
    "shmem4py": os.path.join(_ROOT, "shmem", "dropin"),
}


def path(name: str = "mpi4py") -> str:
    """Directory that holds the drop-in package ``name``."""
    try:
        return PATHS[name]
    except KeyError:
        raise ValueError(f"no drop-in package {name!r} (choose from {', '.join(PATHS)})") \
            from None


def pythonpath(name: str = "mpi4py") -> list:
    """The ``PYTHONPATH`` entries a process needs to run on the drop-in
    ``name``: its directory, then the one holding mpi_shim / shmem.  The
    ``ucxpy.dropins`` entry points name this for ``ucxpy-run --as-<name>``."""
    return [path(name), _ROOT]


def activate(*names: str) -> None:
    """Put the drop-in packages first on ``sys.path`` (before they are imported)."""
    for name in names or ("mpi4py",):
        p = path(name)
        if name in sys.modules and not getattr(sys.modules[name], "__file__", "").startswith(p):
            raise RuntimeError(f"the real {name} is already imported; activate the "
                               "drop-in before importing it")
        if p not in sys.path:
            sys.path.insert(0, p)

"""Adapter: lets shmem4py's test suite import ucxpy's ``shmem`` as ``shmem4py``.

``from shmem4py import shmem`` yields :mod:`shmem4py.shmem` (this package),
which re-exports ucxpy's ``shmem`` and adds the few shmem4py internals the
tests touch (``lib`` constants, ``_getbuffer``).  ``shmem4py.rc`` mirrors
shmem4py's runtime-configuration object; with ``rc.initialize`` (default)
importing ``shmem4py.shmem`` initializes, and ucxpy's ``shmem`` finalizes at
exit.  Written for ucxpy; no shmem4py code is used.
"""
import sys as _sys

__version__ = "ucxpy-adapter"


class Rc:
    """Runtime configuration (shmem4py.rc): ``initialize``, ``threads``,
    ``thread_level``, ``finalize``; unknown names raise TypeError."""

    initialize = True
    threads = False
    thread_level = "multiple"
    finalize = None

    def __init__(self, **kwargs):
        self(**kwargs)

    def __setattr__(self, name, value):
        if not hasattr(type(self), name):
            raise TypeError(f"rc has no option {name!r}")
        super().__setattr__(name, value)

    def __call__(self, **kwargs):
        unknown = [k for k in kwargs if not hasattr(type(self), k)]
        if unknown:
            raise TypeError(f"unexpected rc option(s): {', '.join(unknown)}")
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __repr__(self):
        return f"<{__name__}.rc>"


rc = Rc()
_sys.modules[__name__ + ".rc"] = rc

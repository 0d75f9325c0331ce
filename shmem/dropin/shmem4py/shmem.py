"""``shmem4py.shmem`` for the conformance run: ucxpy's ``shmem`` plus the
shmem4py internals its tests use.  See the package docstring."""
import os as _os

import numpy as _np

from shmem import *  # noqa: F401,F403 - the API under test
from shmem import __all__ as _ours_all
from shmem import ffi

from . import rc as _rc

__all__ = list(_ours_all) + ["ffi", "lib"]

#: the C-level routines and constants (shmem4py's cffi ``lib``): see shmem4py.api
from .api import lib  # noqa: E402

_C_TYPES = {"b": "signed char", "h": "short", "i": "int", "l": "long", "q": "long long",
            "B": "unsigned char", "H": "unsigned short", "I": "unsigned int",
            "L": "unsigned long", "Q": "unsigned long long", "f": "float", "d": "double",
            "g": "long double", "c": "char"}


def _getbuffer(obj, readonly=False):
    """(cdata, element count, C type name) of a contiguous numpy array."""
    if not isinstance(obj, _np.ndarray):
        raise TypeError("object is not a NumPy array")
    if not readonly and not obj.flags.writeable:
        raise ValueError("array object is read-only")
    if not obj.flags.c_contiguous:
        if not obj.flags.f_contiguous:
            raise ValueError("array object is not contiguous")
        obj = obj.T
    ctype = _C_TYPES.get(obj.dtype.char, "char")
    return ffi.from_buffer(f"{ctype}[]", obj), obj.size, ctype


def _env_flag(name, default):
    v = _os.environ.get(f"SHMEM4PY_RC_{name.upper()}")
    if not v:
        return default
    return v.strip().lower() in ("1", "y", "yes", "on", "true")


if _env_flag("initialize", _rc.initialize):
    if _rc.threads:
        init_thread(getattr(THREAD, str(_rc.thread_level).upper()))
    else:
        init()

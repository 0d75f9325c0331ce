"""``shmem4py.api``: the OpenSHMEM C API as cffi calls, on ucxpy's shmem.

``ffi`` is a cffi FFI for making C objects (``ffi.new('long*')``,
``ffi.cast``, ``ffi.string``); :mod:`shmem4py.api.lib` holds the C-named
routines (``shmem_malloc``, ``shmem_long_get`` ...) and constants, taking and
returning cffi pointers.  Symmetric pointers are addresses in this PE's
symmetric heap; the routines translate them to heap offsets and run the
Python API underneath.  Written for ucxpy; no shmem4py code is used.
"""
from . import lib  # noqa: F401
from ._ffi import ffi  # noqa: F401

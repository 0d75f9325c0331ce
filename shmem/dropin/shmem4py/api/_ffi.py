"""The one cffi FFI of ``shmem4py.api`` (its own module, so that
:mod:`shmem4py.api.lib` and the package both take it from below)."""
import cffi as _cffi

ffi = _cffi.FFI()

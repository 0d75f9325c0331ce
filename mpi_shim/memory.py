"""Raw memory: ``MPI.buffer`` and reading DLPack tensors in place."""
from __future__ import annotations

import ctypes

import numpy as np

from .exceptions import ERR_BUFFER, ERR_TYPE, Exception

_EMPTY = memoryview(bytearray(0))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_DL_KIND = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}


def dlpack_view(obj):
    """Byte view of a CPU DLPack tensor (read in place; the capsule keeps
    ownership, so its producer frees it as usual)."""
    dev = obj.__dlpack_device__()
    if int(dev[0]) not in (1, 3):          # kDLCPU, kDLCUDAHost
        raise Exception(ERR_BUFFER, "DLPack tensor is not in host memory")
    capsule = obj.__dlpack__()
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    kind = _DL_KIND.get(t.dtype.code)
    nbits = t.dtype.bits * t.dtype.lanes
    if kind == "f" and t.dtype.lanes == 2:
        kind = "c"
    elif kind is None or t.dtype.lanes != 1:
        raise Exception(ERR_TYPE, "unsupported DLPack dtype")
    dt = np.dtype("?" if kind == "b" else f"{kind}{nbits // 8}")
    shape = [t.shape[i] for i in range(t.ndim)]
    n = int(np.prod(shape)) if shape else 1
    if t.strides:
        expect = 1
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and t.strides[i] != expect:
                raise Exception(ERR_BUFFER, "DLPack tensor is not contiguous")
            expect *= shape[i]
    nbytes = n * dt.itemsize
    if nbytes == 0:
        return _EMPTY, dt.char, dt.itemsize
    mv = memoryview((ctypes.c_char * nbytes).from_address(t.data + t.byte_offset)).cast("B")
    return mv, dt.char, dt.itemsize


# -- MPI.buffer -----------------------------------------------------------------------
class buffer:
    """Raw memory (``MPI.buffer``): what ``Alloc_mem`` and ``Win.tomemory``
    return.  Instances are ctypes byte arrays, so they export the buffer
    protocol (``numpy.frombuffer(win.tomemory(), ...)`` works), and add
    mpi4py's conveniences: ``address``, ``nbytes``, ``format``, ``m[:] = 0``."""

    __slots__ = ()

    @staticmethod
    def _type(n):
        t = _BUFTYPES.get(n)
        if t is None:
            t = _BUFTYPES[n] = type("buffer", (buffer, ctypes.c_ubyte * n), {"__slots__": ()})
        return t

    @classmethod
    def allocate(cls, nbytes, clear=True):
        return buffer._type(nbytes)()

    @classmethod
    def over(cls, view):
        """A buffer sharing the memory of writable ``view``."""
        view = memoryview(view).cast("B") if memoryview(view).format != "B" else memoryview(view)
        if view.nbytes == 0:
            return buffer._type(0)()
        return buffer._type(view.nbytes).from_buffer(view)

    address = property(lambda self: ctypes.addressof(self) if len(self) else 0)
    nbytes = property(len)
    readonly = property(lambda self: False)
    format = property(lambda self: "B")
    itemsize = property(lambda self: 1)
    obj = property(lambda self: getattr(self, "_objects", None))

    def __setitem__(self, key, value):
        mv = memoryview(self).cast("B")
        if isinstance(value, int) and isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            n = len(range(start, stop, step))
            mv[key] = bytes([value]) * n
        else:
            mv[key] = value

    def tobytes(self, order=None):
        return bytes(memoryview(self))

    def release(self):
        pass

    def cast(self, format, shape=None):
        mv = memoryview(self).cast("B")
        return mv.cast(format) if shape is None else mv.cast(format, shape)


_BUFTYPES = {}

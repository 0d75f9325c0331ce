"""Array interchange protocols: DLPack (``__dlpack__``) and ``__cuda_array_interface__``.

Both describe memory by address, shape, strides and element type.  The
memory is read in place: the capsule is not consumed (its producer keeps
ownership and frees it as usual) and no reference to the producer's
storage outlives the message.  Device memory (CUDA/ROCm devices) is taken
to be addressable from the host, as it is for the host-side test objects;
such buffers are flagged ``device`` so that ``MPI.buffer`` refuses
element access from Python.

Errors follow mpi4py: malformed attributes raise ``TypeError``/``KeyError``/
``ValueError``, unusable memory (non-contiguous, read-only for a receive,
non-native byte order, a used capsule) raises ``BufferError``.
"""
from __future__ import annotations

import ctypes
import math
import operator
import sys
import warnings

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

K_DL_CPU, K_DL_CUDA, K_DL_CUDA_HOST, K_DL_ROCM, K_DL_ROCM_HOST, K_DL_CUDA_MANAGED = \
    1, 2, 3, 10, 11, 13
_HOST = {K_DL_CPU, K_DL_CUDA_HOST, K_DL_ROCM_HOST, K_DL_CUDA_MANAGED}
_DL_READ_ONLY = 1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_uint), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _DLVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _DLTensor)]


_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

#: DLPack (type code, bits) -> struct format of one element
_DL_FORMATS = {(0, 8): "b", (0, 16): "h", (0, 32): "i", (0, 64): "q",
               (1, 8): "B", (1, 16): "H", (1, 32): "I", (1, 64): "Q",
               (2, 16): "e", (2, 32): "f", (2, 64): "d", (2, 128): "g",
               (5, 64): "Zf", (5, 128): "Zd", (5, 256): "Zg", (6, 8): "?"}
#: two-lane floats: complex numbers
_DL_COMPLEX = {32: "Zf", 64: "Zd", 128: "Zg"}


class Memory:
    """Host-addressable memory found through an interchange protocol."""

    __slots__ = ("address", "nbytes", "readonly", "format", "itemsize", "device", "keep")

    def __init__(self, address, nbytes, readonly, fmt, itemsize, device, keep):
        self.address, self.nbytes, self.readonly = address, nbytes, readonly
        self.format, self.itemsize, self.device, self.keep = fmt, itemsize, device, keep

    def view(self) -> memoryview:
        """A flat byte memoryview of the memory (read-only when it is)."""
        if self.nbytes == 0:
            mv = memoryview(bytearray(0))
        else:
            mv = memoryview((ctypes.c_char * self.nbytes).from_address(self.address)).cast("B")
        return mv.toreadonly() if self.readonly else mv


def _contiguous(shape, strides, itemsize) -> bool:
    """Whether ``strides`` (in bytes) describe C or Fortran order (size-1 axes ignored)."""
    if strides is None or 0 in shape:
        return True
    for order in (reversed(range(len(shape))), range(len(shape))):
        expect, ok = itemsize, True
        for d in order:
            if shape[d] != 1 and strides[d] != expect:
                ok = False
                break
            expect *= shape[d]
        if ok:
            return True
    return False


# -- DLPack ----------------------------------------------------------------------------------
def dlpack_device(obj):
    """``(device type, device id)`` of a DLPack exporter (TypeError/ValueError when malformed)."""
    dev_type, dev_id = obj.__dlpack_device__()
    return operator.index(dev_type), operator.index(dev_id)


def from_dlpack(obj) -> Memory:
    """The memory of a DLPack exporter."""
    dev_type, _ = dlpack_device(obj)
    stream = None if dev_type in _HOST else -1
    try:
        capsule = obj.__dlpack__(stream=stream, max_version=(1, 0))
    except TypeError:
        capsule = obj.__dlpack__(stream=stream)
    if capsule is None or type(capsule).__name__ != "PyCapsule":
        raise BufferError("dlpack: expecting a DLPack capsule")
    readonly = False
    if _capsule_valid(capsule, b"dltensor_versioned"):
        managed = _DLManagedVersioned.from_address(
            _capsule_pointer(capsule, b"dltensor_versioned"))
        if managed.version.major != 1:
            raise BufferError(f"dlpack: unsupported version {managed.version.major}")
        tensor = managed.dl_tensor
        readonly = bool(managed.flags & _DL_READ_ONLY)
    elif _capsule_valid(capsule, b"dltensor"):
        tensor = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    else:
        raise BufferError("dlpack: invalid or already consumed capsule")
    ndim = tensor.ndim
    if ndim < 0:
        raise BufferError(f"dlpack: invalid number of dimensions {ndim}")
    if ndim and not tensor.shape:
        raise BufferError("dlpack: missing shape")
    shape = [tensor.shape[i] for i in range(ndim)]
    if any(n < 0 for n in shape):
        raise BufferError(f"dlpack: invalid shape {shape}")
    dt = tensor.dtype
    itemsize = dt.bits * dt.lanes // 8
    if dt.lanes == 1:
        fmt = _DL_FORMATS.get((dt.code, dt.bits))
    else:
        fmt = _DL_COMPLEX.get(dt.bits) if dt.code == 2 and dt.lanes == 2 else None
    if fmt is None:
        fmt, unit = "B", 1
    else:
        unit = itemsize
    strides = [tensor.strides[i] * itemsize for i in range(ndim)] if ndim and tensor.strides \
        else None
    if not _contiguous(shape, strides, itemsize):
        raise BufferError("dlpack: buffer is not contiguous")
    nbytes = math.prod(shape) * itemsize if ndim else itemsize
    address = (tensor.data or 0) + tensor.byte_offset
    if fmt == "B":
        itemsize = unit
    return Memory(address, nbytes, readonly, fmt, itemsize, dev_type not in _HOST,
                  (obj, capsule))


# -- CUDA array interface -----------------------------------------------------------------------
def from_cai(obj) -> Memory:
    """The memory described by ``__cuda_array_interface__``."""
    cai = obj.__cuda_array_interface__
    if not isinstance(cai, dict):
        raise TypeError(f"__cuda_array_interface__: expecting a dict, "
                        f"not {type(cai).__name__}")
    data = cai["data"]
    if not isinstance(data, tuple):
        raise TypeError(f"__cuda_array_interface__: 'data' must be a tuple, "
                        f"not {type(data).__name__}")
    if len(data) != 2:
        raise ValueError(f"__cuda_array_interface__: 'data' must be (pointer, readonly), "
                         f"got {len(data)} items")
    address, readonly = operator.index(data[0]), bool(data[1])
    if cai.get("mask") is not None:
        raise BufferError("__cuda_array_interface__: masked arrays are not supported")
    typestr = cai["typestr"]
    if not isinstance(typestr, str):
        raise TypeError(f"__cuda_array_interface__: 'typestr' must be a str, "
                        f"not {type(typestr).__name__}")
    fmt, itemsize = _typestr(typestr, cai.get("descr"))
    shape = cai["shape"]
    if not isinstance(shape, tuple):
        raise TypeError(f"__cuda_array_interface__: 'shape' must be a tuple, "
                        f"not {type(shape).__name__}")
    shape = [operator.index(n) for n in shape]
    if any(n < 0 for n in shape):
        raise BufferError(f"__cuda_array_interface__: invalid shape {shape}")
    strides = cai.get("strides")
    if strides is not None:
        if not isinstance(strides, tuple):
            raise TypeError(f"__cuda_array_interface__: 'strides' must be a tuple, "
                            f"not {type(strides).__name__}")
        strides = [operator.index(s) for s in strides]
    if not _contiguous(shape, strides, itemsize):
        raise BufferError("__cuda_array_interface__: buffer is not contiguous")
    nbytes = math.prod(shape) * itemsize
    return Memory(address, nbytes, readonly, fmt, itemsize, True, (obj,))


def _typestr(typestr: str, descr):
    """``(struct format, itemsize)`` of an array-interface type string."""
    if len(typestr) < 3:
        raise ValueError(f"__cuda_array_interface__: invalid typestr {typestr!r}")
    order, kind, size = typestr[0], typestr[1], typestr[2:]
    native = "<" if sys.byteorder == "little" else ">"
    if order not in ("|", "=", native):
        raise BufferError(f"__cuda_array_interface__: typestr {typestr!r} with "
                          f"non-native byte order")
    try:
        itemsize = int(size)
    except ValueError:
        raise ValueError(f"__cuda_array_interface__: invalid itemsize in {typestr!r}") from None
    if descr is not None and not isinstance(descr, list):
        raise TypeError(f"__cuda_array_interface__: 'descr' must be a list, "
                        f"not {type(descr).__name__}")
    if kind == "V":
        if descr and len(descr) > 1:
            warnings.warn(f"__cuda_array_interface__: structured typestr {typestr!r} "
                          f"is sent as raw bytes", RuntimeWarning, stacklevel=4)
        return "B", itemsize
    try:
        fmt = np.dtype(f"{kind}{itemsize}").char
    except TypeError:
        return "B", itemsize
    if kind == "c":
        fmt = "Z" + np.dtype(f"f{itemsize // 2}").char
    return fmt, itemsize

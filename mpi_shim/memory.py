"""``MPI.buffer`` (alias ``MPI.memory``): a byte sequence over raw memory.

What ``Alloc_mem``, ``Win.tomemory`` and ``buffer.frombuffer``/``fromaddress``
return.  Python 3.11 lets only C types export the buffer protocol, so the
class is a one-dimensional ``uint8`` numpy array subclass: ``memoryview``,
``numpy.frombuffer`` and every MPI call see its bytes in place, read-only
when the memory is.  On top of that it behaves like mpi4py's buffer, not
like an array: indexing gives ints, slicing (step 1 only) gives buffers,
``buf[:] = 0`` fills, no arithmetic, equality is identity, not picklable.
``release()`` (and ``Free_mem``) detaches it: address and size become 0.
Memory found through DLPack or ``__cuda_array_interface__`` on a device
refuses element access (``BufferError``).
"""
from __future__ import annotations

import ctypes
import operator

import numpy as np      # (this module is imported on first use: MPI's __getattr__)

from .msgspec import acquire


_EMPTY = object()          # buffer() without an argument


def _host_array(address: int, nbytes: int) -> np.ndarray:
    if nbytes == 0:
        return np.zeros(0, np.uint8)
    return np.frombuffer((ctypes.c_char * nbytes).from_address(address), np.uint8)


class buffer(np.ndarray):
    """Buffer.

    A contiguous sequence of bytes at a memory address."""

    __array_ufunc__ = None
    __hash__ = object.__hash__
    __eq__ = object.__eq__
    __ne__ = object.__ne__

    def __new__(cls, buf=_EMPTY):
        if buf is _EMPTY:
            return _make(np.zeros(0, np.uint8), None, False, False, address=0)
        return buffer.frombuffer(buf, readonly=_readonly_source(buf))

    def __array_finalize__(self, obj):
        self._obj = getattr(obj, "_obj", None)
        self._readonly = getattr(obj, "_readonly", False)
        self._device = getattr(obj, "_device", False)
        self._released = False
        self._address = None

    def __reduce__(self):
        raise TypeError(f"cannot pickle {type(self).__name__!r} object")

    def __reduce_ex__(self, protocol):
        raise TypeError(f"cannot pickle {type(self).__name__!r} object")

    def __repr__(self):
        return f"<{type(self).__module__}.buffer object at {id(self):#x}>"

    def __bool__(self):
        return self.nbytes > 0

    def __len__(self):
        return self.nbytes

    # -- construction ------------------------------------------------------------------
    @staticmethod
    def allocate(nbytes: int, clear: bool = False) -> "buffer":
        """Buffer allocation.

        Raises ValueError for a negative size and TypeError for a non-integer one.
        """
        n = operator.index(nbytes)
        if n < 0:
            raise ValueError(f"expecting a non-negative size, got {n}")
        storage = bytearray(n)
        arr = np.frombuffer(storage, np.uint8) if n else np.zeros(0, np.uint8)
        address = arr.__array_interface__["data"][0] if n else \
            np.zeros(1, np.uint8).__array_interface__["data"][0]
        return _make(arr, storage, False, False, address=address)

    @staticmethod
    def frombuffer(obj, readonly: bool = False) -> "buffer":
        """Buffer from buffer-like object.

        Raises TypeError for a non-buffer, BufferError for read-only memory asked to be writable.
        """
        if obj is None or isinstance(obj, (int, float, list, tuple, dict, str)):
            raise TypeError(f"a bytes-like object is required, not '{type(obj).__name__}'")
        mem = acquire(obj, writable=not readonly)
        arr = np.frombuffer(mem.view, np.uint8) if mem.nbytes else np.zeros(0, np.uint8)
        return _make(arr, obj, bool(readonly or mem.readonly), mem.device,
                     address=mem.address)

    @staticmethod
    def fromaddress(address: int, nbytes: int, readonly: bool = False) -> "buffer":
        """Buffer from address and size in bytes.

        Raises ValueError for a negative size or a null address with a size.
        """
        address, n = operator.index(address), operator.index(nbytes)
        if n < 0:
            raise ValueError(f"expecting a non-negative size, got {n}")
        if address == 0 and n > 0:
            raise ValueError("expecting a non-null address")
        return _make(_host_array(address, n), None, bool(readonly), False, address=address)

    # -- attributes ---------------------------------------------------------------------------
    @property
    def address(self) -> int:
        """Buffer address.

        Zero once released.
        """
        return 0 if self._released else self._address

    @property
    def obj(self):
        """The underlying object of the buffer.

        None for memory given by address.
        """
        return None if self._released else self._obj

    @property
    def nbytes(self) -> int:
        """Buffer size (in bytes).

        Zero once released.
        """
        return 0 if self._released else self.shape[0]

    @property
    def readonly(self) -> bool:
        """Buffer is read-only.

        False once released.
        """
        return False if self._released else self._readonly

    @property
    def format(self) -> str:
        """Format of each element.

        Always "B" (unsigned bytes).
        """
        return "B"

    @property
    def itemsize(self) -> int:
        """Size (in bytes) of each element.

        Always 1.
        """
        return 1

    # -- sequence protocol ----------------------------------------------------------------------
    def _host(self):
        if self._device:
            raise BufferError("buffer: device memory is not accessible from Python")

    def _index(self, i: int) -> int:
        n = self.nbytes
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("index out of range")
        return i

    def _span(self, key: slice):
        start, stop, step = key.indices(self.nbytes)
        if step != 1:
            raise IndexError("slice with step not supported")
        return start, max(start, stop)

    def __getitem__(self, key):
        self._host()
        if isinstance(key, slice):
            start, stop = self._span(key)
            part = np.ndarray.__getitem__(self, slice(start, stop)).view(buffer)
            part._obj, part._readonly, part._device = self, self._readonly, self._device
            part._address = self.address + start
            return part
        if key is None or not hasattr(key, "__index__"):
            raise TypeError(f"buffer indices must be integers or slices, "
                            f"not {type(key).__name__}")
        return int(np.ndarray.__getitem__(self, self._index(key)))

    def __setitem__(self, key, value):
        self._host()
        if self.readonly:
            raise TypeError("buffer is read-only")
        if isinstance(key, slice):
            start, stop = self._span(key)
            target = np.ndarray.__getitem__(self, slice(start, stop)).view(np.ndarray)
            if isinstance(value, int):
                if not 0 <= value <= 255:
                    raise OverflowError("value too large to convert to unsigned char")
                target[:] = value
                return
            src = memoryview(value).cast("B") if memoryview(value).format != "B" or \
                memoryview(value).ndim != 1 else memoryview(value)
            if src.nbytes != stop - start:
                raise ValueError("buffer slice assignment: sizes differ")
            target[:] = np.frombuffer(src, np.uint8) if src.nbytes else target[:0]
            return
        if key is None or not hasattr(key, "__index__"):
            raise TypeError(f"buffer indices must be integers or slices, "
                            f"not {type(key).__name__}")
        value = operator.index(value)
        if not 0 <= value <= 255:
            raise OverflowError("value too large to convert to unsigned char")
        np.ndarray.__setitem__(self, self._index(key), value)

    def __delitem__(self, key):
        raise NotImplementedError("buffer items cannot be deleted")

    # -- conversions ---------------------------------------------------------------------------
    def cast(self, format: str, shape=None) -> memoryview:
        """Cast to a memoryview with new format or shape.

        Raises BufferError for device memory.
        """
        self._host()
        mv = memoryview(self.view(np.ndarray)[:self.nbytes])
        return mv.cast(format) if shape is None else mv.cast(format, shape)

    def tobytes(self, order=None) -> bytes:
        """Return the data in the buffer as a byte string.

        The order argument is accepted for memoryview compatibility.
        """
        self._host()
        return bytes(self.view(np.ndarray)[:self.nbytes])

    def toreadonly(self) -> "buffer":
        """Return a readonly version of the buffer object.

        It shares address, memory and underlying object with the original.
        """
        out = _make(self.view(np.ndarray), self._obj, True, self._device,
                    address=self.address)
        return out

    def release(self) -> None:
        """Release the underlying buffer exposed by the buffer object.

        Address and size become zero; the memory itself is not touched.
        """
        self._released = True
        self._obj = None


def _readonly_source(obj) -> bool:
    if isinstance(obj, buffer):
        return obj.readonly
    try:
        return memoryview(obj).readonly
    except TypeError:
        return False


def _make(arr: np.ndarray, obj, readonly: bool, device: bool, address: int) -> buffer:
    b = arr.view(buffer)
    b._obj, b._readonly, b._device = obj, readonly, device
    b._address = address
    if readonly and b.flags.writeable:
        b.flags.writeable = False
    return b

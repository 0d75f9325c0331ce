"""The "external32" data representation (MPI 4.1, section 5.2.2).

Every basic element is stored big-endian with the sizes of MPI's table:
``LONG``/``UNSIGNED_LONG`` and ``INT``-sized Fortran types take 4 bytes,
``WCHAR`` 2, ``LONG_DOUBLE`` (x87 80-bit extended here) 16 bytes as an
IEEE binary128 number, complex types two such parts, pair types their two
components.  Conversion works on natively packed bytes (see
:mod:`.packing`): a homogeneous type converts its whole packed stream in
one numpy call, a mixed one per element kind (one index per basic
element).
"""
from __future__ import annotations

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

from .packing import _rows
from .typemap import ELEMENTS, Typemap

_MANT = []


def _ldouble_mant() -> int:
    """The mantissa bits of long double: 63 (x87 extended), 112 (binary128) or
    52 (a double); asked on first use (numpy: ucxpy.lazy)."""
    if not _MANT:
        _MANT.append(np.finfo(np.longdouble).nmant)
    return _MANT[0]


def _x87_to_quad(native: np.ndarray) -> np.ndarray:
    """16-byte x87 extended values (little-endian storage) to big-endian binary128."""
    raw = native.view(np.uint8).reshape(-1, 16)
    out = np.zeros_like(raw)
    if _ldouble_mant() == 112:
        return raw[:, ::-1].copy()
    if _ldouble_mant() == 52:          # long double is a double: widen
        x = raw[:, :8].copy().view(np.float64).reshape(-1)
        bits = x.view(np.uint64)
        sign_exp = (bits >> 52).astype(np.uint64)
        exp = sign_exp & 0x7FF
        sign = sign_exp >> 11
        qexp = np.where(exp == 0, 0, np.where(exp == 0x7FF, 0x7FFF, exp + 16383 - 1023))
        frac = (bits & ((1 << 52) - 1)) << np.uint64(12)
        out[:, 0:2] = ((sign << 15) | qexp).astype(">u2").view(np.uint8).reshape(-1, 2)
        out[:, 2:10] = frac.astype(">u8").view(np.uint8).reshape(-1, 8)
        return out
    mant = raw[:, 0:8].copy().view("<u8").reshape(-1)
    sign_exp = raw[:, 8:10].copy().view("<u2").reshape(-1)
    fraction = (mant << np.uint64(1))            # drop the explicit integer bit
    out[:, 0:2] = sign_exp.astype(">u2").view(np.uint8).reshape(-1, 2)
    out[:, 2:10] = fraction.astype(">u8").view(np.uint8).reshape(-1, 8)
    return out


def _quad_to_x87(ext: np.ndarray) -> np.ndarray:
    """Big-endian binary128 values to 16-byte native long doubles."""
    raw = ext.view(np.uint8).reshape(-1, 16)
    out = np.zeros_like(raw)
    if _ldouble_mant() == 112:
        return raw[:, ::-1].copy()
    sign_exp = raw[:, 0:2].copy().view(">u2").reshape(-1).astype(np.uint64)
    top = raw[:, 2:10].copy().view(">u8").reshape(-1)
    exp = sign_exp & 0x7FFF
    if _ldouble_mant() == 52:
        sign = sign_exp >> 15
        dexp = np.clip(exp.astype(np.int64) - 16383 + 1023, 0, 0x7FF).astype(np.uint64)
        dexp = np.where(exp == 0x7FFF, 0x7FF, np.where(exp == 0, 0, dexp))
        bits = (sign << np.uint64(63)) | (dexp << np.uint64(52)) | (top >> np.uint64(12))
        out[:, :8] = bits.astype("<u8").view(np.uint8).reshape(-1, 8)
        return out
    integer_bit = np.where(exp != 0, np.uint64(1) << np.uint64(63), np.uint64(0))
    mant = (top >> np.uint64(1)) | integer_bit
    out[:, 0:8] = mant.astype("<u8").view(np.uint8).reshape(-1, 8)
    out[:, 8:10] = sign_exp.astype("<u2").view(np.uint8).reshape(-1, 2)
    return out


def _to_ext(code: int, native: np.ndarray) -> np.ndarray:
    """Native bytes of elements of kind ``code`` to their external32 bytes."""
    e = ELEMENTS[code]
    if e.convert == "x87":
        return _x87_to_quad(native)
    values = native.view(e.numpy)
    if e.numpy.kind == "U":
        values = values.view(np.uint32)
    elif e.numpy.kind == "S":
        return native
    return values.astype(e.ext32).view(np.uint8)


def _from_ext(code: int, ext: np.ndarray) -> np.ndarray:
    """External32 bytes of elements of kind ``code`` to native bytes."""
    e = ELEMENTS[code]
    if e.convert == "x87":
        return _quad_to_x87(ext)
    if e.numpy.kind == "S":
        return ext
    target = np.uint32 if e.numpy.kind == "U" else e.numpy
    return ext.view(e.ext32).astype(target).view(np.uint8)


def size(tm: Typemap, count: int) -> int:
    """Bytes of ``count`` elements in external32."""
    return tm.ext32_layout()[0] * count


def _gather(flat, positions, width):
    return _rows(flat, width)[positions].reshape(-1)


def encode(packed: np.ndarray, tm: Typemap, count: int) -> np.ndarray:
    """External32 bytes of ``count`` natively packed elements."""
    kinds = tm.kinds()
    if len(kinds) == 1:
        (code,) = kinds
        return _to_ext(code, packed).reshape(-1)
    per, offsets = tm.ext32_layout()
    out = np.empty(per * count, np.uint8)
    ebase = per * np.arange(count, dtype=np.int64)
    nbase = tm.size * np.arange(count, dtype=np.int64)
    for code, ext_pos in offsets.items():
        e = ELEMENTS[code]
        npos = (nbase[:, None] + tm.element_positions(code)[None, :]).reshape(-1)
        epos = (ebase[:, None] + ext_pos[None, :]).reshape(-1)
        native = _gather(packed, npos, e.size)
        _rows(out, e.ext32.itemsize)[epos] = _to_ext(code, native).reshape(-1, e.ext32.itemsize)
    return out


def decode(ext: np.ndarray, tm: Typemap, count: int) -> np.ndarray:
    """Natively packed bytes of ``count`` elements from their external32 bytes."""
    kinds = tm.kinds()
    if len(kinds) == 1:
        (code,) = kinds
        return _from_ext(code, ext).reshape(-1)
    per, offsets = tm.ext32_layout()
    out = np.empty(tm.size * count, np.uint8)
    ebase = per * np.arange(count, dtype=np.int64)
    nbase = tm.size * np.arange(count, dtype=np.int64)
    for code, ext_pos in offsets.items():
        e = ELEMENTS[code]
        npos = (nbase[:, None] + tm.element_positions(code)[None, :]).reshape(-1)
        epos = (ebase[:, None] + ext_pos[None, :]).reshape(-1)
        raw = _gather(ext, epos, e.ext32.itemsize)
        _rows(out, e.size)[npos] = _from_ext(code, raw).reshape(-1, e.size)
    return out

"""The table of predefined datatypes, as mpi4py 4.1.2 on MPICH exposes them.

Each row: the module constants naming the type (aliases share one object),
its MPI name, the numpy storage of one element, the type code ``tocode()``
returns, ``typechar``, ``typestr`` and alignment.  Pair types (``SHORT_INT``
...) are listed with their two components.  Types MPICH does not provide
(``LOGICAL1``, ``INTEGER16``, ``REAL2``, ``COMPLEX4``, ``BFLOAT16_T`` ...)
are null, exactly where mpi4py+MPICH has them null.

``CODES`` maps type codes (``fromcode``, buffer formats, typecode strings in
message specs) to the constant name they select.
"""
from __future__ import annotations

from .typemap import register_element

#: (constant names, MPI name, numpy dtype, code, typechar, typestr, align, ext32 dtype)
NAMED = [
    (("PACKED",), "MPI_PACKED", "u1", "B", "B", "u1", 1, None),
    (("BYTE",), "MPI_BYTE", "u1", "B", "B", "u1", 1, None),
    (("AINT",), "MPI_AINT", "i8", "p", "p", "i8", 8, None),
    (("OFFSET",), "MPI_OFFSET", "i8", "p", "p", "i8", 8, None),
    (("COUNT",), "MPI_COUNT", "i8", "p", "p", "i8", 8, None),
    (("CHAR",), "MPI_CHAR", "S1", "c", "c", "S1", 1, None),
    (("WCHAR",), "MPI_WCHAR", "U1", "U", "U", "U1", 4, ">u2"),
    (("SIGNED_CHAR",), "MPI_SIGNED_CHAR", "i1", "b", "b", "i1", 1, None),
    (("SHORT", "SIGNED_SHORT"), "MPI_SHORT", "i2", "h", "h", "i2", 2, None),
    (("INT", "SIGNED_INT"), "MPI_INT", "i4", "i", "i", "i4", 4, None),
    (("LONG", "SIGNED_LONG"), "MPI_LONG", "i8", "l", "l", "i8", 8, ">i4"),
    (("LONG_LONG", "SIGNED_LONG_LONG"), "MPI_LONG_LONG_INT", "i8", "q", "q", "i8", 8, None),
    (("UNSIGNED_CHAR",), "MPI_UNSIGNED_CHAR", "u1", "B", "B", "u1", 1, None),
    (("UNSIGNED_SHORT",), "MPI_UNSIGNED_SHORT", "u2", "H", "H", "u2", 2, None),
    (("UNSIGNED", "UNSIGNED_INT"), "MPI_UNSIGNED", "u4", "I", "I", "u4", 4, None),
    (("UNSIGNED_LONG",), "MPI_UNSIGNED_LONG", "u8", "L", "L", "u8", 8, ">u4"),
    (("UNSIGNED_LONG_LONG",), "MPI_UNSIGNED_LONG_LONG", "u8", "Q", "Q", "u8", 8, None),
    (("FLOAT", "FLOAT32_T"), "MPI_FLOAT", "f4", "f", "f", "f4", 4, None),
    (("DOUBLE", "FLOAT64_T"), "MPI_DOUBLE", "f8", "d", "d", "f8", 8, None),
    (("LONG_DOUBLE",), "MPI_LONG_DOUBLE", "g", "g", "g", "f16", 16, "x87"),
    (("C_BOOL", "BOOL"), "MPI_C_BOOL", "?", "b1", "?", "b1", 1, None),
    (("INT8_T", "SINT8_T"), "MPI_INT8_T", "i1", "i1", "b", "i1", 1, None),
    (("INT16_T", "SINT16_T"), "MPI_INT16_T", "i2", "i2", "h", "i2", 2, None),
    (("INT32_T", "SINT32_T"), "MPI_INT32_T", "i4", "i4", "i", "i4", 4, None),
    (("INT64_T", "SINT64_T"), "MPI_INT64_T", "i8", "i8", "l", "i8", 8, None),
    (("UINT8_T",), "MPI_UINT8_T", "u1", "u1", "B", "u1", 1, None),
    (("UINT16_T",), "MPI_UINT16_T", "u2", "u2", "H", "u2", 2, None),
    (("UINT32_T",), "MPI_UINT32_T", "u4", "u4", "I", "u4", 4, None),
    (("UINT64_T",), "MPI_UINT64_T", "u8", "u8", "L", "u8", 8, None),
    (("FLOAT16_T",), "MPIX_C_FLOAT16", "f2", "e", "e", "f2", 2, None),
    (("C_COMPLEX", "C_FLOAT_COMPLEX"), "MPI_C_COMPLEX", "c8", "F", "F", "c8", 4, None),
    (("C_DOUBLE_COMPLEX",), "MPI_C_DOUBLE_COMPLEX", "c16", "D", "D", "c16", 8, None),
    (("C_LONG_DOUBLE_COMPLEX",), "MPI_C_LONG_DOUBLE_COMPLEX", "G", "G", "G", "c32", 16,
     "x87"),
    (("CXX_BOOL",), "MPI_CXX_BOOL", "?", "?", "?", "b1", 1, None),
    (("CXX_FLOAT_COMPLEX",), "MPI_CXX_FLOAT_COMPLEX", "c8", "F", "F", "c8", 4, None),
    (("CXX_DOUBLE_COMPLEX",), "MPI_CXX_DOUBLE_COMPLEX", "c16", "D", "D", "c16", 8, None),
    (("CXX_LONG_DOUBLE_COMPLEX",), "MPI_CXX_LONG_DOUBLE_COMPLEX", "G", "G", "G", "c32", 16,
     "x87"),
    (("CHARACTER",), "MPI_CHARACTER", "S1", "c", "c", "S1", 1, None),
    (("LOGICAL", "F_BOOL"), "MPI_LOGICAL", "i4", "i", "i", "i4", 4, None),
    (("INTEGER", "F_INT"), "MPI_INTEGER", "i4", "i", "i", "i4", 4, None),
    (("REAL", "F_FLOAT"), "MPI_REAL", "f4", "f", "f", "f4", 4, None),
    (("DOUBLE_PRECISION", "F_DOUBLE"), "MPI_DOUBLE_PRECISION", "f8", "d", "d", "f8", 8, None),
    (("COMPLEX", "F_COMPLEX", "F_FLOAT_COMPLEX"), "MPI_COMPLEX", "c8", "F", "F", "c8", 4,
     None),
    (("DOUBLE_COMPLEX", "F_DOUBLE_COMPLEX"), "MPI_DOUBLE_COMPLEX", "c16", "D", "D", "c16", 8,
     None),
    (("INTEGER1",), "MPI_INTEGER1", "i1", "i1", "b", "i1", 1, None),
    (("INTEGER2",), "MPI_INTEGER2", "i2", "i2", "h", "i2", 2, None),
    (("INTEGER4",), "MPI_INTEGER4", "i4", "i4", "i", "i4", 4, None),
    (("INTEGER8",), "MPI_INTEGER8", "i8", "i8", "l", "i8", 8, None),
    (("REAL4",), "MPI_REAL4", "f4", "f4", "f", "f4", 4, None),
    (("REAL8",), "MPI_REAL8", "f8", "f8", "d", "f8", 8, None),
    (("REAL16",), "MPI_REAL16", "g", "f16", "g", "f16", 16, "x87"),
    (("COMPLEX8",), "MPI_COMPLEX8", "c8", "c8", "F", "c8", 4, None),
    (("COMPLEX16",), "MPI_COMPLEX16", "c16", "c16", "D", "c16", 8, None),
    (("COMPLEX32",), "MPI_COMPLEX32", "G", "c32", "G", "c32", 16, "x87"),
]

#: (constant names, MPI name, value type, index type, index displacement, extent, align)
PAIRS = [
    (("SHORT_INT",), "MPI_SHORT_INT", "SHORT", "INT", 4, 8, 4),
    (("INT_INT", "TWOINT"), "MPI_2INT", "INT", "INT", 4, 8, 4),
    (("LONG_INT",), "MPI_LONG_INT", "LONG", "INT", 8, 16, 8),
    (("FLOAT_INT",), "MPI_FLOAT_INT", "FLOAT", "INT", 4, 8, 4),
    (("DOUBLE_INT",), "MPI_DOUBLE_INT", "DOUBLE", "INT", 8, 16, 8),
    (("LONG_DOUBLE_INT",), "MPI_LONG_DOUBLE_INT", "LONG_DOUBLE", "INT", 16, 32, 16),
]

#: constants that are null in mpi4py 4.1.2 on MPICH
NULL = ("LOGICAL1", "LOGICAL2", "LOGICAL4", "LOGICAL8", "LOGICAL16", "INTEGER16",
        "REAL2", "COMPLEX4", "BFLOAT16_T")

#: type code -> constant name (``Datatype.fromcode`` and buffer formats)
CODES = {
    "c": "CHAR", "S1": "CHAR", "s": "CHAR", "S": "CHAR", "a": "CHAR",
    "b": "SIGNED_CHAR", "B": "UNSIGNED_CHAR", "h": "SHORT", "H": "UNSIGNED_SHORT",
    "i": "INT", "I": "UNSIGNED", "l": "LONG", "L": "UNSIGNED_LONG",
    "q": "LONG_LONG", "Q": "UNSIGNED_LONG_LONG", "f": "FLOAT", "d": "DOUBLE",
    "g": "LONG_DOUBLE", "F": "C_FLOAT_COMPLEX", "D": "C_DOUBLE_COMPLEX",
    "G": "C_LONG_DOUBLE_COMPLEX", "Zf": "C_FLOAT_COMPLEX", "Zd": "C_DOUBLE_COMPLEX",
    "Zg": "C_LONG_DOUBLE_COMPLEX", "?": "C_BOOL", "b1": "C_BOOL", "e": "FLOAT16_T",
    "f2": "FLOAT16_T", "p": "AINT", "P": "UNSIGNED_LONG", "n": "COUNT",
    "N": "UNSIGNED_LONG", "U": "WCHAR", "U1": "WCHAR", "w": "WCHAR", "u": "UINT16_T",
    "i1": "INT8_T", "i2": "INT16_T", "i4": "INT32_T", "i8": "INT64_T",
    "u1": "UINT8_T", "u2": "UINT16_T", "u4": "UINT32_T", "u8": "UINT64_T",
    "f4": "FLOAT", "f8": "DOUBLE", "f16": "LONG_DOUBLE",
    "c8": "C_FLOAT_COMPLEX", "c16": "C_DOUBLE_COMPLEX", "c32": "C_LONG_DOUBLE_COMPLEX",
    "M": "INT64_T", "m": "INT64_T",
}

#: Match_size: (typeclass name, size) -> constant name
MATCH_SIZE = {
    ("REAL", 4): "REAL4", ("REAL", 8): "REAL8", ("REAL", 16): "REAL16",
    ("INTEGER", 1): "INTEGER1", ("INTEGER", 2): "INTEGER2", ("INTEGER", 4): "INTEGER4",
    ("INTEGER", 8): "INTEGER8",
    ("COMPLEX", 8): "COMPLEX8", ("COMPLEX", 16): "COMPLEX16", ("COMPLEX", 32): "COMPLEX32",
    ("LOGICAL", 4): "LOGICAL",
}

#: Create_f90_*: (decimal digits, exponent range) limits -> constant whose storage is used
F90_INTEGER = [(2, "INTEGER1"), (4, "INTEGER2"), (9, "INTEGER4"), (18, "INTEGER8")]
F90_REAL = [(3, 4, "FLOAT16_T"), (6, 37, "REAL4"), (15, 307, "REAL8"), (33, 4931, "REAL16")]
F90_COMPLEX = [(6, 37, "COMPLEX8"), (15, 307, "COMPLEX16"), (33, 4931, "COMPLEX32")]

#: Get_value_index: value type -> pair type (index type INT only, as MPICH)
VALUE_INDEX = {"SHORT": "SHORT_INT", "INT": "INT_INT", "LONG": "LONG_INT",
               "FLOAT": "FLOAT_INT", "DOUBLE": "DOUBLE_INT",
               "LONG_DOUBLE": "LONG_DOUBLE_INT"}


def register_elements() -> dict:
    """Register one element kind per named type; returns ``{MPI name: code}``."""
    codes = {}
    for _names, mpi_name, dtype, _code, _char, _str, align, ext32 in NAMED:
        if ext32 == "x87":
            codes[mpi_name] = register_element(mpi_name, dtype, align, None, "x87")
        else:
            codes[mpi_name] = register_element(mpi_name, dtype, align, ext32)
    return codes

"""The native data plane (native/dp/, the extension ``ucxpy._dp``): its
public types, for the layers above the core.

* :class:`Worker` — the data plane beside one core worker (``Worker.dp``:
  its counters);
* :class:`MappedKey` — a peer's region mapped into this process: put, get
  and atomics in one C call (``RemoteKey.native``);
* :class:`Symmetric` — a symmetric region's keys by PE, and the calls over
  it that OpenSHMEM's plain put, get, quiet and atomics become
  (``Symmetric.call``; shmem.accel);
* the kinds of those calls (``PUT``, ``GET``, ``QUIET``, ``FETCH_ADD``, ...).
"""
from ._dp import (ADD, AND, COMPARE_SWAP, FETCH, FETCH_ADD, FETCH_AND, FETCH_INC,  # noqa: F401
                  FETCH_OR, FETCH_XOR, GET, GET_NBI, INC, OR, PUT, PUT_NBI, QUIET, SET, SWAP,
                  XOR, MappedKey, Symmetric, SymmetricCall, Worker)

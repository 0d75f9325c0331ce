"""shmem's plain calls in the native data plane (``ucxpy.dataplane.Symmetric``).

``put``, ``get``, their ``_nbi`` forms, ``quiet`` and the integer atomics
are C callables over their Python functions, which stay the reference
implementation and serve every call the data plane does not take
(native/dp/binding.c says which:
exactly the positional arguments, whole numpy arrays of one element format,
a symmetric array on this PE's heap, an int operand, a PE whose heap is
mapped here).  The table behind them is opened when the runtime starts,
with one data-plane key per PE whose heap is mapped here (this PE's own
too), and closed when it ends; closed, or with tracing on, every call goes
to its Python function.  ``UCXPY_FASTPATH=n`` leaves it closed.
"""
from __future__ import annotations

import functools

import numpy as np

from ucxpy.dataplane import (ADD, AND, COMPARE_SWAP, FETCH, FETCH_ADD,  # noqa: F401
                             FETCH_AND, FETCH_INC, FETCH_OR, FETCH_XOR, GET, GET_NBI, INC, OR,
                             PUT, PUT_NBI, QUIET, SET, SWAP, XOR, MappedKey, Symmetric)

#: the data plane's table behind the calls (the kinds above: native/dp/binding.c)
TABLE = Symmetric()


def call(kind: int, fn):
    """``fn`` with its plain calls done by the data plane."""
    return functools.update_wrapper(TABLE.call(kind, fn), fn)


def open_table(rt) -> None:
    """Fill the table from ``rt`` (a started runtime) and enable it."""
    dp = rt.worker.dp
    if dp is None or rt.worker.tr is not None:
        return
    TABLE.open(dp, rt.heap.base, rt.heap.size, len(rt.peers), np.ndarray,
               rt.ctxs.default.pending)
    for peer in rt.peers:
        if peer.base:
            # the peer's heap as it names it (raddr), mapped here at base; CPU
            # atomics, as the Python path's on a LOCAL or MAPPED PE
            TABLE.set(peer.pe, MappedKey(dp, peer.base, peer.raddr, rt.heap.size,
                                         atomics=True, keep=peer))
    TABLE.enable(True)


def close_table() -> None:
    TABLE.close()

"""User-level failure mitigation (ULFM): revoke, failed-process queries,
agreement and shrink, on ucxpy's failure detection."""
from __future__ import annotations

from .engine import ENGINE


def _failed_wids(c):
    out = []
    for w in c.peers:
        ep = ENGINE.eps.get(w)
        if ep is not None and ep.failed is not None:
            out.append(w)
    return out


def revoke(c):
    c.revoked = True


def get_failed(c):
    from .group import Group
    return Group._of(_failed_wids(c))


def ack_failed(c, num_to_ack=None):
    failed = _failed_wids(c)
    if num_to_ack is not None:
        failed = failed[:num_to_ack]
    c.acked = frozenset(failed)
    return len(c.acked)


def agree(comm, flag):
    from .op import BAND
    return comm.allreduce(int(flag), BAND)


def iagree(comm, flag):
    from .op import BAND
    import numpy as np
    buf = np.frombuffer(memoryview(flag).cast("B"), dtype="i") if not isinstance(flag, int) \
        else None
    if buf is None:
        raise TypeError("Iagree needs a one-element integer buffer")
    from .datatype import IN_PLACE
    return comm.Iallreduce(IN_PLACE, buf, BAND)


def shrink(comm):
    return comm.Dup()

"""The pure state machines of the verbs transport (no libibverbs needed).

:mod:`ucxpy.transports.verbs` drives real queue pairs through cffi; what it
decides -- which RC queue pair transitions exist, which ``ibv_modify_qp``
attribute mask and field values each one sets, how an endpoint's
out-of-band connection (REQ / REP / RTU) advances, which QP data in those
messages is acceptable -- is plain data and functions here, re-exported by
``verbs`` and unit tested without a device.

QP transitions (:data:`QP_TRANSITIONS`, the IB spec's RC state table for the
ones we make)::

    RESET -> INIT -> RTR -> RTS,   any -> ERR,   ERR -> RESET

Endpoint connection states (:data:`OOB_STEPS`; failure and close are the
endpoint's own business)::

    state       message   next
    ACCEPTING   REQ       WAIT_RTU      (acceptor: QP to RTS, answers REP)
    REQ_SENT    REP       ESTABLISHED   (connector: QP to RTS, answers RTU)
    WAIT_RTU    RTU       ESTABLISHED   (acceptor)
    any other combination: ProtocolError
"""
from __future__ import annotations

import enum
import os
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Callable, Optional

from ..errors import ProtocolError

__all__ = ["QpState", "QP_ATTR", "QP_TRANSITIONS", "MTU_BYTES", "ACCESS_LOCAL_WRITE",
           "ACCESS_REMOTE_WRITE", "ACCESS_REMOTE_READ", "ACCESS_REMOTE_ATOMIC", "RC_ACCESS",
           "InvalidTransition", "transition_mask", "transition_params", "QueuePair",
           "CONNECTING", "REQ_SENT", "ACCEPTING", "WAIT_RTU", "ESTABLISHED", "FAILED",
           "CLOSED", "OOB_REQ", "OOB_REP", "OOB_RTU", "OOB_STEPS", "oob_step",
           "valid_qp_data"]


# ------------------------------------------------------------ QP state machine

class QpState(enum.IntEnum):
    """``enum ibv_qp_state`` (values fixed by the verbs ABI)."""

    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    SQD = 4
    SQE = 5
    ERR = 6


#: ``enum ibv_qp_attr_mask`` bits (ABI values; checked against libibverbs in the tests)
QP_ATTR = {
    "STATE": 1 << 0, "CUR_STATE": 1 << 1, "EN_SQD_ASYNC_NOTIFY": 1 << 2,
    "ACCESS_FLAGS": 1 << 3, "PKEY_INDEX": 1 << 4, "PORT": 1 << 5, "QKEY": 1 << 6,
    "AV": 1 << 7, "PATH_MTU": 1 << 8, "TIMEOUT": 1 << 9, "RETRY_CNT": 1 << 10,
    "RNR_RETRY": 1 << 11, "RQ_PSN": 1 << 12, "MAX_QP_RD_ATOMIC": 1 << 13,
    "ALT_PATH": 1 << 14, "MIN_RNR_TIMER": 1 << 15, "SQ_PSN": 1 << 16,
    "MAX_DEST_RD_ATOMIC": 1 << 17, "PATH_MIG_STATE": 1 << 18, "CAP": 1 << 19,
    "DEST_QPN": 1 << 20,
}

#: RC transitions we make: (from, to) -> attributes the modify must set
#: (the required set of the IB spec's QP state table for RC).
QP_TRANSITIONS = {
    (QpState.RESET, QpState.INIT): ("STATE", "PKEY_INDEX", "PORT", "ACCESS_FLAGS"),
    (QpState.INIT, QpState.RTR): ("STATE", "AV", "PATH_MTU", "DEST_QPN", "RQ_PSN",
                                  "MAX_DEST_RD_ATOMIC", "MIN_RNR_TIMER"),
    (QpState.RTR, QpState.RTS): ("STATE", "TIMEOUT", "RETRY_CNT", "RNR_RETRY", "SQ_PSN",
                                 "MAX_QP_RD_ATOMIC"),
}
#: any state may go to ERR (flushes outstanding work) and from there to RESET
for _s in QpState:
    QP_TRANSITIONS.setdefault((_s, QpState.ERR), ("STATE",))
QP_TRANSITIONS[(QpState.ERR, QpState.RESET)] = ("STATE",)

#: IB ``enum ibv_mtu`` value -> bytes
MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}

ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_ATOMIC = 1, 2, 4, 8
RC_ACCESS = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC


class InvalidTransition(ValueError):
    """A QP transition the RC state table does not allow."""


def transition_mask(cur: QpState, nxt: QpState) -> int:
    """``ibv_modify_qp`` attribute mask for ``cur -> nxt``; raises InvalidTransition."""
    names = QP_TRANSITIONS.get((QpState(cur), QpState(nxt)))
    if names is None:
        raise InvalidTransition(f"QP transition {QpState(cur).name} -> {QpState(nxt).name} "
                                f"is not part of the RC state machine")
    mask = 0
    for n in names:
        mask |= QP_ATTR[n]
    return mask


def transition_params(cur: QpState, nxt: QpState, local: dict, remote: Optional[dict] = None,
                      tuning: Optional[dict] = None) -> dict:
    """Field values of ``uxv_qp_params_t`` for ``cur -> nxt``.

    ``local``: port, gid_index, mtu, max_rd_atomic, psn;
    ``remote``: qpn, psn, lid, gid (bytes 16), mtu, global (bool)."""
    t = dict(timeout=14, retry_cnt=7, rnr_retry=7, min_rnr_timer=12)
    t.update(tuning or {})
    cur, nxt = QpState(cur), QpState(nxt)
    transition_mask(cur, nxt)   # validates
    p = {"qp_state": int(nxt)}
    if (cur, nxt) == (QpState.RESET, QpState.INIT):
        p.update(pkey_index=0, port=local["port"], access=RC_ACCESS)
    elif (cur, nxt) == (QpState.INIT, QpState.RTR):
        if remote is None:
            raise InvalidTransition("INIT -> RTR needs the remote QP's connection data")
        p.update(path_mtu=min(local["mtu"], remote["mtu"]), dest_qpn=remote["qpn"],
                 rq_psn=remote["psn"], max_dest_rd_atomic=local["max_rd_atomic"],
                 min_rnr_timer=t["min_rnr_timer"], dlid=remote["lid"], sl=0,
                 port=local["port"], is_global=1 if remote.get("global") else 0,
                 dgid=remote["gid"], sgid_index=local["gid_index"], hop_limit=64)
    elif (cur, nxt) == (QpState.RTR, QpState.RTS):
        p.update(timeout=t["timeout"], retry_cnt=t["retry_cnt"], rnr_retry=t["rnr_retry"],
                 sq_psn=local["psn"], max_rd_atomic=local["max_rd_atomic"])
    return p


class QueuePair:
    """An RC QP's state; ``apply(params, mask) -> rc`` performs the modify
    (``lib.uxv_qp_modify`` on a real QP, anything in tests)."""

    def __init__(self, apply: Callable[[dict, int], int]):
        self.state = QpState.RESET
        self._apply = apply

    def move(self, nxt: QpState, local: dict, remote: Optional[dict] = None) -> None:
        """Advance to ``nxt``; on failure the QP is considered in ERR and OSError raised."""
        nxt = QpState(nxt)
        mask = transition_mask(self.state, nxt)
        params = transition_params(self.state, nxt, local, remote)
        rc = self._apply(params, mask)
        if rc:
            prev, self.state = self.state, QpState.ERR
            raise OSError(rc, f"ibv_modify_qp {prev.name} -> {nxt.name}: "
                              f"{os.strerror(rc) if rc > 0 else rc}")
        self.state = nxt

    def connect(self, local: dict, remote: dict) -> None:
        """INIT -> RTR -> RTS with the peer's data (RESET -> INIT first if needed)."""
        if self.state == QpState.RESET:
            self.move(QpState.INIT, local)
        self.move(QpState.RTR, local, remote)
        self.move(QpState.RTS, local, remote)


# ------------------------------------------------------------ endpoint connection

#: endpoint states (:class:`~ucxpy.transports.verbs.VerbsEndpoint.state`)
CONNECTING, REQ_SENT, ACCEPTING, WAIT_RTU, ESTABLISHED, FAILED, CLOSED = range(7)
#: out-of-band message kinds
OOB_REQ, OOB_REP, OOB_RTU = 1, 2, 3

#: (endpoint state, message kind) -> the state the message leads to
OOB_STEPS = {
    (ACCEPTING, OOB_REQ): WAIT_RTU,
    (REQ_SENT, OOB_REP): ESTABLISHED,
    (WAIT_RTU, OOB_RTU): ESTABLISHED,
}


def oob_step(state: int, kind: int) -> int:
    """The state an endpoint in ``state`` moves to on an out-of-band message of
    ``kind``; ProtocolError for a message the state does not expect."""
    nxt = OOB_STEPS.get((state, kind))
    if nxt is None:
        raise ProtocolError(f"verbs: unexpected out-of-band message {kind} in state {state}")
    return nxt


def valid_qp_data(qpn: int, psn: int, mtu: int) -> bool:
    """Whether REQ / REP carry usable QP data: a QP number and PSN of 24 bits
    (QP 0 is never an RC queue pair) and a known ``enum ibv_mtu`` value."""
    return 0 < qpn < 1 << 24 and 0 <= psn < 1 << 24 and mtu in MTU_BYTES

"""The verbs transport's pure state machines (ucxpy/transports/verbs_qp.py,
no libibverbs needed): the RC queue pair transitions with their attribute
masks and field values, the queue pair walk, the endpoint's REQ / REP / RTU
steps and the QP data check.  The mutation suite of ucxpy.transports.verbs_qp.

Masks and field values are written out bit by bit from the IB spec's RC
state table, not computed from the module's own tables.
"""
from __future__ import annotations

import errno
import itertools
import os

import pytest

from ucxpy.errors import ProtocolError
from ucxpy.transports import verbs_qp as V
from ucxpy.transports.verbs_qp import (ACCEPTING, CLOSED, CONNECTING, ESTABLISHED, FAILED,
                                       OOB_REP, OOB_REQ, OOB_RTU, REQ_SENT, WAIT_RTU,
                                       InvalidTransition, QpState, QueuePair, oob_step,
                                       transition_mask, transition_params, valid_qp_data)

pytestmark = pytest.mark.timeout(60)

RESET, INIT, RTR, RTS, SQD, SQE, ERR = (QpState.RESET, QpState.INIT, QpState.RTR, QpState.RTS,
                                         QpState.SQD, QpState.SQE, QpState.ERR)
STATE, ACCESS, PKEY, PORT = 1, 1 << 3, 1 << 4, 1 << 5
AV, PATH_MTU, TIMEOUT, RETRY, RNR_RETRY, RQ_PSN = 1 << 7, 1 << 8, 1 << 9, 1 << 10, 1 << 11, \
    1 << 12
MAX_QP_RD, MIN_RNR, SQ_PSN, MAX_DEST_RD, DEST_QPN = 1 << 13, 1 << 15, 1 << 16, 1 << 17, 1 << 20

LOCAL = dict(port=2, gid_index=3, mtu=4, max_rd_atomic=16, psn=0x123456)
REMOTE = dict(qpn=0x4242, psn=0x654321, lid=7, gid=bytes(range(16)), mtu=3, **{"global": True})

ALLOWED = {(RESET, INIT), (INIT, RTR), (RTR, RTS), (ERR, RESET)} | {(s, ERR) for s in QpState}


def test_abi_values():
    assert [int(s) for s in QpState] == [0, 1, 2, 3, 4, 5, 6]
    assert (V.ACCESS_LOCAL_WRITE, V.ACCESS_REMOTE_WRITE, V.ACCESS_REMOTE_READ,
            V.ACCESS_REMOTE_ATOMIC, V.RC_ACCESS) == (1, 2, 4, 8, 15)
    assert V.MTU_BYTES == {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
    assert set(V.QP_TRANSITIONS) == ALLOWED


def test_masks_of_every_transition():
    assert transition_mask(RESET, INIT) == STATE | PKEY | PORT | ACCESS == 0x39
    assert transition_mask(INIT, RTR) == \
        STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD | MIN_RNR == 0x129181
    assert transition_mask(RTR, RTS) == \
        STATE | TIMEOUT | RETRY | RNR_RETRY | SQ_PSN | MAX_QP_RD == 0x12E01
    for s in QpState:
        assert transition_mask(s, ERR) == STATE
    assert transition_mask(ERR, RESET) == STATE
    assert transition_mask(1, 2) == transition_mask(INIT, RTR)         # plain ints work


def test_every_other_transition_is_refused():
    for cur, nxt in itertools.product(QpState, QpState):
        if (cur, nxt) in ALLOWED:
            continue
        with pytest.raises(InvalidTransition) as e:
            transition_mask(cur, nxt)
        assert str(e.value) == (f"QP transition {cur.name} -> {nxt.name} is not part of "
                                f"the RC state machine")
        with pytest.raises(InvalidTransition):
            transition_params(cur, nxt, LOCAL, REMOTE)
    with pytest.raises(ValueError):
        transition_mask(7, 0)                 # not a QP state at all
    assert issubclass(InvalidTransition, ValueError)


def test_params_reset_to_init():
    assert transition_params(RESET, INIT, LOCAL) == \
        dict(qp_state=1, pkey_index=0, port=2, access=15)
    assert transition_params(0, 1, dict(LOCAL, port=1)) == \
        dict(qp_state=1, pkey_index=0, port=1, access=15)


def test_params_init_to_rtr():
    assert transition_params(INIT, RTR, LOCAL, REMOTE) == dict(
        qp_state=2, path_mtu=3, dest_qpn=0x4242, rq_psn=0x654321, max_dest_rd_atomic=16,
        min_rnr_timer=12, dlid=7, sl=0, port=2, is_global=1, dgid=bytes(range(16)),
        sgid_index=3, hop_limit=64)
    # the path MTU is the smaller of both, either way round
    assert transition_params(INIT, RTR, dict(LOCAL, mtu=2), REMOTE)["path_mtu"] == 2
    assert transition_params(INIT, RTR, dict(LOCAL, mtu=5), dict(REMOTE, mtu=5))["path_mtu"] \
        == 5
    local = dict(LOCAL)
    remote = dict(REMOTE, **{"global": False})
    assert transition_params(INIT, RTR, local, remote)["is_global"] == 0
    del remote["global"]
    assert transition_params(INIT, RTR, local, remote)["is_global"] == 0
    p = transition_params(INIT, RTR, local, REMOTE, tuning=dict(min_rnr_timer=3))
    assert p["min_rnr_timer"] == 3
    with pytest.raises(InvalidTransition) as e:
        transition_params(INIT, RTR, LOCAL)
    assert str(e.value) == "INIT -> RTR needs the remote QP's connection data"
    with pytest.raises(InvalidTransition):
        transition_params(INIT, RTR, LOCAL, None)


def test_params_rtr_to_rts():
    assert transition_params(RTR, RTS, LOCAL, REMOTE) == dict(
        qp_state=3, timeout=14, retry_cnt=7, rnr_retry=7, sq_psn=0x123456, max_rd_atomic=16)
    assert transition_params(RTR, RTS, LOCAL) == transition_params(RTR, RTS, LOCAL, REMOTE)
    tuned = transition_params(RTR, RTS, LOCAL, tuning=dict(timeout=20, retry_cnt=3,
                                                           rnr_retry=1))
    assert tuned == dict(qp_state=3, timeout=20, retry_cnt=3, rnr_retry=1, sq_psn=0x123456,
                         max_rd_atomic=16)
    assert transition_params(RTR, RTS, LOCAL, tuning={}) == transition_params(RTR, RTS, LOCAL)
    assert transition_params(RTR, RTS, LOCAL, tuning=None)["timeout"] == 14


def test_params_to_err_and_back():
    for s in QpState:
        assert transition_params(s, ERR, {}) == dict(qp_state=6)
    assert transition_params(ERR, RESET, {}) == dict(qp_state=0)
    assert type(transition_params(ERR, RESET, {})["qp_state"]) is int


class Recorder:
    """A stand-in ``ibv_modify_qp``: records ``(params, mask)``, answers ``rcs``."""

    def __init__(self, rcs=None):
        self.calls = []
        self.rcs = dict(rcs or {})

    def __call__(self, params, mask):
        self.calls.append((params, mask))
        return self.rcs.get(params["qp_state"], 0)


def test_queue_pair_connects_from_reset():
    rec = Recorder()
    qp = QueuePair(rec)
    assert qp.state is RESET
    qp.connect(LOCAL, REMOTE)
    assert qp.state is RTS
    assert rec.calls == [(transition_params(RESET, INIT, LOCAL), 0x39),
                         (transition_params(INIT, RTR, LOCAL, REMOTE), 0x129181),
                         (transition_params(RTR, RTS, LOCAL, REMOTE), 0x12E01)]


def test_queue_pair_connects_from_init():
    rec = Recorder()
    qp = QueuePair(rec)
    qp.move(INIT, LOCAL)
    assert qp.state is INIT and len(rec.calls) == 1
    qp.connect(LOCAL, REMOTE)
    assert [c[0]["qp_state"] for c in rec.calls] == [1, 2, 3]
    with pytest.raises(InvalidTransition):
        qp.connect(LOCAL, REMOTE)               # RTS -> RTR is not a transition
    assert qp.state is RTS and len(rec.calls) == 3


def test_queue_pair_move_takes_ints_and_checks_first():
    rec = Recorder()
    qp = QueuePair(rec)
    qp.move(1, LOCAL)
    assert qp.state is INIT and isinstance(qp.state, QpState)
    with pytest.raises(InvalidTransition):
        qp.move(RTS, LOCAL)
    assert qp.state is INIT and len(rec.calls) == 1     # nothing applied
    qp.move(ERR, {})
    qp.move(RESET, {})
    assert qp.state is RESET and rec.calls[-2:] == [(dict(qp_state=6), 1),
                                                    (dict(qp_state=0), 1)]


@pytest.mark.parametrize("rc", [errno.EPERM, errno.EINVAL, errno.ENOMEM])
def test_queue_pair_failure_goes_to_err(rc):
    qp = QueuePair(Recorder({2: rc}))
    with pytest.raises(OSError) as e:
        qp.connect(LOCAL, REMOTE)
    assert qp.state is ERR
    assert e.value.errno == rc
    assert e.value.strerror == f"ibv_modify_qp INIT -> RTR: {os.strerror(rc)}"
    qp.move(RESET, {})                          # ERR -> RESET: the QP can be reused
    assert qp.state is RESET


def test_queue_pair_failure_with_a_negative_code():
    qp = QueuePair(Recorder({1: -5}))
    with pytest.raises(OSError) as e:
        qp.move(INIT, LOCAL)
    assert qp.state is ERR
    assert (e.value.errno, e.value.strerror) == (-5, "ibv_modify_qp RESET -> INIT: -5")


def test_oob_steps():
    states = (CONNECTING, REQ_SENT, ACCEPTING, WAIT_RTU, ESTABLISHED, FAILED, CLOSED)
    assert states == tuple(range(7))
    assert (OOB_REQ, OOB_REP, OOB_RTU) == (1, 2, 3)
    assert oob_step(ACCEPTING, OOB_REQ) == WAIT_RTU
    assert oob_step(REQ_SENT, OOB_REP) == ESTABLISHED
    assert oob_step(WAIT_RTU, OOB_RTU) == ESTABLISHED
    expected = {(ACCEPTING, OOB_REQ), (REQ_SENT, OOB_REP), (WAIT_RTU, OOB_RTU)}
    for state, kind in itertools.product(states, (0, OOB_REQ, OOB_REP, OOB_RTU, 4)):
        if (state, kind) in expected:
            continue
        with pytest.raises(ProtocolError) as e:
            oob_step(state, kind)
        assert str(e.value) == f"verbs: unexpected out-of-band message {kind} in state {state}"


def test_valid_qp_data():
    assert valid_qp_data(1, 0, 1)
    assert valid_qp_data((1 << 24) - 1, (1 << 24) - 1, 5)
    assert valid_qp_data(0x4242, 0x123456, 3)
    assert not valid_qp_data(0, 5, 3)                      # QP 0 is not an RC QP
    assert not valid_qp_data(1 << 24, 5, 3)
    assert not valid_qp_data(5, 1 << 24, 3)
    assert not valid_qp_data(5, -1, 3)
    assert not valid_qp_data(-1, 5, 3)
    for mtu in (0, 6, 256):
        assert not valid_qp_data(5, 5, mtu)
    for mtu in (1, 2, 3, 4, 5):
        assert valid_qp_data(5, 5, mtu)

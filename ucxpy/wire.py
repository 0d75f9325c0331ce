"""Frame ids and header layouts the core puts on any transport.

Every header is little-endian and fixed-size per ``AmId`` so that a receiver
can reject a malformed frame by its length alone before unpacking it.
"""
from __future__ import annotations

import enum
import struct


class AmId(enum.IntEnum):
    """Frame kinds used by the core.  User active messages start at ``USER``."""

    WIREUP = 1        # header: packed WorkerAddress of the sender
    TAG_EAGER = 2     # header: tag                          payload: message
    TAG_RTS = 3       # header: tag, sreq id, size, rkey addr, rkey len + rkey
    RNDV_RTR = 4      # header: sreq id, rreq id, range (receiver wants data frames)
    RNDV_DATA = 5     # header: rreq id, offset              payload: fragment
    RNDV_ATS = 6      # header: sreq id, status (receiver is done with sender's buffer)
    CLOSE = 7         # header: empty (peer closes gracefully)
    AM_EAGER = 8      # header: AM + user header               payload: data
    AM_RTS = 9        # header: AM_RTS + user header + rkey
    RMA_PUT = 10      # header: RMA_PUT                        payload: data
    RMA_ACK = 11      # header: RMA_ACK (put done / refused)
    RMA_GET = 12      # header: RMA_GET
    RMA_GET_REP = 13  # header: RMA_ACK                        payload: data
    RMA_AMO = 14      # header: RMA_AMO
    RMA_AMO_REP = 15  # header: RMA_AMO_REP
    RNDV_RTP = 16     # header: RTP + rkey of the receive buffer (sender puts a part)
    RNDV_FIN = 17     # header: FIN (the sender's part has landed)
    LANE_MOVE = 18    # header: empty (the sender's last frame on this connection:
                      # it goes on on the one this side opened, see Endpoint._move_to)
    PLUGIN = 19       # header: the protocol plug-in's kind byte + its own header
                      # (ucxpy.protocols: UCXPY_PROTO_PLUGIN)
    USER = 32         # first id available to active-message users


#: WIREUP's header when the sender moved to this connection from its own
#: (LANE_MOVE ends its frames there); empty otherwise
MOVED = b"M"

#: ``tag``
EAGER = struct.Struct("<Q")
#: ``tag, sreq_id, size, remote address`` followed by the remote key bytes
RTS = struct.Struct("<QQQQ")
#: ``sreq_id, rreq_id, offset, length``
RTR = struct.Struct("<QQQQ")
#: ``rreq_id, offset``
DATA = struct.Struct("<QQ")
#: ``sreq_id, rreq_id, length, receive buffer address`` followed by its key
RTP = struct.Struct("<QQQQ")
#: ``rreq_id, bytes written``
FIN = struct.Struct("<QQ")
#: ``sreq_id, status`` (0 ok, 1 truncated/dropped by receiver, 2 receiver error)
ATS = struct.Struct("<QB")

#: ``user am id, user header length``
AM = struct.Struct("<HH")
#: ``user am id, user header length, sreq_id, size, remote address``
AM_RTS = struct.Struct("<HHQQQ")

#: ``op id, mem id, remote address``
RMA_PUT = struct.Struct("<QQQ")
#: ``op id, status``
RMA_ACK = struct.Struct("<QB")
#: ``op id, mem id, remote address, length``
RMA_GET = struct.Struct("<QQQQ")
#: ``op id, mem id, remote address, opcode, size, value, compare``
RMA_AMO = struct.Struct("<QQQBBQQ")
#: ``op id, status, old value``
RMA_AMO_REP = struct.Struct("<QBQ")

ATS_OK = 0
ATS_DROPPED = 1
ATS_ERROR = 2
#: the send ids of rendezvous a C caller (libucp) offered through the data
#: plane (native/dp/rndv.c): the core's own ids never have this bit
RNDV_EXT_ID = 1 << 63

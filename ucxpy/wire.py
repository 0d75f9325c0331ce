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
    RNDV_RTR = 4      # header: sreq id, rreq id (receiver wants data frames)
    RNDV_DATA = 5     # header: rreq id, offset              payload: fragment
    RNDV_ATS = 6      # header: sreq id, status (receiver is done with sender's buffer)
    CLOSE = 7         # header: empty (peer closes gracefully)
    AM_EAGER = 8      # header: AM + user header               payload: data
    AM_RTS = 9        # header: AM_RTS + user header + rkey
    USER = 32         # first id available to active-message users


#: ``tag``
EAGER = struct.Struct("<Q")
#: ``tag, sreq_id, size, remote address`` followed by the remote key bytes
RTS = struct.Struct("<QQQQ")
#: ``sreq_id, rreq_id``
RTR = struct.Struct("<QQ")
#: ``rreq_id, offset``
DATA = struct.Struct("<QQ")
#: ``sreq_id, status`` (0 ok, 1 truncated/dropped by receiver, 2 receiver error)
ATS = struct.Struct("<QB")

#: ``user am id, user header length``
AM = struct.Struct("<HH")
#: ``user am id, user header length, sreq_id, size, remote address``
AM_RTS = struct.Struct("<HHQQQ")

ATS_OK = 0
ATS_DROPPED = 1
ATS_ERROR = 2

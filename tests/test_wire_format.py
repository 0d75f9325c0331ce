"""The core's wire format is a contract between processes (and versions):
frame ids and every header layout are pinned here byte for byte, so a
change to ucxpy/wire.py is a deliberate, visible protocol change."""
from __future__ import annotations

import struct

import pytest

from ucxpy import wire

IDS = {"WIREUP": 1, "TAG_EAGER": 2, "TAG_RTS": 3, "RNDV_RTR": 4, "RNDV_DATA": 5,
       "RNDV_ATS": 6, "CLOSE": 7, "AM_EAGER": 8, "AM_RTS": 9, "RMA_PUT": 10, "RMA_ACK": 11,
       "RMA_GET": 12, "RMA_GET_REP": 13, "RMA_AMO": 14, "RMA_AMO_REP": 15, "RNDV_RTP": 16,
       "RNDV_FIN": 17, "LANE_MOVE": 18, "PLUGIN": 19, "USER": 32}


def test_moved_wireup_header_is_pinned():
    assert wire.MOVED == b"M"      # WIREUP's header after a LANE_MOVE; empty otherwise


def test_frame_ids_are_pinned_and_distinct():
    assert {m.name: int(m) for m in wire.AmId} == IDS
    assert len(set(IDS.values())) == len(IDS)
    assert max(v for k, v in IDS.items() if k != "USER") < wire.AmId.USER


#: (struct, fields, expected bytes): little-endian, no padding
LAYOUTS = [
    ("EAGER", (0x0102030405060708,), bytes.fromhex("0807060504030201")),
    ("RTS", (1, 2, 3, 4), b"".join(i.to_bytes(8, "little") for i in (1, 2, 3, 4))),
    ("RTR", (5, 6, 7, 8), b"".join(i.to_bytes(8, "little") for i in (5, 6, 7, 8))),
    ("DATA", (9, 10), (9).to_bytes(8, "little") + (10).to_bytes(8, "little")),
    ("RTP", (1, 2, 3, 4), b"".join(i.to_bytes(8, "little") for i in (1, 2, 3, 4))),
    ("FIN", (11, 12), (11).to_bytes(8, "little") + (12).to_bytes(8, "little")),
    ("ATS", (13, 2), (13).to_bytes(8, "little") + b"\x02"),
    ("AM", (0x1234, 0x0506), bytes.fromhex("34120605")),
    ("AM_RTS", (1, 2, 3, 4, 5), bytes.fromhex("01000200") +
     b"".join(i.to_bytes(8, "little") for i in (3, 4, 5))),
    ("RMA_PUT", (1, 2, 3), b"".join(i.to_bytes(8, "little") for i in (1, 2, 3))),
    ("RMA_ACK", (7, 1), (7).to_bytes(8, "little") + b"\x01"),
    ("RMA_GET", (1, 2, 3, 4), b"".join(i.to_bytes(8, "little") for i in (1, 2, 3, 4))),
    ("RMA_AMO", (1, 2, 3, 4, 8, 5, 6), b"".join(i.to_bytes(8, "little") for i in (1, 2, 3)) +
     b"\x04\x08" + (5).to_bytes(8, "little") + (6).to_bytes(8, "little")),
    ("RMA_AMO_REP", (1, 0, 9), (1).to_bytes(8, "little") + b"\x00" + (9).to_bytes(8, "little")),
]


@pytest.mark.parametrize("name,fields,expect", LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_header_layouts_are_pinned(name, fields, expect):
    s = getattr(wire, name)
    assert isinstance(s, struct.Struct)
    assert s.pack(*fields) == expect
    assert s.size == len(expect)
    assert s.unpack(expect) == fields


def test_every_header_struct_is_covered():
    structs = {k for k, v in vars(wire).items() if isinstance(v, struct.Struct)}
    assert structs == {x[0] for x in LAYOUTS}


def test_ats_status_codes():
    assert (wire.ATS_OK, wire.ATS_DROPPED, wire.ATS_ERROR) == (0, 1, 2)

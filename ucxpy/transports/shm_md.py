"""The shm transport's memory domain: shared segments, a registration
table, and cross-memory attach (CMA) for registered user memory.

What a peer on this host gets from a key this domain packed
(:meth:`ShmMemoryDomain.rkey_unpack`):

==============================  ===============================================
region                          access
==============================  ===============================================
``mem_alloc`` segment           mapped here (``address``): loads, stores and
(``ucxpy-rm-<pid>-<token>-<n>``)  CPU atomics straight into the owner's memory
user memory (``mem_reg``), CMA  ``transport_key`` for ShmEndpoint.get / put:
permitted, another process      process_vm_readv / writev, one copy
anything else (another host,    None: the core falls back to active messages
the same process, no CMA)
==============================  ===============================================

Validity: the domain keeps a registration table in shared memory
(``ucxpy-rt-<pid>-<token>``, one 64-bit word per registration holding its
registration id while registered, 0 after ``mem_dereg``).  Peers map the
table and check the word before each access (:meth:`ShmRemoteKey.valid`),
so a stale key after unregistration raises instead of writing into freed
or reused memory.  A key packed when the table was full has slot 0 and is
not checked.

Packed key (little-endian): ``KEY`` = magic b"SHMD", pid, table slot,
registration id, lengths of the table name, segment name and host id, then
those three (names ascii; the segment name empty for user memory).
Unpacking refuses names that are not this domain's (they are opened under
/dev/shm) and slots past the table.

Segments of killed processes are reaped (their pid is in the name) when a
table is created.
"""
from __future__ import annotations

import errno
import itertools
import os
import re
import secrets
import struct
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from .. import shmfile
from .._native import ffi, lib
from ..errors import RemoteAccessError
from ..netaddr import host_id as local_host_id
from .base import MdCaps, MdRemoteKey, MemoryDomain

TABLE_SLOTS = 4096
KEY = struct.Struct("<4sIIQBBB")
KEY_MAGIC = b"SHMD"
TABLE_NAME = re.compile(r"\Aucxpy-rt-[0-9]+-[0-9a-f]+\Z")
SEG_NAME = re.compile(r"\Aucxpy-rm-[0-9]+-[0-9a-f]+-[0-9]+\Z")
#: names this domain reaps when their process is gone
STALE_NAMES = re.compile(r"\Aucxpy-r[tm]-([0-9]+)-")
#: transport key of ShmEndpoint.get / put (CMA): magic, pid, base, length
RKEY = struct.Struct("<4sIQQ")
RKEY_MAGIC = b"SHMK"


class Segment:
    """A named shared-memory file mapped into this process."""

    def __init__(self, name: str, length: int, create: bool):
        if create:                  # sparse: a heap's pages are used as touched
            self.map = shmfile.create(name, length)
        else:
            try:
                self.map = shmfile.open_private(name, length)
            except OSError as e:
                if e.errno == errno.EINVAL:
                    raise RemoteAccessError(f"shared segment {name} is smaller than its key "
                                            f"says") from None
                raise
        self.name = name
        self.path = os.path.join(shmfile.SHM_DIR, name)
        self.length = length
        self.view = memoryview(self.map)      # keeps the mapping open
        with ffi.from_buffer(self.view) as p:
            self.address = int(ffi.cast("uintptr_t", p))
        self.fixed = 0              # mapped again there (mem_alloc's address), until mem_free

    def unlink(self) -> None:
        shmfile.unlink_quiet(self.path)


class _Reg:
    __slots__ = ("reg_id", "slot", "alloc")

    def __init__(self, reg_id: int, slot: int, alloc):
        self.reg_id = reg_id
        self.slot = slot
        self.alloc = alloc


class ShmRemoteKey(MdRemoteKey):
    """A key unpacked on this host: ``table_word`` is the address (here) of
    the region's registration-table word, 0 when it has none."""

    __slots__ = ("table_word", "reg_id")

    def __init__(self, address, transport_key, keep, table_word: int, reg_id: int):
        MdRemoteKey.__init__(self, address, transport_key, keep)
        self.table_word = table_word
        self.reg_id = reg_id

    def valid(self) -> bool:
        return not self.table_word or \
            lib.ucxpy_atomic_load64(ffi.cast("void *", self.table_word)) == self.reg_id

    def guard(self) -> tuple:
        return (self.table_word, self.reg_id) if self.table_word else (0, 0)


def parse_key(packed: bytes) -> tuple:
    """``(pid, slot, reg id, table name, segment name, host id)`` of a packed
    key, or RemoteAccessError."""
    packed = bytes(packed)
    try:
        magic, pid, slot, reg_id, tlen, slen, hlen = KEY.unpack_from(packed)
    except struct.error:
        raise RemoteAccessError("malformed shm memory key (too short)") from None
    off = KEY.size
    if magic != KEY_MAGIC or len(packed) != off + tlen + slen + hlen:
        raise RemoteAccessError("malformed shm memory key")
    table = packed[off:off + tlen].decode("ascii", "replace")
    seg = packed[off + tlen:off + tlen + slen].decode("ascii", "replace")
    host = packed[off + tlen + slen:]
    # the names are opened under /dev/shm and the slot indexes the table
    if not TABLE_NAME.match(table) or (seg and not SEG_NAME.match(seg)) or slot >= TABLE_SLOTS:
        raise RemoteAccessError("malformed shm memory key (segment name or slot)")
    return pid, slot, reg_id, table, seg, host


class ShmMemoryDomain(MemoryDomain):
    """Memory of one shm interface (see the module docstring)."""

    access = "cma"

    def __init__(self, name: str, cma: bool):
        self.name = name
        self.caps = MdCaps.ALLOC | MdCaps.REG | MdCaps.RKEY_PTR
        if cma:
            self.caps |= MdCaps.PUT | MdCaps.GET
        self.pid = os.getpid()
        self._token = secrets.token_hex(8)
        self._host = local_host_id()
        self._table: Optional[Segment] = None
        self._free_slots: list = []
        self._reg_ids = itertools.count(1)
        self._seg_ids = itertools.count(1)
        self._own: dict = {}          # segment name -> Segment we allocated
        self._peers: dict = {}        # segment name -> Segment of a peer, mapped here
        self._closed = False

    # -- local memory ------------------------------------------------------------
    def mem_alloc(self, length: int, address: int = 0) -> Segment:
        if address:
            length = shmfile.page_round(length)
        seg = Segment(f"ucxpy-rm-{self.pid}-{self._token}-{next(self._seg_ids)}",
                      length, create=True)
        if address:
            # the segment's pages again at exactly `address` (a free range:
            # shmfile refuses one in use), the region's address from now on
            try:
                shmfile.alias_fixed(seg.address, length, address)
            except BaseException:
                seg.unlink()
                raise
            seg.fixed = seg.address = address
        self._own[seg.name] = seg
        return seg

    def mem_free(self, alloc: Segment) -> None:
        if self._own.pop(alloc.name, None) is not None:
            alloc.unlink()
        if alloc.fixed:
            shmfile.unmap_fixed(alloc.fixed, alloc.length)
            alloc.fixed = 0

    def _table_word(self, slot: int):
        return ffi.cast("void *", self._table.address + slot * 8)

    def mem_reg(self, view, alloc=None) -> _Reg:
        if self._closed:
            raise RemoteAccessError("the shm memory domain is closed")
        if self._table is None:
            shmfile.reap_dead(STALE_NAMES)
            self._table = Segment(f"ucxpy-rt-{self.pid}-{self._token}", TABLE_SLOTS * 8,
                                  create=True)
            self._free_slots = list(range(TABLE_SLOTS - 1, 0, -1))
        reg = _Reg(next(self._reg_ids), self._free_slots.pop() if self._free_slots else 0,
                   alloc if alloc is not None and alloc.name in self._own else None)
        if reg.slot:
            lib.ucxpy_atomic_store64(self._table_word(reg.slot), reg.reg_id)
        return reg

    def mem_dereg(self, reg: _Reg) -> None:
        if reg.slot and self._table is not None:
            lib.ucxpy_atomic_store64(self._table_word(reg.slot), 0)
            self._free_slots.append(reg.slot)
        reg.slot = 0

    def rkey_pack(self, reg: _Reg) -> bytes:
        table = self._table.name.encode()
        seg = reg.alloc.name.encode() if reg.alloc is not None else b""
        return KEY.pack(KEY_MAGIC, self.pid, reg.slot, reg.reg_id, len(table), len(seg),
                        len(self._host)) + table + seg + self._host

    # -- peers' memory -----------------------------------------------------------
    def _segment(self, name: str, length: int) -> Segment:
        """``name`` mapped here (cached), at least ``length`` bytes long."""
        seg = self._peers.get(name) or self._own.get(name)
        if seg is None:
            if self._table is not None and name == self._table.name:
                seg = self._table
            else:
                seg = Segment(name, length, create=False)
            self._peers[name] = seg
        if seg.length < length:
            raise RemoteAccessError(f"shared segment {name} is smaller than its key says")
        return seg

    def rkey_unpack(self, packed, base: int, length: int) -> Optional[ShmRemoteKey]:
        pid, slot, reg_id, table, seg_name, host = parse_key(packed)
        if host != self._host:
            return None
        try:
            tab = self._segment(table, TABLE_SLOTS * 8)
        except (OSError, RemoteAccessError):
            return None                 # another /dev/shm, or not ours to map
        word = tab.address + slot * 8 if slot else 0
        if seg_name:
            try:
                seg = self._segment(seg_name, length)
            except OSError:
                raise RemoteAccessError(f"stale remote key: segment {seg_name} is gone") from None
            # the key keeps both mappings: its address and its table word
            return ShmRemoteKey(seg.address, None, (seg, tab), word, reg_id)
        if pid != self.pid and self.caps & MdCaps.GET:
            return ShmRemoteKey(0, RKEY.pack(RKEY_MAGIC, pid, base, length), tab, word, reg_id)
        return None

    def rkey_map(self, packed, length: int) -> Optional[memoryview]:
        try:
            _pid, _slot, _id, _table, seg_name, host = parse_key(packed)
            if not seg_name or host != self._host:
                return None
            return Segment(seg_name, length, create=False).view
        except (OSError, RemoteAccessError):
            return None

    def close(self) -> None:
        self._closed = True
        for seg in list(self._own.values()):
            seg.unlink()
        self._own.clear()
        if self._table is not None:
            self._table.unlink()
        self._peers.clear()

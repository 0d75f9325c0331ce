"""The ofi transport's memory domain: ``fi_mr_reg`` registrations.

A registration lives exactly as long as the buffer view it describes (see
:class:`~ucxpy.transports.base.ViewRegistrations`); keys are random and unguessable by peers, and
never reused while registered.  The bounce buffers of the interface are
registered here too (:meth:`OfiMemoryDomain.register_raw`), for local
access only: no peer may read or write them.

Remote key (``pack_rkey``): magic b"OFK1", owner interface uuid, MR key,
base address, length, flags (1: the provider addresses by virtual address,
else by offset).  The endpoint's get/put check the key against the
region before posting ``fi_read`` / ``fi_write``.
"""
from __future__ import annotations

import collections
import secrets
import struct

from ..errors import RemoteAccessError, TransportUnavailable
from .base import RegistrationDomain, ViewRegistrations

try:
    from .._ofi import ffi, lib
except ImportError:  # built only where libfabric's headers exist
    ffi = lib = None

_RKEY = struct.Struct("<4sQQQQB")
_RKEY_MAGIC = b"OFK1"
_RK_VIRT = 1


def pack_rkey(uuid: int, key: int, base: int, length: int, virt: bool) -> bytes:
    return _RKEY.pack(_RKEY_MAGIC, uuid, key, base, length, _RK_VIRT if virt else 0)


def unpack_rkey(data) -> tuple:
    """-> (owner uuid, MR key, base, length, virtual addressing); RemoteAccessError if bad."""
    try:
        magic, uuid, key, base, length, flags = _RKEY.unpack(bytes(data))
    except struct.error:
        raise RemoteAccessError("malformed ofi remote key") from None
    if magic != _RKEY_MAGIC:
        raise RemoteAccessError("not an ofi remote key")
    return uuid, key, base, length, bool(flags & _RK_VIRT)


def _errstr(rc: int) -> str:
    return ffi.string(lib.uxofi_strerror(rc)).decode(errors="replace")


class _Registration:
    __slots__ = ("mr", "key", "desc", "address", "length")


class OfiMemoryDomain(RegistrationDomain):
    """Registrations with one interface's libfabric domain (``iface._h``).
    ``key_limit``: the provider's MR key size; ``mr_local``: local buffers
    need descriptors too (FI_MR_LOCAL); ``virt_addr``: peers address by
    virtual address (FI_MR_VIRT_ADDR); ``pinned``: how many wrapped views of
    non-memoryview buffers stay registered (UCXPY_OFI_PINNED)."""

    def __init__(self, iface, key_limit: int, mr_local: bool, virt_addr: bool, pinned: int):
        super().__init__(iface)
        self.key_limit = key_limit
        self.mr_local = mr_local
        self.virt_addr = virt_addr
        self._keys = set()            # keys in use
        self.mrs = []                 # the bounce buffers' registrations
        #: registrations of peers' RMA and rendezvous buffers, by view
        self.regs = ViewRegistrations(self.register, self.deregister)
        self._pinned = collections.deque(maxlen=max(pinned, 1))

    def _next_key(self) -> int:
        """A random key no registration of ours uses: unguessable by peers."""
        while True:
            key = secrets.randbits(64) & self.key_limit
            if key and key not in self._keys:
                self._keys.add(key)
                return key

    def register_raw(self, ptr, length: int):
        """Register a bounce buffer for local access; returns its descriptor."""
        mr = ffi.new("struct fid_mr **")
        key = ffi.new("uint64_t *")
        desc = ffi.new("void **")
        # bounce buffers: local access only, no peer may read or write them
        access = lib.FI_SEND | lib.FI_RECV | lib.FI_READ | lib.FI_WRITE
        rc = lib.uxofi_mr_reg(self.iface._h, ptr, length, access, self._next_key(), mr, key,
                              desc)
        if rc:
            raise TransportUnavailable(f"ofi: fi_mr_reg of {length} bytes: {_errstr(rc)}")
        self.mrs.append(mr[0])
        return desc[0]

    def register(self, view: memoryview) -> _Registration:
        """Register ``view`` for peers' reads and writes (and local use)."""
        reg = _Registration()
        mr = ffi.new("struct fid_mr **")
        key = ffi.new("uint64_t *")
        desc = ffi.new("void **")
        access = (lib.FI_SEND | lib.FI_RECV | lib.FI_READ | lib.FI_WRITE
                  | lib.FI_REMOTE_READ | lib.FI_REMOTE_WRITE)
        with ffi.from_buffer(view) as p:
            address = int(ffi.cast("uintptr_t", p))
            rc = lib.uxofi_mr_reg(self.iface._h, p, view.nbytes, access, self._next_key(),
                                  mr, key, desc)
        if rc:
            raise RemoteAccessError(f"ofi: fi_mr_reg of {view.nbytes} bytes: {_errstr(rc)}")
        reg.mr, reg.key, reg.desc = mr[0], int(key[0]), desc[0] if self.mr_local else ffi.NULL
        reg.address, reg.length = address, view.nbytes
        return reg

    def deregister(self, reg: _Registration) -> None:
        if reg.mr is not None and self.iface._h is not None:
            lib.uxofi_mr_close(reg.mr)
            self._keys.discard(reg.key)
        reg.mr = None

    def pack_local_key(self, buf) -> tuple:
        """Register ``buf`` for as long as this view of it lives and describe
        it for a peer's get/put: ``(address, remote key)``.

        The core passes the memoryview it keeps until the transfer is
        acknowledged.  Other buffers are wrapped in a view that stays pinned
        among the last ``UCXPY_OFI_PINNED`` (64) such registrations."""
        mv = buf if type(buf) is memoryview else memoryview(buf)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        if mv is not buf:
            self._pinned.append(mv)
        uuid = self.iface.uuid
        if mv.nbytes == 0:
            return 0, pack_rkey(uuid, 0, 0, 0, self.virt_addr)
        reg = self.regs.for_view(mv)
        return reg.address, pack_rkey(uuid, reg.key, reg.address, reg.length, self.virt_addr)

    def release(self) -> None:
        """Close every registration of user memory (the interface closes)."""
        self._pinned.clear()
        self.regs.clear()

    def close_bounce(self) -> None:
        """Close the bounce buffers' registrations (before their domain)."""
        for mr in self.mrs:
            lib.uxofi_mr_close(mr)
        self.mrs = []

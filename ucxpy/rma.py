"""RMA and atomics on registered memory (UCX's ucp_mem_map / ucp_put / ucp_atomic).

Theory of operation
-------------------
``Worker.mem_map()`` registers memory and returns a :class:`MemHandle`; its
``pack_rkey()`` bytes travel to peers, which turn them into a
:class:`RemoteKey` with ``Endpoint.unpack_rkey()``.  Each remote key picks one
access mode when unpacked, from the endpoint's lane:

=========  ======================================  ==============================
mode       when                                    put / get / atomics
=========  ======================================  ==============================
RDMA       lane reads and writes registered        fi_write / fi_read (ofi),
           memory by itself (ofi, verbs); the      RDMA WRITE / READ (verbs);
           key carries the lane's registration     atomics as in AM mode
MAPPED     lane is shm and the memory was          memcpy into the peer's shared
           allocated by ``mem_map(length=n)``      segment; native C11 atomics
CMA        lane is shm, user buffer registered,    process_vm_writev/readv;
           cross-memory attach permitted           atomics as in AM mode
AM         anything else (tcp, other hosts)        frames served by the target's
                                                   progress (see below)
=========  ======================================  ==============================

In AM mode the *target must progress* (call any blocking ucxpy function, or
``worker.progress()``, or start the worker's progress thread with
``UCXPY_PROGRESS_THREAD=y`` / ``Worker.start_progress_thread()``).  Puts
complete when the target acknowledged them, so a completed put is visible at
the target.  Atomics are applied by the target with the same native atomics
as MAPPED mode, so both modes may hit one word concurrently.

Validity: each worker keeps a registration table in shared memory (one
64-bit slot per registration holding its memory id, 0 when unmapped).
MAPPED and CMA accesses check the slot first, and the AM target checks its
registry, so a stale key after ``unmap()`` raises :class:`RemoteAccessError`
instead of writing into freed memory.  Every access is range-checked against
the key; atomics must be naturally aligned.

Ordering: operations on one endpoint in AM mode are executed in issue order.
``Endpoint.fence()`` orders operations issued before it ahead of those after
it also across modes (it waits for outstanding AM operations);
``Endpoint.flush()`` / ``Worker.flush()`` wait until all are complete.
"""
from __future__ import annotations

import errno
import glob
import itertools
import os
from typing import Optional

from . import shmfile, wire
from .atomics import MASK as _MASK, OPS as ATOMIC_OPS, POST_OPS  # noqa: F401 (re-exported)
from .atomics import address_of as buffer_address, apply as apply_atomic
from .buffers import COMPLETED, recv_view, send_view
from .errors import RemoteAccessError
from .request import Request
from .shmfile import SHM_DIR
from .rkey import ALIGN, BADOP, OK, RANGE, STALE, TABLE_SLOTS, RegionKey, resolve
from .rkey import HEADER as _RKEY  # noqa: F401 (tests build keys with it)
from .rkey import pack as _pack_rkey
from .rkey import pack_transport_keys as _pack_transport_keys
from .rkey import unpack_transport_keys as _unpack_transport_keys  # noqa: F401
from .transports.base import Caps
from .transports.liveness import pid_alive

try:
    from ._native import ffi, lib
except ImportError:  # pragma: no cover - the module is built at install time
    ffi = lib = None

AmId = wire.AmId

#: atomic opcodes (wire values); post = add/and/or/xor, fetch = all

_STATUS = {STALE: "stale or unknown remote key", RANGE: "access outside the registered region",
           ALIGN: "misaligned atomic", BADOP: "bad atomic operation"}

MAPPED, CMA, RDMA, AM = "mapped", "cma", "rdma", "am"
#: a lane that moves registered memory by itself (RDMA) serves RMA directly
RDMA_CAPS = Caps.GET_ZCOPY | Caps.PUT_ZCOPY
#: a lane whose registrations peers read and write one-sidedly (RDMA)
REG_CAPS = RDMA_CAPS | Caps.MEM_REG


def _reap_stale_segments() -> None:
    """Unlink segments left by killed processes (their pid is in the name)."""
    for path in glob.glob(os.path.join(SHM_DIR, "ucxpy-r[tm]-*")):
        try:
            pid = int(os.path.basename(path).split("-")[2])
        except (IndexError, ValueError):
            continue
        if not pid_alive(pid):
            try:
                os.unlink(path)
            except OSError:
                pass


class _Segment:
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
        self.path = os.path.join(SHM_DIR, name)
        self.length = length
        self.view = memoryview(self.map)      # keeps the mapping open
        self.address = buffer_address(self.view)

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


class MemHandle:
    """Registered memory (``ucp_mem_h``).  ``buf`` is a writable byte view,
    ``address`` its base address as peers name it."""

    def __init__(self, rma, mem_id: int, view: memoryview, address: int, segment=None):
        self.rma = rma
        self.mem_id = mem_id
        self.buf = view
        self.address = address
        self.length = view.nbytes
        self.segment = segment
        self.slot = -1
        self._tl_keys = None
        self._rdma_view = None
        self.mapped = True

    def __repr__(self) -> str:
        kind = "shared" if self.segment else "user"
        return f"<MemHandle {self.mem_id} {kind} {self.length} B at {self.address:#x}>"

    def pack_rkey(self) -> bytes:
        """Remote key bytes for peers (``ucp_rkey_pack``)."""
        if not self.mapped:
            raise RemoteAccessError("memory handle is unmapped")
        w = self.rma.worker
        table = self.rma.table.name.encode() if self.rma.table else b""
        seg = self.segment.name.encode() if self.segment else b""
        return _pack_rkey(w.uuid, self.mem_id, self.address, self.length, os.getpid(),
                          self.slot, table, seg, w.address.host_id, self._transport_keys())

    def _transport_keys(self) -> bytes:
        """The region registered with every interface that reads and writes
        one-sidedly by itself (RDMA: ofi, verbs), so peers on those lanes
        put/get directly (format: :func:`ucxpy.rkey.pack_transport_keys`).
        Registered once, through a view of our own: the transports tie a
        registration to the view it was made for, so dropping that view in
        ``unmap`` revokes the key."""
        if self._tl_keys is None:
            keys = []
            for iface in self.rma.worker.ifaces:
                if iface.attrs.caps & REG_CAPS == REG_CAPS and self.length:
                    if self._rdma_view is None:
                        self._rdma_view = self.buf[:]
                    _addr, key = iface.pack_local_key(self._rdma_view)
                    keys.append((iface.name.encode(), bytes(key)))
            self._tl_keys = _pack_transport_keys(keys)
        return self._tl_keys

    def unmap(self) -> None:
        """Unregister (idempotent); later remote accesses raise RemoteAccessError."""
        if self.mapped:
            self.mapped = False
            lock = self.rma.worker.lock
            if lock is None:
                self.rma.unregister(self)
            else:
                with lock:
                    self.rma.unregister(self)


class RemoteKey(RegionKey):
    """A peer's registered region as seen through one endpoint: the fields of
    its packed key (:class:`ucxpy.rkey.RegionKey`, whose ``check`` range-checks
    every access) and the access mode picked for the endpoint's lane."""

    __slots__ = ("ep", "mode", "_local_base")

    def __init__(self, ep, packed):
        RegionKey.__init__(self, packed)
        if self.uuid != ep.remote.uuid:
            raise RemoteAccessError(f"remote key belongs to another worker than {ep!r}")
        self.ep = ep
        self._local_base = 0
        self.mode = ep.worker.rma.access_mode(ep, self)

    def __repr__(self) -> str:
        return f"<RemoteKey mem {self.mem_id} [{self.base:#x}+{self.length}] {self.mode}>"

    @property
    def mapped_address(self) -> int:
        """Address of the region's first byte as mapped into this process
        (MAPPED mode; 0 otherwise), for layers that load/store peer memory
        directly, e.g. OpenSHMEM's symmetric heap and ``shmem_ptr``."""
        return self._local_base if self.mode == MAPPED else 0

    def map(self) -> Optional[memoryview]:
        """The region mapped into this process when it lives in a shared
        segment on this host, whatever the lane (UCX's ``rkey_ptr``): a
        writable view of all of it (the mapping lasts as long as the view),
        or None where it cannot be mapped (another host, a registered user
        buffer, no /dev/shm).  Loads and stores through it bypass the lane:
        the caller orders them (MPI's ``Win.Sync`` and barriers)."""
        if not self.segment or self.host_id != self.ep.worker.address.host_id:
            return None
        try:
            return _Segment(self.segment, self.length, create=False).view
        except (OSError, RemoteAccessError):
            return None


class _Op:
    __slots__ = ("ep", "req", "dest")

    def __init__(self, ep, req, dest=None):
        self.ep = ep
        self.req = req
        self.dest = dest


class RmaEngine:
    """Registrations, peer mappings and outstanding operations of one worker."""

    def __init__(self, worker):
        self.worker = worker
        self.registry = {}            # mem id -> MemHandle
        self.ops = {}                 # op id -> _Op (AM mode, awaiting a reply)
        self.table = None             # our registration table (_Segment)
        self._free_slots = []
        self._ids = itertools.count(1)
        self._op_ids = itertools.count(1)
        self._peer_segments = {}      # segment name -> _Segment (peers' memory / tables)
        self.handlers = {AmId.RMA_PUT: self.on_put, AmId.RMA_ACK: self.on_ack,
                         AmId.RMA_GET: self.on_get, AmId.RMA_GET_REP: self.on_get_rep,
                         AmId.RMA_AMO: self.on_amo, AmId.RMA_AMO_REP: self.on_amo_rep}

    # -- registration --------------------------------------------------------
    def _shared_ok(self) -> bool:
        return lib is not None and os.access(SHM_DIR, os.W_OK) and \
            any(i.attrs.caps & Caps.MEM_MAP for i in self.worker.ifaces)

    def _ensure_table(self) -> None:
        if self.table is not None or not self._shared_ok():
            return
        _reap_stale_segments()
        name = f"ucxpy-rt-{os.getpid()}-{self.worker.uuid:x}"
        self.table = _Segment(name, TABLE_SLOTS * 8, create=True)
        self._free_slots = list(range(TABLE_SLOTS - 1, 0, -1))

    def mem_map(self, buf=None, length: int = 0, shared: bool = False) -> MemHandle:
        if buf is None and length <= 0:
            raise ValueError("mem_map needs a buffer or a length > 0")
        if buf is not None and length:
            raise ValueError("mem_map takes a buffer or a length, not both")
        mem_id = next(self._ids)
        self._ensure_table()
        if buf is None:
            if self.table is not None or shared and lib is not None \
                    and os.access(SHM_DIR, os.W_OK):
                seg = _Segment(f"ucxpy-rm-{os.getpid()}-{self.worker.uuid:x}-{mem_id}",
                               length, create=True)
                mh = MemHandle(self, mem_id, seg.view, seg.address, seg)
            else:
                mem = bytearray(length)
                mh = self._wrap(mem_id, mem)
        else:
            mh = self._wrap(mem_id, buf)
        if self.table is not None and self._free_slots:
            mh.slot = self._free_slots.pop()
            lib.ucxpy_atomic_store64(ffi.cast("void *", self.table.address + mh.slot * 8), mem_id)
        self.registry[mem_id] = mh
        return mh

    def _wrap(self, mem_id, buf) -> MemHandle:
        view = recv_view(buf)       # the view pins the buffer: it cannot move or shrink
        return MemHandle(self, mem_id, view, buffer_address(view))

    def unregister(self, mh: MemHandle) -> None:
        self.registry.pop(mh.mem_id, None)
        mh._rdma_view = None        # revokes the RDMA registrations made for it
        if mh.slot > 0 and self.table is not None:
            lib.ucxpy_atomic_store64(ffi.cast("void *", self.table.address + mh.slot * 8), 0)
            self._free_slots.append(mh.slot)
        if mh.segment is not None:
            mh.segment.unlink()

    def close(self) -> None:
        for mh in list(self.registry.values()):
            mh.unmap()
        if self.table is not None:
            self.table.unlink()
        self._peer_segments.clear()

    # -- access mode -----------------------------------------------------------
    def access_mode(self, ep, rkey: RemoteKey) -> str:
        ep.transport_endpoint()
        if ep.lane.name in rkey.tl_keys and ep.lane.attrs.caps & REG_CAPS == REG_CAPS:
            return RDMA
        same_host = (ep.lane.attrs.caps & (Caps.MEM_MAP | Caps.LOOPBACK) and lib is not None
                     and rkey.host_id == self.worker.address.host_id and rkey.table)
        if not same_host:
            return AM
        try:
            tab = self._peer_segment(rkey.table, TABLE_SLOTS * 8)
        except (OSError, RemoteAccessError):
            return AM
        rkey._table_addr = tab.address + rkey.slot * 8
        if rkey.segment:
            try:
                seg = self._peer_segment(rkey.segment, rkey.length)
            except OSError:
                raise RemoteAccessError(f"stale remote key: segment {rkey.segment} is gone") from None
            rkey._local_base = seg.address
            return MAPPED
        if rkey.pid != os.getpid() and ep.lane.attrs.caps & Caps.GET_ZCOPY:
            return CMA
        return AM

    def _peer_segment(self, name: str, length: int) -> _Segment:
        seg = self._peer_segments.get(name)
        if seg is None:
            if self.table is not None and name == self.table.name:
                seg = self.table
            else:
                own = next((m.segment for m in self.registry.values()
                            if m.segment is not None and m.segment.name == name), None)
                seg = own or _Segment(name, length, create=False)
            self._peer_segments[name] = seg
        return seg

    # -- initiator -------------------------------------------------------------
    def _post(self, ep, am_id, header_fn, payload=b"", dest=None) -> Request:
        req = Request(self.worker)
        op_id = next(self._op_ids)
        self.ops[op_id] = _Op(ep, req, dest)
        try:
            ep.send_frame(am_id, header_fn(op_id), payload)
        except BaseException:
            del self.ops[op_id]
            raise
        return req

    def put_nb(self, ep, buf, address: int, rkey: RemoteKey) -> Request:
        mv = send_view(buf)
        off = rkey.check(address, mv.nbytes)
        if self.worker.tr is not None:
            self.worker.tr.rma("put", ep, mv.nbytes, rkey.mode)
        if rkey.mode == MAPPED:
            if mv.nbytes:
                ffi.memmove(ffi.cast("char *", rkey._local_base + off), mv, mv.nbytes)
            return COMPLETED
        if rkey.mode == CMA:
            self._cma(lib.ucxpy_cma_write, rkey, mv, address)
            return COMPLETED
        if rkey.mode == RDMA:
            return self._rdma(ep, "put", mv, address, rkey)
        return self._fragmented(ep, mv, lambda piece, at: self._post(
            ep, AmId.RMA_PUT, lambda i: wire.RMA_PUT.pack(i, rkey.mem_id, at), piece), address)

    def get_nb(self, ep, buf, address: int, rkey: RemoteKey) -> Request:
        mv = recv_view(buf)
        off = rkey.check(address, mv.nbytes)
        if self.worker.tr is not None:
            self.worker.tr.rma("get", ep, mv.nbytes, rkey.mode)
        if rkey.mode == MAPPED:
            if mv.nbytes:
                ffi.memmove(mv, ffi.cast("char *", rkey._local_base + off), mv.nbytes)
            return COMPLETED
        if rkey.mode == CMA:
            self._cma(lib.ucxpy_cma_read, rkey, mv, address)
            return COMPLETED
        if rkey.mode == RDMA:
            return self._rdma(ep, "get", mv, address, rkey)
        return self._fragmented(ep, mv, lambda piece, at: self._post(
            ep, AmId.RMA_GET, lambda i: wire.RMA_GET.pack(i, rkey.mem_id, at, piece.nbytes),
            dest=piece), address)

    def _fragmented(self, ep, mv, post_one, address: int) -> Request:
        """Issue ``post_one(piece, remote address)`` per transport-sized piece of
        ``mv``; one Request completes when all did (the first error wins)."""
        frag = ep.transport_endpoint().iface.attrs.max_frame
        if mv.nbytes <= frag:
            return post_one(mv, address)
        parent = Request(self.worker)
        offsets = range(0, mv.nbytes, frag)
        left = [len(offsets)]

        def one_done(r):
            left[0] -= 1
            if r.exc is not None:
                parent.complete(exc=r.exc)
            elif left[0] == 0:
                parent.complete()
        for off in offsets:
            post_one(mv[off:off + frag], address + off).add_done_callback(one_done)
        return parent

    def _rdma(self, ep, op: str, mv, address: int, rkey: RemoteKey) -> Request:
        """One-sided put/get by the lane itself (fi_write / fi_read, RDMA
        WRITE / READ); tracked so ``flush`` and ``fence`` wait for it."""
        if not mv.nbytes:
            return COMPLETED
        tep = ep.transport_endpoint()
        req = Request(self.worker)
        op_id = next(self._op_ids)
        self.ops[op_id] = _Op(ep, req)

        def done(exc, op_id=op_id, mv=mv):
            if self.ops.pop(op_id, None) is not None:
                req.complete(exc=exc)
        try:
            if getattr(tep, op)(mv, address, rkey.tl_keys[ep.lane.name], done):
                done(None)
        except BaseException:
            self.ops.pop(op_id, None)
            raise
        return req

    @staticmethod
    def _cma(fn, rkey, mv, address):
        if not mv.nbytes:
            return
        with ffi.from_buffer(mv) as local:
            n = fn(rkey.pid, local, address, mv.nbytes)
        if n != mv.nbytes:
            raise RemoteAccessError(f"cross-memory access to pid {rkey.pid} failed "
                                    f"({os.strerror(-n) if n < 0 else f'{n} bytes moved'})")

    def atomic_nb(self, ep, op: str, value: int, address: int, rkey: RemoteKey,
                  size: int = 8, compare: int = 0) -> Request:
        if op not in ATOMIC_OPS:
            raise ValueError(f"unknown atomic {op!r}; one of {', '.join(ATOMIC_OPS)}")
        if size not in (4, 8):
            raise ValueError("atomic size must be 4 or 8 bytes")
        off = rkey.check(address, size, align=size)
        code = ATOMIC_OPS[op]
        if self.worker.tr is not None:
            self.worker.tr.rma("atomic_" + op, ep, size, rkey.mode)
        if rkey.mode == MAPPED:
            req = Request(self.worker)
            req.complete(apply_atomic(rkey._local_base + off, code, size, value, compare))
            return req
        return self._post(ep, AmId.RMA_AMO, lambda i: wire.RMA_AMO.pack(
            i, rkey.mem_id, address, code, size, value & _MASK[size], compare & _MASK[size]))

    def outstanding(self, ep=None) -> bool:
        return any(op.ep is ep for op in self.ops.values()) if ep is not None else bool(self.ops)

    def fail_peer(self, ep, exc) -> None:
        for op_id, op in list(self.ops.items()):
            if op.ep is ep:
                del self.ops[op_id]
                op.req.complete(exc=exc)

    def _finish(self, header, struct_):
        fields = struct_.unpack(header)
        op = self.ops.pop(fields[0], None)
        if op is None:
            from .errors import ProtocolError
            raise ProtocolError(f"RMA reply for unknown operation {fields[0]}")
        if fields[1] != OK:
            op.req.complete(exc=RemoteAccessError(f"remote {_STATUS.get(fields[1], 'error')}"))
            return None, fields
        return op, fields

    def on_ack(self, tep, header, payload):
        op, _ = self._finish(header, wire.RMA_ACK)
        if op is not None:
            op.req.complete()

    def on_get_rep(self, tep, header, payload):
        op, _ = self._finish(header, wire.RMA_ACK)
        if op is not None:
            if len(payload) != op.dest.nbytes:
                op.req.complete(exc=RemoteAccessError("get reply of the wrong length"))
            else:
                if not (isinstance(payload, memoryview) and payload.obj is op.dest.obj):
                    op.dest[:] = payload
                op.req.complete()

    def on_amo_rep(self, tep, header, payload):
        op, fields = self._finish(header, wire.RMA_AMO_REP)
        if op is not None:
            op.req.complete(fields[2])

    def reply_dest(self, header, length):
        """``recv_dest`` for GET replies: the initiator's buffer."""
        op_id, status = wire.RMA_ACK.unpack(header)
        op = self.ops.get(op_id)
        if op is None or op.dest is None or status != OK or length != op.dest.nbytes:
            return None
        return op.dest

    # -- target (accesses checked by ucxpy.rkey.resolve) ----------------------
    def put_dest(self, header, length):
        """``recv_dest`` for PUT frames: straight into the registered memory."""
        _, mem_id, address = wire.RMA_PUT.unpack(header)
        status, mh, off = resolve(self.registry, mem_id, address, length)
        return mh.buf[off:off + length] if status == OK else None

    def on_put(self, tep, header, payload):
        op_id, mem_id, address = wire.RMA_PUT.unpack(header)
        n = len(payload)
        status, mh, off = resolve(self.registry, mem_id, address, n)
        if status == OK and n and not (isinstance(payload, memoryview)
                                       and payload.obj is mh.buf.obj):
            mh.buf[off:off + n] = payload
        tep.owner_ep.send_frame(AmId.RMA_ACK, wire.RMA_ACK.pack(op_id, status))

    def on_get(self, tep, header, payload):
        op_id, mem_id, address, n = wire.RMA_GET.unpack(header)
        status, mh, off = resolve(self.registry, mem_id, address, n)
        data = mh.buf[off:off + n] if status == OK else b""
        tep.owner_ep.send_frame(AmId.RMA_GET_REP, wire.RMA_ACK.pack(op_id, status), data)

    def on_amo(self, tep, header, payload):
        op_id, mem_id, address, code, size, value, compare = wire.RMA_AMO.unpack(header)
        old = 0
        if size not in (4, 8) or code > 5:
            status = BADOP
        else:
            status, mh, off = resolve(self.registry, mem_id, address, size, size)
            if status == OK:
                old = apply_atomic(mh.address + off, code, size, value, compare)
        tep.owner_ep.send_frame(AmId.RMA_AMO_REP, wire.RMA_AMO_REP.pack(op_id, status, old))

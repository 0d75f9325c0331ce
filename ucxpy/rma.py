"""RMA and atomics on registered memory (UCX's ucp_mem_map / ucp_put / ucp_atomic).

Theory of operation
-------------------
``Worker.mem_map()`` registers memory and returns a :class:`MemHandle`; its
``pack_rkey()`` bytes travel to peers, which turn them into a
:class:`RemoteKey` with ``Endpoint.unpack_rkey()``.  Memory belongs to the
transports' memory domains (``ucxpy.transports.base.MemoryDomain``): a
handle is registered with the domain of every interface of the worker, and
its key carries each domain's packed key.  ``mem_map(length=n)`` takes the
memory from the first domain that allocates memory its same-host peers can
map (``MdCaps.ALLOC``), else from the heap.

Each remote key picks one access mode when unpacked, by asking the memory
domain of the endpoint's lane (the core names no transport):

============  ==========================================  =========================
mode          when the lane's domain unpacks the key to   put / get / atomics
============  ==========================================  =========================
MAPPED        an address here (``rkey_ptr``)              memmove; CPU atomics
one-sided     a transport key and ``MdCaps.PUT|GET``;     ``TransportEndpoint.put``
              its mode: the domain's ``access``, e.g.     / ``get``; atomics by the
              "rdma" (asynchronous) or "cma" (a           device with
              synchronous copy)                           ``UCXPY_ATOMIC_MODE``,
                                                          else as in AM mode
AM            nothing (another host, no such domain)      frames served by the
                                                          target's progress
============  ==========================================  =========================

In AM mode the *target must progress* (call any blocking ucxpy function, or
``worker.progress()``, or start the worker's progress thread with
``UCXPY_PROGRESS_THREAD=y`` / ``Worker.start_progress_thread()``).  Puts
complete when the target acknowledged them, so a completed put is visible at
the target.  Atomics are applied by the target with the same CPU atomics as
MAPPED mode, so both modes may hit one word concurrently; device atomics
(``UCXPY_ATOMIC_MODE=device``) are not atomic with those, which is why the
mode is chosen per worker, not per key.

Validity: where the lane's domain can tell (``MdRemoteKey.valid``; shm keeps
a registration table in shared memory for it), a stale key after
``unmap()`` raises :class:`~ucxpy.RemoteAccessError` instead of writing into freed
memory, and the AM target checks its registry.  Every access is
range-checked against the key; atomics must be naturally aligned.

Ordering: operations on one endpoint in AM mode are executed in issue order.
``Endpoint.fence()`` orders operations issued before it ahead of those after
it also across modes (it waits for outstanding AM and one-sided operations);
``Endpoint.flush()`` / ``Worker.flush()`` wait until all are complete.
"""
from __future__ import annotations

import itertools
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from . import wire
from .atomics import MASK as _MASK, OPS as ATOMIC_OPS
from .atomics import address_of as buffer_address, apply as apply_atomic
from .buffers import COMPLETED, recv_view, send_view
from .errors import ProtocolError, RemoteAccessError
from .request import Request
from .rkey import ALIGN, BADOP, OK, RANGE, STALE, RegionKey, resolve
from .rkey import pack as _pack_rkey
from .rkey import pack_md_keys as _pack_md_keys
from .transports.base import MdCaps
from ._dp import MappedKey

try:
    from ._native import ffi, lib
except ImportError:  # pragma: no cover - the module is built at install time
    ffi = lib = None

AmId = wire.AmId

_STATUS = {STALE: "stale or unknown remote key", RANGE: "access outside the registered region",
           ALIGN: "misaligned atomic", BADOP: "bad atomic operation"}

#: access modes; a one-sided mode is named by its memory domain (``access``):
#: CMA and RDMA are the names shm and the RDMA transports give theirs
MAPPED, CMA, RDMA, AM = "mapped", "cma", "rdma", "am"
ONE_SIDED = MdCaps.PUT | MdCaps.GET
_DEVICE_SIZE = {4: MdCaps.ATOMIC32, 8: MdCaps.ATOMIC64}


class MemHandle:
    """Registered memory (``ucp_mem_h``).  ``buf`` is a writable byte view,
    ``address`` its base address as peers name it; ``alloc`` the memory
    domain allocation it lives in (None for user or heap memory)."""

    def __init__(self, rma, mem_id: int, view: memoryview, address: int, alloc=None,
                 alloc_md=None):
        self.rma = rma
        self.mem_id = mem_id
        self.buf = view
        self.address = address
        self.length = view.nbytes
        self.alloc = alloc
        self.alloc_md = alloc_md
        self._regs = None           # [(memory domain, its registration)]
        self._rkey = None
        self.mapped = True

    def __repr__(self) -> str:
        kind = f"{self.alloc_md.name}-allocated" if self.alloc is not None else "user"
        return f"<MemHandle {self.mem_id} {kind} {self.length} B at {self.address:#x}>"

    def pack_rkey(self) -> bytes:
        """Remote key bytes for peers (``ucp_rkey_pack``): registers the
        memory with every memory domain of the worker on first use."""
        if not self.mapped:
            raise RemoteAccessError("memory handle is unmapped")
        if self._rkey is None:
            regs, keys = [], []
            for md in self.rma.domains() if self.length else ():
                if md.caps & MdCaps.REG:
                    memh = md.mem_reg(self.buf, self.alloc if md is self.alloc_md else None)
                    regs.append((md, memh))
                    keys.append((md.name.encode(), bytes(md.rkey_pack(memh))))
            self._regs = regs
            self._rkey = _pack_rkey(self.rma.worker.uuid, self.mem_id, self.address,
                                    self.length, _pack_md_keys(keys))
        return self._rkey

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
    its packed key (``ucxpy.rkey.RegionKey``, whose ``check`` range-checks
    every access), what the lane's memory domain unpacked (``md_key``) and the
    access mode that gives."""

    __slots__ = ("ep", "mode", "native")

    def __init__(self, ep, packed):
        RegionKey.__init__(self, packed)
        if self.uuid != ep.remote.uuid:
            raise RemoteAccessError(f"remote key belongs to another worker than {ep!r}")
        self.ep = ep
        #: the data plane's key (``ucxpy._dp.MappedKey``: put, get and, with
        #: CPU atomics, atomics in one C call), or None: Python does every
        #: access; set by access_mode
        self.native = None
        self.mode = ep.worker.rma.access_mode(ep, self)

    def __repr__(self) -> str:
        return f"<RemoteKey mem {self.mem_id} [{self.base:#x}+{self.length}] {self.mode}>"

    @property
    def mapped_address(self) -> int:
        """Address of the region's first byte as mapped into this process
        (MAPPED mode; 0 otherwise), for layers that load/store peer memory
        directly, e.g. OpenSHMEM's symmetric heap and ``shmem_ptr``."""
        return self.md_key.address if self.mode == MAPPED else 0

    def map(self) -> Optional[memoryview]:
        """The region mapped into this process where a memory domain of this
        worker can map it, whatever the lane (UCX's ``rkey_ptr``): a writable
        view of all of it (the mapping lasts as long as the view), or None
        (another host, a registered user buffer, no such domain).  Loads and
        stores through it bypass the lane: the caller orders them (MPI's
        ``Win.Sync`` and barriers)."""
        rma = self.ep.worker.rma
        rma._alloc_domain()
        for md in rma.domains():
            packed = self.md_keys.get(md.name)
            if packed is not None and md.caps & MdCaps.RKEY_PTR:
                view = md.rkey_map(packed, self.length)
                if view is not None:
                    return view
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
        self.ops = {}                 # op id -> _Op (awaiting a reply or the lane)
        self._ids = itertools.count(1)
        self._op_ids = itertools.count(1)
        self._atomic_mode = None
        self._host_md = None
        self._host_md_tried = False
        self.handlers = {AmId.RMA_PUT: self.on_put, AmId.RMA_ACK: self.on_ack,
                         AmId.RMA_GET: self.on_get, AmId.RMA_GET_REP: self.on_get_rep,
                         AmId.RMA_AMO: self.on_amo, AmId.RMA_AMO_REP: self.on_amo_rep}

    # -- registration --------------------------------------------------------
    def domains(self) -> list:
        """The memory domains of the worker's interfaces, in lane order, and
        the host memory domain once one was needed (:meth:`_alloc_domain`)."""
        mds = [i.md for i in self.worker.ifaces if i.md is not None]
        return mds + [self._host_md] if self._host_md is not None else mds

    def _alloc_domain(self, host: bool = True):
        """The domain that allocates memory same-host peers map: an
        interface's, else (``host``) the context's host memory domain,
        opened once."""
        md = next((i.md for i in self.worker.ifaces
                   if i.md is not None and i.md.caps & MdCaps.ALLOC), None)
        if md is None and host:
            if not self._host_md_tried:
                self._host_md_tried = True
                self._host_md = self.worker.context.host_memory_domain()
            md = self._host_md
        return md

    def mem_map(self, buf=None, length: int = 0, shared: bool = False,
                address: int = 0) -> MemHandle:
        """A length allocates memory from the first interface's memory domain
        that allocates memory same-host peers map, else from the heap;
        ``shared`` (the caller wants that kind, ``RemoteKey.map``) falls back
        to the context's host memory domain instead of the heap.  ``address``
        (with a length): the memory is shared and also mapped at exactly that
        page-aligned, free address, which is the region's address (UCP's
        ``UCP_MEM_MAP_FIXED``, for OpenSHMEM's symmetric heap)."""
        if buf is None and length <= 0:
            raise ValueError("mem_map needs a buffer or a length > 0")
        if buf is not None and length:
            raise ValueError("mem_map takes a buffer or a length, not both")
        if buf is not None and address:
            raise ValueError("mem_map places allocated memory at an address, not a buffer")
        mem_id = next(self._ids)
        if address:
            md = self._alloc_domain(host=True)
            if md is None:
                raise RemoteAccessError("no memory domain allocates shared memory here, "
                                        "which a fixed address needs")
            alloc = md.mem_alloc(length, address)
            mh = MemHandle(self, mem_id, alloc.view, alloc.address, alloc, md)
        elif buf is None:
            md = self._alloc_domain(host=shared)
            if md is not None:
                alloc = md.mem_alloc(length)
                mh = MemHandle(self, mem_id, alloc.view, alloc.address, alloc, md)
            else:
                mh = self._wrap(mem_id, bytearray(length))
        else:
            mh = self._wrap(mem_id, buf)
        self.registry[mem_id] = mh
        return mh

    def _wrap(self, mem_id, buf) -> MemHandle:
        view = recv_view(buf)       # the view pins the buffer: it cannot move or shrink
        return MemHandle(self, mem_id, view, buffer_address(view))

    def unregister(self, mh: MemHandle) -> None:
        self.registry.pop(mh.mem_id, None)
        for md, memh in mh._regs or ():
            md.mem_dereg(memh)
        mh._regs = None
        if mh.alloc is not None:
            mh.alloc_md.mem_free(mh.alloc)

    def close(self) -> None:
        for mh in list(self.registry.values()):
            mh.unmap()
        if self._host_md is not None:
            self._host_md.close()

    # -- access mode -----------------------------------------------------------
    def atomic_mode(self) -> str:
        """"cpu" or "device": ``UCXPY_ATOMIC_MODE`` with auto resolved (device
        only when every interface's memory domain has device atomics)."""
        if self._atomic_mode is None:
            mode = self.worker.config.atomic_mode
            if mode == "auto":
                ifaces = self.worker.ifaces
                mode = "device" if ifaces and all(
                    i.md is not None and i.md.caps & MdCaps.ATOMIC64 for i in ifaces) else "cpu"
            self._atomic_mode = mode
        return self._atomic_mode

    def access_mode(self, ep, rkey: RemoteKey) -> str:
        ep.transport_endpoint()
        md = ep.lane.md
        packed = rkey.md_keys.get(md.name) if md is not None and lib is not None else None
        mk = None if packed is None else md.rkey_unpack(packed, rkey.base, rkey.length)
        if mk is None:
            return AM
        rkey.md_key = mk
        if mk.address:
            self._native_mapping(rkey, mk)
            return MAPPED
        if mk.transport_key is not None and md.caps & ONE_SIDED == ONE_SIDED:
            return md.access
        return AM

    def _native_mapping(self, rkey: RemoteKey, mk) -> None:
        """Give a MAPPED key its data-plane key (``rkey.native``, which keeps
        ``mk`` and so the mapping): when the native data plane is on and the
        domain's validity check is one word.  Its atomics are on with CPU
        atomics only (device atomics are not atomic with them)."""
        dp = self.worker.dp
        if dp is None:
            return
        guard = mk.guard()
        if guard is None:
            return
        rkey.native = MappedKey(dp, mk.address, rkey.base, rkey.length, guard[0], guard[1],
                                self.atomic_mode() == "cpu", mk)

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
        native = rkey.native
        if native is not None and self.worker.tr is None and native.put(address, buf):
            return COMPLETED             # one C call; else the checks below say why not
        mv = send_view(buf)
        off = rkey.check(address, mv.nbytes)
        if self.worker.tr is not None:
            self.worker.tr.rma("put", ep, mv.nbytes, rkey.mode)
        if rkey.mode == MAPPED:
            if mv.nbytes:
                ffi.memmove(ffi.cast("char *", rkey.md_key.address + off), mv, mv.nbytes)
            return COMPLETED
        if rkey.mode != AM:
            return self._one_sided(ep, "put", mv, address, rkey)
        return self._fragmented(ep, mv, lambda piece, at: self._post(
            ep, AmId.RMA_PUT, lambda i: wire.RMA_PUT.pack(i, rkey.mem_id, at), piece), address)

    def get_nb(self, ep, buf, address: int, rkey: RemoteKey) -> Request:
        native = rkey.native
        if native is not None and self.worker.tr is None and native.get(address, buf):
            return COMPLETED
        mv = recv_view(buf)
        off = rkey.check(address, mv.nbytes)
        if self.worker.tr is not None:
            self.worker.tr.rma("get", ep, mv.nbytes, rkey.mode)
        if rkey.mode == MAPPED:
            if mv.nbytes:
                ffi.memmove(mv, ffi.cast("char *", rkey.md_key.address + off), mv.nbytes)
            return COMPLETED
        if rkey.mode != AM:
            return self._one_sided(ep, "get", mv, address, rkey)
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

    def _track(self, ep, keep=None):
        """A Request for an operation the lane completes, and its callback
        ``done(exc[, value])``; tracked so ``flush`` and ``fence`` wait for it
        (``keep``: the local buffer, held until then)."""
        req = Request(self.worker)
        op_id = next(self._op_ids)
        self.ops[op_id] = _Op(ep, req, keep)

        def done(exc, value=None, op_id=op_id):
            if self.ops.pop(op_id, None) is not None:
                req.complete(value, exc=exc)
        return req, op_id, done

    def _one_sided(self, ep, op: str, mv, address: int, rkey: RemoteKey) -> Request:
        """Put/get by the lane itself (``TransportEndpoint.put`` / ``get``:
        fi_write, RDMA WRITE, a cross-memory copy, ...)."""
        if not mv.nbytes:
            return COMPLETED
        req, op_id, done = self._track(ep, mv)
        try:
            finished = getattr(ep.transport_endpoint(), op)(
                mv, address, rkey.md_key.transport_key, done)
        except BaseException:
            self.ops.pop(op_id, None)
            raise
        if finished:                     # done at once (a synchronous copy)
            self.ops.pop(op_id, None)
            return COMPLETED
        return req

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
        if self.atomic_mode() == "device":
            return self._device_atomic(ep, op, size, value, compare, address, rkey)
        if rkey.mode == MAPPED:
            req = Request(self.worker)
            req.complete(apply_atomic(rkey.md_key.address + off, code, size, value, compare))
            return req
        return self._post(ep, AmId.RMA_AMO, lambda i: wire.RMA_AMO.pack(
            i, rkey.mem_id, address, code, size, value & _MASK[size], compare & _MASK[size]))

    def _device_atomic(self, ep, op, size, value, compare, address, rkey) -> Request:
        md, mk = ep.lane.md, rkey.md_key
        if mk is None or mk.transport_key is None or not md.caps & _DEVICE_SIZE[size] \
                or op not in md.device_atomic_ops:
            raise RemoteAccessError(
                f"UCXPY_ATOMIC_MODE=device: lane {ep.lane.name} has no {size * 8}-bit device "
                f"atomic {op!r} for this key (cpu atomics would not be atomic with device ones)")
        req, op_id, done = self._track(ep)
        try:
            ep.transport_endpoint().atomic(op, size, address, mk.transport_key,
                                           value & _MASK[size], compare & _MASK[size], done)
        except BaseException:
            self.ops.pop(op_id, None)
            raise
        return req

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

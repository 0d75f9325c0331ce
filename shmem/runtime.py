"""Start-up, per-PE access paths, and the progress/back-off loop.

Theory of operation
-------------------
``init()`` joins the ucxpy SPMD job (``ucxpy-run`` or ``mpiexec``), maps one
shared segment of ``UCXPY_SHMEM_HEAP_SIZE`` bytes (the *symmetric heap*) and
allgathers ``(heap address, packed rkey)`` over the bootstrap.  Every PE then
has one :class:`Peer` per PE, whose ``mode`` fixes how that PE's heap is
reached for the rest of the job:

=======  ==========================================  ===========================
mode     when                                        put / get / atomics
=======  ==========================================  ===========================
LOCAL    the calling PE itself                       memmove / native atomics
MAPPED   same host, shm transport (ucxpy MAPPED)     memmove into the peer's
                                                     segment mapped here; native
                                                     atomics; no target progress
AM       anything else (tcp, other hosts)            ucxpy RMA on the endpoint;
                                                     the target progresses in
                                                     its own shmem calls, or in
                                                     the worker progress thread
=======  ==========================================  ===========================

Because symmetric objects are identified by their *offset* in the heap, the
hot paths only add an offset to the cached per-PE base: no lookups, no key
unpacking per call.

Every blocking wait goes through :meth:`Runtime.wait`: it progresses the
worker (AM-mode peers need it, and tagged collectives too), spins briefly,
then yields the CPU and finally naps with growing sleeps, so oversubscribed
PEs (more PEs than cores) do not starve the PE they are waiting for.
"""
from __future__ import annotations

import atexit
import mmap
import os
import struct
import sys
import time
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Callable, Optional

import numpy as np

import ucxpy
from ucxpy import atomics, config
from ucxpy.errors import TimeoutError as UcxpyTimeout
from ucxpy.rma import MAPPED, RDMA

from . import accel
from .allocator import SymmetricHeap
from .errors import InvalidPE, NotInitialized
from .settings import DEFAULT_HEAP_SIZE, parse_heap_size as parse_size


LOCAL, AM = "local", "am"
#: bytes at the start of the heap kept for the library (team sync counters)
RESERVED_BYTES = 64 << 10
_HEAP_INFO = struct.Struct("<QQ")
#: (busy spins, spins with sched_yield, longest nap) of Runtime.wait: spin
#: long when every PE of this host has a core, nap early when oversubscribed
_WAIT_POLICY = {False: (16, 2048, 500e-6), True: (2, 2, 50e-6)}


def heap_size_from_env(env=None) -> int:
    """``UCXPY_SHMEM_HEAP_SIZE``, else OpenSHMEM's ``SHMEM_SYMMETRIC_SIZE``, else 64M."""
    size = config.setting("UCXPY_SHMEM_HEAP_SIZE", env)
    if size is not None:
        return size
    text = (os.environ if env is None else env).get("SHMEM_SYMMETRIC_SIZE")
    return parse_size(text) if text else DEFAULT_HEAP_SIZE


class Peer:
    """How this PE reaches one PE's symmetric heap."""

    __slots__ = ("pe", "mode", "base", "ptr", "u8", "ep", "rkey", "raddr")

    def __init__(self, pe, mode, base=0, ep=None, rkey=None, raddr=0, length=0):
        self.pe = pe
        self.mode = mode
        self.base = base            # heap address in *this* process (LOCAL, MAPPED)
        self.ep = ep
        self.rkey = rkey
        self.raddr = raddr          # heap address in the peer's process (AM)
        if base:
            self.ptr = atomics.pointer(base)
            self.u8 = np.frombuffer(atomics.buffer(self.ptr, length), np.uint8)
        else:
            self.ptr = None
            self.u8 = None

    @property
    def direct(self) -> bool:
        """Loads and stores reach this PE's heap (LOCAL or MAPPED)."""
        return self.base != 0

    def __repr__(self) -> str:
        return f"<Peer {self.pe} {self.mode}>"


#: what init() builds beside the heap, by name: the modules above the runtime
#: register their state's constructor when imported (shmem.team "teams",
#: shmem.ctx "ctxs"; the package imports both), so this module imports none
#: of them and they all import it
_REGISTRIES = {}


def register(name: str, factory) -> None:
    """``factory(runtime)`` builds ``runtime.<name>`` in :class:`Runtime`."""
    _REGISTRIES[name] = factory


def _registry(name: str):
    factory = _REGISTRIES.get(name)
    if factory is None:
        raise NotInitialized(f"shmem's {name} are not set up: import shmem, not shmem.runtime alone")
    return factory


class Runtime:
    """Everything ``init()`` sets up; one per process."""

    def __init__(self, heap_size: Optional[int] = None, timeout: float = 120.0):
        if not atomics.available:
            raise NotInitialized("ucxpy._native is not built: run pip install -e .")
        self.world = ucxpy.init(timeout=timeout)
        self.worker = self.world.worker
        self.rank = self.world.rank
        self.size = self.world.size
        self.timeout = self.worker.config.timeout
        size = heap_size or heap_size_from_env()
        if size <= RESERVED_BYTES:
            raise ValueError(f"symmetric heap of {size} bytes is too small "
                             f"(the library keeps {RESERVED_BYTES})")
        self.mh = self.worker.mem_map(length=size)
        self._anon = None
        if self.mh.address % mmap.PAGESIZE:
            # no shared segment (no shm transport): register page-aligned
            # anonymous memory instead, so align= holds on every PE alike
            self.mh.unmap()
            self._anon = mmap.mmap(-1, size)
            self.mh = self.worker.mem_map(self._anon)
        self.heap = SymmetricHeap(self.mh, RESERVED_BYTES)
        info = _HEAP_INFO.pack(self.mh.address, self.mh.length) + self.mh.pack_rkey()
        infos = self.world.bootstrap.allgather(info, timeout=timeout)
        self.peers = []
        hosts = []
        for pe, blob in enumerate(infos):
            raddr, length = _HEAP_INFO.unpack_from(blob)
            if length != size:
                raise ValueError(f"PE {pe} has a {length}-byte symmetric heap, this PE "
                                 f"{size}: set UCXPY_SHMEM_HEAP_SIZE alike on every PE")
            ep = self.world.ep(pe)
            hosts.append(ep.remote.host_id)
            if pe == self.rank:
                self.peers.append(Peer(pe, LOCAL, self.mh.address, ep, None, raddr, size))
                continue
            rkey = ep.unpack_rkey(blob[_HEAP_INFO.size:])
            if rkey.mode == MAPPED:
                self.peers.append(Peer(pe, MAPPED, rkey.mapped_address, ep, rkey, raddr, size))
            else:
                self.peers.append(Peer(pe, AM, 0, ep, rkey, raddr, size))
        self.hosts = hosts
        self.any_am = any(p.mode == AM for p in self.peers)
        #: peers whose puts the lane writes one-sidedly (RDMA): those writes
        #: are ordered neither among themselves nor with the active messages
        #: that carry AMOs and signals, so fence and put_signal wait for them
        self.unordered = [p for p in self.peers if p.rkey is not None and p.rkey.mode == RDMA]
        self.teams = _registry("teams")(self)
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        self.oversubscribed = self.teams.shared.n > cores
        self.wait_policy = _WAIT_POLICY[self.oversubscribed]
        self.ctxs = _registry("ctxs")(self)
        self.progress_thread = False
        if self.any_am and _want_progress_thread(self.oversubscribed):
            # AM-mode targets must progress for peers' puts and atomics to
            # land; a PE busy computing would otherwise stall them.
            self.worker.start_progress_thread()
            self.progress_thread = True
        self.finalized = False
        self.world.barrier(timeout)
        accel.open_table(self)

    # -- PEs -------------------------------------------------------------------
    def peer(self, pe) -> Peer:
        """The :class:`Peer` for world PE ``pe``; raises InvalidPE."""
        try:
            if pe >= 0:
                return self.peers[pe]
        except (IndexError, TypeError):
            pass
        raise InvalidPE(f"PE {pe!r} is out of range for a job of {self.size} PEs")

    # -- waiting -----------------------------------------------------------------
    def wait(self, cond: Callable[[], bool], what: str = "wait",
             timeout: Optional[float] = None) -> None:
        """Progress until ``cond()`` is true, backing off as described above.
        Raises TimeoutError after ``timeout`` (default ``UCXPY_TIMEOUT``, 0 =
        forever) and PeerFailure/ConnectionLost when a peer died meanwhile."""
        if cond():
            return
        # with the progress thread on, leave progress to it: competing for
        # the worker lock costs a GIL hand-off (up to the switch interval)
        progress = _no_progress if self.progress_thread else self.worker.progress
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout if timeout and timeout > 0 else float("inf")
        spins, nap = 0, 10e-6
        busy_spins, yield_spins, max_nap = self.wait_policy
        while True:
            if progress():
                spins, nap = 0, 10e-6
            if cond():
                return
            spins += 1
            if spins < busy_spins:
                continue
            if not spins & 255:
                self.check_failures()
                if time.monotonic() > deadline:
                    raise UcxpyTimeout(f"shmem {what} did not complete within {timeout:g} s")
            if spins < yield_spins:
                os.sched_yield()
            else:
                time.sleep(nap)
                nap = min(nap * 2, max_nap)

    def wait_requests(self, reqs, what="quiet") -> None:
        """Wait for every ucxpy Request in ``reqs``; raises the first error."""
        pending = [r for r in reqs if not r.done]
        if pending:
            self.wait(lambda: all(r.done for r in pending), what)
        for r in reqs:
            if r.exc is not None:
                raise r.exc

    def check_failures(self) -> None:
        self.worker.check_peers()
        for ep in self.world.eps:
            if ep.failed is not None:
                raise ep.failed

    # -- teardown ----------------------------------------------------------------
    def finalize(self, collective: bool = True) -> None:
        if self.finalized:
            return
        try:
            if collective:
                self.ctxs.quiet_all()
                self.teams.world.sync()
                self.world.finalize()
            else:
                self.world.abort("shmem: exiting without finalize")
        finally:
            accel.close_table()
            self.finalized = True


def _no_progress() -> int:
    time.sleep(0)       # release the GIL so the progress thread runs
    return 0


def _want_progress_thread(oversubscribed: bool) -> bool:
    """auto: only when the host has a CPU for the thread.  With more PEs than
    CPUs the thread has none to run on: each PE's two threads take turns at
    the GIL, and every worker call goes through the thread's lock with the
    native fast paths off (tests/hosts' 16-PE job on 2 cores: 68-132 s with
    it, 19 s without, docs/notes/performance-history.md).  AM-mode accesses are then
    served inside shmem calls, as OpenSHMEM requires."""
    mode = config.setting("UCXPY_SHMEM_PROGRESS_THREAD")
    return mode == "y" or (mode == "auto" and not oversubscribed)


current: Optional[Runtime] = None
_crashed = False


def get() -> Runtime:
    """The live runtime, or NotInitialized."""
    rt = current
    if rt is None:
        raise NotInitialized("shmem is not initialized: call shmem.init() first")
    return rt


def init(heap_size: Optional[int] = None) -> Runtime:
    global current
    if current is None:
        current = Runtime(heap_size)
        _install_exit_hooks()
    return current


def finalize() -> None:
    global current
    rt, current = current, None
    if rt is not None:
        rt.finalize()


_hooks_installed = False


def _install_exit_hooks() -> None:
    """Finalize at exit if the program did not; after an uncaught exception
    abort instead of entering a barrier the other PEs may never reach."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    prev = sys.excepthook

    def hook(*exc):
        global _crashed
        _crashed = True
        prev(*exc)
    sys.excepthook = hook
    atexit.register(_at_exit)


def _at_exit() -> None:
    global current
    rt, current = current, None
    if rt is not None and not rt.finalized:
        try:
            rt.finalize(collective=not _crashed)
        except Exception as e:  # noqa: BLE001 - exiting anyway
            sys.stderr.write(f"shmem: finalize at exit failed: {e}\n")

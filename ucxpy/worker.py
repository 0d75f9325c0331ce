"""Worker: the progress engine, wire-up and frame dispatch (UCX's ucp_worker)."""
from __future__ import annotations

import os
import random
import select
import struct
import threading
import time
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Callable, Optional

from . import _dp, protocols, wire
from .address import WorkerAddress
from .am import ActiveMessages
from .buffers import PayloadPool, recv_view  # noqa: F401  (recv_view re-exported)
from .endpoint import Endpoint
from .netaddr import host_id
from .progress_thread import (ENDPOINT_API, WORKER_API, ProgressThread, make_thread_safe,
                              threads_alive)
from .errors import (ConnectionLost, InvalidBuffer, PeerFailure, ProgressThreadError,
                     ProtocolError, TruncationError, UcxpyError)
from .request import Request, TagInfo, deadline_of, timeout_error
from .rma import MemHandle, RmaEngine
from .rndv import RendezvousProtocol, RtsInfo, split_floor
from .tag import (ANY_SOURCE, FULL_MASK, RecvRequest, TagMatcher,
                  UnexpectedMessage, deliver_eager, handoff_matched)

AmId = wire.AmId
TAG_EAGER = int(AmId.TAG_EAGER)
AM_EAGER = int(AmId.AM_EAGER)
COLD_EVERY = 16     # power of two
#: polls of one fast-path C call (``Worker.recv_poller``) between progress passes
FAST_SPINS = 256
#: the longest nap of a waiting worker (it sleeps on the transports'
#: descriptors, which wake it when a message arrives; the nap bounds what
#: nothing signals: failure notices, a lost wake-up)
MAX_NAP = 2e-3
#: the same with more ranks than CPUs and no other thread: every sleeper's
#: wake-up takes the CPU from the ranks doing the work (at 64 ranks on 2
#: cores, naps of 2 ms left the ranks working a third of the machine)
OVERSUBSCRIBED_MAX_NAP = 0.1
#: progress passes between two looks at the clock (and, with more ranks
#: than CPUs, two sched_yields) in a wait.  With more ranks than CPUs the
#: peer a wait needs is as often queued behind this rank on its CPU as
#: running on another: one pass, then the CPU to the next rank.  Eight
#: passes before each yield cost an 8-rank all-to-all of 64 KiB 5-11 % more
#: CPU per rank and about 10 % more time (bench/a2a_phases.py, 2026-12-06)
BURST, OVERSUBSCRIBED_BURST = 64, 1
#: local ids given to peers whose worker id collides with a live peer's
ALIAS_BASE = 1 << 62
#: a peer's last connection closed: wait this long (and two full progress
#: passes) for a connection of its that is still being accepted before
#: failing what depends on it (see Worker.conn_failed)
CLOSE_GRACE = 0.25


class TagMessage:
    """A message removed from the unexpected queue by a matched probe
    (``tag_probe(..., remove=True)``); receive it with :meth:`Worker.tag_recv_message_nb`."""

    __slots__ = ("info", "_msg")

    def __init__(self, msg: UnexpectedMessage):
        self.info = msg.info
        self._msg = msg


def usable_cpus() -> int:
    """CPUs the job's ranks on this host may share: this process's affinity
    mask when it holds several CPUs (the job confined by taskset or a cpuset),
    else every online CPU (a rank bound to one core of its own says nothing
    about how many cores its job has)."""
    try:
        mask = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mask = 0
    return mask if mask > 1 else (os.cpu_count() or 1)


class Worker:
    """Progress engine owning one interface per selected transport.

    Nothing moves unless :meth:`progress` is called (directly, or by a
    blocking call, ``Request.wait`` or ``Request.test``).
    """

    def __init__(self, context, worker_id: Optional[int] = None):
        self.context = context
        self.config = context.config
        self.uuid = random.getrandbits(63)
        self.id = self.uuid if worker_id is None else worker_id
        self.tr = None          # ucxpy.trace.Recorder with UCXPY_TRACE / UCXPY_STATS
        #: receives completed by the native fast path (recv_poller)
        self.fast_recvs = 0
        self.fast_sends = 0     # eager sends by the data plane (a Lane, the tcp eager path)
        self.fast_offers = 0    # rendezvous offers by the data plane (Lane.rts)
        # every posted receive keeps it as its cancel function: bound once,
        # not once per receive (a progress thread shadows it the same way)
        self._cancel_recv = self._cancel_recv
        self.direct_am_ids = frozenset((AmId.RNDV_DATA, AmId.RMA_PUT, AmId.RMA_GET_REP))
        #: the native data plane's worker (ucxpy._dp; None: UCXPY_FASTPATH=n,
        #: the pure-Python reference does everything)
        self.dp = _dp.Worker() if self.config.fastpath else None
        #: the one tag matcher: the data plane's (native/dp/tag.c), or the
        #: Python reference (ucxpy.tag) when the data plane is off
        self.matcher = TagMatcher() if self.dp is None else \
            _dp.TagMatcher(self.dp, UnexpectedMessage, handoff_matched)
        #: the poll of the one interface whose inbox the data plane reads
        #: (ShmInterface.poll_native), or None
        self._poll_native = None
        #: tag_recv_nb's common case in one call (the data plane's), or None
        self._post_new = None if self.dp is None else self.matcher.post_new
        self._payloads = PayloadPool()       # unexpected eager payloads
        self.rndv = RendezvousProtocol(self)
        self.am = ActiveMessages(self)
        self.rma = RmaEngine(self)
        self.endpoints = {}                  # local peer id -> Endpoint (see _local_id)
        self._by_uuid = {}                   # remote worker uuid -> Endpoint
        self._aliases = 0
        self._failing = {}                   # Endpoint -> (deadline, tick, exc): see conn_failed
        self._holding = {}                   # Endpoint -> (its held connection, deadline): _peer_moved
        self.bootstrap = None                # set by ucxpy.spmd: reports dead ranks
        self._handlers: list = [None] * 256
        for am_id, h in ((AmId.WIREUP, self._on_wireup), (AmId.TAG_EAGER, self._on_tag_eager),
                         (AmId.TAG_RTS, self._on_tag_rts), (AmId.RNDV_RTR, self.rndv.on_rtr),
                         (AmId.RNDV_DATA, self.rndv.on_data), (AmId.RNDV_ATS, self.rndv.on_ats),
                         (AmId.CLOSE, self._on_close), (AmId.AM_EAGER, self.am.on_eager),
                         (AmId.AM_RTS, self.am.on_rts), (AmId.RNDV_RTP, self.rndv.on_rtp),
                         (AmId.RNDV_FIN, self.rndv.on_fin), (AmId.LANE_MOVE, self._on_lane_move),
                         (AmId.PLUGIN, self._on_plugin)):
            self._handlers[am_id] = h
        #: the protocol plug-in (UCXPY_PROTO_PLUGIN), or None
        self.protocol = protocols.load(self, self.config.proto_plugin)
        #: its C half runs C callers' messages of its sizes (native/dp/proto.c)
        self.proto_c = False
        p = self.protocol
        if p is not None and p.native and self.dp is not None and self.config.proto_native:
            address, param = p.native_table()
            self.dp.set_proto(address, param, int(AmId.PLUGIN), p.sizes)
            self.proto_c = True
        for am_id, h in self.rma.handlers.items():
            self._handlers[am_id] = h
        self.ifaces = []
        self.closed = False
        try:
            for cls in context.transports:
                iface = cls(self, self.config)
                iface.split_floor = split_floor(iface.attrs.caps, self.config.rndv_split_thresh)
                self.ifaces.append(iface)
        except BaseException:
            self.close()
            raise
        # Interfaces carrying our endpoints are progressed on every call; the
        # others (listening for newcomers) every COLD_EVERY-th call only, so an
        # unused tcp listener does not cost an epoll syscall per progress().
        self._hot = []
        self._cold = [i.progress for i in self.ifaces]
        self._tick = 0
        self._callbacks = []                 # add_progress_callback: run by every progress()
        self._whens = []                     # when(): (request, predicate) progress completes
        # a C caller's progress (libucp) reads tcp connections itself: the
        # connections whose reading we lend it (tep -> ucxpy._dp.Stream, None
        # until first lent; lend_streams: set by ucxpy.capi for its workers)
        self.lend_streams = False
        self._streams = {}
        # a C caller's pass (libucp's progress: native/dp inbox and streams)
        # may match a receive posted through our path; we deliver it (set by
        # ucxpy.capi for its workers, the only ones whose dp.py_poll a C
        # caller reads)
        self.c_matches = False
        self._streams_scan = -1              # endpoints counted at the last look for new ones
        self._wake_sources = []              # add_wake_source: slept on beside the transports
        self.address = WorkerAddress(self.id, self.uuid, os.getpid(), host_id(),
                                     tuple((i.name, i.address()) for i in self.ifaces))
        self.address_bytes = self.address.pack()
        if self.config.trace or self.config.stats:
            from .trace import Recorder     # deferred: ucxpy.trace only when tracing or counting
            self.tr = Recorder(self, self.config)
        if self.dp is not None:
            self._attach_native()
        self.lock = None                     # set when a progress thread runs
        self.aio_drivers = {}                # asyncio loop -> ucxpy.aio.AsyncProgress
        self._progress_thread = None
        if self.config.progress_thread:
            self.start_progress_thread()

    def __repr__(self) -> str:
        return f"<Worker {self.id} tls={[i.name for i in self.ifaces]}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- progress ------------------------------------------------------------
    def progress(self) -> int:
        """Advance the transports once; returns the number of events handled."""
        n = 0
        if self.c_matches:              # (a C caller's pass matched receives of ours)
            n += self.matcher.deliver()
        if self._streams:               # (libucp's, read in C: here too while Python waits)
            n += self.matcher.streams_progress(64)[0] + self._streams_back()
        for fn in self._hot:
            n += fn()
        self._tick += 1
        if not self._tick & (COLD_EVERY - 1):
            for fn in self._cold:
                n += fn()
        if self._failing or self._holding:
            n += self._fail_closed_peers()
        if self._callbacks:
            for cb in self._callbacks:    # (removal rebinds the list: a callback may)
                n += cb()
        if self.lend_streams:
            self._streams_lend()
        return n

    # -- tcp connections read in C (native/dp/stream.c) ----------------------------
    def _streams_back(self) -> int:
        """Take back the connections whose C reader stopped (a frame it does
        not run, the end of the stream, an error): what it read and did not
        take goes to the transport first, which reads the socket again."""
        n = 0
        for tep, s in list(self._streams.items()):
            if s is not None and tep.stream_lent and not s.lent:
                tep.unlend_stream()
                data = s.take()
                if data:
                    tep.stream_spill(data, True)
                n += 1
        return n

    def _streams_lend(self) -> None:
        """Lend the reading of every registered connection whose next bytes
        are its next frame (nothing of it buffered here) to the C reader, and
        tell the data plane how much of our progress is left (our own
        connections carry the peer's frames too: duplex)."""
        streams = self._streams
        if self._streams_scan != len(self.endpoints) or not self._tick & 63:
            self._streams_scan = len(self.endpoints)    # (new endpoints, and now and then)
            for ep in self.endpoints.values():
                tep = ep._tep
                if tep is not None and tep not in streams and tep.duplex and tep.held is None \
                        and ep.failed is None and getattr(tep, "lend_stream", None) is not None \
                        and tep.owner_ep is ep:
                    streams[tep] = None
        if not streams:
            return
        for tep, s in list(streams.items()):
            if tep.stream_lent:
                continue
            fd = tep.stream_in()
            if fd < 0:
                if not tep.can_send():
                    self._stream_drop(tep)      # (gone: closed or failed)
                continue
            if s is None:
                s = _dp.Stream(fd, tep.owner_ep.remote_id, TAG_EAGER, tep.native_max_frame,
                               AM_EAGER)
                self.dp.add_stream(s)
                self._streams[tep] = s
            tep.lend_stream(s)
        self._sync_py_poll()

    def _stream_drop(self, tep) -> None:
        """``tep``'s reading is Python's for good (held, failed, gone)."""
        s = self._streams.pop(tep, None)
        if s is None:
            return
        if tep.stream_lent:
            tep.unlend_stream()
        data = s.take()
        if data:                         # (delivered by the transport's next pass)
            tep.stream_spill(data, False)
        s.out_open = False
        s.dead = True                    # (libucp's senders ask for another)
        self.dp.remove_stream(s)
        self._sync_py_poll()

    def progress_all(self) -> int:
        """:meth:`progress` with every interface polled, those that carry no
        endpoint yet too (a C caller's timer pass: libucp's progress runs
        ours about once a millisecond while the data plane has the rest)."""
        n = self.progress()
        for fn in self._cold:
            n += fn()
        return n

    def _sync_py_poll(self) -> None:
        """Tell the data plane how much of our progress it cannot do: the
        interfaces with endpoints other than those whose inbox it reads, and
        the layers' callbacks (libucp's progress runs ours on every call
        while there are any).  An interface with ``c_idle()`` counts only
        while that is false; it calls this again when that changes (self's
        queue: empty, or not)."""
        dp = self.dp
        if dp is None:
            return
        native = [i.progress for i in self.ifaces if getattr(i, "native", None) is not None
                  or (self._streams and getattr(i, "c_quiet", None) is not None and i.c_quiet())
                  or (getattr(i, "c_idle", None) is not None and i.c_idle())]
        dp.py_poll = sum(1 for fn in self._hot if fn not in native) + len(self._callbacks)

    def add_progress_callback(self, cb: Callable[[], int]) -> None:
        """Run ``cb()`` at the end of every :meth:`progress` (UCS's callback
        queue): layers above the core advance their own state machines from
        it.  ``cb`` returns the number of events it handled (0 when idle),
        which :meth:`wait_until` uses to decide between spinning and sleeping."""
        if cb not in self._callbacks:
            self._callbacks.append(cb)
            self._sync_py_poll()

    def when(self, predicate: Callable[[], bool]) -> Request:
        """A request that this worker's progress completes once
        ``predicate()`` is true (or fails with what it raises): the
        non-blocking form of :meth:`wait_until`, for a caller that must not
        wait inside the call (libucp's ``ucp_ep_flush_nbx``, whose peer may
        be another worker of this process, progressed by another thread).
        Done at once when the predicate already holds."""
        req = Request(self)
        if self._settled(req, predicate):
            return req
        if not self._whens:
            self.add_progress_callback(self._when_pass)
        self._whens.append((req, predicate))
        return req

    @staticmethod
    def _settled(req: Request, predicate) -> bool:
        """Complete ``req`` if ``predicate()`` holds, or fail it with what
        the predicate raises; whether it did either."""
        try:
            if not predicate():
                return False
        except BaseException as e:      # noqa: BLE001 - the request carries it
            req.complete(exc=e)
            return True
        req.complete()
        return True

    def _when_pass(self) -> int:
        # (a completion's callback may call when(): those join what is left)
        pending, self._whens = self._whens, []
        left = [(req, p) for req, p in pending if not self._settled(req, p)]
        self._whens = left + self._whens
        if not self._whens:
            self.remove_progress_callback(self._when_pass)
        return len(pending) - len(left)

    def flush_nb(self) -> Request:
        """A request done once every endpoint's sends have left and its RMA
        completed (:meth:`flush`'s condition), completed by progress."""
        return self.when(lambda: all(ep.flushed() for ep in list(self.endpoints.values())
                                     if ep.failed is None and not ep.closed))

    def remove_progress_callback(self, cb: Callable[[], int]) -> None:
        """Stop calling ``cb`` from :meth:`progress` (no error if absent)."""
        # a new list, not the one a progress pass may be iterating (a
        # callback that removes itself: Worker.when's)
        self._callbacks = [c for c in self._callbacks if c != cb]
        self._sync_py_poll()

    def _fail_closed_peers(self) -> int:
        """Fail the endpoints whose grace (see conn_failed) is over, unless a
        connection from the peer turned up meanwhile."""
        now, n = time.monotonic(), 0
        for ep, (tep, deadline) in list(self._holding.items()):
            if now >= deadline:
                del self._holding[ep]
                tep.held = None
                ep.fail(ConnectionLost(
                    f"worker {ep.remote_id} moved to our connection but its own never "
                    f"delivered the move within {self.config.peer_timeout} s",
                    peer=ep.remote_id))
                n += 1
        for ep, (deadline, tick, exc) in list(self._failing.items()):
            if ep.incoming or ep.failed is not None:
                del self._failing[ep]
            elif now >= deadline and self._tick >= tick:
                del self._failing[ep]
                ep.fail(exc)
                n += 1
        return n

    def _mark_hot(self, iface) -> None:
        """``iface`` now carries an endpoint: progress it on every call."""
        fn = iface.progress
        if fn in self._cold:
            self._cold.remove(fn)
            self._hot.append(fn)
            self._sync_py_poll()

    def wait_until(self, cond: Callable[[], bool], timeout: Optional[float] = None,
                   what="operation", lock=None,
                   fast: Optional[Callable[[], bool]] = None,
                   max_nap: Optional[float] = None, on_events: bool = False) -> None:
        """Progress until ``cond()`` is true.  Spins for ``UCXPY_BUSY_POLL``
        seconds, then sleeps on the transports' file descriptors (and the
        wake sources, :meth:`add_wake_source`) with growing naps so
        oversubscribed ranks leave the CPU to each other: up to
        ``MAX_NAP``, or ``OVERSUBSCRIBED_MAX_NAP`` with more ranks
        than CPUs and no other thread.  ``cond`` must therefore become true
        only through what wakes the sleeper: a message, or a ring of a wake
        source; a condition on memory another process writes without ringing
        passes a short ``max_nap``.

        ``lock`` (a layer's library lock, e.g. mpi_shim's THREAD_MULTIPLE
        lock, not held by the caller) is taken around each progress pass
        while other threads are alive, and released between passes.

        ``fast`` (from :meth:`recv_poller`) is tried before each progress
        pass of a single-threaded wait; True means it completed the wait.

        ``on_events``: ``cond`` changes only when a progress pass handles
        something (a request completes), and costs enough to spare (a scan
        of many requests): a single-threaded wait then tests it after such
        passes and once per burst of passes, not after every pass."""
        if lock is not None and threads_alive() > 1:
            with lock:              # (what cond reads, other threads change under it)
                if cond():
                    return
        elif cond():
            return
        if self.tr is not None:
            return self._wait_traced(cond, timeout, str(what), lock, max_nap, on_events)
        self._wait_loop(cond, timeout, what, lock, fast, max_nap, on_events)

    def _wait_loop(self, cond, timeout, what, shared=None, fast=None, max_nap=None,
                   on_events=False) -> None:
        if self.progress_error is not None:
            self.check_peers()             # raises: the progress thread is gone
        deadline = deadline_of(timeout, self.config.timeout)
        progress = self.progress
        busy = self.config.busy_poll
        spin_until = time.monotonic() + busy
        nap = 20e-6
        share = self.oversubscribed()
        burst = OVERSUBSCRIBED_BURST if share else BURST
        # another thread may complete what we wait for without waking us
        # (its progress pass takes the wake-up): long naps only alone
        longest = OVERSUBSCRIBED_MAX_NAP if share and self.lock is None else MAX_NAP
        if max_nap is not None:
            longest = min(longest, max_nap)
        while True:
            # with one thread alive nobody else can want the lock, so this
            # pass polls without it; only a live thread can start another,
            # and this one is here: the count is exact
            lock = shared if shared is not None and threads_alive() > 1 else None
            if lock is None:
                for _ in range(burst):
                    if fast is not None and fast():
                        return
                    if progress():
                        if cond():
                            return
                        spin_until = 0.0
                    elif not on_events and cond():
                        return
                # (the pass above just looked, unless it waits on events
                # only: again only when a dead rank's requests failed)
                done = (self.check_peers() or on_events) and cond()
            else:
                with lock:
                    for _ in range(16):
                        if progress():
                            spin_until = 0.0
                        if cond():
                            return
                    done = self.check_peers() and cond()
            if done:
                return
            now = time.monotonic()
            if spin_until == 0.0:          # there was activity: spin on from now
                spin_until, nap = now + busy, 20e-6
            if now >= deadline:
                raise timeout_error(what, timeout if timeout else self.config.timeout)
            if now >= spin_until:
                self._idle_sleep(min(nap, max(deadline - now, 0)))
                nap = min(nap * 2, longest if threads_alive() == 1 else MAX_NAP)
            elif share:
                os.sched_yield()           # more ranks than CPUs: let the peer run
            elif lock is not None:
                time.sleep(0)              # let another thread take the lock

    _oversubscribed = None

    def oversubscribed(self) -> bool:
        """Whether this host runs more of the job's ranks than it has CPUs
        (``UCXPY_OVERSUBSCRIBED``; "auto" compares the launcher's local rank
        count with the CPUs this process may run on).  Waiting then makes one
        progress pass at a time and yields the CPU between them
        (``sched_yield``, ``OVERSUBSCRIBED_BURST``), so the rank that
        would make progress gets to run instead of waiting for the spinner's
        time slice to end.  Decided once the worker has joined a job; before
        that (or outside one) the answer is no."""
        v = self._oversubscribed
        if v is not None:
            return v
        mode, boot = self.config.oversubscribed, self.bootstrap
        if mode in ("y", "n"):
            v = mode == "y"
        elif boot is None:             # not (yet) part of a launched job
            return False
        else:
            v = getattr(boot, "local_size", 1) > usable_cpus()
        self._oversubscribed = v
        return v

    _local_ranks = None

    def set_local_ranks(self, n: int) -> None:
        """This host runs ``n`` ranks of the job (for a worker outside
        ucxpy's bootstraps, such as the torch backend's under torchrun):
        decides :meth:`oversubscribed` in "auto" mode, and :meth:`local_ranks`."""
        self._local_ranks = n
        if self.config.oversubscribed not in ("y", "n"):
            self._oversubscribed = n > usable_cpus()

    def local_ranks(self) -> int:
        """The job's ranks on this host, as far as known (1 outside a job):
        how many peers share a transport's receive queue (protocol
        thresholds)."""
        if self._local_ranks is not None:
            return self._local_ranks
        return max(1, getattr(self.bootstrap, "local_size", 1) or 1)

    def cpu_share(self) -> float:
        """The job's ranks on this host per CPU they share, at least 1: with
        more ranks than CPUs each runs about 1/cpu_share of the time, and a
        transport stretches what it does every so many seconds of wall time
        by this (shm's housekeeping)."""
        return max(1.0, self.local_ranks() / usable_cpus())

    def _wait_traced(self, cond, timeout, what, lock=None, max_nap=None,
                     on_events=False) -> None:
        """:meth:`wait_until` with its busy and sleeping time recorded."""
        t0, slept0 = time.perf_counter_ns(), self._slept_ns
        try:
            self._wait_loop(cond, timeout, what, lock, max_nap=max_nap, on_events=on_events)
        finally:
            self.tr.wait(t0, time.perf_counter_ns(), self._slept_ns - slept0, what)

    _slept_ns = 0

    def wait_for(self, req: Request, timeout: Optional[float] = None) -> None:
        poll = self.recv_poller(req)
        if poll is not None and poll():
            return                      # (the message was there: no wait loop)
        self.wait_until(lambda: req.done, timeout, req, fast=poll)

    def wait_all(self, reqs: list, timeout: Optional[float] = None) -> None:
        """Progress until every request of ``reqs`` is done (their errors are
        theirs: nothing is raised for them here).  With more ranks than CPUs,
        in one wait loop for them all: a wait's set-up per request, and the
        native receive poll it would try, cost more than they save when the
        ring's head is as often another peer's frame (an 8-rank all-to-all);
        else one after the other (:meth:`wait_for`: each receive first tries
        the native poll, which also completes those posted behind it)."""
        if not self.oversubscribed():
            for r in reqs:
                if not r.done:
                    self.wait_for(r, timeout)
            return
        i, n = 0, len(reqs)

        def cond() -> bool:
            nonlocal i
            while i < n and reqs[i].done:
                i += 1
            return i == n
        self.wait_until(cond, timeout, "requests")

    def recv_poller(self, req) -> Optional[Callable[[], bool]]:
        """The native poll for waiting on the posted receive ``req``
        (``UCXPY_FASTPATH``), or None where it does not apply.

        It applies with tracing and statistics off, no progress thread
        (which polls the same inbox or socket) and not with more ranks than
        CPUs (where the progress pass takes the frame as cheaply), to a
        receive posted in the data plane's matcher:

        * whose source's frames arrive in the inbox the data plane reads
          (shm; any source when that is the only such inbox): ``poll()``
          takes the eager messages waiting there in one C call that spins
          briefly on an empty inbox (the data plane matches and delivers
          them: native/dp/inbox.c) and says whether ``req`` completed;
        * from a source whose frames all arrive on one transport endpoint
          lending its socket (``stream_in``: tcp): ``poll()`` acts while
          ``req`` is the receive a message with exactly its tag would match
          (``first_for``); one C call then takes the next frame from the
          socket if it is that message, and ``req`` completes.

        Anything else stays for the wait's next progress pass, in order.  A
        wait passes ``poll`` to :meth:`wait_until`, which tries it before
        each progress pass."""
        if self.dp is None or self.tr is not None or self.lock is not None \
                or not isinstance(req, RecvRequest) or req.done or not req.handle:
            return None
        over = self._oversubscribed
        if over is None:
            over = self.oversubscribed()
        if over:
            return None
        src = req.source
        tep = None
        if src != ANY_SOURCE:
            tep = self._sole_incoming(src)
            if tep is None:
                return None
        poll = self._poll_native
        if poll is not None and (tep is None or tep.iface.native is not None):
            def poller() -> bool:
                poll(FAST_SPINS)
                return req.done
            return poller
        if tep is None or tep.stream_in is None or req.buf is None or self.config.proto_python:
            return None
        m, tag, buf, recv = self.matcher, req.tag, req.buf, self._stream_recv

        def socket_poller() -> bool:
            if req.done or m.first_for(src, tag) is not req:
                return req.done
            n, got = recv(tep, tag, FULL_MASK, buf, FAST_SPINS)
            if n < 0:
                return False
            m.remove(req)
            self.fast_recvs += 1
            req.complete(TagInfo(src, got, n))
            if got & m.notify_mask & ~req.mask:
                m.notify(req)
            return True
        return socket_poller

    def _stream_recv(self, tep, tag: int, mask: int, buf, spins: int) -> tuple:
        """The data plane's tcp eager path, receiver side: when ``tep`` lends
        its socket (``stream_in``), the next frame taken from it by one C
        call if it is a whole eager message with ``tag`` under ``mask`` that
        fits ``buf``: ``(n, its tag)``; n is -1 (no frame) or -2 (another
        frame first, left in order).  What was read and not taken goes back
        to the connection (``stream_spill``)."""
        fd = tep.stream_in()
        if fd < 0:
            return -1, 0
        if spins > tep.stream_spins:
            spins = tep.stream_spins
        try:
            n, got, spill = _dp.tcp_eager_recv(self.dp, fd, TAG_EAGER, tag, mask, buf, spins)
        except (OSError, MemoryError) as e:
            tep.stream_fail(e)
            return -1, 0
        if spill is not None:
            tep.stream_spill(spill, n < 0)
        return n, got

    def _sole_incoming(self, src: int):
        """The one transport endpoint all frames of worker ``src`` arrive on
        (its endpoint live), or None."""
        ep = self.endpoints.get(src)
        if ep is None or ep.failed is not None or len(ep.incoming) != 1:
            return None
        for tep in ep.incoming:
            return tep

    def _attach_native(self) -> None:
        """Let the data plane read the inbox of each interface that offers
        one (``native_ring``): its eager messages are then matched in C."""
        found = [i for i in self.ifaces if getattr(i, "native_ring", None)]
        for iface in found:
            iface.native = _dp.Inbox(self.matcher, iface.native_ring, TAG_EAGER)
            # the protocol table's "Python" entries (UCXPY_PROTO_PYTHON)
            iface.native.hand_sizes(self.config.proto_python)
            # the rendezvous the data plane runs: offers a libucp receive
            # takes, read whole (below the split floor), and the answers to
            # libucp's own offers (native/dp/rndv.c)
            iface.native.rndv(int(AmId.TAG_RTS), int(AmId.RNDV_ATS), iface.split_floor - 1)
            # active messages' eager frames, for handlers written in C (libucp's)
            iface.native.am(int(AmId.AM_EAGER))
        if len(found) == 1:
            self._poll_native = found[0].poll_native
        # what a native caller's progress polls to know ours has work
        self.dp.poll_fds = [fd for i in self.ifaces for fd in i.control_fds()]

    def _native_register(self, tep) -> None:
        """Frames of ``tep`` may now be matched in C (wired up, nothing held,
        its peer not failed): name its source to its interface's inbox."""
        native = tep.iface.native
        ep = tep.owner_ep
        if native is not None and tep.native_conn and tep.held is None and ep is not None \
                and ep.failed is None:
            native.add_conn(tep.native_conn, ep.remote_id)
            out = ep._tep
            native.set_lane(tep.native_conn, out.native_lane if out is not None else None)
        if self.lend_streams and getattr(tep, "lend_stream", None) is not None \
                and tep.held is None and ep is not None and ep.failed is None:
            self._streams.setdefault(tep, None)     # (lent at the end of a pass)

    @staticmethod
    def _native_forget(tep) -> None:
        """Frames of ``tep`` go through Python again (held, failed, gone)."""
        native = tep.iface.native
        if native is not None and tep.native_conn:
            native.forget_conn(tep.native_conn)
        owner = tep.iface.owner
        if getattr(owner, "_streams", None) and tep in owner._streams:
            owner._stream_drop(tep)

    def add_wake_source(self, source) -> None:
        """Sleep on ``source`` too (an object with ``fileno()`` and
        ``drain()``, such as a ``ucxpy.doorbell.Doorbell``): a waiting
        worker wakes when it becomes readable and drains it."""
        if source not in self._wake_sources:
            self._wake_sources.append(source)

    def wait_fds(self) -> list:
        """Arm every interface's wake-up (``Interface.wait_fds``) and return
        the descriptors that become readable once this worker has work: the
        interfaces', the tcp connections read in C, the wake sources.  What
        a waiting worker sleeps on, and what :meth:`arm` hands a C caller."""
        fds = [fd for i in self.ifaces for fd in i.wait_fds()]
        if self._streams:               # (the tcp connections read in C, whose sockets
            fds += [s.fd for s in self._streams.values()    # the interface no longer polls)
                    if s is not None and s.lent]
        fds += [src.fileno() for src in self._wake_sources]
        return fds

    def arm(self) -> list | None:
        """Prepare to sleep outside this worker (UCP's ``ucp_worker_arm``,
        for a caller polling the worker's event descriptor): the descriptors
        of :meth:`wait_fds`, armed, or None when the worker has work now (a
        wake source rang, or a descriptor is readable already): progress
        first, then arm again."""
        if any([src.drain() for src in self._wake_sources]):
            return None
        fds = self.wait_fds()
        if fds and select.select(fds, (), (), 0)[0]:
            return None
        return fds

    def _idle_sleep(self, seconds: float) -> None:
        t0 = time.perf_counter_ns()
        if self.proto_c and self.dp.proto_owed:
            seconds = 0                 # (a plug-in's C half waits for room in a ring)
        fds = self.wait_fds()
        if fds:
            select.select(fds, (), (), seconds)
            for src in self._wake_sources:
                src.drain()
        else:
            time.sleep(seconds)
        dt = time.perf_counter_ns() - t0
        self._slept_ns += dt
        tr = self.tr
        if tr is not None and tr.events is not None:
            tr.event("progress", "sleep", "", dur=dt, ts=t0)

    #: what killed the background progress thread (see check_peers)
    progress_error = None

    def check_peers(self) -> bool:
        """Ask the launcher whether a rank died; fail what depends on it
        (True when it did: requests may have completed).  Raises
        ProgressThreadError once the background progress thread has died:
        whoever waits on it would wait forever."""
        if self.progress_error is not None:
            raise ProgressThreadError(
                f"worker {self.id}: the progress thread died: {self.progress_error!r}"
            ) from self.progress_error
        boot = self.bootstrap
        if boot is None:
            return False
        try:
            boot.check_failures()
        except PeerFailure as e:
            ep = self.endpoints.get(e.peer)
            if ep is not None:
                ep.fail(e)
            self._fail_wildcards(e)
            return True
        return False

    def start_progress_thread(self) -> None:
        """Progress this worker from a background thread (see
        :mod:`ucxpy.progress_thread`); public methods become serialized."""
        if self._progress_thread is not None:
            return
        self.lock = threading.RLock()
        make_thread_safe(self, WORKER_API, self.lock)
        for ep in self.endpoints.values():
            make_thread_safe(ep, ENDPOINT_API, self.lock)
        self._progress_thread = ProgressThread(self)
        self._progress_thread.start()

    def stop_progress_thread(self) -> None:
        t, self._progress_thread = self._progress_thread, None
        if t is not None:
            t.stop()

    # -- wire-up -------------------------------------------------------------
    def connect(self, address) -> Endpoint:
        """Endpoint to the worker at ``address`` (bytes or WorkerAddress).
        Connecting twice to the same worker returns the same endpoint."""
        if not isinstance(address, WorkerAddress):
            address = WorkerAddress.unpack(address)
        ep = self._by_uuid.get(address.uuid)
        if ep is not None and not ep.closed:
            return ep
        ep = self._new_endpoint(address)
        return ep

    def _local_id(self, address) -> int:
        """The id this worker uses for the peer at ``address``: its worker id,
        unless a live endpoint of another worker already has that id (workers
        of different jobs number themselves alike: a spawned child's rank 0
        and its parent's rank 0); then a local alias above ``ALIAS_BASE``.
        The id is the peer's ``Endpoint.remote_id`` and the ``source`` of what
        it sends; a dead or closed endpoint with the id is replaced."""
        wid = address.worker_id
        cur = self.endpoints.get(wid)
        if cur is None or cur.remote.uuid == address.uuid or cur.closed or \
                cur.failed is not None:
            return wid
        self._aliases += 1
        return ALIAS_BASE + self._aliases

    def _new_endpoint(self, address) -> Endpoint:
        ep = Endpoint(self, address)
        ep.remote_id = self._local_id(address)
        if self.lock is not None:
            make_thread_safe(ep, ENDPOINT_API, self.lock)
        self.endpoints[ep.remote_id] = ep
        self._by_uuid[address.uuid] = ep
        return ep

    def _on_wireup(self, tep, header, payload):
        if header and header != wire.MOVED:
            raise ProtocolError(f"WIREUP with an unknown header {bytes(header[:8])!r}")
        addr = WorkerAddress.unpack(payload)
        ep = self._by_uuid.get(addr.uuid)
        if ep is None or ep.closed:
            ep = self._new_endpoint(addr)
        tep.owner_ep = ep
        ep.incoming.add(tep)
        self._mark_hot(tep.iface)
        tr = self.tr
        if tr is not None:
            tr.event("wireup", "wireup_accept", tep.iface.name, peer=ep.remote_id)
        if header:
            self._peer_moved(ep, tep)
            if tep.held is None:
                self._native_register(tep)
            return
        self._native_register(tep)
        own = ep._tep
        if own is not None and own is not tep and tep.duplex and own.duplex and \
                own.iface is tep.iface and self.uuid > addr.uuid and own.can_send() \
                and tep.can_send():
            ep._move_to(tep)       # both sides connected: the larger uuid moves

    def _peer_moved(self, ep, tep) -> None:
        """The peer now sends on ``tep`` (our own connection), having ended
        its frames on its own one with LANE_MOVE (``Endpoint._move_to``).
        Until that LANE_MOVE is read, what arrives on ``tep`` is held: it was
        sent after everything on the old connection."""
        if ep._move_seen:
            ep._move_seen = False
            return
        self._native_forget(tep)
        tep.held = []
        self._holding[ep] = (tep, time.monotonic() + self.config.peer_timeout)

    def _on_lane_move(self, tep, header, payload):
        """The peer's last frame on ``tep``: release what it sent since on
        the connection it moved to."""
        ep = tep.owner_ep
        ep.incoming.discard(tep)
        self._native_forget(tep)
        held = self._holding.pop(ep, None)
        if held is None:
            ep._move_seen = True
        else:
            self._release(held[0])

    def _release(self, tep) -> None:
        frames, tep.held = tep.held, None
        for f in frames:
            self.recv_frame(tep, *f)
        self._native_register(tep)

    def _on_close(self, tep, header, payload):
        ep = tep.owner_ep
        if ep is not None:
            ep.peer_closed = True

    # -- transport callbacks (TransportOwner) ----------------------------------
    def recv_frame(self, tep, am_id, header, payload):
        held = tep.held
        if held is not None:            # (a payload read into its destination stays there)
            held.append((am_id, bytes(header),
                         payload if am_id in self.direct_am_ids else bytes(payload)))
            return
        h = self._handlers[am_id]
        try:
            if h is None:
                raise ProtocolError(f"frame with unknown active-message id {am_id}")
            ep = tep.owner_ep
            if ep is None:
                if am_id != AmId.WIREUP:
                    raise ProtocolError(f"frame {am_id} before wire-up")
            elif ep.failed is not None:
                return      # late frames of a peer already declared failed: nothing waits
            h(tep, header, payload)
        except (ProtocolError, struct.error, ValueError, UnicodeDecodeError) as e:
            self._bad_frame(tep, e)
        except ConnectionLost:
            # A handler's reply (RMA ack, RTR, data) found the way back to the
            # peer broken: conn_failed reports that; progress() must not raise.
            pass

    @property
    def native_consumes(self) -> bool:
        """May an interface's ``native`` consumer (the data plane) take
        frames?  Not while anything records arrivals (tracing, statistics)."""
        return self.tr is None

    def recv_dest(self, tep, am_id, header, length):
        try:
            if am_id == AmId.RNDV_DATA:
                return self.rndv.data_dest(header, length)
            if am_id == AmId.RMA_PUT:
                return self.rma.put_dest(header, length)
            if am_id == AmId.RMA_GET_REP:
                return self.rma.reply_dest(header, length)
        except struct.error:
            pass            # recv_frame reports the malformed header
        return None

    def conn_failed(self, tep, exc):
        """A transport connection died.  While the peer's incoming connection
        still delivers, nothing fails yet: a peer that finished and closed may
        have replies (ATS, RMA acks, data) in flight to us, and sending on the
        dead direction raises by itself.  When no incoming connection remains,
        the endpoint fails after a short grace (``CLOSE_GRACE`` and two full
        progress passes): a peer that sent on a brand-new connection and then
        left may have that connection still waiting to be accepted, and what
        it carries must be delivered, not dropped."""
        ep = tep.owner_ep
        if ep is None:
            return
        if isinstance(exc, ConnectionLost) and exc.peer is None:
            exc.peer = ep.remote_id
        ep.incoming.discard(tep)
        self._native_forget(tep)
        held = self._holding.get(ep)
        if held is not None and held[0] is not tep:
            del self._holding[ep]       # the old connection died before its LANE_MOVE
            self._release(held[0])
        if ep.incoming or ep.failed is not None or ep in self._failing:
            return
        if ep.peer_closed:
            exc = ConnectionLost(f"worker {ep.remote_id} closed its endpoint", peer=ep.remote_id)
        self._failing[ep] = (time.monotonic() + CLOSE_GRACE, self._tick + 2 * COLD_EVERY, exc)

    def _bad_frame(self, tep, e):
        exc = e if isinstance(e, ProtocolError) else \
            ProtocolError(f"malformed frame: {type(e).__name__}: {e}")
        try:
            tep.close()
        finally:
            self.conn_failed(tep, exc)

    def _endpoint_failed(self, ep, exc):
        for tep in ep.incoming:
            self._native_forget(tep)
        self.rndv.fail_peer(ep, exc)
        self.rma.fail_peer(ep, exc)
        if self.protocol is not None:
            self.protocol.fail_peer(ep, exc)
        for req in self.matcher.requests_from(ep.remote_id):
            self.matcher.remove(req)
            req.complete(exc=exc)

    def _fail_wildcards(self, exc):
        for req in self.matcher.requests_from(ANY_SOURCE):
            self.matcher.remove(req)
            req.complete(exc=exc)

    def _endpoint_closed(self, ep):
        if self.endpoints.get(ep.remote_id) is ep:
            del self.endpoints[ep.remote_id]
        if self._by_uuid.get(ep.remote.uuid) is ep:
            del self._by_uuid[ep.remote.uuid]

    # -- tagged messages -------------------------------------------------------
    def _on_tag_eager(self, tep, header, payload):
        (tag,) = wire.EAGER.unpack(header)
        src = tep.owner_ep.remote_id
        req = self.matcher.match_posted(src, tag)
        if req is None:
            m = UnexpectedMessage(src, tag, len(payload), self._payloads.copy(payload))
            self.matcher.queue_unexpected(m)
            if self.tr is not None:
                self.tr.arrive(tep, "tag", src, tag, len(payload), False, m)
            return
        if self.tr is not None:
            self.tr.arrive(tep, "tag", src, tag, len(payload), True)
        if tag & self.matcher.notify_mask & ~req.mask:
            req.add_done_callback(self.matcher.notify)
        n = len(payload)
        if n <= req.capacity and req.buf is not None:   # deliver_eager's common case, inlined
            if n:
                req.buf[:n] = payload
            req.complete(TagInfo(src, tag, n))
        else:
            deliver_eager(req, src, tag, payload)

    def _on_tag_rts(self, tep, header, payload):
        n = wire.RTS.size
        tag, sreq_id, size, raddr = wire.RTS.unpack(header[:n])
        rts = RtsInfo(tep, sreq_id, size, raddr, bytes(header[n:]))
        src = tep.owner_ep.remote_id
        req = self.matcher.match_posted(src, tag)
        if req is None:
            m = UnexpectedMessage(src, tag, size, rts=rts)
            self.matcher.queue_unexpected(m)
            if self.tr is not None:
                self.tr.arrive(tep, "tag", src, tag, size, False, m, rts)
        else:
            if self.tr is not None:
                self.tr.arrive(tep, "tag", src, tag, size, True, None, rts)
            if tag & self.matcher.notify_mask & ~req.mask:
                req.add_done_callback(self.matcher.notify)
            self._recv_rndv(req, src, tag, rts)

    def _on_plugin(self, tep, header, payload):
        if self.protocol is None or not header:
            raise ProtocolError("a protocol plug-in's frame, and no plug-in here "
                                "(UCXPY_PROTO_PLUGIN differs between the ranks)")
        if self.proto_c and self.dp.proto_frame(getattr(tep, "native_conn", 0) or 0,
                                                header, payload):
            return                      # (one of its C half's messages)
        self.protocol.on_frame(tep.owner_ep, header[0], header[1:], payload)

    def _plugin_offer(self, ep, tag, offer):
        """A protocol plug-in's offer of a tagged message arrived from ``ep``:
        matched in the one matcher as a rendezvous offer, or kept."""
        src = ep.remote_id
        req = self.matcher.match_posted(src, tag)
        if req is None:
            self.matcher.queue_unexpected(UnexpectedMessage(src, tag, offer.size, rts=offer))
            return
        if tag & self.matcher.notify_mask & ~req.mask:
            req.add_done_callback(self.matcher.notify)
        self._recv_rndv(req, src, tag, offer)

    def _recv_rndv(self, req, src, tag, rts):
        plugin = type(rts) is protocols.PluginOffer
        if rts.size > req.capacity:
            if plugin:
                rts.protocol.drop(rts)
            else:
                self.rndv.drop(rts)
            req.complete(exc=TruncationError(
                f"message of {rts.size} bytes from {src} (tag {tag:#x}) does not fit "
                f"in receive buffer of {req.capacity} bytes", rts.size, req.capacity))
            return
        if plugin:
            if req.buf is None:             # a receive of any size
                req.buf = bytearray(rts.size)
            rts.protocol.start_recv(req, rts, TagInfo(src, tag, rts.size))
            return
        if req.buf is None:                 # a receive of any size
            req.buf = bytearray(rts.size)
            self.rndv.start_recv(rts, memoryview(req.buf), req, TagInfo(src, tag, rts.size))
            return
        if self.tr is None and rts.rkey and self._get_and_ack(rts, req.buf):
            req.complete(TagInfo(src, tag, rts.size))
            return
        self.rndv.start_recv(rts, req.buf, req, TagInfo(src, tag, rts.size))

    def _get_and_ack(self, rts, buf) -> bool:
        """The data plane's shm rendezvous, receiver side: an offer the
        receiver reads whole (below its interface's ``split_floor``) read by
        CMA into ``buf`` and answered ATS(OK) on the peer's lane, in C.
        False with nothing done where it does not apply (no lane, a key of
        another kind, CMA refused): ``start_recv`` then does it all and
        reports."""
        owner = rts.tep.owner_ep
        out = owner._tep if owner is not None else None
        lane = out.native_lane if out is not None else None
        if lane is None or rts.size >= rts.tep.iface.split_floor:
            return False
        try:
            rc = lane.get_ack(self.dp, rts.rkey, rts.raddr, buf, rts.size, rts.sreq_id)
        except (TypeError, ValueError, BufferError):
            return False
        if rc < 0:
            return False
        if rc == 1:
            out.wake_peer()
        elif rc == 2:                       # read; the answer goes the Python way
            self.rndv._ack(owner, rts.sreq_id, wire.ATS_OK)
        return True

    def _deliver_unexpected(self, req, m: UnexpectedMessage):
        if self.tr is not None:
            self.tr.match_unexpected(m)
        if m.rts is None:
            data, m.data = m.data, None
            deliver_eager(req, m.source, m.tag, data)
            self._payloads.give(data)
        else:
            self._recv_rndv(req, m.source, m.tag, m.rts)

    @staticmethod
    def _source_id(source) -> int:
        if type(source) is int:
            return source
        if isinstance(source, Endpoint):
            return source.remote_id
        return ANY_SOURCE if source is None else int(source)

    def tag_recv_nb(self, buf, tag: int = 0, tag_mask: int = FULL_MASK,
                    source=ANY_SOURCE, request_class=None) -> Request:
        """Post a receive for a message whose tag matches ``tag`` under
        ``tag_mask`` from ``source`` (worker id, Endpoint or ANY_SOURCE).
        The request's result is a :class:`TagInfo`; a message larger than
        ``buf`` completes it with :class:`TruncationError`.

        ``request_class``: a subclass of :class:`~ucxpy.tag.RecvRequest`
        with slots of its own, which the caller fills once this returns (a
        layer above keeps its fields in the core's request, as UCP's
        ``request_size`` lets MPI libraries do: one object per receive).  It
        must complete through RecvRequest's ``complete``."""
        post_new = self._post_new
        if post_new is not None and self.tr is None:
            # the common case in one C call (the data plane's post_new: a
            # worker id, a plain byte buffer, a live source); else the lines below
            r = post_new(self, buf, tag, tag_mask, source, request_class or RecvRequest,
                         self._cancel_recv)
            if r is not None:
                return r if type(r) is not tuple else self._post_taken(*r)
        src = source if type(source) is int else self._source_id(source)
        return self._post((request_class or RecvRequest)(
            self, recv_view(buf), src, tag & FULL_MASK, tag_mask, self._cancel_recv))

    def _post_taken(self, req, m):
        """``post_new`` gave ``req`` the unexpected message ``m``, which the
        Python path delivers (a rendezvous offer, a message it handed over):
        ``req``, once that is under way."""
        if m.tag & self.matcher.notify_mask & ~req.mask:
            req.add_done_callback(self.matcher.notify)
        self._deliver_unexpected(req, m)
        return req

    def tag_recv_any_nb(self, tag: int = 0, tag_mask: int = FULL_MASK,
                        source=ANY_SOURCE) -> Request:
        """Like :meth:`tag_recv_nb`, for a message of any size: the request's
        ``buf`` becomes a bytearray of exactly the message's bytes when it
        matches; its result is the :class:`TagInfo`.  Ordered with every
        other receive (MPI's matching rules), without a probe."""
        src = source if type(source) is int else self._source_id(source)
        return self._post(RecvRequest(self, None, src, tag & FULL_MASK, tag_mask,
                                      self._cancel_recv))

    def _post(self, req):
        """Match a new receive with the unexpected queue, else post it."""
        src, tag, tag_mask = req.source, req.tag, req.mask
        if self.tr is not None:
            self.tr.recv_posted(src, tag, tag_mask, req.capacity)
        m = self.matcher.post(req)
        if m is not None:               # it arrived first (req is not posted)
            if m is True:               # (the data plane delivered it: req is done)
                return req
            if m.tag & self.matcher.notify_mask & ~tag_mask:
                req.add_done_callback(self.matcher.notify)
            self._deliver_unexpected(req, m)
            return req
        if src != ANY_SOURCE:
            ep = self.endpoints.get(src)
            if ep is not None and ep.failed is not None:
                self.matcher.remove(req)
                req.complete(exc=ep.failed)
        return req

    def _cancel_recv(self, req) -> bool:
        return self.matcher.remove(req)

    def tag_recv(self, buf, tag: int = 0, tag_mask: int = FULL_MASK, source=ANY_SOURCE,
                 timeout: Optional[float] = None) -> TagInfo:
        """Blocking :meth:`tag_recv_nb`; returns the :class:`TagInfo`.  On
        timeout the receive is cancelled before TimeoutError is raised.

        Tries :meth:`tag_try_recv` (the native fast path) first."""
        info = self.tag_try_recv(buf, tag, tag_mask, source)
        if info is not None:
            return info
        req = self.tag_recv_nb(buf, tag, tag_mask, source)
        if req.done:
            return req.wait()
        try:
            return req.wait(timeout)
        except UcxpyError:
            req.cancel()
            raise

    def tag_try_recv(self, buf, tag: int = 0, tag_mask: int = FULL_MASK,
                     source=ANY_SOURCE) -> Optional[TagInfo]:
        """Receive at once by the native fast path (``UCXPY_FASTPATH``), or
        return None having consumed nothing (then post the receive as usual).

        Applies when ``source`` is a worker id whose frames all arrive on one
        transport endpoint, of an interface whose inbox the data plane reads
        (shm: ``Inbox.try_recv``, native/dp/inbox.c) or lending its socket
        to the data plane's tcp eager path (tcp: ``stream_in``,
        native/dp/tcp.c), and nothing posted or queued could take the
        message instead (the matcher's ``idle_for``: no wildcard or masked
        receive posted, no exact one for this source and tag, none at all for
        a masked ``tag_mask``, an empty unexpected queue); and without
        tracing, statistics or a progress thread.  Then one C call spins
        briefly on the inbox or socket and, if the next frame is an eager
        message matching ``tag`` under ``tag_mask`` that fits ``buf``, copies
        it into ``buf`` and consumes it: no request, matcher or progress
        pass.  A buffer that is not writable and contiguous gives None."""
        if type(source) is not int or source < 0 or not self.config.fastpath \
                or self.tr is not None or self.lock is not None:
            return None
        tag &= FULL_MASK
        if not self.matcher.idle_for(source, tag, tag_mask):
            return None
        ep = self.endpoints.get(source)         # (_sole_incoming, inlined: the hottest receive)
        if ep is None or ep.failed is not None or len(ep.incoming) != 1:
            return None
        for tep in ep.incoming:
            break
        over = self._oversubscribed
        if over is None:
            over = self.oversubscribed()
        iface = tep.iface
        try:
            if iface.native is not None:
                if not iface.native_idle:
                    return None
                n, got = iface.native.try_recv(tep.native_conn, tag, tag_mask, buf,
                                               0 if over else FAST_SPINS)
                if n >= 0:
                    n = iface.native_flags(n)
            else:
                if tep.stream_in is None or self.config.proto_python:
                    return None
                n, got = self._stream_recv(tep, tag, tag_mask, buf, 0 if over else FAST_SPINS)
        except (TypeError, ValueError, BufferError):
            return None
        if n < 0:
            return None
        self.fast_recvs += 1
        return TagInfo(source, got, n)

    def tag_probe_nb(self, tag: int = 0, tag_mask: int = FULL_MASK, source=ANY_SOURCE,
                     remove: bool = False):
        """Progress once and look for a matching unexpected message.

        Returns None, a :class:`TagInfo` (``remove=False``) or a
        :class:`TagMessage` taken off the queue (``remove=True``, MPI's Mprobe)."""
        self.progress()
        m = self.matcher.find_unexpected(self._source_id(source), tag & FULL_MASK, tag_mask, remove)
        if m is None:
            return None
        return TagMessage(m) if remove else m.info

    def fail_receives(self, tag: int, tag_mask: int, exc: BaseException) -> int:
        """Complete every posted receive whose tag is ``tag`` under
        ``tag_mask`` with ``exc`` (e.g. a communicator was revoked); returns
        how many were failed."""
        reqs = self.matcher.requests_matching(tag & FULL_MASK, tag_mask)
        for req in reqs:
            self.matcher.remove(req)
            req.complete(exc=exc)
        return len(reqs)

    def tag_peek(self, tag: int = 0, tag_mask: int = FULL_MASK, source=ANY_SOURCE,
                 remove: bool = False):
        """Like :meth:`tag_probe_nb` without progressing: look at what has
        already arrived (oldest first).  Returns None, a :class:`TagInfo`, or
        with ``remove=True`` a :class:`TagMessage` taken off the queue."""
        if not self.matcher.unexpected_depth():
            return None
        m = self.matcher.find_unexpected(self._source_id(source), tag & FULL_MASK, tag_mask,
                                         remove)
        if m is None:
            return None
        return TagMessage(m) if remove else m.info

    def tag_probe(self, tag: int = 0, tag_mask: int = FULL_MASK, source=ANY_SOURCE,
                  remove: bool = False, timeout: Optional[float] = None):
        """Blocking probe: waits until a matching message is available."""
        src = self._source_id(source)
        found = []

        def cond():
            m = self.matcher.find_unexpected(src, tag & FULL_MASK, tag_mask, remove)
            if m is not None:
                found.append(m)
                return True
            if src != ANY_SOURCE:
                ep = self.endpoints.get(src)
                if ep is not None and ep.failed is not None:
                    raise ep.failed
            return False
        self.wait_until(cond, timeout, "tag_probe")
        return TagMessage(found[0]) if remove else found[0].info

    def tag_recv_message_nb(self, buf, message: TagMessage) -> Request:
        """Receive a message obtained from ``tag_probe(..., remove=True)``."""
        if message._msg is None:
            raise InvalidBuffer("this probed message was already received")
        m, message._msg = message._msg, None
        req = RecvRequest(self, recv_view(buf), m.source, m.tag, FULL_MASK, None)
        self._deliver_unexpected(req, m)
        return req

    # -- active messages ---------------------------------------------------------
    def set_am_handler(self, am_id: int, handler) -> None:
        """Run ``handler(msg: AmMessage)`` from progress for every active message
        sent to ``am_id`` (0..65535); ``None`` removes it.  Messages that arrived
        before registration are delivered now, in order.  See :mod:`ucxpy.am`."""
        self.am.set_handler(am_id, handler)

    # -- memory registration -------------------------------------------------------
    def mem_map(self, buf=None, length: int = 0, shared: bool = False,
                address: int = 0) -> MemHandle:
        """Register ``buf`` (any writable contiguous buffer), or allocate
        ``length`` bytes of registered shared memory that same-host peers map
        directly.  ``shared``: a shared segment even where the shm transport
        is not in use (for layers that map peers' memory themselves through
        :meth:`ucxpy.rma.RemoteKey.map`).  ``address``: the allocation is
        also mapped at exactly that free, page-aligned address, the region's
        address for peers (UCP's fixed-address allocation).  See :mod:`ucxpy.rma`."""
        return self.rma.mem_map(buf, length, shared, address)

    # -- teardown --------------------------------------------------------------
    def flush(self, timeout: Optional[float] = None) -> None:
        """Wait until every send of every endpoint has left."""
        for ep in list(self.endpoints.values()):
            if ep.failed is None and not ep.closed:
                ep.flush(timeout)

    def stats(self) -> dict:
        """Counters of this worker (see :mod:`ucxpy.trace`): messages and
        bytes per protocol overall (``worker``), per peer (``endpoints``) and
        per transport (``transports``), rendezvous variants and fallbacks,
        the unexpected-queue high-water mark, busy-poll and sleep time.
        Counting is on with ``UCXPY_STATS=y`` or ``UCXPY_TRACE``; otherwise
        only the current state is reported and ``enabled`` is False.  ``dp``
        holds what the native data plane executed (always counted, in C)."""
        if self.tr is not None:
            return self.tr.stats()
        return {"enabled": False,
                "worker": {"unexpected.depth": self.matcher.unexpected_depth(),
                           "rndv.sends_in_flight": len(self.rndv.sends),
                           "rndv.recvs_in_flight": len(self.rndv.recvs),
                           "time.sleep_ns": self._slept_ns},
                "endpoints": {}, "transports": {},
                "dp": self.dp.counters() if self.dp is not None else {}}

    def close(self) -> None:
        """Close endpoints gracefully, then the transports (idempotent)."""
        if self.closed:
            return
        self.stop_progress_thread()
        self.closed = True
        self._failing.clear()
        self._holding.clear()
        for ep in list(self.endpoints.values()):
            try:
                ep.close(timeout=5.0)
            except UcxpyError:
                ep.abort()
        self.rma.close()
        for iface in self.ifaces:
            iface.close()
        if self.tr is not None:
            self.tr.finish()

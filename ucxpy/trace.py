"""Protocol event tracing and UCX-style statistics.

Theory of operation
-------------------
A worker has a :class:`Recorder` in ``worker.tr`` when ``UCXPY_TRACE=DIR``
or ``UCXPY_STATS=y`` is set, else ``worker.tr is None``.  Every hook in the
core is one ``if tr is not None:`` check, so with both off (the default) the
hot paths pay one attribute load and compare per event site, nothing else.

When on, the recorder

* counts messages and bytes per protocol, per peer and per lane (transport),
  rendezvous variants and fallbacks, the unexpected-queue high-water mark and
  the time blocking calls spent busy-polling versus sleeping
  (:meth:`ucxpy.Worker.stats`; printed at exit with ``UCXPY_STATS=y``);
* with tracing, appends events ``(ts_ns, dur_ns, cat, name, lane, args)`` to
  a ring buffer of ``UCXPY_TRACE_EVENTS`` entries (the oldest are dropped and
  counted), timestamps from :func:`time.perf_counter_ns`.

Messages are linked across ranks by a key ``"src>dst:kind:seq"``: the sender
numbers what it sends to each peer, the receiver numbers what arrives from
each peer; transports deliver a peer's frames in order, so both count alike.
``ucxpy-trace merge`` turns the events that share a key into a flow.

Files: ``DIR/trace.<rank>.jsonl`` (a header line with rank, pid, host and the
clock offset to rank 0, then one JSON object per event), written when the
worker closes, at interpreter exit and on ``SIGUSR1`` (a snapshot).

Layers above the core (mpi_shim, shmem) add their own events through
:func:`span`, :func:`mark`, :func:`begin` / :func:`end`.
"""
from __future__ import annotations

import atexit
import collections
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
import weakref

from .wire import AmId

now = time.perf_counter_ns

#: tags whose top byte is 0xFF belong to ucxpy's own collectives (see ucxpy.tag)
_RESERVED = 0xFF << 56

_live = weakref.WeakSet()          # recorders that still have something to write
_hooks_installed = False
_files_lock = threading.Lock()
_file_seq = 0


def _install_process_hooks() -> None:
    """atexit and SIGUSR1 (main thread only, and only if nobody else has it)."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_dump_all, True)
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
                signal.signal(signal.SIGUSR1, lambda signum, frame: _dump_all(False))
        except (ValueError, OSError):   # not supported here: no snapshot on signal
            pass


def _dump_all(at_exit: bool) -> None:
    for rec in list(_live):
        try:
            rec.finish() if at_exit else rec.dump()
        except Exception as e:      # never let a trace write break the program's exit
            print(f"ucxpy: cannot write trace: {e}", file=sys.stderr)


class Recorder:
    """Counters and (optionally) the event ring of one worker."""

    def __init__(self, worker, config):
        self.worker = worker
        self.dir = config.trace or ""
        self.print_stats = bool(config.stats)
        self.tracing = bool(self.dir)
        self.events = collections.deque(maxlen=max(1, config.trace_events)) \
            if self.tracing else None
        self.recorded = 0
        self.rank = None                 # set by ucxpy.World: names the file
        self.size = None
        self.clock_offset_ns = 0         # add to local timestamps to get rank 0's clock
        self.clock_rtt_ns = None
        self.start_ns = now()
        self.totals = collections.Counter()
        self.per_peer = collections.defaultdict(collections.Counter)
        self.per_lane = collections.defaultdict(collections.Counter)
        self.unexpected_hwm = 0
        self._tx_seq = collections.Counter()     # (peer, kind) -> messages sent
        self._rx_seq = collections.Counter()     # (peer, kind) -> messages arrived
        self._unexp_keys = {}                    # id(UnexpectedMessage) -> key
        self._sends = {}                         # rndv sreq id -> key
        self._recvs = {}                         # rndv rreq id -> key
        self._rts_keys = {}                      # id(RtsInfo) -> key, until matched
        self._finished = False
        self._path = None
        if self.tracing:
            os.makedirs(self.dir, exist_ok=True)
        _live.add(self)
        _install_process_hooks()

    # -- recording -------------------------------------------------------------
    def event(self, cat, name, lane="", dur=0, ts=None, **args) -> None:
        """Append one event (``ts`` defaults to now, in ns)."""
        if self.events is not None:
            self.events.append((now() if ts is None else ts, dur, cat, name, lane, args))
            self.recorded += 1

    def count(self, key, nbytes=0, peer=None, lane=None) -> None:
        """``key.msgs += 1`` and ``key.bytes += nbytes`` overall, per peer, per lane."""
        msgs, size = key + ".msgs", key + ".bytes"
        c = self.totals
        c[msgs] += 1
        c[size] += nbytes
        if peer is not None:
            c = self.per_peer[peer]
            c[msgs] += 1
            c[size] += nbytes
        if lane is not None:
            c = self.per_lane[lane]
            c[msgs] += 1
            c[size] += nbytes

    # -- core hooks (each called from one `if tr is not None:` site) -----------
    def send(self, ep, eager_id, proto, nbytes, tag, sreq_id=None) -> None:
        """A tag (``eager_id`` TAG_EAGER) or active message (``tag`` = AM id)
        is being sent to ``ep`` by protocol ``proto``."""
        kind = "tag" if eager_id == AmId.TAG_EAGER else "am"
        peer = ep.remote_id
        lane = ep.lane.name if ep.lane is not None else "?"
        self._tx_seq[peer, kind] += 1
        key = f"{self.worker.id}>{peer}:{kind}:{self._tx_seq[peer, kind]}"
        self.count(f"tx.{kind}.{proto}", nbytes, peer, lane)
        if sreq_id is not None:
            self._sends[sreq_id] = key
        if self.events is not None:
            self.event("send", f"{kind}_send", lane, peer=peer, proto=proto, size=nbytes,
                       tag=tag, msg=key)

    def arrive(self, tep, kind, src, tag, nbytes, matched, m=None, rts=None) -> str:
        """A tag or AM message (eager, or the RTS ``rts``) arrived from ``src``;
        ``m``: the unexpected-queue entry it became."""
        self._rx_seq[src, kind] += 1
        key = f"{src}>{self.worker.id}:{kind}:{self._rx_seq[src, kind]}"
        rndv = rts is not None
        if rndv:
            self._rts_keys[id(rts)] = key
        lane = tep.iface.name
        self.count(f"rx.{kind}.{'rndv' if rndv else 'eager'}", nbytes, src, lane)
        if m is not None:          # into the unexpected queue
            self._unexp_keys[id(m)] = key
            depth = self.worker.matcher.unexpected_depth()
            if depth > self.unexpected_hwm:
                self.unexpected_hwm = depth
            self.totals["unexpected.msgs"] += 1
        if self.events is not None:
            self.event("recv", "rts" if rndv else "arrive", lane, peer=src, tag=tag,
                       size=nbytes, msg=key, expected=matched)
            if matched and kind == "tag":
                self.event("recv", "match", lane, peer=src, tag=tag, size=nbytes, msg=key,
                           queue="expected")
        return key

    def match_unexpected(self, m) -> None:
        key = self._unexp_keys.pop(id(m), None)
        self.totals["match.unexpected"] += 1
        if self.events is not None:
            self.event("recv", "match", "", peer=m.source, tag=m.tag, size=m.length, msg=key,
                       queue="unexpected")

    def recv_posted(self, source, tag, mask, capacity) -> None:
        self.totals["tag_recv.posted"] += 1
        if self.events is not None:
            self.event("recv", "recv_posted", "", peer=source, tag=tag,
                       mask=f"{mask:#x}", capacity=capacity)

    def rndv_recv(self, rts, rreq_id, variant, nbytes) -> None:
        """The receiver chose how to move a matched rendezvous."""
        lane = rts.tep.iface.name
        self.count(f"rndv.{variant}", nbytes, rts.tep.owner_ep.remote_id, lane)
        if self.events is not None:
            key = self._recvs[rreq_id] = self._rts_keys.pop(id(rts), None)
            self.event("rndv", f"rndv_{variant}", lane, size=nbytes, msg=key,
                       peer=rts.tep.owner_ep.remote_id)

    def rndv(self, name, lane, sreq_id=None, rreq_id=None, **args) -> None:
        """A rendezvous control frame / chunk on either side."""
        if name == "fallback":
            self.totals["rndv.fallback"] += 1
        if self.events is not None:
            key = self._sends.get(sreq_id) if sreq_id is not None else self._recvs.get(rreq_id)
            self.event("rndv", name, lane, msg=key, **args)

    def rndv_done(self, sreq_id=None, rreq_id=None) -> None:
        key = self._sends.pop(sreq_id, None) if sreq_id is not None else \
            self._recvs.pop(rreq_id, None)
        if self.events is not None:
            self.event("rndv", "send_done" if sreq_id is not None else "recv_done", "",
                       msg=key)

    def rma(self, op, ep, nbytes, mode) -> None:
        lane = ep.lane.name if ep.lane is not None else mode
        self.count(f"rma.{op}", nbytes, ep.remote_id, lane)
        self.totals[f"rma.mode.{mode}"] += 1
        if self.events is not None:
            self.event("rma", op, lane, peer=ep.remote_id, size=nbytes, mode=mode)

    def wait(self, t0, t1, slept, what) -> None:
        self.totals["time.wait_ns"] += t1 - t0
        self.totals["time.sleep_ns"] += slept
        self.totals["time.busy_ns"] += t1 - t0 - slept
        if self.events is not None:
            self.event("wait", "wait", "", dur=t1 - t0, ts=t0, what=what, slept_ns=slept)

    # -- statistics ------------------------------------------------------------
    def stats(self) -> dict:
        t = dict(self.totals)
        t["unexpected.hwm"] = self.unexpected_hwm
        dp = self.worker.dp
        return {"enabled": True, "worker": t,
                "endpoints": {p: dict(c) for p, c in sorted(self.per_peer.items())},
                "transports": {l: dict(c) for l, c in sorted(self.per_lane.items())},
                "dp": dp.counters() if dp is not None else {},
                "trace": {"dir": self.dir, "recorded": self.recorded,
                          "kept": len(self.events) if self.events is not None else 0}}

    def format_stats(self) -> str:
        s = self.stats()
        who = f"rank {self.rank}" if self.rank is not None else f"worker {self.worker.id}"
        lines = [f"ucxpy stats [{who} pid {os.getpid()}]"]
        for section in ("worker", "endpoints", "transports", "dp"):
            items = s[section]
            if section in ("worker", "dp"):
                lines += [f"  {k} = {v}" for k, v in sorted(items.items())]
                continue
            for name, c in items.items():
                lines.append(f"  {section[:-1]} {name}:")
                lines += [f"    {k} = {v}" for k, v in sorted(c.items())]
        return "\n".join(lines)

    # -- output ----------------------------------------------------------------
    def path(self) -> str:
        global _file_seq
        if self._path is None:
            if self.rank is not None:
                name = f"trace.{self.rank}.jsonl"
            else:
                with _files_lock:
                    _file_seq += 1
                    name = f"trace.pid{os.getpid()}.{_file_seq}.jsonl"
            self._path = os.path.join(self.dir, name)
        return self._path

    def header(self) -> dict:
        return {"type": "header", "format": 1, "rank": self.rank, "size": self.size,
                "worker_id": self.worker.id, "pid": os.getpid(), "host": socket.gethostname(),
                "clock": "perf_counter_ns", "clock_offset_ns": self.clock_offset_ns,
                "clock_rtt_ns": self.clock_rtt_ns, "start_ns": self.start_ns,
                "recorded": self.recorded, "kept": len(self.events or ()),
                "dropped": self.recorded - len(self.events or ()),
                "stats": self.stats()}

    def dump(self) -> None:
        """Write the header and every kept event (replaces an earlier dump)."""
        if not self.tracing:
            return
        path = self.path()
        tmp = f"{path}.tmp{os.getpid()}"
        for _ in range(100):         # a progress thread may append meanwhile
            try:
                events = list(self.events)
                break
            except RuntimeError:
                continue
        else:
            raise RuntimeError("trace ring kept changing while being written")
        with open(tmp, "w") as f:
            f.write(json.dumps(self.header()) + "\n")
            for ts, dur, cat, name, lane, args in events:
                rec = {"ts": ts, "cat": cat, "name": name}
                if dur:
                    rec["dur"] = dur
                if lane:
                    rec["lane"] = lane
                if args:
                    rec["args"] = args
                f.write(json.dumps(rec, default=str) + "\n")
        os.replace(tmp, path)

    def finish(self) -> None:
        """Worker close / exit: final dump and statistics (once)."""
        if self._finished:
            return
        self._finished = True
        _live.discard(self)
        self.dump()
        if self.print_stats:
            print(self.format_stats(), file=sys.stderr, flush=True)


#: what the counters of :meth:`ucxpy.Worker.stats` mean (``ucxpy-info -s``)
COUNTERS = (
    ("tx.<tag|am>.<proto>.msgs/.bytes", "messages sent per protocol: eager_short (copied "
     "at send), eager_copy, rndv"),
    ("rx.<tag|am>.<eager|rndv>.msgs/.bytes", "messages (eager frames, RTS) arrived"),
    ("rndv.<get|split|rtr>.msgs/.bytes", "rendezvous variant the receiver chose"),
    ("rndv.data_tx.msgs/.bytes", "rendezvous ranges the sender streamed as data frames"),
    ("rndv.fallback", "one-sided rendezvous copies refused, sent as frames instead"),
    ("rma.<put|get|atomic_op>.msgs/.bytes", "RMA operations issued"),
    ("rma.mode.<mapped|cma|rdma|am>", "RMA operations issued per access mode of the "
     "remote key (direct loads/stores of layers above, e.g. shmem's MAPPED heap, are "
     "not RMA operations and are not counted)"),
    ("tag_recv.posted", "tagged receives posted"),
    ("unexpected.msgs / unexpected.hwm", "arrivals that found no receive / queue depth "
     "high-water mark"),
    ("match.unexpected", "receives matched from the unexpected queue"),
    ("time.wait_ns / busy_ns / sleep_ns", "time in blocking waits: busy-polling vs "
     "sleeping on file descriptors"),
    ("peer.failures", "endpoints failed (peer died or connection lost)"),
)


def discard(rec: "Recorder") -> None:
    """Forget ``rec`` without writing it (a worker's counting for a moment,
    as ``ucxpy-info -s``'s self-test does)."""
    rec._finished = True
    _live.discard(rec)


# -- public API for layers above the core -------------------------------------------

def recorder(worker):
    """The worker's recorder if it traces events, else None."""
    tr = getattr(worker, "tr", None)
    return tr if tr is not None and tr.events is not None else None


class _Span:
    __slots__ = ("tr", "cat", "name", "args", "t0")

    def __init__(self, tr, cat, name, args):
        self.tr, self.cat, self.name, self.args = tr, cat, name, args
        self.t0 = now()

    def __enter__(self):
        return self

    def set(self, **args) -> None:
        """Add arguments known only inside the span (e.g. the algorithm)."""
        self.args.update(args)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.args["error"] = exc_type.__name__
        t1 = now()
        self.tr.event(self.cat, self.name, "", dur=t1 - self.t0, ts=self.t0, **self.args)
        return False

    end = __exit__


class _NoSpan:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def set(self, **args) -> None:
        pass

    def end(self, *exc) -> None:
        pass


NO_SPAN = _NoSpan()


def span(worker, cat: str, name: str, **args):
    """Context manager recording a complete event from enter to exit on the
    worker's timeline (a shared no-op object when tracing is off)::

        with ucxpy.trace.span(worker, "coll", "allreduce", algorithm="ring"):
            ...
    """
    tr = getattr(worker, "tr", None)
    if tr is None or tr.events is None:
        return NO_SPAN
    return _Span(tr, cat, name, args)


def begin(worker, cat: str, name: str, **args):
    """Start a span ended later by ``end(token)`` (nonblocking operations)."""
    return span(worker, cat, name, **args)


def end(token, **args) -> None:
    """End a span from :func:`begin`; ``args`` are added to it."""
    if token is not NO_SPAN:
        token.set(**args)
        token.end(None, None, None)


def mark(worker, cat: str, name: str, **args) -> None:
    """Record an instant event (no-op when tracing is off)."""
    tr = getattr(worker, "tr", None)
    if tr is not None and tr.events is not None:
        tr.event(cat, name, "", **args)


# -- clock alignment ---------------------------------------------------------------

CLOCK_ROUNDS = 8


def align_clocks(world, rounds: int = CLOCK_ROUNDS, timeout: float = 30.0) -> None:
    """Cristian's algorithm against rank 0 over tagged messages: each rank
    pings rank 0 ``rounds`` times; from the round with the shortest round trip,
    offset = t_rank0 - (t_send + t_recv) / 2.  Rank 0 serves ranks in order.
    Collective; called by :class:`ucxpy.World` when tracing."""
    from .tag import RESERVED_TAG_BASE     # deferred: ucxpy-trace reads traces without .tag (_dp)
    tag = RESERVED_TAG_BASE | (2 << 48)
    tr = world.worker.tr
    w, rank, size = world.worker, world.rank, world.size
    buf = bytearray(8)
    if rank == 0:
        tr.clock_offset_ns, tr.clock_rtt_ns = 0, 0
        for peer in range(1, size):
            for _ in range(rounds):
                w.tag_recv(buf, tag, source=peer, timeout=timeout)
                world.eps[peer].tag_send(struct.pack("<q", now()), tag, timeout)
        return
    best = None
    ep = world.eps[0]
    for _ in range(rounds):
        t0 = now()
        ep.tag_send(b"\0" * 8, tag, timeout)
        w.tag_recv(buf, tag, source=0, timeout=timeout)
        t1 = now()
        (t_ref,) = struct.unpack("<q", buf)
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, t_ref - (t0 + t1) // 2)
    tr.clock_rtt_ns, tr.clock_offset_ns = best
    tr.event("clock", "clock_sync", "", rtt_ns=best[0], offset_ns=best[1])


def is_reserved_tag(tag) -> bool:
    """True for ucxpy's own traffic (barriers, clock sync)."""
    return isinstance(tag, int) and tag & _RESERVED == _RESERVED

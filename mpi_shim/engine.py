"""Per-process MPI state: the ucxpy worker, the process table, tag layout, waiting.

Processes are named by their ucxpy *worker id* ("wid"): the ranks of the
job this process was launched with are wids ``0 .. size-1``; processes that
join later (spawned children, ``Connect``/``Accept`` peers) get the wid their
worker announced.  Groups and communicators store wids; the engine maps a
wid to its endpoint.

Tag layout (64-bit ucxpy tags; ucxpy keeps tags whose top byte is 0xFF):

====== ======== ==========================================================
bits   field    meaning
====== ======== ==========================================================
0-30   user     the MPI tag (TAG_UB = 2**31 - 1)
31-50  context  communicator context id
51-59  seq      synchronous-send sequence (acknowledged by the receiver)
60-62  kind     P2P, COLL, ACK, CGRP (Create_group), LOCAL (an
                intercommunicator's local group), PART (partitioned),
                CTRL (control traffic: intercommunicator creation, ULFM)
====== ======== ==========================================================
"""
from __future__ import annotations

import time

import ucxpy
from ucxpy.progress_thread import ApiLock, threads_alive

from .exceptions import translate

USER_BITS = 31
USER_MASK = (1 << USER_BITS) - 1
CTX_SHIFT, CTX_BITS = 31, 20
CTX_MASK = ((1 << CTX_BITS) - 1) << CTX_SHIFT
SEQ_SHIFT, SEQ_BITS = 51, 9
SEQ_MASK = ((1 << SEQ_BITS) - 1) << SEQ_SHIFT
KIND_SHIFT = 60
KIND_P2P, KIND_COLL, KIND_ACK, KIND_CGRP, KIND_LOCAL, KIND_PART, KIND_CTRL = \
    (k << KIND_SHIFT for k in range(7))
FULL = 0xFFFF_FFFF_FFFF_FFFF
MASK_TAG = FULL & ~SEQ_MASK                 # exact tag, any ssend sequence
MASK_ANY_TAG = FULL & ~SEQ_MASK & ~USER_MASK
TAG_UB = USER_MASK


class Engine:
    """The process-wide state every communicator shares."""

    def __init__(self):
        self.world = None
        self.worker = None
        self.me = 0                  # own wid
        self.eps = {}                # wid -> ucxpy Endpoint
        self.hooks = []              # extra progress functions (nonblocking protocols)
        self.lock = None             # an RLock once several threads may call in
        self.comms = {}              # context id -> WeakSet of CommImpl (ULFM revoke)

    def attach(self, world) -> None:
        self.world = world
        self.worker = world.worker
        self.me = world.rank
        self.eps = dict(enumerate(world.eps))
        self.worker.add_progress_callback(self._progress_hook)

    def acknowledge_by(self, send_ack) -> None:
        """Receives match by MASK_TAG (any ssend sequence): hash them like
        exact ones, and have the matcher call ``send_ack`` (.ops, which
        the MPI initialization passes: this module imports no layer above
        it) for the matches that carry a sequence (ucxpy.tag), so no
        receive needs a callback."""
        m = self.worker.matcher
        m.bucket_mask, m.notify_mask, m.notify = MASK_TAG, SEQ_MASK, send_ack

    def ep(self, wid):
        return self.eps[wid]

    # -- progress ---------------------------------------------------------------
    def _progress_hook(self) -> int:
        """Run the nonblocking protocols' progress functions (``hooks``; run
        by every ``worker.progress()``, so they advance inside any blocking
        call)."""
        n = 0
        if self.hooks:
            for fn in list(self.hooks):
                n += fn()
        return n

    def recv_anysize(self, src: int, tag: int):
        """A ucxpy receive of the message from wid ``src`` with exactly
        ``tag``, whatever its size (its bytes: the request's ``buf``)."""
        return self.worker.tag_recv_any_nb(tag, FULL, src)

    def progress(self) -> int:
        try:
            if self.lock is None:
                return self.worker.progress()
            with self.lock:
                n = self.worker.progress()
            if not n and threads_alive() > 1:
                time.sleep(0)           # a polling loop (Test) lets other threads in
            return n
        except ucxpy.UcxpyError as e:
            raise translate(e) from None

    def wait(self, op) -> None:
        if not op.is_done():
            # a blocking receive may take ucxpy's native fast path: when its
            # message is there already, at once, without the wait loop
            ureq = getattr(op, "ureq", None)
            fast = None if ureq is None else self.worker.recv_poller(ureq)
            if fast is not None and fast() and op.is_done():
                return
            self.wait_until(op.is_done, fast=fast)

    def wait_until(self, cond, timeout=None, fast=None, max_nap=None, on_events=False) -> None:
        """Progress until ``cond()``: spin while there is activity, then nap on
        the transports' descriptors with growing naps (oversubscribed ranks
        leave the CPU to each other; ``max_nap`` and ``on_events`` as
        ucxpy's :meth:`~ucxpy.Worker.wait_until`: a costly ``cond``, such as
        a scan of many requests, is tested after passes that handled
        something).  With several threads (see
        :mod:`.threads`) the library lock is released while waiting and taken
        only around each progress pass."""
        if cond():
            return
        lock = self.lock
        w = self.worker
        if (lock is None or threads_alive() == 1) and not w.oversubscribed():
            # a short spin first, without the wait loop's set-up: the reply to
            # a small message usually arrives within it (a lock held by the
            # only thread is nobody else's to want meanwhile; with more ranks
            # than CPUs the loop below yields the CPU instead)
            try:
                for _ in range(16):
                    if fast is not None and fast():
                        return
                    if (w.progress() or not on_events) and cond():
                        return
            except ucxpy.UcxpyError as e:
                raise translate(e) from None
        saved = lock._release_save() if lock is not None and lock._is_owned() else None
        try:
            w.wait_until(cond, timeout, "MPI operation", lock, fast, max_nap, on_events)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None
        finally:
            if saved is not None:
                lock._acquire_restore(saved)

    def enable_threads(self) -> None:
        """Serialize the worker for concurrent callers (THREAD_MULTIPLE)."""
        if self.lock is None:
            # ucxpy's ApiLock: RLock's interface, and the serialized API
            # calls take and drop it in C instead of calling its methods
            self.lock = ApiLock()


ENGINE = Engine()

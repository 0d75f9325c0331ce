"""Optional background progress (``UCXPY_PROGRESS_THREAD=y``).

Explicit progress is the default: nothing moves unless the application calls
into ucxpy.  A process that only *serves* RMA or active messages (a target
busy computing) can instead let a thread progress its worker.  While the
thread runs, the worker's and its endpoints' public methods take the
worker's lock, so the application may keep calling them from one thread.
The thread spins briefly after activity, then sleeps on the transports' file
descriptors, so an idle target costs little CPU.
"""
from __future__ import annotations

import functools
import select
import threading
import time

from .lazy import logger
from ._apilock import ApiLock, serialized  # noqa: F401  (public here)

#: ``serialized(fn, lock)``: ``fn`` called holding ``lock``, one C vectorcall
#: (native/apilock.c); binds like a function on a class, and
#: functools.update_wrapper gives it fn's metadata.  Layers above the core
#: (mpi_shim's THREAD_MULTIPLE) serialize their API with it.  With an
#: ``ApiLock`` (threading.RLock's interface) it takes and drops the lock in C.

log = logger(__name__)

_limbo = getattr(threading, "_limbo", None)
_active = getattr(threading, "_active", None)


def threads_alive() -> int:
    """``threading.active_count()`` without its lock (a wait loop asks on
    every pass).  Never less than the true count: a starting thread is added
    to the running ones before it leaves the starting ones, and this reads
    the starting ones first, so at worst it is counted twice."""
    if _active is None:             # (another Python's threading module)
        return threading.active_count()
    return len(_limbo) + len(_active)


WORKER_API = ("progress", "progress_all", "wait_until", "connect", "tag_recv_nb",
              "tag_recv_any_nb", "tag_recv", "tag_probe_nb", "tag_probe", "tag_peek",
              "tag_recv_message_nb", "fail_receives", "check_peers", "set_am_handler",
              "mem_map", "flush", "add_progress_callback", "remove_progress_callback",
              "add_wake_source", "_cancel_recv", "when", "flush_nb", "wait_fds", "arm")
ENDPOINT_API = ("tag_send_nb", "tag_send_sync_nb", "tag_send", "send_message", "am_send_nb",
                "am_send", "unpack_rkey", "put_nb", "get_nb", "put", "get", "atomic_post",
                "atomic_fetch_nb", "atomic_fetch", "atomic_fetch_now", "fence", "flush",
                "flushed", "flush_nb", "close", "abort", "fail", "send_frame",
                "transport_endpoint")
#: Worker's public methods that stay unlocked, and why (all of Endpoint's
#: lock).  Every other public method touches state the progress thread
#: changes (the matcher, endpoints, queues, the callback list) and is in the
#: lists above; tests/test_progress_thread.py holds the classes to this
#: split, so a new method must choose.
WORKER_LOCK_FREE = {
    # they call wait_until (locked) and take their native fast paths only
    # without a lock (recv_poller and tag_try_recv check it)
    "wait_for", "wait_all", "recv_poller", "tag_try_recv",
    # the transports' callbacks: they run inside progress(), which holds it
    "recv_frame", "recv_dest", "conn_failed",
    # configuration read (or set once before traffic) and the thread's own switches
    "oversubscribed", "local_ranks", "set_local_ranks", "cpu_share", "stats",
    "start_progress_thread", "stop_progress_thread",
    # close() stops the thread first, then tears down alone
    "close",
}


def make_thread_safe(obj, names, lock) -> None:
    """Shadow ``obj``'s methods ``names`` with versions holding ``lock``."""
    for name in names:
        fn = getattr(obj, name)

        @functools.wraps(fn)
        def locked(*args, __fn=fn, **kwargs):
            with lock:
                return __fn(*args, **kwargs)
        setattr(obj, name, locked)


class ProgressThread(threading.Thread):
    """Calls ``worker.progress()`` until stopped."""

    def __init__(self, worker, busy: float = 0.001):
        super().__init__(name=f"ucxpy-progress-{worker.id}", daemon=True)
        self.worker = worker
        self.busy = busy
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:     # a handler or callback raised: nobody progresses now
            log.error("ucxpy: the progress thread of worker %s died: %r", self.worker.id, e,
                      exc_info=True)
            self.worker.progress_error = e

    def _loop(self) -> None:
        w, lock = self.worker, self.worker.lock
        idle_since = time.monotonic()
        while not self._stop_event.is_set():
            with lock:
                if w.closed:
                    return
                n = w.progress()
            now = time.monotonic()
            if n:
                idle_since = now
            elif now - idle_since > self.busy:
                fds = [fd for i in w.ifaces for fd in i.wait_fds()]
                if fds:
                    select.select(fds, (), (), 0.001)
                else:
                    time.sleep(0.0005)
            else:
                time.sleep(0)   # let the application thread take the lock

    def stop(self) -> None:
        self._stop_event.set()
        if threading.current_thread() is not self:
            self.join(timeout=5)

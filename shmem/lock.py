"""Distributed locks: a ticket lock on a symmetric 64-bit word.

The lock word lives on PE 0 (every PE names the same symmetric object, so
PE 0's copy is the one word they contend on).  Its high 32 bits hand out
tickets, the low 32 bits say which ticket is served:

* ``set_lock``: ``t = fetch_add(word, 1 << 32) >> 32``, then wait until
  ``word & 0xFFFFFFFF == t`` (FIFO fair; back off while waiting).
* ``test_lock``: read the word; if free (``next == serving``) try
  ``compare_swap(word, w, w + (1 << 32))``; True means *not* acquired, as in
  OpenSHMEM.
* ``clear_lock``: quiet every context (the critical section's stores
  complete first), then ``add(word, 1)`` hands the lock to the next ticket.

The serving counter wraps after 2**32 acquisitions of one lock.
"""
from __future__ import annotations

import os
import time

import numpy as np

from ucxpy import atomics

from . import heap, runtime
from .errors import DtypeMismatch

LOCK_PE = 0
_TICKET = 1 << 32
_LOW = 0xFFFF_FFFF


def _word(rt, lock):
    if not isinstance(lock, np.ndarray) or lock.dtype.itemsize != 8 or \
            lock.dtype.kind not in "iu" or lock.size != 1:
        raise DtypeMismatch("a lock is a one-element int64 symmetric array (shmem.new_lock())")
    return rt.peers[LOCK_PE], rt.heap.offset_of(lock, 8)


def _fetch_add(rt, peer, off, value) -> int:
    if peer.base:
        return atomics.fetch_add64(peer.ptr + off, value)
    return peer.ep.atomic_fetch("add", value, peer.raddr + off, peer.rkey, 8)


def _load(rt, peer, off) -> int:
    if peer.base:
        return atomics.load64(peer.ptr + off)
    return peer.ep.atomic_fetch("or", 0, peer.raddr + off, peer.rkey, 8)


def new_lock():
    """Collectively allocate a lock (a zeroed symmetric int64 word)."""
    return heap.zeros(1, np.int64)


def del_lock(lock) -> None:
    """Collectively free a lock from :func:`new_lock`."""
    heap.free(lock)


def set_lock(lock) -> None:
    """Acquire ``lock``, waiting in FIFO order."""
    rt = runtime.get()
    peer, off = _word(rt, lock)
    ticket = (_fetch_add(rt, peer, off, _TICKET) >> 32) & _LOW
    if peer.base:
        rt.wait(lambda: atomics.load64(peer.ptr + off) & _LOW == ticket, "set_lock")
        atomics.fence_acquire()
        return
    # remote word: poll with growing pauses so waiters do not flood PE 0
    nap = 20e-6
    while _load(rt, peer, off) & _LOW != ticket:
        rt.worker.progress()
        time.sleep(nap)
        nap = min(nap * 2, 1e-3)


def test_lock(lock) -> bool:
    """Try to acquire ``lock`` without waiting; returns False if acquired,
    True if it is held by someone else (OpenSHMEM's convention)."""
    rt = runtime.get()
    peer, off = _word(rt, lock)
    rt.worker.progress()
    w = _load(rt, peer, off)
    if (w >> 32) & _LOW != w & _LOW:
        os.sched_yield()        # callers retry in a loop: let the holder run
        return True
    new = (w + _TICKET) & 0xFFFF_FFFF_FFFF_FFFF
    if peer.base:
        old = atomics.cswap64(peer.ptr + off, w, new)
    else:
        old = peer.ep.atomic_fetch("cswap", new, peer.raddr + off, peer.rkey, 8, compare=w)
    if old == w:
        if atomics.available:
            atomics.fence_acquire()
        return False
    return True


def clear_lock(lock) -> None:
    """Release ``lock`` after completing this PE's outstanding stores."""
    rt = runtime.get()
    peer, off = _word(rt, lock)
    rt.ctxs.quiet_all()
    if peer.base:
        atomics.add64(peer.ptr + off, 1)
    else:
        peer.ep.atomic_fetch("add", 1, peer.raddr + off, peer.rkey, 8)


class Lock:
    """A lock object: ``with lock: ...`` or ``acquire()``/``release()``.
    Creating and destroying one are collective."""

    def __init__(self):
        self._lock = new_lock()

    def destroy(self) -> None:
        """Free the lock (idempotent)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            del_lock(lock)

    def acquire(self, blocking: bool = True) -> bool:
        """Acquire; with ``blocking=False`` return at once, True if acquired."""
        if blocking:
            set_lock(self._lock)
            return True
        return not test_lock(self._lock)

    def release(self) -> None:
        clear_lock(self._lock)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

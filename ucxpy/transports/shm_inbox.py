"""The shm transport's per-process receive queue (inbox): its segment,
mapping, naming and the recovery of a producer lock whose holder is gone.

An interface owns one inbox, ``/dev/shm/ucxpy-shm-<pid>-<token>``, named
after its control socket ``ucxpy-<pid>-<token>``, linked while it lives and
holding one multi-producer frame ring (native/ring.c); every same-host peer
connected to it maps it once and pushes its frames there.  A process killed
before it could unlink its inbox leaves the file to its peers (which unlink
it when they see it die) or to :func:`reap_stale_segments`.  The transport
itself is ucxpy/transports/shm.py.
"""
from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from ..lazy import logger
from .. import shmfile
from .._native import ffi, lib
from ..errors import ProtocolError
from ..shmfile import SHM_DIR, unlink_quiet as _unlink_quiet
from .liveness import pid_alive

log = logger("ucxpy.shm")

SEG_PREFIX = "ucxpy-shm-"
_SEG_RE = re.compile(r"^ucxpy-shm-([0-9]+)-[0-9a-f]{16}$")
#: a socket name, ``ucxpy-<pid>-<token>``; its inbox is ``ucxpy-shm-<pid>-<token>``
_SOCK_RE = re.compile(rb"^ucxpy-([0-9]+)-([0-9a-f]{16})$")
HDR = lib.UCXPY_RING_HDR_SIZE
MAX_RING = 1 << 30
_LOCK_STUCK = 2.0        # seconds after which a lock held by one token is broken anyway (a push takes microseconds)
_PID_LIMIT = 1 << 22     # Linux's largest pid_max
_from_buffer = ffi.from_buffer


def reap_stale_segments(min_age: float = 60.0) -> int:
    """Unlink ``ucxpy-shm-<pid>-*`` segments of dead processes, older than
    ``min_age`` seconds (a segment normally lives until the peer maps it, a few
    milliseconds; the age guard protects peers in another pid namespace that
    share /dev/shm).  Returns the number removed."""
    return shmfile.reap_dead(_SEG_RE, min_age)


def inbox_name(sock_name: bytes, pid: int) -> Optional[str]:
    """The inbox segment of the interface bound to ``sock_name``, or None when
    the name is not an interface socket of process ``pid``."""
    m = _SOCK_RE.match(sock_name)
    if m is None or int(m.group(1)) != pid:
        return None
    return f"{SEG_PREFIX}{pid}-{m.group(2).decode()}"


def new_source() -> int:
    """A random, nonzero connection source."""
    return secrets.randbits(64) or 1


def free_stuck_lock(ring, holder: int, name: str, held: float) -> bool:
    """An inbox's producer lock has been found taken by ``holder`` for
    ``held`` seconds: free it if that process is dead (it published nothing
    of its frame), or after _LOCK_STUCK whoever it is (a scribbled lock
    word)."""
    alive = holder < _PID_LIMIT and pid_alive(holder)
    if not holder or (alive and held < _LOCK_STUCK):
        return False
    if not lib.ucxpy_ring_break_lock(ring, holder):
        return False
    log.warning("shm: freed the lock of inbox %s held by %s %d for %.1f s", name,
                "live process" if alive else "dead process" if holder < _PID_LIMIT
                else "no process", holder, held)
    return True


def ring_ok(size: int) -> bool:
    """Is ``size`` an inbox size we accept (a power of two, 4 KiB .. 1 GiB)?"""
    return 4096 <= size <= MAX_RING and not size & (size - 1)


class Inbox:
    """One process's receive queue mapped here: our own (we consume it) or a
    peer's (our endpoints to that peer produce into it)."""

    def __init__(self, mm: mmap.mmap, capacity: int, name: str, owner: bool):
        self.capacity = capacity
        self.name = name
        self.path = os.path.join(SHM_DIR, name)
        self.owner = owner          # we created it: unlink it when done
        self.mm = mm
        self.base = _from_buffer(self.mm)
        self.users = 0              # endpoints producing into it

    @classmethod
    def create(cls, name: str, capacity: int) -> "Inbox":
        # allocated now: a full /dev/shm must fail here, not SIGBUS later;
        # populated (as a peer's is by open): frames cycle through every page
        # of an inbox, and a page's first touch in a mapping is a fault (8 a
        # rank per all-to-all of 8 ranks, 2026-12-05, before this)
        mm = shmfile.create(name, HDR + capacity, allocate=True, populate=True)
        inbox = cls(mm, capacity, name, owner=True)
        if lib.ucxpy_ring_init(inbox.base, HDR + capacity) != 0:
            inbox.close()
            raise OSError(errno.EINVAL, "cannot initialise a shm inbox")
        return inbox

    @classmethod
    def open(cls, name: str, capacity: int) -> "Inbox":
        """Map a peer's inbox (a file that is not the job user's private
        segment of exactly that size is refused and left alone)."""
        return cls(shmfile.open_private(name, HDR + capacity, exact=True, populate=True),
                   capacity, name, owner=False)

    def handle(self, source: int = 0):
        """A local handle of the ring: the consumer's, or (``source``) a
        producer's whose frames carry that source."""
        r = ffi.new("ucxpy_ring_t *")
        size = HDR + self.capacity
        if (lib.ucxpy_ring_attach_producer(r, self.base, size, source, os.getpid()) if source
                else lib.ucxpy_ring_attach(r, self.base, size)) != 0:
            raise ProtocolError(f"shm inbox {self.name} is corrupt")
        return r

    def data_view(self) -> memoryview:
        return memoryview(self.mm)[HDR:HDR + self.capacity].toreadonly()

    def close(self) -> None:
        if self.owner:
            _unlink_quiet(self.path)
            self.owner = False
        if self.mm is None:
            return
        ffi.release(self.base)
        try:
            self.mm.close()
        except BufferError:
            # A payload view escaped recv_frame; the mapping goes with it.
            pass
        self.mm = None

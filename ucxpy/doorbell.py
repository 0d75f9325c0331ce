"""Doorbells: waking a same-host process that sleeps on shared memory.

A process that waits for a word in memory another process writes (a
shared-memory team's counters, :mod:`ucxpy.shmteam`) has no message to wake
it: without help it must poll, and with more ranks than cores the pollers
take the CPU from the ranks that would write the word.  A doorbell lets it
sleep instead: the sleeper publishes, next to the word, that it sleeps and
the name of its doorbell; the writer stores the word, then looks for
sleepers and rings theirs.  Either the sleeper sees the word on its last
look before sleeping, or the writer sees the sleeper (both sides' stores
and loads are sequentially consistent), so no wake-up is lost.

A doorbell is a unix datagram socket in the abstract namespace (no file;
gone when the process dies), one per process.  Its descriptor is one of
the worker's sleep descriptors (:meth:`ucxpy.Worker.add_wake_source`);
ringing is one ``sendto`` of an empty datagram.  Anyone may ring: a ring
only makes the sleeper look at its memory again.  Abstract names are per
network namespace, so a group shares doorbells only where every member is
in one (:func:`namespace`).
"""
from __future__ import annotations

import os
import secrets
import socket
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from .netaddr import ns_inode


class Doorbell:
    """This process's doorbell: ``name`` for the ringers, ``fileno()`` to sleep on."""

    def __init__(self):
        self.name = f"ucxpy-bell-{os.getpid()}-{secrets.token_hex(6)}".encode()
        self._sock = socket.socket(socket.AF_UNIX,
                                   socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        self._sock.bind(b"\0" + self.name)
        self._pid = os.getpid()

    def fileno(self) -> int:
        return self._sock.fileno()

    def drain(self) -> int:
        """Take the rings that arrived (after a sleep); returns how many."""
        n = 0
        while True:
            try:
                self._sock.recv(16)
            except (BlockingIOError, InterruptedError):
                return n
            except OSError:
                return n
            n += 1

    def close(self) -> None:
        self._sock.close()


_bell: Optional[Doorbell] = None
_sender: Optional[socket.socket] = None


def doorbell() -> Doorbell:
    """This process's doorbell (made on first use; a forked child makes its own)."""
    global _bell
    if _bell is None or _bell._pid != os.getpid():
        _bell = Doorbell()
    return _bell


def ring(name: bytes) -> bool:
    """Ring the doorbell called ``name``; False if it does not exist (any
    more) here.  A full queue counts as rung: a wake-up is pending anyway."""
    global _sender
    if _sender is None:
        _sender = socket.socket(socket.AF_UNIX,
                                socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    try:
        _sender.sendto(b"", b"\0" + name)
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False
    return True


def namespace() -> int:
    """The network namespace doorbells live in here (equal between two
    processes: each can ring the other's)."""
    return ns_inode("net")

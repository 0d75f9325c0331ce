"""Watching same-host peer processes: the shared death detector of the
transports that have no connection to break (shm rings, libfabric RDM).

A pidfd becomes readable when its process exits (zombies included), so a
sleeping worker wakes up on a peer's death and a progressing one finds out
with a single ``poll(0)``.  Without pidfds (old kernels) ``kill(pid, 0)`` plus
a zombie check is the fallback.
"""
from __future__ import annotations

import errno
import os
import select


def pid_alive(pid: int) -> bool:
    """Is process ``pid`` running (and not a zombie)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class PidWatch:
    """A set of watched peer pids."""

    def __init__(self):
        self._fds = {}                 # pid -> pidfd, or -1 without pidfd support
        self._poller = select.poll()

    def __bool__(self) -> bool:
        return bool(self._fds)

    def __contains__(self, pid: int) -> bool:
        return pid in self._fds

    def watch(self, pid: int) -> bool:
        """Start watching ``pid``; False if it is already gone."""
        if pid in self._fds:
            return True
        try:
            fd = os.pidfd_open(pid)
        except AttributeError:
            fd = -1
        except (OverflowError, ValueError):
            return False        # not a pid at all (a malformed peer address)
        except OSError as e:
            if e.errno == errno.ESRCH:
                return False
            fd = -1
        self._fds[pid] = fd
        if fd >= 0:
            self._poller.register(fd, select.POLLIN)
        return True

    def unwatch(self, pid: int) -> None:
        fd = self._fds.pop(pid, -1)
        if fd >= 0:
            self._poller.unregister(fd)
            os.close(fd)

    def dead(self) -> set:
        """Pids of watched processes that have exited."""
        if not self._fds:
            return set()
        ready = {fd for fd, _ev in self._poller.poll(0)}
        return {pid for pid, fd in self._fds.items()
                if fd in ready or (fd < 0 and not pid_alive(pid))}

    def fds(self) -> list:
        """File descriptors that become readable when a watched process exits."""
        return [fd for fd in self._fds.values() if fd >= 0]

    def close(self) -> None:
        for pid in list(self._fds):
            self.unwatch(pid)

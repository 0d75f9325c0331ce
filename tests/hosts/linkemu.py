"""Userspace link emulator: a lossy, slow "cable" between two network namespaces.

Used by :mod:`tests.hosts.netns` when the kernel has no ``sch_netem`` (tc
netem delay/loss).  One process per link opens a TAP device in each of two
namespaces (``setns`` through ctypes, then ``TUNSETIFF``) and copies Ethernet
frames between them, dropping each with probability ``loss`` and holding it
for ``delay`` seconds (FIFO per direction, so it never reorders).  ``loss=1``
is a silent cut: no FIN, no RST, no carrier change -- a host that vanished.

The TAP devices are not persistent: they disappear with this process.

Usage (run by the harness)::

    python linkemu.py NS_A DEV_A NS_B DEV_B MTU

then commands on stdin, one per line, each answered by ``OK`` on stdout::

    set delay=0.02 loss=0.01
    stats                 -> "OK fwd=<n> dropped=<n>"
"""
from __future__ import annotations

import collections
import ctypes
import fcntl
import os
import random
import select
import struct
import sys
import time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns({path}): {os.strerror(e)}")
    finally:
        os.close(fd)


def open_tap(netns: str, name: str) -> int:
    """Create TAP device ``name`` inside namespace ``netns``; returns its fd."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        _setns(f"/var/run/netns/{netns}")
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
        os.set_blocking(fd, False)
        return fd
    finally:
        if _libc.setns(own, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "cannot return to the original namespace")
        os.close(own)


def main(argv) -> int:
    ns_a, dev_a, ns_b, dev_b, mtu = argv[1], argv[2], argv[3], argv[4], int(argv[5])
    fa, fb = open_tap(ns_a, dev_a), open_tap(ns_b, dev_b)
    peer = {fa: fb, fb: fa}
    queues = {fa: collections.deque(), fb: collections.deque()}   # frames waiting *for* fd
    delay, loss = 0.0, 0.0
    fwd = dropped = 0
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    stdin = sys.stdin.fileno()
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    buf_size = mtu + 64
    while True:
        now = time.monotonic()
        due = [q[0][0] for q in queues.values() if q]
        timeout = max(0.0, min(due) - now) if due else 1.0
        ready, _, _ = select.select([fa, fb, stdin], [], [], timeout)
        for fd in ready:
            if fd == stdin:
                line = sys.stdin.readline()
                if not line:
                    return 0            # the harness is gone: so are we (and the taps)
                cmd = line.split()
                if cmd and cmd[0] == "set":
                    for kv in cmd[1:]:
                        k, _, v = kv.partition("=")
                        if k == "delay":
                            delay = float(v)
                        elif k == "loss":
                            loss = float(v)
                    sys.stdout.write("OK\n")
                elif cmd and cmd[0] == "stats":
                    sys.stdout.write(f"OK fwd={fwd} dropped={dropped}\n")
                else:
                    sys.stdout.write(f"ERR {line.strip()}\n")
                sys.stdout.flush()
                continue
            for _ in range(256):
                try:
                    frame = os.read(fd, buf_size)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break
                if loss and (loss >= 1.0 or rng.random() < loss):
                    dropped += 1
                    continue
                queues[peer[fd]].append((time.monotonic() + delay, frame))
        now = time.monotonic()
        for fd, q in queues.items():
            while q and q[0][0] <= now:
                _, frame = q.popleft()
                try:
                    os.write(fd, frame)
                    fwd += 1
                except OSError:
                    dropped += 1        # device down or its queue full: the wire lost it


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except KeyboardInterrupt:
        sys.exit(0)

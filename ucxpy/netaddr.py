"""This host's identity, its IPv4 addresses, and which one a listener binds.

:func:`host_id` names the host for reachability (every transport and the
worker address use it: same value, same host).

Listeners (the tcp transport, the verbs out-of-band socket, the launcher's
rendezvous service) bind one address, never all of them:

* ``UCXPY_TCP_IFACE`` (an IP or a device name) when the user gives one;
* loopback for a job on a single host, and for a process without a job key
  (it only ever talks to itself, see :mod:`ucxpy.auth`);
* otherwise the address the kernel would use to reach the launcher (or the
  default route), found by :func:`route_ipv4`; where nothing routes (a
  network namespace without a default route) the first non-loopback device
  address.

``ucxpy.spmd`` decides single- or multi-host from the bootstrap and passes
the result to the transports as ``tcp_iface``.
"""
from __future__ import annotations

import fcntl
import functools
import os
import socket
import struct
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from .errors import TransportUnavailable

LOOPBACK = "127.0.0.1"


def ns_inode(kind: str) -> int:
    """Inode of this process's ``kind`` namespace ("net", "pid", ...), 0 if unknown."""
    try:
        return os.stat(f"/proc/self/ns/{kind}").st_ino
    except OSError:
        return 0


@functools.lru_cache(maxsize=None)
def host_id() -> bytes:
    """Identity of this host: hostname, kernel boot id and network-namespace
    inode (abstract unix sockets are per network namespace, and a reboot or
    another kernel means another host)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}/{ns_inode('net')}".encode()


def ipv4_of_device(name: str) -> Optional[str]:
    """Primary IPv4 address of network device ``name`` (Linux SIOCGIFADDR)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            res = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(res[20:24])
    except (OSError, ValueError):
        return None


def device_ipv4s() -> list:
    try:
        names = [n for _, n in socket.if_nameindex()]
    except OSError:
        return []
    return [ip for ip in map(ipv4_of_device, names) if ip]


def local_ipv4s() -> list:
    """Every IPv4 address of this host: hostname's first, then the devices'."""
    ips = []
    try:
        name = socket.gethostname()
        # (an ASCII name as bytes: a str loads the idna codec, 2 ms of start-up)
        ips += socket.gethostbyname_ex(name.encode() if name.isascii() else name)[2]
    except OSError:
        pass
    ips += device_ipv4s()
    return list(dict.fromkeys(ips))


def is_loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("localhost", "::1")


def route_ipv4(towards: Optional[str] = None) -> Optional[str]:
    """The local IP the kernel would use to reach ``towards``, else the one
    of the default route; None when nothing routes.  Connecting a UDP socket
    sends no packet."""
    targets = ([towards] if towards else []) + ["10.255.255.255", "8.8.8.8"]
    for target in targets:
        try:
            info = socket.getaddrinfo(target, 9, socket.AF_INET, socket.SOCK_DGRAM)[0]
            with socket.socket(info[0], socket.SOCK_DGRAM) as s:
                s.connect(info[4])
                ip = s.getsockname()[0]
        except OSError:
            continue
        if ip != "0.0.0.0" and (target == towards and is_loopback(target)
                                or not is_loopback(ip)):
            return ip
    return None


def outward_ipv4(towards: Optional[str] = None) -> str:
    """:func:`route_ipv4`, else the first non-loopback device address, else loopback."""
    ip = route_ipv4(towards)
    if ip:
        return ip
    others = [ip for ip in device_ipv4s() if not is_loopback(ip)]
    return others[0] if others else LOOPBACK


def resolve_iface(tcp_iface: str) -> Optional[str]:
    """``UCXPY_TCP_IFACE`` -> an IPv4 address (it may name a device), or None."""
    try:
        socket.inet_aton(tcp_iface)
        return tcp_iface
    except OSError:
        return ipv4_of_device(tcp_iface)


def listen_ipv4(tcp_iface: str, keyed: bool) -> Optional[str]:
    """The address a listener binds (and advertises); None if ``tcp_iface``
    names nothing usable.  See the module docstring for the rule."""
    if tcp_iface:
        return resolve_iface(tcp_iface)
    if not keyed:
        return LOOPBACK
    return outward_ipv4()


def advertised_ipv4s(tcp_iface: str, keyed: bool = True) -> list:
    """The one IP to bind and put in a listener's address (:func:`listen_ipv4`):
    ``tcp_iface`` (an IP or a device name) if set, else loopback without a
    job key, else the address of the default route."""
    ip = listen_ipv4(tcp_iface, keyed)
    if ip is None:
        raise TransportUnavailable(f"UCXPY_TCP_IFACE={tcp_iface!r} is neither an "
                                   f"IPv4 address nor a device with one")
    return [ip]

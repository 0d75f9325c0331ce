"""The transports (one module each, behind the contract in ``base.py``)
and their registry: name -> "module:Class", imported only when selected or
queried.  Nothing here imports a transport or the core."""
from __future__ import annotations

from ..errors import ConfigError

#: transport name -> "module:class"; imported only when selected or queried.
#: More come from :func:`register_transport` and the ``ucxpy.transports``
#: entry point group (name = transport name, value = "module:Class").
TRANSPORTS = {
    "self": "ucxpy.transports.loopback:SelfInterface",
    "shm": "ucxpy.transports.shm:ShmInterface",
    "tcp": "ucxpy.transports.tcp:TcpInterface",
    "verbs": "ucxpy.transports.verbs:VerbsInterface",
    "ofi": "ucxpy.transports.ofi:OfiInterface",
}
_plugins_loaded = False
#: the transport that reaches the worker itself (always selected)
LOOPBACK = "self"


def register_transport(name: str, target: str) -> None:
    """Make the :class:`~ucxpy.transports.base.Interface` subclass at
    ``target`` ("module:Class") selectable as ``name`` in ``UCXPY_TLS``
    (examples/toy_transport.py is a whole one).  Registering a taken name
    for another class is a ConfigError."""
    if not name or "," in name or ":" not in target:
        raise ConfigError(f"register_transport({name!r}, {target!r}): want a name and "
                          f"'module:Class'")
    old = TRANSPORTS.get(name)
    if old is not None and old != target:
        raise ConfigError(f"transport {name!r} is already {old}")
    TRANSPORTS[name] = target


def transports() -> dict:
    """Every known transport: the built-in ones, those registered, and those
    of installed packages' ``ucxpy.transports`` entry points."""
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        from importlib import metadata     # (deferred: only when a name is unknown)
        for ep in metadata.entry_points(group="ucxpy.transports"):
            TRANSPORTS.setdefault(ep.name, ep.value)
    return TRANSPORTS

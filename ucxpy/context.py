"""Context: the configuration and the set of transports a process may use."""
from __future__ import annotations

import importlib
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Optional

from .config import Config
from .errors import TransportUnavailable
from .transports.base import Availability

# the transport registry lives with the transports (the config validates
# names against it without importing the context); re-exported here
from .transports import LOOPBACK, TRANSPORTS, register_transport, transports  # noqa: F401
from .worker import Worker


def load_transport(name: str, config: Config):
    """Return ``(interface class or None, Availability)`` for transport ``name``."""
    # a built-in name needs no scan of the installed packages' entry points
    target = TRANSPORTS.get(name) or transports().get(name)
    if target is None:
        return None, Availability(False, f"unknown transport {name!r}")
    mod, cls = target.split(":")
    try:
        iface_cls = getattr(importlib.import_module(mod), cls)
    except Exception as e:  # a missing native module or library must not break the others
        return None, Availability(False, f"cannot load {mod}: {type(e).__name__}: {e}")
    return iface_cls, iface_cls.query(config)


class Context:
    """Holds the configuration and the transports selected by ``UCXPY_TLS``.

    ``self`` (loopback) is always added so a worker can message itself.
    Transports that are selected but unavailable here are recorded in
    ``unavailable`` with the reason; :class:`TransportUnavailable` is
    raised if none remains.
    """

    def __init__(self, config: Optional[Config] = None, **overrides):
        self.config = config if config is not None else Config.from_env(**overrides)
        names = list(self.config.tls)
        if "all" in names:
            names = list(transports())
        if LOOPBACK not in names:
            names.insert(0, LOOPBACK)
        self.transports = []          # interface classes, in preference order
        self.unavailable = {}         # name -> reason
        for name in dict.fromkeys(names):
            cls, avail = load_transport(name, self.config)
            if cls is not None and avail.available:
                self.transports.append(cls)
            else:
                self.unavailable[name] = avail.reason
        if not any(c.name != LOOPBACK for c in self.transports) and names != [LOOPBACK]:
            raise TransportUnavailable(
                "no selected transport is available: " +
                "; ".join(f"{n}: {r}" for n, r in self.unavailable.items()))

    def create_worker(self, worker_id: Optional[int] = None):
        """Create a :class:`ucxpy.Worker`; ``worker_id`` is its identity for
        tag matching (the rank under a launcher), random if omitted."""
        return Worker(self, worker_id)

    def host_memory_domain(self):
        """A new memory domain for memory same-host peers map, from the first
        known transport that offers one without its interface
        (``Interface.host_memory_domain``), or None."""
        for name in transports():
            cls, avail = load_transport(name, self.config)
            md = cls.host_memory_domain(self.config) if cls is not None and avail.available \
                else None
            if md is not None:
                return md
        return None

    @staticmethod
    def query(config: Optional[Config] = None):
        """``[(name, Availability)]`` for every known transport (``ucxpy-info``)."""
        config = config if config is not None else Config.from_env()
        return [(name, load_transport(name, config)[1]) for name in transports()]

"""Typed configuration, read once from ``UCXPY_*`` environment variables."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from .errors import ConfigError

KNOWN_TRANSPORTS = ("self", "shm", "tcp", "verbs", "ofi")


def _parse_size(text: str) -> int:
    """'8K' / '1m' / '65536' / 'inf' -> bytes."""
    t = text.strip().lower()
    if t in ("inf", "infinity"):
        return 1 << 62
    if t in ("auto", "-1"):
        return -1
    mult = 1
    for suffix, m in (("kb", 1 << 10), ("mb", 1 << 20), ("gb", 1 << 30),
                      ("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30), ("b", 1)):
        if t.endswith(suffix):
            t, mult = t[: -len(suffix)], m
            break
    try:
        return int(float(t) * mult)
    except ValueError:
        raise ConfigError(f"not a size: {text!r}") from None


def _parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "y", "yes", "on", "true"):
        return True
    if t in ("0", "n", "no", "off", "false"):
        return False
    raise ConfigError(f"not a boolean: {text!r}")


def _parse_tristate(text: str) -> str:
    """"auto", "y" or "n" (the usual spellings of yes/no accepted)."""
    t = str(text).strip().lower()
    if t in ("", "auto", "try"):
        return "auto"
    return "y" if _parse_bool(t) else "n"


@dataclass
class Config:
    """Effective configuration.  Each field maps to ``UCXPY_<FIELD NAME>``."""

    #: transports to use, in order of preference ("self" is always added for loopback)
    tls: tuple = ("self", "shm", "tcp")
    #: messages of at least this many bytes use rendezvous (-1 = auto: above the
    #: transport's eager-copy limit; 0 = always rendezvous)
    rndv_thresh: int = -1
    #: rendezvous messages of at least this size are copied by both sides at once
    #: (the sender puts the first part while the receiver gets the rest)
    rndv_split_thresh: int = 512 * 1024
    #: payloads up to this size use the eager-short path (-1 = transport default)
    short_thresh: int = -1
    #: seconds a blocking call waits before raising TimeoutError (0 = forever)
    timeout: float = 0.0
    #: seconds without traffic before a silent peer is suspected dead
    peer_timeout: float = 30.0
    #: interface / address for tcp to listen on and advertise ("" = chosen per job:
    #: loopback for a single-host job or a process without a job key, else the
    #: address that routes to the launcher / the default route)
    tcp_iface: str = ""
    #: encrypt tcp connections with TLS (certificates pinned through the job key)
    tcp_tls: bool = False
    #: shm ring size per connection, bytes
    shm_ring_size: int = 1 << 21
    #: allow single-copy cross-process transfers (process_vm_readv)
    shm_cma: bool = True
    #: seconds a waiting worker spins before sleeping on file descriptors
    busy_poll: float = 0.002
    #: more ranks on this host than CPUs: spin in short bursts and give the
    #: CPU away (sched_yield) between them ("auto": decided from the
    #: launcher's local rank count against the host's CPUs; "y"/"n" force)
    oversubscribed: str = "auto"
    #: log level name
    log_level: str = "WARN"
    #: run a background progress thread (for RMA targets that do not progress)
    progress_thread: bool = False
    #: the job key peers prove knowledge of (set by ucxpy-run; "" = none: this
    #: process then only talks to itself); never printed
    auth_key: str = field(default="", repr=False)
    #: file holding the job key (used when auth_key is empty; mode 600)
    auth_key_file: str = ""
    #: directory to write protocol event traces to, one file per rank
    #: (trace.<rank>.jsonl; "" = off, the default: hooks cost one check)
    trace: str = ""
    #: events kept per worker when tracing (a ring buffer: the oldest are dropped;
    #: a few hundred bytes of memory each)
    trace_events: int = 200_000
    #: count messages/bytes per protocol, peer and transport (Worker.stats())
    #: and print them when the worker closes
    stats: bool = False

    _CONVERT = {
        "tls": lambda s: tuple(x.strip() for x in s.split(",") if x.strip()),
        "rndv_thresh": _parse_size,
        "short_thresh": _parse_size,
        "rndv_split_thresh": _parse_size,
        "timeout": float,
        "peer_timeout": float,
        "tcp_iface": str,
        "shm_ring_size": _parse_size,
        "shm_cma": _parse_bool,
        "busy_poll": float,
        "oversubscribed": _parse_tristate,
        "log_level": str,
        "progress_thread": _parse_bool,
        "tcp_tls": _parse_bool,
        "auth_key": str,
        "auth_key_file": str,
        "trace": str,
        "trace_events": _parse_size,
        "stats": _parse_bool,
    }

    @classmethod
    def from_env(cls, env=None, **overrides) -> "Config":
        """Build from ``env`` (default ``os.environ``); keyword overrides win."""
        env = os.environ if env is None else env
        cfg = cls()
        for f in fields(cls):
            if f.name.startswith("_"):
                continue
            key = "UCXPY_" + f.name.upper()
            if key in env:
                try:
                    setattr(cfg, f.name, cls._CONVERT[f.name](env[key]))
                except ConfigError:
                    raise
                except (TypeError, ValueError) as e:
                    raise ConfigError(f"{key}={env[key]!r}: {e}") from None
        for k, v in overrides.items():
            if not hasattr(cfg, k) or k.startswith("_"):
                raise ConfigError(f"unknown config option {k!r}")
            if isinstance(v, str) and k in cls._CONVERT:
                v = cls._CONVERT[k](v)
            setattr(cfg, k, v)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if isinstance(self.tls, str):
            self.tls = tuple(x.strip() for x in self.tls.split(",") if x.strip())
        unknown = [t for t in self.tls if t not in KNOWN_TRANSPORTS and t != "all"]
        if unknown:
            raise ConfigError(f"UCXPY_TLS names unknown transport(s) {unknown}; "
                              f"known: {', '.join(KNOWN_TRANSPORTS)}")
        if not self.tls:
            raise ConfigError("UCXPY_TLS is empty")
        for name in ("rndv_thresh", "short_thresh"):
            if getattr(self, name) < -1:
                raise ConfigError(f"UCXPY_{name.upper()} must be >= 0 (or -1/auto)")
        if self.trace_events < 1:
            raise ConfigError("UCXPY_TRACE_EVENTS must be >= 1")
        if self.shm_ring_size < 4096 or self.shm_ring_size & (self.shm_ring_size - 1):
            raise ConfigError("UCXPY_SHM_RING_SIZE must be a power of two >= 4096")
        from . import auth
        if isinstance(self.auth_key, bytes):
            self.auth_key = self.auth_key.decode("utf-8", "surrogateescape")
        if self.auth_key:
            auth.check_key(self.auth_key.encode("utf-8", "surrogateescape"), "UCXPY_AUTH_KEY")
        elif self.auth_key_file:
            auth.read_key_file(self.auth_key_file)

    def items(self):
        """(env name, value) pairs for ``ucxpy-info -c``; the key is masked."""
        from .auth import MASK
        for f in fields(self):
            if not f.name.startswith("_"):
                value = getattr(self, f.name)
                if f.name == "auth_key" and value:
                    value = MASK
                yield "UCXPY_" + f.name.upper(), value

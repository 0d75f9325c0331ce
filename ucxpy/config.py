"""Typed configuration, read once from ``UCXPY_*`` environment variables.

:class:`Config` holds the core's options (one dataclass field per
``UCXPY_<NAME>``, each with its parser and documentation).  Transports,
launchers and the layers above declare their own variables with
:func:`declare` (name, default, parser, doc: UCX's config tables) and read
them with :func:`setting` / :meth:`ucxpy.Config.setting`; nothing else reads
``UCXPY_*`` from the environment.  ``ucxpy-info -c`` prints every declared
variable (:func:`variables`), ``-cf`` with its documentation.
"""
from __future__ import annotations

import importlib
import os
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Callable, Dict, Optional

from . import auth
from .errors import ConfigError
from .record import field, fields, record
from .transports import TRANSPORTS, transports

PREFIX = "UCXPY_"


def parse_size(text: str) -> int:
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


def parse_size_ranges(text: str) -> tuple:
    """'1K-64K,1M-inf' / 'all' / '' -> ((first, last), ...) byte counts,
    both ends included ('all': every size; '' or 'none': none)."""
    t = str(text).strip().lower()
    if t in ("", "none", "n", "no"):
        return ()
    if t in ("all", "y", "yes"):
        return ((0, 1 << 62),)
    out = []
    for part in t.split(","):
        lo, sep, hi = part.strip().partition("-")
        first = parse_size(lo) if lo.strip() else 0
        last = parse_size(hi) if sep else first
        if first < 0 or last < first:
            raise ConfigError(f"not a size range: {part!r}")
        out.append((first, last))
    return tuple(sorted(out))


def parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "y", "yes", "on", "true"):
        return True
    if t in ("0", "n", "no", "off", "false"):
        return False
    raise ConfigError(f"not a boolean: {text!r}")


def parse_tristate(text: str) -> str:
    """"auto", "y" or "n" (the usual spellings of yes/no accepted)."""
    t = str(text).strip().lower()
    if t in ("", "auto", "try"):
        return "auto"
    return "y" if parse_bool(t) else "n"


ATOMIC_MODES = ("auto", "cpu", "device")


def parse_choice(text: str, choices) -> str:
    """``text`` (case-insensitive) if it is one of ``choices``, else ConfigError."""
    t = str(text).strip().lower()
    if t not in choices:
        raise ConfigError(f"{text!r} is not one of {', '.join(choices)}")
    return t


def _tls(text: str) -> tuple:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _opt(default, parse, doc: str, **kw):
    """A :class:`Config` field: its default, the parser of its environment
    text and its documentation (``ucxpy-info -cf``)."""
    return field(default=default, metadata={"parse": parse, "doc": doc}, **kw)


@record
class Config:
    """Effective configuration.  Each field maps to ``UCXPY_<FIELD NAME>``;
    the variables of transports and launchers are declared with
    :func:`~ucxpy.config.declare` and read with :meth:`setting` (see
    :func:`~ucxpy.config.variables`)."""

    tls: tuple = _opt(("self", "shm", "tcp"), _tls,
                      'transports to use, in order of preference ("self" is always added '
                      'for loopback; "all" = every one available)')
    rndv_thresh: int = _opt(-1, parse_size,
                            "messages of at least this many bytes use rendezvous (auto: above "
                            "the transport's eager-copy limit; 0 = always rendezvous)")
    rndv_split_thresh: int = _opt(512 * 1024, parse_size,
                                  "rendezvous messages of at least this size are copied by both "
                                  "sides at once (the sender puts the first part while the "
                                  "receiver gets the rest) where the lane reads and writes "
                                  "one-sidedly")
    short_thresh: int = _opt(-1, parse_size,
                             "payloads up to this size use the eager-short path (auto = the "
                             "transport's default)")
    timeout: float = _opt(0.0, float,
                          "seconds a blocking call waits before raising TimeoutError (0 = forever)")
    peer_timeout: float = _opt(30.0, float,
                               "seconds without traffic before a silent peer is declared dead")
    tcp_iface: str = _opt("", str,
                          "IP or device for tcp to bind and advertise (empty = chosen per job: "
                          "loopback for a single-host job or a process without a job key, else "
                          "the address routed to the launcher / the default route)")
    tcp_tls: bool = _opt(False, parse_bool,
                         "encrypt tcp connections with TLS 1.3 (certificates pinned through "
                         "the job key)")
    shm_ring_size: int = _opt(1 << 21, parse_size,
                              "bytes of each process's shm receive queue, which all its same-host peers write to (a power of two >= 4096)")
    shm_cma: bool = _opt(True, parse_bool,
                         "allow single-copy cross-process transfers (process_vm_readv)")
    atomic_mode: str = _opt("auto", lambda t: parse_choice(t, ATOMIC_MODES),
                            "how RMA atomics are done, like UCX_ATOMIC_MODE: cpu (loads and "
                            "stores on mapped memory, else the target's CPU through active "
                            "messages), device (the lane's device atomics; a lane without "
                            "them raises), auto (device only when every lane of the worker "
                            "has them, else cpu: the two kinds are not atomic with each other)")
    shm_coll: bool = _opt(True, parse_bool,
                          "collectives of same-host groups through shared segments (ucxpy.shmteam) "
                          "where the layer above offers them; n = messages only")
    shm_coll_slot: int = _opt(1 << 20, parse_size,
                              "bytes per data slot of a shared-memory team (two per member); "
                              "larger operations run in slot-sized pieces")
    shm_coll_teams: int = _opt(32, parse_size,
                               "shared-memory teams one process may belong to at once (more "
                               "communicators use messages)")
    fastpath: bool = _opt(True, parse_bool,
                          "the native data plane (native/dp): tag matching in C for every "
                          "caller, the shm inbox's eager messages matched and delivered in C, "
                          "eager sends, put/get and atomics on mapped peer memory (n = the "
                          "pure-Python matcher and protocols only, the reference)")
    tcp_native: bool = _opt(True, parse_bool,
                            "libucp's progress reads and writes tcp connections' eager "
                            "tagged and active messages in C (native/dp/stream.c; the core "
                            "lends a connection's reading while nothing of it is buffered in "
                            "Python); n = libucp's tcp traffic goes through Python")
    proto_python: tuple = _opt((), parse_size_ranges,
                               "message sizes whose eager messages the Python reference "
                               "protocol runs instead of the native data plane: comma-separated "
                               "ranges such as 1K-64K, or all (the data plane hands exactly "
                               "those to Python, after matching in the same queues; "
                               "ucxpy-info -e prints the table)")
    proto_plugin: str = _opt("", str,
                             "a tagged-message protocol written in Python for the sizes it "
                             "names, in place of the stock ones, as name:sizes (the shipped "
                             "pipelined-copy, or module:Class of a ucxpy.protocols.Protocol; "
                             "sizes as UCXPY_PROTO_PYTHON's), e.g. pipelined-copy:64K-inf; "
                             "every rank of a job must name the same one")
    proto_native: bool = _opt(True, parse_bool,
                              "a protocol plug-in's C half (Protocol.native, e.g. "
                              "pipelined-copy's) runs the messages of its sizes that C callers "
                              "(libucp) send and receive, without the interpreter; n = its "
                              "Python half runs every message")
    busy_poll: float = _opt(0.002, float,
                            "seconds a waiting worker spins before sleeping on file descriptors")
    oversubscribed: str = _opt("auto", parse_tristate,
                               "more ranks on this host than CPUs: spin in short bursts and "
                               "sched_yield between them (auto: the launcher's local rank count "
                               "against the CPUs the job may use; y/n force)")
    log_level: str = _opt("WARN", str, "log level name")
    progress_thread: bool = _opt(False, parse_bool,
                                 "run a background progress thread (for RMA targets that do "
                                 "not progress)")
    auth_key: str = _opt("", str,
                         "the job key peers prove knowledge of (set by the launcher; empty: "
                         "this process only talks to itself); never printed", repr=False)
    auth_key_file: str = _opt("", str,
                              "file holding the job key (mode 600), used when UCXPY_AUTH_KEY "
                              "is empty")
    trace: str = _opt("", str,
                      "directory for protocol event traces, one trace.<rank>.jsonl per rank "
                      "(empty = off: hooks cost one check)")
    trace_events: int = _opt(200_000, parse_size,
                             "events kept per worker when tracing (a ring buffer: the oldest "
                             "are dropped)")
    stats: bool = _opt(False, parse_bool,
                       "count messages/bytes per protocol, peer and transport "
                       "(Worker.stats()) and print them when the worker closes")
    #: the ``UCXPY_*`` variables of the environment this was built from
    #: (None: built directly, :meth:`setting` then reads ``os.environ``)
    _env: Optional[dict] = field(default=None, repr=False, compare=False)

    @classmethod
    def from_env(cls, env=None, **overrides) -> "Config":
        """Build from ``env`` (default ``os.environ``); keyword overrides win."""
        env = os.environ if env is None else env
        cfg = cls()
        cfg._env = {k: v for k, v in env.items() if k.startswith(PREFIX)}
        for f in _fields():
            key = PREFIX + f.name.upper()
            if key in env:
                setattr(cfg, f.name, _parse(key, f.metadata["parse"], env[key]))
        known = {f.name: f for f in _fields()}
        for k, v in overrides.items():
            f = known.get(k)
            if f is None:
                raise ConfigError(f"unknown config option {k!r}")
            if isinstance(v, str):
                v = _parse(PREFIX + k.upper(), f.metadata["parse"], v)
            setattr(cfg, k, v)
        cfg.validate()
        return cfg

    def setting(self, name: str):
        """The value of the declared variable ``name`` (``UCXPY_...``) in the
        environment this configuration was read from."""
        return setting(name, self._env)

    def validate(self) -> None:
        if isinstance(self.tls, str):
            self.tls = tuple(x.strip() for x in self.tls.split(",") if x.strip())
        unknown = [t for t in self.tls if t not in TRANSPORTS and t != "all"]
        if unknown:         # (the installed packages' entry points: read only when needed)
            known = transports()
            unknown = [t for t in unknown if t not in known]
        if unknown:
            raise ConfigError(f"UCXPY_TLS names unknown transport(s) {unknown}; "
                              f"known: {', '.join(known)}")
        if not self.tls:
            raise ConfigError("UCXPY_TLS is empty")
        for name in ("rndv_thresh", "short_thresh"):
            if getattr(self, name) < -1:
                raise ConfigError(f"UCXPY_{name.upper()} must be >= 0 (or -1/auto)")
        if self.trace_events < 1:
            raise ConfigError("UCXPY_TRACE_EVENTS must be >= 1")
        if self.shm_ring_size < 4096 or self.shm_ring_size & (self.shm_ring_size - 1):
            raise ConfigError("UCXPY_SHM_RING_SIZE must be a power of two >= 4096")
        if self.shm_coll_slot < 4096 or self.shm_coll_slot % 64:
            raise ConfigError("UCXPY_SHM_COLL_SLOT must be a multiple of 64, at least 4096")
        if isinstance(self.auth_key, bytes):
            self.auth_key = self.auth_key.decode("utf-8", "surrogateescape")
        if self.auth_key:
            auth.check_key(self.auth_key.encode("utf-8", "surrogateescape"), "UCXPY_AUTH_KEY")
        elif self.auth_key_file:
            auth.read_key_file(self.auth_key_file)

    def items(self):
        """(env name, value) pairs of the core options; the key is masked."""
        for f in _fields():
            value = getattr(self, f.name)
            if f.name == "auth_key" and value:
                value = auth.MASK
            yield PREFIX + f.name.upper(), value


def _fields():
    return [f for f in fields(Config) if not f.name.startswith("_")]


# ----------------------------------------------------------------- the registry

@record(frozen=True)
class Var:
    """One declared ``UCXPY_*`` variable."""
    name: str                  # the whole environment name, UCXPY_...
    default: object            # the value when unset or empty
    parse: Callable            # text -> value (raises ConfigError/ValueError when malformed)
    doc: str
    component: str             # "core", a transport's name, "launch", "shmem", ...
    secret: bool = False       # never printed (the job key)


_REGISTRY: Dict[str, Var] = {}


def declare(component: str, *specs) -> None:
    """Declare ``component``'s variables, each ``(NAME, default, parser, doc)``
    with NAME without the ``UCXPY_`` prefix, the way UCX components declare
    their config tables.  Declaring a name twice differently is an error."""
    for suffix, default, parse, doc in specs:
        var = Var(PREFIX + suffix, default, parse, doc, component)
        old = _REGISTRY.get(var.name)
        if old is not None and (old.component, old.default, old.parse) != \
                (component, default, parse):
            raise ConfigError(f"{var.name} declared by both {old.component} and {component}")
        _REGISTRY[var.name] = var


for _f in _fields():
    _REGISTRY[PREFIX + _f.name.upper()] = Var(PREFIX + _f.name.upper(), _f.default,
                                              _f.metadata["parse"], _f.metadata["doc"],
                                              "core", secret=_f.name == "auth_key")


def _parse(name: str, parse: Callable, text: str):
    try:
        return parse(text)
    except ConfigError as e:
        raise ConfigError(f"{name}={text!r}: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{name}={text!r}: {e}") from None


def setting(name: str, env=None):
    """The value of the declared variable ``name`` in ``env`` (a mapping or
    a :class:`Config`, whose environment snapshot is used; default
    ``os.environ``): parsed, or its default when unset or empty.
    This is the one place ``UCXPY_*`` variables are read from."""
    var = _REGISTRY.get(name)
    if var is None:                 # its component may not be imported yet
        # the launch variables first: importing every transport for them
        # (libfabric's and libibverbs' libraries) costs a rank's start-up
        # a quarter of a second
        importlib.import_module("ucxpy.bootstrap")
        var = _REGISTRY.get(name)
    if var is None:
        var = variables(plugins=False).get(name) or variables().get(name)
        if var is None:
            raise ConfigError(f"{name} is not a declared ucxpy variable")
    if env is not None and not hasattr(env, "get"):   # a Config: its snapshot
        env = getattr(env, "_env", None)
    text = (os.environ if env is None else env).get(name)
    if text is None or not str(text).strip():
        return var.default
    return _parse(name, var.parse, str(text))


def auth_key_from_env(env=None) -> Optional[bytes]:
    """The job key ``UCXPY_AUTH_KEY`` / ``UCXPY_AUTH_KEY_FILE`` give, or None
    (ConfigError if the file is unusable or the key too short)."""
    text = setting(auth.ENV_KEY, env)
    if text:
        key = text.encode("utf-8", "surrogateescape")
        auth.check_key(key)
        return key
    path = setting(auth.ENV_KEY_FILE, env)
    return auth.read_key_file(path) if path else None


def variables(plugins: bool = True) -> Dict[str, Var]:
    """Every declared variable, by name: the core's, every transport's and
    launcher's (their modules are imported for it), and (``plugins``) those
    that packages above the core declare through the ``ucxpy.config`` entry
    point group."""
    from importlib import metadata      # deferred: importlib.metadata (email, zipfile) only here
    for mod in dict.fromkeys(t.split(":")[0] for t in transports().values()):
        try:
            importlib.import_module(mod)
        except Exception:          # a transport that cannot load declares nothing
            pass
    importlib.import_module("ucxpy.bootstrap")
    for ep in metadata.entry_points(group="ucxpy.config") if plugins else ():
        try:
            ep.load()
        except Exception:
            pass
    return dict(_REGISTRY)


def unknown_variables(env=None) -> list:
    """``UCXPY_*`` names in ``env`` that nothing declares (likely typos)."""
    known = variables()
    env = os.environ if env is None else env
    return sorted(k for k in env if k.startswith(PREFIX) and k not in known)

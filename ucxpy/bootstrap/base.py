"""The bootstrap contract (:class:`Bootstrap`), its timeout and the
single-process one; the launchers' bootstraps (zmq_boot, pmi_boot,
pmix_boot, mpi_boot) build on it, and ``ucxpy.bootstrap`` picks one
(:func:`ucxpy.bootstrap.from_env`)."""
from __future__ import annotations

import os
import socket
import sys

from .. import auth, config
from ..errors import BootstrapError, ConfigError, InvalidRank, PeerFailure
from ..errors import TimeoutError as _UcxpyTimeoutError
from ..netaddr import LOOPBACK, outward_ipv4

#: seconds a collective waits when the caller passes ``timeout=None``
#: (override with ``UCXPY_BOOTSTRAP_TIMEOUT``; 0 or negative = wait forever)
DEFAULT_TIMEOUT = 120.0


def _int_or_none(text: str):
    return int(text)


#: what launchers tell each rank, and the bootstrap's own options
config.declare(
    "launch",
    ("BOOTSTRAP", "auto", lambda t: t.strip().lower(),
     "force a bootstrap: zmq, pmi, pmix, mpi or single (auto: from the launcher's "
     "variables)"),
    ("BOOTSTRAP_TIMEOUT", DEFAULT_TIMEOUT, float,
     "seconds a bootstrap collective (wire-up exchange, barrier) waits; 0 = forever"),
    ("BOOTSTRAP_CONNECT_TIMEOUT", 30.0, float,
     "seconds a rank tries to reach ucxpy-run's rendezvous service"),
    ("PMI_VERSION", None, _int_or_none,
     "PMI wire protocol to speak on PMI_FD: 1 or 2 (default 1 under Hydra, 2 under Slurm)"),
    ("RUN_ADVERTISE", "", str,
     "ucxpy-run: the address ranks use to reach the launcher (as --advertise)"),
    ("RUN_STACKS_ON_TIMEOUT", False, config.parse_bool,
     "ucxpy-run: at --timeout, have every rank print each thread's stack before it is "
     "killed (as --stacks-on-timeout)"),
    ("RUN_ADDR", "", str, "set by ucxpy-run: its rendezvous service (selects the zmq bootstrap)"),
    ("RANK", None, int, "set by ucxpy-run: this process's rank"),
    ("SIZE", None, int, "set by ucxpy-run: the number of ranks"),
    ("LOCAL_RANK", None, int, "set by ucxpy-run: the rank among those on this host"),
    ("LOCAL_SIZE", None, int, "set by ucxpy-run: the number of ranks on this host"),
    ("JOB_ID", "", str, "set by ucxpy-run: the job's identity"),
    ("GROUP", 0, int, "set by ucxpy-run: the spawn group (0 = the initial job)"),
    ("APPNUM", None, int, "set by ucxpy-run: which application of an MPMD launch or spawn"),
    ("UNIVERSE_SIZE", None, int, "set by ucxpy-run: how many processes the job may grow to"),
    ("PARENT_PORT", "", str, "set by ucxpy-run for spawned processes: the parents' port"),
)


class BootstrapTimeout(BootstrapError, _UcxpyTimeoutError):
    """A bootstrap collective did not complete in time.

    Both a :class:`~ucxpy.errors.BootstrapError` and a
    :class:`ucxpy.errors.TimeoutError`.  ``missing`` lists the ranks that had
    not joined the operation, when the bootstrap can tell (empty otherwise).
    """

    def __init__(self, message: str, missing=()):
        super().__init__(message)
        self.missing = list(missing)


def resolve_timeout(timeout):
    """``None`` -> the default; ``<= 0`` -> ``None`` (forever); else float."""
    if timeout is None:
        try:
            timeout = config.setting("UCXPY_BOOTSTRAP_TIMEOUT")
        except config.ConfigError:
            timeout = DEFAULT_TIMEOUT
    timeout = float(timeout)
    return None if timeout <= 0 else timeout


class Bootstrap:
    """What the core needs from a launcher.

    Attributes: ``rank``, ``size``, ``local_rank``, ``local_size`` (ranks on
    this host as assigned by the launcher) and ``hostname``.

    ``timeout`` arguments are seconds; ``None`` means :data:`DEFAULT_TIMEOUT`
    (or ``UCXPY_BOOTSTRAP_TIMEOUT``), ``0`` means wait forever.  A collective
    that does not finish in time raises :class:`BootstrapTimeout`; one that
    cannot finish because a participant died raises
    :class:`~ucxpy.errors.PeerFailure`.
    """

    kind = "abstract"
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    hostname: str = ""

    # -- collectives ---------------------------------------------------
    def allgather(self, data: bytes, timeout=None) -> list:
        """Return every rank's ``data`` as ``list[bytes]`` indexed by rank."""
        raise NotImplementedError

    def barrier(self, timeout=None) -> None:
        """Return once every rank has entered the barrier."""
        raise NotImplementedError

    def bcast(self, data, root: int = 0, timeout=None) -> bytes:
        """Return ``root``'s ``data`` on every rank (others may pass ``None``)."""
        raise NotImplementedError

    # -- optional key/value store ------------------------------------------
    def put(self, key: str, value: bytes) -> None:
        """Publish ``value`` under ``key`` for other ranks to :meth:`get`."""
        raise NotImplementedError(f"{type(self).__name__} has no key/value store")

    def get(self, key: str, timeout=None) -> bytes:
        """Wait for ``key`` to be :meth:`put` by some rank and return its value."""
        raise NotImplementedError(f"{type(self).__name__} has no key/value store")

    def lookup(self, key: str):
        """The value put under ``key`` or None, without waiting for it."""
        raise NotImplementedError(f"{type(self).__name__} has no key/value store")

    # -- dynamic processes -------------------------------------------------
    def spawn(self, apps, **extra) -> tuple:
        """Start new processes through the launcher: ``apps`` is a list of
        ``{"argv": [...], "maxprocs": n, "env": {...}, "wdir": path}`` forming
        one new group; ``port`` (in ``extra``) is what the children's
        :meth:`parent_port` returns.  Returns ``(group, errcodes)`` once
        started (errcodes: one list per app).  Launchers that cannot start
        processes raise :class:`~ucxpy.errors.BootstrapError`."""
        raise BootstrapError(f"the {self.kind} bootstrap cannot start new processes "
                             "(run the job under ucxpy-run or MPICH's mpiexec to spawn)")

    def parent_port(self):
        """The port a spawning job asked this one to connect to, or None."""
        return config.setting("UCXPY_PARENT_PORT") or None

    def universe_size(self):
        """How many processes the job may grow to (None: the launcher does
        not say)."""
        v = config.setting("UCXPY_UNIVERSE_SIZE")
        return v if v else self.size

    def appnum(self):
        """Which application of an MPMD launch (or spawn) this process runs,
        or None."""
        return config.setting("UCXPY_APPNUM")

    # -- security and placement (used by ucxpy.spmd before the worker exists) --
    def job_key(self, timeout=None):
        """The job key every rank of the job holds (bytes), or None where
        this launcher gives none.  May be collective: every rank calls it,
        once, at the same point (``ucxpy.init`` does)."""
        return None

    def listen_address(self):
        """The local IP this rank's listeners should bind, or None to let
        the transports decide (see :mod:`ucxpy.netaddr`)."""
        return None

    def _broadcast_job_key(self, timeout=None) -> bytes:
        """Rank 0's key (``UCXPY_AUTH_KEY`` / its file, else a fresh one),
        broadcast through the launcher's own channel; computed once."""
        key = getattr(self, "_job_key", None)
        if key is None:
            mine = None
            if self.rank == 0:
                try:
                    mine = config.auth_key_from_env() or auth.generate_key().encode()
                except ConfigError as e:
                    raise BootstrapError(str(e)) from None
            key = self._job_key = bytes(self.bcast(mine, root=0, timeout=timeout))
        return key

    def _placement_listen_address(self):
        """Loopback when every rank is on this host, else the routed address."""
        return LOOPBACK if self.local_size >= self.size else outward_ipv4()

    def _placement_from_hostnames(self, timeout=None):
        """``(local_rank, local_size)`` among the ranks whose hostname is this
        one's, by an allgather of hostnames (collective): for launchers that
        do not say."""
        hosts = [h.decode() for h in self.allgather(self.hostname.encode(), timeout)]
        mine = [r for r, h in enumerate(hosts) if h == self.hostname]
        return mine.index(self.rank), len(mine)

    # -- failures and teardown ----------------------------------------------
    def check_failures(self) -> None:
        """Raise :class:`~ucxpy.errors.PeerFailure` if the launcher reported a
        dead rank since the last call.  Cheap enough to call from a progress
        loop: implementations rate-limit the real check by time."""

    def abort(self, message: str = "", errorcode: int = 1) -> None:
        """Tell the launcher to stop the job: every *other* rank is killed at
        once and the job's exit status becomes ``errorcode``.

        Under ``ucxpy-run`` (and for a single rank) this returns, so the caller
        can print its error and exit; the launcher kills it too if it has not
        exited after the grace period.  Under MPI it calls ``MPI_Abort`` and
        does not return.
        """
        if message:
            sys.stderr.write(f"rank {self.rank}: abort: {message}\n")
            sys.stderr.flush()

    def _abort_and_exit(self, message: str, errorcode: int, kill) -> None:
        """Print ``message``, flush, call ``kill(code)`` (the launcher's abort,
        which should not return), then exit with ``code`` in any case."""
        code = int(errorcode) or 1
        if message:
            sys.stderr.write(f"rank {self.rank}: abort: {message}\n")
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            kill(code)
        finally:
            os._exit(code)

    def close(self) -> None:
        """Release resources.  Idempotent."""

    # -- helpers -----------------------------------------------------------
    def _check_root(self, root: int) -> int:
        if not isinstance(root, int) or not 0 <= root < self.size:
            raise InvalidRank(f"bcast root {root!r} out of range [0, {self.size})")
        return root

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"<{type(self).__name__} rank={self.rank}/{self.size} "
                f"local={self.local_rank}/{self.local_size} host={self.hostname!r}>")


class SingletonBootstrap(Bootstrap):
    """A job of one rank: every collective is local."""

    kind = "single"

    def __init__(self):
        self.rank, self.size = 0, 1
        self.local_rank, self.local_size = 0, 1
        self.hostname = socket.gethostname()
        self._kv: dict = {}

    def allgather(self, data: bytes, timeout=None) -> list:
        return [bytes(data)]

    def barrier(self, timeout=None) -> None:
        return None

    def bcast(self, data, root: int = 0, timeout=None) -> bytes:
        self._check_root(root)
        return bytes(data)

    def put(self, key: str, value: bytes) -> None:
        self._kv[str(key)] = bytes(value)

    def get(self, key: str, timeout=None) -> bytes:
        try:
            return self._kv[str(key)]
        except KeyError:
            raise BootstrapTimeout(f"key {key!r} was never put (single-rank job)") from None

    def lookup(self, key: str):
        return self._kv.get(str(key))

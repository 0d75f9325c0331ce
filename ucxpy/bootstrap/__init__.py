"""Launch-time wire-up: who am I, how many are we, and swap addresses.

Every ucxpy program is SPMD.  Before workers can connect they must learn each
other's addresses; a :class:`Bootstrap` provides exactly the few collective
operations needed for that, over whatever launched the job:

* :class:`~ucxpy.bootstrap.zmq_boot.ZmqBootstrap` - launched by ``ucxpy-run``
  (``UCXPY_RUN_ADDR`` is set); talks to the launcher's rendezvous service and
  learns about dead ranks through :meth:`Bootstrap.check_failures`.
* :class:`~ucxpy.bootstrap.pmi_boot.PmiBootstrap` - launched by MPICH's
  ``mpiexec`` (Hydra) or ``srun --mpi=pmi2``: speaks the PMI-1/PMI-2 wire
  protocol on ``PMI_FD`` itself, no MPI library needed.
* :class:`~ucxpy.bootstrap.pmix_boot.PmixBootstrap` - launched by Open MPI's
  ``mpirun``, PRRTE's ``prterun`` or ``srun --mpi=pmix`` (``PMIX_NAMESPACE``,
  ``PMIX_RANK``, ``PMIX_SERVER_URI*``): a PMIx client through the system's
  libpmix (cffi, ``ucxpy._pmix``), no MPI library needed; unavailable, with
  the reason, where ucxpy was built without ``libpmix-dev``.
* :class:`~ucxpy.bootstrap.mpi_boot.MpiBootstrap` - launched by
  ``mpirun``/``mpiexec`` with neither a PMI socket nor a usable PMIx server;
  uses mpi4py.
* :class:`SingletonBootstrap` - started directly: rank 0 of 1.

Use :func:`from_env` to get the right one (the one place the choice is made);
``UCXPY_BOOTSTRAP=zmq|pmi|pmix|mpi|single`` forces a choice.  Typical use::

    boot = ucxpy.bootstrap.from_env()
    addrs = boot.allgather(my_address, timeout=60)   # list[bytes], index = rank
    boot.barrier(timeout=60)
    boot.check_failures()   # from the progress loop; cheap, rate-limited
    boot.close()

Collectives must be called by every rank in the same order (as in MPI).  A
bootstrap object is meant to be used from one thread at a time.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import sys

from .. import config
from ..errors import BootstrapError, InvalidRank, PeerFailure
from ..errors import TimeoutError as _UcxpyTimeoutError

__all__ = [
    "Bootstrap", "SingletonBootstrap", "BootstrapTimeout", "from_env",
    "detect_mpi_launcher", "DEFAULT_TIMEOUT",
    # re-exported: the errors a bootstrap raises
    "BootstrapError", "PeerFailure", "InvalidRank",
]

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
            from .. import auth
            from ..errors import ConfigError
            mine = None
            if self.rank == 0:
                try:
                    mine = auth.key_from_env() or auth.generate_key().encode()
                except ConfigError as e:
                    raise BootstrapError(str(e)) from None
            key = self._job_key = bytes(self.bcast(mine, root=0, timeout=timeout))
        return key

    def _placement_listen_address(self):
        """Loopback when every rank is on this host, else the routed address."""
        from ..netaddr import LOOPBACK, outward_ipv4
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


#: environment variables that mark a process started by an MPI launcher
_MPI_MARKERS = (
    ("OMPI_COMM_WORLD_SIZE", "Open MPI"),
    ("PMIX_RANK", "PMIx"),
    ("PMI_SIZE", "MPICH/Hydra"),
    ("PMI_RANK", "MPICH/Hydra"),
    ("MPI_LOCALNRANKS", "MPICH/Hydra"),
)


def detect_mpi_launcher(env=None):
    """Name of the MPI launcher that started this process, or ``None``."""
    env = os.environ if env is None else env
    for var, name in _MPI_MARKERS:
        if var in env:
            return name
    return None


def _mpi_size_hint(env) -> int:
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS", "PMIX_SIZE"):
        try:
            return int(env[var])
        except (KeyError, ValueError):
            continue
    return 0


def from_env(env=None) -> Bootstrap:
    """Return the bootstrap matching how this process was launched.

    ``UCXPY_BOOTSTRAP`` (``zmq``, ``pmi``, ``pmix``, ``mpi``, ``single``)
    forces a choice; otherwise ``UCXPY_RUN_ADDR`` selects zmq, a PMI socket
    (``PMI_FD``, from Hydra or Slurm) selects pmi unless the real mpi4py's
    ``MPI`` is already loaded (its MPI library owns that socket then), a
    PMIx server (Open MPI's ``mpirun``, ``srun --mpi=pmix``) selects pmix
    when ucxpy's PMIx binding is built (before mpi4py: no MPI library is
    needed, and a loaded one shares the same libpmix client), other MPI
    launcher variables (with mpi4py importable) select mpi, and anything
    else is a single rank.

    Raises :class:`~ucxpy.errors.BootstrapError` if the forced or detected
    bootstrap cannot start (service unreachable, PMIx binding not built,
    mpi4py missing under a multi-rank MPI launch, unknown ``UCXPY_BOOTSTRAP``).
    """
    env = os.environ if env is None else env
    forced = config.setting("UCXPY_BOOTSTRAP", env)
    if forced in ("", "auto") and config.setting("UCXPY_RUN_ADDR", env):
        forced = "zmq"              # (ucxpy-run: no PMI or PMIx module to load)
    if forced in ("", "auto"):
        from .pmi_boot import pmi_available
        from .pmix_boot import pmix_server_present, unavailable_reason
        pmix_why = unavailable_reason() if pmix_server_present(env) else "no PMIx server"
        if pmi_available(env) and not _real_mpi_loaded():
            forced = "pmi"
        elif not pmix_why:
            forced = "pmix"
        elif detect_mpi_launcher(env):
            if importlib.util.find_spec("mpi4py") is not None:
                forced = "mpi"
            elif _mpi_size_hint(env) > 1:
                raise BootstrapError(
                    f"started by an MPI launcher ({detect_mpi_launcher(env)}) with "
                    f"{_mpi_size_hint(env)} ranks, but mpi4py is not importable and "
                    f"the PMIx bootstrap cannot run ({pmix_why}); install mpi4py or "
                    "libpmix-dev, or launch with ucxpy-run")
            else:
                forced = "single"
        else:
            forced = "single"
    if forced in ("zmq", "ucxpy-run"):
        from .zmq_boot import ZmqBootstrap
        return ZmqBootstrap.from_env(env)
    if forced == "pmi":
        from .pmi_boot import PmiBootstrap
        return PmiBootstrap(env)
    if forced == "pmix":
        from .pmix_boot import PmixBootstrap
        return PmixBootstrap(env)
    if forced == "mpi":
        from .mpi_boot import MpiBootstrap
        return MpiBootstrap()
    if forced in ("single", "singleton", "none"):
        return SingletonBootstrap()
    raise BootstrapError(f"UCXPY_BOOTSTRAP={forced!r}: expected zmq, pmi, pmix, mpi or single")


def _real_mpi_loaded() -> bool:
    """Whether an MPI library's mpi4py.MPI (not mpi_shim's) is imported."""
    mod = sys.modules.get("mpi4py.MPI")
    return mod is not None and not getattr(mod, "__name__", "").startswith("mpi_shim")


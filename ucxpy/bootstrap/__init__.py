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
import sys

from .. import config
from ..errors import BootstrapError, InvalidRank, PeerFailure  # noqa: F401  (re-exported)

__all__ = [
    "Bootstrap", "SingletonBootstrap", "BootstrapTimeout", "from_env",
    "detect_mpi_launcher", "DEFAULT_TIMEOUT",
    # re-exported: the errors a bootstrap raises
    "BootstrapError", "PeerFailure", "InvalidRank",
]

from .base import (DEFAULT_TIMEOUT, Bootstrap, BootstrapTimeout,  # noqa: F401
                   SingletonBootstrap, resolve_timeout)


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
        # deferred: PMI's and PMIx's modules load only when probed (a ucxpy-run rank: neither)
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
        from .zmq_boot import ZmqBootstrap      # deferred: the chosen bootstrap only
        return ZmqBootstrap.from_env(env)
    if forced == "pmi":
        from .pmi_boot import PmiBootstrap      # deferred: the chosen bootstrap only
        return PmiBootstrap(env)
    if forced == "pmix":
        from .pmix_boot import PmixBootstrap    # deferred: the chosen bootstrap only
        return PmixBootstrap(env)
    if forced == "mpi":
        from .mpi_boot import MpiBootstrap      # deferred: the chosen bootstrap only (mpi4py)
        return MpiBootstrap()
    if forced in ("single", "singleton", "none"):
        return SingletonBootstrap()
    raise BootstrapError(f"UCXPY_BOOTSTRAP={forced!r}: expected zmq, pmi, pmix, mpi or single")


def _real_mpi_loaded() -> bool:
    """Whether an MPI library's mpi4py.MPI (not mpi_shim's) is imported."""
    mod = sys.modules.get("mpi4py.MPI")
    return mod is not None and not getattr(mod, "__name__", "").startswith("mpi_shim")


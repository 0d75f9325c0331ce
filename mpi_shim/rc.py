"""Runtime configuration read when MPI initializes (mpi4py's ``mpi4py.rc``).

Attributes (set them before ``mpi_shim.MPI`` is first imported):
``initialize`` (initialize at import), ``threads`` and ``thread_level``
("single", "funneled", "serialized", "multiple"), ``finalize`` (finalize at
exit; None: when initialized at import), ``fast_reduce``, ``recv_mprobe``,
``irecv_bufsz`` and ``errors`` ("exception", "default", "abort", "fatal").
Environment variables ``MPI4PY_RC_<NAME>`` override the defaults.
"""
from __future__ import annotations

import os

initialize = True
threads = True
thread_level = "multiple"
finalize = None
fast_reduce = True
recv_mprobe = True
irecv_bufsz = 32768
errors = "exception"

_LEVELS = {"single": 0, "funneled": 1, "serialized": 2, "multiple": 3}


def _env(name, default):
    v = os.environ.get(f"MPI4PY_RC_{name.upper()}")
    if v is None:
        return default
    if isinstance(default, bool) or default is None:
        return v.lower() in ("1", "y", "yes", "true", "on")
    if isinstance(default, int):
        return int(v)
    return v


for _name in ("initialize", "threads", "thread_level", "finalize", "fast_reduce",
              "recv_mprobe", "irecv_bufsz", "errors"):
    globals()[_name] = _env(_name, globals()[_name])


def thread_level_value() -> int:
    """The thread support level to request, from ``threads``/``thread_level``."""
    if not threads:
        return 0
    try:
        return _LEVELS[str(thread_level).lower()]
    except KeyError:
        raise ValueError(f"invalid thread level {thread_level!r}") from None


def __call__(**kwargs):   # pragma: no cover - module objects are not callable
    raise TypeError

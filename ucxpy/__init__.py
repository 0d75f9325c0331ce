"""ucxpy: a UCX-like point-to-point messaging framework in Python.

Core objects follow UCX's UCP layer: a :class:`Context` (configuration and
transports), :class:`Worker` (progress engine, tag matching), and
:class:`Endpoint` (connection to a remote worker).  :func:`init` joins an SPMD
job started by ``ucxpy-run`` or ``mpirun``.

The names below are loaded on first use (PEP 562), and so are the
subpackages (``ucxpy.worker``, ...): a process that needs only part of the
package, such as the launcher ``ucxpy-run`` (the bootstrap, auth and config:
half its start-up was importing the core it never runs), does not pay for
the rest.  ``from ucxpy import Worker`` and ``ucxpy.Worker`` work as before.
"""
import importlib

__version__ = "0.1.0"

#: public name -> the submodule that defines it
_EXPORTS = {
    "Config": "config", "Context": "context", "Endpoint": "endpoint",
    "Request": "request", "TagInfo": "request", "World": "spmd", "init": "spmd",
    "ANY_SOURCE": "tag", "FULL_MASK": "tag", "TagMessage": "worker", "Worker": "worker",
    **{name: "errors" for name in (
        "BootstrapError", "Canceled", "ConfigError", "ConnectionLost", "InvalidBuffer",
        "InvalidRank", "MessageTooLarge", "PeerFailure", "ProgressThreadError",
        "ProtocolError", "RemoteAccessError", "TimeoutError", "TransportUnavailable",
        "TruncationError", "UcxpyError")},
}

__all__ = [
    "Config", "Context", "Worker", "Endpoint", "Request", "TagInfo", "TagMessage",
    "World", "init", "ANY_SOURCE", "FULL_MASK",
    "UcxpyError", "ConfigError", "TransportUnavailable", "ConnectionLost", "PeerFailure",
    "ProgressThreadError",
    "ProtocolError", "TruncationError", "MessageTooLarge", "TimeoutError", "Canceled",
    "InvalidRank", "InvalidBuffer", "RemoteAccessError", "BootstrapError",
]


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is not None:
        value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
        globals()[name] = value             # the next lookup does not come here
        return value
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:                                    # a subpackage not imported yet
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(_EXPORTS))

"""ucxpy: a UCX-like point-to-point messaging framework in Python.

Core objects follow UCX's UCP layer: a :class:`Context` (configuration and
transports), :class:`Worker` (progress engine, tag matching), and
:class:`Endpoint` (connection to a remote worker).  :func:`init` joins an SPMD
job started by ``ucxpy-run`` or ``mpirun``.
"""
from . import auth, trace
from .config import Config
from .context import Context
from .endpoint import Endpoint
from .errors import (BootstrapError, Canceled, ConfigError, ConnectionLost,
                     InvalidBuffer, InvalidRank, MessageTooLarge, PeerFailure, ProgressThreadError,
                     ProtocolError, RemoteAccessError, TimeoutError,
                     TransportUnavailable, TruncationError, UcxpyError)
from .request import Request, TagInfo
from .spmd import World, init
from .tag import ANY_SOURCE, FULL_MASK
from .worker import TagMessage, Worker

__version__ = "0.1.0"

__all__ = [
    "Config", "Context", "Worker", "Endpoint", "Request", "TagInfo", "TagMessage",
    "World", "init", "ANY_SOURCE", "FULL_MASK",
    "UcxpyError", "ConfigError", "TransportUnavailable", "ConnectionLost", "PeerFailure",
    "ProgressThreadError",
    "ProtocolError", "TruncationError", "MessageTooLarge", "TimeoutError", "Canceled",
    "InvalidRank", "InvalidBuffer", "RemoteAccessError", "BootstrapError",
]

"""Every exception ucxpy raises.  All derive from :class:`UcxpyError`."""
from __future__ import annotations


class UcxpyError(Exception):
    """Base class of ucxpy errors."""


class ConfigError(UcxpyError, ValueError):
    """A ``UCXPY_*`` setting is malformed or names an unknown transport."""


class TransportUnavailable(UcxpyError):
    """No selected transport can reach a peer, or a transport cannot start here."""


class ConnectionLost(UcxpyError, ConnectionError):
    """The connection to a peer broke, or the peer process died.

    ``peer`` names the remote worker (its rank under a launcher) when known.
    """

    def __init__(self, message: str, peer=None):
        super().__init__(message)
        self.peer = peer


class PeerFailure(ConnectionLost):
    """The launcher reported that a rank exited or stopped responding."""


class ProtocolError(ConnectionLost):
    """A malformed or unexpected frame arrived; the connection is closed."""


class TruncationError(UcxpyError):
    """The matched message is larger than the receive buffer.

    ``size`` is the incoming message size, ``capacity`` the buffer size.
    """

    def __init__(self, message: str, size: int = 0, capacity: int = 0):
        super().__init__(message)
        self.size = size
        self.capacity = capacity


class MessageTooLarge(UcxpyError, ValueError):
    """A frame exceeds what the transport or protocol accepts."""


class TimeoutError(UcxpyError, TimeoutError):  # noqa: A001 - deliberate, also a builtin TimeoutError
    """A blocking call did not complete within its timeout."""


class Canceled(UcxpyError):
    """The request was cancelled before it completed."""


class InvalidRank(UcxpyError, ValueError):
    """A rank / worker id is out of range or unknown."""


class InvalidBuffer(UcxpyError, TypeError):
    """A buffer is not usable for this call (read-only, not contiguous, ...)."""


class RemoteAccessError(UcxpyError):
    """An RMA/atomic targets memory outside a registered region, with a stale
    or malformed remote key, or a misaligned address."""


class ProgressThreadError(UcxpyError):
    """The worker's background progress thread died (an exception in a
    handler or progress callback it ran); ``__cause__`` is that exception.
    Raised by every later wait on the worker instead of waiting forever."""


class BootstrapError(UcxpyError):
    """Launch-time wire-up failed (rendezvous service unreachable, timeout)."""

"""Requests: the handle every non-blocking call returns (UCX's ``*_nbx``)."""
from __future__ import annotations

import time
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import Callable, Optional

from . import _dp
from .errors import Canceled, TimeoutError


class Request(_dp.RequestCore):
    """Completion handle of a non-blocking operation.

    ``test()`` progresses the worker once and reports completion; ``wait()``
    progresses until completion and returns the result (a :class:`TagInfo` for
    receives, ``None`` for sends) or raises the operation's error;
    ``cancel()`` tries to withdraw an operation that has not matched yet.

    Its fields (``worker``, ``done``, ``exc``, ``result``, ``_callbacks``,
    ``_cancel``) are C (``ucxpy._dp.RequestCore``, native/dp/binding.c), so
    the data plane completes a request without a Python frame; they behave
    as ``__slots__`` would.
    """

    __slots__ = ()

    def __init__(self, worker, cancel: Optional[Callable[["Request"], bool]] = None):
        self.worker = worker
        self.done = False
        self.exc: Optional[BaseException] = None
        self.result = None
        self._callbacks = None
        self._cancel = cancel

    # -- completion (called by the core) ---------------------------------
    def complete(self, result=None, exc: Optional[BaseException] = None) -> None:
        if self.done:
            return
        self.done = True
        self.result = result
        self.exc = exc
        self._cancel = None
        cbs = self._callbacks
        if cbs:
            self._callbacks = None
            for cb in cbs:
                cb(self)

    def _sent(self, exc: Optional[BaseException]) -> None:
        """``on_complete`` for transport sends."""
        self.complete(exc=exc)

    def add_done_callback(self, cb: Callable[["Request"], None]) -> None:
        """Call ``cb(request)`` on completion (immediately if already done)."""
        if self.done:
            cb(self)
        elif self._callbacks is None:
            self._callbacks = [cb]
        else:
            self._callbacks.append(cb)

    # -- user API --------------------------------------------------------
    def test(self) -> bool:
        """Progress once; True when complete.  Raises the operation's error."""
        if not self.done:
            self.worker.progress()
            if not self.done:
                return False
        if self.exc is not None:
            raise self.exc
        return True

    def wait(self, timeout: Optional[float] = None):
        """Progress until complete and return the result.

        ``timeout`` seconds (default: ``UCXPY_TIMEOUT``, 0 = forever) after which
        :class:`ucxpy.errors.TimeoutError` is raised; the request stays valid
        and may be waited again or cancelled.
        """
        if not self.done:
            self.worker.wait_for(self, timeout)
        if self.exc is not None:
            raise self.exc
        return self.result

    def cancel(self) -> bool:
        """Cancel if still possible.  Returns True if the request is now
        completed with :class:`ucxpy.errors.Canceled`."""
        if self.done or self._cancel is None:
            return False
        if self._cancel(self):
            self.complete(exc=Canceled("request cancelled"))
            return True
        return False

    @property
    def cancelled(self) -> bool:
        return self.done and isinstance(self.exc, Canceled)

    def __repr__(self) -> str:
        state = "pending" if not self.done else ("error" if self.exc else "done")
        return f"<{type(self).__name__} {state}>"


class PyTagInfo:
    """What a completed or probed tagged message carried: ``source``,
    ``tag``, ``length``; iterable as that tuple and equal to anything whose
    tuple is the same.  (The reference of the data plane's C type, which
    is :class:`TagInfo`: its completions make one without a Python frame.)"""

    __slots__ = ("source", "tag", "length")

    def __init__(self, source: int, tag: int, length: int):
        self.source = source
        self.tag = tag
        self.length = length

    def __iter__(self):
        return iter((self.source, self.tag, self.length))

    def __eq__(self, other):
        return tuple(self) == tuple(other)

    def __repr__(self) -> str:
        return f"TagInfo(source={self.source}, tag={self.tag:#x}, length={self.length})"


#: What a completed or probed tagged message carried (native/dp/binding.c;
#: :class:`PyTagInfo` is its reference)
TagInfo = _dp.TagInfo


def deadline_of(timeout: Optional[float], default: float) -> float:
    """Absolute monotonic deadline; ``inf`` for no timeout."""
    if timeout is None:
        timeout = default
    return time.monotonic() + timeout if timeout and timeout > 0 else float("inf")


def timeout_error(what, timeout: float) -> TimeoutError:
    """``what``: a description, or the object waited for (shown by its repr,
    formatted only now: waits pass it as it is)."""
    return TimeoutError(f"{what if isinstance(what, str) else repr(what)} did not complete "
                        f"within {timeout:g} s")

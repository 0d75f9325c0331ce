"""``MPI.Request``, ``Prequest`` and ``Grequest``.

A request refers to an *operation* (see :mod:`.ops`) with ``is_done()``
(no progress), ``finish(status)`` (fills the status, raises on error,
returns the pickle API's object), ``peek(status)`` and ``cancel()``.
Completing a nonpersistent request makes it ``REQUEST_NULL``; a persistent
operation (:class:`PersistentOp`) goes back to *inactive* instead and
``Start`` runs it again.
"""
from __future__ import annotations

from .engine import ENGINE
from .exceptions import ERR_ARG, ERR_REQUEST, Exception, user_call
from .handle import Handle, register_family
from .ops import *  # noqa: F401,F403 - re-exported for the other modules
from .ops import DoneOp, _Op
from .status import Status

UNDEFINED = -32766


class PersistentOp(_Op):
    """A persistent request: ``start()`` makes a fresh inner operation."""

    __slots__ = ("starter", "cur")
    persistent = True

    def __init__(self, starter):
        self.starter, self.cur = starter, None

    def start(self):
        if self.cur is not None:
            raise Exception(ERR_REQUEST, "persistent request is already active")
        self.cur = self.starter()

    def is_done(self):
        return self.cur is None or self.cur.is_done()

    def active(self):
        return self.cur is not None

    def finish(self, status):
        cur, self.cur = self.cur, None
        if cur is None:
            if status is not None:
                status._clear()
            return None
        return cur.finish(status)

    def peek(self, status):
        if self.cur is None:
            status._clear()
        else:
            self.cur.peek(status)

    def cancel(self):
        return self.cur.cancel() if self.cur is not None else False


class Request(Handle):
    """Request handler."""

    __slots__ = ()

    def __reduce__(self):
        if self._h is not None and not self._const:
            raise ValueError("cannot serialize an active request")
        return super().__reduce__()

    @classmethod
    def _from(cls, op):
        return cls._wrap(op)

    @classmethod
    def _done_request(cls):
        return cls._wrap(DoneOp())

    def _complete(self, status):
        op = self._h
        if op is None:
            if status is not None:
                status._clear()
            return None
        if not getattr(op, "persistent", False):
            self._h = None
        return op.finish(status)

    # -- single request ----------------------------------------------------------
    def Wait(self, status=None) -> bool:
        """Wait for the request to complete."""
        op = self._h
        if op is not None and not op.is_done():
            ENGINE.wait(op)
        self._complete(status)
        return True

    def wait(self, status=None):
        """Wait for the request to complete; returns the received object."""
        op = self._h
        if op is not None and not op.is_done():
            ENGINE.wait(op)
        return self._complete(status)

    def Test(self, status=None) -> bool:
        """Test for the completion of the request."""
        op = self._h
        if op is not None and not op.is_done():
            ENGINE.progress()
            if not op.is_done():
                return False
        self._complete(status)
        return True

    def test(self, status=None):
        """Test for completion; returns ``(flag, object)``."""
        op = self._h
        if op is not None and not op.is_done():
            ENGINE.progress()
            if not op.is_done():
                return False, None
        return True, self._complete(status)

    def Get_status(self, status=None) -> bool:
        """Non-destructive test for the completion of the request."""
        op = self._h
        if op is not None and not op.is_done():
            ENGINE.progress()
            if not op.is_done():
                return False
        if status is not None:
            if op is None:
                status._clear()
            else:
                op.peek(status)
        return True

    def get_status(self, status=None) -> bool:
        """Non-destructive test for the completion of the request."""
        return self.Get_status(status)

    def Cancel(self) -> None:
        """Cancel the request."""
        if self._h is None:
            raise Exception(ERR_REQUEST, "invalid request (REQUEST_NULL)")
        self._h.cancel()

    def cancel(self) -> None:
        """Cancel the request."""
        self.Cancel()

    def Free(self) -> None:
        """Free the request (an active operation still completes)."""
        if self._h is None:
            raise Exception(ERR_REQUEST, "invalid request (REQUEST_NULL)")
        self._h = None

    def free(self) -> None:
        """Free the request unless it is a constant."""
        if not self._const:
            self._h = None

    # -- arrays of requests ---------------------------------------------------------
    @staticmethod
    def _ops(requests):
        return [r._h for r in requests if r._h is not None]

    @classmethod
    def Waitall(cls, requests, statuses=None) -> bool:
        """Wait for all of the requests to complete."""
        if statuses is None and type(requests) is list:
            # the common case (waitall without statuses or results to collect)
            _wait_each(requests)
            err = None
            for r in requests:
                try:
                    r._complete(None)
                except Exception as e:
                    err = err or e
            if err is not None:
                raise err
            return True
        cls.waitall(requests, statuses)
        return True

    @classmethod
    def waitall(cls, requests, statuses=None):
        """Wait for all requests; returns the list of received objects."""
        requests = list(requests)
        _wait_each(requests)
        out, err = [], None
        if isinstance(statuses, list):
            while len(statuses) < len(requests):
                statuses.append(Status())
        for i, r in enumerate(requests):
            st = _nth(statuses, i)
            try:
                out.append(r._complete(st))
            except Exception as e:
                err = err or e
                out.append(None)
        if err is not None:
            raise err
        return out

    @classmethod
    def Testall(cls, requests, statuses=None) -> bool:
        """Test for the completion of all of the requests."""
        return cls.testall(requests, statuses)[0]

    @classmethod
    def testall(cls, requests, statuses=None):
        """Test for completion of all; returns ``(flag, objects or None)``."""
        requests = list(requests)
        ops = cls._ops(requests)
        if not all(o.is_done() for o in ops):
            ENGINE.progress()
            if not all(o.is_done() for o in ops):
                return False, None
        return True, cls.waitall(requests, statuses)

    @classmethod
    def Waitany(cls, requests, status=None) -> int:
        """Wait for any of the requests to complete; returns its index."""
        return cls.waitany(requests, status)[0]

    @classmethod
    def waitany(cls, requests, status=None):
        """Wait for any request; returns ``(index, object)``."""
        requests = list(requests)
        if not any(_active(r) for r in requests):
            if status is not None:
                status._clear()
            return UNDEFINED, None
        if not any(_ready(r) for r in requests):
            # (a scan of every request: after progress passes that completed something)
            ENGINE.wait_until(lambda: any(_ready(r) for r in requests), on_events=True)
        for i, r in enumerate(requests):
            if _ready(r):
                return i, r._complete(status)

    @classmethod
    def Testany(cls, requests, status=None):
        """Test for the completion of any request; returns ``(index, flag)``."""
        i, flag, _ = cls.testany(requests, status)
        return i, flag

    @classmethod
    def testany(cls, requests, status=None):
        """Test for any request; returns ``(index, flag, object)``."""
        requests = list(requests)
        if not any(_active(r) for r in requests):
            if status is not None:
                status._clear()
            return UNDEFINED, True, None
        for attempt in (0, 1):
            for i, r in enumerate(requests):
                if _ready(r):
                    return i, True, r._complete(status)
            if attempt == 0:
                ENGINE.progress()
        return UNDEFINED, False, None

    @classmethod
    def Waitsome(cls, requests, statuses=None):
        """Wait for some requests to complete; returns their indices (None if none active)."""
        return cls.waitsome(requests, statuses)[0]

    @classmethod
    def waitsome(cls, requests, statuses=None):
        """Wait for some requests; returns ``(indices, objects)``."""
        requests = list(requests)
        if not any(_active(r) for r in requests):
            return None, None
        if not any(_ready(r) for r in requests):
            # (a scan of every request: after progress passes that completed something)
            ENGINE.wait_until(lambda: any(_ready(r) for r in requests), on_events=True)
        return cls._some(requests, statuses)

    @classmethod
    def _some(cls, requests, statuses):
        idx, objs, err = [], [], None
        for i, r in enumerate(requests):
            if _ready(r):
                idx.append(i)
                try:
                    objs.append(r._complete(_nth(statuses, len(idx) - 1)))
                except Exception as e:
                    err = err or e
                    objs.append(None)
        if err is not None:
            raise err
        return idx, objs

    @classmethod
    def Testsome(cls, requests, statuses=None):
        """Test for completion of some requests; returns their indices."""
        return cls.testsome(requests, statuses)[0]

    @classmethod
    def testsome(cls, requests, statuses=None):
        """Test for some requests; returns ``(indices, objects)``."""
        requests = list(requests)
        if not any(_active(r) for r in requests):
            return None, None
        if not any(_ready(r) for r in requests):
            ENGINE.progress()
        return cls._some(requests, statuses)

    @classmethod
    def Get_status_all(cls, requests, statuses=None) -> bool:
        """Non-destructive test for the completion of all requests."""
        requests = list(requests)
        ops = cls._ops(requests)
        if not all(o.is_done() for o in ops):
            ENGINE.progress()
            if not all(o.is_done() for o in ops):
                return False
        if statuses is not None:
            for i, r in enumerate(requests):
                st = _nth(statuses, i)
                if st is not None:
                    r.Get_status(st)
        return True

    @classmethod
    def get_status_all(cls, requests, statuses=None) -> bool:
        """Non-destructive test for the completion of all requests."""
        return cls.Get_status_all(requests, statuses)

    @classmethod
    def Get_status_any(cls, requests, status=None):
        """Non-destructive test for any request; returns ``(index, flag)``."""
        requests = list(requests)
        if not any(_active(r) for r in requests):
            if status is not None:
                status._clear()
            return UNDEFINED, True
        for attempt in (0, 1):
            for i, r in enumerate(requests):
                if _ready(r):
                    r.Get_status(status)
                    return i, True
            if attempt == 0:
                ENGINE.progress()
        return UNDEFINED, False

    @classmethod
    def get_status_any(cls, requests, status=None):
        """Non-destructive test for any request; returns ``(index, flag)``."""
        return cls.Get_status_any(requests, status)

    @classmethod
    def Get_status_some(cls, requests, statuses=None):
        """Non-destructive test for some requests; returns their indices."""
        requests = list(requests)
        if not any(_active(r) for r in requests):
            return None
        if not any(_ready(r) for r in requests):
            ENGINE.progress()
        idx = [i for i, r in enumerate(requests) if _ready(r)]
        for k, i in enumerate(idx):
            st = _nth(statuses, k)
            if st is not None:
                requests[i].Get_status(st)
        return idx

    @classmethod
    def get_status_some(cls, requests, statuses=None):
        """Non-destructive test for some requests; returns their indices."""
        return cls.Get_status_some(requests, statuses)


def _active(r):
    op = r._h
    return op is not None and (not getattr(op, "persistent", False) or op.active())


def _ready(r):
    return _active(r) and r._h.is_done()


def _wait_each(requests) -> None:
    """Wait for the requests one after the other: each wait progresses
    everything, and a receive waits on ucxpy's native fast path, which also
    hands the frames right behind its message to the receives posted next."""
    for r in requests:
        op = r._h
        if op is not None and not op.is_done():
            ENGINE.wait(op)


def _nth(statuses, i):
    if statuses is None:
        return None
    if isinstance(statuses, list):
        while len(statuses) <= i:
            statuses.append(Status())
        return statuses[i]
    return statuses[i] if i < len(statuses) else None


class Prequest(Request):
    """Persistent request handler."""

    __slots__ = ()

    @classmethod
    def _accepts(cls, impl) -> bool:
        return impl is None or getattr(impl, "persistent", False)

    def _op_checked(self) -> PersistentOp:
        op = self._h
        if op is None or not getattr(op, "persistent", False):
            raise Exception(ERR_REQUEST, "invalid persistent request")
        return op

    def Start(self) -> None:
        """Start a communication with a persistent request."""
        self._op_checked().start()

    def start(self) -> None:
        """Start a communication with a persistent request."""
        self.Start()

    @classmethod
    def Startall(cls, requests) -> None:
        """Start a collection of persistent requests."""
        for r in requests:
            r.Start()

    @classmethod
    def startall(cls, requests) -> None:
        """Start a collection of persistent requests."""
        cls.Startall(requests)

    def Pready(self, partition: int) -> None:
        """Mark a partition of a partitioned send ready."""
        self._partitioned().ready([partition])

    def Pready_range(self, partition_low: int, partition_high: int) -> None:
        """Mark the partitions ``low..high`` (inclusive) ready."""
        self._partitioned().ready(range(partition_low, partition_high + 1))

    def Pready_list(self, partitions) -> None:
        """Mark the listed partitions ready."""
        self._partitioned().ready(list(partitions))

    def Parrived(self, partition: int) -> bool:
        """Test whether a partition of a partitioned receive has arrived."""
        return self._partitioned().arrived(partition)

    def _partitioned(self):
        op = self._op_checked()
        if not hasattr(op, "ready"):
            raise Exception(ERR_REQUEST, "not a partitioned request")
        return op


def make_prequest(starter, cls=Prequest) -> Prequest:
    return cls._wrap(PersistentOp(starter))


class _GrequestOp(_Op):
    __slots__ = ("done", "query", "free_fn", "cancel_fn", "args", "kwargs", "cancelled", "obj")

    def is_done(self):
        return self.done

    def _status(self, status):
        st = status if status is not None else Status()
        st._clear()
        if self.query is not None:
            user_call(self.query, st, *self.args, **self.kwargs)
        return st

    def finish(self, status):
        try:
            st = self._status(status)
        finally:
            if self.free_fn is not None:
                user_call(self.free_fn, *self.args, **self.kwargs)
        err = st.Get_error()
        if err:
            raise Exception(err)
        obj, self.obj = self.obj, None
        return obj

    def peek(self, status):
        self._status(status)

    def cancel(self):
        if self.cancel_fn is not None:
            user_call(self.cancel_fn, self.done, *self.args, **self.kwargs)
        return False


class Grequest(Request):
    """Generalized request handler."""

    __slots__ = ()

    @classmethod
    def _accepts(cls, impl) -> bool:
        return impl is None or isinstance(impl, _GrequestOp)

    @classmethod
    def Start(cls, query_fn=None, free_fn=None, cancel_fn=None, args=None, kwargs=None):
        """Create and return a user-defined request."""
        op = _GrequestOp()
        op.done, op.query, op.free_fn, op.cancel_fn = False, query_fn, free_fn, cancel_fn
        op.args, op.kwargs = tuple(args or ()), dict(kwargs or {})
        op.cancelled, op.obj = False, None
        return cls._wrap(op)

    def Complete(self) -> None:
        """Notify that a user-defined request is complete."""
        op = self._h
        if op is None or not isinstance(op, _GrequestOp):
            raise Exception(ERR_REQUEST, "invalid generalized request")
        if op.done:
            raise Exception(ERR_REQUEST, "generalized request already completed")
        op.done = True

    def complete(self, obj=None) -> None:
        """Notify that a user-defined request is complete (``obj``: what wait returns)."""
        self.Complete()
        self._h.obj = obj


REQUEST_NULL = Request._constant(None)
register_family(Request)
_ = ERR_ARG

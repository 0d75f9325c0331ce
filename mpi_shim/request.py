"""``MPI.Request``, ``Prequest`` and ``Grequest`` (see :mod:`.ops` for the
operations they wrap and how they progress)."""
from __future__ import annotations

from .exceptions import ERR_REQUEST, Exception
from .ops import *  # noqa: F401,F403 - re-exported for the other modules
from .ops import (_INACTIVE, _Op, DoneOp, ENGINE, PickleRecvOp, RecvOp)
from .status import Status

UNDEFINED = -32766


# -- public request classes ---------------------------------------------------
class Request:
    """Handle of a nonblocking operation (``MPI.Request``)."""

    __slots__ = ("_op", "__weakref__")

    def __init__(self, request=None):
        if request is None:
            self._op = None
        elif isinstance(request, Request):
            self._op = request._op
        else:
            raise TypeError("expected a Request")

    def __eq__(self, other):
        if not isinstance(other, Request):
            return NotImplemented
        return self._op is other._op

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def __hash__(self):
        return id(self._op)

    def __bool__(self):
        return self._op is not None

    def __repr__(self):
        return f"<{type(self).__name__} {'null' if self._op is None else 'active'}>"

    @classmethod
    def _from(cls, op):
        r = cls.__new__(cls)
        r._op = op
        return r

    # handles (for fromhandle/toint round trips)
    _handles = {}

    @property
    def handle(self):
        if self._op is None:
            return 0
        h = id(self._op)
        Request._handles[h] = self._op
        return h

    def toint(self):
        return self.handle

    py2f = toint

    @classmethod
    def fromhandle(cls, handle):
        r = cls.__new__(cls)
        Request.__init__(r)
        r._op = Request._handles.get(handle) if handle else None
        return r

    fromint = f2py = fromhandle

    def _done(self):
        """Transition after completion: null (persistent: inactive)."""
        self._op = None

    def _complete(self, status):
        op = self._op
        if op is None:
            if status is not None:
                status._clear()
            return None
        self._done()
        return op.finish(status)

    # -- single request ----------------------------------------------------------
    def Wait(self, status=None):
        if self._op is not None:
            ENGINE.wait(self._op)
        self._complete(status)
        return True

    def wait(self, status=None):
        if self._op is not None:
            ENGINE.wait(self._op)
        return self._complete(status)

    def Test(self, status=None):
        op = self._op
        if op is not None and not op.is_done():
            ENGINE.progress()
            if not op.is_done():
                return False
        self._complete(status)
        return True

    def test(self, status=None):
        op = self._op
        if op is not None and not op.is_done():
            ENGINE.progress()
            if not op.is_done():
                return False, None
        return True, self._complete(status)

    def Get_status(self, status=None):
        op = self._op
        if op is None:
            if status is not None:
                status._clear()
            return True
        if not op.is_done():
            ENGINE.progress()
            if not op.is_done():
                return False
        if status is not None:
            try:
                _peek(op, status)
            except Exception:
                pass
        return True

    def get_status(self, status=None):
        return self.Get_status(status)

    def Cancel(self):
        if self._op is not None:
            self._op.cancel()

    cancel = Cancel

    def Free(self):
        self._op = None

    free = Free

    # -- arrays of requests ---------------------------------------------------------
    @staticmethod
    def _ops(requests):
        return [r._op for r in requests]

    @classmethod
    def Waitall(cls, requests, statuses=None):
        cls.waitall(requests, statuses)
        return True

    @classmethod
    def waitall(cls, requests, statuses=None):
        ops = [r._op for r in requests if r._op is not None]
        ENGINE.wait_until(lambda: all(o.is_done() for o in ops))
        out, err = [], None
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
    def Testall(cls, requests, statuses=None):
        return cls.testall(requests, statuses)[0]

    @classmethod
    def testall(cls, requests, statuses=None):
        ops = [r._op for r in requests if r._op is not None]
        if not all(o.is_done() for o in ops):
            ENGINE.progress()
            if not all(o.is_done() for o in ops):
                return False, None
        return True, cls.waitall(requests, statuses)

    @classmethod
    def Waitany(cls, requests, status=None):
        return cls.waitany(requests, status)[0]

    @classmethod
    def waitany(cls, requests, status=None):
        requests = list(requests)
        if not any(_active(r) for r in requests):
            if status is not None:
                status._clear()
            return UNDEFINED, None
        ENGINE.wait_until(lambda: any(_active(r) and r._op.is_done() for r in requests))
        for i, r in enumerate(requests):
            if _active(r) and r._op.is_done():
                return i, r._complete(status)

    @classmethod
    def Testany(cls, requests, status=None):
        i, flag, _ = cls.testany(requests, status)
        return i, flag

    @classmethod
    def testany(cls, requests, status=None):
        requests = list(requests)
        if not any(_active(r) for r in requests):
            if status is not None:
                status._clear()
            return UNDEFINED, True, None
        for attempt in (0, 1):
            for i, r in enumerate(requests):
                if _active(r) and r._op.is_done():
                    return i, True, r._complete(status)
            if attempt == 0:
                ENGINE.progress()
        return UNDEFINED, False, None

    @classmethod
    def Waitsome(cls, requests, statuses=None):
        return cls.waitsome(requests, statuses)[0]

    @classmethod
    def waitsome(cls, requests, statuses=None):
        requests = list(requests)
        if not any(_active(r) for r in requests):
            return None, None
        ENGINE.wait_until(lambda: any(_active(r) and r._op.is_done() for r in requests))
        return cls._some(requests, statuses)

    @classmethod
    def _some(cls, requests, statuses):
        idx, objs, err = [], [], None
        for i, r in enumerate(requests):
            if _active(r) and r._op.is_done():
                idx.append(i)
                try:
                    objs.append(r._complete(_nth(statuses, len(idx) - 1)))
                except Exception as e:
                    err = err or e
        if err is not None:
            raise err
        return idx, objs

    @classmethod
    def Testsome(cls, requests, statuses=None):
        return cls.testsome(requests, statuses)[0]

    @classmethod
    def testsome(cls, requests, statuses=None):
        requests = list(requests)
        if not any(_active(r) for r in requests):
            return None, None
        if not any(_active(r) and r._op.is_done() for r in requests):
            ENGINE.progress()
        return cls._some(requests, statuses)

    @classmethod
    def Get_status_all(cls, requests, statuses=None):
        ops = [r._op for r in requests if r._op is not None]
        ENGINE.progress()
        flag = all(o.is_done() for o in ops)
        if flag and statuses is not None:
            for i, r in enumerate(requests):
                if i < len(statuses):
                    r.Get_status(statuses[i])
        return flag

    get_status_all = Get_status_all

    @classmethod
    def Get_status_any(cls, requests, status=None):
        requests = list(requests)
        if not any(_active(r) for r in requests):
            if status is not None:
                status._clear()
            return UNDEFINED, True
        ENGINE.progress()
        for i, r in enumerate(requests):
            if _active(r) and r._op.is_done():
                r.Get_status(status)
                return i, True
        return UNDEFINED, False

    get_status_any = Get_status_any

    @classmethod
    def Get_status_some(cls, requests, statuses=None):
        requests = list(requests)
        if not any(_active(r) for r in requests):
            return None
        ENGINE.progress()
        idx = [i for i, r in enumerate(requests) if _active(r) and r._op.is_done()]
        for k, i in enumerate(idx):
            requests[i].Get_status(_nth(statuses, k))
        return idx

    get_status_some = Get_status_some


def _active(r):
    return r._op is not None and r._op is not _INACTIVE


def _nth(statuses, i):
    if statuses is None:
        return None
    if not isinstance(statuses, list):
        return statuses[i] if i < len(statuses) else None
    while len(statuses) <= i:
        statuses.append(Status())
    return statuses[i]


def _peek(op, status):
    """Fill ``status`` without consuming ``op``."""
    if isinstance(op, RecvOp) and op.ureq.exc is None:
        info = op.ureq.result
        status._set(op.comm._rank_of_world(info.source), info.tag & USER_MASK, info.length)
    elif isinstance(op, PickleRecvOp) and op.info is not None:
        info = op.info
        status._set(op.comm._rank_of_world(info.source), info.tag & USER_MASK, info.length)
    elif isinstance(op, DoneOp):
        status._set(op.source, op.tag, op.count)
    else:
        status._clear()


class Prequest(Request):
    """A persistent request: ``Start`` runs it again, completion leaves it inactive."""

    __slots__ = ("_start",)

    def __init__(self, request=None):
        super().__init__(request)
        self._start = getattr(request, "_start", None)

    def _done(self):
        self._op = _INACTIVE

    def Start(self):
        if self._start is None:
            raise Exception(ERR_REQUEST, "inactive persistent request")
        self._op = self._start()

    start = Start

    @classmethod
    def Startall(cls, requests):
        for r in requests:
            r.Start()

    startall = Startall

    def Free(self):
        self._op = None
        self._start = None


def make_prequest(start) -> Prequest:
    r = Prequest()
    r._start = start
    r._op = _INACTIVE
    return r


class _GrequestOp(_Op):
    __slots__ = ("done", "query", "free", "cancel_fn", "args", "kwargs")

    def is_done(self):
        return self.done

    def finish(self, status):
        st = status if status is not None else Status()
        st._clear()
        if self.query is not None:
            self.query(st, *self.args, **self.kwargs)
        if self.free is not None:
            self.free(*self.args, **self.kwargs)
        return None

    def cancel(self):
        if self.cancel_fn is not None:
            self.cancel_fn(self.done, *self.args, **self.kwargs)
        return False


class Grequest(Request):
    """Generalized request: completes when the user calls ``Complete``."""

    __slots__ = ()

    def __init__(self, request=None):
        if request is not None and not isinstance(request, Grequest):
            raise TypeError("expected a Grequest")
        super().__init__(request)

    @classmethod
    def Start(cls, query_fn=None, free_fn=None, cancel_fn=None, args=None, kwargs=None):
        op = _GrequestOp()
        op.done, op.query, op.free, op.cancel_fn = False, query_fn, free_fn, cancel_fn
        op.args, op.kwargs = tuple(args or ()), dict(kwargs or {})
        r = cls()
        r._op = op
        return r

    def Complete(self):
        if self._op is not None:
            self._op.done = True

    complete = Complete


REQUEST_NULL = Request()

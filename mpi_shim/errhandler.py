"""``MPI.Errhandler``: what happens when an MPI call on an object fails.

Predefined handlers: ``ERRORS_RETURN`` (the call raises ``MPI.Exception``:
mpi4py's default for every object it creates), ``ERRORS_ARE_FATAL`` and
``ERRORS_ABORT`` (the job is aborted).  A user handler made by
``Comm/Win/File/Session.Create_errhandler(fn)`` is called as
``fn(obj, errorcode)``; afterwards the call raises as with ERRORS_RETURN.
"""
from __future__ import annotations

import sys

from .exceptions import ERR_ARG, ERR_ERRHANDLER, SUCCESS, Exception
from .handle import Handle, register_family

MAX_USER_ERRHANDLERS = 32        # per object kind, like mpi4py's callback table


class ErrhandlerImpl:
    __slots__ = ("name", "fn", "kind", "predefined", "_hid", "__weakref__")

    def __init__(self, name, fn=None, kind=None, predefined=False):
        self.name, self.fn, self.kind, self.predefined = name, fn, kind, predefined


_user_count = {}                 # kind -> live user handlers


class Errhandler(Handle):
    """Error handler."""

    __slots__ = ()

    def __reduce__(self):
        if self._h is not None and self._h.fn is not None:
            raise ValueError("cannot serialize a user-defined error handler")
        return super().__reduce__()

    def __repr__(self):
        return f"<Errhandler {self._h.name if self._h else 'ERRHANDLER_NULL'}>"

    def Free(self) -> None:
        """Free the error handler (the objects using it keep it)."""
        h = self._h
        if h is None:
            raise Exception(ERR_ERRHANDLER, "invalid error handler (ERRHANDLER_NULL)")
        if h is not None and h.fn is not None and not getattr(h, "_freed", False):
            _user_count[h.kind] = max(_user_count.get(h.kind, 1) - 1, 0)
        self._h = None

    def free(self) -> None:
        """Free the error handler unless it is a constant."""
        if not self._const and self._h is not None:
            self.Free()

    @classmethod
    def _create(cls, fn, kind):
        if not callable(fn):
            raise TypeError("error handler function must be callable")
        n = _user_count.get(kind, 0)
        if n >= MAX_USER_ERRHANDLERS:
            raise RuntimeError(f"cannot create more than {MAX_USER_ERRHANDLERS} "
                               f"user-defined {kind} error handlers")
        _user_count[kind] = n + 1
        return cls._wrap(ErrhandlerImpl("user", fn, kind))

    @staticmethod
    def _checked(errhandler, kind):
        if not isinstance(errhandler, Errhandler):
            raise TypeError("expected an Errhandler")
        h = errhandler._h
        if h is None:
            raise Exception(ERR_ARG, "invalid error handler (ERRHANDLER_NULL)")
        if h.kind is not None and h.kind != kind:
            raise Exception(ERR_ARG, f"error handler made for {h.kind} objects")
        return h


def errhandler_of(impl) -> Errhandler:
    """A new Errhandler object referring to ``impl`` (what ``Get_errhandler`` returns)."""
    return Errhandler._wrap(impl)


def raise_in(obj, exc: Exception, call_only: bool = False) -> None:
    """Apply ``obj``'s error handler to ``exc``.

    ``call_only`` (Call_errhandler): run the handler without raising for
    ERRORS_RETURN and user handlers.
    """
    impl = getattr(obj, "_h", None)
    if impl is None and call_only:
        obj._impl()                     # a null object: its class's error
    h = getattr(impl, "errhandler", None) if impl is not None else None
    code = exc.Get_error_code()
    if h is None or h is _RETURN or h is _EXCEPTIONS:
        if call_only:
            return
        raise exc
    if h.fn is not None:
        h.fn(obj, code)
        if call_only:
            return
        raise exc
    if code == SUCCESS and call_only:
        return
    _abort(obj, exc)


#: how ERRORS_ARE_FATAL ends the job: ``abort(errorcode)``, set by .comm
#: (COMM_WORLD.Abort), which imports this module, not the other way round
_ABORT_JOB = []


def set_abort(fn) -> None:
    """Make ``fn(errorcode)`` what ERRORS_ARE_FATAL calls."""
    _ABORT_JOB[:] = [fn]


def _abort(obj, exc) -> None:
    sys.stderr.write(f"MPI error on {obj!r}: {exc}; aborting (ERRORS_ARE_FATAL)\n")
    sys.stderr.flush()
    if _ABORT_JOB:
        _ABORT_JOB[0](exc.Get_error_class() or 1)
    else:                                   # (no communicator yet: nothing else to end)
        raise SystemExit(exc.Get_error_class() or 1)


_RETURN = ErrhandlerImpl("ERRORS_RETURN", predefined=True)
_FATAL = ErrhandlerImpl("ERRORS_ARE_FATAL", predefined=True)
_ABORT = ErrhandlerImpl("ERRORS_ABORT", predefined=True)
_EXCEPTIONS = _RETURN

ERRHANDLER_NULL = Errhandler._constant(None)
ERRORS_RETURN = Errhandler._constant(_RETURN)
ERRORS_ARE_FATAL = Errhandler._constant(_FATAL)
ERRORS_ABORT = Errhandler._constant(_ABORT)
register_family(Errhandler)
# impl-level names the object implementations store
ERRORS_RETURN_IMPL, ERRORS_ARE_FATAL_IMPL = _RETURN, _FATAL
_ = ERR_ERRHANDLER

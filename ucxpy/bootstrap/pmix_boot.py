"""Bootstrap over PMIx, for jobs started by Open MPI's ``mpirun`` (its
PMIx server in each ``orted``), PRRTE's ``prterun`` or Slurm's
``srun --mpi=pmix`` - no MPI library and no mpi4py needed.

Theory of operation.  The launcher runs a PMIx server on every node and
tells each rank where it is (``PMIX_NAMESPACE``, ``PMIX_RANK``,
``PMIX_SERVER_URI*``).  ``PMIx_Init`` connects this process to it, through
the system's libpmix (``ucxpy._pmix``, a cffi binding of the few calls used,
built at install time where ``libpmix-dev`` is installed); the job's size,
this rank's local rank and the number of ranks on its node come from the
job-level data the server hands over at init (``PMIX_JOB_SIZE``,
``PMIX_LOCAL_RANK``, ``PMIX_LOCAL_SIZE``).

The collectives are the PMIx modex:

* allgather: ``PMIx_Put`` of this rank's value under a key naming the
  collective (``ucxpy.ag.<seq>``), ``PMIx_Commit``, a ``PMIx_Fence`` over the
  whole namespace with ``PMIX_COLLECT_DATA``, then ``PMIx_Get`` of that key
  from every rank (the data is local after the fence);
* bcast: the root puts ``ucxpy.bc.<seq>``, fence with data, every rank gets
  it from the root;
* barrier: a fence, with data too, so that what :meth:`put` published
  becomes visible to :meth:`lookup` (as after a PMI barrier).

Values are PMIx byte objects: any size, no encoding.  Nothing ever waits
without a deadline: fences and gets are the non-blocking calls
(``PMIx_Fence_nb``, ``PMIx_Get_nb``), whose completion PMIx's progress thread
reports through a callback; the caller waits for it with the collective's
timeout and raises :class:`~ucxpy.bootstrap.BootstrapTimeout` when it
passes.  ``PMIX_TIMEOUT`` (a second more) goes to the server too, so that it
drops the abandoned operation where it supports that.  ``PMIx_Init`` and
``PMIx_Finalize`` talk to the server in blocking calls, so they run in a
helper thread the caller waits for with a deadline.  A timed-out collective
cannot be withdrawn (as in MPI): the bootstrap is unusable after it, and the
right response is :meth:`PmixBootstrap.abort`.

Failures.  The launcher kills the job when a rank dies (Open MPI and Slurm
both do by default), as under PMI.  Besides, an event handler is registered
for PMIx's process-termination and abort events and for the loss of the
server connection (the node daemon died): :meth:`check_failures` raises
:class:`~ucxpy.errors.PeerFailure` for each one reported (a lost server has
``peer=None``), and a collective waiting when one arrives raises it at once
instead of waiting for its timeout.  The callbacks only append to a list.

Errors map to :mod:`ucxpy.errors`: ``PMIX_ERR_TIMEOUT`` to
:class:`~ucxpy.bootstrap.BootstrapTimeout`, every other failing status to
:class:`~ucxpy.errors.BootstrapError` naming the call and PMIx's string.
"""
from __future__ import annotations

import atexit
import math
import os
import socket
import threading
import time

from ..errors import BootstrapError, PeerFailure
from .base import Bootstrap, BootstrapTimeout, resolve_timeout

try:
    from .._pmix import ffi, lib
    _IMPORT_ERROR = None
except ImportError as _e:    # built only where libpmix-dev's pmix.h exists
    ffi = lib = None
    _IMPORT_ERROR = _e

__all__ = ["PmixBootstrap", "pmix_server_present", "unavailable_reason"]

#: seconds PMIx_Init and PMIx_Finalize may take before the bootstrap gives up
CONNECT_TIMEOUT = 30.0
FINALIZE_TIMEOUT = 10.0
#: how often a waiting collective looks at reported failures
_POLL = 0.05
_LOST_SERVER = ("lost the connection to the PMIx server (the launcher's daemon on this "
                "node died)")


def pmix_server_present(env) -> bool:
    """Whether the launcher says a PMIx server serves this process
    (``PMIX_NAMESPACE``, ``PMIX_RANK`` and a ``PMIX_SERVER_URI*``)."""
    return bool(env.get("PMIX_NAMESPACE")) and "PMIX_RANK" in env and \
        any(k.startswith("PMIX_SERVER_URI") for k in env)


def unavailable_reason() -> str:
    """'' when the PMIx binding is loaded, else why the bootstrap cannot run."""
    if lib is None:
        return (f"ucxpy._pmix is not built ({_IMPORT_ERROR}): install libpmix-dev "
                "(make deps) and reinstall ucxpy")
    return ""


# -- completions, reported by PMIx's progress thread ---------------------------------
class _Op:
    """One non-blocking PMIx call in flight.  Holds every argument PMIx may
    read after the call returned, and itself (through its handle in
    ``_IN_FLIGHT``) until PMIx completes it, even after the caller gave up."""

    __slots__ = ("done", "status", "value", "handle", "args")

    def __init__(self, *args):
        self.done = threading.Event()
        self.status = None
        self.value = None
        self.args = args
        self.handle = ffi.new_handle(self)
        _IN_FLIGHT[id(self)] = self.handle

    def finish(self, status, value=None):
        self.status, self.value = status, value
        _IN_FLIGHT.pop(id(self), None)
        self.done.set()


_IN_FLIGHT: dict = {}
#: (status, namespace, rank or None) of every failure event, in arrival order
_EVENTS: list = []


def _value(kv):
    """A pmix_value_t as bytes (byte object, string) or int, else None."""
    data, size = ffi.new("const char **"), ffi.new("size_t *")
    if lib.ucxpy_pmix_value_bytes(kv, data, size) == 0:
        return ffi.buffer(data[0], size[0])[:] if size[0] else b""
    out = ffi.new("uint64_t *")
    if lib.ucxpy_pmix_value_uint(kv, out) == 0:
        return int(out[0])
    return None


if lib is not None:
    @ffi.def_extern()
    def ucxpy_pmix_op_done(status, cbdata):
        ffi.from_handle(cbdata).finish(status)

    @ffi.def_extern()
    def ucxpy_pmix_value_done(status, kv, cbdata):
        ok = status == lib.PMIX_SUCCESS and kv != ffi.NULL
        ffi.from_handle(cbdata).finish(status, _value(kv) if ok else None)

    @ffi.def_extern()
    def ucxpy_pmix_event(ref, status, source, info, ninfo, results, nresults, cbfunc, cbdata):
        nspace, rank = None, None
        for i in range(ninfo):
            if ffi.string(info[i].key) == ffi.string(lib.PMIX_EVENT_AFFECTED_PROC):
                proc = lib.ucxpy_pmix_value_proc(ffi.addressof(info[i].value))
                if proc != ffi.NULL:
                    nspace, rank = ffi.string(proc.nspace).decode(), int(proc.rank)
        _EVENTS.append((int(status), nspace, rank))
        if cbfunc != ffi.NULL:       # let the other handlers (an MPI library's) see it
            cbfunc(lib.PMIX_SUCCESS, ffi.NULL, 0, ffi.NULL, ffi.NULL, cbdata)


def _failure_codes():
    return [lib.PMIX_ERR_LOST_CONNECTION, lib.PMIX_ERR_UNREACH, lib.PMIX_ERR_PROC_ABORTED,
            lib.PMIX_ERR_PROC_REQUESTED_ABORT, lib.PMIX_ERR_PROC_ABORTED_BY_SIG,
            lib.PMIX_ERR_EXIT_NONZERO_TERM, lib.PMIX_ERR_PROC_TERM_WO_SYNC,
            lib.PMIX_PROC_TERMINATED, lib.PMIX_EVENT_PROC_TERMINATED,
            lib.PMIX_EVENT_NODE_DOWN]


def _errstr(rc) -> str:
    return f"{ffi.string(lib.PMIx_Error_string(rc)).decode()} ({rc})"


def _bounded(fn, timeout, what):
    """``fn()`` in a helper thread, waited for ``timeout`` seconds (a blocking
    PMIx call that a dead or stuck server could hold forever)."""
    box = []
    t = threading.Thread(target=lambda: box.append(fn()), name=f"ucxpy-pmix-{what}",
                         daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        raise BootstrapTimeout(f"PMIx {what} did not return within {timeout:g} s "
                               "(is the launcher's PMIx server alive?)")
    return box[0]


class PmixBootstrap(Bootstrap):
    """Bootstrap over the launcher's PMIx server (``PMIx_Init`` ...
    ``PMIx_Finalize``)."""

    kind = "pmix"

    def __init__(self, env=None):
        env = os.environ if env is None else env
        why = unavailable_reason()
        if why:
            raise BootstrapError(f"PMIx bootstrap unavailable: {why}")
        if not pmix_server_present(env):
            raise BootstrapError("PMIx bootstrap needs a PMIx server: PMIX_NAMESPACE, "
                                 "PMIX_RANK and PMIX_SERVER_URI* are not all set")
        self._closed = False
        self._handler = None
        self._seq = 0
        self._failed: dict = {}           # rank (None: the server) -> message
        self._unreported: list = []
        self._seen = 0                    # events of _EVENTS already looked at
        me = ffi.new("pmix_proc_t *")
        rc = _bounded(lambda: lib.PMIx_Init(me, ffi.NULL, 0), CONNECT_TIMEOUT, "init")
        if rc != lib.PMIX_SUCCESS:
            raise BootstrapError(f"PMIx_Init failed: {_errstr(rc)}")
        atexit.register(self.close)        # a rank that never finalizes is an error to mpirun
        self._me = me
        self.nspace = ffi.string(me.nspace).decode()
        self.rank = int(me.rank)
        self.hostname = socket.gethostname()
        self._register_failure_handler()
        self.size = self._job_int("PMIX_JOB_SIZE")
        if self.size is None:
            raise BootstrapError("PMIx: the server gave no job size (PMIX_JOB_SIZE)")
        local_rank = self._job_int("PMIX_LOCAL_RANK", self.rank)
        local_size = self._job_int("PMIX_LOCAL_SIZE")
        if local_rank is None or local_size is None:
            self.local_rank, self.local_size = self._placement_from_hostnames()
        else:
            self.local_rank, self.local_size = local_rank, local_size

    # -- calls ------------------------------------------------------------------
    def _proc(self, rank):
        p = ffi.new("pmix_proc_t *")
        ffi.memmove(p.nspace, self._me.nspace, len(self._me.nspace))
        p.rank = rank
        return p

    @staticmethod
    def _info(timeout=None, collect=False, optional=False):
        """The directives of a fence or get: ``PMIX_TIMEOUT`` (whole seconds,
        one more than ours so that our deadline fires first),
        ``PMIX_COLLECT_DATA``, ``PMIX_OPTIONAL`` (look only in the data this
        process holds).  Returns ``(array, count)``."""
        items = []
        if timeout is not None:
            seconds = min(math.ceil(timeout) + 1, 2**31 - 1)
            items.append((lib.PMIX_TIMEOUT, ffi.new("int *", seconds), lib.PMIX_INT))
        for key, wanted in ((lib.PMIX_COLLECT_DATA, collect), (lib.PMIX_OPTIONAL, optional)):
            if wanted:
                items.append((key, ffi.new("bool *", True), lib.PMIX_BOOL))
        if not items:
            return ffi.NULL, 0
        arr = ffi.new("pmix_info_t[]", len(items))
        for i, (key, data, kind) in enumerate(items):
            rc = lib.PMIx_Info_load(ffi.addressof(arr[i]), key, data, kind)
            if rc != lib.PMIX_SUCCESS:
                raise BootstrapError(f"PMIx_Info_load failed: {_errstr(rc)}")
        return arr, len(items)

    def _error(self, status, what):
        """The exception for a PMIx call that failed with ``status``."""
        if status == lib.PMIX_ERR_TIMEOUT:
            return BootstrapTimeout(f"rank {self.rank}: PMIx {what}: the server timed the "
                                    "operation out")
        if status in (lib.PMIX_ERR_UNREACH, lib.PMIX_ERR_LOST_CONNECTION):
            return PeerFailure(f"rank {self.rank}: PMIx {what}: {_LOST_SERVER}", peer=None)
        return BootstrapError(f"rank {self.rank}: PMIx {what} failed: {_errstr(status)}")

    def _check_failed(self, what) -> None:
        """Raise PeerFailure if a failure was reported: a fence over the job
        cannot complete without every rank and the server."""
        self._note_events()
        if self._failed:
            rank, message = next(iter(self._failed.items()))
            raise PeerFailure(f"rank {self.rank}: PMIx {what}: {message}", peer=rank)

    def _wait(self, ops, what, timeout, missing_ok=False):
        """Wait until every op completed, for ``timeout`` seconds (None:
        forever); raise on the first failing status (``missing_ok``: a key
        not found is None) or on a failure reported meanwhile."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for op in ops:
            while not op.done.wait(_POLL):
                self._check_failed(what)
                if deadline is not None and time.monotonic() >= deadline:
                    raise BootstrapTimeout(
                        f"rank {self.rank}: PMIx {what} timed out after {timeout:g} s "
                        "(some rank did not join; PMIx cannot say which)")
            if op.status == lib.PMIX_ERR_NOT_FOUND and missing_ok:
                continue
            if op.status not in (lib.PMIX_SUCCESS, lib.PMIX_OPERATION_SUCCEEDED):
                raise self._error(op.status, what)
        return [op.value for op in ops]

    def _started(self, op, rc, what):
        if rc == lib.PMIX_OPERATION_SUCCEEDED:      # done at once: no callback comes
            op.finish(lib.PMIX_SUCCESS)
        elif rc != lib.PMIX_SUCCESS:
            op.finish(rc)
            raise self._error(rc, what)
        return op

    def _fence(self, what, timeout, collect=True) -> None:
        self._check_open()
        self._check_failed(what)
        info, n = self._info(timeout, collect)
        op = _Op(info)
        self._started(op, lib.PMIx_Fence_nb(ffi.NULL, 0, info, n, lib.ucxpy_pmix_op_done,
                                           op.handle), what)
        self._wait([op], what, timeout)

    def _get_nb(self, rank, key: str, timeout, optional=False):
        """Start ``PMIx_Get_nb`` of ``key`` put by ``rank``; its op."""
        proc = self._proc(rank)
        info, n = self._info(timeout, optional=optional)
        ckey = ffi.new("char[]", key.encode())
        op = _Op(proc, ckey, info)
        return self._started(op, lib.PMIx_Get_nb(proc, ckey, info, n,
                                                 lib.ucxpy_pmix_value_done, op.handle),
                             f"get {key!r}")

    def _gets(self, ranks, key: str, what, timeout) -> list:
        """The values of ``key`` put by each of ``ranks``, fetched in parallel."""
        return self._wait([self._get_nb(r, key, timeout) for r in ranks], what, timeout)

    def _job_int(self, name, rank=None):
        """An integer of the job-level (or, with ``rank``, that process's) data
        the server gave at init, or None when it gave none."""
        key = ffi.string(getattr(lib, name)).decode()
        op = self._get_nb(lib.PMIX_RANK_WILDCARD if rank is None else rank, key, 5.0)
        if op.done.wait(5.0) and op.status == lib.PMIX_SUCCESS and isinstance(op.value, int):
            return op.value
        return None

    def _check_open(self):
        if self._closed:
            raise BootstrapError("the PMIx bootstrap is closed")

    # -- key/value store (PMI's semantics: visible after the next fence) -------------
    def _put(self, key: str, value: bytes) -> None:
        self._check_open()
        data = bytes(value)
        buf = ffi.new("char[]", data)
        bo = ffi.new("pmix_byte_object_t *", {"bytes": buf, "size": len(data)})
        val = ffi.new("pmix_value_t *")
        rc = lib.PMIx_Value_load(val, bo, lib.PMIX_BYTE_OBJECT)
        if rc == lib.PMIX_SUCCESS:
            rc = lib.PMIx_Put(lib.PMIX_GLOBAL, key.encode(), val)
            lib.PMIx_Value_destruct(val)
        if rc == lib.PMIX_SUCCESS:
            rc = lib.PMIx_Commit()
        if rc != lib.PMIX_SUCCESS:
            raise BootstrapError(f"rank {self.rank}: PMIx put {key!r} failed: {_errstr(rc)}")

    def put(self, key: str, value: bytes) -> None:
        """Publish ``value`` under ``key``; visible to every rank after the
        next collective (each is a fence that collects data).  PMIx keeps
        each rank's values apart: when several ranks put one key,
        :meth:`lookup` returns the lowest rank's."""
        self._put(f"ucxpy.kv.{key}", value)

    def get(self, key: str, timeout=None) -> bytes:
        """The value put under ``key`` (waits, re-asking, until ``timeout``)."""
        timeout = resolve_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        nap = 0.001
        while True:
            v = self.lookup(key)
            if v is not None:
                return v
            if deadline is not None and time.monotonic() >= deadline:
                raise BootstrapTimeout(f"rank {self.rank}: PMIx key {key!r} never appeared")
            time.sleep(nap)
            nap = min(nap * 2, 0.05)

    def lookup(self, key: str):
        """The value put under ``key`` (visible after a fence), or None: every
        rank's copy is looked for in the data this process already holds
        (``PMIX_OPTIONAL``; a get of a key no rank names cannot go to the
        server: PMIx keys belong to a rank)."""
        self._check_open()
        key = f"ucxpy.kv.{key}"
        ops = [self._get_nb(r, key, 5.0, optional=True) for r in range(self.size)]
        found = self._wait(ops, f"lookup {key!r}", 5.0, missing_ok=True)
        return next((v for v in found if v is not None), None)

    # -- collectives --------------------------------------------------------------
    def allgather(self, data: bytes, timeout=None) -> list:
        timeout = resolve_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        seq, what = self._seq, f"allgather #{self._seq}"
        self._seq += 1
        key = f"ucxpy.ag.{seq}"
        self._put(key, data)
        self._fence(what, timeout)
        others = [r for r in range(self.size) if r != self.rank]
        remaining = None if deadline is None else max(0.001, deadline - time.monotonic())
        got = dict(zip(others, self._gets(others, key, what, remaining)))
        got[self.rank] = bytes(data)
        return [got[r] for r in range(self.size)]

    def barrier(self, timeout=None) -> None:
        what = f"barrier #{self._seq}"
        self._seq += 1
        self._fence(what, resolve_timeout(timeout))

    def bcast(self, data, root: int = 0, timeout=None) -> bytes:
        self._check_root(root)
        timeout = resolve_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        seq, what = self._seq, f"bcast #{self._seq}"
        self._seq += 1
        key = f"ucxpy.bc.{seq}"
        if self.rank == root:
            if data is None:
                raise BootstrapError("bcast: the root must supply data")
            self._put(key, data)
        self._fence(what, timeout)
        if self.rank == root:
            return bytes(data)
        remaining = None if deadline is None else max(0.001, deadline - time.monotonic())
        return self._gets([root], key, what, remaining)[0]

    # -- placement, keys ---------------------------------------------------------
    def job_key(self, timeout=None) -> bytes:
        """Rank 0 makes the job key (or takes ``UCXPY_AUTH_KEY``) and
        broadcasts it through the PMIx server (collective)."""
        return self._broadcast_job_key(timeout)

    def listen_address(self):
        return self._placement_listen_address()

    def universe_size(self):
        """PMIx's ``PMIX_UNIV_SIZE`` (the slots of the allocation), else the base's."""
        n = self._job_int("PMIX_UNIV_SIZE")
        return n if n else super().universe_size()

    def appnum(self):
        n = self._job_int("PMIX_APPNUM", self.rank)
        return n if n is not None else super().appnum()

    # -- failures and teardown ----------------------------------------------------
    def _register_failure_handler(self) -> None:
        codes = _failure_codes()
        arr = ffi.new("pmix_status_t[]", codes)
        # without a registration callback the call blocks and returns the
        # handler's reference (>= 0) or an error
        ref = lib.PMIx_Register_event_handler(arr, len(codes), ffi.NULL, 0,
                                              lib.ucxpy_pmix_event, ffi.NULL, ffi.NULL)
        self._handler = ref if ref >= 0 else None

    def _note_events(self) -> None:
        """Turn the events reported since the last look into failures."""
        while self._seen < len(_EVENTS):
            status, nspace, rank = _EVENTS[self._seen]
            self._seen += 1
            if status in (lib.PMIX_ERR_LOST_CONNECTION, lib.PMIX_ERR_UNREACH):
                rank, message = None, _LOST_SERVER
            elif nspace not in (None, self.nspace) or rank == self.rank:
                continue
            elif rank is None or rank >= self.size:
                rank, message = None, f"the launcher reported a failure: {_errstr(status)}"
            else:
                message = f"rank {rank} failed: {_errstr(status)}"
            if rank not in self._failed:
                self._failed[rank] = message
                self._unreported.append(PeerFailure(message, peer=rank))

    def check_failures(self) -> None:
        """Raise :class:`~ucxpy.errors.PeerFailure` for each failure PMIx
        reported since the last call (a peer's termination or abort, or the
        loss of the server: ``peer=None``).  Costs a list-length comparison
        when nothing happened."""
        if self._seen < len(_EVENTS):
            self._note_events()
        if self._unreported:
            raise self._unreported.pop(0)

    def abort(self, message: str = "", errorcode: int = 1):
        """``PMIx_Abort``: the launcher kills the job; does not return."""
        self._abort_and_exit(message, errorcode, lambda code: lib.PMIx_Abort(
            code, (message or "abort").encode(), ffi.NULL, 0))

    def close(self) -> None:
        """Finalize PMIx (bounded by a deadline).  Idempotent; also run at exit."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._handler is not None:
            lib.PMIx_Deregister_event_handler(self._handler, ffi.NULL, ffi.NULL)
        try:
            _bounded(lambda: lib.PMIx_Finalize(ffi.NULL, 0), FINALIZE_TIMEOUT, "finalize")
        except BootstrapError:
            pass

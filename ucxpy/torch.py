"""torch.distributed on ucxpy: ``import ucxpy.torch`` registers backend
``"ucxpy"`` for CPU tensors.

Theory of operation
-------------------
A process has one ucxpy worker for every group (``_process``).  Under
``torchrun`` (or any ``init_method``) it is created at the first group and
the groups wire up through torch's Store: each member publishes its worker
address under its group rank, reads the others' and connects (connecting
twice to a worker returns the same endpoint, so groups share endpoints).
The job key that authenticates wire-up is made by group rank 0 of the first
group and passed through the Store.  Under ucxpy's own launchers
(``ucxpy-run``, ``mpiexec``, ``srun``), with no ``MASTER_ADDR``, importing
this module joins the ucxpy job (:func:`ucxpy.init`) and sets the variables
torch's ``env://`` rendezvous reads (rank, size, and the address of a Store
served by rank 0), so ``dist.init_process_group("ucxpy")`` needs nothing
more; the world group then uses the job's endpoints.

A group is a :class:`ProcessGroupUcxpy` (a Python ``dist.ProcessGroup``):
every collective is a generator of ucxpy's collective engine
(:mod:`ucxpy.coll`) on the group's :class:`ucxpy.coll.Team`, started at the
call and moved by the worker's progress; the call returns a
:class:`UcxpyWork` whose ``wait()`` progresses until it is done.  Its
``get_future()`` (DDP's Reducer chains its bucket work on it) completes the
work first, so the future is never left waiting for progress nobody drives.
Contiguous tensors go to ucxpy as they are (a numpy view of their memory,
no copy); others are copied to a contiguous buffer and back.  Reductions run
on the received bytes in the tensor's dtype: by numpy's ufuncs where numpy
has the dtype (the same IEEE / two's-complement results as torch's), by
torch otherwise (:class:`TorchOp`: bfloat16).  AVG is a sum divided by the
group size (floor division for integers), PREMUL_SUM multiplies by its
factor before summing.

Errors: a dead peer, a timeout (the group's ``timeout``, the default of
every wait) or a message that does not fit (mismatched collectives) raise
``torch.distributed.DistBackendError`` from ``wait()``; an operation or
dtype that cannot be reduced raises ``ValueError`` at the call.
"""
from __future__ import annotations

import ctypes
import datetime
import os
import secrets
import socket
import zlib
TYPE_CHECKING = False      # (typing is imported for type checkers only: issue 44)
if TYPE_CHECKING:
    from typing import List, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (AllgatherOptions, AllreduceCoalescedOptions,
                                        AllreduceOptions, AllToAllOptions, BarrierOptions,
                                        BroadcastOptions, GatherOptions, ReduceOp,
                                        ReduceOptions, ReduceScatterOptions, ScatterOptions)

from . import coll, config
from .bootstrap import detect_mpi_launcher
from .bootstrap.pmi_boot import pmi_available
from .config import Config
from .context import Context
from .errors import UcxpyError
from .tag import ANY_SOURCE, FULL_MASK, RESERVED_TAG_BASE

__all__ = ["ProcessGroupUcxpy", "UcxpyWork", "TorchOp", "BACKEND"]

#: the backend's name, for ``dist.init_process_group``
BACKEND = "ucxpy"
_P2P_KIND = 0xFD << 48              # (collectives use 0xFE: ucxpy.coll.Team)
_R = ReduceOp.RedOpType


# -- the process's worker -----------------------------------------------------------
class _Proc:
    """This process's ucxpy worker (one for all groups) and, under a ucxpy
    launcher, the job's World."""
    world = None
    worker = None


def _process(store, group_rank: int):
    """The worker, made at the first group (under torchrun) with the job
    key group rank 0 published in ``store``."""
    if _Proc.worker is not None:
        return _Proc.worker
    if group_rank == 0:
        store.set("ucxpy/job_key", secrets.token_hex(32))
    key = store.get("ucxpy/job_key").decode()
    cfg = Config.from_env()
    if not cfg.auth_key and not cfg.auth_key_file:
        cfg = Config.from_env(auth_key=key)
    w = _Proc.worker = Context(cfg).create_worker()
    # more ranks than CPUs here: waits yield the CPU (torchrun says how many)
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local and local.isdigit():
        w.set_local_ranks(int(local))
    return w


def _launched_by_ucxpy_or_mpi(env) -> bool:
    return bool(config.setting("UCXPY_RUN_ADDR", env)) or pmi_available(env) \
        or detect_mpi_launcher(env) is not None


def _join_launcher_job() -> None:
    """Under ucxpy-run, mpiexec or srun with no MASTER_ADDR: join the ucxpy
    job and set what torch's env:// rendezvous reads, its Store served by
    rank 0 on a free port (of the loopback when the job has one host)."""
    env = os.environ
    if env.get("MASTER_ADDR") or env.get("TORCHELASTIC_RUN_ID") or \
            not _launched_by_ucxpy_or_mpi(env):
        return
    from .spmd import init      # deferred: only a ucxpy-run or mpiexec job joins (not torchrun)
    w = init()
    _Proc.world, _Proc.worker = w, w.worker
    boot = w.bootstrap
    hosts = boot.allgather(socket.gethostname().encode())
    if w.rank == 0:
        host = boot.listen_address() or ("127.0.0.1" if len(set(hosts)) == 1 else
                                         socket.gethostbyname(socket.gethostname()))
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        msg = f"{host} {port}".encode()
    else:
        msg = b""
    host, port = boot.bcast(msg, 0).decode().split()
    local = [h for h in hosts if h == hosts[w.rank]]
    env.update(MASTER_ADDR=host, MASTER_PORT=port, RANK=str(w.rank), WORLD_SIZE=str(w.size),
               LOCAL_RANK=str(hosts[:w.rank].count(hosts[w.rank])),
               LOCAL_WORLD_SIZE=str(len(local)))


# -- reductions in torch ---------------------------------------------------------------
_NP_VIEW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.complex128}
#: dtypes numpy computes as torch does (elementwise IEEE / two's complement):
#: reduced by numpy's ufuncs on the bytes, no tensor wrapping per block
_NP_TYPES = {torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16,
             torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16,
             torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_,
             torch.complex64: np.complex64, torch.complex128: np.complex128}
_UFUNCS = {_R.SUM: np.add, _R.AVG: np.add, _R.PREMUL_SUM: np.add, _R.PRODUCT: np.multiply,
           _R.MIN: np.minimum, _R.MAX: np.maximum, _R.BAND: np.bitwise_and,
           _R.BOR: np.bitwise_or, _R.BXOR: np.bitwise_xor}
_FUNCS = {_R.SUM: torch.add, _R.AVG: torch.add, _R.PREMUL_SUM: torch.add,
          _R.PRODUCT: torch.mul, _R.MIN: torch.minimum, _R.MAX: torch.maximum,
          _R.BAND: torch.bitwise_and, _R.BOR: torch.bitwise_or, _R.BXOR: torch.bitwise_xor}
_BITWISE = (_R.BAND, _R.BOR, _R.BXOR)


class TorchOp:
    """``combine_to(a, b, out)`` of the engine on numpy views of a torch
    dtype's memory (same item size), computed by torch in that dtype."""

    commutative = True
    __slots__ = ("fn", "dtype")

    def __init__(self, fn, dtype):
        self.fn, self.dtype = fn, dtype

    def combine_to(self, a, b, out) -> None:
        dt = self.dtype
        self.fn(torch.from_numpy(a).view(dt), torch.from_numpy(b).view(dt),
                out=torch.from_numpy(out).view(dt))


#: (kind, dtype) -> the engine's op, for the ops without a factor (made once)
_OPS: dict = {}


def _op(reduce_op, dtype):
    """(engine op, kind, factor) for a ReduceOp on ``dtype``; ValueError at
    the call for what cannot be reduced."""
    kind, factor = reduce_op, None
    if isinstance(reduce_op, ReduceOp):
        state = reduce_op.__getstate__()
        kind, factor = state[0], state[1] if len(state) > 1 else None
    if factor is None:
        op = _OPS.get((kind, dtype))
        if op is not None:
            return op, kind, None
    op = _make_op(kind, factor, dtype)
    if factor is None:
        _OPS[(kind, dtype)] = op
    return op, kind, factor


def _make_op(kind, factor, dtype):
    if kind not in _FUNCS:
        raise ValueError(f"ucxpy backend: unsupported reduce op {kind}")
    if dtype.is_complex and kind in (_R.MIN, _R.MAX):
        raise ValueError(f"ucxpy backend: {kind.name} of complex tensors")
    if kind in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"ucxpy backend: {kind.name} of {dtype} tensors")
    if kind == _R.PREMUL_SUM and factor is None:
        raise ValueError("ucxpy backend: PREMUL_SUM without a factor")
    if dtype == torch.bool and kind in (_R.SUM, _R.AVG, _R.PREMUL_SUM):
        raise ValueError(f"ucxpy backend: {kind.name} of bool tensors (use MAX/BOR)")
    if dtype in _NP_TYPES:
        return coll.NumpyOp(kind.name, _UFUNCS[kind])
    return TorchOp(_FUNCS[kind], dtype)


# -- tensors as numpy views --------------------------------------------------------
class _Held(np.ndarray):
    """A numpy view of a tensor's memory that keeps the tensor alive (its
    slices and memoryviews keep it in turn): a send of an asynchronous
    operation may read an input the caller already dropped."""

    __slots__ = ("tensor",)


def _view(t) -> np.ndarray:
    """A contiguous tensor's memory as a flat numpy array of its dtype (or of
    its item size's unsigned type: bf16), NOT holding the tensor: made once
    per (address, length, dtype) and kept (a ctypes array at the address).
    A collective on a tensor then costs a few cheap reads instead of a chain
    of torch calls, which run cold after every large operation (tens of
    microseconds per call at 1 MiB).  A stale entry names memory no tensor
    owns and is never read: an entry is used only for a live tensor at that
    address.  Only what completes while the caller holds ``t`` may use it
    bare; :attr:`_Flat.np` is the view that holds the tensor."""
    n = t.numel()
    key = (t.data_ptr(), n, t.dtype)
    v = _VIEWS.get(key)
    if v is None:
        item = t.element_size()
        if item not in _NP_VIEW:
            raise ValueError(f"ucxpy backend: dtype {t.dtype} (item size {item})")
        dt = _NP_TYPES.get(t.dtype, _NP_VIEW[item])
        if not n:
            return np.empty(0, dt)
        v = np.frombuffer((ctypes.c_char * (n * item)).from_address(key[0]), dt)
        if len(_VIEWS) >= _VIEWS_KEPT:
            _VIEWS.clear()
        _VIEWS[key] = v
    return v


#: _view's arrays, and how many it keeps
_VIEWS: dict = {}
_VIEWS_KEPT = 256


class _Flat:
    """A tensor's memory as a flat numpy array of its item size: the tensor
    itself when contiguous (no copy), else a contiguous copy written back by
    :meth:`back` (``writes``: the operation changes it).  ``raw`` is the
    bare array (:func:`_view`), for what completes within the call (the
    shared-memory team's operations); ``np`` holds the tensor, for what
    runs on after it returns."""

    __slots__ = ("t", "tmp", "raw", "_np", "writes")

    def __init__(self, t, writes=True):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"ucxpy backend: expected a tensor, got {type(t).__name__}")
        if not t.is_cpu:
            raise ValueError(f"ucxpy backend: a {t.device.type} tensor (CPU only)")
        if t.is_sparse:
            raise ValueError("ucxpy backend: sparse tensors are not supported")
        self.t, self.writes = t, writes
        self.tmp = t if t.is_contiguous() else t.contiguous()
        self.raw = _view(self.tmp)
        self._np = None

    @property
    def np(self) -> np.ndarray:
        h = self._np
        if h is None:
            h = self._np = self.raw.view(_Held)
            h.tensor = self.tmp
        return h

    def bytes(self) -> memoryview:
        return memoryview(self.np).cast("B")

    def back(self) -> None:
        if self.writes and self.tmp is not self.t:
            with torch.no_grad():
                self.t.copy_(self.tmp)


def _rows(t) -> int:
    """Bytes per index of dimension 0 (all_to_all_single's splits)."""
    return t.numel() // t.shape[0] * t.element_size() if t.dim() and t.shape[0] else 0


def _split(size, splits, n, what):
    """Byte counts per rank: ``splits`` (rows) or an even split of ``size``."""
    rows, row = size
    if splits:
        if len(splits) != n:
            raise ValueError(f"ucxpy backend: {what} has {len(splits)} entries for {n} ranks")
        if sum(splits) != rows:
            raise ValueError(f"ucxpy backend: {what} sums to {sum(splits)}, dimension 0 is {rows}")
        return [s * row for s in splits]
    if rows % n:
        raise ValueError(f"ucxpy backend: dimension 0 ({rows}) does not split evenly in {n}")
    return [rows // n * row] * n


# -- works -------------------------------------------------------------------------------
class UcxpyWork(dist.Work):
    """One operation in flight: ``wait()`` progresses ucxpy until it is done,
    then writes back what non-contiguous outputs need; ``result()`` and
    ``get_future()`` give the output tensors."""

    def __init__(self, pg, reqs, outputs, finish=None):
        super().__init__()
        self._pg, self._reqs, self._outputs, self._finish = pg, reqs, outputs, finish
        self._exc: Optional[BaseException] = None
        self._finished = False

    def _done(self) -> bool:
        return all(r.done for r in self._reqs)

    def is_completed(self) -> bool:
        if not self._finished and not self._done():
            self._pg.worker.progress()
        return self._finished or self._done()

    def is_success(self) -> bool:
        return self.is_completed() and self._first_exc() is None

    def _first_exc(self):
        return self._exc or next((r.exc for r in self._reqs if r.exc is not None), None)

    def exception(self):
        return self._first_exc()

    def wait(self, timeout=None) -> bool:
        if self._finished:
            if self._exc is not None:
                raise self._exc
            return True
        limit = self._pg.timeout_s
        if isinstance(timeout, datetime.timedelta) and timeout.total_seconds() > 0:
            limit = timeout.total_seconds()
        try:
            if not self._done():
                self._pg.worker.wait_until(self._done, limit, "torch.distributed operation",
                                           on_events=True)
            exc = self._first_exc()
            if exc is not None:
                raise exc
            if self._finish is not None:
                self._finish()
        except dist.DistBackendError as e:
            self._exc = e
        except (UcxpyError, TimeoutError, OSError, ValueError, RuntimeError) as e:
            self._exc = self._pg._error(e)
        self._finished = True
        self._pg._retire(self)
        if self._exc is not None:
            raise self._exc
        return True

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        fut = torch.futures.Future()
        try:
            self.wait()
        except BaseException as e:          # (set on the future, raised by its wait())
            fut.set_exception(e)
            return fut
        fut.set_result(self._outputs)
        return fut


# -- the process group ---------------------------------------------------------------------
def _team_id(group_id: str) -> int:
    """The same 16-bit id at every member: torch's default group names are
    the global count of groups (every rank creates every group, in order);
    hashed names go through CRC-32."""
    try:
        return int(group_id) % 0xFFFF + 1
    except ValueError:
        return zlib.crc32(group_id.encode()) % 0xFFFF + 1


class ProcessGroupUcxpy(dist.ProcessGroup):
    """A torch.distributed group on ucxpy: its members' endpoints as a
    :class:`ucxpy.coll.Team` and every operation on the collective engine."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta,
                 group_id: str = "0", global_ranks: Optional[List[int]] = None):
        super().__init__(rank, size)
        self._group_name = group_id
        self.timeout_s = timeout.total_seconds() if timeout else 1800.0
        w = _Proc.world
        if w is not None and size == w.size and (global_ranks is None or
                                                 list(global_ranks) == list(range(size))):
            worker, eps = w.worker, list(w.eps)
        else:
            worker = _process(store, rank)
            store.set(f"ucxpy/addr/{rank}", worker.address_bytes)
            addrs = [store.get(f"ucxpy/addr/{r}") for r in range(size)]
            eps = [worker.connect(a) for a in addrs]
        self.worker = worker
        self.team = coll.Team(worker, eps, rank, _team_id(group_id))
        self.p2p_base = RESERVED_TAG_BASE | _P2P_KIND | (self.team.base & (0xFFFF << 32))
        self._inflight = set()
        self._shm_team = None if size > 1 else False
        self._colls = 0

    # -- bookkeeping --
    def getBackendName(self) -> str:
        return BACKEND

    @property
    def group_name(self) -> str:
        """torch's name of the group (DeviceMesh and the functional
        collectives look groups up by it)."""
        return self._group_name

    def __repr__(self):
        return f"ProcessGroupUcxpy(rank {self.rank()} of {self.size()})"

    def _retire(self, work) -> None:
        self._inflight.discard(work)

    def _start(self, gen, outputs, finish=None) -> UcxpyWork:
        try:
            req = coll.CollRequest(self.worker, gen)
        except (UcxpyError, OSError) as e:
            raise self._error(e) from e
        work = UcxpyWork(self, [req], outputs, finish)
        self._inflight.add(work)
        return work

    def _shm(self, what: Optional[str] = None, nbytes: int = 0):
        """The group's shared-memory team (ucxpy.shmteam) when it takes
        collective ``what`` of ``nbytes`` (None: a collective it never
        takes).  Every collective calls this first, so every member counts
        the same calls: the team forms at the group's second collective
        (collective and blocking; None everywhere when a member cannot
        join, e.g. the group spans hosts)."""
        t = self._shm_team
        if t is None:
            self._colls += 1
            if self._colls < 2:
                return None
            try:
                t = self._shm_team = coll.form_shm_team(self.team) or False
            except (UcxpyError, TimeoutError, OSError) as e:
                self._shm_team = False
                raise self._error(e) from e
        if not t or what is None or t.closed or nbytes > t.limits[what]:
            return None
        return t

    def _now(self, fn, outputs, finish=None) -> UcxpyWork:
        """Run a shared-memory team operation at the call (in call order on
        every member); a completed work."""
        try:
            fn()
            if finish is not None:
                finish()
        except (UcxpyError, TimeoutError, OSError) as e:
            raise self._error(e) from e
        work = UcxpyWork(self, [], outputs)
        work._finished = True               # (its wait() returns at once)
        return work

    def _error(self, e: BaseException) -> dist.DistBackendError:
        """ucxpy's error as torch.distributed's (naming this rank)."""
        err = dist.DistBackendError(f"ucxpy backend (rank {self.rank()} of {self.size()}): "
                                    f"{type(e).__name__}: {e}")
        err.__cause__ = e
        return err

    def _one(self, tensors, what):
        if len(tensors) != 1:
            raise ValueError(f"ucxpy backend: {what} takes one tensor per process "
                             f"(got {len(tensors)})")
        return tensors[0]

    # -- reductions --
    def _reduce_args(self, t, reduce_op):
        op, kind, factor = _op(reduce_op, t.dtype)
        f = _Flat(t)
        if kind == _R.PREMUL_SUM:
            with torch.no_grad():
                f.tmp.mul_(factor)
        return f, op, kind

    def _avg(self, f, kind):
        if kind == _R.AVG:
            with torch.no_grad():
                if f.tmp.dtype.is_floating_point or f.tmp.dtype.is_complex:
                    f.tmp.div_(self.size())
                else:
                    f.tmp.div_(self.size(), rounding_mode="floor")

    def allreduce(self, tensors, opts=AllreduceOptions()):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        t = self._one(tensors, "allreduce")
        f, op, kind = self._reduce_args(t, opts.reduceOp)

        def finish():
            self._avg(f, kind)
            f.back()
        shm = self._shm("allreduce", f.raw.nbytes)
        if shm is not None:
            return self._now(lambda: shm.allreduce(f.raw, f.raw, op.combine_to), [t], finish)
        return self._start(coll.allreduce(self.team, f.np, op, out=f.np), [t], finish)

    def allreduce_coalesced(self, tensors, opts=AllreduceCoalescedOptions()):
        works = [self.allreduce([t], opts) for t in tensors]
        return _Joined(self, works, list(tensors))

    def reduce(self, tensors, opts=ReduceOptions()):
        t = self._one(tensors, "reduce")
        f, op, kind = self._reduce_args(t, opts.reduceOp)
        root = opts.rootRank
        self._check_rank(root)
        me = self.rank() == root
        scratch = f.np.copy()

        def finish():
            if me:
                f.np[...] = scratch
                self._avg(f, kind)
                f.back()
        shm = self._shm("reduce", f.np.nbytes)
        if shm is not None:
            return self._now(lambda: shm.reduce(f.np, scratch if me else None, op.combine_to,
                                                root), [t], finish)
        return self._start(coll.reduce(self.team, f.np, op, root, out=scratch if me else None),
                           [t], finish)

    def _check_rank(self, r):
        if not 0 <= r < self.size():
            raise ValueError(f"ucxpy backend: rank {r} outside a group of {self.size()}")

    def reduce_scatter(self, output_tensors, input_tensors, opts=ReduceScatterOptions()):
        out = self._one(output_tensors, "reduce_scatter")
        ins = self._one(input_tensors, "reduce_scatter")
        if len(ins) != self.size():
            raise ValueError(f"ucxpy backend: reduce_scatter needs {self.size()} inputs")
        f, op, kind = self._reduce_args(out, opts.reduceOp)
        blocks = []
        for x in ins:
            if x.numel() != out.numel() or x.dtype != out.dtype:
                raise ValueError("ucxpy backend: reduce_scatter inputs must match the output")
            b = _Flat(x.clone() if kind == _R.PREMUL_SUM else x, writes=False)
            if kind == _R.PREMUL_SUM:
                with torch.no_grad():
                    b.tmp.mul_(_op(opts.reduceOp, out.dtype)[2])
            blocks.append(b.np)

        def finish():
            self._avg(f, kind)
            f.back()
        self._shm()
        return self._start(coll.reduce_scatter(self.team, blocks, op, f.np), [out], finish)

    def reduce_scatter_single(self, output, input, opts=ReduceScatterOptions()):
        n = self.size()
        if input.numel() != output.numel() * n:
            raise ValueError(f"ucxpy backend: reduce_scatter input has {input.numel()} "
                             f"elements, not {n} x {output.numel()}")
        chunks = list(input.reshape(-1).chunk(n)) if input.is_contiguous() else \
            list(input.contiguous().reshape(-1).chunk(n))
        return self.reduce_scatter([output], [chunks], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=ReduceScatterOptions()):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _Joined(self, works, list(outputs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # -- data movement --
    def broadcast(self, tensors, opts=BroadcastOptions()):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        t = self._one(tensors, "broadcast")
        root = opts.rootRank
        self._check_rank(root)
        f = _Flat(t, writes=self.rank() != root)
        shm = self._shm("bcast", f.np.nbytes)
        if shm is not None:
            return self._now(lambda: shm.bcast(f.bytes(), root), [t], f.back)
        return self._start(coll.bcast(self.team, f.bytes(), root), [t], f.back)

    def allgather(self, output_tensors, input_tensors, opts=AllgatherOptions()):
        outs = self._one(output_tensors, "allgather")
        x = self._one(input_tensors, "allgather")
        if len(outs) != self.size():
            raise ValueError(f"ucxpy backend: allgather needs {self.size()} outputs")
        flats = [_Flat(o) for o in outs]
        for o in outs:
            if o.numel() * o.element_size() != x.numel() * x.element_size():
                raise ValueError("ucxpy backend: allgather outputs must match the input size")
        src = _Flat(x, writes=False)

        def finish():
            for g in flats:
                g.back()
        b = src.np.nbytes
        shm = self._shm("allgather", b * self.size())
        if shm is not None:
            whole = np.empty(b * self.size(), np.uint8)

            def gathered():
                shm.allgather(src.np.view(np.uint8), whole)
                for i, g in enumerate(flats):
                    g.np.view(np.uint8)[:] = whole[i * b:(i + 1) * b]
            return self._now(gathered, [outs], finish)
        return self._start(coll.allgather(self.team, src.bytes(), [g.bytes() for g in flats]),
                           [outs], finish)

    def all_gather_single(self, output, input, opts=AllgatherOptions()):
        n = self.size()
        if output.numel() != input.numel() * n:
            raise ValueError(f"ucxpy backend: all_gather output has {output.numel()} elements, "
                             f"not {n} x {input.numel()}")
        f = _Flat(output)
        src = _Flat(input, writes=False)
        whole = f.bytes()
        k = src.bytes().nbytes
        shm = self._shm("allgather", k * n)
        if shm is not None:
            return self._now(lambda: shm.allgather(src.np.view(np.uint8), f.np.view(np.uint8)),
                             [output], f.back)
        blocks = [whole[i * k:(i + 1) * k] for i in range(n)]
        return self._start(coll.allgather(self.team, src.bytes(), blocks), [output], f.back)

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=AllgatherOptions()):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _Joined(self, works, list(outputs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def allgather_coalesced(self, output_lists, inputs, opts=AllgatherOptions()):
        works = [self.allgather([o], [i], opts) for o, i in zip(output_lists, inputs)]
        return _Joined(self, works, list(output_lists))

    def gather(self, output_tensors, input_tensors, opts=GatherOptions()):
        x = self._one(input_tensors, "gather")
        root = opts.rootRank
        self._check_rank(root)
        src = _Flat(x, writes=False)
        flats = None
        if self.rank() == root:
            outs = self._one(output_tensors, "gather")
            if len(outs) != self.size():
                raise ValueError(f"ucxpy backend: gather needs {self.size()} outputs")
            flats = [_Flat(o) for o in outs]

        def finish():
            for g in flats or ():
                g.back()
        self._shm()
        return self._start(coll.gather(self.team, src.bytes(),
                                       [g.bytes() for g in flats] if flats else None, root),
                           list(output_tensors), finish)

    def scatter(self, output_tensors, input_tensors, opts=ScatterOptions()):
        out = self._one(output_tensors, "scatter")
        root = opts.rootRank
        self._check_rank(root)
        f = _Flat(out)
        parts = None
        if self.rank() == root:
            ins = self._one(input_tensors, "scatter")
            if len(ins) != self.size():
                raise ValueError(f"ucxpy backend: scatter needs {self.size()} inputs")
            parts = [_Flat(i, writes=False).bytes() for i in ins]
        self._shm()
        return self._start(coll.scatter(self.team, parts, f.bytes(), root), [out], f.back)

    def alltoall(self, output_tensors, input_tensors, opts=AllToAllOptions()):
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"ucxpy backend: alltoall needs {n} inputs and {n} outputs")
        outs = [_Flat(o) for o in output_tensors]
        ins = [_Flat(i, writes=False) for i in input_tensors]

        def finish():
            for g in outs:
                g.back()
        self._shm()
        return self._start(coll.alltoall(self.team, [i.bytes() for i in ins],
                                         [o.bytes() for o in outs]), list(output_tensors), finish)

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          opts=AllToAllOptions()):
        n = self.size()
        if output.dtype != input.dtype:
            raise ValueError("ucxpy backend: all_to_all_single input and output dtypes differ")
        sc = _split((input.shape[0] if input.dim() else 0, _rows(input)), input_split_sizes, n,
                    "input_split_sizes")
        rc = _split((output.shape[0] if output.dim() else 0, _rows(output)), output_split_sizes,
                    n, "output_split_sizes")
        f = _Flat(output)
        src = _Flat(input, writes=False)
        # (the same choice on every member: splits given or not, by the call)
        even = not input_split_sizes and not output_split_sizes
        shm = self._shm("alltoall", src.np.nbytes if even else 1 << 62)
        if shm is not None:
            return self._now(lambda: shm.alltoall(src.np.view(np.uint8), f.np.view(np.uint8)),
                             [output], f.back)
        return self._start(coll.alltoallv(self.team, src.bytes(), sc, f.bytes(), rc), [output],
                           f.back)

    alltoall_base = all_to_all_single

    def barrier(self, opts=BarrierOptions()):
        shm = self._shm("bcast", 0)
        if shm is not None:
            return self._now(shm.barrier, [])
        return self._start(coll.barrier(self.team), [])

    # -- point to point --
    def _p2p_tag(self, tag: int) -> int:
        if not 0 <= tag <= 0xFFFF_FFFF:
            raise ValueError(f"ucxpy backend: tag {tag} outside 0..2**32-1")
        return self.p2p_base | tag

    def send(self, tensors, dst: int, tag: int = 0):
        t = self._one(tensors, "send")
        self._check_rank(dst)
        f = _Flat(t, writes=False)
        try:
            req = self.team.eps[dst].tag_send_nb(f.bytes(), self._p2p_tag(tag))
        except UcxpyError as e:
            raise self._error(e) from e
        work = UcxpyWork(self, [req], [t])
        work._keep = f                      # (the bytes stay alive until sent)
        return work

    def recv(self, tensors, src: int, tag: int = 0):
        t = self._one(tensors, "recv")
        self._check_rank(src)
        f = _Flat(t)
        req = self.worker.tag_recv_nb(f.bytes(), self._p2p_tag(tag), FULL_MASK,
                                      self.team.peers[src])
        return UcxpyWork(self, [req], [t], f.back)

    def recv_anysource(self, tensors, tag: int = 0):
        t = self._one(tensors, "recv")
        f = _Flat(t)
        req = self.worker.tag_recv_nb(f.bytes(), self._p2p_tag(tag), FULL_MASK, ANY_SOURCE)
        work = UcxpyWork(self, [req], [t], f.back)
        peers = self.team.peers

        def source_rank():
            return peers.index(req.result.source) if req.done and req.exc is None else -1
        work._source_rank = source_rank
        return work


class _Joined(UcxpyWork):
    """Several works as one (the coalesced forms)."""

    def __init__(self, pg, works, outputs):
        super().__init__(pg, [r for w in works for r in w._reqs], outputs, None)
        self._works = works

    def wait(self, timeout=None) -> bool:
        for w in self._works:
            w.wait(timeout)
        self._finished = True
        return True


def _create(opts, backend_options=None):
    """The backend's creator (``extended_api``)."""
    return ProcessGroupUcxpy(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                             str(opts.group_id), list(opts.global_ranks_in_group))


def register() -> None:
    """Register backend ``"ucxpy"`` for CPU tensors (done at import)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])


register()
_join_launcher_job()

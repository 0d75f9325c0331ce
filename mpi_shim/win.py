"""One-sided communication (``MPI.Win``) on ucxpy RMA.

Put/Get use ucxpy's put/get on registered memory (mapped shared memory for
``Allocate``, user buffers through CMA or active messages for ``Create``).

The accumulate family: on 4- and 8-byte integers with SUM, REPLACE, NO_OP,
BAND, BOR or BXOR (what hardware atomics cover) every element is updated
with a word atomic (ucxpy's C11 atomics), wherever the update runs, so that
all of them are atomic with respect to each other (MPI's default
``accumulate_ops=same_op_no_op``).  A single element (``Fetch_and_op``,
``Compare_and_swap``, one-element accumulates) goes straight to ucxpy's
``atomic_fetch``/``atomic_post``: a direct atomic instruction on mapped
memory, else one small RMA frame served by ucxpy at the target.  Everything
else (other types and ops, several elements) runs at the target in an
active message handler (numpy ops on the window memory, or the same word
atomics where they apply), which serializes concurrent updates; each one is
acknowledged, so ``Flush`` waits for all of them.  A single-element atomic
is not issued while accumulates of this origin are still in flight to that
target, which keeps MPI's accumulate ordering.

Passive target locks are granted by a lock manager at the target, PSCW
uses post/complete notifications; Fence is flush + barrier.
"""
from __future__ import annotations

import functools
import pickle
import sys

from ucxpy.lazy import lazy_import
np = lazy_import("numpy", globals())   # (deferred: ucxpy.lazy)

import ucxpy

from . import attr

try:                    # a window's table of mapped targets for the C calls (.accel)
    from ._accel import WinTargets as _WinTargets
except ImportError:     # (not built: the Python methods serve every call)
    _WinTargets = None
from .comm import COMM_WORLD, Comm
from .datatype import describe, from_description, reduction_dtype
from .msgspec import Msg, byte_view, parse
from .errhandler import ERRORS_RETURN_IMPL, Errhandler, errhandler_of, raise_in
from .msgspec import _PLAIN_FORMATS, _PLAIN_TYPES, parse_target
from .exceptions import (ERR_ARG, ERR_DISP, ERR_RANK, ERR_RMA_SHARED, ERR_RMA_SYNC, ERR_WIN,
                         Exception, translate)
from .handle import Handle, register_family
from ucxpy.buffers import BufferExporter
from .info import WIN_BASE, WIN_CREATE_FLAVOR, WIN_DISP_UNIT, WIN_MODEL, WIN_SIZE, Info
from .op import NO_OP, REPLACE, SUM, Op, _by_name
from .packing import contiguous_range, span
from .request import ENGINE, DoneOp, Request
from .status import PROC_NULL
from ucxpy.atomics import OPS as ATOMIC_OPS, POST_OPS, apply as apply_atomic

AM_ACC, AM_REPLY = 0x4D50, 0x4D51
FLAVOR_CREATE, FLAVOR_ALLOCATE, FLAVOR_DYNAMIC, FLAVOR_SHARED = 1, 2, 3, 4
WIN_FLAVOR_CREATE, WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_DYNAMIC, WIN_FLAVOR_SHARED = 1, 2, 3, 4
WIN_FLAVOR = WIN_CREATE_FLAVOR
WIN_SEPARATE, WIN_UNIFIED = 1, 2
LOCK_EXCLUSIVE, LOCK_SHARED = 234, 235
MODE_NOCHECK, MODE_NOSTORE, MODE_NOPUT, MODE_NOPRECEDE, MODE_NOSUCCEED = 1024, 2048, 4096, 8192, 16384
_WINS = {}              # window id -> WinImpl
_pending = {}           # reply id -> callback(data)
_ids = iter(range(1, 1 << 62))


#: accumulate ops that word atomics implement (NO_OP: a fetch-and-add of 0)
_ORDER = sys.byteorder      # of the words ucxpy's atomics take and return
_WORD_MASK = {4: (1 << 32) - 1, 8: (1 << 64) - 1}
_WORD = {}                  # datatype impl -> its size as an atomic word (0: none)
#: numpy element type -> (word size, signed, the first unsigned value that
#: stands for a negative one, 2**bits) for Fetch_and_op's one-pass path
#: (filled on first use: numpy is imported then, ucxpy.lazy)
_NP_WORD = {}


def _np_word(dt):
    """The ``_NP_WORD`` entry of numpy dtype ``dt``, or None."""
    if not _NP_WORD:
        for t in map(np.dtype, ("=i4", "=i8", "=u4", "=u8")):
            signed = t.kind == "i"
            _NP_WORD[t] = (t.itemsize, signed, 1 << (8 * t.itemsize - signed), 1 << 8 * t.itemsize)
    return _NP_WORD.get(dt)
_ATOMIC_OP = {"SUM": "add", "REPLACE": "swap", "NO_OP": "add", "BAND": "and", "BOR": "or",
              "BXOR": "xor"}


def _atomic_width(np_dtype, opname: str, kind: str) -> int:
    """Element size when this accumulate runs as word atomics, else 0."""
    if np_dtype is None or np_dtype.kind not in "iu" or np_dtype.itemsize not in (4, 8):
        return 0
    return np_dtype.itemsize if kind == "cas" or opname in _ATOMIC_OP else 0


def _setup():
    if getattr(_setup, "done", False):
        return
    _setup.done = True
    ENGINE.worker.set_am_handler(AM_ACC, _on_request)
    ENGINE.worker.set_am_handler(AM_REPLY, _on_reply)


def _addr_of(view) -> int:
    if view.nbytes == 0:
        return 0
    return np.frombuffer(view, np.uint8).__array_interface__["data"][0]


class WinImpl:
    def __init__(self, comm: Comm, view, disp_unit, flavor, mh=None, keep=None):
        _setup()
        self.comm = comm                 # private duplicate: window control traffic
        c = comm._c
        self.id = c.ctx
        self.view, self.disp_unit, self.flavor = view, disp_unit, flavor
        self.mh, self.keep = mh, keep
        self.base = _addr_of(view)
        self.rank, self.size = c.rank, c.size
        self.ranks = c.group
        self.name, self.info, self.attrs, self.errhandler = "", {}, {}, ERRORS_RETURN_IMPL
        self.predefined = False
        self.reqs = {}                   # target -> [ucxpy requests / pending markers]
        self.after = []                  # unpack closures run at flush
        self.inflight = {}               # target -> number of unacknowledged AM ops
        self.lock_state = [0, 0]         # exclusive holder count, shared count
        self.lock_queue = []             # (origin world rank, reply id, type)
        self.posts, self.completes = {}, {}
        self.start_group = self.post_group = None
        # registered before the exchange below: once a peer has our entry it
        # may send lock or accumulate requests at once
        _WINS[self.id] = self
        me = (self.base, view.nbytes, disp_unit, mh.pack_rkey() if mh else b"")
        self.peers = comm.allgather(me)
        self.rkeys = []
        self.eps = c.eps                 # the communicator's endpoints, by rank
        for r, (addr, n, du, rk) in enumerate(self.peers):
            ep = c.eps[r]
            self.rkeys.append(ep.unpack_rkey(rk) if rk and r != self.rank else None)
        # the mapped targets for the C calls (mpi_shim.accel): Put, Get, Flush
        # and the one-word atomics on them take one native step
        self._native = None if _WinTargets is None else \
            _WinTargets(self.size, self.reqs, self.after, self.inflight)
        if self._native is not None:
            for r, rk in enumerate(self.rkeys):
                if rk is not None and rk.native is not None:
                    base, _, du, _ = self.peers[r]
                    self._native.set(r, rk.native, base - rk.base, du)

    # -- targets ------------------------------------------------------------
    def _target(self, origin: Msg, target_rank, target):
        disp, count, dtype = parse_target(target, origin.count, origin.dtype)
        if not (0 <= target_rank < self.size):
            raise Exception(ERR_RANK, f"invalid target rank {target_rank}")
        du = self.peers[target_rank][2]
        return disp * du, count, dtype

    def _track(self, target, req):
        if not req.done:
            self.reqs.setdefault(target, []).append(req)

    def _plain_offset(self, o: Msg, target_rank, target):
        """Byte offset in the target window of a whole contiguous origin
        buffer sent to a plain displacement (None or an int), or None when
        the general target parser must look at it."""
        if not (o.whole and (target is None or type(target) is int)
                and 0 <= target_rank < self.size):
            return None
        if target is not None and target < 0:
            raise Exception(ERR_DISP, f"invalid target displacement {target}")
        return (target or 0) * self.peers[target_rank][2]

    def put(self, origin, target_rank, target):
        o = parse(origin)
        roff = self._plain_offset(o, target_rank, target)
        if roff is not None:                 # one block, as below
            data = o.view
            if target_rank == self.rank:
                self.view[roff:roff + len(data)] = data
            else:
                self._track(target_rank, self.comm._c.eps[target_rank].put_nb(
                    data, self.peers[target_rank][0] + roff, self.rkeys[target_rank]))
            return
        off, count, dtype = self._target(o, target_rank, target)
        data = o.pack()
        for roff, piece in _blocks(dtype, count, off, data):
            if target_rank == self.rank:
                self.view[roff:roff + len(piece)] = piece
            else:
                rk = self.rkeys[target_rank]
                self._track(target_rank, self.comm._c.eps[target_rank].put_nb(
                    piece, self.peers[target_rank][0] + roff, rk))

    def get(self, origin, target_rank, target):
        o = parse(origin, writable=True)
        roff = self._plain_offset(o, target_rank, target)
        if roff is not None:                 # one block, as below
            dst = o.view
            if target_rank == self.rank:
                dst[:] = self.view[roff:roff + len(dst)]
            else:
                self._track(target_rank, self.comm._c.eps[target_rank].get_nb(
                    dst, self.peers[target_rank][0] + roff, self.rkeys[target_rank]))
            return
        off, count, dtype = self._target(o, target_rank, target)
        c = o.contig()
        buf = c if c is not None else memoryview(bytearray(o.nbytes))
        pos = 0
        for roff, n in _blocks(dtype, count, off, None):
            dst = buf[pos:pos + n]
            if target_rank == self.rank:
                dst[:] = self.view[roff:roff + n]
            else:
                self._track(target_rank, self.comm._c.eps[target_rank].get_nb(
                    dst, self.peers[target_rank][0] + roff, self.rkeys[target_rank]))
            pos += n
        if c is None:
            self.after.append(lambda: o.unpack(bytes(buf)))

    def acc(self, kind, origin, result, target_rank, target, op, compare=None):
        """Accumulate-family operation executed at the target."""
        o = parse(origin) if origin is not None else None
        r = parse(result, writable=True) if result is not None else None
        ref = o if o is not None else r
        off, count, dtype = self._target(ref, target_rank, target)
        unit = reduction_dtype(dtype)
        if unit is None:
            raise Exception(ERR_ARG, "accumulate needs a target type made of one basic type")
        data = bytes(o.pack()) if o is not None and op is not NO_OP else b""
        cmp = bytes(parse(compare).pack()) if compare is not None else b""
        dense = contiguous_range(off, count, dtype._impl().typemap) == (off, off + unit.itemsize)
        size = _atomic_width(unit, op.name, kind) if dense else 0
        rk = self.rkeys[target_rank] if target_rank != self.rank else None
        if size and count == 1 and rk is not None and not self.inflight.get(target_rank) \
                and (self.peers[target_rank][0] + off) % size == 0:
            self._word_atomic(kind, op.name, target_rank, off, size, data, cmp, r)
            return
        hdr = (self.id, kind, op.name, describe(dtype), off, count, cmp)
        if target_rank == self.rank:
            old = _apply(self, hdr, data)
            if r is not None:
                _store(r, old)
            return
        rid = next(_ids)
        self.inflight[target_rank] = self.inflight.get(target_rank, 0) + 1

        def done(payload, target_rank=target_rank):
            self.inflight[target_rank] -= 1
            if r is not None:
                _store(r, payload)
        _pending[rid] = done
        ep = self.comm._c.eps[target_rank]
        ep.am_send_nb(AM_ACC, pickle.dumps((rid, hdr)), data)

    def word_atomic(self, kind, o, r, c, target_rank, disp, op) -> bool:
        """Fetch_and_op / Compare_and_swap of one whole-buffer element as one
        ucxpy atomic when :meth:`acc` would choose that path too (a remote
        target with a remote key, a 4 or 8 byte integer, an op the atomics
        have, an aligned address, no emulated accumulate in flight); False
        to take :meth:`acc`."""
        if not (o.whole and r.whole and (c is None or c.whole)) or type(disp) is not int \
                or disp < 0 or target_rank == self.rank or not 0 <= target_rank < self.size:
            return False
        rk = self.rkeys[target_rank]
        if rk is None or self.inflight.get(target_rank):
            return False
        h = o.dtype._h
        size = _WORD.get(h)
        if size is None:
            unit = reduction_dtype(o.dtype)
            size = _WORD[h] = unit.itemsize if unit is not None and unit.kind in "iu" \
                and unit.itemsize in (4, 8) else 0
        name = op.name
        if not size or (kind != "cas" and name not in _ATOMIC_OP):
            return False
        off = disp * self.peers[target_rank][2]
        if (self.peers[target_rank][0] + off) % size:
            return False
        self._word_atomic(kind, name, target_rank, off, size,
                          b"" if name == "NO_OP" else bytes(o.view),
                          bytes(c.view) if c is not None else b"", r)
        return True

    def _word_atomic(self, kind, opname, target_rank, off, size, data, cmp, result):
        """One element through ucxpy's atomics (see the module docstring)."""
        if kind == "acc" and opname == "NO_OP":
            return
        value = int.from_bytes(data[:size], _ORDER) if data else 0
        ep, rk = self.comm._c.eps[target_rank], self.rkeys[target_rank]
        addr = self.peers[target_rank][0] + off
        if kind == "cas":
            compare = int.from_bytes(cmp[:size], _ORDER)
            req = ep.atomic_fetch_nb("cswap", value, addr, rk, size, compare)
        elif kind == "acc" and _ATOMIC_OP[opname] in POST_OPS:
            req = ep.atomic_post(_ATOMIC_OP[opname], value, addr, rk, size)
        else:
            req = ep.atomic_fetch_nb(_ATOMIC_OP[opname], value, addr, rk, size)
        if result is not None:
            mask = (1 << (8 * size)) - 1
            req.add_done_callback(lambda q: q.exc is None and _store(
                result, (q.result & mask).to_bytes(size, _ORDER)))
        self._track(target_rank, req)

    def track_word(self, req, target_rank, result, word):
        """Store a word atomic's old value into numpy ``result`` when ``req``
        completes (Fetch_and_op's one-pass path, when not done at once)."""
        req.add_done_callback(lambda q: q.exc is None and _store_word(result, q.result, word))
        self._track(target_rank, req)

    # -- completion -----------------------------------------------------------
    def flush(self, target=None):
        if target is not None and not self.after and not self.inflight.get(target):
            # the usual case: plain requests to one target (often none left)
            reqs = self.reqs.pop(target, None)
            if reqs:
                for req in reqs:
                    req.wait()
            return
        targets = list(self.reqs) if target is None else [target]
        for t in targets:
            for req in self.reqs.pop(t, ()):
                req.wait()
        if target is None:
            ENGINE.wait_until(lambda: not any(self.inflight.values()))
        else:
            ENGINE.wait_until(lambda: not self.inflight.get(target))
        after = self.after[:]            # (the list itself is the C calls' too)
        self.after.clear()
        for fn in after:
            fn()

    # -- control messages -------------------------------------------------------
    def ctrl(self, target, kind, arg=None, wait=False):
        """Send a control message; with ``wait`` block until the target replies."""
        got = []
        rid = next(_ids)
        if wait:
            _pending[rid] = got.append
        hdr = (self.id, kind, arg, self.rank)
        if target == self.rank:
            _ctrl(self, rid if wait else 0, ENGINE.world.rank, hdr)
        else:
            self.comm._c.eps[target].am_send_nb(AM_ACC, pickle.dumps((rid if wait else 0, hdr)))
        if wait:
            ENGINE.wait_until(lambda: bool(got))


def _blocks(dtype, count, off, data):
    """(remote offset, piece) per contiguous run of the target layout; pieces
    are lengths when ``data`` is None."""
    tm = dtype._impl().typemap
    whole = contiguous_range(off, count, tm)
    if whole is not None:
        n = whole[1] - whole[0]
        yield whole[0], (n if data is None else data[:n])
        return
    runs = tm.byte_blocks()
    pos = 0
    for i in range(count):
        for bo, bn in zip(runs.starts.tolist(), runs.lengths.tolist()):
            yield off + i * tm.extent + bo, (bn if data is None else data[pos:pos + bn])
            pos += bn


def _store_word(result, value: int, word) -> None:
    """An atomic's old ``value`` (unsigned, at most ``2**bits`` wide) into
    one-element numpy ``result`` of ``word`` (an ``_NP_WORD`` entry)."""
    value &= _WORD_MASK[word[0]]
    if value >= word[2]:                 # signed: back from two's complement
        value -= word[3]
    if result.ndim == 1:
        result[0] = value
    else:
        result.flat[0] = value


def _word_now(w, origin, result, target_rank: int, target_disp: int, atomic: str,
              noop: bool, compare) -> bool:
    """Fetch_and_op's and Compare_and_swap's one pass for their common case
    (what WinImpl.word_atomic checks): numpy ``origin`` and ``result`` of
    one 4/8-byte integer of one type, at an aligned word of a target whose
    key ucxpy's atomics reach.  Mapped memory takes one native call and no
    request (``Endpoint.atomic_fetch_now``).  True when the atomic is issued
    (done, or completed by the next flush), False for the general path."""
    word = _np_word(origin.dtype)
    if word is None or result.dtype is not origin.dtype or origin.size != 1 \
            or result.size != 1 or target_disp < 0 or not 0 <= target_rank < w.size \
            or w.inflight.get(target_rank) or not result.flags.writeable:
        return False
    rk = w.rkeys[target_rank]
    size = word[0]
    base, _, du, _ = w.peers[target_rank]
    addr = base + target_disp * du
    if rk is None or addr % size:
        return False
    value = 0 if noop else origin.item()
    ep = w.eps[target_rank]
    old = ep.atomic_fetch_now(atomic, value, addr, rk, size, compare)
    if old is None:
        try:
            req = ep.atomic_fetch_nb(atomic, value, addr, rk, size, compare)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None
        if not req.done or req.exc is not None:
            w.track_word(req, target_rank, result, word)
            return True
        old = req.result
    _store_word(result, old, word)
    return True


def _store(msg, payload):
    c = msg.contig()
    n = len(payload)
    if c is not None:
        c[:n] = payload
    else:
        msg.unpack(payload, n)


def _apply(win, hdr, data):
    """Run an accumulate-family operation on this process's window memory."""
    _, kind, opname, tdesc, off, count, cmp = hdr
    target = from_description(tdesc)
    dt = reduction_dtype(target)
    lo, hi = span(off, count, target._impl().typemap)
    if lo < 0 or hi > win.view.nbytes:
        raise Exception(ERR_ARG, "RMA target range outside the window")
    whole = contiguous_range(off, count, target._impl().typemap)
    if whole is None:
        return _apply_scattered(Msg(win.view, count, target, off), dt, kind, opname,
                                data, cmp)
    off, n = whole[0], whole[1] - whole[0]
    count = n // dt.itemsize
    size = _atomic_width(dt, opname, kind)
    if size and (win.base + off) % size == 0:
        old = _word_atomics(win.base + off, dt, kind, opname, count, data, cmp)
        return old if kind in ("get_acc", "fetch", "cas") else b""
    mem = np.frombuffer(win.view[off:off + n], dt)
    old = mem.tobytes()
    if kind == "cas":
        if mem[0] == np.frombuffer(cmp, dt)[0]:
            mem[0] = np.frombuffer(data, dt)[0]
    elif opname != "NO_OP":
        op = _by_name(opname)
        new = np.frombuffer(data, dt, count)
        mem[:] = op.combine(mem.copy(), new, None)
    return old if kind in ("get_acc", "fetch", "cas") else b""


def _apply_scattered(m, dt, kind, opname, data, cmp):
    """An accumulate into a non-contiguous target layout (packed, combined, unpacked)."""
    mem = np.frombuffer(m.pack(), dt).copy()
    old = mem.tobytes()
    if kind == "cas":
        if mem[0] == np.frombuffer(cmp, dt)[0]:
            mem[0] = np.frombuffer(data, dt)[0]
    elif opname != "NO_OP":
        mem = _by_name(opname).combine(mem, np.frombuffer(data, dt, len(mem)), None)
    m.unpack(np.ascontiguousarray(mem).view(np.uint8))
    return old if kind in ("get_acc", "fetch", "cas") else b""


def _word_atomics(addr, dt, kind, opname, count, data, cmp) -> bytes:
    """Apply an accumulate element by element with word atomics at ``addr``
    (this process's window memory); returns the old elements."""
    size = dt.itemsize
    udt = np.dtype(f"u{size}")
    old = np.empty(count, udt)
    if kind == "cas":
        old[0] = apply_atomic(addr, ATOMIC_OPS["cswap"], size, int(np.frombuffer(data, udt)[0]),
                              int(np.frombuffer(cmp, udt)[0]))
        return old.tobytes()
    code = ATOMIC_OPS[_ATOMIC_OP[opname]]
    values = np.frombuffer(data, udt, count) if opname != "NO_OP" else np.zeros(count, udt)
    for i in range(count):
        old[i] = apply_atomic(addr + i * size, code, size, int(values[i]), 0)
    return old.tobytes()


def _payload(msg, then):
    """Call ``then(bytes)`` with the message's data (now, or when a
    rendezvous payload arrived); returns the handler's keep flag."""
    if not msg.is_rndv:
        then(bytes(msg.data) if msg.data is not None else b"")
        return False
    buf = bytearray(msg.length)
    msg.receive(buf).add_done_callback(lambda r: then(buf))
    return True


def _on_request(msg):
    rid, hdr = pickle.loads(msg.header)
    win = _WINS.get(hdr[0])
    if win is None:
        return False
    if hdr[1] in ("acc", "get_acc", "fetch", "cas"):
        src = msg.source

        def serve(data):
            old = _apply(win, hdr, data)
            ENGINE.eps[src].am_send_nb(AM_REPLY, pickle.dumps(rid), old)
        return _payload(msg, serve)
    _ctrl(win, rid, msg.source, hdr)
    return False


def _reply(win, rid, world):
    if not rid:
        return
    if world == ENGINE.world.rank:
        _pending.pop(rid)(b"")
    else:
        ENGINE.eps[world].am_send_nb(AM_REPLY, pickle.dumps(rid), b"")


def _ctrl(win, rid, world, hdr):
    """Lock manager and PSCW bookkeeping at the target."""
    _, kind, arg, origin = hdr
    st = win.lock_state
    if kind == "lock":
        win.lock_queue.append((rid, world, arg))
        _grant(win)
    elif kind == "unlock":
        if arg == LOCK_EXCLUSIVE:
            st[0] -= 1
        else:
            st[1] -= 1
        _grant(win)
        _reply(win, rid, world)
    elif kind == "post":
        win.posts[origin] = win.posts.get(origin, 0) + 1
    elif kind == "complete":
        win.completes[origin] = win.completes.get(origin, 0) + 1


def _grant(win):
    st, q = win.lock_state, win.lock_queue
    while q:
        rid, world, typ = q[0]
        if typ == LOCK_EXCLUSIVE and st[0] == 0 and st[1] == 0:
            st[0] += 1
        elif typ != LOCK_EXCLUSIVE and st[0] == 0:
            st[1] += 1
        else:
            return
        q.pop(0)
        _reply(win, rid, world)


def _on_reply(msg):
    cb = _pending.pop(pickle.loads(msg.header), None)
    return _payload(msg, cb) if cb is not None else False


# -- the public class ----------------------------------------------------------------
#: Flush progresses the worker on every this many calls (a power of two)
FLUSH_PROGRESS_EVERY = 64
_FLUSHES = [0]


def flush_progress() -> None:
    """A progress pass for the passive-target requests of peers that Flush
    serves now and then (FLUSH_PROGRESS_EVERY)."""
    try:
        ENGINE.worker.progress()
    except ucxpy.UcxpyError as e:
        raise translate(e) from None


def atomic_op_codes(noop_bit: int) -> dict:
    """The predefined ops one-word atomics do, by their implementation:
    ucxpy.atomics' code, plus ``noop_bit`` for NO_OP (an add of 0)."""
    codes = {}
    for name, atomic in _ATOMIC_OP.items():
        op = _by_name(name)
        codes[op._h] = ATOMIC_OPS[atomic] | (noop_bit if name == "NO_OP" else 0)
    return codes


def _epoch(method):
    """Mark a window synchronization call for the trace timeline (category
    ``win``, the MPI name, the target rank when there is one): the calls
    pay nothing unless tracing is on, when :func:`trace_epochs` wraps them."""
    method._win_epoch = True
    return method


def _traced(method):
    name = method.__name__

    @functools.wraps(method)
    def traced(self, *args, **kwargs):
        w = ENGINE.worker
        if w is None or w.tr is None:
            return method(self, *args, **kwargs)
        extra = {"rank": args[0]} if args and name in ("Flush", "Lock", "Unlock") else {}
        with ucxpy.trace.span(w, "win", name, **extra):
            return method(self, *args, **kwargs)
    traced._win_traced = True
    return traced


def trace_epochs() -> None:
    """Record the window synchronization calls (and their aliases, e.g.
    ``Flush_local``) on the trace timeline; called at MPI initialization
    when the worker traces (idempotent)."""
    for key, member in list(vars(Win).items()):
        if getattr(member, "_win_epoch", False) and not getattr(member, "_win_traced", False):
            setattr(Win, key, _traced(member))


class Win(Handle, BufferExporter):
    """Remote memory access context."""

    __slots__ = ()

    def _buffer_target(self):
        return self._impl().view

    def __reduce__(self):
        if self._h is not None:
            raise ValueError("cannot serialize a window")
        return super().__reduce__()

    def _impl(self) -> WinImpl:
        if self._h is None:
            raise Exception(ERR_WIN, "invalid window (WIN_NULL)")
        return self._h

    @classmethod
    def _make(cls, impl):
        return cls._wrap(impl)

    def _release(self):
        self.Free()

    # -- creation ---------------------------------------------------------------
    @classmethod
    def Create(cls, memory, disp_unit=1, info=None, comm=None):
        """Create a window over existing memory (collective)."""
        comm = (comm or COMM_WORLD).Dup()
        view = byte_view(memory, writable=True)[0] if memory is not None else \
            memoryview(bytearray(0))
        mh = ENGINE.worker.mem_map(view) if view.nbytes else None
        return cls._make(WinImpl(comm, view, disp_unit, FLAVOR_CREATE, mh, memory))

    @classmethod
    def Allocate(cls, size, disp_unit=1, info=None, comm=None):
        """Create a window over newly allocated, registered memory (collective)."""
        comm = (comm or COMM_WORLD).Dup()
        if size > 0:
            mh = ENGINE.worker.mem_map(length=size)
            view = mh.buf[:size]
        else:
            mh, view = None, memoryview(bytearray(0))
        return cls._make(WinImpl(comm, view, disp_unit, FLAVOR_ALLOCATE, mh))

    @classmethod
    def Allocate_shared(cls, size, disp_unit=1, info=None, comm=None):
        """Create a window over memory that same-host processes map directly (collective)."""
        # each rank's part is a shared segment of ucxpy's (mem_map(shared=True)),
        # which the others map through its remote key (RemoteKey.map)
        comm = (comm or COMM_WORLD).Dup()
        mh = ENGINE.worker.mem_map(length=max(size, 1), shared=True)
        view = mh.buf[:size]
        w = WinImpl(comm, view, disp_unit, FLAVOR_SHARED, mh)
        w.shared = []
        for r, (_addr, n, _du, _rk) in enumerate(w.peers):
            if r == w.rank or not n:
                w.shared.append(view if r == w.rank else memoryview(bytearray(0)))
                continue
            peer = w.rkeys[r].map()
            if peer is None:
                raise Exception(ERR_RMA_SHARED, f"Allocate_shared: rank {r}'s memory cannot "
                                f"be mapped here (the communicator must be on one host)")
            w.shared.append(peer[:n])
        comm.Barrier()
        return cls._make(w)

    @classmethod
    def Create_dynamic(cls, info=None, comm=None):
        """Create a window to which memory is attached later (collective)."""
        comm = (comm or COMM_WORLD).Dup()
        return cls._make(WinImpl(comm, memoryview(bytearray(0)), 1, FLAVOR_DYNAMIC))

    def Attach(self, memory):
        """Attach memory to a dynamic window."""
        self._impl().attrs.setdefault("attached", []).append(memory)

    def Detach(self, memory):
        """Detach memory from a dynamic window."""
        lst = self._impl().attrs.get("attached", [])
        for i, m in enumerate(lst):
            if m is memory:
                del lst[i]
                break

    def Free(self):
        """Free the window (collective; completes pending operations first)."""
        w = self._impl()
        w.flush()
        w.comm.Barrier()
        if w.mh is not None:
            w.mh.unmap()
        _WINS.pop(w.id, None)
        attr.delete_all(self, {k: v for k, v in w.attrs.items() if isinstance(k, int)})
        w.comm.Free()
        w._native = None
        self._h = None

    # -- queries -------------------------------------------------------------------
    def Get_group(self):
        """Access the group of processes that created the window."""
        return self._impl().comm.Get_group()

    group = property(Get_group)
    group_size = property(lambda self: self._impl().size)
    group_rank = property(lambda self: self._impl().rank)

    def Get_attr(self, keyval):
        """Retrieve an attribute value by key."""
        w = self._impl()
        predefined = {WIN_BASE: w.base, WIN_SIZE: w.view.nbytes, WIN_DISP_UNIT: w.disp_unit,
                      WIN_CREATE_FLAVOR: w.flavor, WIN_MODEL: WIN_UNIFIED}
        if keyval in predefined:
            return predefined[keyval]
        return attr.get_attr("win", w.attrs, keyval)

    def Set_attr(self, keyval, attrval):
        """Store an attribute value associated with a key."""
        attr.set_attr("win", self, self._impl().attrs, keyval, attrval)

    def Delete_attr(self, keyval):
        """Delete an attribute value associated with a key."""
        attr.delete_attr("win", self, self._impl().attrs, keyval)

    @classmethod
    def Create_keyval(cls, copy_fn=None, delete_fn=None, nopython=False):
        """Create a new attribute key for windows."""
        return attr.create_keyval("win", copy_fn, delete_fn, nopython)

    @classmethod
    def Free_keyval(cls, keyval):
        """Free an attribute key for windows."""
        return attr.free_keyval("win", keyval)

    @property
    def attrs(self):
        w = self._impl()
        return (w.base, w.view.nbytes, w.disp_unit)

    flavor = property(lambda self: self._impl().flavor)
    model = property(lambda self: WIN_UNIFIED)

    def tomemory(self):
        """Return the local window memory as a buffer."""
        from .memory import buffer      # deferred: .memory imports numpy (start-up, issue 44)
        return buffer.frombuffer(self._impl().view)

    def Shared_query(self, rank):
        """Return the memory and displacement unit of a rank's part of a shared window."""
        w = self._impl()
        if rank == PROC_NULL:
            rank = 0
        from .memory import buffer      # deferred: .memory imports numpy (start-up, issue 44)
        if w.flavor != FLAVOR_SHARED:
            return buffer.allocate(0), w.disp_unit
        return buffer.frombuffer(w.shared[rank]), w.peers[rank][2]

    def Get_info(self):
        """Return the hints of the window."""
        return Info.Create(dict(self._impl().info))

    def Set_info(self, info):
        """Set new hints for the window."""
        if info:
            self._impl().info.update(info.items())

    info = property(Get_info, Set_info)

    def Get_name(self):
        """Get the print name of the window."""
        return "MPI_WIN_NULL" if self._h is None else self._h.name

    def Set_name(self, name):
        """Set the print name of the window."""
        self._impl().name = name

    name = property(Get_name, Set_name)

    def Get_errhandler(self):
        """Get the error handler for a window."""
        return errhandler_of(self._impl().errhandler)

    def Set_errhandler(self, errhandler):
        """Set the error handler for a window."""
        self._impl().errhandler = Errhandler._checked(errhandler, "win")

    def Call_errhandler(self, errorcode):
        """Call the error handler installed on a window."""
        raise_in(self, Exception(errorcode), call_only=True)

    @classmethod
    def Create_errhandler(cls, errhandler_fn):
        """Create a new error handler for windows."""
        return Errhandler._create(errhandler_fn, "win")

    # -- communication -----------------------------------------------------------------
    def _call(self, fn, *args):
        try:
            return fn(*args)
        except ucxpy.UcxpyError as e:
            raise translate(e) from None

    def Put(self, origin, target_rank, target=None):
        """Put data into a memory window on a remote process."""
        w = self._h
        if type(origin) in _PLAIN_TYPES and type(target_rank) is int and w is not None \
                and (target is None or type(target) is int and target >= 0) \
                and 0 <= target_rank < w.size and target_rank != w.rank:
            # the common case in one pass (what WinImpl.put checks): a whole
            # contiguous buffer of a predefined type at a displacement
            rk = w.rkeys[target_rank]
            mv = memoryview(origin)
            if rk is not None and mv.nbytes and mv.c_contiguous \
                    and _PLAIN_FORMATS.get(mv.format) is not None:
                base, _, du, _ = w.peers[target_rank]
                try:
                    req = w.eps[target_rank].put_nb(mv, base + (target or 0) * du, rk)
                except ucxpy.UcxpyError as e:
                    raise translate(e) from None
                if not req.done:
                    w.reqs.setdefault(target_rank, []).append(req)
                return
        if target_rank != PROC_NULL:
            self._call(self._impl().put, origin, target_rank, target)

    def Get(self, origin, target_rank, target=None):
        """Get data from a memory window on a remote process."""
        w = self._h
        if type(origin) in _PLAIN_TYPES and type(target_rank) is int and w is not None \
                and (target is None or type(target) is int and target >= 0) \
                and 0 <= target_rank < w.size and target_rank != w.rank:
            rk = w.rkeys[target_rank]            # (as in Put)
            mv = memoryview(origin)
            if rk is not None and mv.nbytes and mv.c_contiguous and not mv.readonly \
                    and _PLAIN_FORMATS.get(mv.format) is not None:
                base, _, du, _ = w.peers[target_rank]
                try:
                    req = w.eps[target_rank].get_nb(mv, base + (target or 0) * du, rk)
                except ucxpy.UcxpyError as e:
                    raise translate(e) from None
                if not req.done:
                    w.reqs.setdefault(target_rank, []).append(req)
                return
        if target_rank != PROC_NULL:
            self._call(self._impl().get, origin, target_rank, target)

    def Accumulate(self, origin, target_rank, target=None, op=SUM):
        """Accumulate data into the target process."""
        if target_rank != PROC_NULL:
            self._call(self._impl().acc, "acc", origin, None, target_rank, target, op)

    def Get_accumulate(self, origin, result, target_rank, target=None, op=SUM):
        """Fetch-and-accumulate data into the target process."""
        if target_rank != PROC_NULL:
            self._call(self._impl().acc, "get_acc", origin, result, target_rank, target, op)

    def Fetch_and_op(self, origin, result, target_rank, target_disp=0, op=SUM):
        """Perform one-element fetch-and-accumulate."""
        w = self._h
        if type(origin) is np.ndarray and type(result) is np.ndarray and w is not None \
                and type(target_rank) is int and type(target_disp) is int and type(op) is Op:
            h = op._h
            atomic = _ATOMIC_OP.get(h.name) if h is not None else None
            if atomic is not None and _word_now(w, origin, result, target_rank, target_disp,
                                                atomic, h.name == "NO_OP", 0):
                return
        o, r = parse(origin), parse(result, writable=True)
        if o.count != 1 or r.count != 1 or o.dtype != r.dtype:
            raise ValueError("Fetch_and_op needs one element of one datatype")
        if target_rank != PROC_NULL:
            w = self._impl()
            try:
                if w.word_atomic("fetch", o, r, None, target_rank, target_disp, op):
                    return
            except ucxpy.UcxpyError as e:
                raise translate(e) from None
            self._call(w.acc, "fetch", o, r, target_rank, (target_disp, 1, r.dtype), op)

    def Compare_and_swap(self, origin, compare, result, target_rank, target_disp=0):
        """Perform one-element atomic compare-and-swap."""
        w = self._h
        if type(origin) is np.ndarray and type(result) is np.ndarray and w is not None \
                and type(compare) is np.ndarray and compare.dtype is origin.dtype \
                and compare.size == 1 and type(target_rank) is int and type(target_disp) is int \
                and _word_now(w, origin, result, target_rank, target_disp, "cswap", False,
                              compare.item()):
            return
        o, r, c = parse(origin), parse(result, writable=True), parse(compare)
        if o.count != 1 or r.count != 1 or c.count != 1 or not (o.dtype == r.dtype == c.dtype):
            raise ValueError("Compare_and_swap needs one element of one datatype")
        if target_rank != PROC_NULL:
            w = self._impl()
            try:
                if w.word_atomic("cas", o, r, c, target_rank, target_disp, REPLACE):
                    return
            except ucxpy.UcxpyError as e:
                raise translate(e) from None
            self._call(w.acc, "cas", o, r, target_rank, (target_disp, 1, r.dtype), REPLACE, c)

    def _rma_req(self, fn, *args):
        fn(*args)
        self.Flush_local_all()
        return Request._from(DoneOp())

    def Rput(self, origin, target_rank, target=None):
        """Put data into a remote window; returns a request."""
        return self._rma_req(self.Put, origin, target_rank, target)

    def Rget(self, origin, target_rank, target=None):
        """Get data from a remote window; returns a request."""
        return self._rma_req(self.Get, origin, target_rank, target)

    def Raccumulate(self, origin, target_rank, target=None, op=SUM):
        """Accumulate into a remote window; returns a request."""
        return self._rma_req(self.Accumulate, origin, target_rank, target, op)

    def Rget_accumulate(self, origin, result, target_rank, target=None, op=SUM):
        """Fetch-and-accumulate into a remote window; returns a request."""
        return self._rma_req(self.Get_accumulate, origin, result, target_rank, target, op)

    # -- synchronization -----------------------------------------------------------------
    @_epoch
    def Fence(self, assertion=0):
        """Perform an MPI fence synchronization on the window (collective)."""
        w = self._impl()
        self._call(w.flush)
        w.comm.Barrier()

    @_epoch
    def Flush(self, rank):
        """Complete all outstanding RMA operations to a target."""
        w = self._h
        try:
            if w is None or w.reqs or w.after or w.inflight.get(rank):
                # something to complete (the usual case has nothing left:
                # mapped operations and atomics are done when issued)
                if rank != PROC_NULL:
                    (w or self._impl()).flush(rank)
            # serve peers' passive-target requests (active-message lanes) now
            # and then, so a rank that only flushes still lets them finish; a
            # progress pass on every call would double a mapped Get+Flush.
            # The library lock, if any, is held already (threads.py).
            n = _FLUSHES[0] = _FLUSHES[0] + 1
            if not n & (FLUSH_PROGRESS_EVERY - 1):
                ENGINE.worker.progress()
        except ucxpy.UcxpyError as e:
            raise translate(e) from None

    @_epoch
    def Flush_all(self):
        """Complete all outstanding RMA operations to all targets."""
        self._call(self._impl().flush)

    Flush_local = Flush
    Flush_local_all = Flush_all

    def Sync(self):
        """Synchronize the public and private copies of the window."""
        self._impl()
        ENGINE.progress()           # serve peers' lock and accumulate requests meanwhile

    @_epoch
    def Lock(self, rank, lock_type=LOCK_EXCLUSIVE, assertion=0):
        """Begin an RMA access epoch at the target process."""
        if rank != PROC_NULL:
            self._call(self._impl().ctrl, rank, "lock", lock_type, True)
            self._impl().attrs.setdefault("_locks", {})[rank] = lock_type

    @_epoch
    def Unlock(self, rank):
        """Complete an RMA access epoch at the target process."""
        if rank == PROC_NULL:
            return
        w = self._impl()
        typ = w.attrs.get("_locks", {}).pop(rank, None)
        if typ is None:
            raise Exception(ERR_RMA_SYNC, f"window is not locked at rank {rank}")
        self._call(w.flush, rank)
        self._call(w.ctrl, rank, "unlock", typ, True)

    @_epoch
    def Lock_all(self, assertion=0):
        """Begin an RMA access epoch at all processes."""
        w = self._impl()
        for r in range(w.size):
            self.Lock(r, LOCK_SHARED)

    @_epoch
    def Unlock_all(self):
        """Complete an RMA access epoch at all processes."""
        w = self._impl()
        for r in range(w.size):
            self.Unlock(r)

    @_epoch
    def Post(self, group, assertion=0):
        """Start an RMA exposure epoch to a group."""
        w = self._impl()
        w.post_group = self._ranks_of(group)
        for r in w.post_group:
            w.ctrl(r, "post")

    @_epoch
    def Start(self, group, assertion=0):
        """Start an RMA access epoch to a group."""
        w = self._impl()
        w.start_group = self._ranks_of(group)
        ENGINE.wait_until(lambda: all(w.posts.get(r, 0) > 0 for r in w.start_group))
        for r in w.start_group:
            w.posts[r] -= 1

    @_epoch
    def Complete(self):
        """Complete an RMA access epoch started with Start."""
        w = self._impl()
        if w.start_group is None:
            raise Exception(ERR_RMA_SYNC, "Complete without Start")
        self._call(w.flush)
        for r in w.start_group:
            w.ctrl(r, "complete")
        w.start_group = None

    def _wait_done(self, w):
        return all(w.completes.get(r, 0) > 0 for r in w.post_group)

    @_epoch
    def Wait(self):
        """Complete an RMA exposure epoch started with Post."""
        w = self._impl()
        if w.post_group is None:
            raise Exception(ERR_RMA_SYNC, "Wait without Post")
        ENGINE.wait_until(lambda: self._wait_done(w))
        for r in w.post_group:
            w.completes[r] -= 1
        w.post_group = None

    def Test(self):
        """Test whether an RMA exposure epoch is complete."""
        w = self._impl()
        if w.post_group is None:
            raise Exception(ERR_RMA_SYNC, "Test without Post")
        ENGINE.progress()
        if not self._wait_done(w):
            return False
        self.Wait()
        return True

    def _ranks_of(self, group):
        """Window ranks of ``group``'s members."""
        w = self._impl()
        idx = {wr: i for i, wr in enumerate(w.ranks)}
        return [idx[x] for x in group._check()]


WIN_NULL = Win._constant(None)
register_family(Win)

"""OpenSHMEM 1.5 spec checks, one section per spec chapter, run on every PE.

Usage: ``ucxpy-run -n N python shmem_spec.py SECTION...`` (or mpiexec).
Prints ``SHMEM-SPEC OK <section> <pe>`` per passed section; any failure
raises (the job fails).  Sections follow the spec: setup (9.1-9.3 library
setup/query), heap (9.3 memory management), rma (9.5), amo (9.6), signal
(9.7), coll (9.9 collectives), team (9.4), ctx (9.5 contexts), ordering
(9.10 memory ordering: fence, quiet), p2p (9.11 point-to-point sync),
barrier (9.9.1/9.9.2), lock (9.12), errors (bad input).
"""
import os
import sys
import time

import numpy as np

import shmem

if os.environ.get("LATE_RDMA_WRITES"):
    # an unordered fabric, as RDMA is: every one-sided write of the ofi lane
    # lands (and completes) 0.5-4 ms late, after frames sent later and in
    # any order among themselves; fence and put_signal must still order
    import random

    from ucxpy.transports import ofi as _ofi
    _late, _rng, _put = [], random.Random(7), _ofi.OfiEndpoint.put

    def _late_put(self, local, remote_addr, rkey, on_complete):
        data = bytearray(local)           # the caller's buffer is free at once
        _late.append((time.monotonic() + _rng.uniform(5e-4, 4e-3), self, data,
                      remote_addr, rkey, on_complete))
        return False

    def _land():
        now = time.monotonic()
        due = [w for w in _late if w[0] <= now]
        for w in due:
            _late.remove(w)
            _, ep, data, addr, rkey, cb = w
            if _put(ep, memoryview(data), addr, rkey, cb):
                cb(None)
        return len(due)
    _ofi.OfiEndpoint.put = _late_put

shmem.init()
if os.environ.get("LATE_RDMA_WRITES"):
    shmem.runtime.get().worker.add_progress_callback(_land)
me, n = shmem.my_pe(), shmem.n_pes()
right, left = (me + 1) % n, (me - 1) % n


def section_setup():
    assert shmem.info_get_version() == (1, 5)
    assert shmem.info_get_name() == shmem.VENDOR_STRING
    assert 0 <= me < n and shmem.TEAM_WORLD.n_pes() == n
    assert n == int(os.environ.get("EXPECT_NPES", n))
    assert shmem.pe_accessible(n - 1) and not shmem.pe_accessible(n)
    assert shmem.query_thread() in tuple(shmem.THREAD)
    shmem.init()                        # idempotent


def section_heap():
    # the same allocation sequence gives the same offsets on every PE
    a = shmem.zeros(10, "i4")
    b = shmem.empty((3, 5), "f8", align=256)
    rt = shmem.runtime.get()
    offs = np.array([rt.heap.offset_of(a, 0), rt.heap.offset_of(b, 0)], "i8")
    allo = shmem.zeros(2 * n, "i8")
    shmem.fcollect(allo, shmem.array(offs))
    assert (allo.reshape(n, 2) == offs).all(), allo
    assert b.__array_interface__["data"][0] % 256 == 0
    assert (a == 0).all()
    assert shmem.addr_accessible(a, right) and not shmem.addr_accessible(np.zeros(1), right)
    shmem.free(b)
    c = shmem.full((2, 2), 7, "i2", order="F")
    assert c.flags.f_contiguous and (c == 7).all()
    mem = shmem.alloc(16, 4)
    arr = shmem.fromalloc(mem, (4, 4), "i4")
    arr[...] = me
    shmem.barrier_all()
    shmem.free(mem)
    try:
        shmem.free(mem)
    except shmem.InvalidFree:
        pass
    else:
        raise AssertionError("double free not detected")
    for x in (a, c, allo):
        shmem.free(x)
    info = shmem.heap_info()
    assert info["free"] > 0 and len(info["modes"]) == n


def section_rma():
    for dt in ("i1", "u2", "i4", "i8", "f4", "f8", "c16", "g"):
        dst = shmem.full(6, -1, dt)
        src = np.arange(6).astype(dt) + me
        shmem.barrier_all()
        shmem.put(dst, src, right)
        shmem.barrier_all()
        assert (dst == np.arange(6).astype(dt) + left).all(), (dt, dst)
        got = np.empty(6, dt)
        shmem.get(got, dst, right)
        assert (got == np.arange(6).astype(dt) + me).all()
        shmem.barrier_all()
        shmem.free(dst)
    # size=, p/g, strided, nbi
    dst = shmem.zeros(12, "i8")
    shmem.put(dst, np.full(12, me + 1, "i8"), right, size=3)
    shmem.p(dst[5:], 99, right)
    shmem.barrier_all()
    assert list(dst[:6]) == [left + 1] * 3 + [0, 0, 99], dst
    assert shmem.g(dst[5:], right) == 99
    shmem.barrier_all()
    dst[...] = 0
    shmem.barrier_all()
    shmem.iput(dst, np.arange(12, dtype="i8"), right, tst=3, sst=2, size=4)
    shmem.barrier_all()
    assert list(dst[::3]) == [0, 2, 4, 6] and (dst.reshape(4, 3)[:, 1:] == 0).all(), dst
    got = np.full(8, -1, "i8")
    shmem.iget(got, dst, right, tst=2, sst=3, size=4)
    assert list(got) == [0, -1, 2, -1, 4, -1, 6, -1], got
    shmem.barrier_all()
    big = shmem.zeros(1 << 18, "u1")
    src = np.random.default_rng(me).integers(0, 255, 1 << 18, dtype="u1")
    shmem.put_nbi(big, src, right)
    shmem.quiet()
    shmem.barrier_all()
    assert (big == np.random.default_rng(left).integers(0, 255, 1 << 18, dtype="u1")).all()
    back = np.empty_like(big)
    shmem.get_nbi(back, big, left)
    shmem.quiet()
    assert (back == np.random.default_rng((left - 1) % n).integers(0, 255, 1 << 18, "u1")).all()
    view = shmem.ptr(dst, right)
    if view is not None:
        assert view.shape == dst.shape and view[0] == 0
    shmem.barrier_all()
    shmem.free(big)
    shmem.free(dst)


def section_amo():
    for dt in ("i4", "i8", "u4", "u8"):
        c = shmem.zeros(1, dt)
        shmem.barrier_all()
        for _ in range(5):
            shmem.atomic_inc(c, 0)
        shmem.atomic_add(c, 2, 0)
        old = shmem.atomic_fetch_add(c, 1, 0)
        assert 0 <= old < 8 * n
        shmem.barrier_all()
        if me == 0:
            assert c[0] == 8 * n, (dt, c)
        assert shmem.atomic_fetch(c, 0) == 8 * n
        shmem.barrier_all()
        if me == 0:
            assert shmem.atomic_compare_swap(c, 8 * n, 1, 0) == 8 * n
            assert shmem.atomic_compare_swap(c, 0, 5, 0) == 1     # fails: unchanged
            assert shmem.atomic_swap(c, 0b1100, 0) == 1
            assert shmem.atomic_fetch_and(c, 0b0110, 0) == 0b1100
            assert shmem.atomic_fetch_or(c, 0b0001, 0) == 0b0100
            assert shmem.atomic_fetch_xor(c, 0b0101, 0) == 0b0101
            assert shmem.atomic_fetch(c, 0) == 0
            assert shmem.atomic_fetch_op(c, None, shmem.AMO_INC, 0) == 0
            shmem.atomic_op(c, 3, shmem.AMO_SET, 0)
            f = np.zeros(1, dt)
            shmem.atomic_fetch_inc_nbi(f, c, 0)
            shmem.quiet()
            assert f[0] == 3
        shmem.barrier_all()
        shmem.free(c)
    x = shmem.array(1.5)
    shmem.barrier_all()
    if me == n - 1:
        assert shmem.atomic_swap(x, 2.25, 0) == 1.5       # nobody else writes x
        assert shmem.atomic_fetch(x, 0) == 2.25
    shmem.barrier_all()
    shmem.free(x)


def section_signal():
    sig = shmem.new_signal()
    data = shmem.zeros(1000, "f8")
    shmem.barrier_all()
    for rnd in range(1, 4):
        shmem.put_signal(data, np.full(1000, rnd * 10 + me, "f8"), right, sig, 1, shmem.SIGNAL_ADD)
        assert shmem.signal_wait_until(sig, shmem.CMP_GE, rnd) >= rnd
        assert (data == rnd * 10 + left).all(), "data must be visible with the signal"
        shmem.barrier_all()
    shmem.put_signal_nbi(data[:1], np.ones(1), right, sig, 77, shmem.SIGNAL_SET)
    shmem.quiet()
    shmem.barrier_all()
    assert shmem.signal_fetch(sig) == 77
    shmem.free(data)
    shmem.del_signal(sig)


def section_coll():
    for team in (shmem.TEAM_WORLD, shmem.TEAM_SHARED):
        tn, tme = team.n_pes(), team.my_pe()
        for root in range(tn):
            src = shmem.full(5, tme * 3, "i8")
            dst = shmem.full(5, -1, "i8")
            shmem.broadcast(dst, src, root, team=team)
            assert (dst == root * 3).all()
            shmem.free(dst)
            shmem.free(src)
        src = shmem.full(3, tme, "i4")
        dst = shmem.zeros(3 * tn, "i4")
        shmem.fcollect(dst, src, team=team)
        assert (dst.reshape(tn, 3) == np.arange(tn)[:, None]).all()
        shmem.collect(dst, src, size=1 + tme % 2, team=team)
        want = np.concatenate([np.full(1 + i % 2, i) for i in range(tn)])
        assert (dst[:want.size] == want).all(), dst
        a2a_s = shmem.array(np.arange(2 * tn, dtype="i8") + 100 * tme)
        a2a_t = shmem.zeros(2 * tn, "i8")
        shmem.alltoall(a2a_t, a2a_s, team=team)
        assert list(a2a_t) == [100 * i + 2 * tme + k for i in range(tn) for k in range(2)]
        shmem.alltoalls(a2a_t, a2a_s, tst=2, sst=2, size=1, team=team)
        assert list(a2a_t[::2]) == [100 * i + 2 * tme for i in range(tn)]
        for op, fn in (("sum", sum), ("max", max), ("min", min), ("prod", np.prod)):
            r = shmem.zeros(4, "f8")
            shmem.reduce(r, shmem.full(4, tme + 1.0), op=op, team=team)
            assert (r == fn(range(1, tn + 1))).all(), (op, r)
        r = shmem.zeros(1, "u8")
        shmem.reduce(r, shmem.full(1, 1 << tme, "u8"), op=shmem.OP_OR, team=team)
        assert r[0] == (1 << tn) - 1
        shmem.xor_reduce(r, shmem.full(1, 1, "u8"), team=team)
        assert r[0] == tn % 2
    # floats reduce to the same bits everywhere
    r = shmem.zeros(1)
    shmem.sum_reduce(r, shmem.array([0.1 * (me + 1) ** 0.5]))
    allr = shmem.zeros(n)
    shmem.fcollect(allr, r)
    assert len(set(allr.tolist())) == 1


def section_team():
    w = shmem.TEAM_WORLD
    evens = w.split_strided(0, 2, (n + 1) // 2)
    if me % 2 == 0:
        assert evens and evens.n_pes() == (n + 1) // 2 and evens.my_pe() == me // 2
        assert evens.translate_pe(evens.my_pe(), w) == me
        assert w.translate_pe(me, evens) == me // 2
        evens.sync()
        s = shmem.zeros(1, "i8")     # allocations stay collective over the world
        r = shmem.zeros(1, "i8")
        s[0] = me
        shmem.sum_reduce(r, s, team=evens)
        assert r[0] == sum(range(0, n, 2))
    else:
        assert not evens and w.translate_pe(me, shmem.TEAM_WORLD) == me
        s = shmem.zeros(1, "i8")
        r = shmem.zeros(1, "i8")
    shmem.barrier_all()
    xt, yt = shmem.team_split_2d(w, 2)
    assert xt.n_pes() == min(2, n - (me // 2) * 2) and xt.my_pe() == me % 2
    assert yt.my_pe() == me // 2
    xt.sync()
    yt.sync()
    ctx = yt.create_ctx()
    d = shmem.zeros(1, "i8")
    shmem.put(d, np.array([me], "i8"), 0, ctx=ctx)    # team-relative PE 0 of my column
    ctx.quiet()
    shmem.barrier_all()
    if me < 2:
        assert d[0] >= me and d[0] % 2 == me, d
    for t in (xt, yt, evens):
        t.destroy()
    ctx.destroy()
    assert not ctx and not evens
    # many create/destroy cycles recycle slots
    for i in range(20):
        t = w.split_strided(i % n, 1, 1)
        if me == i % n:
            t.sync()
        t.destroy()
    shmem.barrier_all()
    shmem.free(d)
    shmem.free(r)
    shmem.free(s)


def section_ctx():
    ctx = shmem.ctx_create(shmem.CTX_PRIVATE)
    assert ctx and ctx != shmem.CTX_DEFAULT and ctx.get_team() == shmem.TEAM_WORLD
    d = shmem.zeros(4, "i4")
    shmem.put_nbi(d, np.full(4, me, "i4"), right, ctx=ctx)
    shmem.fence(ctx)
    shmem.quiet(ctx)
    shmem.barrier_all()
    assert (d == left).all(), d
    shmem.barrier_all()                # nobody adds to d before its owner checked it
    shmem.ctx_destroy(ctx)
    with shmem.Ctx.create() as c2:
        shmem.atomic_add(d[:1], 1, right, ctx=c2)
        c2.quiet()
    shmem.barrier_all()
    assert d[0] == left + 1
    shmem.free(d)


def section_ordering():
    """put; fence; put is delivered in order; quiet completes puts."""
    data = shmem.zeros(64, "i8")
    flag = shmem.zeros(1, "i8")
    shmem.barrier_all()
    for rnd in range(1, 30):
        shmem.put(data, np.full(64, rnd, "i8"), right)
        shmem.fence()
        shmem.atomic_set(flag, rnd, right)
        shmem.wait_until(flag, shmem.CMP_GE, rnd)
        assert (data == rnd).all(), f"fence violated in round {rnd}"
        shmem.barrier_all()
    # quiet: after quiet the target sees the data, so a non-RMA notification works
    shmem.put_nbi(data, np.full(64, -5, "i8"), right)
    shmem.quiet()
    shmem.sync_all()                     # sync alone completes nothing, but quiet did
    assert (data == -5).all()
    shmem.barrier_all()
    shmem.free(flag)
    shmem.free(data)


def section_p2p():
    """wait_until wakes on a remote update; the test family reports state."""
    ivars = shmem.zeros(3, "i8")
    assert not shmem.test(ivars[1:2], shmem.CMP_EQ, 1)
    assert shmem.test_any(ivars, "==", 1) is None and shmem.test_some(ivars, ">", 0) == []
    shmem.barrier_all()                      # nobody sets ivars before all tested them
    time.sleep(0.05 * (me == 0))             # the waiter really waits
    shmem.atomic_set(ivars[1:2], 1, right)
    shmem.wait_until(ivars[1:2], shmem.CMP_EQ, 1)
    assert shmem.test(ivars[1:2], "eq", 1)
    assert shmem.wait_until_any(ivars, shmem.CMP_NE, 0) == 1
    assert shmem.wait_until_some(ivars, ">=", 1) == [1]
    assert shmem.test_all(ivars, "<=", 1) and not shmem.test_all(ivars, "==", 1)
    shmem.wait_until_all(ivars, "<", 5, status=[0, 0, 1])
    shmem.wait_until_all_vector(ivars, "==", [0, 1, 0])
    assert shmem.wait_until_any_vector(ivars, "==", [9, 1, 9]) == 1
    assert shmem.test_some_vector(ivars, "==", [0, 9, 0]) == [0, 2]
    shmem.barrier_all()
    shmem.free(ivars)


def section_barrier():
    """Everything put before barrier_all is visible after it, on every PE."""
    box = shmem.zeros(n, "i8")
    for rnd in range(1, 6):
        for pe in range(n):
            shmem.put(box[me:me + 1], np.array([rnd * 100 + me], "i8"), pe)
        shmem.barrier_all()
        assert (box == rnd * 100 + np.arange(n)).all(), box
        shmem.barrier_all()
    arrived = shmem.zeros(1, "i8")
    time.sleep(0.02 * me)
    shmem.atomic_inc(arrived, 0)
    shmem.barrier_all()
    if me == 0:
        assert arrived[0] == n
    shmem.sync_all()
    shmem.sync(shmem.TEAM_SHARED)
    shmem.team_sync(shmem.TEAM_WORLD)
    shmem.free(arrived)
    shmem.free(box)


def section_lock():
    lock = shmem.new_lock()
    counter = shmem.zeros(1, "i8")
    shmem.barrier_all()
    for _ in range(10):
        shmem.set_lock(lock)
        v = shmem.g(counter, 0)
        shmem.p(counter, v + 1, 0)
        shmem.clear_lock(lock)
    shmem.barrier_all()
    if me == 0:
        assert counter[0] == 10 * n, counter
    acquired = 0
    while not acquired:
        acquired = not shmem.test_lock(lock)
    shmem.clear_lock(lock)
    with shmem.Lock() as _:
        pass
    shmem.barrier_all()
    shmem.del_lock(lock)
    shmem.free(counter)


def section_errors():
    sym = shmem.zeros(4, "i4")
    local = np.zeros(4, "i4")
    checks = [
        (shmem.NotSymmetric, lambda: shmem.put(local, local, right)),
        (shmem.NotSymmetric, lambda: shmem.get(local, local, right)),
        (shmem.NotSymmetric, lambda: shmem.atomic_inc(local[:1], right)),
        (shmem.InvalidPE, lambda: shmem.put(sym, local, n)),
        (shmem.InvalidPE, lambda: shmem.put(sym, local, -1)),
        (shmem.DtypeMismatch, lambda: shmem.put(sym, np.zeros(4, "f4"), right)),
        (shmem.InvalidArray, lambda: shmem.put(sym, local, right, size=5)),
        (shmem.InvalidArray, lambda: shmem.put(sym, np.zeros((4, 4), "i4")[:, 0], right)),
        (shmem.DtypeMismatch, lambda: shmem.atomic_fetch_and(shmem.full(1, 1.0), 1, right)),
        (shmem.InvalidArray, lambda: shmem.atomic_inc(sym, right)),
        (shmem.InvalidTeam, lambda: shmem.TEAM_INVALID.n_pes()),
        (shmem.InvalidContext, lambda: shmem.quiet(shmem.CTX_INVALID)),
        (ValueError, lambda: shmem.wait_until(sym[:1], "~", 0)),
        (TypeError, lambda: shmem.put(sym, [1, 2, 3, 4], right)),
        (shmem.SymmetricHeapExhausted, lambda: shmem.empty(1 << 40, "u1")),
    ]
    for exc, fn in checks:
        try:
            fn()
        except exc as e:
            assert isinstance(e, shmem.ShmemError) or exc in (ValueError, TypeError), e
        else:
            raise AssertionError(f"expected {exc.__name__}")
    assert issubclass(shmem.InvalidPE, ValueError)
    assert issubclass(shmem.NotSymmetric, ValueError)
    shmem.barrier_all()
    shmem.free(sym)


SECTIONS = {name[len("section_"):]: fn for name, fn in globals().items()
            if name.startswith("section_")}

#: EXPECT_MODE=am: every other PE must be reached in AM mode, and each
#: section's RMA operations (counted with UCXPY_STATS=y) must all have gone
#: through AM-mode keys.  Printed per section as
#: ``SHMEM-SPEC MODES <section> <pe> peers=<mode,...> rma=<mode:count,...>``.
EXPECT_MODE = os.environ.get("EXPECT_MODE", "")
#: EXPECT_RMA=rdma,am: the access modes the core's RMA counters may show
#: (default: EXPECT_MODE), e.g. puts by RDMA and AMOs as active messages
EXPECT_RMA = [m for m in os.environ.get("EXPECT_RMA", "").split(",") if m]


def _rma_modes():
    w = shmem.runtime.get().worker.stats()["worker"]
    return {k[len("rma.mode."):]: v for k, v in w.items() if k.startswith("rma.mode.")}


for name in sys.argv[1:] or list(SECTIONS):
    before = _rma_modes()
    SECTIONS[name]()
    after = _rma_modes()
    used = {m: after[m] - before.get(m, 0) for m in after if after[m] != before.get(m, 0)}
    peers = [m for pe, m in enumerate(shmem.heap_info()["modes"]) if pe != me]
    if EXPECT_MODE:
        assert shmem.runtime.get().worker.stats()["enabled"], "EXPECT_MODE needs UCXPY_STATS=y"
        assert set(peers) == {EXPECT_MODE}, (name, peers)
        assert set(used) <= set(EXPECT_RMA or [EXPECT_MODE]), (name, used)
    print(f"SHMEM-SPEC MODES {name} {me} peers={','.join(peers)} "
          f"rma={','.join(f'{m}:{c}' for m, c in sorted(used.items()))}", flush=True)
    print(f"SHMEM-SPEC OK {name} {me}", flush=True)
shmem.finalize()

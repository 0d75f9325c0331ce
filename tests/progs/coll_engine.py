"""ucxpy.coll against numpy, on a plain Team over the job's endpoints
(tests/test_coll_engine.py): every collective, every root, sizes choosing
each allreduce algorithm, in place, uneven and empty all-to-all parts, a
non-commutative reduction in rank order, the object collectives (pickles of
any size), reductions and scans of values, the straight-line blocking forms,
nonblocking collectives two at a time, the sparse exchanges, the
fault-tolerant agreement, a failed team raising before its
next round, and (ucxpy.intercoll) every collective between the job's two
halves.  Prints COLL OK."""
import sys

import numpy as np

import ucxpy
from ucxpy import coll
from ucxpy import intercoll as inter
from ucxpy.schedules import ALLREDUCE_RING_MIN


class Affine:
    """A non-commutative, associative reduction: (a, b) pairs compose as
    affine maps mod a prime, so the result names the order ranks were
    combined in."""
    commutative = False
    P = 1_000_003

    def combine_to(self, left, right, out):
        a = left[0] * right[0] % self.P
        b = (left[0] * right[1] + left[1]) % self.P
        out[0], out[1] = a, b


def affine_fold(n):
    acc = None
    for r in range(n):
        f = np.array([r + 2, 3 * r + 1], np.int64)
        if acc is None:
            acc = f
        else:
            out = np.empty(2, np.int64)
            Affine().combine_to(acc, f, out)
            acc = out
    return acc


def between_halves(w, rank, n):
    """ucxpy.intercoll between ranks [0, h) and [h, n): every collective,
    every root convention, checked against what each side sent."""
    h = n // 2
    mine, other = (range(0, h), range(h, n)) if rank < h else (range(h, n), range(0, h))
    me, left = mine.index(rank), rank < h
    p = inter.Pair(w.worker, [w.eps[r] for r in mine], [w.eps[r] for r in other], me,
                   pair_id=9, local_id=10 if left else 11)
    run = lambda g: coll.run(p, g, timeout=60)          # noqa: E731
    m = len(other)
    run(inter.barrier(p))
    swapped = run(inter.leader_swap(p, ("leader", mine[0])))
    assert swapped == ("leader", other[0]), swapped
    # rooted: the left group's member 0 is the root, then the right group's last
    for root_side_left, root_idx in ((True, 0), (False, len(range(h, n)) - 1)):
        if left == root_side_left:
            root = inter.ROOT if me == root_idx else inter.IDLE
        else:
            root = root_idx
        root_rank = (0 if root_side_left else h) + root_idx
        data = b"from %d" % root_rank
        got = run(inter.bcast(p, data if root == inter.ROOT else None, root))
        assert got == (None if root == inter.IDLE else data), got
        buf = bytearray(len(data))
        got = run(inter.bcast(p, data if root == inter.ROOT else buf, root))
        assert root == inter.IDLE or bytes(buf if root != inter.ROOT else got) == data
        assert run(inter.bcast_obj(p, {"r": root_rank}, root)) == \
            (None if root in (inter.ROOT, inter.IDLE) else {"r": root_rank})
        parts = [bytearray(3) for _ in range(m)]
        run(inter.gather(p, bytes([rank]) * 3, parts, root))
        if root == inter.ROOT:
            assert parts == [bytearray([r]) * 3 for r in other], parts
        outs = bytearray(2)
        run(inter.scatter(p, [bytes([root_rank, r]) for r in other], outs, root))
        if root >= 0:
            assert outs == bytearray([root_rank, rank]), outs
        got = run(inter.gather_obj(p, rank, root))
        assert got == (list(other) if root == inter.ROOT else None), got
        got = run(inter.scatter_obj(p, [("s", r) for r in other], root))
        assert got == (("s", rank) if root >= 0 else None), got
        x = np.full(4, rank + 1, np.int64)
        got = run(inter.reduce(p, x, coll.NUMPY_OPS["sum"], root, coll.Codec.of(x)))
        if root == inter.ROOT:
            assert (got == sum(r + 1 for r in other)).all(), got
        else:
            assert got is None
    parts = [bytearray(1) for _ in range(m)]
    run(inter.allgather(p, bytes([rank]), parts))
    assert parts == [bytearray([r]) for r in other]
    assert run(inter.allgather_obj(p, rank)) == list(other)
    recvs = [bytearray(2) for _ in range(m)]
    run(inter.alltoall(p, [bytes([rank, r]) for r in other], recvs))
    assert recvs == [bytearray([r, rank]) for r in other], recvs
    assert run(inter.alltoall_obj(p, [(rank, r) for r in other])) == [(r, rank) for r in other]
    x = np.full(3, rank, np.int64)
    got = run(inter.allreduce(p, x, coll.NUMPY_OPS["max"], coll.Codec.of(x)))
    assert (got == max(other)).all(), got
    counts = [2] * len(mine)
    y = np.arange(2 * len(other), dtype=np.int64) + rank
    got = run(inter.reduce_scatter(p, y, coll.NUMPY_OPS["sum"], coll.Codec.of(y), counts))
    full = sum(np.arange(2 * len(mine), dtype=np.int64) + r for r in other)
    assert (got == full[2 * me:2 * me + 2]).all(), (got, full)
    run(inter.barrier(p))


def main():
    w = ucxpy.init()
    rank, n = w.rank, w.size
    t = coll.Team(w.worker, w.eps, rank, team_id=7)
    run = lambda g: coll.run(t, g, timeout=60)          # noqa: E731

    run(coll.barrier(t))
    # broadcast from every root
    for root in range(n):
        buf = bytearray(b"r%d" % root * 100) if rank == root else bytearray(len(b"r%d" % root) * 100)
        run(coll.bcast(t, buf, root))
        assert bytes(buf) == b"r%d" % root * 100
    # allreduce: each algorithm, out of place and in place, several dtypes
    SUM = coll.NUMPY_OPS["sum"]
    for count in (1, 5, ALLREDUCE_RING_MIN // 8 + 3):
        for dt in (np.float64, np.int32):
            x = (np.arange(count) + rank).astype(dt)
            want = sum((np.arange(count) + r).astype(dt) for r in range(n))
            got = run(coll.allreduce(t, x, SUM))
            assert np.array_equal(got, want) and got is not x
            y = x.copy()
            assert run(coll.allreduce(t, y, SUM, out=y)) is y and np.array_equal(y, want)
    big = np.full(ALLREDUCE_RING_MIN // 8 + 11, rank + 1.0)
    for algo in (coll.allreduce_ring, coll.allreduce_hd, coll.allreduce_rd):
        out = np.empty_like(big)
        run(algo(t, big, coll.NUMPY_OPS["max"], out))
        assert (out == n).all(), algo
    # reduce to every root; a non-commutative op keeps rank order
    for root in range(n):
        x = np.array([rank + 1, rank], np.int64)
        got = run(coll.reduce(t, x, SUM, root))
        if rank == root:
            assert list(got) == [n * (n + 1) // 2, n * (n - 1) // 2]
        else:
            assert got is None
        out = np.zeros(2, np.int64)
        mine = np.array([rank + 2, 3 * rank + 1], np.int64)
        got = run(coll.reduce(t, mine, Affine(), root, out=out))
        if rank == root:
            assert got is out and list(out) == list(affine_fold(n)), (out, affine_fold(n))
    # allgather, reduce_scatter, gather, scatter
    blocks = [bytearray(3) for _ in range(n)]
    run(coll.allgather(t, bytes([rank] * 3), blocks))
    assert blocks == [bytearray([r] * 3) for r in range(n)]
    for count in (1, 4, 10000):
        mine = [np.full(count, rank * 10 + b, np.float32) for b in range(n)]
        out = np.empty(count, np.float32)
        run(coll.reduce_scatter(t, mine, SUM, out))
        assert (out == sum(r * 10 + rank for r in range(n))).all()
    for root in range(n):
        got = [bytearray(2) for _ in range(n)] if rank == root else None
        run(coll.gather(t, bytes([rank, root]), got, root))
        if rank == root:
            assert got == [bytearray([r, root]) for r in range(n)]
        into = bytearray(2)
        parts = [bytes([r, root]) for r in range(n)] if rank == root else None
        run(coll.scatter(t, parts, into, root))
        assert into == bytes([rank, root])
    # all-to-all: uneven and empty parts (rank i sends i+j bytes to j; none to itself when odd)
    sizes = lambda i, j: 0 if (i == j and i % 2) else i + j          # noqa: E731
    send = [bytes([rank]) * sizes(rank, j) for j in range(n)]
    recv = [bytearray(sizes(i, rank)) for i in range(n)]
    run(coll.alltoall(t, send, recv))
    assert recv == [bytearray([i]) * sizes(i, rank) for i in range(n)]
    sc = [sizes(rank, j) for j in range(n)]
    rc = [sizes(i, rank) for i in range(n)]
    flat = bytearray(sum(rc) + 5)
    run(coll.alltoallv(t, b"".join(send), sc, flat, rc))
    assert bytes(flat[:sum(rc)]) == b"".join(bytes([i]) * sizes(i, rank) for i in range(n))
    # Python objects: broadcast, gather, scatter, allgather, alltoall (any size)
    for root in range(n):
        got = run(coll.bcast_obj(t, {"root": root, "pad": "x" * 5000 * root}
                                 if rank == root else None, root))
        assert got == {"root": root, "pad": "x" * 5000 * root}
        got = run(coll.gather_obj(t, ("r", rank), root))
        assert got == ([("r", r) for r in range(n)] if rank == root else None)
        got = run(coll.scatter_obj(t, [[root, r] for r in range(n)] if rank == root else None, root))
        assert got == [root, rank]
    assert run(coll.allgather_obj(t, "y" * rank)) == ["y" * r for r in range(n)]
    assert run(coll.alltoall_obj(t, [(rank, j) for j in range(n)])) == [(r, rank) for r in range(n)]
    # reductions of values: objects (op called as op(a, b), rank order kept) and arrays
    concat = lambda a, b: a + b                                       # noqa: E731
    concat.commutative = False
    objs = coll.Codec()
    want = "".join(str(r) for r in range(n))
    assert run(coll.allreduce(t, str(rank), concat, codec=objs)) == want
    for root in range(n):
        got = run(coll.reduce(t, str(rank), concat, root, objs))
        assert got == (want if rank == root else None), got
    got = run(coll.scan(t, str(rank), concat, objs))
    assert got == "".join(str(r) for r in range(rank + 1))
    got = run(coll.scan(t, str(rank), concat, objs, exclusive=True))
    assert got == (None if rank == 0 else "".join(str(r) for r in range(rank)))
    x = np.full(3, rank + 1, np.int64)
    got = run(coll.scan(t, x, SUM, coll.Codec.of(x)))
    assert (got == sum(range(1, rank + 2))).all()
    got = run(coll.bcast_value(t, x if rank == 0 else None, 0, coll.Codec.of(x)))
    assert (got == 1).all()
    # sparse exchange on a ring (two edges between the same pair at 2
    # ranks, apart by their rounds) plus an edge that is none
    left, right = (rank - 1) % n, (rank + 1) % n
    recvs = [bytearray(2), bytearray(2), None]
    run(coll.neighbor(t, [left, right, None], [right, left, None],
                      [bytes([rank, 0]), bytes([rank, 1]), None], recvs, [0, 1, 0], [0, 1, 0]))
    assert recvs[:2] == [bytearray([left, 0]), bytearray([right, 1])], recvs
    got = run(coll.neighbor_obj(t, [left, None, right], [right, left], [("r", rank), ("l", rank)],
                                [0, 0, 1], [0, 1]))
    assert got == [("r", left), None, ("l", right)], got
    # fault-tolerant agreement: everyone, then without the last member (known
    # failed to every other one, which does not take part)
    acc, failed = run(coll.agree(t, rank, max, t.coll_tag()))
    assert acc == n - 1 and failed == set(), (acc, failed)
    tag = t.coll_tag()
    if n > 1 and rank != n - 1:
        acc, failed = run(coll.agree(t, 1 << rank, lambda a, b: a | b, tag, {n - 1}))
        assert acc == (1 << (n - 1)) - 1 and failed == {n - 1}, (acc, failed)
    # the straight-line blocking forms, interleaved with the generators
    coll.barrier_now(t)
    buf = bytearray(b"z" * 9) if rank == 0 else bytearray(9)
    coll.bcast_now(t, buf, 0)
    assert buf == b"z" * 9
    y = np.full(6, float(rank))
    out = np.empty_like(y)
    coll.allreduce_now(t, y, SUM, out)
    assert (out == sum(range(n))).all()
    sb = [bytes([rank, j]) for j in range(n)]
    rb = [bytearray(2) for _ in range(n)]
    coll.alltoall_now(t, sb, rb)
    assert rb == [bytearray([i, rank]) for i in range(n)]
    run(coll.barrier(t))
    # two nonblocking collectives at once, completed in the other order
    a = coll.CollRequest(w.worker, coll.allreduce(t, np.full(7, rank, np.int64), SUM))
    b = coll.CollRequest(w.worker, coll.allgather(t, bytes([rank]), [bytearray(1) for _ in range(n)]))
    seen = []
    a.add_done_callback(seen.append)
    got_b = b.wait(60)
    assert (a.wait(60) == sum(range(n))).all() and seen == [a]
    assert got_b == [bytearray([r]) for r in range(n)]
    # a failed team raises at its next round
    if n > 1:
        t.failed = RuntimeError("team failed")
        try:
            run(coll.barrier(t))
        except RuntimeError as e:
            assert "team failed" in str(e)
        else:
            raise AssertionError("a failed team ran a collective")
        t.failed = None
    if n > 1:
        between_halves(w, rank, n)
    # bad arguments
    try:
        coll.Team(w.worker, w.eps, rank, team_id=1 << 16)
    except ValueError:
        pass
    else:
        raise AssertionError("team_id out of range accepted")
    run(coll.barrier(t))
    print(f"COLL OK {rank}", flush=True)
    w.finalize()


if __name__ == "__main__":
    sys.exit(main())

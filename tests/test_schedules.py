"""Collective schedules (ucxpy.schedules): every rank reached exactly once,
parent/child and partner relations symmetric, for every group size to 33."""
import numpy as np
import pytest

from ucxpy.schedules import binomial_tree, recursive_doubling


@pytest.mark.parametrize("n", range(1, 34))
def test_binomial_tree_spans_the_group(n):
    for root in {0, n // 2, n - 1}:
        tree = {r: binomial_tree(r, n, root) for r in range(n)}
        assert tree[root][0] is None
        for r, (parent, children) in tree.items():
            if r != root:
                assert r in tree[parent][1]
            for child in children:
                assert tree[child][0] == r
        # a broadcast from root reaches everyone once, in ceil(log2 n) hops
        reached, frontier, depth = {root}, [root], 0
        while frontier:
            frontier = [c for r in frontier for c in tree[r][1]]
            assert not reached & set(frontier)
            reached |= set(frontier)
            depth += bool(frontier)
        assert reached == set(range(n)) and depth <= (n - 1).bit_length()


@pytest.mark.parametrize("n", range(1, 34))
def test_recursive_doubling_computes_an_ordered_allreduce(n):
    plans = [recursive_doubling(r, n) for r in range(n)]
    vals = [(r,) for r in range(n)]           # tuples: concatenation is not commutative
    for r, p in enumerate(plans):             # fold: "send" side pairs with a "recv" side
        if p.fold:
            kind, peer = p.fold
            assert plans[peer].fold == ("recv" if kind == "send" else "send", r)
    vals = [vals[p.fold[1]] + vals[r] if p.fold and p.fold[0] == "recv" else vals[r]
            for r, p in enumerate(plans)]
    rounds = max(len(p.partners) for p in plans)
    for k in range(rounds):
        new = list(vals)
        for r, p in enumerate(plans):
            if k < len(p.partners):
                peer = p.partners[k]
                assert plans[peer].partners[k] == r
                new[r] = vals[peer] + vals[r] if peer < r else vals[r] + vals[peer]
        vals = new
    for r, p in enumerate(plans):
        if p.unfold and p.unfold[0] == "recv":
            vals[r] = vals[p.unfold[1]]
    assert all(v == tuple(range(n)) for v in vals), vals


def test_bad_ranks():
    with pytest.raises(ValueError):
        binomial_tree(3, 3, 0)
    with pytest.raises(ValueError):
        recursive_doubling(-1, 4)


@pytest.mark.parametrize("n", range(1, 34))
def test_ring_allreduce_reduces_every_block_once_and_shares_it(n):
    from ucxpy.schedules import ring_allreduce
    plans = [ring_allreduce(r, n) for r in range(n)]
    # acc[r][b]: the set of ranks whose block b has been folded into rank r's copy
    acc = [[{r} for _ in range(n)] for r in range(n)]
    for step in range(n - 1):
        sent = {}
        for r, p in enumerate(plans):
            sb, _ = p.reduce_scatter[step]
            sent[p.right] = (sb, set(acc[r][sb]))
        for r, p in enumerate(plans):
            _, rb = p.reduce_scatter[step]
            sb, vals = sent[r]
            assert sb == rb and p.left == (r - 1) % n
            assert not (vals & acc[r][rb])          # nothing counted twice
            acc[r][rb] |= vals
    for r, p in enumerate(plans):
        assert acc[r][p.owned] == set(range(n))
    for step in range(n - 1):
        sent = {}
        for r, p in enumerate(plans):
            sb, _ = p.allgather[step]
            sent[p.right] = (sb, set(acc[r][sb]))
        for r, p in enumerate(plans):
            _, rb = p.allgather[step]
            sb, vals = sent[r]
            assert sb == rb and vals == set(range(n))
            acc[r][rb] = vals
    assert all(acc[r][b] == set(range(n)) for r in range(n) for b in range(n))


@pytest.mark.parametrize("count,n", [(0, 1), (10, 3), (3, 5), (1000, 7), (7, 7)])
def test_block_bounds_cover_the_count(count, n):
    from ucxpy.schedules import block_bounds
    b = block_bounds(count, n)
    assert len(b) == n and b[0][0] == 0 and b[-1][1] == count
    assert all(x[1] == y[0] for x, y in zip(b, b[1:]))
    assert max(s - a for a, s in b) - min(s - a for a, s in b) <= 1


def test_allreduce_algorithm_choice():
    from ucxpy.schedules import ALLREDUCE_RING_MIN, allreduce_algorithm
    assert allreduce_algorithm(8, 1, 4, True) == "recursive_doubling"
    assert allreduce_algorithm(ALLREDUCE_RING_MIN, 1 << 13, 4, True) == "halving_doubling"
    assert allreduce_algorithm(ALLREDUCE_RING_MIN, 1 << 13, 8, True) == "halving_doubling"
    for n in (2, 3, 5, 6, 7):        # 2: the same schedule; others: no fold
        assert allreduce_algorithm(ALLREDUCE_RING_MIN, 1 << 13, n, True) == "ring", n
    assert allreduce_algorithm(ALLREDUCE_RING_MIN, 1 << 13, 4, False) == "recursive_doubling"
    assert allreduce_algorithm(ALLREDUCE_RING_MIN, 1 << 13, 1, True) == "recursive_doubling"
    assert allreduce_algorithm(ALLREDUCE_RING_MIN, 2, 4, True) == "recursive_doubling"


@pytest.mark.parametrize("call", [
    lambda: binomial_tree(0, 3, 3), lambda: binomial_tree(3, 3, 0),
    lambda: binomial_tree(-1, 3, 0), lambda: binomial_tree(0, 3, -1),
    lambda: recursive_doubling(4, 4), lambda: recursive_doubling(-1, 4),
], ids=["root=n", "rank=n", "rank<0", "root<0", "rd-rank=n", "rd-rank<0"])
def test_out_of_group_ranks_are_refused_with_the_numbers(call):
    with pytest.raises(ValueError, match=r"outside a group of [34]"):
        call()


@pytest.mark.parametrize("rank,n", [(3, 3), (-1, 3), (1, 1)])
def test_ring_refuses_out_of_group_ranks(rank, n):
    from ucxpy.schedules import ring_allreduce
    with pytest.raises(ValueError, match=f"rank {rank} outside a group of {n}"):
        ring_allreduce(rank, n)


@pytest.mark.parametrize("n", range(1, 34))
def test_recursive_doubling_fold_and_unfold_pair_up(n):
    """Each rank that sits out gives its value to exactly one neighbour and
    gets the result back from that same neighbour; the plan is the exact
    mirror on both sides, and core ranks have log2(pof2) partners."""
    plans = [recursive_doubling(r, n) for r in range(n)]
    pof2 = 1 << (n.bit_length() - 1)
    for r, p in enumerate(plans):
        if p.fold is None:
            assert p.unfold is None and len(p.partners) == pof2.bit_length() - 1
            continue
        kind, peer = p.fold
        assert p.unfold == ("recv" if kind == "send" else "send", peer), (r, p)
        assert plans[peer].unfold == (kind, r), (r, p, plans[peer])
        if kind == "send":
            assert p.partners == [] and peer == r + 1
        else:
            assert peer == r - 1 and len(p.partners) == pof2.bit_length() - 1
    assert sum(p.fold is not None and p.fold[0] == "send" for p in plans) == n - pof2


@pytest.mark.parametrize("n", range(1, 12))
def test_ring_plan_has_n_minus_1_steps_each_way(n):
    from ucxpy.schedules import ring_allreduce
    for r in range(n):
        p = ring_allreduce(r, n)
        assert len(p.reduce_scatter) == n - 1 and len(p.allgather) == n - 1
        assert (p.right, p.left, p.owned) == ((r + 1) % n, (r - 1) % n, (r + 1) % n)


def test_allreduce_algorithm_boundaries():
    from ucxpy.schedules import ALLREDUCE_RING_MIN, allreduce_algorithm
    assert allreduce_algorithm(ALLREDUCE_RING_MIN, 2, 2, True) == "ring"       # n=2, count=n
    assert allreduce_algorithm(ALLREDUCE_RING_MIN - 1, 1 << 13, 2, True) == "recursive_doubling"
    assert allreduce_algorithm(ALLREDUCE_RING_MIN, 3, 4, True) == "recursive_doubling"


def test_collective_table_is_what_ucxpy_info_prints():
    from ucxpy.schedules import collective_table
    assert collective_table(4) == [
        ("barrier", "-", "dissemination"),
        ("bcast", "any", "binomial tree"),
        ("reduce", "any", "binomial tree (rank order for non-commutative ops)"),
        ("allreduce", "< 512 KiB", "recursive_doubling"),
        ("allreduce", ">= 512 KiB",
         "halving/doubling (Rabenseifner) (commutative ops; else recursive doubling)"),
        ("scan/exscan", "any", "recursive doubling"),
        ("allgather", "any", "ring"),
        ("gather/scatter/alltoall", "any", "direct (all messages at once)"),
    ]


def test_collective_table_names_what_the_layers_choose():
    from ucxpy.schedules import collective_table
    t4 = collective_table(4)
    assert ("allreduce", "< 512 KiB", "recursive_doubling") in t4
    assert ("allreduce", ">= 512 KiB", "ring (commutative ops; else recursive doubling)") in \
        collective_table(6)
    assert [row[0] for row in t4] == ["barrier", "bcast", "reduce", "allreduce", "allreduce",
                                      "scan/exscan", "allgather", "gather/scatter/alltoall"]
    assert all(len(row) == 3 and all(isinstance(x, str) and x for x in row) for row in t4)
    t1 = collective_table(1)
    assert t1[4][2].startswith("recursive_doubling")          # one rank never rings
    assert dict((r[0], r[2]) for r in t4)["bcast"] == "binomial tree"


@pytest.mark.parametrize("rank,n", [(4, 4), (-1, 3), (1, 1)])
def test_halving_refuses_out_of_group_ranks(rank, n):
    from ucxpy.schedules import halving_doubling
    with pytest.raises(ValueError, match=f"rank {rank} outside a group of {n}"):
        halving_doubling(rank, n)


def simulate_halving(n, count):
    """Run every rank's HalvingPlan on vectors of distinct numbers the way
    ucxpy.coll.allreduce_hd moves them; check on the way that each
    round pairs two ranks whose send and keep/recv ranges mirror, and return
    (final vectors, expected sum, plans)."""
    from ucxpy.schedules import block_bounds, halving_doubling
    plans = [halving_doubling(r, n) for r in range(n)]
    rng = np.random.default_rng(n * 1000 + count)
    data = [rng.integers(0, 1 << 20, count).astype(np.int64) for _ in range(n)]
    want = sum(data)
    state = [d.copy() for d in data]
    for r, p in enumerate(plans):                 # fold: into the right neighbour
        if p.fold and p.fold[0] == "send":
            assert plans[p.fold[1]].fold == ("recv", r)
            state[p.fold[1]] += state[r]
    nb = plans[-1].nblocks
    bounds = block_bounds(count, nb)

    def span(blocks):
        return slice(bounds[blocks[0]][0], bounds[blocks[1] - 1][1])
    rounds = max(len(p.reduce_scatter) for p in plans)

    def exchange(phase, land):
        """Every round of ``phase`` at once: each rank sends its ``send``
        range; the peer's message must be for this rank and cover exactly
        this rank's keep/recv range, which ``land`` updates."""
        for i in range(rounds):
            msgs = {r: (getattr(p, phase)[i][0], getattr(p, phase)[i][1],
                        state[r][span(getattr(p, phase)[i][1])].copy())
                    for r, p in enumerate(plans) if getattr(p, phase)}
            for r, p in enumerate(plans):
                if getattr(p, phase):
                    peer, _send, mine = getattr(p, phase)[i]
                    src, got_range, got = msgs[peer]
                    assert src == r and got_range == mine, (n, phase, i, r, p, plans[peer])
                    land(state[r], span(mine), got)

    def combine(vec, where, got):
        vec[where] += got

    def replace(vec, where, got):
        vec[where] = got
    exchange("reduce_scatter", combine)
    for r, p in enumerate(plans):
        if p.reduce_scatter:
            assert p.reduce_scatter[-1][2] == (p.owned, p.owned + 1)
    exchange("allgather", replace)
    for r, p in enumerate(plans):                 # unfold: the result back
        if p.unfold and p.unfold[0] == "send":
            assert plans[p.unfold[1]].unfold == ("recv", r)
            state[p.unfold[1]] = state[r].copy()
    return state, want, plans


@pytest.mark.parametrize("n", range(1, 18))
@pytest.mark.parametrize("count", [17, 64])
def test_halving_doubling_reduces_everything_everywhere(n, count):
    state, want, plans = simulate_halving(n, count)
    for r in range(n):
        assert np.array_equal(state[r], want), (n, r)
    pof2 = 1 << (n.bit_length() - 1)
    k = pof2.bit_length() - 1
    owners = sorted(p.owned for p in plans if p.reduce_scatter or p.fold is None)
    assert owners == list(range(pof2)) if pof2 > 1 else owners in ([0], [])
    for r, p in enumerate(plans):
        assert p.nblocks == pof2
        if p.fold and p.fold[0] == "send":
            assert (p.reduce_scatter, p.allgather, p.owned) == ([], [], -1)
            assert p.unfold == ("recv", r + 1) and p.fold == ("send", r + 1)
            continue
        assert len(p.reduce_scatter) == len(p.allgather) == k
        sizes = [ks[1] - ks[0] for _peer, _s, ks in p.reduce_scatter]
        assert sizes == [pof2 >> (i + 1) for i in range(k)]        # halving
        assert [rs[1] - rs[0] for _peer, _s, rs in p.allgather] == [1 << i for i in range(k)]
        if p.fold is not None:
            assert p.fold == ("recv", r - 1) and p.unfold == ("send", r - 1)
        else:
            assert p.unfold is None


def test_halving_plan_for_four_ranks_is_pinned():
    from ucxpy.schedules import halving_doubling
    assert halving_doubling(2, 4) == (None, [(0, (0, 2), (2, 4)), (3, (3, 4), (2, 3))], 2,
                                      [(3, (2, 3), (3, 4)), (0, (2, 4), (0, 2))], None, 4)
    assert halving_doubling(1, 3) == (("recv", 0), [(2, (1, 2), (0, 1))], 0,
                                      [(2, (0, 1), (1, 2))], ("send", 0), 2)


def test_fold_names_the_core_of_any_group():
    from ucxpy.schedules import _fold
    assert _fold(0, 3) == (2, 1, ("send", 1), ("recv", 1), None)
    assert _fold(1, 3) == (2, 1, ("recv", 0), ("send", 0), 0)
    assert _fold(2, 3) == (2, 1, None, None, 1)
    assert [_fold(0, 3).real(nd) for nd in (0, 1)] == [1, 2]
    assert _fold(5, 8) == (8, 0, None, None, 5)


def test_team_sizes_by_group_size():
    """Which calls a shared-memory team takes: the smaller limits for two
    members, the larger from three on (every rank computes the same)."""
    from ucxpy.schedules import TEAM_MAX, WHOLE_REDUCE_MAX, team_max
    assert WHOLE_REDUCE_MAX == 16 << 10
    assert TEAM_MAX == {"bcast": (256 << 10, 1 << 62), "allreduce": (4 << 20, 1 << 62),
                        "reduce": (4 << 20, 1 << 62), "allgather": (256 << 10, 4 << 20),
                        "alltoall": (256 << 10, 1 << 20)}
    for op, (two, more) in TEAM_MAX.items():
        assert team_max(op, 1) == team_max(op, 2) == two
        assert team_max(op, 3) == team_max(op, 4) == team_max(op, 64) == more
    with pytest.raises(KeyError):
        team_max("scan", 2)


def test_team_table_is_pinned():
    from ucxpy.schedules import team_table
    whole = "one sync, each member reduces all slots (rank order)"
    scatter = "reduce-scatter in the slots, gather (commutative ops)"
    assert team_table(2) == [
        ("barrier", "-", "flags: every member's counter"),
        ("bcast", "<= 256 KiB", "root's slot, copied out by the others"),
        ("allreduce", "<= 16 KiB", whole), ("allreduce", "> 16 KiB, <= 4 MiB", scatter),
        ("reduce", "<= 16 KiB", whole), ("reduce", "> 16 KiB, <= 4 MiB", scatter),
        ("allgather", "<= 256 KiB", "own slot, every slot copied out"),
        ("alltoall", "<= 256 KiB", "own slot, each member's block copied out")]
    assert team_table(4) == [
        ("barrier", "-", "flags: every member's counter"),
        ("bcast", "any", "root's slot, copied out by the others"),
        ("allreduce", "<= 16 KiB", whole), ("allreduce", "> 16 KiB, any", scatter),
        ("reduce", "<= 16 KiB", whole), ("reduce", "> 16 KiB, any", scatter),
        ("allgather", "<= 4 MiB", "own slot, every slot copied out"),
        ("alltoall", "<= 1 MiB", "own slot, each member's block copied out")]


def test_team_table_calls_limits_from_2_to_40_unlimited(monkeypatch):
    import ucxpy.schedules as sch
    monkeypatch.setattr(sch, "TEAM_MAX", dict(sch.TEAM_MAX, bcast=(1 << 40, (1 << 40) - 1)))
    assert sch.team_table(2)[1][1] == "any"
    assert sch.team_table(3)[1][1] == f"<= {((1 << 40) - 1) >> 20} MiB"

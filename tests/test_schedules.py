"""Collective schedules (ucxpy.schedules): every rank reached exactly once,
parent/child and partner relations symmetric, for every group size to 33."""
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

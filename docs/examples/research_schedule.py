"""run: ucxpy-run -n 3 python docs/examples/research_schedule.py

The researcher's guide's collective schedule: Bruck's allgather, which takes
ceil(log2 n) rounds for any n (the engine's ring takes n - 1), written for
ucxpy.coll.  The schedule is rank arithmetic; the algorithm is a generator
that posts one round and yields its requests.  It runs blocking and
nonblocking on the job's team and on a team object of its own (the ranks
in reverse order), checked against numpy and the engine's own allgather.
"""
import numpy as np

import ucxpy
from ucxpy import coll
from ucxpy.tag import RESERVED_TAG_BASE


def bruck_rounds(rank: int, n: int) -> list:
    """The schedule: per round ``(send_to, recv_from, count, at)``.  Member
    ``rank`` keeps the blocks of members rank, rank+1, ... in that order;
    in the round of distance d it sends its first ``count`` blocks to
    rank - d and receives as many from rank + d, stored from block ``at``."""
    rounds, dist = [], 1
    while dist < n:
        rounds.append(((rank - dist) % n, (rank + dist) % n, min(dist, n - dist), dist))
        dist *= 2
    return rounds


def allgather_bruck(t, send, out):
    """The algorithm: ``out`` (``t.size * len(send)`` elements) becomes every
    member's ``send``, by team rank.  One ``yield`` per round."""
    tag, n, k = t.coll_tag(), t.size, len(send)
    held = np.empty(n * k, send.dtype)          # held[i] is member (rank + i)'s block
    held[:k] = send
    for rnd, (to, frm, count, at) in enumerate(bruck_rounds(t.rank, n)):
        into = memoryview(held[at * k:(at + count) * k]).cast("B")
        r = coll.post_recv(t, frm, into, tag | rnd)         # (each checks t.check())
        s = coll.post_send(t, to, memoryview(held[:count * k]).cast("B"), tag | rnd)
        yield [s, r]                            # resumed once both completed
    out[:] = np.roll(held, t.rank * k)          # rotate into rank order
    return out


class ReversedTeam:
    """A team is any object with these attributes: here the job's ranks in
    reverse order, with a tag space of its own (ucxpy's reserved tags, team
    id 9, as ``coll.Team`` lays them out)."""

    def __init__(self, world):
        n = world.size
        self.worker, self.size, self.rank = world.worker, n, n - 1 - world.rank
        self.eps = [world.eps[n - 1 - i] for i in range(n)]     # by team rank
        self.peers = [ep.remote_id for ep in self.eps]          # their worker ids
        self.wait_until = world.worker.wait_until
        self.base, self.seq = RESERVED_TAG_BASE | (0xFE << 48) | (9 << 32), 0

    def coll_tag(self) -> int:                  # every member calls collectives in one order
        self.seq = (self.seq + 1) & 0xFFFFFF
        return self.base | (self.seq << 8)      # the low 8 bits: the round

    def check(self) -> None:                    # raise here once the team may not communicate
        pass


world = ucxpy.init()
n, k = world.size, 5
team = coll.Team(world.worker, world.eps, world.rank, team_id=8)


def contribution(rank, salt=0):
    return np.arange(k, dtype=np.float64) + 100 * rank + salt


expected = np.concatenate([contribution(r) for r in range(n)])

# blocking: coll.run drives the generator, waiting in team.wait_until
out = np.empty(n * k)
coll.run(team, allgather_bruck(team, contribution(world.rank), out), timeout=30)
assert np.array_equal(out, expected), out

# the same answer as the engine's ring allgather
blocks = [bytearray(k * 8) for _ in range(n)]
coll.run(team, coll.allgather(team, memoryview(contribution(world.rank)).cast("B"), blocks))
assert np.array_equal(np.frombuffer(b"".join(blocks)), out)

# nonblocking: two at once, moved by the requests' completion callbacks
outs = [np.empty(n * k), np.empty(n * k)]
reqs = [coll.CollRequest(world.worker, allgather_bruck(team, contribution(world.rank, s), o))
        for s, o in zip((1, 2), outs)]
for s, (r, o) in zip((1, 2), zip(reqs, outs)):
    r.wait(timeout=30)
    assert np.array_equal(o, np.concatenate([contribution(q, s) for q in range(n)]))

# a team of its own: results come by team rank, which reverses the job's
rev = ReversedTeam(world)
out = np.empty(n * k)
coll.run(rev, allgather_bruck(rev, contribution(world.rank), out), timeout=30)
assert np.array_equal(out, np.concatenate([contribution(r) for r in reversed(range(n))]))

print(f"rank {world.rank}: Bruck allgather in {len(bruck_rounds(world.rank, n))} rounds "
      f"for {n} ranks, checked")
world.finalize()

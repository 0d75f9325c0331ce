"""Every collective of the bootstrap, checked on every rank; prints OK."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from ucxpy import bootstrap  # noqa: E402

boot = bootstrap.from_env()
expect_kind = os.environ.get("EXPECT_BOOTSTRAP")
assert expect_kind is None or boot.kind == expect_kind, (boot.kind, expect_kind)
rank, size = boot.rank, boot.size
assert 0 <= rank < size
assert 0 <= boot.local_rank < boot.local_size <= size

# variable sizes, including an empty contribution and a larger one
mine = b"" if rank == 0 else f"rank{rank}:".encode() + bytes([rank % 256]) * (1000 * rank)
got = boot.allgather(mine, timeout=30)
assert len(got) == size, got
for r, item in enumerate(got):
    want = b"" if r == 0 else f"rank{r}:".encode() + bytes([r % 256]) * (1000 * r)
    assert bytes(item) == want, (r, item[:20])

for root in {0, size - 1}:
    value = f"from root {root}".encode() * 3
    out = boot.bcast(value if rank == root else None, root=root, timeout=30)
    assert bytes(out) == value, out

boot.barrier(timeout=30)
# a second allgather gets its own sequence number
assert [bytes(x) for x in boot.allgather(bytes([rank]), timeout=30)] == [bytes([r]) for r in range(size)]

if boot.kind in ("zmq", "single"):
    boot.put(f"key{rank}", f"value{rank}".encode())
    peer = (rank + 1) % size
    assert boot.get(f"key{peer}", timeout=30) == f"value{peer}".encode()
elif boot.kind == "pmix":      # PMI's semantics: visible after the next collective
    boot.put(f"key{rank}", f"value{rank}".encode())
    boot.barrier(timeout=30)
    assert [boot.lookup(f"key{r}") for r in range(size)] == \
        [f"value{r}".encode() for r in range(size)]
    assert boot.lookup("never-put") is None

boot.check_failures()
boot.barrier(timeout=30)
boot.close()
boot.close()
print(f"OK rank {rank}/{size} {boot.kind}", flush=True)

"""Every torch.distributed operation on backend "ucxpy" against what it
must give (tests/test_torch_backend.py), and the functional collectives and
DTensor on it: launched by torchrun, ucxpy-run or mpiexec.  Prints TORCH OK
<rank>.  With ``moe`` after the backend, then runs torch_train.py's MoE
dispatch and combine in the same job and prints MOE OK <rank>."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

import ucxpy.torch  # noqa: F401  (registers "ucxpy")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
          torch.uint8, torch.int16, torch.int32, torch.int64]


def check(cond, what):
    if not cond:
        raise AssertionError(f"rank {dist.get_rank()}: {what}")


def main():
    backend = sys.argv[1] if len(sys.argv) > 1 else "ucxpy"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    rank, n = dist.get_rank(), dist.get_world_size()
    R = dist.ReduceOp
    # all_reduce: every op, every dtype, async
    for dt in DTYPES:
        for op, want in ((R.SUM, lambda v: sum(v)), (R.MIN, min), (R.MAX, max),
                         (R.PRODUCT, lambda v: __import__("math").prod(v))):
            vals = [r % 3 + 1 for r in range(n)]
            x = torch.full((5,), vals[rank], dtype=dt)
            w = dist.all_reduce(x, op, async_op=True)
            w.wait()
            check(torch.equal(x, torch.full((5,), want(vals), dtype=dt)), f"{op} {dt}: {x}")
        if not dt.is_floating_point:
            for op, fn in ((R.BAND, lambda a, b: a & b), (R.BOR, lambda a, b: a | b),
                           (R.BXOR, lambda a, b: a ^ b)):
                vals = [(r * 37 + 5) & 0x7F for r in range(n)]
                want = vals[0]
                for v in vals[1:]:
                    want = fn(want, v)
                x = torch.full((3,), vals[rank], dtype=dt)
                dist.all_reduce(x, op)
                check(int(x[0]) == want, f"{op} {dt}")
    # AVG and PREMUL_SUM (floats), big enough for the ring / halving-doubling
    for count in (7, 70000):
        x = torch.arange(count, dtype=torch.float64) * (rank + 1)
        dist.all_reduce(x, R.AVG)
        check(torch.allclose(x, torch.arange(count, dtype=torch.float64) * (n + 1) / 2), "AVG")
        x = torch.full((count,), float(rank + 1))
        dist.all_reduce(x, dist._make_nccl_premul_sum(0.5))
        check(torch.allclose(x, torch.full((count,), n * (n + 1) / 4)), "PREMUL_SUM")
    x = torch.full((4,), 2 * rank + 1, dtype=torch.int32)
    dist.all_reduce(x, R.AVG)
    check(int(x[0]) == (n * n) // n, "integer AVG")
    # non-contiguous tensor
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    dist.all_reduce(m)
    check(torch.equal(m, torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * n), "strided")
    # broadcast, reduce, from every root
    for root in range(n):
        x = torch.full((6,), float(rank))
        dist.broadcast(x, root)
        check(torch.equal(x, torch.full((6,), float(root))), "broadcast")
        x = torch.full((3,), float(rank + 1), dtype=torch.bfloat16)
        dist.reduce(x, root, R.SUM)
        if rank == root:
            check(float(x[0]) == n * (n + 1) / 2, f"reduce {x}")
    # all_gather (list and single), reduce_scatter (list and single)
    for dt in (torch.float32, torch.bfloat16, torch.int64):
        outs = [torch.empty(4, dtype=dt) for _ in range(n)]
        dist.all_gather(outs, torch.full((4,), rank, dtype=dt))
        check(all(torch.equal(o, torch.full((4,), r, dtype=dt)) for r, o in enumerate(outs)),
              "all_gather")
        out = torch.empty(4 * n, dtype=dt)
        dist.all_gather_into_tensor(out, torch.full((4,), rank, dtype=dt))
        check(torch.equal(out, torch.arange(n, dtype=dt).repeat_interleave(4)), "all_gather_into")
        ins = [torch.full((3,), rank * 10 + b, dtype=dt) for b in range(n)]
        out = torch.empty(3, dtype=dt)
        dist.reduce_scatter(out, ins)
        check(torch.equal(out, torch.full((3,), sum(r * 10 + rank for r in range(n)), dtype=dt)),
              f"reduce_scatter {dt} {out}")
        flat = torch.cat(ins)
        out = torch.empty(3, dtype=dt)
        dist.reduce_scatter_tensor(out, flat)
        check(torch.equal(out, torch.full((3,), sum(r * 10 + rank for r in range(n)), dtype=dt)),
              "reduce_scatter_tensor")
    # gather, scatter
    for root in range(n):
        g = [torch.empty(2) for _ in range(n)] if rank == root else None
        dist.gather(torch.full((2,), float(rank)), g, dst=root)
        if rank == root:
            check(all(float(t[0]) == r for r, t in enumerate(g)), "gather")
        out = torch.empty(2)
        dist.scatter(out, [torch.full((2,), float(r + root)) for r in range(n)]
                     if rank == root else None, src=root)
        check(float(out[0]) == rank + root, "scatter")
    # all_to_all_single: even, uneven and empty splits; all_to_all lists
    x = torch.arange(n * 2, dtype=torch.float32) + 100 * rank
    out = torch.empty(n * 2)
    dist.all_to_all_single(out, x)
    check(torch.equal(out, torch.tensor([100 * r + 2 * rank + k for r in range(n) for k in (0, 1)],
                                        dtype=torch.float32)), "all_to_all_single")
    send_splits = [(rank + j) % 3 for j in range(n)]          # some zero
    recv_splits = [(r + rank) % 3 for r in range(n)]
    x = torch.cat([torch.full((s, 2), float(rank * 10 + j)) for j, s in enumerate(send_splits)])
    out = torch.empty(sum(recv_splits), 2)
    dist.all_to_all_single(out, x, recv_splits, send_splits)
    want = torch.cat([torch.full((s, 2), float(r * 10 + rank)) for r, s in enumerate(recv_splits)])
    check(torch.equal(out, want), "uneven all_to_all_single")
    outs = [torch.empty(r + 1) for r in range(n)]
    dist.all_to_all(outs, [torch.full((rank + 1,), float(rank * n + j)) for j in range(n)])
    check(all(torch.equal(o, torch.full((r + 1,), float(r * n + rank))) for r, o in enumerate(outs)),
          "all_to_all")
    dist.barrier()
    # send/recv with tags, batch_isend_irecv in a ring
    if n > 1:
        right, left = (rank + 1) % n, (rank - 1) % n
        a, b = torch.empty(3), torch.empty(3)
        ops = [dist.P2POp(dist.isend, torch.full((3,), float(rank)), right, tag=1),
               dist.P2POp(dist.isend, torch.full((3,), float(rank + 50)), right, tag=2),
               dist.P2POp(dist.irecv, b, left, tag=2), dist.P2POp(dist.irecv, a, left, tag=1)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        check(float(a[0]) == left and float(b[0]) == left + 50, "batch_isend_irecv tags")
        if rank == 0:
            dist.send(torch.tensor([7.0, 8.0]), 1)
        elif rank == 1:
            t = torch.empty(2)
            dist.recv(t, 0)
            check(t.tolist() == [7.0, 8.0], "send/recv")
    # object collectives
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank})
    check(objs == [{"rank": r} for r in range(n)], "all_gather_object")
    lst = [rank, "x"] if rank == 0 else [None, None]
    dist.broadcast_object_list(lst, 0)
    check(lst == [0, "x"], "broadcast_object_list")
    # subgroups: even and odd ranks, and a DP x TP mesh of 2 x (n/2)
    evens = dist.new_group([r for r in range(n) if r % 2 == 0])
    odds = dist.new_group([r for r in range(n) if r % 2 == 1]) if n > 1 else None
    mine = evens if rank % 2 == 0 else odds
    x = torch.tensor([float(rank)])
    dist.all_reduce(x, group=mine)
    check(float(x[0]) == sum(r for r in range(n) if r % 2 == rank % 2), "subgroup")
    if n % 2 == 0 and n >= 4:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("dp", "tp"))
        tp = mesh.get_group("tp")
        x = torch.tensor([float(rank)])
        dist.all_reduce(x, group=tp)
        lo = rank // (n // 2) * (n // 2)
        check(float(x[0]) == sum(range(lo, lo + n // 2)), "tp group of the mesh")
    # C++ callers through the trampoline: the functional collectives (their
    # inputs are temporaries the caller drops while the operation runs) and
    # DTensor's redistribution
    import torch.distributed._functional_collectives as funcol
    world = dist.group.WORLD
    for _ in range(3):
        y = funcol.wait_tensor(funcol.all_reduce(torch.full((4,), float(rank + 1)), "sum", world))
        check(torch.equal(y, torch.full((4,), float(n * (n + 1) // 2))), f"funcol all_reduce {y}")
        g = funcol.wait_tensor(funcol.all_gather_tensor(torch.full((3,), float(rank)), 0, world))
        check(torch.equal(g, torch.arange(n).repeat_interleave(3).float()), f"funcol all_gather {g}")
        rs = funcol.wait_tensor(funcol.reduce_scatter_tensor(torch.arange(4.0 * n), "sum", 0, world))
        check(torch.equal(rs, torch.arange(4.0 * n)[4 * rank:4 * rank + 4] * n),
              f"funcol reduce_scatter {rs}")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh1 = init_device_mesh("cpu", (n,))
    full = torch.arange(8.0 * n).reshape(2 * n, 4)
    dt = distribute_tensor(full, mesh1, [Shard(0)])
    check(torch.equal(dt.redistribute(mesh1, [Replicate()]).to_local(), full), "DTensor replicate")
    check(float((dt * 2).sum().full_tensor()) == float(full.sum() * 2), "DTensor sum")
    # errors at the call
    try:
        dist.all_reduce(torch.ones(2), R.BAND)
    except ValueError as e:
        check("BAND" in str(e), str(e))
    else:
        raise AssertionError("BAND of floats accepted")
    dist.barrier()
    print(f"TORCH OK {rank}", flush=True)
    if "moe" in sys.argv[2:]:
        from torch_train import moe     # (this folder: the script's)
        moe(rank, n)
        dist.barrier()
        print(f"MOE OK {rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

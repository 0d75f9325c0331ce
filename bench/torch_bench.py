"""torch.distributed on ucxpy against gloo (``make bench-torch``, part of
``make bench``).  Issue 33's figures, in one run, on this host:

* ``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor`` and
  ``all_to_all_single`` (fp32) at 2 and 4 ranks, from 8 B to 64 MiB per rank;
* an expert-parallel dispatch/combine (``--tokens`` x ``--hidden`` bf16, top-2
  routing, uneven splits: counts exchanged, tokens dispatched and sent home
  by ``all_to_all_single``);
* the step time of DDP on an MLP of a few million parameters;
* mpi_shim's ``Allreduce`` on the same buffers (>= 1 MiB: float32 tensors
  of torch's allocator, as numpy arrays), to show the backend adds nothing
  on top of the core.

Every job runs with ``THP_MEM_ALLOC_ENABLE=1`` (``--no-thp``: without),
torch's own switch that puts its allocations of 2 MiB and more on
transparent huge pages, as numpy does for its arrays of 4 MiB and more.
Which pages a buffer has matters more than any protocol at these sizes (an
allreduce of 64 MiB at 2 ranks, 2026-12-05: 16.4 ms on 4 KiB pages, 13.4 ms on huge
pages, for the backend and for the engine called directly alike), so both
sides get the same.

Each figure is the median of ``--repeat`` timed calls (after warm-up), each
call started after a barrier, timed on every rank, the slowest rank's time
taken.  Jobs run under
``torchrun`` (gloo and ucxpy alike) and ``ucxpy-run`` (mpi_shim), one at a
time.  Targets: ucxpy faster than gloo at every size and pattern; ucxpy's
all_reduce bandwidth at >= 1 MiB >= 0.9x mpi_shim's.  Printed as PASS/MISS;
results in bench/results/torch.json.

Usage: python bench/torch_bench.py [--ranks 2,4] [--max-size 64M] [--repeat N] [--no-thp]
                                   [--json FILE]
       (the jobs themselves: torch_bench.py --job BACKEND OUT SIZES REPEAT ...)
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from ucxpy.tools import snapshot

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SHIM_FACTOR = 0.9


def _sizes(max_size: int):
    s, out = 8, []
    while s <= max_size:
        out.append(s)
        s *= 8 if s < 1 << 20 else 4
    if out[-1] != max_size:
        out.append(max_size)
    return out


def _parse_size(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(t[:-1] if mult > 1 else t) * mult


def _reps(size: int, repeat: int) -> int:
    return max(8, min(repeat, int(200e6 // max(size, 1))))


# -- the jobs ---------------------------------------------------------------------------
def _timed(fn, reps, warm=2):
    """Median over ``reps`` calls of the slowest rank's time of ``fn()``."""
    import torch
    import torch.distributed as dist
    for _ in range(warm):
        fn()
    dist.barrier()
    times = []
    for _ in range(reps):
        dist.barrier()                  # (every rank starts together, as mpi_shim's job does)
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, dist.ReduceOp.MAX)
        times.append(float(t[0]))
    return statistics.median(times)


def job_torch(backend, out, sizes, repeat, tokens, hidden):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    if backend == "ucxpy":
        import ucxpy.torch  # noqa: F401
    dist.init_process_group(backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    res = {op: {} for op in OPS}
    for size in sizes:
        count = max(size // 4, n)
        count -= count % n
        reps = _reps(size, repeat)
        x = torch.ones(count)
        res["all_reduce"][size] = _timed(lambda: dist.all_reduce(x), reps)
        part = torch.ones(count // n)
        whole = torch.empty(count)
        res["all_gather"][size] = _timed(lambda: dist.all_gather_into_tensor(whole, part), reps)
        res["reduce_scatter"][size] = _timed(lambda: dist.reduce_scatter_tensor(part, x), reps)
        y = torch.empty(count)
        res["all_to_all"][size] = _timed(lambda: dist.all_to_all_single(y, x), reps)
    # expert parallelism: top-2 routing of bf16 tokens, uneven splits
    g = torch.Generator().manual_seed(rank)
    toks = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    expert = torch.randint(0, n, (tokens * 2,), generator=g)
    order = torch.argsort(expert, stable=True)
    send = toks.repeat(2, 1)[order]
    scount = torch.bincount(expert, minlength=n)

    def ep():
        rcount = torch.empty_like(scount)
        dist.all_to_all_single(rcount, scount)
        recv = torch.empty(int(rcount.sum()), hidden, dtype=torch.bfloat16)
        dist.all_to_all_single(recv, send, rcount.tolist(), scount.tolist())
        back = torch.empty_like(send)
        dist.all_to_all_single(back, recv, scount.tolist(), rcount.tolist())
    res["ep_dispatch_combine"] = _timed(ep, max(5, repeat // 4))
    # DDP step: MLP of ~4.2M parameters
    torch.manual_seed(0)
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xb, yb = torch.randn(32, 1024), torch.randn(32, 1024)

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
    res["ddp_step"] = _timed(step, max(5, repeat // 4))
    res["ddp_params"] = sum(p.numel() for p in model.parameters())
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def job_shim(out, sizes, repeat):
    import torch
    from mpi_shim import MPI
    comm = MPI.COMM_WORLD
    res = {}
    for size in sizes:
        x = torch.ones(max(size // 4, 1)).numpy()       # (torch's memory, as the backend's)
        reps = _reps(size, repeat)
        for _ in range(2):
            comm.Allreduce(MPI.IN_PLACE, x)
        times = []
        for _ in range(reps):
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, x)
            times.append(comm.allreduce(time.perf_counter() - t0, MPI.MAX))
        res[size] = statistics.median(times)
    if comm.Get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"all_reduce": res}, f)


# -- the driver -----------------------------------------------------------------------
def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(cmd, timeout, thp=True):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT,
               THP_MEM_ALLOC_ENABLE="1" if thp else "0")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:5])}...: exit {p.returncode}\n{p.stderr[-3000:]}")


def run_torch(backend, n, sizes, args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        _launch([os.path.join(BIN, "torchrun"), f"--nproc_per_node={n}",
                 "--master_addr=127.0.0.1", f"--master_port={_port()}", __file__, "--job",
                 backend, out, ",".join(map(str, sizes)), str(args.repeat), str(args.tokens),
                 str(args.hidden)], args.timeout, args.thp)
        with open(out) as f:
            return json.load(f)


def run_shim(n, sizes, args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        _launch([os.path.join(BIN, "ucxpy-run"), "-n", str(n), sys.executable, __file__,
                 "--job", "mpi_shim", out, ",".join(map(str, sizes)), str(args.repeat)],
                args.timeout, args.thp)
        with open(out) as f:
            return json.load(f)


def _fmt_t(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def _fmt_size(z: int) -> str:
    return f"{z >> 20} MiB" if z >= 1 << 20 else f"{z >> 10} KiB" if z >= 1 << 10 else f"{z} B"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--job":
        kind, out, sizes, repeat = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
        sizes = [int(s) for s in sizes.split(",")]
        if kind == "mpi_shim":
            return job_shim(out, sizes, repeat)
        return job_torch(kind, out, sizes, repeat, int(sys.argv[6]), int(sys.argv[7]))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--max-size", default="64M")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--no-thp", dest="thp", action="store_false",
                   help="torch's allocations on 4 KiB pages (THP_MEM_ALLOC_ENABLE=0)")
    p.add_argument("--json", default=os.path.join(HERE, "results", "torch.json"))
    snapshot.add_option(p, "torch")
    args = p.parse_args()
    sizes = _sizes(_parse_size(args.max_size))
    ranks = [int(r) for r in args.ranks.split(",")]
    results, verdicts = {}, []
    for n in ranks:
        ours, gloo = run_torch("ucxpy", n, sizes, args), run_torch("gloo", n, sizes, args)
        shim = run_shim(n, [z for z in sizes if z >= 1 << 20], args)
        results[n] = {"ucxpy": ours, "gloo": gloo, "mpi_shim": shim}
        print(f"\n== {n} ranks (median of the slowest rank's time; ucxpy / gloo) ==")
        print(f"{'size':>8} " + " ".join(f"{op:>30}" for op in OPS))
        worst = {}
        for z in sizes:
            cells = []
            for op in OPS:
                a, b = ours[op][str(z)], gloo[op][str(z)]
                worst[op] = max(worst.get(op, 0), a / b)
                cells.append(f"{_fmt_t(a)} / {_fmt_t(b)} ({a / b:.2f}x)")
            print(f"{_fmt_size(z):>8} " + " ".join(f"{c:>30}" for c in cells))
        for key in ("ep_dispatch_combine", "ddp_step"):
            a, b = ours[key], gloo[key]
            worst[key] = a / b
            print(f"{key}: {_fmt_t(a)} / {_fmt_t(b)} ({a / b:.2f}x)"
                  + (f"  ({ours['ddp_params'] / 1e6:.1f} M parameters)" if key == "ddp_step"
                     else f"  ({args.tokens} tokens x {args.hidden}, bf16, top-2)"))
        for op, r in worst.items():
            verdicts.append((f"{n} ranks: {op} faster than gloo at every size",
                             "PASS" if r < 1.0 else "MISS", f"worst {r:.2f}x"))
        big = [z for z in sizes if z >= 1 << 20]
        ratio = min(shim["all_reduce"][str(z)] / ours["all_reduce"][str(z)] for z in big) \
            if big else None
        if ratio is not None:
            verdicts.append((f"{n} ranks: all_reduce bandwidth >= {SHIM_FACTOR}x mpi_shim's "
                             f"Allreduce at >= 1 MiB", "PASS" if ratio >= SHIM_FACTOR else "MISS",
                             f"worst {ratio:.2f}x"))
    print("\n== targets (issue 33) ==")
    for name, verdict, detail in verdicts:
        print(f"{verdict:5} {name}  ({detail})")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    data = {"when": time.strftime("%Y-%m-%d %H:%M"), "thp": args.thp, "sizes": sizes,
            "results": results, "targets": verdicts}
    with open(args.json, "w") as f:
        json.dump(data, f, indent=1)
    snapshot.save(args, data)


if __name__ == "__main__":
    main()

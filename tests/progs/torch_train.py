"""Deep-learning patterns on a torch.distributed backend (tests/test_torch_backend.py):

  torch_train.py BACKEND ddp OUT      20 DDP steps of a small MLP (same seed everywhere);
                                      rank 0 saves the parameters to OUT
  torch_train.py BACKEND fsdp OUT     the same model under FSDP2 (fully_shard)
  torch_train.py BACKEND pipe OUT     a GPipe schedule over 2 stages (torch.distributed.pipelining);
                                      the last stage saves the losses
  torch_train.py BACKEND moe -        an MoE layer's dispatch and combine (all_to_all_single,
                                      uneven and empty splits): every token comes back exactly
  torch_train.py BACKEND die -        rank 1 dies; every survivor's next collective must fail
  torch_train.py BACKEND stall -      rank 1 sleeps; rank 0's collective must time out (5 s)

Several of ddp, fsdp and pipe, comma-separated, run one after the other in
one job (OUT is then a folder, each saving OUT/<mode>.pt), each printing
TRAIN <mode> OK <rank> when done.  Prints TRAIN OK <rank> at the end."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import ucxpy.torch  # noqa: F401


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 8))


def batches(rank, steps=20):
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g))
            for _ in range(steps)]


def ddp(rank, out):
    from torch.nn.parallel import DistributedDataParallel as DDP
    m = DDP(model(), bucket_cap_mb=0.01)          # several buckets
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    for x, y in batches(rank):
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in m.module.state_dict().items()}, out)


def fsdp(rank, out):
    from torch.distributed.fsdp import fully_shard
    m = model()
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    for x, y in batches(rank):
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    state = {k: v.full_tensor().detach().clone() for k, v in m.state_dict().items()}
    if rank == 0:
        torch.save(state, out)


def pipe(rank, out):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    full = model()
    stage_mod = full[:2] if rank == 0 else full[2:]
    stage = PipelineStage(stage_mod, rank, 2, torch.device("cpu"))
    losses = []
    sched = ScheduleGPipe(stage, n_microbatches=4,
                          loss_fn=lambda o, t: nn.functional.mse_loss(o, t))
    opt = torch.optim.SGD(stage_mod.parameters(), lr=0.05)
    for x, y in batches(0, 5):
        opt.zero_grad()
        if rank == 0:
            sched.step(x)
        else:
            got = []
            sched.step(target=y, losses=got)
            losses.append(torch.stack(got).mean().item())
        opt.step()
    if rank == 1:
        torch.save(losses, out)


def moe(rank, n):
    """Each rank routes its tokens to experts (one per rank) by a top-1
    choice; the counts are exchanged, tokens dispatched by
    all_to_all_single with uneven (some empty) splits, the experts tag them,
    and the combine sends them home."""
    hidden = 24
    g = torch.Generator().manual_seed(rank)
    tokens = 5 + 3 * rank
    x = torch.randn(tokens, hidden, generator=g, dtype=torch.float32)
    dest = torch.randint(0, n, (tokens,), generator=g)
    if n > 2:
        dest[dest == (rank + 1) % n] = rank                 # one empty split per rank
    order = torch.argsort(dest, stable=True)
    send = x[order]
    send_counts = torch.bincount(dest, minlength=n)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    recv = torch.empty(int(recv_counts.sum()), hidden)
    dist.all_to_all_single(recv, send, recv_counts.tolist(), send_counts.tolist())
    expert_out = recv * 2 + rank                            # the "expert"
    back = torch.empty_like(send)
    dist.all_to_all_single(back, expert_out, send_counts.tolist(), recv_counts.tolist())
    want = send * 2 + dest[order].unsqueeze(1).float()
    assert torch.equal(back, want), "a token came back wrong"
    # bf16 dispatch as well
    recv16 = torch.empty(int(recv_counts.sum()), hidden, dtype=torch.bfloat16)
    dist.all_to_all_single(recv16, send.to(torch.bfloat16), recv_counts.tolist(),
                           send_counts.tolist())
    back16 = torch.empty_like(send, dtype=torch.bfloat16)
    dist.all_to_all_single(back16, recv16, send_counts.tolist(), recv_counts.tolist())
    assert torch.equal(back16, send.to(torch.bfloat16)), "bf16 round trip"


def die(rank, n):
    dist.barrier()
    if rank == 1:
        os._exit(3)
    time.sleep(1)
    t0 = time.monotonic()
    try:
        for _ in range(50):
            dist.all_reduce(torch.ones(4))
    except Exception as e:          # noqa: BLE001  (DistBackendError)
        print(f"FAILED AS EXPECTED rank {rank} after {time.monotonic() - t0:.1f}s: "
              f"{type(e).__name__}: {str(e)[:200]}", flush=True)
        os._exit(0)
    print(f"rank {rank}: collectives went on without rank 1", flush=True)
    os._exit(1)


def stall(rank):
    # the ranks' parent (torchrun's agent) names the file rank 0 leaves when
    # it is done, so that rank 1 stalls only that long (at most 25 s)
    done = os.path.join("/tmp", f"ucxpy-torch-stall-{os.getppid()}")
    if rank == 1:
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline and not os.path.exists(done):
            time.sleep(0.1)
        os._exit(0)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
    except Exception as e:          # noqa: BLE001  (DistBackendError)
        took = time.monotonic() - t0
        print(f"TIMED OUT AS EXPECTED after {took:.1f}s: {type(e).__name__}: {str(e)[:200]}",
              flush=True)
        open(done, "w").close()
        try:
            time.sleep(0.5)             # (rank 1 sees it)
        finally:
            os.unlink(done)
        os._exit(0 if 4 < took < 20 else 1)
    os._exit(1)


def mismatch(rank):
    """Members that call a collective with different sizes (small: one
    eager round; large: rendezvous rounds): every one of them fails, none
    returns a result with stale bytes in it."""
    for count in (4, 1 << 17):
        x = torch.ones(count * (1 + rank))
        try:
            dist.all_reduce(x)
        except Exception as e:      # noqa: BLE001  (DistBackendError)
            print(f"MISMATCH FAILED AS EXPECTED {count} rank {rank}: {type(e).__name__}: "
                  f"{str(e)[:200]}", flush=True)
        else:
            print(f"rank {rank}: a mismatched all_reduce returned {x[:4].tolist()}", flush=True)
    os._exit(0)


def main():
    backend, mode, out = sys.argv[1:4]
    timeout = 5 if mode == "stall" else 60
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    rank, n = dist.get_rank(), dist.get_world_size()
    if "," in mode:
        for m in mode.split(","):
            {"ddp": ddp, "fsdp": fsdp, "pipe": pipe}[m](rank, os.path.join(out, f"{m}.pt"))
            dist.barrier()
            print(f"TRAIN {m} OK {rank}", flush=True)
    elif mode == "ddp":
        ddp(rank, out)
    elif mode == "fsdp":
        fsdp(rank, out)
    elif mode == "pipe":
        pipe(rank, out)
    elif mode == "moe":
        moe(rank, n)
    elif mode == "die":
        die(rank, n)
    elif mode == "stall":
        stall(rank)
    elif mode == "mismatch":
        mismatch(rank)
    dist.barrier()
    print(f"TRAIN OK {rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

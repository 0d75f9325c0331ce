"""DDP on ucxpy: ``torchrun --nproc_per_node=2 examples/torch_ddp.py``
(or ``ucxpy-run -n 2 python examples/torch_ddp.py``, no MASTER_ADDR needed)."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ucxpy.torch  # noqa: F401  (registers backend "ucxpy")

dist.init_process_group("ucxpy")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
for step in range(50):
    x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()                      # gradients all-reduced by ucxpy
    opt.step()
w = model.module[0].weight.detach().clone()
dist.all_reduce(w, dist.ReduceOp.MAX)    # every rank holds the same weights
assert torch.equal(w, model.module[0].weight)
if rank == 0:
    print(f"DDP on ucxpy: {dist.get_world_size()} ranks, final loss {loss.item():.3f}")
dist.destroy_process_group()

"""run: ucxpy-run -n 2 python docs/examples/hello_torch.py

The README's PyTorch example: torch.distributed on the "ucxpy" backend.
"""
import torch
import torch.distributed as dist
import ucxpy.torch  # noqa: F401  (registers the "ucxpy" backend)

dist.init_process_group("ucxpy")        # ranks and wire-up from ucxpy-run, or torchrun's store
t = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(t)
assert t.tolist() == [dist.get_world_size() * (dist.get_world_size() + 1) / 2] * 4
print(f"rank {dist.get_rank()}: {t.tolist()}")
dist.destroy_process_group()

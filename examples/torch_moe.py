"""Expert parallelism on ucxpy: an MoE layer's dispatch and combine by
``all_to_all_single`` with uneven splits (one expert per rank, top-1
routing).  ``torchrun --nproc_per_node=4 examples/torch_moe.py``"""
import torch
import torch.distributed as dist

import ucxpy.torch  # noqa: F401  (registers backend "ucxpy")

dist.init_process_group("ucxpy")
rank, n = dist.get_rank(), dist.get_world_size()
g = torch.Generator().manual_seed(rank)
tokens = torch.randn(100 + 10 * rank, 512, generator=g, dtype=torch.bfloat16)
expert = torch.randint(0, n, (len(tokens),), generator=g)      # the router's choice
order = torch.argsort(expert, stable=True)
send = tokens[order]
send_counts = torch.bincount(expert, minlength=n)
recv_counts = torch.empty_like(send_counts)
dist.all_to_all_single(recv_counts, send_counts)               # how many come to me
recv = send.new_empty(int(recv_counts.sum()), 512)
dist.all_to_all_single(recv, send, recv_counts.tolist(), send_counts.tolist())   # dispatch
out = recv * 2                                                 # this rank's expert
back = torch.empty_like(send)
dist.all_to_all_single(back, out, send_counts.tolist(), recv_counts.tolist())    # combine
assert torch.equal(back, send * 2)
print(f"rank {rank}: sent {send_counts.tolist()}, expert got {len(recv)} tokens, all came back")
dist.destroy_process_group()

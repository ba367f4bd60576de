"""MoE dispatch with all_to_allv: every rank sends a different number of
tokens to every other rank.

    torchrun --nproc-per-node 4 examples/moe_all_to_allv.py

`counts[s][d]` is the number of elements rank s sends to rank d; every rank
passes the whole matrix (all-gather the per-rank rows first, as MoE routers
do). The input is packed by destination, the output by source.
"""

import ferry
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
comm = ferry.Communicator.from_torch()
torch.cuda.set_device(comm.device)
hidden = 1024
g = torch.Generator().manual_seed(comm.rank)
my_row = torch.randint(0, 64, (comm.world,), generator=g)  # tokens for each destination
rows = [torch.empty_like(my_row) for _ in range(comm.world)]
dist.all_gather_object(rows, my_row)
counts = torch.stack(rows) * hidden  # elements

tokens = torch.randn(int(counts[comm.rank].sum()), dtype=torch.bfloat16, device="cuda")
out = comm.alloc((int(counts.sum(0).max()),), torch.bfloat16)  # room for any rank's receive
comm.all_to_allv(out, tokens, counts.tolist())
torch.cuda.current_stream().synchronize()
print(f"rank {comm.rank} received {int(counts[:, comm.rank].sum()) // hidden} tokens")
comm.close()
dist.destroy_process_group()

"""A small all-gather on the critical path: algo="sm" (one SM kernel, not copy
engines) against the default copy-engine path, each captured in a CUDA graph
of 20 calls, checked and timed.

torchrun --nproc-per-node 2 examples/small_on_sms.py
"""

import ferry
import torch

comm = ferry.init()  # rank, world and device from torchrun
rank, world, n = comm.rank, comm.world, 4096
out = comm.alloc((world * n,), torch.uint8)
shard = torch.full((n,), rank, dtype=torch.uint8, device=comm.device)
expected = torch.arange(world, dtype=torch.uint8, device=comm.device).repeat_interleave(n)

for algo in ("auto", "sm"):  # auto: copy engines, no SM; sm: up to 32 blocks of one kernel
    comm.all_gather(out, shard, algo=algo)  # warm-up outside the capture
    comm.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            comm.all_gather(out, shard, algo=algo)
    graph.replay()  # the first replay also uploads the graph: not timed
    out.fill_(0xFF)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    assert torch.equal(out, expected), f"rank {rank}: algo={algo} gave wrong bytes"
    if rank == 0:
        print(
            f"all_gather {n} B per rank on {world} GPUs, algo={algo}: {start.elapsed_time(end) * 50:.1f} us per call"
        )
comm.close()

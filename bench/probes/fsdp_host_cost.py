"""Probe: where the host's time goes in FSDP2 steps with ferry's all-gather
(python/ferry/bench/fsdp.py measured ferry's steps enqueueing slower than
NCCL's when the host sets the pace). Times FSDPAllGather.allocate and
__call__, and the pool's pieces, per all-gather, over a few steps.

    FERRY_HOST_TRACE=1 torchrun --nproc-per-node 2 bench/probes/fsdp_host_cost.py
    PROBE_CPROFILE=1 ...    # rank 0's Python profile of steps 4-8 too
"""

import cProfile
import os
import pstats
import statistics
import time

import ferry.torch
import torch
import torch.distributed as dist
from ferry.bench.fsdp import build
from python_overhead import per_call_us  # the same timing loop as the Python-layer probe
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
comm = ferry.torch.communicator()
dev = torch.device("cuda", local)
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
model, opt = build(torch, fully_shard, mp, 8, 8192, dev, 0)
gather = ferry.torch.use_for_fsdp(model, comm)
spent = {"allocate": [], "call": [], "as_tensor": []}


def timed(name, fn):
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        out = fn(*a, **kw)
        spent[name].append((time.perf_counter() - t0) * 1e6)
        return out

    return wrapper


gather.allocate = timed("allocate", gather.allocate)
orig_call = ferry.torch.FSDPAllGather.__call__
ferry.torch.FSDPAllGather.__call__ = timed("call", orig_call)
ferry.torch.torch.as_tensor = timed("as_tensor", torch.as_tensor)
x = torch.randn(1024, 8192, device=dev)
steps = []
profile = cProfile.Profile() if os.environ.get("PROBE_CPROFILE") and dist.get_rank() == 0 else None
for i in range(8):
    if i == 3:
        for v in spent.values():
            v.clear()
        if profile:
            profile.enable()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model(x).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    steps.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
if profile:
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(30)
if dist.get_rank() == 0:
    print(f"host ms per step (after 3): {[round(s, 2) for s in steps[3:]]}")
    for k, v in spent.items():
        if v:
            print(f"{k:>10}: {len(v)} calls, median {statistics.median(v):.1f} us, max {max(v):.1f} us")
    print(
        f"pool reserved {gather.pool.bytes_reserved >> 20} MiB, in use {gather.pool.bytes_in_use >> 20} MiB"
    )


# The pieces of one all-gather's host path, alone (no FSDP around them).
pool = gather.pool
group = dist.group.WORLD
out = pool.empty((2 * 65536,), torch.bfloat16)
mine = out[local * 65536 : (local + 1) * 65536]
chunk = pool._chunks[0]
pieces = {
    "torch.cuda.current_stream(dev).cuda_stream": lambda: torch.cuda.current_stream(dev).cuda_stream,
    "torch._C._cuda_getCurrentRawStream(i)": lambda: torch._C._cuda_getCurrentRawStream(local),
    "Ranges.allocate + release": lambda: pool._ranges.release(*pool._ranges.allocate(1 << 20, 7)),
    "as_tensor(range) + 2 views": lambda: (
        torch.as_tensor(ferry.torch._DeviceMemory(chunk.data_ptr(), 1 << 20, local), device=dev)
        .view(torch.bfloat16)
        .view((1 << 19,))
    ),
    "chunk[a:b].view(dtype).view(shape)": lambda: (
        chunk[4096 : 4096 + (1 << 20)].view(torch.bfloat16).view((1 << 19,))
    ),
    "pool.empty (and its release)": lambda: pool.empty((1 << 19,), torch.bfloat16),
    "group.size() + group.rank()": lambda: (group.size(), group.rank()),
    "comm.all_gather in place (eager, GPU-bound?)": lambda: comm.all_gather(out, mine),
}
results = {k: per_call_us(f, 500 if "all_gather" in k else 2000) for k, f in pieces.items()}
torch.cuda.synchronize()
if dist.get_rank() == 0:
    for k, v in results.items():
        print(f"{v:8.1f} us  {k}")
gather.pool.close()
comm.close()
dist.destroy_process_group()

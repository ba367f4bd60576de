"""FSDP2 with its parameter all-gathers on ferry's copy engines: the usual
fully_shard setup, one extra line, and a check that training gives the same
loss as with NCCL's all-gather.

torchrun --nproc-per-node 2 examples/fsdp2.py
"""

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic GEMMs: equal runs, equal bits

import ferry.torch
import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
comm = ferry.torch.communicator()  # over the default group


def train(with_ferry: bool) -> list:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).cuda()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    if with_ferry:
        # The extra line. reduce_scatter=True would move the gradients' reduce-scatters
        # to ferry too (copy engines and a small SM reduction kernel; docs/api.md).
        gather = ferry.torch.use_for_fsdp(model, comm)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    x = torch.randn(256, 1024, device="cuda", generator=torch.Generator("cuda").manual_seed(dist.get_rank()))
    for _ in range(3):
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if with_ferry:
        assert gather.calls > 0, "ferry's all-gather did not run"
        gather.pool.close()
    return losses


torch.use_deterministic_algorithms(True)
nccl, ours = train(False), train(True)
assert nccl == ours, f"losses differ: NCCL {nccl}, ferry {ours}"
if dist.get_rank() == 0:
    print(
        f"FSDP2, 3 steps on {dist.get_world_size()} GPUs, all-gathers by ferry: losses {ours} (same as NCCL's)"
    )
comm.close()
dist.destroy_process_group()

"""One process driving every local GPU.

python examples/single_process.py
"""

import ferry
import torch

comm = ferry.init_local()  # all visible GPUs
world, n = comm.world, 4096
outs = comm.alloc((world * n,), torch.uint8)  # one tensor per GPU
ins = [torch.full((world * n,), r, dtype=torch.uint8, device=f"cuda:{r}") for r in range(world)]
comm.all_to_all(outs, ins)  # block j of GPU i's input lands in block i of GPU j's output
comm.synchronize()
for r, o in enumerate(outs):
    assert torch.equal(o.view(world, n)[:, 0].cpu(), torch.arange(world, dtype=torch.uint8)), f"GPU {r}"
print(f"all_to_all over {world} GPUs in one process: ok")
comm.close()

"""All-gather with ferry, checked against the expected data.

torchrun --nproc-per-node 4 examples/all_gather.py
"""

import ferry
import torch

comm = ferry.init()
torch.cuda.set_device(comm.device)
n = 1 << 20
out = comm.alloc((comm.world * n,), torch.bfloat16)
inp = torch.full((n,), float(comm.rank), dtype=torch.bfloat16, device="cuda")
comm.all_gather(out, inp)
torch.cuda.current_stream().synchronize()
expected = torch.arange(comm.world, dtype=torch.bfloat16, device="cuda").repeat_interleave(n)
assert torch.equal(out, expected), "all_gather mismatch"
if comm.rank == 0:
    print(f"all_gather of {n} bf16 per rank over {comm.world} GPUs: ok")
comm.close()

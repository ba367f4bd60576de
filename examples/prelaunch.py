"""Prelaunch: arm an all-gather ahead, let the producer's stream trigger it.

    torchrun --nproc-per-node 4 examples/prelaunch.py

The collective's commands (and its ready handshake with the peers) are
enqueued before the producer runs; a stream memory write right after the
producer releases them, with no kernel and no host round trip. Read
docs/api.md, "Prelaunch", for what an armed collective holds meanwhile.
"""

import ferry
import torch

comm = ferry.init()
torch.cuda.set_device(comm.device)
n = 1 << 16
out = comm.alloc((comm.world * n,), torch.bfloat16)
shard = torch.empty(n, dtype=torch.bfloat16, device="cuda")
torch.manual_seed(0)  # the same weights on every rank: each can check every block
w = torch.randn(1024, 1024, dtype=torch.bfloat16, device="cuda")
producer = torch.cuda.Stream()


def produce(step):
    x = torch.full((1024, 1024), float(step), dtype=torch.bfloat16, device="cuda") @ w
    shard.copy_(x.flatten()[:n])


# A kernel launched for the first time while a collective is armed can wait
# for the device forever (CUDA's lazy loading synchronizes the context, and the
# armed stream waits for its trigger): run the whole producer once first.
with torch.cuda.stream(producer):
    produce(0)
torch.cuda.synchronize()

h = comm.prepare("all_gather", out, shard)
for step in range(10):
    # Enqueued now, behind a trigger word in this GPU's memory, which the
    # producer's stream writes without crossing PCIe (gate="host", the
    # default, would also accept h.trigger() from the host).
    h.arm(gate="device")
    with torch.cuda.stream(producer):
        produce(step)
        h.trigger(producer)  # released once the producer reaches this point
    h.wait()  # the current stream waits for the all-gather
    torch.cuda.current_stream().synchronize()
    assert torch.equal(out, shard.repeat(comm.world)), f"step {step}: all_gather mismatch"
h.release()
if comm.rank == 0:
    print(f"prelaunched all_gather, 10 steps over {comm.world} GPUs, triggered by the producer stream: ok")
comm.close()

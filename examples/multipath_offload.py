"""Large host<->GPU copies over several GPUs' host links at once, and a
model's weights put to sleep in host memory and woken again. One GPU or more
(with one, every copy is a plain copy over its own link, and the result says
why).

python examples/multipath_offload.py
"""

import ferry
import ferry.kv as kv
import torch

# One 512 MiB copy into GPU 0, split over GPU 0's own link and relays through
# its peers (NVLink), in the current stream's order like cudaMemcpyAsync.
n = 512 << 20
host = kv.pinned_empty((n,), torch.uint8)  # pinned: pageable memory goes as one plain copy
host.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8))
gpu = torch.empty(n, dtype=torch.uint8, device="cuda:0")
ran = ferry.multipath_copy(gpu, host)
done = torch.cuda.Event(enable_timing=True)
start = torch.cuda.Event(enable_timing=True)
start.record()
ferry.multipath_copy(gpu, host)
done.record()
done.synchronize()
assert torch.equal(gpu[-4096:].cpu(), host[-4096:]) and torch.equal(gpu[:4096].cpu(), host[:4096])
how = f"over {ran['links']} links" if ran["multipath"] else f"as one plain copy ({ran['reason']})"
print(f"512 MiB host -> GPU {how}: {n / start.elapsed_time(done) / 1e6:.1f} GB/s")

# Sleep and wake: every CUDA parameter and buffer to pinned host memory (one
# batched multipath copy), the GPU memory freed, then back into the same
# Parameter objects.
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(16)]).to("cuda:0", torch.bfloat16)
before = [p.detach().clone() for p in model.parameters()]
held = torch.cuda.memory_allocated()
state = ferry.offload.sleep(model)
freed = held - torch.cuda.memory_allocated()
print(f"asleep: {state.nbytes >> 20} MiB of weights in host memory, {freed >> 20} MiB of GPU memory freed")
state.wake()
assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before)), "weights differ after wake"
x = torch.randn(8, 4096, device="cuda:0", dtype=torch.bfloat16)
print(f"awake: the model runs again, output {tuple(model(x).shape)}: ok")

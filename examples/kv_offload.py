"""A paged KV cache saved to host memory and fetched back on a prefix-cache
hit, as a serving engine does, on the copy engines. One GPU.

python examples/kv_offload.py

The GPU cache is one tensor that each attention layer reads through its own
view ([2, num_blocks, block_size, heads, head_dim], vLLM's per-layer shape).
The host cache is a page-first pinned pool ([host_pages, 2 x layers, ...]):
a page's 2 x layers tensors lie end to end there, so each page moves as one
pitched copy instead of one copy per layer and K/V (docs/kv.md, "Which mode
to use when"). Each side is a kv.Pages, read and checked once, so that the
calls read nothing of its 2 x layers tensors.
"""

import ferry.kv as kv
import torch

layers, num_blocks, block_size, heads, head_dim = 8, 256, 16, 8, 128
host_pages, dtype = 1024, torch.bfloat16
page = (block_size, heads, head_dim)

gpu = torch.randn((layers, 2, num_blocks, *page), dtype=dtype, device="cuda")
kv_caches = [gpu[layer] for layer in range(layers)]  # what layer l's attention reads and writes
# ferry's view: one tensor per layer and K/V, read and checked once here.
gpu_side = kv.Pages(list(gpu.view(2 * layers, num_blocks, *page)))

pool = kv.HostPool(host_pages * 2 * layers * block_size * heads * head_dim * dtype.itemsize)
host = pool.tensor((host_pages, 2 * layers, *page), dtype)  # pinned, on the GPU's NUMA node
host_side = kv.Pages([host[:, i] for i in range(2 * layers)])

# A finished request's blocks go to free host pages. zero_sm=True: copy
# engines only, no kernel, so the model's kernels keep every SM.
blocks, slots = [17, 3, 200, 42, 43, 44, 128], [900, 901, 12, 5, 6, 7, 640]
saved = kv.copy_blocks(host_side, gpu_side, dst_ids=slots, src_ids=blocks, zero_sm=True)
expected = gpu[:, :, blocks].clone()  # [layers, 2, pages, ...], ordered after the save on this stream
torch.cuda.current_stream().synchronize()
for j, s in enumerate(slots):
    assert torch.equal(host[s].cuda(), expected[:, :, j].reshape(2 * layers, *page)), f"host page {s}"
print(
    f"saved {len(blocks)} blocks ({saved['bytes']} bytes): {saved['strategy']}, "
    f"{saved['copies']} copies ({saved['pitched']} pitched), {saved['sms']} SMs"
)

# The blocks are reused by other requests meanwhile.
gpu[:, :, blocks] = 0

# A later request hits the saved prefix. Its fetch is planned and enqueued
# ahead, behind a gate, while the scheduler still works; when the step needs
# the pages, the gate opens in the stream's order and only the copies remain.
new_blocks = [9, 10, 11, 60, 61, 62, 63]
fetch = kv.prepare(gpu_side, host_side, dst_ids=new_blocks, src_ids=slots)
fetch.arm()  # enqueued now, after the current stream's work
# ... the scheduler, the previous step's sampling ...
fetch.trigger_on(torch.cuda.current_stream())  # or fetch.trigger() from the host, or a kernel's store
fetch.wait()  # work queued on the current stream from here on sees the pages
assert torch.equal(gpu[:, :, new_blocks], expected), "fetched pages differ"
print(f"fetched {fetch.copies} copies prepared ahead, {fetch.nbytes} bytes: ok")

# A small fetch on the critical path: mode="auto" picks by this GPU's table
# (a copy kernel for small pages when SMs may be used); index lists may be
# CPU tensors, read in place.
ids = torch.tensor([100, 101], dtype=torch.int64)
ran = kv.copy_blocks(gpu_side, host_side, dst_ids=ids, src_ids=torch.tensor([900, 901]))
torch.cuda.current_stream().synchronize()
assert torch.equal(gpu[:, :, [100, 101]], expected[:, :, :2]), "small fetch differs"
print(f"small fetch with mode='auto': {ran['strategy']}, {ran['sms']} SMs: ok")

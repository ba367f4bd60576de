"""LD_PRELOAD=libferry_preload.so under an unmodified PyTorch program: pinned
host<->GPU copies from the threshold up go through the multipath engine
(FERRY_DEBUG says so once), every byte arrives and stream order holds; small
copies go to the CUDA runtime, pageable ones run as one plain copy."""

import os
import subprocess
import sys

try:
    import torch
except ImportError:  # CPU-only machines: the tests are collected, and skipped (and counted) by conftest
    torch = None
import ferry.multipath as mp  # noqa: E402
import pytest  # noqa: E402

PROGRAM = r"""
import torch
MiB = 1 << 20
g = torch.Generator().manual_seed(0)
n = 64 * MiB + 3
src = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).pin_memory()
torch.cuda.synchronize()
a = src.to("cuda")                            # cudaMemcpyAsync + synchronize: through the engine
b = torch.empty(n, dtype=torch.uint8, device="cuda")
b.copy_(src, non_blocking=True)               # stream-ordered
c = (b.to(torch.int16) + 1).to(torch.uint8)   # a kernel after it sees all of it
back = torch.empty(n, dtype=torch.uint8).pin_memory()
back.copy_(c, non_blocking=True)              # GPU -> pinned host
torch.cuda.synchronize()
assert torch.equal(a.cpu(), src), "to(cuda)"
assert torch.equal(back, (src.to(torch.int16) + 1).to(torch.uint8)), "copy_ both ways"
small = torch.arange(1000, dtype=torch.float32).pin_memory().to("cuda")   # below the threshold
pageable = torch.ones(16 * MiB, dtype=torch.uint8).to("cuda")             # pageable: one plain copy
assert small.sum().item() == 499500.0 and int(pageable.sum().item()) == 16 * MiB
print("preload: ok")
"""


# A kernel launched before the program's first large copy.
KERNEL_FIRST = "import torch\ntorch.ones(1, device='cuda')\ntorch.cuda.synchronize()\n"

# With the engine scheduling the own link's chunks (the library's default
# changed by hand), a kernel's first launch after a copy can hold those chunks
# behind the stream the copy holds (docs/multipath.md, "Hazards"): a race, so
# a pass proves nothing.
OWN_LINK_SCHEDULED = pytest.mark.xfail(
    strict=False,
    reason="known hazard (docs/multipath.md, 'Hazards'): the own link's chunks, submitted after the copy "
    "returned, held behind the copy's own stream by a kernel's first launch",
)


@pytest.mark.parametrize(
    "first,queues,own_share",
    [
        pytest.param("", None, None, id="copy-first"),
        pytest.param(KERNEL_FIRST, None, None, id="kernel-first"),
        pytest.param("", "32", None, id="copy-first-32-queues"),
        pytest.param("", None, "0", id="copy-first-own-link-scheduled", marks=OWN_LINK_SCHEDULED),
    ],
)
def test_unmodified_torch_program_under_ld_preload(first, queues, own_share):
    lib = mp.preload_library()
    env = dict(os.environ, LD_PRELOAD=lib, FERRY_DEBUG="1", CUDA_MODULE_LOADING="EAGER", FERRY_TIMEOUT_S="10")
    env.pop("FERRY_MULTIPATH_OWN_SHARE_ON_STREAM", None)
    if queues:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = queues
    if own_share is not None:
        env["FERRY_MULTIPATH_OWN_SHARE_ON_STREAM"] = own_share
    run = subprocess.run(
        [sys.executable, "-c", first + PROGRAM], env=env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "preload: ok" in run.stdout
    assert "routing host<->GPU copies through the multipath engine" in run.stderr, run.stderr[-3000:]
    if torch.cuda.device_count() < 2:  # no peer can relay: the engine says so and copies plainly
        assert "no peer GPU may relay" in run.stderr, run.stderr[-3000:]
    elif own_share is None:  # the library's default: the caller's stream took the own link's share
        assert "the caller's stream (head)" in run.stderr, run.stderr[-3000:]

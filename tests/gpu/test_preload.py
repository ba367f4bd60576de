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


# A kernel launched before the program's first large copy: the defect shows
# with it too, so both cases stay expected failures.
KERNEL_FIRST = "import torch\ntorch.ones(1, device='cuda')\ntorch.cuda.synchronize()\n"

DEFECT = pytest.mark.xfail(
    strict=False,
    reason="open defect (docs/multipath.md, 'Known problems'): under the preload library the second copy's chunks "
    "on the target's own link sometimes never land while the relays' do, whether or not a kernel ran first",
)


# With 32 hardware queues per GPU (CUDA_DEVICE_MAX_CONNECTIONS) the probe's
# case nearest the defect passed where 8 and 1 failed (docs/multipath.md): an
# expected failure too until runs of this program say otherwise (XPASS).
QUEUES_32 = pytest.mark.xfail(strict=False, reason="open defect; 32 hardware queues passed once in a probe")


@pytest.mark.parametrize(
    "first,queues",
    [
        pytest.param("", None, id="copy-first", marks=DEFECT),
        pytest.param(KERNEL_FIRST, None, id="kernel-first", marks=DEFECT),
        pytest.param("", "32", id="copy-first-32-queues", marks=QUEUES_32),
    ],
)
def test_unmodified_torch_program_under_ld_preload(first, queues):
    lib = mp.preload_library()
    env = dict(os.environ, LD_PRELOAD=lib, FERRY_DEBUG="1", CUDA_MODULE_LOADING="EAGER", FERRY_TIMEOUT_S="10")
    if queues:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = queues
    run = subprocess.run(
        [sys.executable, "-c", first + PROGRAM], env=env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "preload: ok" in run.stdout
    assert "routing host<->GPU copies through the multipath engine" in run.stderr, run.stderr[-3000:]

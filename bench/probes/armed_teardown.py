"""Which teardowns wait for an armed gate's trigger?

A prepared transfer armed on a stream of its own holds that stream on a
gate until it is triggered. Freeing device or pinned memory is documented
to synchronize with the device; if it waits for the held stream, a program
that frees memory before it triggers never gets to the trigger. Each case
runs in a process of its own: arm a prepared KV fetch on a side stream,
run the case, then trigger the fetch and check its pages. A case that has
not returned within `--limit` seconds is reported as held.

    python bench/probes/armed_teardown.py [--limit 20] [--cases a,b]
"""

import argparse
import os
import subprocess
import sys
import time

PRELUDE = r"""
import gc, sys, time, torch, ferry, ferry.kv as kv
host = kv.pinned_empty((64, 4096), torch.uint8)
host.copy_(torch.randint(0, 256, (64, 4096), dtype=torch.uint8))
gpu = torch.full((64, 4096), 0xA5, dtype=torch.uint8, device="cuda")
side = torch.cuda.Stream()
torch.cuda.synchronize()
armed = kv.prepare(gpu, host, list(range(8)), list(range(30, 38)))
armed.arm(side)
print("armed", flush=True)
t0 = time.perf_counter()
"""

EPILOGUE = r"""
print(f"case returned in {(time.perf_counter() - t0) * 1e3:.1f} ms", flush=True)
armed.trigger()
armed.synchronize(timeout=10)
assert torch.equal(gpu[0:8].cpu(), host[30:38]), "pages differ"
print("ok", flush=True)
"""

CASES = {
    # cudaHostAlloc'd pool (under 64 MiB): cudaFreeHost on close.
    "pool_small_close": "p = kv.HostPool(1 << 20)\np.close()",
    # mmap + cudaHostRegister pool: cudaHostUnregister when its last tensor goes.
    "pool_large_drop": "p = kv.HostPool(128 << 20)\nt = p.tensor((1024,), torch.uint8)\ndel t, p\ngc.collect()",
    # torch's caching allocator hands its blocks back with cudaFree.
    "torch_empty_cache": "x = torch.empty(64 << 20, dtype=torch.uint8, device='cuda')\ndel x\ntorch.cuda.empty_cache()",
    # A new allocation only (cudaMalloc), nothing freed.
    "torch_malloc": "x = torch.empty(256 << 20, dtype=torch.uint8, device='cuda')\nx.fill_(1)",
    # cudaHostAlloc and cudaMallocHost-backed pinned tensors, nothing freed.
    "pinned_alloc": "p = kv.HostPool(1 << 20)\nq = kv.HostPool(128 << 20)\nx = torch.empty(1 << 20, pin_memory=True)",
    "multipath_close": (
        "import ferry.multipath as mp\n"
        "e = mp.Engine(devices=[0], loopback=2, chunk_bytes=1 << 20, min_bytes=2 << 20)\n"
        "w = kv.pinned_empty((8 << 20,), torch.uint8)\n"
        "g = torch.empty(8 << 20, dtype=torch.uint8, device='cuda')\n"
        "e.copy(g, w)\ne.synchronize()\ne.close()"
    ),
    # Both made after the arming, where making one is now refused (setting one
    # up waits for every stream); closing ones made before is in
    # tests/gpu/test_kv.py (test_teardowns_while_a_transfer_is_armed).
    "communicator_close": "c = ferry.init_local([0])\nc.close()",
    "heap_close": (
        "c = ferry.init_local([0])\nh = ferry.symm.Heap(c, capacity=256 << 20)\n"
        "x = h.empty((1 << 20,), torch.uint8)\ndel x\nh.close()\nc.close()"
    ),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=20.0)
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args()
    env = dict(
        os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1"
    )
    print(f"armed_teardown: a prepared fetch armed on a side stream, then each case; limit {a.limit:.0f} s")
    for name in a.cases.split(","):
        # Each line announced before it runs: a held case names the line that waits.
        steps = "".join(
            f"print('step: ' + {line!r}, flush=True)\n{line}\n" for line in CASES[name].split("\n")
        )
        src = PRELUDE + steps + EPILOGUE
        t = time.perf_counter()
        try:
            run = subprocess.run(
                [sys.executable, "-c", src], env=env, capture_output=True, text=True, timeout=a.limit
            )
            out = run.stdout.strip().splitlines()
            verdict = (
                "ok" if run.returncode == 0 and out and out[-1] == "ok" else f"failed (rc {run.returncode})"
            )
            detail = next((line for line in out if line.startswith("case returned")), "")
            if verdict != "ok":  # the error's own line, not what the interpreter says at exit
                errors = [
                    line for line in run.stderr.splitlines() if "Error" in line and "nanobind" not in line
                ]
                detail += " | " + (errors[-1] if errors else run.stderr.strip()[-600:].replace("\n", " | "))
        except subprocess.TimeoutExpired as e:
            got = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            verdict = "HELD"
            detail = f"no return within {a.limit:.0f} s; got to: {got.strip().splitlines()[-1:]}"
        print(f"{name:20s} {verdict:6s} {time.perf_counter() - t:6.1f} s  {detail}", flush=True)


if __name__ == "__main__":
    main()

"""Probe: what index lists in GPU memory cost the kernel mode per call.

    python bench/probes/kv_gpu_lists_cost.py [--calls 200] [--rounds 5]

Fetches scattered pages of a ferry HostPool into a GPU buffer with
mode="kernel", the index lists as CUDA tensors (read in place: checked by the
kernel, and by a pass before the copy for repeated destinations, in a tree
that has that pass) and as CPU int64 tensors (checked on the host), and
prints per point the GPU time per call (CUDA events around `calls` calls back
to back, median of `rounds`) and the host time per call. Run it with two trees
(PYTHONPATH) to compare them. Nothing here is checked: the KV tests check the bytes.
"""

import argparse
import random
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--points", default="64x4096,256x16384,1024x16384,4096x4096")
    args = ap.parse_args()
    import ferry
    import ferry.kv as kv
    import torch

    print(f"ferry from {ferry.__file__}")
    for point in args.points.split(","):
        pages, page = (int(x) for x in point.split("x"))
        total = 4 * pages
        pool = kv.HostPool(total * page)
        host = pool.tensor((total, page), torch.uint8)
        gpu = torch.empty((total, page), dtype=torch.uint8, device="cuda")
        rng = random.Random(pages)
        dst = rng.sample(range(total), pages)
        src = rng.sample(range(total), pages)
        lists = {
            "gpu lists": (torch.tensor(dst, device="cuda"), torch.tensor(src, device="cuda")),
            "cpu lists": (torch.tensor(dst), torch.tensor(src)),
        }
        for name, (d, s) in lists.items():
            for _ in range(10):
                kv.copy_blocks(gpu, host, d, s, mode="kernel")
            torch.cuda.synchronize()
            gpu_us, host_us = [], []
            for _ in range(args.rounds):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    kv.copy_blocks(gpu, host, d, s, mode="kernel")
                host_us.append((time.perf_counter() - t0) / args.calls * 1e6)
                b.record()
                torch.cuda.synchronize()
                gpu_us.append(a.elapsed_time(b) * 1e3 / args.calls)
            print(
                f"{pages:5d} x {page:6d} B  {name}: {statistics.median(gpu_us):8.2f} us a call on the GPU"
                f" ({min(gpu_us):.2f}-{max(gpu_us):.2f}), host {statistics.median(host_us):7.2f} us",
                flush=True,
            )
        del host, gpu
        pool.close()


if __name__ == "__main__":
    main()

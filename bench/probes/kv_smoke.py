"""One copy per mode and direction with torch's own pinned memory, then with a
ferry HostPool: the quickest look at whether ferry.kv moves bytes on a GPU.

    python bench/probes/kv_smoke.py
"""

import sys

import ferry.kv as kv
import torch


def main() -> int:
    host = torch.randint(0, 256, (64, 4096), dtype=torch.uint8).pin_memory()
    gpu = torch.zeros((64, 4096), dtype=torch.uint8, device="cuda")
    bad = 0
    for mode in kv.MODES:
        for direction in ("h2d", "d2h"):
            gpu.fill_(0) if direction == "h2d" else None
            dst, src = (gpu, host) if direction == "h2d" else (host, gpu)
            rep = kv.copy_blocks(dst, src, [3, 9, 10], [1, 2, 3], mode=mode)
            torch.cuda.synchronize()
            ok = torch.equal(dst[[3, 9, 10]].cpu(), src[[1, 2, 3]].cpu())
            bad += not ok
            print(mode, direction, rep, "ok" if ok else "WRONG", flush=True)
    pool = kv.HostPool(1 << 20)
    print("pool", pool.backing, pool.numa_node, pool.huge_pages, flush=True)
    t = pool.tensor((16, 4096), torch.uint8)
    t.copy_(host[:16])
    kv.copy_blocks(gpu, t, [0], [5])
    torch.cuda.synchronize()
    bad += not torch.equal(gpu[0].cpu(), host[5])
    print("pool copy", "ok" if not bad else "WRONG", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

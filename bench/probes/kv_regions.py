"""Copy-engine page transfers with many tensors per side: the cost per copy.

    python bench/probes/kv_regions.py [--pages 2048] [--page-bytes 32768] [--regions 1,8,64] [--modes batched]
                                      [--streams own,default] [--pool-pages N,...] [--huge-pages auto,off]
    python bench/probes/kv_regions.py --regions 1 --pages 4096 --pool-pages 4096,65536 --huge-pages auto,off

Batched copies cannot be submitted on torch's default stream, the legacy
one, so there each page would go as a copy of its own (the end-to-end
benchmark's Llama-3.1-8B fetch, 131,072 copies of 32 KB, copies there);
ferry runs its copy-engine strategies there on a stream of its own, joined
by events. --streams compares the two streams.
--pool-pages and --huge-pages ask whether the host pool's size and its
pages change the cost of a copy: each region's host tensor holds that many
pages (the ids drawn from all of them), from a HostPool with huge pages
where the system allows (auto) or without (off); its backing is printed.
This times one host-to-GPU copy_blocks call per case with the
same random page ids in every tensor, as the end-to-end benchmark makes
them (CPU int64 tensors), and prints the host time of the call, the GPU
time from before the call to after it (CUDA events on the stream), and
both per copy; median of --reps after a warm-up. Every destination page of
the last call is checked against its source.
"""

import argparse
import random
import statistics
import time

import ferry.kv as kv
import torch


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--pages", type=int, default=2048)
    p.add_argument("--page-bytes", type=int, default=32768)
    p.add_argument("--regions", default="1,8,64")
    p.add_argument("--modes", default="batched")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--streams", default="own,default", help="a stream of the probe's, torch's default stream")
    p.add_argument("--pool-pages", default="", help="host pages per region (default: --pages)")
    p.add_argument("--huge-pages", default="auto", help="auto (where available) and/or off")
    p.add_argument("--max-pool-gib", type=float, default=16, help="refuse cases whose host pool is larger")
    args = p.parse_args()
    n, pb = args.pages, args.page_bytes
    rng = random.Random(1)
    own = torch.cuda.Stream()
    pools = [int(x) for x in args.pool_pages.split(",") if x] or [n]
    cases = [(r, pp, hp) for r in (int(x) for x in args.regions.split(",")) for pp in pools
             for hp in args.huge_pages.split(",")]  # fmt: skip
    for regions, pool_pages, huge in cases:
        if pool_pages < n:
            raise SystemExit(f"--pool-pages {pool_pages}: at least --pages ({n})")
        if huge not in ("auto", "off"):
            raise SystemExit(f"--huge-pages {huge}: expected auto or off")
        if regions * pool_pages * pb > args.max_pool_gib * 2**30:
            print(f"regions {regions} x {pool_pages} pages: pool over --max-pool-gib, skipped", flush=True)
            continue
        pool = kv.HostPool(regions * pool_pages * pb, huge_pages=None if huge == "auto" else False)
        whole = pool.tensor((regions, pool_pages, pb), torch.uint8)
        host = [whole[r] for r in range(regions)]
        for h in host:
            h.copy_(torch.randint(0, 256, (pool_pages, pb), dtype=torch.uint8))
        gpu = [torch.empty((n, pb), dtype=torch.uint8, device="cuda") for _ in range(regions)]
        src_ids = torch.tensor(rng.sample(range(pool_pages), n), dtype=torch.int64)
        dst_ids = torch.tensor(rng.sample(range(n), n), dtype=torch.int64)
        where_pool = (
            f"pool {regions * pool_pages * pb >> 20} MiB ({pool.backing}, huge pages {pool.huge_pages})"
        )
        for mode, where in ((m, w) for m in args.modes.split(",") for w in args.streams.split(",")):
            s = own if where == "own" else torch.cuda.default_stream()
            host_s, gpu_ms = [], []
            for rep in range(args.reps + 1):
                if rep == args.reps:  # the last call lands on poison: the check below is of it alone
                    for g in gpu:
                        g.fill_(0xA5)
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                a.record(s)
                t0 = time.perf_counter()
                rep_info = kv.copy_blocks(gpu, host, dst_ids, src_ids, stream=s, mode=mode)
                t1 = time.perf_counter()
                b.record(s)
                b.synchronize()
                if rep:
                    host_s.append(t1 - t0)
                    gpu_ms.append(a.elapsed_time(b))
            bad = sum(int((g[dst_ids] != h[src_ids].cuda()).any(dim=1).sum()) for g, h in zip(gpu, host))
            h, g = statistics.median(host_s) * 1e6, statistics.median(gpu_ms) * 1e3
            copies = rep_info["copies"]
            print(
                f"regions {regions:3d} x {n} pages of {pb} B, {where_pool}, {mode} ({rep_info['strategy']}), {where} stream: "
                f"{copies} copies, host {h:9.0f} us ({h / copies:.2f} a copy), "
                f"GPU {g:9.0f} us ({g / copies:.2f} a copy, {copies * pb / g / 1e3:.1f} GB/s), {bad} pages wrong",
                flush=True,
            )
        del host, gpu, whole
        pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

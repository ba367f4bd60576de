"""Prepared (submitted-ahead) page transfers split over several streams: do
more streams move small pages faster once the gate opens?

    CUDA_DEVICE_MAX_CONNECTIONS=32 python bench/probes/kv_ahead_split.py [--pages 16K,64K] [--counts 1024,4096] [--parts 1,2,4] [--reps 7]

Many parts arm many streams; with more armed streams than CUDA's hardware
queues (8 by default) a trigger can queue behind an armed stream and wait
for itself, hence the larger setting.

A prepared transfer runs its copies on a stream of its own behind a gate.
Here the pages are split into `parts` prepared transfers (each its own
stream), all armed, then all opened in the main stream's order (a stream
write each, no kernel); the main stream waits for all of them. Fetch
(host to GPU), save (GPU to host) and both at once (on two main streams).
Time: CUDA events from before the triggers to after the waits; median of
--reps after a warm-up. The host pages are a random sample of twice as many
pages, the GPU pages another; every destination page of the last run is
compared with its source.
"""

import argparse
import random
import statistics

import ferry.kv as kv
import torch
from ferry.bench.report import parse_size


def split(ids, parts):
    n = len(ids)
    return [ids[i * n // parts : (i + 1) * n // parts] for i in range(parts)]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--pages", default="16K,64K")
    p.add_argument("--counts", default="1024,4096")
    p.add_argument("--parts", default="1,2,4")
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    sizes = [parse_size(x) for x in a.pages.split(",")]
    counts = [int(x) for x in a.counts.split(",")]
    parts_list = [int(x) for x in a.parts.split(",")]
    main_s, other_s = torch.cuda.Stream(), torch.cuda.Stream()
    bad = 0
    for size in sizes:
        for count in counts:
            pool = 2 * count
            elems = size // 2
            host = kv.pinned_empty((pool, elems), torch.bfloat16)
            host.copy_(torch.randn(pool, elems, dtype=torch.bfloat16))
            gpu = torch.randn((pool, elems), dtype=torch.bfloat16, device="cuda")
            host_out = kv.pinned_empty((pool, elems), torch.bfloat16)
            gpu_in = torch.empty((pool, elems), dtype=torch.bfloat16, device="cuda")
            rng = random.Random(size + count)
            f_dst, f_src = rng.sample(range(pool), count), rng.sample(range(pool), count)
            s_dst, s_src = rng.sample(range(pool), count), rng.sample(range(pool), count)
            for op in ("fetch", "save", "both"):
                for parts in parts_list:
                    sides = []
                    if op in ("fetch", "both"):
                        sides.append((gpu_in, host, f_dst, f_src, main_s))
                    if op in ("save", "both"):
                        sides.append((host_out, gpu, s_dst, s_src, other_s if op == "both" else main_s))
                    prepared = [
                        [
                            (kv.prepare(dst, src, dd, ss), st)
                            for dd, ss in zip(split(d, parts), split(s, parts))
                        ]
                        for dst, src, d, s, st in sides
                    ]
                    times = []
                    for r in range(1 + a.reps):
                        for t in (gpu_in, host_out):
                            t.fill_(float("nan"))
                        torch.cuda.synchronize()
                        for side in prepared:
                            for t, _ in side:
                                t.arm(torch.cuda.current_stream())
                        start, end = (
                            torch.cuda.Event(enable_timing=True),
                            torch.cuda.Event(enable_timing=True),
                        )
                        start.record(main_s)
                        other_s.wait_event(start)
                        for side in prepared:
                            for t, st in side:
                                t.trigger_on(st)
                            for t, st in side:
                                t.wait(st)
                        main_s.wait_stream(other_s)
                        end.record(main_s)
                        end.synchronize()
                        if r:
                            times.append(start.elapsed_time(end) * 1e3)
                    for dst, src, d, s, _ in sides:
                        got = dst[torch.tensor(d)].cpu() if dst.is_cuda else dst[torch.tensor(d)]
                        ref = src[torch.tensor(s)].cpu() if src.is_cuda else src[torch.tensor(s)]
                        wrong = int((got.view(torch.int16) != ref.view(torch.int16)).any(dim=1).sum())
                        bad += wrong
                    us = statistics.median(times)
                    moved = size * count * len(sides)
                    print(
                        f"{op:<5} {size >> 10:>4} KB x {count:>5} pages, {parts} part(s): {us:9.1f} us, "
                        f"{moved / us / 1e3:6.1f} GB/s  (samples {min(times):.0f}-{max(times):.0f} us)",
                        flush=True,
                    )
    print(f"pages wrong: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

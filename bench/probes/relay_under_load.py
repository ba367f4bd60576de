"""How fast does a relay into GPU 0 go while foreign copies load GPU 0's link?

Foreign: host -> GPU 0 copies of 256 MB queued on one stream, kept 8 deep.
Measured alone and beside them, GB/s (median of 3):
- hop 1: 256 MB host -> GPU 1 (GPU 1's link);
- hop 2: 256 MB GPU 1 -> GPU 0 on GPU 1's stream (NVLink);
- relay: 256 MB host -> GPU 1 -> GPU 0 in 8 MB chunks, two streams on GPU 1
  (the engine's pipeline, by hand);
- own: 256 MB host -> GPU 0 on another stream (behind the queue).

    python bench/probes/relay_under_load.py
"""

import statistics
import time

import torch
from ferry.bench.multipath import Runtime

MiB = 1 << 20


def main():
    n = 256 * MiB
    chunk = 8 * MiB
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    g0 = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    g1 = torch.empty(n, dtype=torch.uint8, device="cuda:1")
    stage = [torch.empty(chunk, dtype=torch.uint8, device="cuda:1") for _ in range(2)]
    f_host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    f_dev = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    f = torch.cuda.Stream(0)
    a1, b1, s0 = torch.cuda.Stream(1), torch.cuda.Stream(1), torch.cuda.Stream(0)
    ev = [torch.cuda.Event() for _ in range(2)]
    free = [torch.cuda.Event() for _ in range(2)]

    def hop1():
        with torch.cuda.stream(a1):
            g1.copy_(host, non_blocking=True)

    rt = Runtime()
    rt.enable_peer_access([0, 1])
    peer = rt.copy  # exactly one cudaMemcpyAsync on GPU 1's stream (no fences)

    def hop2():
        peer(g0.data_ptr(), g1.data_ptr(), n, a1)

    def relay():
        for i in range(n // chunk):
            k = i % 2
            a1.wait_event(free[k])
            with torch.cuda.stream(a1):
                stage[k].copy_(host[i * chunk : (i + 1) * chunk], non_blocking=True)
                ev[k].record(a1)
            b1.wait_event(ev[k])
            peer(g0.data_ptr() + i * chunk, stage[k].data_ptr(), chunk, b1)
            free[k].record(b1)

    def own():
        with torch.cuda.stream(s0):
            g0.copy_(host, non_blocking=True)

    def rate(fn, loaded):
        out = []
        for _ in range(4):
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
            if loaded:
                with torch.cuda.stream(f):
                    for _ in range(8):
                        f_dev.copy_(f_host, non_blocking=True)
                time.sleep(0.01)
            t = time.perf_counter()
            fn()
            for d in (0, 1):
                torch.cuda.current_stream(d).synchronize()
            a1.synchronize()
            b1.synchronize()
            s0.synchronize()
            out.append(n / (time.perf_counter() - t) / 1e9)
        torch.cuda.synchronize(0)
        return statistics.median(out[1:])

    for name, fn in (
        ("hop 1 (host -> GPU 1)", hop1),
        ("hop 2 (GPU 1 -> GPU 0)", hop2),
        ("relay", relay),
        ("own", own),
    ):
        print(
            f"  {name:24s} alone {rate(fn, False):6.1f} GB/s   beside 8 x 256 MB into GPU 0 {rate(fn, True):6.1f} GB/s"
        )


if __name__ == "__main__":
    main()

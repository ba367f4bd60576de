"""How many copies a prepared page transfer can hold behind its gate before
enqueueing them blocks the host (the stream's queue is finite): arms
transfers of growing size with a timer thread that opens the gate after 3 s,
and reports the arms that only returned once the gate opened.

    FERRY_KV_ARMED_MAX=100000 python bench/probes/kv_armed.py
"""

import random
import sys
import threading
import time

import ferry.kv as kv
import torch


def main() -> int:
    pages = 16384
    host = kv.pinned_empty((2 * pages, 4096), torch.uint8)
    gpu = torch.empty((2 * pages, 4096), dtype=torch.uint8, device="cuda")
    for n in (256, 512, 1024, 2048, 4096, 8192, 16384):
        rng = random.Random(n)
        t = kv.prepare(gpu, host, rng.sample(range(2 * pages), n), rng.sample(range(2 * pages), n))
        torch.cuda.synchronize()
        timer = threading.Timer(3.0, t.trigger)
        timer.start()
        t0 = time.perf_counter()
        t.arm()
        armed_s = time.perf_counter() - t0
        blocked = armed_s > 2.5
        if not blocked:
            timer.cancel()
            t.trigger()
        else:
            timer.join()
        t.synchronize(30)
        print(
            f"armed {n:>6} copies ({t.copies} after merging): arm took {1e3 * armed_s:8.1f} ms"
            f"{'  BLOCKED until the gate opened' if blocked else ''}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How many copies a prepared page transfer can hold behind its gate before
enqueueing them blocks the host (the stream's queue is finite): arms
transfers of growing size with a timer thread that opens the gate after 3 s,
and reports the arms that only returned once the gate opened. Cases: plain
copies of one tensor's 4 KB pages, batched and one call per copy
(per_page); pitched copies (a page-first host pool of `rows` tensors, one
cudaMemcpy2DAsync per page of `rows` rows).

    FERRY_KV_ARMED_MAX=1000000 python bench/probes/kv_armed.py [--quick]
"""

import random
import sys
import threading
import time

import ferry.kv as kv
import torch


def arm_and_time(t) -> tuple:
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
    return armed_s, blocked


def report(what: str, calls: str, armed_s: float, blocked: bool) -> None:
    print(
        f"{what:<44} {calls:<28} arm took {1e3 * armed_s:8.1f} ms{'  BLOCKED until the gate opened' if blocked else ''}",
        flush=True,
    )


def main() -> int:
    quick = "--quick" in sys.argv
    pages = 16384
    host = kv.pinned_empty((2 * pages, 4096), torch.uint8)
    gpu = torch.empty((2 * pages, 4096), dtype=torch.uint8, device="cuda")
    plain = (1024, 4096, 16384) if quick else (256, 512, 1024, 2048, 4096, 8192, 16384)
    for mode in ("batched", "per_page"):
        for n in plain:
            rng = random.Random(n)
            t = kv.prepare(
                gpu, host, rng.sample(range(2 * pages), n), rng.sample(range(2 * pages), n), mode=mode
            )
            armed_s, blocked = arm_and_time(t)
            report(f"{mode}: {n} copies of 4 KB", f"({t.copies} after merging)", armed_s, blocked)
    del host, gpu
    for rows, counts in ((48, (256, 341, 512, 683, 1024)), (8, (1024, 2048)), (3, (2048, 5000))):
        space = 2 * max(counts)
        h = kv.pinned_empty((space, rows, 4096), torch.uint8)
        g = torch.empty((rows, space, 4096), dtype=torch.uint8, device="cuda")
        host_tensors, gpu_tensors = [h[:, i] for i in range(rows)], list(g)
        for n in counts:
            rng = random.Random(n)
            t = kv.prepare(
                gpu_tensors, host_tensors, rng.sample(range(space), n), rng.sample(range(space), n)
            )
            armed_s, blocked = arm_and_time(t)
            report(
                f"pitched: {n} pages x {rows} rows of 4 KB",
                f"({n * rows} rows, {t.copies} calls)",
                armed_s,
                blocked,
            )
        del h, g, host_tensors, gpu_tensors
    return 0


if __name__ == "__main__":
    sys.exit(main())

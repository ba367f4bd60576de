"""What keeping the links warm costs while no copy runs.

    FERRY_MULTIPATH_KEEP_WARM_MS=50 python bench/probes/keep_warm_cost.py [--idle-ms 40] [--rounds 5]

An engine over every visible GPU (GPU 0 with a loopback relay where there is
one GPU) makes one 8 MiB copy into GPU 0 and one back, then the process
sleeps `--idle-ms`: the process's CPU time over that sleep is the engine's
thread (the caller sleeps), and its probes are what the links copy
meanwhile. Printed per round: CPU ms per idle ms, with the knob as set in the
environment; run it once with the knob at 0 and once at its value.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import ferry.multipath as mp
import torch

MiB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--idle-ms", type=float, default=40.0)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n = torch.cuda.device_count()
    eng = mp.Engine(devices=list(range(n)), loopback=1 if n == 1 else 0, min_bytes=4 * MiB)
    host = torch.empty(8 * MiB, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda:0")
    stream = torch.cuda.Stream(0)
    shares = []
    for _ in range(args.rounds):
        eng.copy(dev, host, stream=stream)
        eng.copy(host, dev, stream=stream)
        stream.synchronize()
        c0, w0 = time.process_time(), time.perf_counter()
        time.sleep(args.idle_ms / 1e3)
        c1, w1 = time.process_time(), time.perf_counter()
        shares.append((c1 - c0) / (w1 - w0))
    eng.check()
    eng.close()
    knob = os.environ.get("FERRY_MULTIPATH_KEEP_WARM_MS", "(default)")
    print(
        f"keep-warm {knob} ms, {n} GPU(s), idle {args.idle_ms:g} ms after a copy each way: CPU time per idle time "
        f"median {statistics.median(shares):.3f}, rounds {', '.join(f'{x:.3f}' for x in shares)}"
    )


if __name__ == "__main__":
    main()

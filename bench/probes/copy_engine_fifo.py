"""Does a copy on one stream wait for copies queued earlier on another?

A foreign stream queues K host->GPU 0 copies of 256 MB; 20 ms later one 4 MB
copy of a given kind goes on another stream, and the host polls both until
done. "wait" is the small copy's time from its submission to its end; "drain"
is the time from that submission until the foreign queue's last copy ended.
wait close to drain: the small copy ran after the foreign queue (first in,
first out across streams); wait of a few hundred microseconds: it was served
beside it. One line per kind; run it with CUDA_DEVICE_MAX_CONNECTIONS set to
compare hardware-queue counts.

    python bench/probes/copy_engine_fifo.py [--queued 8]
    python bench/probes/copy_engine_fifo.py --sweep   # by the small copy's size, both directions
"""

import argparse
import os
import time

import torch

MiB = 1 << 20


def behind(queue, lead_s: float, small):
    """queue() enqueues the foreign copies and returns an event after the last;
    lead_s later small() submits the small copy and returns an event after it.
    Both polled from the host: (the small copy's wait, the queue's drain), in
    us from the small copy's submission."""
    last = queue()
    time.sleep(lead_s)
    t = time.perf_counter()
    ev = small()
    done = {}
    while len(done) < 2:
        now = time.perf_counter()
        if "small" not in done and ev.query():
            done["small"] = now
        if "foreign" not in done and last.query():
            done["foreign"] = now
    return (done["small"] - t) * 1e6, (done["foreign"] - t) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--queued", type=int, default=8, help="foreign 256 MB copies queued ahead")
    ap.add_argument("--small", type=int, default=4, help="the small copy's MiB")
    args = ap.parse_args()
    n_gpu = torch.cuda.device_count()
    big = 256 * MiB
    f_host = torch.empty(big, dtype=torch.uint8, pin_memory=True)
    f_dev = torch.empty(big, dtype=torch.uint8, device="cuda:0")
    small = args.small * MiB
    h = torch.empty(small, dtype=torch.uint8, pin_memory=True)
    d0 = torch.empty(small, dtype=torch.uint8, device="cuda:0")
    d0b = torch.empty(small, dtype=torch.uint8, device="cuda:0")
    d1 = torch.empty(small, dtype=torch.uint8, device="cuda:1") if n_gpu > 1 else None
    f = torch.cuda.Stream(0)
    s0 = torch.cuda.Stream(0)
    s0_hi = torch.cuda.Stream(0, priority=-1)
    s1 = torch.cuda.Stream(1) if n_gpu > 1 else None

    kinds = {
        "h2d gpu0 (same link, same direction)": (s0, lambda: d0.copy_(h, non_blocking=True)),
        "h2d gpu0, greatest priority stream": (s0_hi, lambda: d0.copy_(h, non_blocking=True)),
        "d2h gpu0 (same link, other direction)": (s0, lambda: h.copy_(d0, non_blocking=True)),
        "d2d within gpu0": (s0, lambda: d0b.copy_(d0, non_blocking=True)),
    }
    # What a gate puts on the caller's stream: is it held behind the queue too?
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    word = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    kinds["stream write value (cuStreamWriteValue64)"] = (
        s0,
        lambda: cu.cuStreamWriteValue64(
            ctypes.c_void_p(s0.cuda_stream), ctypes.c_uint64(word.data_ptr()), ctypes.c_uint64(1), 0
        ),
    )
    kinds["stream wait value, already met"] = (
        s0,
        lambda: cu.cuStreamWaitValue64(
            ctypes.c_void_p(s0.cuda_stream), ctypes.c_uint64(word.data_ptr()), ctypes.c_uint64(0), 0
        ),
    )
    kinds["event record alone"] = (s0, lambda: None)
    kinds["a kernel (fill)"] = (s0, lambda: d0b.fill_(1))
    if s1 is not None:
        kinds["h2d gpu1 (the other GPU's link)"] = (s1, lambda: d1.copy_(h, non_blocking=True))
        kinds["gpu1 -> gpu0 over NVLink (gpu1's stream)"] = (s1, lambda: d0.copy_(d1, non_blocking=True))
    for _, (st, fn) in kinds.items():  # warm-up: every kind once, alone
        with torch.cuda.stream(st):
            fn()
    torch.cuda.synchronize()
    print(
        f"CUDA_DEVICE_MAX_CONNECTIONS={os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', '(default 8)')}, "
        f"{args.queued} x 256 MB queued ahead, small copy {args.small} MiB, gpus {n_gpu}"
    )
    alone = {}
    for name, (st, fn) in kinds.items():
        ev = torch.cuda.Event()
        t = time.perf_counter()
        with torch.cuda.stream(st):
            fn()
            ev.record(st)
        ev.synchronize()
        alone[name] = (time.perf_counter() - t) * 1e6
    for name, (st, fn) in kinds.items():
        torch.cuda.synchronize()

        def queue():
            with torch.cuda.stream(f):
                for _ in range(args.queued):
                    f_dev.copy_(f_host, non_blocking=True)
                e = torch.cuda.Event()
                e.record(f)
            return e

        def small(st=st, fn=fn):
            ev = torch.cuda.Event()
            with torch.cuda.stream(st):
                fn()
                ev.record(st)
            return ev

        wait, drain = behind(queue, 0.02, small)
        verdict = "after the queue" if wait > 0.8 * drain else "beside it"
        print(
            f"  {name:44s} alone {alone[name]:7.0f} us  wait {wait:8.0f} us  drain {drain:8.0f} us  -> {verdict}"
        )
    torch.cuda.synchronize()


def sweep(direction: str, sizes, queued: int):
    """The same question by size, in one direction: foreign copies queued on
    GPU 0 in `direction`, then one small copy the same way on another stream
    (which sizes take the copy engine's queue; the smallest may not)."""
    big = 256 * MiB
    f_host = torch.empty(big, dtype=torch.uint8, pin_memory=True)
    f_dev = torch.empty(big, dtype=torch.uint8, device="cuda:0")
    top = max(sizes)
    h = torch.empty(top, dtype=torch.uint8, pin_memory=True)
    d = torch.empty(top, dtype=torch.uint8, device="cuda:0")
    f, s = torch.cuda.Stream(0), torch.cuda.Stream(0)

    def one(n):
        if direction == "h2d":
            d[:n].copy_(h[:n], non_blocking=True)
        else:
            h[:n].copy_(d[:n], non_blocking=True)

    for n in sizes:  # warm-up
        with torch.cuda.stream(s):
            one(n)
    torch.cuda.synchronize()
    for n in sizes:

        def queue():
            with torch.cuda.stream(f):
                for _ in range(queued):
                    if direction == "h2d":
                        f_dev.copy_(f_host, non_blocking=True)
                    else:
                        f_host.copy_(f_dev, non_blocking=True)
                e = torch.cuda.Event()
                e.record(f)
            return e

        def small(n=n):
            ev = torch.cuda.Event()
            with torch.cuda.stream(s):
                one(n)
                ev.record(s)
            return ev

        wait, drain = behind(queue, 0.005, small)  # most of the queue still ahead
        verdict = "after the queue" if wait > 0.8 * drain else "beside it"
        print(
            f"  {direction} {n:>9d} B behind a {direction} queue: wait {wait:8.0f} us, drain {drain:8.0f} us -> {verdict}"
        )
        torch.cuda.synchronize()


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "--sweep":
        for direction in ("h2d", "d2h"):
            sweep(direction, [8, 4096, 65536, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20], 8)
    else:
        main()

"""One multipath copy at a time while a foreign copy hogs the target's own link.

    python bench/probes/own_share_contention.py [MiB per copy, default 256] [on,off]

A thread keeps four host-to-GPU copies of the same size queued on a second
stream of GPU 0; 50 ms after it starts, ferry copies into GPU 0 one at a time
(each waited for), with own_share_on_stream on and then off. Per copy: GB/s
(CUDA events on the caller's stream) and the share of its bytes each link
carried, and the foreign copies' GB/s over the same span. With the share on
the stream, a copy's share is planned when copy() is called, from what the
engine measured before: the first copy meets the foreign copies with an even
share, and the later ones should shrink it (or drop it while the own link's
probe comes back late).
"""

import sys
import threading
import time

import ferry.multipath as mp
import torch


def main():
    n = int(sys.argv[1] if len(sys.argv) > 1 else 256) << 20
    gpus = torch.cuda.device_count()
    if gpus < 2:
        raise SystemExit("needs two GPUs or more")
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    f_host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    f_dev = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    s, f = torch.cuda.Stream(0), torch.cuda.Stream(0)
    settings = [x == "on" for x in (sys.argv[2] if len(sys.argv) > 2 else "on,off").split(",")]
    for on in settings:
        e = mp.Engine(devices=list(range(gpus)), own_share_on_stream=on)
        for _ in range(3):  # measured before the foreign copies start
            e.copy(dev, host, stream=s)
            s.synchronize()
        # Four queued at a time: queueing many at once can block the host
        # until most of them have run.
        stop = threading.Event()
        done = []

        def foreign(stop=stop, done=done):
            torch.cuda.set_device(0)
            marks = []
            while not stop.is_set():
                with torch.cuda.stream(f):
                    f_dev.copy_(f_host, non_blocking=True)
                marks.append(torch.cuda.Event())
                marks[-1].record(f)
                if len(marks) >= 4:
                    marks.pop(0).synchronize()
                    done.append(time.perf_counter())
            f.synchronize()

        t = threading.Thread(target=foreign)
        t.start()
        time.sleep(0.05)
        t0 = time.perf_counter()
        for i in range(8):
            before = e.bytes_by_link()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(s)
            e.copy(dev, host, stream=s)
            b.record(s)
            s.synchronize()
            moved = [y - x for x, y in zip(before, e.bytes_by_link())]
            shares = [round(m / max(sum(moved), 1), 3) for m in moved]
            gbps = n / (a.elapsed_time(b) * 1e-3) / 1e9
            print(f"own_share_on_stream={on} copy {i}: {gbps:6.1f} GB/s, bytes by link {shares}", flush=True)
        t1 = time.perf_counter()
        stop.set()
        t.join()
        inside = sum(1 for x in done if t0 < x <= t1)
        print(f"own_share_on_stream={on}: foreign copies {inside * n / (t1 - t0) / 1e9:.1f} GB/s meanwhile")
        torch.cuda.synchronize()
        e.check()
        e.close()


if __name__ == "__main__":
    main()

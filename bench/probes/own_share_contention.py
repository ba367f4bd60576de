"""One multipath copy at a time while foreign copies load the target's own link.

    python bench/probes/own_share_contention.py            # every case, each in a process of its own
    python bench/probes/own_share_contention.py on off     # the cases named
    python bench/probes/own_share_contention.py --case on  # one case, in this process

A thread keeps four host-to-GPU copies queued on a second stream of GPU 0
(--mib each, default 64); 50 ms after it starts, the main thread makes 8
multipath copies into GPU 0 one at a time (each waited for). Per copy: GB/s
(CUDA events on the caller's stream) and each link's share of its bytes; then
the foreign copies' GB/s over the same span. Each case runs in a process of
its own, bounded (--timeout, default 40 s; a hung case prints its threads'
Python stacks and "HUNG").

It shows, in ferry, the starvation under docs/multipath.md, "Hazards" (a
stream that keeps host-to-GPU copies queued starves other streams' copies
on that link; bench/probes/head_wait_hang.cu shows it without ferry). The cases
tell the explanations apart:
- on, off: the two settings;
- head-off: own share off, but a 16 MiB head on the caller's stream
  (head_bytes): a copy on the stream between the engine's stream writes and
  its wait, without the scheduler's own-share rules;
- on-1q, on-32q: on, with CUDA_DEVICE_MAX_CONNECTIONS 1 and 32 (how many
  hardware queues the streams share);
- on-noevent: on, the foreign thread without event records (it paces
  itself with stream queries);
- on-locked: on, one Python lock around each multipath copy and around each
  foreign copy with its event record (no two threads submitting at once);
- on-debug: on, FERRY_DEBUG=1 and a 5 s timeout (what the engine saw).
"""

import argparse
import os
import subprocess
import sys
import threading
import time

CASES = {
    "on": ({}, {"own_share_on_stream": True}),
    "off": ({}, {"own_share_on_stream": False}),
    "head-off": ({}, {"own_share_on_stream": False, "head_bytes": 16 << 20}),
    "on-1q": ({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, {"own_share_on_stream": True}),
    "on-32q": ({"CUDA_DEVICE_MAX_CONNECTIONS": "32"}, {"own_share_on_stream": True}),
    "on-noevent": ({}, {"own_share_on_stream": True}),
    "on-locked": ({}, {"own_share_on_stream": True}),
    "on-debug": ({"FERRY_DEBUG": "1", "FERRY_TIMEOUT_S": "5"}, {"own_share_on_stream": True}),
}


def run_case(name: str, mib: int) -> None:
    import faulthandler

    import ferry.multipath as mp
    import torch

    faulthandler.register(15, all_threads=True)  # SIGTERM from the runner: every thread's stack
    n = mib << 20
    gpus = torch.cuda.device_count()
    if gpus < 2:
        raise SystemExit("needs two GPUs or more")
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    f_host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    f_dev = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    s, f = torch.cuda.Stream(0), torch.cuda.Stream(0)
    e = mp.Engine(devices=list(range(gpus)), **CASES[name][1])
    for _ in range(3):  # measured before the foreign copies start
        e.copy(dev, host, stream=s)
        s.synchronize()
    lock = threading.Lock() if name == "on-locked" else None
    stop = threading.Event()
    done = []

    def foreign():
        torch.cuda.set_device(0)
        marks = []
        while not stop.is_set():
            if lock:
                lock.acquire()
            with torch.cuda.stream(f):
                f_dev.copy_(f_host, non_blocking=True)
            if name != "on-noevent":
                marks.append(torch.cuda.Event())
                marks[-1].record(f)
            if lock:
                lock.release()
            if name == "on-noevent":
                while not f.query() and not stop.is_set():
                    time.sleep(1e-4)
                done.append(time.perf_counter())
            elif len(marks) >= 4:
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
        if lock:
            lock.acquire()
        a.record(s)
        e.copy(dev, host, stream=s)
        b.record(s)
        if lock:
            lock.release()
        s.synchronize()
        moved = [y - x for x, y in zip(before, e.bytes_by_link())]
        shares = [round(m / max(sum(moved), 1), 3) for m in moved]
        gbps = n / (a.elapsed_time(b) * 1e-3) / 1e9
        print(f"{name} copy {i}: {gbps:6.1f} GB/s, bytes by link {shares}", flush=True)
    t1 = time.perf_counter()
    stop.set()
    t.join()
    inside = sum(1 for x in done if t0 < x <= t1)
    print(f"{name}: foreign copies {inside * n / (t1 - t0) / 1e9:.1f} GB/s meanwhile", flush=True)
    torch.cuda.synchronize()
    e.check()
    e.close()
    print(f"{name}: ok", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("cases", nargs="*", help=f"of {', '.join(CASES)} (default: all)")
    p.add_argument("--case", help="run this one case in this process")
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--timeout", type=float, default=40)
    args = p.parse_args()
    if args.case:
        run_case(args.case, args.mib)
        return 0
    bad = [c for c in args.cases if c not in CASES]
    if bad:
        raise SystemExit(f"unknown cases {bad}; known: {', '.join(CASES)}")
    for name in args.cases or list(CASES):
        env = dict(os.environ, **CASES[name][0])
        cmd = [sys.executable, "-u", __file__, "--case", name, "--mib", str(args.mib)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = proc.communicate(timeout=args.timeout)
            verdict = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            proc.terminate()  # faulthandler prints the stacks
            try:
                out, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            verdict = f"HUNG (no end in {args.timeout:.0f} s)"
        keep = [line for line in out.splitlines() if "routing" not in line and "UserWarning" not in line]
        print(f"== {name}: {verdict}")
        print("\n".join(keep[-40:]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

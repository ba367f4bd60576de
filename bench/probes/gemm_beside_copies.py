"""What slows a GEMM beside host-to-GPU page copies: the copies' host
submission, their bytes, or the GPU's clock under its power cap.

    python bench/probes/gemm_beside_copies.py [--gemms 30] [--pairs 9] [--out FILE.json]

A loop of bf16 8192^3 GEMMs on one stream (one CUDA graph, so that the
thread feeding the transfers cannot delay a GEMM's launch), alone and beside continuous
transfers on another stream (alternating, --pairs pairs per side; each
round runs every side's pair, in an order of the round's own). The
transfers run from a thread of their own, two calls in flight, from before
the GEMMs start until they end, so every GEMM has them beside it:
- zero_sm-64K: ferry.kv.copy_blocks(zero_sm=True) of 1024 scattered 64 KB pages;
- zero_sm-1M: the same bytes as 64 pages of 1 MB (a sixteenth of the copies);
- plain-64M: one cudaMemcpyAsync of 64 MB (the least submission there is);
- plain-64M-d2h: the same copy GPU to host (the copy engine reads GPU
  memory instead of writing it: asked by name);
- kernel-64K: mode="kernel" (16 blocks on SMs), for scale.
NVML is read every 2 ms during each GEMM loop: the SM clock, the power draw
and the clock-event reasons (the power cap among them). Each pair's slowdown
is beside / alone - 1; the median over the pairs is reported with each
side's mean SM clock and power against its alone runs'.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import random
import statistics
import time

import ferry.kv as kv
import torch
from ferry.bench.kv import Feeder

# nvmlClocksEventReasons bits (nvml.h)
REASONS = {
    0x1: "gpu_idle",
    0x2: "app_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


class Nvml:
    def __init__(self):
        self.lib = None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            h = ctypes.c_void_p()
            props = torch.cuda.get_device_properties(0)
            bus = getattr(props, "pci_bus_id", None)
            ok = -1
            if bus is not None:
                pci = f"{getattr(props, 'pci_domain_id', 0):08x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
                ok = lib.nvmlDeviceGetHandleByPciBusId_v2(pci.encode(), ctypes.byref(h))
            if ok != 0:
                ok = lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
            if ok == 0:
                self.lib, self.h = lib, h
        except OSError:
            pass

    def sample(self):
        """(SM MHz, W, reason bits), or None without NVML."""
        if self.lib is None:
            return None
        clk, mw, why = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        self.lib.nvmlDeviceGetClockInfo(self.h, 1, ctypes.byref(clk))  # NVML_CLOCK_SM
        self.lib.nvmlDeviceGetPowerUsage(self.h, ctypes.byref(mw))
        self.lib.nvmlDeviceGetCurrentClocksThrottleReasons(self.h, ctypes.byref(why))
        return clk.value, mw.value / 1e3, why.value


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--gemms", type=int, default=30)
    p.add_argument("--pairs", type=int, default=9)
    p.add_argument("--sides", default="zero_sm-64K,zero_sm-1M,plain-64M,kernel-64K")
    p.add_argument("--out", default="")
    args = p.parse_args()
    nvml = Nvml()
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    gs, xs = torch.cuda.Stream(), torch.cuda.Stream()
    pool = kv.HostPool(128 << 20)  # pinned, NUMA-local, as the KV benchmark's
    host64 = pool.tensor((2048, 64 << 10), torch.uint8)
    dev64 = torch.empty((2048, 64 << 10), dtype=torch.uint8, device="cuda")
    host1m, dev1m = host64.view(128, 1 << 20), dev64.view(128, 1 << 20)
    rng = random.Random(5)
    d64, s64 = rng.sample(range(2048), 1024), rng.sample(range(2048), 1024)
    d1m, s1m = rng.sample(range(128), 64), rng.sample(range(128), 64)
    flat_h, flat_d = host64.view(-1)[: 64 << 20], dev64.view(-1)[64 << 20 : 128 << 20]
    sides = {
        "zero_sm-64K": lambda: kv.copy_blocks(dev64, host64, d64, s64, stream=xs, zero_sm=True),
        "zero_sm-1M": lambda: kv.copy_blocks(dev1m, host1m, d1m, s1m, stream=xs, zero_sm=True),
        "plain-64M": lambda: flat_d.copy_(flat_h, non_blocking=True),
        "plain-64M-d2h": lambda: flat_h.copy_(flat_d, non_blocking=True),
        "kernel-64K": lambda: kv.copy_blocks(dev64, host64, d64, s64, stream=xs, mode="kernel"),
    }
    c = torch.empty_like(a)
    with torch.cuda.stream(gs):
        torch.matmul(a, b, out=c)  # cuBLAS warmed up before the capture
    torch.cuda.synchronize()
    gemm_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gemm_graph, stream=gs):
        for _ in range(args.gemms):
            torch.matmul(a, b, out=c)
    chosen = [s for s in args.sides.split(",") if s]
    for s in chosen:
        if s not in sides:
            raise SystemExit(f"--sides: {s} is not one of {', '.join(sides)}")

    def loop(side):
        """GEMM ms and the NVML samples taken during it."""
        torch.cuda.synchronize()
        fn = sides.get(side)
        samples = []
        with Feeder(torch, fn, xs, timeout_s=30) if fn else contextlib.nullcontext():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(gs):
                # Untimed: the host gets the GIL back from the feeding thread
                # before the replay while the stream sleeps.
                torch.cuda._sleep(4_000_000)
                start.record()
                gemm_graph.replay()  # every GEMM queued at once: the feeding thread cannot gap them
                end.record()
            deadline = time.monotonic() + 60
            while not start.query() and time.monotonic() < deadline:
                time.sleep(0.0002)  # NVML's samples cover the GEMMs, not the sleep before them
            while not end.query():
                if time.monotonic() > deadline:
                    raise TimeoutError("the GEMM loop did not finish within 60 s")
                s = nvml.sample()
                if s:
                    samples.append(s)
                time.sleep(0.002)
        torch.cuda.synchronize()
        return start.elapsed_time(end), samples

    for s in chosen:  # warm-up: every side once, the GEMM alone once
        loop(s)
    loop(None)
    out = []
    print(f"{args.gemms} GEMMs of 8192^3 bf16, {args.pairs} pairs per side (alone, beside), NVML every 2 ms")
    pairs = {s: [] for s in chosen}  # per side: (alone ms, samples, beside ms, samples)
    shuffle = random.Random(11)
    for _ in range(args.pairs):
        # Every side's pair each round, in an order of the round's own: the
        # GPU's drift in power and temperature falls on every side alike.
        for s in shuffle.sample(chosen, len(chosen)):
            pairs[s].append(loop(None) + loop(s))
    for s in chosen:
        slow, clk_a, clk_b, w_a, w_b, why = [], [], [], [], [], 0
        for t_a, sa, t_b, sb in pairs[s]:
            slow.append(t_b / t_a - 1)
            if sa and sb:
                clk_a.append(statistics.mean(x[0] for x in sa))
                clk_b.append(statistics.mean(x[0] for x in sb))
                w_a.append(statistics.mean(x[1] for x in sa))
                w_b.append(statistics.mean(x[1] for x in sb))
                for x in sa + sb:
                    why |= x[2]
        rec = {
            "side": s,
            "gemms": args.gemms,
            "slowdown": round(statistics.median(slow), 4),
            "samples": [round(x, 4) for x in slow],
            "sm_mhz_alone": round(statistics.mean(clk_a), 1) if clk_a else None,
            "sm_mhz_beside": round(statistics.mean(clk_b), 1) if clk_b else None,
            "watts_alone": round(statistics.mean(w_a), 1) if w_a else None,
            "watts_beside": round(statistics.mean(w_b), 1) if w_b else None,
            "clock_reasons": [v for k, v in REASONS.items() if why & k],
        }
        out.append(rec)
        clocks = (
            f"SM {rec['sm_mhz_alone']} -> {rec['sm_mhz_beside']} MHz, {rec['watts_alone']} -> {rec['watts_beside']} W, "
            f"reasons {','.join(rec['clock_reasons']) or 'none'}"
            if clk_a
            else "no NVML"
        )
        print(
            f"{s:12s} slowdown median {100 * rec['slowdown']:+.2f}% (pairs {min(slow) * 100:+.1f}..{max(slow) * 100:+.1f}%); {clocks}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "records": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a multipath copy's time goes outside the engine's own view, and how
long a stream waiting on a word in pinned host memory takes to see it change.

    FERRY_DEBUG=1 python bench/probes/gate_wake.py [--waits 0,0.02,0.1,0.5,2,5] [--trials 40]
        [--sizes 8,256] [--paths 2] 2> gate_wake.log

Part 1, the wait (no ferry, one GPU): a stream waits until a 64-bit word of
pinned host memory reaches a value (cuStreamWaitValue64, as ferry's gates do)
and then writes another word there (cuStreamWriteValue64). The host opens
the first word after the stream has waited for `wait` ms and spins on the
second: the time between its store and seeing the write is the stream's
wake-up plus one write back over PCIe. Median and 90th percentile of
`--trials` per wait.

Part 2, a copy (the engine over `--paths` GPUs, host to GPU 0 and back,
alternating with a plain copy on the same stream):
before each copy the host notes its clock (CLOCK_MONOTONIC, the clock of the
engine's debug log, in ms) and after `Engine.copy` the stream writes a word
that the host spins on. Each copy prints a `probe:` line with both times to
stderr, where FERRY_DEBUG=1 prints the engine's line for the same copy (when
it saw the stream get to the copy and when the last chunk landed), so the
copy splits into: call to start, the engine's time, landing to the stream
going on. With `--held-us`, the stream waits on a host word for that long
after the call (as behind a kernel), and the times count from its release.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time

import torch

MiB = 1 << 20


def _cuda():
    lib = ctypes.CDLL("libcuda.so.1")
    for name in ("cuStreamWaitValue64_v2", "cuStreamWriteValue64_v2"):
        f = getattr(lib, name)
        f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
        f.restype = ctypes.c_int
    f = lib.cuMemHostGetDevicePointer_v2
    f.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
    f.restype = ctypes.c_int
    return lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


class Words:
    """Two 64-bit words of pinned host memory and their device addresses."""

    def __init__(self, lib):
        self.t = torch.zeros(2, dtype=torch.int64).pin_memory()
        self.host = [self.t.data_ptr(), self.t.data_ptr() + 8]
        self.dev = []
        for h in self.host:
            d = ctypes.c_uint64()
            _check(lib.cuMemHostGetDevicePointer_v2(ctypes.byref(d), ctypes.c_void_p(h), 0), "device pointer")
            self.dev.append(d.value)

    def load(self, i: int) -> int:
        return ctypes.c_uint64.from_address(self.host[i]).value

    def store(self, i: int, v: int) -> None:
        ctypes.c_uint64.from_address(self.host[i]).value = v


def busy_wait(seconds: float) -> None:
    """Spins (no sleep: a sleep's wake-up would be in the time)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def spin_until(pred, limit_s: float = 5.0) -> None:
    end = time.perf_counter() + limit_s
    while not pred():
        if time.perf_counter() > end:
            raise TimeoutError("the stream did not write its word within 5 s")


def part_wait(lib, waits_ms, trials: int) -> None:
    s = torch.cuda.Stream(0)
    w = Words(lib)
    gen = 0
    print("# part 1: a stream's wake-up on a pinned host word (us, host store to the stream's write seen)")
    for wait_ms in waits_ms:
        lat = []
        for _ in range(trials + 2):
            gen += 1
            _check(lib.cuStreamWaitValue64_v2(ctypes.c_void_p(s.cuda_stream), w.dev[0], gen, 0), "wait")
            _check(lib.cuStreamWriteValue64_v2(ctypes.c_void_p(s.cuda_stream), w.dev[1], gen, 0), "write")
            busy_wait(wait_ms * 1e-3)
            t0 = time.perf_counter()
            w.store(0, gen)
            spin_until(lambda: w.load(1) >= gen)
            lat.append((time.perf_counter() - t0) * 1e6)
        lat = sorted(lat[2:])
        print(
            f"waited {wait_ms:g} ms: median {statistics.median(lat):.1f} us, "
            f"p90 {lat[int(0.9 * (len(lat) - 1))]:.1f}, min {lat[0]:.1f}, max {lat[-1]:.1f}",
            flush=True,
        )


def part_copy(lib, sizes_mib, paths: int, reps: int, held_us: float) -> None:
    import ferry.multipath as mp

    eng = mp.Engine(devices=list(range(paths)), head_bytes=0)
    s = torch.cuda.Stream(0)
    w = Words(lib)
    gen = 0
    held = f", the stream held {held_us:g} us after the call" if held_us else ""
    print(f"# part 2: copies{held}; match the 'probe:' lines on stderr with the engine's lines after them")
    for mib in sizes_mib:
        n = mib * MiB
        host = torch.randint(0, 256, (n,), dtype=torch.uint8).pin_memory()
        back = torch.empty(n, dtype=torch.uint8).pin_memory()
        dev = torch.empty(n, dtype=torch.uint8, device="cuda:0")
        for direction, dst, src in (("h2d", dev, host), ("d2h", back, dev)):
            totals = {"ferry": [], "plain": []}
            for r in range(2 * reps + 2):
                impl = "ferry" if r % 2 == 0 else "plain"
                s.synchronize()
                time.sleep(0.002)
                gen += 1
                if held_us:  # the stream gets to the copy only when the host opens word 0
                    _check(
                        lib.cuStreamWaitValue64_v2(ctypes.c_void_p(s.cuda_stream), w.dev[0], gen, 0), "wait"
                    )
                t_call = time.monotonic_ns()
                if impl == "ferry":
                    eng.copy(dst, src, stream=s)
                else:
                    with torch.cuda.stream(s):
                        dst.copy_(src, non_blocking=True)
                _check(lib.cuStreamWriteValue64_v2(ctypes.c_void_p(s.cuda_stream), w.dev[1], gen, 0), "write")
                t_go = t_call
                if held_us:
                    busy_wait(held_us * 1e-6)
                    t_go = time.monotonic_ns()
                    w.store(0, gen)
                spin_until(lambda: w.load(1) >= gen)
                t_done = time.monotonic_ns()
                if impl == "ferry":
                    print(
                        f"probe: {direction} {mib} MiB rep {r // 2}: called at {t_call / 1e6:.3f} ms, "
                        f"the stream went on at {t_done / 1e6:.3f} ms ({(t_done - t_call) / 1e3:.0f} us)",
                        file=sys.stderr,
                        flush=True,
                    )
                if r >= 2:
                    totals[impl].append((t_done - t_go) / 1e3)
            s.synchronize()
            ok = torch.equal(back, host) if direction == "d2h" else torch.equal(dev.cpu(), host)
            f, p = statistics.median(totals["ferry"]), statistics.median(totals["plain"])
            print(
                f"{direction} {mib} MiB over {paths} paths: {'release' if held_us else 'call'} to stream going on, "
                f"median {f:.0f} us ({n / f / 1e3:.1f} GB/s); plain copy {p:.0f} us ({n / p / 1e3:.1f} GB/s); "
                f"bytes {'right' if ok else 'WRONG'}",
                flush=True,
            )
    eng.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--waits", default="0,0.02,0.1,0.5,2,5", help="ms the stream waits before the host opens")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--sizes", default="8,256", help="MiB per copy (part 2)")
    ap.add_argument("--paths", type=int, default=0, help="GPUs of the engine (0: all; 1: part 2 skipped)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--held-us", type=float, default=0, help="part 2: the stream waits this long after the call"
    )
    a = ap.parse_args()
    torch.cuda.init()
    torch.zeros(1, device="cuda:0")
    lib = _cuda()
    part_wait(lib, [float(x) for x in a.waits.split(",")], a.trials)
    paths = a.paths or torch.cuda.device_count()
    if paths >= 2:
        part_copy(lib, [int(x) for x in a.sizes.split(",")], paths, a.reps, a.held_us)


if __name__ == "__main__":
    main()

"""The host time of one multipath copy call, taken apart.

    python bench/probes/multipath_call_cost.py [--mib 8] [--calls 200]

One GPU is enough: the engine runs over GPU 0 with a loopback relay (a relay
"peer" that is GPU 0 itself), so every call goes multipath. Each call is made
with the stream idle (synchronized before), and timed on the host alone
(perf_counter around the call; the copy itself is not in it):
- ferry.multipath.Engine.copy (the Python API: argument checks, then the call);
- the binding's copy with the pointers and stream handle given (no Python checks);
- torch's dst.copy_(src, non_blocking=True) on the same stream, for scale.
Median and 90th percentile of `--calls` after 20 warm-up calls.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

MiB = 1 << 20


def timed(fn, calls: int, sync) -> list:
    out = []
    for i in range(calls + 20):
        sync()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        if i >= 20:
            out.append((t1 - t0) * 1e6)
    sync()
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=8)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    import ferry.multipath as mp

    n = a.mib * MiB
    src = torch.randint(0, 256, (n,), dtype=torch.uint8).pin_memory()
    dst = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    s = torch.cuda.Stream(0)
    eng = mp.Engine(devices=[0], loopback=1, head_bytes=0)
    raw = eng._engine()
    report = eng.copy(dst, src, stream=s)
    s.synchronize()
    if not report["multipath"]:
        raise SystemExit(f"the copy ran plain: {report['reason']}")

    def api():
        eng.copy(dst, src, stream=s)

    def binding():
        raw.copy(dst.data_ptr(), src.data_ptr(), n, s.cuda_stream, 0)

    def plain():
        with torch.cuda.stream(s):
            dst.copy_(src, non_blocking=True)

    for name, fn in (("Engine.copy", api), ("binding copy", binding), ("torch copy_", plain)):
        t = timed(fn, a.calls, s.synchronize)
        print(
            f"{name:14} {a.mib} MiB: median {statistics.median(t):6.1f} us, p90 {t[int(0.9 * (len(t) - 1))]:6.1f}, "
            f"min {t[0]:6.1f}",
            flush=True,
        )
    ok = torch.equal(dst.cpu(), src)
    print(f"bytes {'right' if ok else 'WRONG'}")
    eng.close()


if __name__ == "__main__":
    main()

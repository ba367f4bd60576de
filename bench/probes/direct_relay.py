"""Host <-> GPU 0 copies made by another GPU's copy engine, with no staging.

cudaMemcpyAsync(dst in GPU 0, src in pinned host memory, stream of GPU 1):
whose link does it use, how fast is it, does it land every byte, and does it
wait behind host->GPU 0 copies queued on GPU 0? Lines:
- alone: GB/s of each kind by itself (median of 5 after a warm-up);
- both: GPU 0's own copy and the other GPU's copy into GPU 0 at once, GB/s
  of the two together (over one link's figure: the other GPU's link carried
  part of it);
- queued: the copy's wait when 8 x 256 MB host->GPU 0 copies are queued on
  GPU 0 ahead of it (see copy_engine_fifo.py).

    python bench/probes/direct_relay.py
"""

import statistics
import time

import torch
from copy_engine_fifo import behind  # this folder: run as a script
from ferry.bench.multipath import Runtime

MiB = 1 << 20


def main():
    if torch.cuda.device_count() < 2:
        raise SystemExit("direct_relay: needs 2 GPUs")
    rt = Runtime()
    rt.enable_peer_access([0, 1])
    torch.cuda.set_device(0)
    n = 1024 * MiB
    g = torch.Generator().manual_seed(1)
    host = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).pin_memory()
    host2 = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host2.copy_(host)
    back = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    a = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    b = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    s0, s1 = torch.cuda.Stream(0), torch.cuda.Stream(1)

    copy = rt.copy

    def timed(fns, nbytes, reps=5):
        out = []
        for i in range(reps + 1):
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
            t = time.perf_counter()
            for fn in fns:
                fn(nbytes)
            s0.synchronize()
            s1.synchronize()
            if i:
                out.append(time.perf_counter() - t)
        return len(fns) * nbytes / statistics.median(out) / 1e9

    h2d_own = lambda k: copy(a.data_ptr(), host.data_ptr(), k, s0)  # noqa: E731
    h2d_other = lambda k: copy(b.data_ptr(), host2.data_ptr(), k, s1)  # noqa: E731
    d2h_own = lambda k: copy(back.data_ptr(), a.data_ptr(), k, s0)  # noqa: E731
    d2h_other = lambda k: copy(host2.data_ptr(), b.data_ptr(), k, s1)  # noqa: E731

    # Every byte: host -> GPU 0 by GPU 1's engine, then back by GPU 1's engine.
    b.fill_(0x5A)
    torch.cuda.synchronize(0)
    h2d_other(n)
    s1.synchronize()
    ok_in = torch.equal(b.cpu(), host)
    back.fill_(0)
    copy(back.data_ptr(), b.data_ptr(), n, s1)
    s1.synchronize()
    ok_out = torch.equal(back, host)
    print(
        f"every byte: host->GPU 0 by GPU 1's engine {'ok' if ok_in else 'WRONG'}, back {'ok' if ok_out else 'WRONG'}"
    )
    host2.copy_(host)

    for size in (16 * MiB, 256 * MiB, n):
        line = [f"{size // MiB:5d} MiB:"]
        line.append(f"h2d own {timed([h2d_own], size):6.1f}")
        line.append(f"h2d by gpu1 {timed([h2d_other], size):6.1f}")
        line.append(f"both {timed([h2d_own, h2d_other], size):6.1f}")
        line.append(f"| d2h own {timed([d2h_own], size):6.1f}")
        line.append(f"d2h by gpu1 {timed([d2h_other], size):6.1f}")
        line.append(f"both {timed([d2h_own, d2h_other], size):6.1f} GB/s")
        print("  ".join(line))

    # Behind a foreign queue on GPU 0's host->GPU copies?
    f = torch.cuda.Stream(0)
    big = 256 * MiB
    for name, fn in (("h2d by gpu1", h2d_other), ("h2d own", h2d_own)):
        torch.cuda.synchronize(0)

        def queue():
            with torch.cuda.stream(f):
                for _ in range(8):
                    a[:big].copy_(host[:big], non_blocking=True)
                e = torch.cuda.Event()
                e.record(f)
            return e

        def small(fn=fn):
            ev = torch.cuda.Event()
            fn(4 * MiB)
            ev.record(s1 if fn is h2d_other else s0)
            return ev

        wait, drain = behind(queue, 0.02, small)
        print(f"queued: 4 MiB {name}: wait {wait:8.0f} us, foreign queue drained after {drain:8.0f} us")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

"""Is a GPU's first large copy into a peer slow, and what makes it so?

The multipath engine's debug log (four H200s) showed a relay's second hop,
2 MiB from its staging buffer into GPU 0 over NVLink, taking 105-112 us in
a new engine's first copies and 7-19 us later. Which first use pays: a
stream's first large peer copy, the first peer write into a destination
buffer, or the pair of GPUs? Each case times five 2 MiB copies from GPU r
into GPU 0 in a row (events around each, on the copying stream):

- new stream, new buffers;
- new stream, the destination written before from GPU r;
- the stream of the first case, a new destination;
- new stream after one 8-byte peer copy on it (what the engine's warm-up does);
- new stream after one 64 KiB peer copy on it, new destination.

    python bench/probes/first_peer_copy.py
"""

import torch
from ferry.bench.multipath import Runtime

MiB = 1 << 20


def main():
    n = torch.cuda.device_count()
    if n < 2:
        raise SystemExit("first_peer_copy: needs 2 GPUs")
    rt = Runtime()
    rt.enable_peer_access(list(range(n)))
    print(f"first_peer_copy: {n} GPUs, {torch.cuda.get_device_name(0)}; us per 2 MiB copy, first to fifth")

    def times(r, stream, src, dst, before=None):
        out = []
        with torch.cuda.device(r):
            if before is not None:
                rt.copy(before[0].data_ptr(), before[1].data_ptr(), before[1].numel(), stream)
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(stream)
                rt.copy(dst.data_ptr(), src.data_ptr(), 2 * MiB, stream)
                b.record(stream)
                out.append((a, b))
            stream.synchronize()
        return " ".join(f"{a.elapsed_time(b) * 1e3:6.1f}" for a, b in out)

    keep = []  # every buffer stays allocated: a new one is never an old one's memory again

    def new(d):
        keep.append(torch.randint(0, 256, (2 * MiB,), dtype=torch.uint8, device=f"cuda:{d}"))
        return keep[-1]

    for r in range(1, n):
        src, dst = new(r), new(0)
        s1 = torch.cuda.Stream(r)
        lines = [("new stream, new buffers", times(r, s1, src, dst))]
        lines.append(("new stream, same destination", times(r, torch.cuda.Stream(r), src, dst)))
        lines.append(("same stream, new destination", times(r, s1, src, new(0))))
        tiny_dst, tiny_src = new(0)[:8], new(r)[:8]
        lines.append(
            ("new stream after 8 B", times(r, torch.cuda.Stream(r), src, new(0), (tiny_dst, tiny_src)))
        )
        warm_dst, warm_src = new(0)[: 64 << 10], new(r)[: 64 << 10]
        lines.append(
            ("new stream after 64 KiB", times(r, torch.cuda.Stream(r), src, new(0), (warm_dst, warm_src)))
        )
        for what, t in lines:
            print(f"GPU {r} -> GPU 0, {what:30s} {t}")
        check = new(0)
        with torch.cuda.device(r):
            rt.copy(check.data_ptr(), src.data_ptr(), 2 * MiB, s1)
        s1.synchronize()
        print(f"GPU {r} -> GPU 0: bytes {'ok' if torch.equal(check.cpu(), src.cpu()) else 'WRONG'}")


if __name__ == "__main__":
    main()

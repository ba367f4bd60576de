"""The floor of a multipath copy: its copies queued ahead, released at once.

A copy of S bytes between pinned host memory and GPU 0, split evenly over P
links (GPU 0's own link and P - 1 relays), each link's share cut into 2 MiB
chunks as the engine cuts them. Every CUDA call is made before the copy
starts: all link streams wait on one event that a stream of GPU 0 records
after a sleep, so no host submission, polling or gate is in the time. What is
left is what the copy engines, the links and the host side allow; the
engine's time over this floor is what its host thread costs.

Two ways of running a relay's two hops (host -> staging on the relay, then
staging -> GPU 0 over NVLink; the reverse for GPU to host), each with two
staging buffers:
- events: the engine's way. Hop 1 of every chunk on one stream, hop 2 on
  another after an event; hop 1 of chunk k + 2 waits for hop 2 of chunk k
  (its staging buffer).
- slots: one stream per staging buffer, both hops of a chunk on it in
  order: no event, and the two buffers' chunks in flight at once.
- target: as events, but the NVLink hop on a stream of GPU 0 (its copy
  engine reads the relay's staging buffer, or writes it, GPU to host), so
  that the relay's copy engines carry only its host link's hop.

And two ways with no relay at all, for the host side alone:
- own: each link copies its share of the same host buffer to or from its
  own GPU's memory, in 2 MiB chunks (the copy's host side without the
  NVLink hops).
- separate: the same, each link with a host buffer of its own (as the
  benchmark's "all links at once" measures the machine).

Prints GB/s (median of 7 after a warm-up) by direction, size and links, with
each link's own time from the release; every byte of the last run of each
(direction, size, links, way) checked against the source.

    python bench/probes/relay_floor.py [--sizes 8,16,64,256] [--paths 1,2,4] [--ways events,target]
"""

import argparse
import statistics
import time

import torch
from ferry.bench.multipath import Runtime

MiB = 1 << 20
CHUNK = 2 * MiB


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,16,64,256", help="MiB")
    ap.add_argument("--paths", default="", help="links to try (default 1 to the GPUs)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--chunk-mib", type=int, default=2, help="chunk size (the engine's default is 8)")
    ap.add_argument("--ways", default="events,target", help="relay ways to try: events, slots, target")
    args = ap.parse_args()
    global CHUNK
    CHUNK = args.chunk_mib * MiB
    n_gpu = torch.cuda.device_count()
    if n_gpu < 2:
        raise SystemExit("relay_floor: needs 2 GPUs")
    sizes = [int(s) * MiB for s in args.sizes.split(",")]
    paths = [int(p) for p in args.paths.split(",")] if args.paths else list(range(1, n_gpu + 1))
    ways = args.ways.split(",")
    unknown = sorted(set(ways) - {"events", "slots", "target", "own", "separate"})
    if unknown:
        raise SystemExit(
            f"relay_floor: --ways: unknown {', '.join(unknown)}; expected events, slots, target, own or separate"
        )
    rt = Runtime()
    rt.enable_peer_access(list(range(n_gpu)))
    top = max(sizes)
    g = torch.Generator().manual_seed(7)
    host = torch.randint(0, 256, (top,), dtype=torch.uint8, generator=g).pin_memory()
    host_out = torch.empty(top, dtype=torch.uint8, pin_memory=True)
    dev0 = torch.randint(0, 256, (top,), dtype=torch.uint8, generator=g).to("cuda:0")
    dev0_in = torch.empty(top, dtype=torch.uint8, device="cuda:0")
    staging = {
        r: [torch.empty(CHUNK, dtype=torch.uint8, device=f"cuda:{r}") for _ in range(2)] for r in range(n_gpu)
    }
    streams = {r: [torch.cuda.Stream(r) for _ in range(2)] for r in range(n_gpu)}
    # The "target" way's NVLink hops: two streams of GPU 0 per relay.
    nvlink0 = {r: [torch.cuda.Stream(0) for _ in range(2)] for r in range(1, n_gpu)}
    gate = torch.cuda.Stream(0)
    # The "own" and "separate" ways: each GPU's share in its own memory, and
    # (separate) each link's host buffer of its own.
    share_top = (
        (top + 1) // 2 if any(w in ("own", "separate") for w in ways) else 0
    )  # a share of 2 links or more
    own_dev = [
        torch.randint(0, 256, (share_top,), dtype=torch.uint8, generator=g).to(f"cuda:{r}")
        for r in range(n_gpu)
    ]
    own_in = [torch.empty(share_top, dtype=torch.uint8, device=f"cuda:{r}") for r in range(n_gpu)]
    sep_host = [
        torch.randint(0, 256, (share_top,), dtype=torch.uint8, generator=g).pin_memory() for _ in range(n_gpu)
    ]
    sep_out = [torch.empty(share_top, dtype=torch.uint8, pin_memory=True) for _ in range(n_gpu)]

    def run(to_device, size, p, way):
        """One copy over links 0..p-1; returns (seconds, [seconds per link])."""
        share = (size + p - 1) // p
        release = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(gate):
            # About 1 ms and 0.1 ms per chunk: every call below is queued before it ends.
            torch.cuda._sleep(2_000_000 + 200_000 * (size // CHUNK))
            release.record(gate)
        t0 = time.perf_counter()
        starts, ends = [], []
        for link in range(p):
            lo, hi = link * share, min(size, (link + 1) * share)
            s = streams[link]
            st = torch.cuda.Event(enable_timing=True)
            for q in s + nvlink0.get(link, []):
                q.wait_event(release)
            st.record(s[0])
            with torch.cuda.device(link):
                if way in ("own", "separate"):  # no relay: the link's own GPU, 2 MiB chunks
                    for at in range(lo, hi, CHUNK):
                        n = min(CHUNK, hi - at)
                        off = at - lo
                        if way == "own":
                            h_in, h_out = host.data_ptr() + at, host_out.data_ptr() + at
                        else:
                            h_in, h_out = sep_host[link].data_ptr() + off, sep_out[link].data_ptr() + off
                        if to_device:
                            rt.copy(own_in[link].data_ptr() + off, h_in, n, s[0])
                        else:
                            rt.copy(h_out, own_dev[link].data_ptr() + off, n, s[0])
                elif link == 0:  # the own link: one copy
                    if hi > lo:
                        if to_device:
                            rt.copy(dev0_in.data_ptr() + lo, host.data_ptr() + lo, hi - lo, s[0])
                        else:
                            rt.copy(host_out.data_ptr() + lo, dev0.data_ptr() + lo, hi - lo, s[0])
                else:
                    hop_done = [None, None]
                    freed = [None, None]
                    for k, at in enumerate(range(lo, hi, CHUNK)):
                        n = min(CHUNK, hi - at)
                        slot = k % 2
                        buf = staging[link][slot].data_ptr()
                        src_ptr = host.data_ptr() + at if to_device else dev0.data_ptr() + at
                        dst_ptr = dev0_in.data_ptr() + at if to_device else host_out.data_ptr() + at
                        if way == "slots":
                            q = s[slot]
                            rt.copy(buf, src_ptr, n, q)
                            rt.copy(dst_ptr, buf, n, q)
                            continue
                        first, second = (s[0], s[1]) if to_device else (s[1], s[0])
                        if way == "target":
                            t0s = nvlink0[link][slot]
                            first, second = (s[0], t0s) if to_device else (t0s, s[0])
                        if freed[slot] is not None:
                            first.wait_event(freed[slot])
                        rt.copy(buf, src_ptr, n, first)
                        hop_done[slot] = torch.cuda.Event()
                        hop_done[slot].record(first)
                        second.wait_event(hop_done[slot])
                        rt.copy(dst_ptr, buf, n, second)
                        freed[slot] = torch.cuda.Event()
                        freed[slot].record(second)
                    s[0].wait_stream(s[1])
                    for q in nvlink0[link]:
                        s[0].wait_stream(q)
            en = torch.cuda.Event(enable_timing=True)
            en.record(s[0])
            starts.append(st)
            ends.append(en)
        queued = time.perf_counter() - t0
        for e in ends:
            gate.wait_event(e)
        done = torch.cuda.Event(enable_timing=True)
        done.record(gate)
        done.synchronize()
        for r in range(p):
            torch.cuda.synchronize(r)
        per_link = [st.elapsed_time(en) / 1e3 for st, en in zip(starts, ends)]
        return release.elapsed_time(done) / 1e3, per_link, queued

    def checked(to_device, size, p, way):
        """Every byte of the last run against its source."""
        if way not in ("own", "separate"):
            if to_device:
                return torch.equal(dev0_in[:size].cpu(), host[:size])
            return torch.equal(host_out[:size], dev0[:size].cpu())
        share = (size + p - 1) // p
        for link in range(p):
            lo, hi = link * share, min(size, (link + 1) * share)
            n = hi - lo
            if n <= 0:
                continue
            if to_device:
                src = host[lo:hi] if way == "own" else sep_host[link][:n]
                if not torch.equal(own_in[link][:n].cpu(), src):
                    return False
            else:
                got = host_out[lo:hi] if way == "own" else sep_out[link][:n]
                if not torch.equal(got, own_dev[link][:n].cpu()):
                    return False
        return True

    print(
        f"relay_floor: {n_gpu} GPUs, {torch.cuda.get_device_name(0)}; copies queued ahead, released at once; {CHUNK // MiB} MiB chunks"
    )
    for to_device in (True, False):
        name = "host to GPU 0" if to_device else "GPU 0 to host"
        for size in sizes:
            for p in paths:
                for way in ways if p > 1 else ("plain",):
                    if to_device:
                        dev0_in[:size].fill_(0x5A)
                        for b in own_in:
                            b.fill_(0x5A)
                    else:
                        host_out[:size].fill_(0x5A)
                        for b in sep_out:
                            b.fill_(0x5A)
                    times, links, host_s = [], [], []
                    for i in range(args.reps + 1):
                        t, per, q = run(to_device, size, p, way)
                        if i:
                            times.append(t)
                            links.append(per)
                            host_s.append(q)
                    ok = checked(to_device, size, p, way)
                    t = statistics.median(times)
                    per = [statistics.median(x[i] for x in links) * 1e6 for i in range(p)]
                    print(
                        f"{name}: {size // MiB:5d} MiB {p} links {way:6s} {size / t / 1e9:7.1f} GB/s"
                        f" ({t * 1e6:7.1f} us; links {' '.join(f'{x:.0f}' for x in per)} us)"
                        f" bytes {'ok' if ok else 'WRONG'}; queued in {max(host_s) * 1e6:.0f} us"
                    )


if __name__ == "__main__":
    main()

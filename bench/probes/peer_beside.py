"""How fast is an unrelated GPU 1 -> GPU 0 peer copy beside the multipath engine?

The benchmark's contention step read 0.0-10.4 GB/s for 16 MB peer copies
from GPU 1 into GPU 0 while the engine relayed host-to-GPU-0 copies through
GPU 1, and only 92-124 GB/s alone, on hosts where others gave 261-301 alone.
This times the same peer copies, each between events on the stream that
copies it, in one process:

- alone, as torch copies them (copy_ between GPUs, which also orders the
  copy with both GPUs' current streams) and as one cudaMemcpyAsync;
- beside plain host-to-GPU copies into GPU 1 (its host link busy) and into
  GPU 0;
- beside another stream's peer copies GPU 1 -> GPU 0;
- beside the engine's host-to-GPU-0 copies over GPU 0 and 1 (relays through
  GPU 1), own link first and relay first.

Each background case queues its work first, then, after a 2 ms sleep on the
peer stream (so the background runs by then), 40 peer copies; the line gives
the peer copies' median, lowest and highest GB/s and how many of them
finished while the background still ran.

    python bench/probes/peer_beside.py
"""

import statistics

import ferry.multipath as mp
import torch
from ferry.bench.multipath import Runtime

MiB = 1 << 20
PEER = 16 * MiB
BULK = 256 * MiB
COUNT = 40


def main():
    n = torch.cuda.device_count()
    if n < 2:
        raise SystemExit("peer_beside: needs 2 GPUs")
    rt = Runtime()
    print(
        f"peer_beside: {n} GPUs, {torch.cuda.get_device_name(0)}; torch sees peer access 1->0: "
        f"{torch.cuda.can_device_access_peer(1, 0)}; 16 MiB copies GPU 1 -> GPU 0"
    )
    peer_src = torch.randint(0, 256, (PEER,), dtype=torch.uint8, device="cuda:1")
    peer_dst = torch.empty(PEER, dtype=torch.uint8, device="cuda:0")
    host = torch.randint(0, 256, (BULK,), dtype=torch.uint8).pin_memory()
    bulk = {d: torch.empty(BULK, dtype=torch.uint8, device=f"cuda:{d}") for d in (0, 1)}
    other_src = torch.randint(0, 256, (PEER,), dtype=torch.uint8, device="cuda:1")
    other_dst = torch.empty(PEER, dtype=torch.uint8, device="cuda:0")
    p1 = torch.cuda.Stream(1)
    sleep_cycles = int(2e-3 * torch.cuda.get_device_properties(1).clock_rate * 1e3)
    with torch.cuda.device(1), torch.cuda.stream(p1):
        torch.cuda._sleep(1)  # loaded before any copy holds the stream

    def peer_copies(how, lead=True):
        """COUNT peer copies on p1 after a `lead` sleep, each between events: [(start, end)]."""
        evs = []
        with torch.cuda.device(1):
            if lead:
                with torch.cuda.stream(p1):
                    torch.cuda._sleep(sleep_cycles)
            for _ in range(COUNT):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(p1)
                if how == "torch":
                    with torch.cuda.stream(p1):
                        peer_dst.copy_(peer_src, non_blocking=True)
                else:
                    rt.copy(peer_dst.data_ptr(), peer_src.data_ptr(), PEER, p1)
                b.record(p1)
                evs.append((a, b))
        return evs

    def sync_all():
        for d in range(n):
            torch.cuda.synchronize(d)

    def report(label, evs, background_end=None):
        sync_all()
        rates = [PEER / (a.elapsed_time(b) * 1e-3) / 1e9 for a, b in evs]
        inside = ""
        if background_end is not None:
            first = evs[0][0]
            end_ms = first.elapsed_time(background_end)
            inside = (
                f"; {sum(1 for a, b in evs if first.elapsed_time(b) <= end_ms)} of {COUNT} ended beside it"
            )
        print(
            f"  {label:46s} median {statistics.median(rates):6.1f} GB/s, "
            f"lowest {min(rates):6.1f}, highest {max(rates):6.1f}{inside}"
        )

    for how in ("torch", "memcpy"):
        peer_copies(how, lead=False)  # warm-up
        report(f"alone ({how})", peer_copies(how, lead=False))

    def beside(label, background):
        """`background()` queues work and returns an event recorded after its
        last piece on GPU 1, or None where that is not GPU 1's."""
        sync_all()
        end = background()
        evs = peer_copies("memcpy")
        report(label, evs, end)

    def h2d_into(d):
        def go():
            s = torch.cuda.Stream(d)
            with torch.cuda.device(d), torch.cuda.stream(s):
                for _ in range(4):
                    bulk[d].copy_(host, non_blocking=True)
            if d != 1:
                return None  # events of two GPUs do not compare
            e = torch.cuda.Event(enable_timing=True)
            e.record(s)
            return e

        return go

    def other_peer():
        s = torch.cuda.Stream(1)
        for _ in range(3 * COUNT):
            rt.copy(other_dst.data_ptr(), other_src.data_ptr(), PEER, s)
        e = torch.cuda.Event(enable_timing=True)
        e.record(s)
        return e

    beside("beside host copies into GPU 1", h2d_into(1))
    beside("beside host copies into GPU 0", h2d_into(0))
    beside("beside another stream's peer copies", other_peer)
    for own_first in (True, False):
        eng = mp.Engine(devices=[0, 1], own_link_first=own_first)
        s0 = torch.cuda.Stream(0)
        eng.copy(bulk[0], host, stream=s0)  # warm-up: the relays' first chunks
        sync_all()
        before = eng.bytes_by_link()

        def engine_copies(eng=eng, s0=s0):
            for _ in range(4):
                eng.copy(bulk[0], host, stream=s0)
            return None

        beside(f"beside the engine ({'own link first' if own_first else 'relay first'})", engine_copies)
        moved = [b - a for a, b in zip(before, eng.bytes_by_link())]
        print(f"    the engine's bytes by link: {moved}")
        eng.close()
    report("alone again (memcpy)", peer_copies("memcpy", lead=False))


if __name__ == "__main__":
    main()

"""Workers for the SM path, algo "sm" (each returns a list of failure
strings; an empty list is a pass)."""

from __future__ import annotations

import os
import time
import zlib

from _checks import (
    SM_BYTES,
    check_collectives,
    check_repeats,
    checker,
    expecter,
    init,
    rand_bytes,
)
from _workers_prelaunch import run_prepared_all_gather


def _sm_span_format_stress(torch, comm, buf, rank, world, check, calls=50, replays=400) -> list:
    """20,000 back-to-back SM-path broadcasts of 1 MiB (the format with one
    flag per peer and block) from a CUDA graph: a rank that finishes a call
    goes straight into the next and overwrites its flags, which a slower
    peer's block must still accept (sm_path_flag_passes; without that, a
    sweep stopped once in about 10,000 calls). Bounded by the kernel's own
    timeout; the output is checked at the end."""
    import time

    dev, n = buf.device, 1 << 20
    out = buf[:n]
    src = rand_bytes(torch, zlib.crc32(b"sm-stress"), n, dev)
    if rank == 0:
        out.copy_(src)
    else:
        out.fill_(0xCC)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(s):
        with torch.cuda.graph(graph, stream=s):
            for _ in range(calls):
                comm.broadcast(out, None, root=0, algo="sm")
    t0 = time.monotonic()
    try:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
        comm.synchronize()
    except Exception as exc:  # noqa: BLE001
        return [f"rank {rank}: {calls * replays} SM-path broadcasts of 1 MiB: {exc!r}"]
    check(f"{calls * replays} SM-path broadcasts of 1 MiB in {time.monotonic() - t0:.2f} s", out, src)
    del graph
    return []


def sm_path(rank: int, world: int, port: int) -> list:
    """algo "sm" (one SM kernel per call, through the peers' windows): the
    correctness matrix within its size limit, 1,000 back-to-back calls,
    alternating streams, interleaved with copy-engine calls in a CUDA graph
    replayed 2,000 times, prepared with every trigger, all_to_allv with new
    random counts every call, the errors it must give, and a peer that calls
    with another size (bounded, named)."""
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"  # prelaunch below (see prelaunch_and_graphs)
    import ferry
    import torch

    comm = init(rank, world, port, timeout=60)
    dev = torch.device("cuda", rank)
    fails = []
    check = checker(torch, dev, rank, fails)
    expect = expecter(ferry, fails, prefix=f"rank {rank}: ")

    try:
        buf = comm.alloc((world * 1000 * 4096 * 2,), torch.uint8)  # check_repeats: 1,000 calls of 4 KB blocks
        fails += check_collectives(torch, comm, [rank], [dev], world, [buf], algos=("sm",))
        # Both sides of the low-latency format's limit (64 KiB per block), one
        # call after another on the same windows.
        fails += check_collectives(
            torch,
            comm,
            [rank],
            [dev],
            world,
            [buf],
            dtypes=("uint8",),
            sizes=(65536, 65537, 65535),
            a2a_sizes=(65536, 65537),
            algos=("sm",),
        )
        fails += check_repeats(torch, comm, [rank], [dev], world, [buf], algo="sm")
        streams = [torch.cuda.Stream(device=dev) for _ in range(2)]
        fails += check_repeats(
            torch, comm, [rank], [dev], world, [buf], reps=200, streams=[streams], algo="sm"
        )

        # A graph mixing the SM path and copy engines, replayed 2,000 times.
        n = 4096 + 5
        ag_out, ag_in = buf[: world * n], torch.empty(n, dtype=torch.uint8, device=dev)
        a2a_out = buf[world * n : 2 * world * n]
        a2a_in = torch.empty(world * n, dtype=torch.uint8, device=dev)
        ce_out = buf[2 * world * n : 3 * world * n]
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream(device=dev)
        with torch.cuda.stream(s):
            with torch.cuda.graph(graph, stream=s):
                comm.all_gather(ag_out, ag_in, algo="sm")
                comm.all_gather(ce_out, ag_in, algo="b2b")
                comm.all_to_all(a2a_out, a2a_in, algo="sm")
        for block in range(2):
            seed = lambda q: zlib.crc32(f"smgraph/{block}/{q}".encode())
            ag_in.copy_(rand_bytes(torch, seed(rank), n, dev))
            a2a_in.copy_(rand_bytes(torch, seed(rank) + 1, world * n, dev))
            torch.cuda.synchronize()
            for _ in range(1000):
                graph.replay()
            torch.cuda.synchronize()
            gathered = torch.cat([rand_bytes(torch, seed(q), n, dev) for q in range(world)])
            check(f"graph sm all_gather after {(block + 1) * 1000} replays", ag_out, gathered)
            check(f"graph b2b all_gather after {(block + 1) * 1000} replays", ce_out, gathered)
            check(
                f"graph sm all_to_all after {(block + 1) * 1000} replays",
                a2a_out,
                torch.cat(
                    [
                        rand_bytes(torch, seed(q) + 1, world * n, dev)[rank * n : (rank + 1) * n]
                        for q in range(world)
                    ]
                ),
            )
        del graph
        comm.synchronize()
        fails += _sm_span_format_stress(torch, comm, buf, rank, world, check)

        # Prepared: every trigger, each gate.
        side = torch.cuda.Stream(device=dev)
        with torch.cuda.stream(side):
            word = torch.zeros(1, dtype=torch.int64, device=dev)
            ferry._native.hooks().launch_trigger_kernel(word.data_ptr(), 1, 1, side.cuda_stream)
        side.synchronize()
        h = comm.prepare("all_gather", ag_out, ag_in, algo="sm")
        run_prepared_all_gather(torch, ferry, h, ag_out, ag_in, side, rank, world, 15, "smpre", check)
        h.release()
        comm.synchronize()

        # What it refuses, by name.
        big = SM_BYTES + 1
        expect(
            r"all_gather: algo 'sm' moves at most FERRY_SM_BYTES = 1048576 bytes per peer; this call moves 1048577",
            lambda: comm.all_gather(
                buf[: world * big], torch.empty(big, dtype=torch.uint8, device=dev), algo="sm"
            ),
        )
        # all_to_allv (MoE dispatch): new random counts, zeros included, every call.
        for step in range(20):
            counts = [
                [
                    zlib.crc32(f"v/{step}/{q}/{t}".encode()) % 5000 * (((q + t + step) % 4) != 0)
                    for t in range(world)
                ]
                for q in range(world)
            ]
            send = sum(counts[rank])
            recv = sum(counts[q][rank] for q in range(world))
            seed = lambda q: zlib.crc32(f"v/{step}/{q}".encode())  # noqa: E731
            src = rand_bytes(torch, seed(rank), send + 1, dev)[1:]  # unaligned input
            out = buf[1 : 1 + recv]  # unaligned output
            out.fill_(0xA5)
            comm.all_to_allv(out, src, counts, algo="sm")
            parts = []
            for q in range(world):
                start = sum(counts[q][:rank])
                parts.append(
                    rand_bytes(torch, seed(q), sum(counts[q]) + 1, dev)[1:][start : start + counts[q][rank]]
                )
            check(f"sm all_to_allv step {step}", out, torch.cat(parts))
        expect(
            r"algo 'sm' moves at most FERRY_SM_BYTES = 1048576 bytes per peer; this call moves 1048577",
            lambda: comm.all_to_allv(
                buf[: world * (SM_BYTES + 1)],
                torch.zeros(world * (SM_BYTES + 1), dtype=torch.uint8, device=dev),
                [[SM_BYTES + 1] * world for _ in range(world)],
                algo="sm",
            ),
        )
        # A reduce_scatter result one float past the window: the bound names both sizes.
        expect(
            r"algo 'sm' moves at most FERRY_SM_BYTES = 1048576 bytes per peer; this call moves 1048580",
            lambda: comm.reduce_scatter(
                torch.empty(SM_BYTES // 4 + 1, device=dev),
                torch.empty(world * (SM_BYTES // 4 + 1), device=dev),
                algo="sm",
            ),
        )
        comm.synchronize()
        comm.free(buf)
    finally:
        comm.close()

    # A peer that calls with another size: bounded, named, and close() returns.
    # Both in the low-latency format (100 and 200 bytes), then one in each
    # (100 and 20,000: each side waits for a signal the other never sends).
    for i, sizes in enumerate(((100, 200), (100, 20000))):
        os.environ["FERRY_PORT"] = str(port + 1 + i)
        comm = ferry.init(rank=rank, world=world, device=rank, timeout=3)
        try:
            out = comm.alloc((world * max(sizes),), torch.uint8)
            m = sizes[0] if rank == 0 else sizes[1]
            t0 = time.monotonic()
            expect(
                r"rank \d",
                lambda: (
                    comm.all_gather(
                        out[: world * m], torch.zeros(m, dtype=torch.uint8, device=dev), algo="sm"
                    ),
                    comm.synchronize(),
                ),
            )
            took = time.monotonic() - t0
            if took > 20:
                fails.append(
                    f"rank {rank}: a mismatched sm call {sizes} took {took:.1f} s to report (timeout 3 s)"
                )
        finally:
            t0 = time.monotonic()
            comm.close()
            if time.monotonic() - t0 > 20:
                fails.append(
                    f"rank {rank}: close() after the mismatch {sizes} took {time.monotonic() - t0:.1f} s"
                )
    return fails

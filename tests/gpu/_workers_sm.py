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


def two_shot_bytes() -> int:
    """FERRY_SM_TWO_SHOT_BYTES as the communicator reads it."""
    return int(os.environ.get("FERRY_SM_TWO_SHOT_BYTES") or (1 << 20))


def check_two_shot(torch, comm, ranks, devs, world, bufs, streams=None, window=SM_BYTES) -> list:
    """all_reduce on the SM path in two shots (3 or more ranks, buffers from
    FERRY_SM_TWO_SHOT_BYTES; each rank reduces one part, then sends it to every
    peer): random values against the host's reduction in rank order, every
    byte, poisoned outputs; uneven parts, in place, an offset off 16 bytes,
    parts at the window's edge and past it (in rounds); one-shot calls between
    two-shot ones on the same slots without a wait (a two-shot call counts
    R + 1 calls for R rounds), rounds followed by the other forms; a CUDA graph
    of both forms replayed on new data. `bufs`: one
    registered uint8 buffer per local rank of at least 4 x (world x window +
    512) bytes; `ranks`/`devs` as in check_collectives (one process per rank,
    or every rank local)."""
    from _workers_reduce import _randoms, _reduced

    local = len(ranks) > 1
    fails = []
    region = (world * window + 511) // 256 * 256

    def part(nbytes):
        return (-(-nbytes // world) + 15) // 16 * 16

    def sync():
        for d in {d.index for d in devs}:
            torch.cuda.synchronize(d)

    def call(outs, ins, op):
        kw = {"op": op, "algo": "sm"}
        if streams is not None:
            kw["stream"] = streams if local else streams[0]
        comm.all_reduce(outs if local else outs[0], ins if local else ins[0], **kw)

    def case(tag, slot, dtype, op, count, in_place=False, offset=0):
        """Inputs (random, per rank), poisoned outputs in region `slot` of
        the buffers at `offset` elements, and the expected result."""
        elem = torch.empty((), dtype=dtype).element_size()
        xs = [
            _randoms(torch, zlib.crc32(f"2shot/{tag}/{world}/{q}".encode()), count, devs[i], dtype)
            for i, q in enumerate(ranks)
        ]
        full = [
            _randoms(torch, zlib.crc32(f"2shot/{tag}/{world}/{q}".encode()), count, devs[0], dtype).cpu()
            for q in range(world)
        ]
        outs = []
        for i, b in enumerate(bufs):
            o = b[slot * region + offset * elem : slot * region + (offset + count) * elem].view(dtype)
            o.view(torch.uint8).fill_(0xA5)
            if in_place:
                o.copy_(xs[i])
            outs.append(o)
        ins = outs if in_place else xs
        return outs, ins, _reduced(torch, full, op)

    def verify(label, outs, want):
        sync()
        for q, o in zip(ranks, outs):
            bad = int((o.cpu().view(torch.uint8) != want.view(torch.uint8)).sum().item())
            if bad:
                fails.append(
                    f"two-shot {label}: rank {q}: {bad} wrong bytes of {want.numel() * want.element_size()}"
                )

    f32, bf16, i32, f16 = torch.float32, torch.bfloat16, torch.int32, torch.float16
    cases = [
        # (tag, dtype, op, count, in place, offset in elements)
        ("edge-uneven", f32, "sum", (world * window - 52) // 4, False, 0),
        ("bf16-max-inplace", bf16, "max", max(two_shot_bytes(), world * window // 2) // 2 + 7, True, 0),
        ("i32-window", i32, "sum", world * window // 4, False, 1),
        ("f16-min-threshold", f16, "min", two_shot_bytes() // 2, False, 3),
        # Just under the threshold: one shot (the whole buffer to every peer), where the window holds it.
        ("f16-min-below", f16, "min", two_shot_bytes() // 2 - 8, False, 0),
    ]
    if two_shot_bytes() - 16 > window:
        cases.pop()
    for tag, dtype, op, count, in_place, offset in cases:
        outs, ins, want = case(tag, 0, dtype, op, count, in_place, offset)
        sync()
        try:
            call(outs, ins, op)
            comm.synchronize()
        except Exception as exc:  # noqa: BLE001
            fails.append(f"two-shot {tag}: raised {exc!r}")
            continue
        verify(tag, outs, want)

    # Both forms back to back on the same slots, three rounds, no wait between calls.
    mix = [
        ("mix-two-shot-a", f32, "sum", (world * window - 4096) // 4),
        ("mix-ll", bf16, "sum", 4099),
        ("mix-one-shot", f32, "max", 70001),
        ("mix-two-shot-b", i32, "sum", max(two_shot_bytes(), world * 150001) // 4 + 3),
    ]

    def back_to_back(label, staged) -> bool:
        """Calls every staged (label, outs, ins, want, op) without a wait
        between them, then checks each; False when a call raised."""
        sync()
        try:
            for _, outs, ins, _, op in staged:
                call(outs, ins, op)
            comm.synchronize()
        except Exception as exc:  # noqa: BLE001
            fails.append(f"two-shot {label}: raised {exc!r}")
            return False
        for case_label, outs, _, want, _ in staged:
            verify(case_label, outs, want)
        return True

    for rnd in range(3):
        staged = []
        for slot, (tag, dtype, op, count) in enumerate(mix):
            outs, ins, want = case(f"{tag}/{rnd}", slot, dtype, op, count)
            staged.append((f"{tag} round {rnd}", outs, ins, want, op))
        if not back_to_back(f"mix round {rnd}", staged):
            break

    # One process per rank: a graph of a two-shot and a one-shot call,
    # replayed on new data each time (every rank local: calls from one thread
    # cannot be captured rank by rank).
    if not local:
        dev = devs[0]
        g_outs, g_ins, _ = case("graph", 0, f32, "sum", (world * window - 4096) // 4)
        s_outs, s_ins, _ = case("graph-small", 1, f32, "sum", 70001)
        sync()
        graph, gs = torch.cuda.CUDAGraph(), torch.cuda.Stream(device=dev)

        def data(rep, q, n):
            return _randoms(torch, zlib.crc32(f"2shot/graph/{rep}/{q}/{n}".encode()), n, dev, f32)

        try:
            with torch.cuda.stream(gs):
                with torch.cuda.graph(graph, stream=gs):
                    comm.all_reduce(g_outs[0], g_ins[0], algo="sm")
                    comm.all_reduce(s_outs[0], s_ins[0], algo="sm")
            for rep in range(3):
                for x, o in ((g_ins[0], g_outs[0]), (s_ins[0], s_outs[0])):
                    x.copy_(data(rep, ranks[0], x.numel()))
                    o.view(torch.uint8).fill_(0xA5)
                sync()
                graph.replay()
                sync()
                for x, o in ((g_ins[0], g_outs[0]), (s_ins[0], s_outs[0])):
                    want = _reduced(torch, [data(rep, q, x.numel()).cpu() for q in range(world)], "sum")
                    verify(f"graph replay {rep} ({x.numel()} floats)", [o], want)
        except Exception as exc:  # noqa: BLE001
            fails.append(f"two-shot graph: raised {exc!r}")
        comm.synchronize()
        del graph

    # Parts of 2.5 windows, uneven: three rounds of a window each, the last one short; then in place.
    count = (world * window * 5 // 2 + 44) // 4
    for in_place in (False, True):
        outs, ins, want = case(f"rounds/{in_place}", 0, f32, "sum", count, in_place)
        sync()
        try:
            call(outs, ins, "sum")
            comm.synchronize()
            verify(f"rounds ({part(count * 4)} B parts, {window} B window, in place {in_place})", outs, want)
        except Exception as exc:  # noqa: BLE001
            fails.append(f"two-shot in rounds (in place {in_place}): raised {exc!r}")
    comm.synchronize()

    # Back to back, no wait between calls: two rounds (parts of 1.5 windows),
    # then calls of the other forms on the same slots, whose first pushes use
    # the parity of the rounds' last one; then two rounds in place.
    two_rounds = (world * window * 3 // 2 + 20) // 4
    sequences = [
        [
            ("r2", 0, f32, "sum", two_rounds, False),
            ("r2-ll", 2, bf16, "sum", 4099, False),
            ("r2-one-shot", 3, f32, "max", 70001, False),
        ],
        [
            ("r2-in-place", 0, i32, "sum", two_rounds, True),
            ("r2-one-shot-b", 2, f32, "min", 70001, False),
            ("r1", 3, f32, "sum", (world * window - 4096) // 4, False),
        ],
    ]
    for n, seq in enumerate(sequences):
        staged = []
        for tag, slot, dtype, op, count, in_place in seq:
            outs, ins, want = case(f"seq/{tag}", slot, dtype, op, count, in_place)
            staged.append((f"sequence {n}: {tag}", outs, ins, want, op))
        if not back_to_back(f"sequence {n}", staged):
            break
    return fails


def two_shot_processes(rank: int, world: int, port: int) -> list:
    """check_two_shot with one process per rank, rank r on GPU r % N
    (FERRY_SHARED_GPUS=1 where ranks outnumber the GPUs, set by the caller)."""
    import torch
    from _checks import SAFE_ENV

    os.environ.update(SAFE_ENV)
    os.environ["FERRY_PORT"] = str(port)
    import ferry

    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    comm = ferry.init(rank=rank, world=world, device=dev.index, timeout=60)
    try:
        buf = comm.alloc((4 * (world * SM_BYTES + 512),), torch.uint8)
        return check_two_shot(torch, comm, [rank], [dev], world, [buf])
    finally:
        comm.close()


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
        if world >= 3:
            fails += check_two_shot(torch, comm, [rank], [dev], world, [buf])

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

"""reduce_scatter and all_reduce in rounds (the reduction of one round beside
the copy engines' next round; FERRY_REDUCE_ROUND_BYTES), byte-exact against
references computed in ferry's order: every rank's block in rank order, in
float for 16-bit floats, rounded once."""

from __future__ import annotations

import os
import sys
import time
import zlib

from _checks import checker, expecter, init, ints

DTYPES = ("float32", "bfloat16", "float16", "float64", "int32", "int64")


def _randoms(torch, seed: int, n: int, dev, dtype):
    """Random values of `dtype`: normal floats (sums round), integers over a wide range."""
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(n, device=dev, generator=g).to(dtype)
    return torch.randint(-(1 << 20), 1 << 20, (n,), device=dev, generator=g).to(dtype)


def _reduced(torch, blocks: list, op: str):
    """What ferry computes: every rank's block in rank order, in float for
    16-bit floats, rounded once."""
    wide = torch.float32 if blocks[0].dtype in (torch.bfloat16, torch.float16) else blocks[0].dtype
    acc = blocks[0].to(wide)
    for b in blocks[1:]:
        b = b.to(wide)
        acc = acc + b if op == "sum" else torch.maximum(acc, b) if op == "max" else torch.minimum(acc, b)
    return acc.to(blocks[0].dtype)


def reductions_in_rounds(rank: int, world: int, port: int) -> list:
    # Rounds of 4 KB per rank's result: a call of 400 KB runs about 100 of them.
    os.environ["FERRY_REDUCE_ROUND_BYTES"] = "4096"
    import ferry
    import torch

    comm = init(rank, world, port, timeout=60)
    dev = torch.device("cuda", rank)
    fails = []
    check = checker(torch, dev, rank, fails)
    ar_buf = comm.alloc(((world * 100003 + 64) * 8,), torch.uint8)
    try:
        # reduce_scatter: every dtype and op, random data (sums round), odd
        # counts (the vector kernel's element tail), inputs at an offset of one
        # element (the element kernel) and aligned, both signal kinds; and the
        # SM path (algo "sm", one kernel): the low-latency format up to 64 KB
        # per peer, flags above.
        for dtype_name in DTYPES:
            dtype = getattr(torch, dtype_name)
            for count in (1, 1003, 4099, 100003):
                for skew in (0, 1):
                    for op in ("sum", "max", "min"):
                        for algo in ("auto", "sm"):
                            label = f"reduce_scatter {dtype_name} n={count} skew={skew} {op} {algo}"
                            print(label, file=sys.stderr, flush=True)  # where a hung run got to
                            seed = lambda s: zlib.crc32(f"{label}/{s}".encode()) % (1 << 31)  # noqa: B023
                            full = [
                                _randoms(torch, seed(s), world * count + skew, dev, dtype)[skew:]
                                for s in range(world)
                            ]
                            out = torch.empty(count + skew, dtype=dtype, device=dev)[skew:]
                            out.view(torch.uint8).fill_(0xA5)
                            signals = "sm" if count == 4099 and algo == "auto" else "auto"
                            comm.reduce_scatter(out, full[rank], op=op, signals=signals, algo=algo)
                            blocks = [x[rank * count : (rank + 1) * count] for x in full]
                            check(label, out, _reduced(torch, blocks, op))
        # all_reduce: out of place and in place, uneven counts, registered
        # output, random data reduced in rank order on every rank; the SM path
        # too (up to its 1 MiB window: the whole buffer goes to every peer).
        for dtype_name in ("float32", "bfloat16", "int64"):
            dtype = getattr(torch, dtype_name)
            es = torch.empty((), dtype=dtype).element_size()
            for count in (7, world * 4096 + 3, 100003):
                for algo in ("auto", "sm"):
                    for op in ("sum", "max"):
                        label = f"all_reduce {dtype_name} n={count} {op} {algo}"
                        print(label, file=sys.stderr, flush=True)
                        seed = lambda s: zlib.crc32(f"{label}/{s}".encode()) % (1 << 31)  # noqa: B023
                        xs = [_randoms(torch, seed(s), count, dev, dtype) for s in range(world)]
                        exp = _reduced(torch, xs, op)
                        ar = ar_buf[: count * es].view(dtype)
                        ar.view(torch.uint8).fill_(0xA5)
                        comm.all_reduce(ar, xs[rank], op=op, algo=algo)
                        check(label, ar, exp)
                        ar.copy_(xs[rank])
                        comm.all_reduce(ar, op=op, algo=algo)
                        check(label + " in place", ar, exp)
        comm.synchronize()
        _repeats_and_graph(torch, comm, rank, world, dev, check)
        # A negative round is refused on every rank alike, before anything is enqueued.
        os.environ["FERRY_REDUCE_ROUND_BYTES"] = "-1"
        expecter(ferry, fails, f"rank {rank}: ")(
            r"FERRY_REDUCE_ROUND_BYTES=-1; expected at least 0",
            lambda: comm.reduce_scatter(torch.empty(3, device=dev), torch.empty(3 * world, device=dev)),
        )
        _default_rounds(torch, comm, rank, world, dev, check)
        # Knobs set apart that make the same rounds (one, on every rank) are no mismatch.
        os.environ["FERRY_REDUCE_ROUND_BYTES"] = str((1 << 20) * (rank + 1))
        same = torch.empty(4096, device=dev).fill_(-1)
        comm.reduce_scatter(same, torch.ones(world * 4096, device=dev), algo="auto", signals="copy")
        check("reduce_scatter, one round from knobs set apart", same, torch.full_like(same, world))
        # Rounds set apart on each rank (4 KiB on rank 0, 8 KiB on rank 1, ...)
        # of a 16 MiB result on copy engines: a mismatch every rank names, not
        # sums of ranges a peer never sent; and within seconds, though 4096
        # rounds fill the stream's queue while the first waits (the host then
        # waits inside CUDA until the watchdog, which watches a call from its
        # first enqueued step, releases the waits round after round). Last: it
        # breaks the communicator.
        os.environ["FERRY_REDUCE_ROUND_BYTES"] = str(4096 * (rank + 1))
        out = torch.empty(4 << 20, device=dev)
        inp = torch.ones(world * (4 << 20), device=dev)

        def apart():
            comm.reduce_scatter(out, inp, algo="auto", signals="copy")
            comm.synchronize()

        t0 = time.monotonic()
        expecter(ferry, fails, f"rank {rank}: ")(
            r"FERRY_REDUCE_ROUND_BYTES\): they must match on every rank", apart
        )
        if time.monotonic() - t0 > 30:
            fails.append(f"rank {rank}: the rounds set apart were named after {time.monotonic() - t0:.0f} s")
    finally:
        comm.close()
    return fails


def _repeats_and_graph(torch, comm, rank, world, dev, check) -> None:
    """The same call with new data five times (ferry replays it from a graph
    from the second), then captured in a torch CUDA graph and replayed."""
    count, dtype = 50003, torch.bfloat16
    inp = torch.empty(world * count, dtype=dtype, device=dev)
    out = torch.empty(count, dtype=dtype, device=dev)

    def fresh(i):
        full = [_randoms(torch, 1000 * i + s, world * count, dev, dtype) for s in range(world)]
        inp.copy_(full[rank])
        out.view(torch.uint8).fill_(0xA5)
        return _reduced(torch, [x[rank * count : (rank + 1) * count] for x in full], "sum")

    for i in range(5):
        exp = fresh(i)
        comm.reduce_scatter(out, inp)
        check(f"reduce_scatter repeat {i}", out, exp)
    comm.reserve_scratch(world * count * 2 + (1 << 20))
    stream = torch.cuda.Stream(device=dev)
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        comm.reduce_scatter(out, inp)
    for i in range(5, 25):
        exp = fresh(i)
        torch.cuda.synchronize(dev)
        graph.replay()
        check(f"reduce_scatter graph replay {i}", out, exp)


def _default_rounds(torch, comm, rank, world, dev, check) -> None:
    """ferry's own rule at a size where it pipelines (128 MiB per rank's result: two rounds)."""
    os.environ["FERRY_REDUCE_ROUND_BYTES"] = "0"
    count = (128 << 20) // 4 + 5
    seed = lambda s: zlib.crc32(f"large/{s}".encode()) % (1 << 31)
    full = [_randoms(torch, seed(s), world * count, dev, torch.float32) for s in range(world)]
    out = torch.empty(count, dtype=torch.float32, device=dev)
    out.view(torch.uint8).fill_(0xA5)
    comm.reduce_scatter(out, full[rank])
    check(
        "reduce_scatter 128 MiB, two rounds",
        out,
        _reduced(torch, [x[rank * count : (rank + 1) * count] for x in full], "sum"),
    )
    del full
    n = world * count
    xs = [ints(torch, seed(100 + s), n, dev, torch.float32) for s in range(world)]
    ar = comm.alloc((n,), torch.float32)
    ar.copy_(xs[rank])
    comm.all_reduce(ar)
    check("all_reduce 128 MiB blocks in place, two rounds", ar, sum(xs))
    comm.synchronize()

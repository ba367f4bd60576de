"""Shared by the GPU test workers (they run inside the test processes, one
per GPU): communicator setup, seeded data, the correctness matrix and the
checkers that collect failure strings."""

from __future__ import annotations

import itertools
import os
import zlib

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# Bytes per rank (all_gather) or per block (all_to_all), odd ones included.
SIZES = (1, 3, 4096, 1000003, (64 << 20) + 1)


A2A_SIZES = (1, 3, 4096, 1000003, (16 << 20) + 1)


# The largest block per peer algo "sm" moves (FERRY_SM_BYTES, 1 MiB by default).
SM_BYTES = int(os.environ.get("FERRY_SM_BYTES") or (1 << 20))


class SmHold:
    """Every SM of each GPU in `devices` held by ferry's SmHolder: spinning
    blocks, on a stream of their own, that take every SM's thread slots, so
    nothing else can run a kernel there. A copy engine needs no SM; a kernel,
    or a copy that CUDA runs as one, does. Create it before the work to
    probe: the holder's kernel is loaded then, not while SMs are held."""

    def __init__(self, torch, devices=None):
        import ferry

        self.torch = torch
        self.devices = list(devices) if devices is not None else [torch.cuda.current_device()]
        self.holders, self.spins = [], []
        for d in self.devices:
            with torch.cuda.device(d):
                self.holders.append(ferry._native.hooks().SmHolder())
                self.spins.append(torch.cuda.Stream(d))

    def finishes(self, enqueue, work, within_s: float = 10.0) -> bool:
        """Whether what `enqueue()` puts on stream `work` finishes within
        `within_s` while every SM is held. The SMs are released before it
        returns and every GPU synchronized, so everything runs to its end."""
        import time

        torch = self.torch
        held = 0
        try:
            for d, h, sp in zip(self.devices, self.holders, self.spins):
                with torch.cuda.device(d):
                    h.hold(sp.cuda_stream, 30.0)
                held += 1
            enqueue()
            done = torch.cuda.Event()
            done.record(work)
            limit = time.monotonic() + within_s
            while not done.query() and time.monotonic() < limit:
                time.sleep(0.001)
            return done.query()
        finally:
            for h in self.holders[:held]:
                h.release()
            for d in self.devices:
                torch.cuda.synchronize(d)


def rand_bytes(torch, seed: int, n: int, dev):
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev, generator=g)


def init(rank: int, world: int, port: int, timeout: float):
    os.environ.update(SAFE_ENV)
    os.environ["FERRY_PORT"] = str(port)
    import ferry
    import torch

    torch.cuda.set_device(rank)
    return ferry.init(rank=rank, world=world, device=rank, timeout=timeout)


def check_collectives(
    torch,
    comm,
    ranks,
    devs,
    world,
    buf,
    dtypes=("uint8", "bfloat16"),
    sizes=SIZES,
    a2a_sizes=A2A_SIZES,
    algos=("b2b", "pcpy", "seq"),
    streams=None,
    repeats=1,
):
    """Runs the correctness matrix for the local ranks `ranks` (one per device
    in `devs`; `buf` is one registered uint8 buffer per local rank) and returns
    failures. Works for one process per GPU (one local rank) and for
    init_local (all ranks local): collectives get lists in the second case.
    `streams`: one per local rank (else the current streams); `repeats`: each
    case set up and run that many times on the same output (a repeated call
    reuses its plan and, from the second, its graph)."""
    local = len(ranks) > 1
    fails = []

    def call(name, outs, ins, **kw):
        if streams is not None:  # the data was written on the current streams
            kw["stream"] = streams
            for d in {d.index for d in devs}:
                torch.cuda.synchronize(d)
        getattr(comm, name)(outs if local else outs[0], ins if local else ins[0], **kw)

    def verify(label, outs, expected):
        for r, o, e in zip(ranks, outs, expected):
            torch.cuda.synchronize(o.device)
            bad = int((o != e).sum().item())
            if bad:
                fails.append(f"rank {r} {label}: {bad} wrong bytes of {e.numel()}")

    cases = []
    for algo in algos:
        for i, n in enumerate(sizes):
            # auto: the own block read back from a peer up to 4 MiB, the kernel above.
            cases.append(("all_gather", algo, n, ("auto", "sm")[i % 2], 0, False))
        cases.append(("all_gather", algo, 1000003, "driver", 1, False))  # odd out offset, cudaMemcpy
        cases.append(("all_gather", algo, 1000003, "peer", 1, False))  # odd out offset, read back
        cases.append(("all_gather", algo, max(sizes), "peer", 0, False))  # read back past auto's cap
        cases.append(("all_gather", algo, 4096 * 3 + 5, "auto", 0, True))  # in-place
        for i, n in enumerate(a2a_sizes):
            # auto: the own block bounces through the next rank's scratch up to 1 MiB.
            cases.append(("all_to_all", algo, n, ("auto", "sm")[i % 2], 0, False))
        cases.append(("all_to_all", algo, 1000003, "auto", 3, False))
        cases.append(("all_to_all", algo, max(a2a_sizes), "peer", 0, False))  # bounce past auto's cap
    for (op, algo, n, lc, off, in_place), dtype_name, rep in itertools.product(cases, dtypes, range(repeats)):
        dtype = getattr(torch, dtype_name)
        elem = torch.empty((), dtype=dtype).element_size()
        nbytes = n * elem
        if algo == "sm" and nbytes > SM_BYTES:
            continue  # refused with a clear error (checked in sm_path)
        total = world * nbytes
        outs, ins, expected = [], [], []
        for r, d, b in zip(ranks, devs, buf):
            out = b[off : off + total]
            seed = lambda q: zlib.crc32(f"{op}/{algo}/{n}/{dtype_name}/{q}".encode())
            if op == "all_gather":
                src = rand_bytes(torch, seed(r), nbytes, d)
                exp = torch.cat([rand_bytes(torch, seed(q), nbytes, d) for q in range(world)])
                out.copy_(rand_bytes(torch, 7 + r, total, d))  # poison
                if in_place:
                    out[r * nbytes : (r + 1) * nbytes].copy_(src)
                    inp = out[r * nbytes : (r + 1) * nbytes]
                else:
                    skew = 3 if elem == 1 else elem  # unaligned bytes; element-aligned for bf16
                    inp = torch.empty(nbytes + skew, dtype=torch.uint8, device=d)[skew:]
                    inp.copy_(src)
            else:
                src = rand_bytes(torch, seed(r), total, d)
                exp = torch.cat(
                    [
                        rand_bytes(torch, seed(q), total, d)[r * nbytes : (r + 1) * nbytes]
                        for q in range(world)
                    ]
                )
                out.copy_(rand_bytes(torch, 7 + r, total, d))
                skew = 3 if elem == 1 else elem
                inp = torch.empty(total + skew, dtype=torch.uint8, device=d)[skew:]
                inp.copy_(src)
            if dtype != torch.uint8 and off == 0:
                out, inp = out.view(dtype), inp.view(dtype) if inp.data_ptr() % elem == 0 else inp
            outs.append(out)
            ins.append(inp)
            expected.append(exp)
        if any(o.dtype != i.dtype for o, i in zip(outs, ins)):
            continue  # an unaligned byte view cannot be viewed as bf16; covered by uint8
        try:
            call(op, outs, ins, algo=algo, local_copy=lc)
            comm.synchronize()
        except Exception as exc:  # noqa: BLE001
            fails.append(f"{op} {algo} n={n} {dtype_name}: raised {exc!r}")
            continue
        verify(
            f"{op} {algo} n={n} {dtype_name} local_copy={lc} offset={off} in_place={in_place} run={rep}",
            [o.view(torch.uint8) for o in outs],
            expected,
        )
    return fails


def check_repeats(torch, comm, ranks, devs, world, buf, reps=1000, n=4096, streams=None, algo="auto"):
    """`reps` back-to-back all-gathers and all-to-alls into distinct slices of the
    registered buffer (so every one is checked), alternating streams if given."""
    local = len(ranks) > 1
    fails = []
    for op in ("all_gather", "all_to_all"):
        inputs = []
        for r, d, b in zip(ranks, devs, buf):
            src = rand_bytes(
                torch, 99 + r + (op == "all_to_all"), reps * (n if op == "all_gather" else world * n), d
            )
            inputs.append(src)
            b[: reps * world * n].fill_(0x5A)
        for i in range(reps):
            o_list, i_list, s_list = [], [], []
            for k, (r, b) in enumerate(zip(ranks, buf)):
                o_list.append(b[i * world * n : (i + 1) * world * n])
                w = n if op == "all_gather" else world * n
                i_list.append(inputs[k][i * w : (i + 1) * w])
                if streams:
                    s_list.append(streams[k][i % len(streams[k])])
            kw = {"stream": (s_list if local else s_list[0])} if streams else {}
            kw["algo"] = algo
            getattr(comm, op)(o_list if local else o_list[0], i_list if local else i_list[0], **kw)
        comm.synchronize()
        for k, (r, d, b) in enumerate(zip(ranks, devs, buf)):
            got = b[: reps * world * n].view(reps, world, n)
            if op == "all_gather":
                exp = torch.stack(
                    [rand_bytes(torch, 99 + q, reps * n, d).view(reps, n) for q in range(world)], dim=1
                )
            else:
                exp = torch.stack(
                    [
                        rand_bytes(torch, 100 + q, reps * world * n, d).view(reps, world, n)[:, r]
                        for q in range(world)
                    ],
                    dim=1,
                )
            bad = int((got != exp).sum().item())
            if bad:
                fails.append(
                    f"rank {r}: {op} {algo} x{reps}{' on alternating streams' if streams else ''}:"
                    f" {bad} wrong bytes"
                )
    return fails


def _same_buffers_shape(op, r, world, n, counts):
    """(elements in, elements out, float32?) of one rank for check_same_buffers."""
    if op == "all_gather":
        return n, world * n, False
    if op == "all_to_all":
        return world * n, world * n, False
    if op == "all_to_allv":
        return sum(counts[r]), sum(counts[q][r] for q in range(world)), False
    if op == "broadcast":
        return n, n, False
    if op == "reduce_scatter":
        return world * n, n, True
    return n, n, True  # all_reduce


def _same_buffers_expected(torch, op, r, world, n, counts, root, src):
    """What rank r's output must hold when rank q's input is src(q, elements)."""
    if op == "all_gather":
        return torch.cat([src(q, n) for q in range(world)])
    if op == "all_to_all":
        return torch.cat([src(q, world * n)[r * n : (r + 1) * n] for q in range(world)])
    if op == "all_to_allv":
        pieces = []
        for q in range(world):
            off = sum(counts[q][:r])
            pieces.append(src(q, sum(counts[q]))[off : off + counts[q][r]])
        return torch.cat(pieces)
    if op == "broadcast":
        return src(root, n)
    if op == "reduce_scatter":
        return sum(src(q, world * n)[r * n : (r + 1) * n] for q in range(world))
    return sum(src(q, n) for q in range(world))  # all_reduce


def check_same_buffers(torch, comm, ranks, devs, world, buf, reps=30, streams=None, captured=False):
    """The training-loop pattern: the same call on the same buffers again and
    again, new data every time. From the second run on, ferry replays such a
    call from a CUDA graph (FERRY_REPLAY_CALLS): every run of every collective
    is checked byte for byte, on alternating streams if given. captured=True
    (one rank per process): each call is captured once into the user's own
    torch CUDA graph, and every run is a replay of it."""
    local = len(ranks) > 1
    fails = []
    n, root = 4099, world - 1
    counts = [[((7 * q + 3 * t) % 11) * 100 + 1 for t in range(world)] for q in range(world)]  # q -> t
    cases = [
        ("all_gather", "b2b", n),
        ("all_gather", "seq", n),
        ("all_gather", "pcpy", n),
        ("all_gather", "b2b", (2 << 20) + 3, "sm"),  # own block by the kernel, on the side stream
        ("all_gather", "pcpy", n, "sm"),
        ("all_to_all", "b2b", n),
        ("all_to_all", "pcpy", n),
        ("all_to_all", "seq", n, "sm"),
        ("all_to_allv", "auto", n),
        ("broadcast", "auto", n),
        ("reduce_scatter", "auto", n),  # the reduction kernel inside the graph
        ("all_reduce", "auto", n),
        ("all_to_all", "auto", n, "in-place"),  # rounds through the scratch, then unpacks
        ("all_gather", "b2b", n, "driver"),  # own block by cudaMemcpyAsync
        # The SM path: one kernel, through the peers' windows (alternate slots per call).
        ("all_gather", "sm", n),
        ("all_to_all", "sm", n),
        ("broadcast", "sm", n),
        ("all_to_allv", "sm", n),
        ("all_to_all", "sm", n, "in-place"),
    ]
    for op, algo, size, *variant in cases:
        in_place = variant == ["in-place"]
        local_copy = variant[0] if variant and not in_place else "auto"
        outs, ins, floats = [], [], False
        for r, d, b in zip(ranks, devs, buf):
            n_in, n_out, floats = _same_buffers_shape(op, r, world, size, counts)
            dtype = torch.float32 if floats else torch.uint8
            outs.append(b[: n_out * (4 if floats else 1)].view(dtype))
            ins.append(outs[-1] if in_place else torch.empty(n_in, dtype=dtype, device=d))
        kw = (
            {"algo": algo, "local_copy": local_copy} if op in ("all_gather", "all_to_all") else {"algo": algo}
        )
        if op == "all_to_allv":
            kw["counts"] = counts
        if op == "broadcast":
            kw["root"] = root
        call = lambda: getattr(comm, op)(outs if local else outs[0], ins if local else ins[0], **kw)  # noqa: E731
        if captured:
            graph = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream(device=devs[0])
            torch.cuda.synchronize(devs[0])
            with torch.cuda.stream(s):
                with torch.cuda.graph(graph, stream=s):
                    call()
            call = graph.replay
        label = f"{op} {algo} n={size}{' ' + variant[0] if variant else ''}"
        for i in range(reps):
            seed = lambda q: zlib.crc32(f"same/{op}/{algo}/{size}/{i}/{q}".encode())
            expected = []
            for k, (r, d) in enumerate(zip(ranks, devs)):
                # Small integers as float32 where ferry reduces (exact sums), bytes elsewhere.
                src = (
                    (lambda q, m: ints(torch, seed(q), m, d, torch.float32))
                    if floats
                    else (lambda q, m: rand_bytes(torch, seed(q), m, d))
                )
                if not in_place:
                    outs[k].view(torch.uint8).fill_(0xA5)
                ins[k].copy_(src(r, ins[k].numel()))
                expected.append(_same_buffers_expected(torch, op, r, world, size, counts, root, src))
            if streams and not captured:
                st = [streams[k][i % len(streams[k])] for k in range(len(ranks))]
                kw["stream"] = st if local else st[0]
            for d in devs:  # the inputs were written on the current streams
                torch.cuda.synchronize(d)
            call()
            comm.synchronize()
            for d in devs:
                torch.cuda.synchronize(d)
            for r, o, e in zip(ranks, outs, expected):
                bad = int((o.view(torch.uint8) != e.view(torch.uint8)).sum().item())
                if bad:
                    fails.append(
                        f"rank {r}: {label}, {'replay' if captured else 'run'} {i + 1} on the same buffers:"
                        f" {bad} wrong bytes"
                    )
    return fails


def ints(torch, seed: int, n: int, dev, dtype, low=-8, high=9):
    """Small random integers as `dtype`: sums of a few stay exact in every float type."""
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    return torch.randint(low, high, (n,), device=dev, generator=g).to(dtype)


def checker(torch, dev, rank: int, fails: list):
    """check(label, got, exp): appends a failure when any byte differs."""

    def check(label, got, exp):
        torch.cuda.synchronize(dev)
        bad = int((got.view(torch.uint8) != exp.view(torch.uint8)).sum().item())
        if bad:
            fails.append(f"rank {rank} {label}: {bad} wrong bytes of {exp.numel() * exp.element_size()}")

    return check


def expecter(ferry, fails: list, prefix: str = ""):
    """expect(pattern, fn): appends a failure unless fn raises a FerryError matching pattern."""
    import re

    def expect(pattern, fn):
        try:
            fn()
        except ferry.FerryError as exc:
            if not re.search(pattern, str(exc)):
                fails.append(f"{prefix}expected /{pattern}/, got {exc}")
            return
        fails.append(f"{prefix}expected /{pattern}/, nothing raised")

    return expect


def check_long_calls(torch, comm, devs, world, bufs, streams=None, captured=False, rounds=4096, runs=3):
    """Calls of thousands of rounds in one process (init_local), each rank's
    part more operations than its stream's queue takes while the first wait
    holds: a reduce_scatter in rounds of 4 KiB (FERRY_REDUCE_ROUND_BYTES) and
    an in-place all_to_all through a 4 KiB scratch (FERRY_SCRATCH_BYTES), each
    `rounds` long. Eagerly, each run is a call (from the second on, ferry
    replays it from its own graph); captured=True, each is captured once into
    a CUDA graph per rank and every run is a replay of those. Random data,
    poisoned outputs, every byte compared. Returns failure strings."""
    from fuzz import capture_per_rank, replay_per_rank

    streams = streams or [torch.cuda.current_stream(d) for d in devs]
    gen = torch.Generator().manual_seed(58 + world + 7 * captured)
    fails = []
    saved = {k: os.environ.get(k) for k in ("FERRY_REDUCE_ROUND_BYTES", "FERRY_SCRATCH_BYTES")}

    def sync():
        for d in {d.index for d in devs}:
            torch.cuda.synchronize(d)

    def check(label, call, feed, outs, poison):
        graphs = None
        for run in range(runs):
            want = feed(run)
            for o in outs if poison else ():
                o.fill_(-7)
            sync()
            if captured and graphs is None:
                call()  # a warm-up, as before any capture: the scratch grows outside the graph
                sync()
                want = feed(run)
                for o in outs if poison else ():
                    o.fill_(-7)
                sync()
                graphs = capture_per_rank(torch, devs, streams, call)
            if graphs is not None:
                replay_per_rank(torch, devs, graphs, streams)
            else:
                call()
            sync()
            for r in range(world):
                bad = int((outs[r].cpu() != want[r]).sum().item())
                if bad:
                    fails.append(f"{label} run {run} rank {r}: {bad} wrong elements of {want[r].numel()}")
                    return

    try:
        # reduce_scatter: `rounds` rounds of 4 KiB of int32 result per rank.
        os.environ["FERRY_REDUCE_ROUND_BYTES"] = "4096"
        count = rounds * 1024
        ins = [torch.empty(world * count, dtype=torch.int32, device=d) for d in devs]
        outs = [torch.empty(count, dtype=torch.int32, device=d) for d in devs]

        def feed_rs(run):
            full = [
                torch.randint(-(1 << 20), 1 << 20, (world * count,), generator=gen, dtype=torch.int32)
                for _ in devs
            ]
            for i, f in zip(ins, full):
                i.copy_(f)
            want = []
            for r in range(world):
                exp = full[0][r * count : (r + 1) * count].clone()
                for q in range(1, world):
                    exp += full[q][r * count : (r + 1) * count]
                want.append(exp)
            return want

        check("reduce_scatter", lambda: comm.reduce_scatter(outs, ins, stream=streams), feed_rs, outs, True)
        del os.environ["FERRY_REDUCE_ROUND_BYTES"]
        # In-place all_to_all through a 4 KiB scratch: blocks in chunks of 4096 / world bytes.
        os.environ["FERRY_SCRATCH_BYTES"] = "4096"
        n = rounds * (4096 // world)
        bs = [b[: world * n] for b in bufs]

        def feed_a2a(run):
            data = [torch.randint(0, 256, (world * n,), generator=gen, dtype=torch.uint8) for _ in devs]
            for b, x in zip(bs, data):
                b.copy_(x)
            return [torch.cat([data[q][r * n : (r + 1) * n] for q in range(world)]) for r in range(world)]

        # In place: the inputs are the outputs, nothing to poison.
        check("in-place all_to_all", lambda: comm.all_to_all(bs, bs, stream=streams), feed_a2a, bs, False)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return fails

"""Code that runs inside the test processes (one per GPU). Each worker returns
a list of failure strings; an empty list is a pass."""

from __future__ import annotations

import itertools
import os
import sys
import time
import traceback
import zlib

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# Bytes per rank (all_gather) or per block (all_to_all), odd ones included.
SIZES = (1, 3, 4096, 1000003, (64 << 20) + 1)
A2A_SIZES = (1, 3, 4096, 1000003, (16 << 20) + 1)
# The largest block per peer algo "sm" moves by default (FERRY_SM_BYTES).
SM_BYTES = 1 << 20


def _rand(torch, seed: int, n: int, dev):
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev, generator=g)


def _init(rank: int, world: int, port: int, timeout: float):
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
                src = _rand(torch, seed(r), nbytes, d)
                exp = torch.cat([_rand(torch, seed(q), nbytes, d) for q in range(world)])
                out.copy_(_rand(torch, 7 + r, total, d))  # poison
                if in_place:
                    out[r * nbytes : (r + 1) * nbytes].copy_(src)
                    inp = out[r * nbytes : (r + 1) * nbytes]
                else:
                    skew = 3 if elem == 1 else elem  # unaligned bytes; element-aligned for bf16
                    inp = torch.empty(nbytes + skew, dtype=torch.uint8, device=d)[skew:]
                    inp.copy_(src)
            else:
                src = _rand(torch, seed(r), total, d)
                exp = torch.cat(
                    [_rand(torch, seed(q), total, d)[r * nbytes : (r + 1) * nbytes] for q in range(world)]
                )
                out.copy_(_rand(torch, 7 + r, total, d))
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
            src = _rand(
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
                    [_rand(torch, 99 + q, reps * n, d).view(reps, n) for q in range(world)], dim=1
                )
            else:
                exp = torch.stack(
                    [
                        _rand(torch, 100 + q, reps * world * n, d).view(reps, world, n)[:, r]
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
                    (lambda q, m: _ints(torch, seed(q), m, d, torch.float32))
                    if floats
                    else (lambda q, m: _rand(torch, seed(q), m, d))
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


def correctness(rank: int, world: int, port: int) -> list:
    import torch

    comm = _init(rank, world, port, timeout=60)
    dev = torch.device("cuda", rank)
    try:
        buf = comm.alloc((world * ((64 << 20) + 8) * 2,), torch.uint8)
        fails = check_collectives(torch, comm, [rank], [dev], world, [buf])
        fails += check_repeats(torch, comm, [rank], [dev], world, [buf])
        streams = [torch.cuda.Stream(device=dev) for _ in range(2)]
        fails += check_repeats(torch, comm, [rank], [dev], world, [buf], reps=200, streams=[streams])
        fails += check_same_buffers(torch, comm, [rank], [dev], world, [buf])
        fails += check_same_buffers(torch, comm, [rank], [dev], world, [buf], reps=10, streams=[streams])
        fails += check_same_buffers(torch, comm, [rank], [dev], world, [buf], reps=10, captured=True)
        # A tensor from PyTorch's allocator, registered through CUDA IPC.
        t = torch.empty(world * 1000003 + 64, dtype=torch.uint8, device=dev)
        comm.register(t)
        fails += [
            f"registered tensor: {f}"
            for f in check_collectives(
                torch,
                comm,
                [rank],
                [dev],
                world,
                [t],
                dtypes=("uint8",),
                sizes=(3, 1000003),
                a2a_sizes=(3, 1000003),
                algos=("b2b", "pcpy"),
            )
        ]
        comm.deregister(t)
        comm.free(buf)
    finally:
        comm.close()
    return fails


def bad_inputs(rank: int, world: int, port: int) -> list:
    import ferry
    import torch

    comm = _init(rank, world, port, timeout=3)
    dev = torch.device("cuda", rank)
    fails = []

    def expect(exc_type, pattern, fn):
        import re

        try:
            fn()
        except exc_type as exc:
            if not re.search(pattern, str(exc)):
                fails.append(f"expected /{pattern}/, got {exc_type.__name__}: {exc}")
            return
        except Exception as exc:  # noqa: BLE001
            fails.append(f"expected {exc_type.__name__} /{pattern}/, got {type(exc).__name__}: {exc}")
            return
        fails.append(f"expected {exc_type.__name__} /{pattern}/, nothing raised")

    out = comm.alloc((world * 4096,), torch.uint8)
    inp = torch.zeros(4096, dtype=torch.uint8, device=dev)
    plain = torch.empty(world * 4096, dtype=torch.uint8, device=dev)
    other = torch.empty(
        4096, dtype=torch.uint8, device=torch.device("cuda", (rank + 1) % torch.cuda.device_count())
    )
    expect(ferry.NotRegisteredError, "not inside a buffer registered", lambda: comm.all_gather(plain, inp))
    expect(ferry.InvalidArgumentError, "in is on GPU", lambda: comm.all_gather(out, other))
    expect(ferry.InvalidArgumentError, "in is on cpu", lambda: comm.all_gather(out, inp.cpu()))
    expect(
        ferry.InvalidArgumentError,
        "not contiguous",
        lambda: comm.all_gather(out, torch.zeros(8192, dtype=torch.uint8, device=dev)[::2]),
    )
    expect(
        ferry.InvalidArgumentError, "out has 4096 bytes; expected", lambda: comm.all_gather(out[:4096], inp)
    )
    n4 = world * 1024
    expect(ferry.InvalidArgumentError, "overlap", lambda: comm.all_to_all(out[:n4], out[1 : n4 + 1]))
    expect(ferry.InvalidArgumentError, "overlap", lambda: comm.all_gather(out, out[1:4097]))

    # Native checks for raw pointers (through __cuda_array_interface__).
    class Raw:
        def __init__(self, ptr, n):
            self.__cuda_array_interface__ = dict(
                shape=(n,), typestr="|u1", data=(ptr, False), version=3, strides=None
            )

    host = torch.zeros(4096, dtype=torch.uint8).pin_memory()
    expect(
        ferry.InvalidArgumentError,
        "pinned host memory",
        lambda: comm.all_gather(out, Raw(host.data_ptr(), 4096)),
    )
    expect(
        ferry.InvalidArgumentError, "expected GPU", lambda: comm.all_gather(out, Raw(other.data_ptr(), 4096))
    )
    # Sizes that differ across ranks: every rank gets a timeout error naming the mismatch.
    n = 1024 if rank == 0 else 2048
    t0 = time.monotonic()
    expect(
        ferry.PeerTimeoutError,
        r"called all_gather\(bytes=\d+.*must match",
        lambda: (comm.all_gather(out[: world * n], inp[:n]), comm.synchronize()),
    )
    if time.monotonic() - t0 > 2:  # a mismatch is definite: no need to wait for the timeout
        fails.append(f"mismatch took {time.monotonic() - t0:.1f} s to report")
    expect(ferry.BrokenError, "broken by an earlier error", lambda: comm.all_gather(out, inp))
    comm.close()
    expect(ferry.ClosedError, "closed", lambda: comm.all_gather(out, inp))
    expect(ferry.ClosedError, "already closed", comm.close)
    return fails


def _ints(torch, seed: int, n: int, dev, dtype, low=-8, high=9):
    """Small random integers as `dtype`: sums of a few stay exact in every float type."""
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    return torch.randint(low, high, (n,), device=dev, generator=g).to(dtype)


def _checker(torch, dev, rank: int, fails: list):
    """check(label, got, exp): appends a failure when any byte differs."""

    def check(label, got, exp):
        torch.cuda.synchronize(dev)
        bad = int((got.view(torch.uint8) != exp.view(torch.uint8)).sum().item())
        if bad:
            fails.append(f"rank {rank} {label}: {bad} wrong bytes of {exp.numel() * exp.element_size()}")

    return check


def _expecter(ferry, fails: list, prefix: str = ""):
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


# Every trigger with the gate in host memory, the stream and kernel triggers
# with the gate in GPU memory too.
TRIGGERS_AND_GATES = [
    ("host", "host"),
    ("stream", "host"),
    ("device", "host"),
    ("stream", "device"),
    ("device", "device"),
]


def _run_prepared_all_gather(torch, ferry, h, out, inp, side, rank, world, steps, tag, check, after_arm=None):
    """Arms `h` (an all_gather of `inp` into `out`) `steps` times with each
    trigger and gate in turn; the input is written after arming (the
    collective must see it); every step is checked byte for byte.
    `after_arm(step)` runs right after each arm()."""
    n, dev = inp.numel(), inp.device
    for step in range(steps):
        how, gate = TRIGGERS_AND_GATES[step % len(TRIGGERS_AND_GATES)]
        seed = lambda s: zlib.crc32(f"{tag}/{step}/{s}".encode())  # noqa: E731
        out.fill_(0xCC)
        h.arm(gate=gate)
        if after_arm:
            after_arm(step)
        with torch.cuda.stream(side):
            inp.copy_(_rand(torch, seed(rank), n, dev))
            if how == "stream":
                h.trigger(side)
            elif how == "device":
                word, value = h.device_trigger()
                ferry.native.launch_trigger_kernel(word, value, 20000, side.cuda_stream)
        if how == "host":
            side.synchronize()
            h.trigger()
        h.wait()
        check(
            f"prepared {tag} all_gather step {step} ({how} trigger, gate in {gate} memory)",
            out,
            torch.cat([_rand(torch, seed(s), n, dev) for s in range(world)]),
        )


def more_collectives(rank: int, world: int, port: int) -> list:
    """all_to_allv, broadcast, reduce_scatter, all_reduce and in-place all_to_all,
    byte-exact against references built from every rank's seeded inputs."""
    os.environ["FERRY_SCRATCH_BYTES"] = str(world * 40000)  # in-place all_to_all in several rounds
    import torch

    comm = _init(rank, world, port, timeout=60)
    dev = torch.device("cuda", rank)
    fails = []
    check = _checker(torch, dev, rank, fails)

    buf = comm.alloc((world * (8 << 20) + 4096,), torch.uint8)
    try:
        # all_to_allv: random counts (zeros included) in elements of several types.
        for trial, dtype in enumerate((torch.uint8, torch.bfloat16, torch.float32)):
            g = torch.Generator().manual_seed(1234 + trial)
            counts = torch.randint(0, 3000, (world, world), generator=g)
            counts[0, world - 1] = 0
            counts[world - 1, 0] = 100003 if trial == 0 else 7
            es = torch.empty((), dtype=dtype).element_size()
            seed = lambda s: zlib.crc32(f"a2av/{trial}/{s}".encode())
            send = _rand(torch, seed(rank), int(counts[rank].sum()) * es, dev).view(dtype)
            recv_n = int(counts[:, rank].sum())
            out = buf[: recv_n * es].view(dtype)
            out.view(torch.uint8).fill_(0xA5)
            for algo in ("b2b", "seq", "pcpy"):
                comm.all_to_allv(out, send, counts.tolist(), algo=algo)
                pieces = []
                for s in range(world):
                    src = _rand(torch, seed(s), int(counts[s].sum()) * es, dev).view(dtype)
                    off = int(counts[s, :rank].sum())
                    pieces.append(src[off : off + int(counts[s, rank])])
                check(f"all_to_allv {dtype} {algo}", out, torch.cat(pieces))
        # broadcast from every root, out-of-place and in place, odd size.
        n = 1000003
        for root in range(world):
            exp = _rand(torch, 77 + root, n, dev)
            out = buf[5 : 5 + n]
            out.fill_(0x11)
            src = exp.clone() if rank == root else None
            comm.broadcast(out, src, root=root)
            check(f"broadcast root={root}", out, exp)
            out.fill_(0x22)
            if rank == root:
                out.copy_(exp)
            comm.broadcast(out, root=root, algo="seq")
            check(f"broadcast in-place root={root}", out, exp)
        # reduce_scatter and all_reduce: sums of small integers are exact.
        for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.float16):
            for count in (1, 1000, 262147):
                seed = lambda s: zlib.crc32(f"red/{dtype}/{count}/{s}".encode()) % (1 << 31)
                ins = [_ints(torch, seed(s), world * count, dev, dtype) for s in range(world)]
                full = torch.stack([x.to(torch.float64) for x in ins]).sum(0)
                out = torch.full((count,), 99, dtype=dtype, device=dev)
                comm.reduce_scatter(out, ins[rank])
                check(
                    f"reduce_scatter {dtype} n={count}",
                    out,
                    full[rank * count : (rank + 1) * count].to(dtype),
                )
                ar = buf[: world * count * out.element_size()].view(dtype)
                comm.all_reduce(ar, ins[rank])
                check(f"all_reduce {dtype} n={world * count}", ar, full.to(dtype))
                ar.copy_(ins[rank])
                comm.all_reduce(ar, op="max")  # in place
                mx = torch.stack([x.to(torch.float64) for x in ins]).max(0).values
                check(f"all_reduce max in-place {dtype}", ar, mx.to(dtype))
        # uneven all_reduce (count not a multiple of world)
        count = world * 1000 + 3
        x = _ints(torch, 5 + rank, count, dev, torch.float32)
        ar = buf[: count * 4].view(torch.float32)
        comm.all_reduce(ar, x)
        exp = sum(_ints(torch, 5 + s, count, dev, torch.float32) for s in range(world))
        check("all_reduce uneven", ar, exp)
        # in-place all_to_all, several rounds through the bounded scratch
        for n in (4096, 100003):
            seed = lambda s: zlib.crc32(f"ipa2a/{n}/{s}".encode())
            t = buf[: world * n]
            t.copy_(_rand(torch, seed(rank), world * n, dev))
            comm.all_to_all(t, t)
            exp = torch.cat(
                [_rand(torch, seed(s), world * n, dev)[rank * n : (rank + 1) * n] for s in range(world)]
            )
            check(f"all_to_all in-place n={n}", t, exp)
        comm.synchronize()
    finally:
        comm.close()
    return fails


def _eager_calls_while_armed(torch, comm, out, inp, side, rank, world, check, fails, keys=12, reps=3):
    """Eager calls made between arm() and the trigger queue behind the armed
    run on the GPU. Each repeats (which makes the replay cache capture it),
    and capturing then must not leave the host waiting for that GPU work:
    the trigger comes only after these calls. Then the same calls with
    nothing armed (captured and replayed now); every output byte checked."""
    import time

    dev, n = inp.device, inp.numel()
    sizes = [1000 + 97 * k for k in range(keys)]
    eager_out = comm.alloc((sum(world * m for m in sizes),), torch.uint8)
    outs, at = [], 0
    for m in sizes:
        outs.append(eager_out[at : at + world * m])
        at += world * m

    def seed(tag, q):
        return zlib.crc32(f"armed-eager/{tag}/{q}".encode())

    for phase in ("while a handle is armed", "with nothing armed"):
        srcs = [_rand(torch, seed(f"{phase}/{m}", rank), m, dev) for m in sizes]
        eager_out.fill_(0xCC)
        out.fill_(0xCC)
        torch.cuda.synchronize()
        armed = phase.startswith("while")
        h = comm.prepare("all_gather", out, inp) if armed else None
        try:
            if h:
                h.arm()
            t0 = time.monotonic()
            for o, x in zip(outs, srcs):
                for _ in range(reps):
                    comm.all_gather(o, x)
            took = time.monotonic() - t0
            if took > 5:
                fails.append(f"rank {rank}: {keys * reps} eager calls {phase} took {took:.1f} s")
            if h:
                with torch.cuda.stream(side):
                    inp.copy_(_rand(torch, seed(phase, rank), n, dev))
                side.synchronize()
                h.trigger()
                h.wait()
            comm.synchronize()
        except Exception as exc:  # noqa: BLE001
            fails.append(f"rank {rank}: eager calls {phase}: {exc!r}")
            return
        finally:
            if h:
                h.release()
        if h:
            check(
                "prepared all_gather triggered after eager calls",
                out,
                torch.cat([_rand(torch, seed(phase, q), n, dev) for q in range(world)]),
            )
        for o, m in zip(outs, sizes):
            check(
                f"eager all_gather of {m} B {phase}",
                o,
                torch.cat([_rand(torch, seed(f"{phase}/{m}", q), m, dev) for q in range(world)]),
            )
    comm.free(eager_out)


def prelaunch_and_graphs(rank: int, world: int, port: int) -> list:
    """Prepared collectives (host, stream and device triggers, reused step after
    step), bad uses of handles, and CUDA graphs replayed 10,000 times."""

    # The documented rule for prelaunch (docs/api.md, "Prelaunch"): the input is
    # produced on a side stream after arming, and with the default 8 hardware
    # queues that stream can land behind the armed wait (seen on H200: every
    # rank's first arm timed out untriggered). Set before CUDA starts.
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"

    import ferry
    import torch

    comm = _init(rank, world, port, timeout=30)
    dev = torch.device("cuda", rank)
    fails = []
    check = _checker(torch, dev, rank, fails)
    expect = _expecter(ferry, fails)

    n = 65536 + 3
    out = comm.alloc((world * n,), torch.uint8)
    inp = torch.empty(n, dtype=torch.uint8, device=dev)
    side = torch.cuda.Stream(device=dev)
    try:
        # Every kernel that runs between arm() and its trigger must be loaded
        # before arming (docs/api.md, "Prelaunch"): CUDA's lazy loading may
        # synchronize the context, which waits for the armed stream. Seen on
        # H200: the first arm timed out untriggered without this warm-up.
        with torch.cuda.stream(side):
            inp.copy_(_rand(torch, 0, n, dev))
            word = torch.zeros(1, dtype=torch.int64, device=dev)
            ferry.native.launch_trigger_kernel(word.data_ptr(), 1, 1, side.cuda_stream)
        side.synchronize()
        h = comm.prepare("all_gather", out, inp)
        expect("not armed", h.trigger)

        spare = comm.alloc((64,), torch.uint8)

        def misuse(step):
            if step == 0:
                expect("armed already", h.arm)
            if step == 1:  # refused at once, not after the timeout
                t0 = time.monotonic()
                expect(r"synchronize: prepared collective \d+ is armed and not triggered", comm.synchronize)
                expect(r"free: prepared collective \d+ is armed and not triggered", lambda: comm.free(spare))
                if time.monotonic() - t0 > 1:
                    fails.append(f"synchronize/free while armed took {time.monotonic() - t0:.1f} s to refuse")
            if step == 3:
                expect("gate in GPU memory, which the host cannot write", h.trigger)

        _run_prepared_all_gather(torch, ferry, h, out, inp, side, rank, world, 60, "pre", check, misuse)
        comm.free(spare)  # nothing armed now
        expect("used by prepared collective", lambda: comm.free(out))
        h.release()
        expect("not a prepared collective", h.trigger)
        # Prepared all_reduce (two exchanges and a kernel behind one trigger).
        x = torch.ones(world * 1000, dtype=torch.float32, device=dev) * (rank + 1)
        ar = comm.alloc((world * 1000,), torch.float32)
        with comm.prepare("all_reduce", ar, x) as hr:
            for _ in range(3):
                hr.arm()
                hr.trigger()
                hr.wait()
                check("prepared all_reduce", ar, torch.full_like(ar, world * (world + 1) / 2))

        _eager_calls_while_armed(torch, comm, out, inp, side, rank, world, check, fails)

        # CUDA graphs: all_gather, all_to_all and all_reduce captured, replayed 10,000 times.
        a2a_out = comm.alloc((world * 4096,), torch.uint8)
        a2a_in = torch.empty(world * 4096, dtype=torch.uint8, device=dev)
        g_in = torch.empty(4096, dtype=torch.uint8, device=dev)
        g_out = out[: world * 4096]
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream(device=dev)
        with torch.cuda.stream(s):
            with torch.cuda.graph(graph, stream=s):
                comm.all_gather(g_out, g_in)
                comm.all_to_all(a2a_out, a2a_in)
                comm.all_reduce(ar, x)
        for block in range(10):
            seed = lambda q: zlib.crc32(f"graph/{block}/{q}".encode())
            g_in.copy_(_rand(torch, seed(rank), 4096, dev))
            a2a_in.copy_(_rand(torch, seed(rank) + 1, world * 4096, dev))
            torch.cuda.synchronize()
            t0 = time.monotonic()
            for _ in range(1000):
                graph.replay()
            torch.cuda.synchronize()
            # Progress on stderr: a hang is then placed to a block of replays.
            print(
                f"rank {rank}: graph block {block} done in {time.monotonic() - t0:.3f} s",
                file=sys.stderr,
                flush=True,
            )
            check(
                f"graph all_gather after {(block + 1) * 1000} replays",
                g_out,
                torch.cat([_rand(torch, seed(q), 4096, dev) for q in range(world)]),
            )
            check(
                f"graph all_to_all after {(block + 1) * 1000} replays",
                a2a_out,
                torch.cat(
                    [
                        _rand(torch, seed(q) + 1, world * 4096, dev)[rank * 4096 : (rank + 1) * 4096]
                        for q in range(world)
                    ]
                ),
            )
            check("graph all_reduce", ar, torch.full_like(ar, world * (world + 1) / 2))
        del graph
        comm.synchronize()

        # Eager calls made while the user captures another stream in global
        # mode (torch's default): ferry captures the repeated call into its own
        # graph meanwhile, which must neither fail the calls nor invalidate the
        # user's capture.
        g_in.copy_(_rand(torch, 4242 + rank, 4096, dev))
        torch.cuda.synchronize()
        user_graph = torch.cuda.CUDAGraph()
        cap, other = torch.cuda.Stream(device=dev), torch.cuda.Stream(device=dev)
        counter = torch.zeros(1, dtype=torch.float32, device=dev)
        try:
            with torch.cuda.stream(cap):
                with torch.cuda.graph(user_graph, stream=cap):
                    counter.add_(1)
                    for _ in range(3):
                        comm.all_gather(g_out, g_in, stream=other)
            other.synchronize()
            comm.synchronize()
            check(
                "eager all_gather during a user's global capture",
                g_out,
                torch.cat([_rand(torch, 4242 + q, 4096, dev) for q in range(world)]),
            )
            user_graph.replay()
            torch.cuda.synchronize()
            if counter.item() != 1.0:
                fails.append(
                    f"rank {rank}: the user's graph ran its kernel {counter.item()} times, expected once"
                )
        except Exception as exc:  # noqa: BLE001
            fails.append(f"rank {rank}: eager calls during a user's global capture: {exc!r}")
        del user_graph
        comm.synchronize()
        # Counts that disagree between ranks: named at once, not after the timeout.
        counts = [[1] * world for _ in range(world)]
        if rank == 0:
            counts[0][0] = 2
        t0 = time.monotonic()
        src = torch.zeros(world * 2, dtype=torch.uint8, device=dev)
        expect(
            r"all_to_allv.*must match",
            lambda: (comm.all_to_allv(a2a_out[: world * 2], src, counts), comm.synchronize()),
        )
        if time.monotonic() - t0 > 5:
            fails.append(f"all_to_allv count mismatch took {time.monotonic() - t0:.1f} s to report")
    finally:
        comm.close()
    return fails


def _sm_span_format_stress(torch, comm, buf, rank, world, check, calls=50, replays=400) -> list:
    """20,000 back-to-back SM-path broadcasts of 1 MiB (the format with one
    flag per peer and block) from a CUDA graph: a rank that finishes a call
    goes straight into the next and overwrites its flags, which a slower
    peer's block must still accept (one_shot_flag_passes; without that, a
    sweep stopped once in about 10,000 calls). Bounded by the kernel's own
    timeout; the output is checked at the end."""
    import time

    dev, n = buf.device, 1 << 20
    out = buf[:n]
    src = _rand(torch, zlib.crc32(b"sm-stress"), n, dev)
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

    comm = _init(rank, world, port, timeout=60)
    dev = torch.device("cuda", rank)
    fails = []
    check = _checker(torch, dev, rank, fails)
    expect = _expecter(ferry, fails, prefix=f"rank {rank}: ")

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
            ag_in.copy_(_rand(torch, seed(rank), n, dev))
            a2a_in.copy_(_rand(torch, seed(rank) + 1, world * n, dev))
            torch.cuda.synchronize()
            for _ in range(1000):
                graph.replay()
            torch.cuda.synchronize()
            gathered = torch.cat([_rand(torch, seed(q), n, dev) for q in range(world)])
            check(f"graph sm all_gather after {(block + 1) * 1000} replays", ag_out, gathered)
            check(f"graph b2b all_gather after {(block + 1) * 1000} replays", ce_out, gathered)
            check(
                f"graph sm all_to_all after {(block + 1) * 1000} replays",
                a2a_out,
                torch.cat(
                    [
                        _rand(torch, seed(q) + 1, world * n, dev)[rank * n : (rank + 1) * n]
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
            ferry.native.launch_trigger_kernel(word.data_ptr(), 1, 1, side.cuda_stream)
        side.synchronize()
        h = comm.prepare("all_gather", ag_out, ag_in, algo="sm")
        _run_prepared_all_gather(torch, ferry, h, ag_out, ag_in, side, rank, world, 15, "smpre", check)
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
            src = _rand(torch, seed(rank), send + 1, dev)[1:]  # unaligned input
            out = buf[1 : 1 + recv]  # unaligned output
            out.fill_(0xA5)
            comm.all_to_allv(out, src, counts, algo="sm")
            parts = []
            for q in range(world):
                start = sum(counts[q][:rank])
                parts.append(
                    _rand(torch, seed(q), sum(counts[q]) + 1, dev)[1:][start : start + counts[q][rank]]
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
        expect(
            r"not reduce_scatter",
            lambda: comm.reduce_scatter(
                torch.empty(4, device=dev), torch.empty(4 * world, device=dev), algo="sm"
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


def _with_kernel_signals(worker, rank: int, world: int, port: int) -> list:
    os.environ["FERRY_SIGNALS"] = "sm"  # read when the communicator is created
    return worker(rank, world, port)


def correctness_kernel_signals(rank: int, world: int, port: int) -> list:
    """The correctness matrix with the ready and done rounds sent by kernels."""
    return _with_kernel_signals(correctness, rank, world, port)


def prelaunch_and_graphs_kernel_signals(rank: int, world: int, port: int) -> list:
    """Prepared collectives (the gate waited for in the ready round's kernel)
    and graphs replayed 10,000 times, with the rounds sent by kernels."""
    return _with_kernel_signals(prelaunch_and_graphs, rank, world, port)


def kernel_signals_skipped_call(rank: int, world: int, port: int) -> list:
    """FERRY_SIGNALS=sm: rank 1 skips a collective that rank 0 makes. Rank
    0's ready-round kernel waits for rank 1's message; the watchdog must name
    rank 1 after the timeout and free the kernel, so that rank 0's
    synchronize() raises instead of hanging."""
    os.environ["FERRY_SIGNALS"] = "sm"
    import ferry
    import torch

    comm = _init(rank, world, port, timeout=3)
    dev = torch.device("cuda", rank)
    out = comm.alloc((world * 4096,), torch.uint8)
    inp = _rand(torch, rank, 4096, dev)
    comm.all_gather(out, inp)
    comm.synchronize()
    fails = []
    if rank == 0:
        t0 = time.monotonic()
        try:
            comm.all_gather(out, inp)
            comm.synchronize()
            fails.append("the all_gather finished although rank 1 never made it")
        except ferry.PeerTimeoutError as exc:
            took = time.monotonic() - t0
            if "rank 1" not in str(exc) or took > 10:
                fails.append(f"bad error after {took:.1f} s: {exc}")
    else:
        time.sleep(6)  # alive, but skips the call
    comm.close()
    return fails


def never_joins(rank: int, world: int, port: int) -> list:
    import ferry

    if rank == 1:
        time.sleep(8)  # alive, but never joins
        return []
    t0 = time.monotonic()
    try:
        _init(rank, world, port, timeout=2)
    except ferry.PeerTimeoutError as exc:
        took = time.monotonic() - t0
        ok = "rank(s) 1 never arrived" in str(exc) and took < 10
        return [] if ok else [f"bad timeout error after {took:.1f} s: {exc}"]
    return ["init returned although rank 1 never joined"]


def peer_dies(rank: int, world: int, port: int) -> list:
    import ferry
    import torch

    comm = _init(rank, world, port, timeout=20)
    out = comm.alloc((world * 4096,), torch.uint8)
    inp = torch.zeros(4096, dtype=torch.uint8, device=torch.device("cuda", rank))
    comm.all_gather(out, inp)
    comm.synchronize()
    if rank == 1:
        os._exit(0)  # dies before the next collective
    time.sleep(1)
    t0 = time.monotonic()
    try:
        comm.all_gather(out, inp)
        comm.synchronize()
    except ferry.PeerTimeoutError as exc:
        took = time.monotonic() - t0
        comm.close()
        return (
            []
            if ("rank 1" in str(exc) and "exited" in str(exc) and took < 10)
            else [f"bad error after {took:.1f} s: {exc}"]
        )
    return ["the collective finished although rank 1 had exited"]


def untriggered_is_reported(gate: str, algo: str) -> list:
    """One process driving GPUs 0 and 1 arms a collective and never triggers
    it: the watchdog must report it after the timeout and open the gate (in
    GPU memory: with a stream write), so that the armed run ends and close()
    does not wait forever. algo "sm": the armed kernel spinning on the gate
    lets go too."""
    os.environ.update(SAFE_ENV)
    import ferry
    import torch

    comm = ferry.init_local([0, 1], timeout=2)
    n = 4096
    bufs = comm.alloc((2 * n,), torch.uint8)
    ins = [torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}") for i in range(2)]
    h = comm.prepare("all_gather", bufs, ins, algo=algo)
    h.arm(gate=gate)
    message = None
    deadline = time.monotonic() + 20
    while message is None and time.monotonic() < deadline:
        try:
            comm.check()
        except ferry.FerryError as exc:
            message = str(exc)
        time.sleep(0.05)
    if message is None:
        return ["no error 20 s after arming with a 2 s timeout"]
    if "never triggered" not in message:
        return [f"wrong error: {message}"]
    # A gate left shut would keep these events pending (and close() would only
    # give up on them after its own timeout).
    streams = [torch.cuda.Stream(device=f"cuda:{i}") for i in range(2)]
    h.wait(streams)
    ends = []
    for st in streams:
        ends.append(torch.cuda.Event())
        ends[-1].record(st)
    deadline = time.monotonic() + 10
    while not all(e.query() for e in ends) and time.monotonic() < deadline:
        time.sleep(0.05)
    fails = []
    if not all(e.query() for e in ends):
        fails.append("the armed run did not end after the watchdog opened its gate")
    t0 = time.monotonic()
    comm.close()
    if time.monotonic() - t0 > 10:
        fails.append(f"close() took {time.monotonic() - t0:.1f} s")
    return fails


def shared_gpu_world(world: int, algos) -> list:
    """`world` ranks in one process on the visible GPUs, several per GPU
    (FERRY_SHARED_GPUS=1, set by the caller): the logic of a world larger than
    the machine (flags, cyclic order, per-source slots of the SM path, masks)
    runs for real. Every rank has its own stream. all_gather and all_to_all
    run check_collectives' matrix, each case twice; all_to_allv, broadcast and
    all_reduce as below. Random data, poisoned outputs, every byte compared."""
    os.environ.update(SAFE_ENV)
    import ferry
    import torch

    gpus = torch.cuda.device_count()
    devs = [torch.device("cuda", r % gpus) for r in range(world)]
    comm = ferry.init_local([d.index for d in devs], timeout=30)
    streams = [torch.cuda.Stream(device=d) for d in devs]
    most = 1 << 20  # the SM path's default block limit (FERRY_SM_BYTES)
    bufs = comm.alloc((world * most + 4096,), torch.uint8)
    fails = []

    def rand(tag, r, n):
        return _rand(torch, zlib.crc32(f"{tag}/{r}".encode()), n, devs[r])

    def run(label, call, outs, expected):
        print(label, file=sys.stderr, flush=True)  # where a run that hangs got to
        for o in outs:
            o.fill_(0xA5)  # poison
        for d in {d.index for d in devs}:
            torch.cuda.synchronize(d)
        try:
            call()
            comm.synchronize()
        except Exception as exc:  # noqa: BLE001
            fails.append(f"{label}: raised {exc!r}")
            return
        for r, (o, e) in enumerate(zip(outs, expected)):
            bad = int((o != e.to(o.device)).sum().item())
            if bad:
                fails.append(f"{label}: rank {r}: {bad} wrong bytes of {e.numel()}")

    for algo in algos:
        print(f"{algo}: all_gather, all_to_all", file=sys.stderr, flush=True)  # where a run that hangs got to
        fails += check_collectives(
            torch,
            comm,
            list(range(world)),
            devs,
            world,
            bufs,
            dtypes=("uint8",),
            sizes=(1, 4097, 65537, 300001),
            a2a_sizes=(1, 4097, 65537, 100003),
            algos=(algo,),
            streams=streams,
            repeats=2,
        )
        g = torch.Generator().manual_seed(world * 7 + len(algo))
        counts = torch.randint(0, 20000, (world, world), generator=g)
        counts[0, world - 1] = 0
        counts[world - 1, 1] = 65537
        tag = f"a2av/{algo}"
        ins = [rand(tag, r, int(counts[r].sum())) for r in range(world)]
        outs = [b[: int(counts[:, r].sum())] for r, b in enumerate(bufs)]
        exp = []
        for r in range(world):
            pieces = []
            for q in range(world):
                off = int(counts[q, :r].sum())
                pieces.append(ins[q][off : off + int(counts[q, r])].cpu())
            exp.append(torch.cat(pieces))
        run(tag, lambda: comm.all_to_allv(outs, ins, counts.tolist(), stream=streams, algo=algo), outs, exp)
        for root in (0, world - 1):
            n = 70001
            tag = f"bcast/{algo}/{root}"
            src = rand(tag, root, n)
            outs = [b[5 : 5 + n] for b in bufs]
            ins = [src if r == root else None for r in range(world)]  # others send nothing
            run(
                tag,
                lambda o=outs, i=ins, rt=root: comm.broadcast(o, i, root=rt, stream=streams, algo=algo),
                outs,
                [src.cpu()] * world,
            )
    # A reduction (copy engines move, a kernel adds), the selector's variant.
    count = world * 1000 + 3
    xs = [_ints(torch, 5 + r, count, devs[r], torch.float32) for r in range(world)]
    ar = [b[: count * 4].view(torch.float32) for b in bufs]
    exp = sum(x.cpu() for x in xs)
    run("all_reduce", lambda: comm.all_reduce(ar, xs, stream=streams), ar, [exp] * world)
    comm.close()
    return fails


if __name__ == "__main__":  # python _workers.py untriggered GATE ALGO (a fresh process)
    if sys.argv[1] == "untriggered":
        problems = untriggered_is_reported(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "shared":  # python _workers.py shared WORLD ALGO,ALGO,...
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ.get("FERRY_TEST_DUMP_S", "240")), exit=True)
        problems = shared_gpu_world(int(sys.argv[2]), sys.argv[3].split(","))
    print("\n".join(problems[:40]) or "ok")
    sys.exit(1 if problems else 0)


def run(target, rank, world, port, queue):
    import faulthandler
    import sys

    dump_s = float(os.environ.get("FERRY_TEST_DUMP_S", "0"))
    if dump_s > 0:  # a hung worker prints where every thread is
        faulthandler.dump_traceback_later(dump_s, exit=False, file=sys.stderr)
    try:
        queue.put((rank, target(rank, world, port)))
    except Exception:  # noqa: BLE001
        queue.put((rank, [traceback.format_exc()]))

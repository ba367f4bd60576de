"""Code that runs inside the test processes (one per GPU). Each worker returns
a list of failure strings; an empty list is a pass. Shared helpers are in
_checks.py; prepared collectives and graphs in _workers_prelaunch.py; the SM
path in _workers_sm.py. `run` is what harness.spawn starts in each process."""

from __future__ import annotations

import os
import sys
import time
import traceback
import zlib

from _checks import (
    SAFE_ENV,
    SM_BYTES,
    SmHold,
    check_collectives,
    check_long_calls,
    check_repeats,
    check_same_buffers,
    checker,
    expecter,
    init,
    ints,
    rand_bytes,
)
from _workers_prelaunch import prelaunch_and_graphs, untriggered_is_reported


def correctness(rank: int, world: int, port: int) -> list:
    import torch

    comm = init(rank, world, port, timeout=60)
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

    comm = init(rank, world, port, timeout=3)
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

    # float32 two bytes into a registered buffer (an array interface of its
    # own: torch tensors are always aligned): refused, not a misaligned load.
    class Misaligned:
        def __init__(self, base, n):
            self.__cuda_array_interface__ = dict(shape=(n,), typestr="<f4", data=(base + 2, False), version=3)

    expect(
        ferry.InvalidArgumentError,
        r"all_reduce: out on rank \d+ is at an address not a multiple of 4 bytes",
        lambda: comm.all_reduce(Misaligned(out.data_ptr(), 256)),
    )
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
    os.environ["FERRY_SIGNALS"] = "rounds"  # not a value: named at creation
    expect(
        ferry.InvalidArgumentError,
        "FERRY_SIGNALS=rounds: expected 'copy' or 'kernel'",
        lambda: ferry.init_local([rank]),
    )
    del os.environ["FERRY_SIGNALS"]
    return fails


def more_collectives(rank: int, world: int, port: int) -> list:
    """all_to_allv, broadcast, reduce_scatter, all_reduce and in-place all_to_all,
    byte-exact against references built from every rank's seeded inputs."""
    os.environ["FERRY_SCRATCH_BYTES"] = str(world * 40000)  # in-place all_to_all in several rounds
    import torch

    comm = init(rank, world, port, timeout=60)
    dev = torch.device("cuda", rank)
    fails = []
    check = checker(torch, dev, rank, fails)

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
            send = rand_bytes(torch, seed(rank), int(counts[rank].sum()) * es, dev).view(dtype)
            recv_n = int(counts[:, rank].sum())
            out = buf[: recv_n * es].view(dtype)
            out.view(torch.uint8).fill_(0xA5)
            for algo in ("b2b", "seq", "pcpy"):
                comm.all_to_allv(out, send, counts.tolist(), algo=algo)
                pieces = []
                for s in range(world):
                    src = rand_bytes(torch, seed(s), int(counts[s].sum()) * es, dev).view(dtype)
                    off = int(counts[s, :rank].sum())
                    pieces.append(src[off : off + int(counts[s, rank])])
                check(f"all_to_allv {dtype} {algo}", out, torch.cat(pieces))
        # broadcast from every root, out-of-place and in place, odd size.
        n = 1000003
        for root in range(world):
            exp = rand_bytes(torch, 77 + root, n, dev)
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
                ins = [ints(torch, seed(s), world * count, dev, dtype) for s in range(world)]
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
        # A call planned before the scratch grew, then planned again on one
        # rank only (set_tuning([]) clears that rank's cached plans): every
        # rank must use the same scratch block, so growing it drops every
        # rank's plans.
        count = 1000
        xs = [ints(torch, 900 + s, world * count, dev, torch.float32) for s in range(world)]
        out = torch.full((count,), 99, dtype=torch.float32, device=dev)
        comm.reduce_scatter(out, xs[rank])
        comm.reserve_scratch(128 << 20)
        if rank == 0:
            comm.set_tuning([])
        out.fill_(99)
        comm.reduce_scatter(out, xs[rank])
        check(
            "reduce_scatter after the scratch grew and one rank planned again",
            out,
            torch.stack(xs).sum(0)[rank * count : (rank + 1) * count],
        )
        # uneven all_reduce (count not a multiple of world)
        count = world * 1000 + 3
        x = ints(torch, 5 + rank, count, dev, torch.float32)
        ar = buf[: count * 4].view(torch.float32)
        comm.all_reduce(ar, x)
        exp = sum(ints(torch, 5 + s, count, dev, torch.float32) for s in range(world))
        check("all_reduce uneven", ar, exp)
        # in-place all_to_all, several rounds through the bounded scratch
        for n in (4096, 100003):
            seed = lambda s: zlib.crc32(f"ipa2a/{n}/{s}".encode())
            t = buf[: world * n]
            t.copy_(rand_bytes(torch, seed(rank), world * n, dev))
            comm.all_to_all(t, t)
            exp = torch.cat(
                [rand_bytes(torch, seed(s), world * n, dev)[rank * n : (rank + 1) * n] for s in range(world)]
            )
            check(f"all_to_all in-place n={n}", t, exp)
        comm.synchronize()
    finally:
        comm.close()
    return fails


def _with_signals(setting: str, worker, rank: int, world: int, port: int) -> list:
    os.environ["FERRY_SIGNALS"] = setting  # read when the communicator is created
    return worker(rank, world, port)


def correctness_kernel_signals(rank: int, world: int, port: int) -> list:
    """The correctness matrix with the ready and done rounds sent by kernels."""
    return _with_signals("sm", correctness, rank, world, port)


def more_collectives_kernel_signals(rank: int, world: int, port: int) -> list:
    """more_collectives with the ready and done rounds sent by kernels."""
    return _with_signals("sm", more_collectives, rank, world, port)


def mixed_signals(rank: int, world: int, port: int) -> list:
    """Even ranks send their rounds by kernel, odd ranks by copy engine: the
    same flags and values, so the whole matrix must pass (docs/api.md says
    the settings interoperate)."""
    return _with_signals("sm" if rank % 2 == 0 else "copy", correctness, rank, world, port)


def prelaunch_and_graphs_kernel_signals(rank: int, world: int, port: int) -> list:
    """Prepared collectives (the gate waited for in the ready round's kernel)
    and graphs replayed 10,000 times, with the rounds sent by kernels."""
    return _with_signals("sm", prelaunch_and_graphs, rank, world, port)


def latency_preset(rank: int, world: int, port: int) -> list:
    """FERRY_TUNING=latency: "auto" takes the shipped preset's variant and
    signals at each size (the SM path below its bound, copy engines above),
    and every size on both sides of the bounds is byte-exact, eager, repeated
    and replayed from a captured graph."""
    os.environ["FERRY_TUNING"] = "latency"  # read when the communicator is created
    import torch
    from ferry import tune

    comm = init(rank, world, port, timeout=60)
    dev = torch.device("cuda", rank)
    fails = []
    try:
        rules = tune.preset_rules(torch.cuda.get_device_name(dev), world, "latency")
        if rules is None:
            return fails  # no preset shipped for this GPU: the default applies (CPU-tested)
        for op in ("all_gather", "all_to_all", "all_to_allv", "broadcast", "reduce_scatter", "all_reduce"):
            for n in (4096, 512 << 10, 1 << 20, (1 << 20) + 16, 64 << 20):
                got = (comm.choose_algo(op, n), comm.choose_signals(op, n))
                # Rules naming "sm" apply where the window takes the call (n: the selector's bytes).
                fits = comm.sm_path_takes(op, n * world if op == "all_reduce" else n)
                want = tune.select([r for r in rules if r[3] != "sm" or fits], op, world, n)
                want = (want[0], want[1] if want[1] != "auto" else "copy")
                if got != want:
                    fails.append(f"rank {rank} {op} {n} B: auto chose {got}, the preset says {want}")
        buf = comm.alloc((world * ((4 << 20) + 8) * 2,), torch.uint8)
        bounds = (3, 4096, 1 << 20, (1 << 20) + 1, (4 << 20) + 1)  # uint8 and bf16: both sides of 1 MiB
        fails += check_collectives(
            torch, comm, [rank], [dev], world, [buf], sizes=bounds, a2a_sizes=bounds, algos=("auto",)
        )
        fails += check_repeats(torch, comm, [rank], [dev], world, [buf], reps=200)
        fails += check_same_buffers(torch, comm, [rank], [dev], world, [buf], reps=10, captured=True)
        comm.free(buf)
    finally:
        comm.close()
    return fails


def which_calls_need_sms(rank: int, world: int, port: int) -> list:
    """Every SM of each GPU held by spinning blocks (ferry's SmHolder). With
    copy signals, the calls the README says use no SM (64 KB each: in-place
    and out-of-place all_gather, the latter's own block through a peer by
    default; all_to_all with local_copy='peer'; in-place broadcast) must
    finish while the SMs are held; the same calls with signals='sm' (per
    call, same communicator and buffers) must not finish until they are
    released; signals='auto' follows the tuning table's rule where it names
    signals, else FERRY_SIGNALS (the test's parameter). A reduce_scatter
    (documented: its reduction is an SM kernel) must wait whatever the
    signals. Each setting runs three times (repeats are replayed from graphs
    ferry captures), with fresh data checked byte by byte after the release."""
    import torch

    default = os.environ.get("FERRY_SIGNALS", "copy")  # what signals='auto' means here
    comm = init(rank, world, port, timeout=60)
    dev = torch.device("cuda", rank)
    fails = []
    check = checker(torch, dev, rank, fails)
    n = 64 << 10
    gathered = comm.alloc((world * n,), torch.uint8)
    gathered_out = comm.alloc((world * n,), torch.uint8)
    own = torch.empty(n, dtype=torch.uint8, device=dev)
    swapped = comm.alloc((world * n,), torch.uint8)
    sent = torch.empty(world * n, dtype=torch.uint8, device=dev)
    bcast = comm.alloc((n,), torch.uint8)
    reduced = torch.empty(n // 4, dtype=torch.float32, device=dev)
    addends = torch.empty(world * (n // 4), dtype=torch.float32, device=dev)
    work = torch.cuda.Stream(device=dev)
    hold = SmHold(torch, [dev])

    def step(seed: int, signals: str):
        """Fresh inputs and poisoned outputs (before the SMs are held: torch's
        fills are kernels), the SM-free calls on `work`, and the expected outputs."""
        mine = rand_bytes(torch, seed + rank, n, dev)
        gathered.fill_(0xA5)
        gathered[rank * n : (rank + 1) * n].copy_(mine)
        gathered_out.fill_(0xA5)
        own.copy_(mine)
        sent.copy_(rand_bytes(torch, seed + 100 + rank, world * n, dev))
        swapped.fill_(0xA5)
        bcast.copy_(rand_bytes(torch, seed + 200, n, dev) if rank == 0 else torch.full_like(bcast, 0xA5))
        torch.cuda.synchronize(dev)

        def enqueue():
            comm.all_gather(gathered, gathered[rank * n : (rank + 1) * n], stream=work, signals=signals)
            comm.all_gather(gathered_out, own, stream=work, signals=signals)
            comm.all_to_all(swapped, sent, stream=work, local_copy="peer", signals=signals)
            comm.broadcast(bcast, root=0, stream=work, signals=signals)

        everyone = torch.cat([rand_bytes(torch, seed + s, n, dev) for s in range(world)])
        expected = {
            "all_gather in place": (gathered, everyone),
            "all_gather": (gathered_out, everyone),
            "all_to_all": (
                swapped,
                torch.cat(
                    [
                        rand_bytes(torch, seed + 100 + s, world * n, dev)[rank * n : (rank + 1) * n]
                        for s in range(world)
                    ]
                ),
            ),
            "broadcast": (bcast, rand_bytes(torch, seed + 200, n, dev)),
        }
        return enqueue, expected

    def held(label: str, enqueue, needs_sms: bool) -> None:
        """`enqueue` with every SM of this GPU held: it must finish (within
        10 s) or must not (within 0.5 s), then everything runs to the end."""
        print(label, file=sys.stderr, flush=True)  # where a run that hangs got to
        finished = hold.finishes(enqueue, work, within_s=0.5 if needs_sms else 10.0)
        comm.synchronize()
        if needs_sms and finished:
            fails.append(f"rank {rank} {label}: finished while every SM was held (no kernel ran?)")
        if not needs_sms and not finished:
            fails.append(f"rank {rank} {label}: did not finish within 10 s while every SM was held")

    try:
        # First calls plan, register and grow the scratch (not SM-free).
        enqueue, _ = step(0, "auto")
        enqueue()
        comm.reduce_scatter(reduced, addends, stream=work)
        comm.synchronize()
        seed = 1000
        ops = ("all_gather", "all_to_all", "broadcast", "reduce_scatter")
        # "sm" is the first name of "kernel", still accepted: one case each.
        cases = [(s, None) for s in ("copy", "kernel", "auto", "copy", "sm")]
        cases += [(s, t) for t in ("kernel", "copy") for s in ("auto", "copy", "kernel")]
        for signals, table in cases:
            comm.set_tuning([(op, 0, (1 << 63) - 1, "b2b", table or "auto") for op in ops])
            needs_sms = (signals if signals != "auto" else table or default) in ("kernel", "sm")
            for rep in range(3):
                seed += 1000
                label = f"signals={signals!r} table={table!r} #{rep}"
                enqueue, expected = step(seed, signals)
                held(label, enqueue, needs_sms)
                for what, (got, exp) in expected.items():
                    check(f"{label} {what}", got, exp)
        # The reduction is an SM kernel whatever signals the data movement uses.
        for signals in ("copy", "kernel"):
            summands = [ints(torch, seed + q, world * (n // 4), dev, torch.float32) for q in range(world)]
            addends.copy_(summands[rank])
            reduced.fill_(float("nan"))
            torch.cuda.synchronize(dev)
            held(
                f"reduce_scatter signals={signals!r}",
                lambda: comm.reduce_scatter(reduced, addends, stream=work, signals=signals),
                True,
            )
            check(
                f"reduce_scatter signals={signals!r}",
                reduced,
                sum(summands)[rank * (n // 4) : (rank + 1) * (n // 4)],
            )
    finally:
        comm.close()
    return fails


def kernel_signals_skipped_call(rank: int, world: int, port: int) -> list:
    """FERRY_SIGNALS=sm: rank 1 skips a collective that rank 0 makes. Rank
    0's ready-round kernel waits for rank 1's message; the watchdog must name
    rank 1 after the timeout and free the kernel, so that rank 0's
    synchronize() raises instead of hanging."""
    os.environ["FERRY_SIGNALS"] = "sm"
    import ferry
    import torch

    comm = init(rank, world, port, timeout=3)
    dev = torch.device("cuda", rank)
    out = comm.alloc((world * 4096,), torch.uint8)
    inp = rand_bytes(torch, rank, 4096, dev)
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


def kernel_gives_up_in_a_graph(rank: int, world: int, port: int) -> list:
    """Rank 0 replays a captured all_gather that rank 1 never replays; the
    waiting kernel is a signal round (FERRY_SIGNALS=sm) or the SM path's, per
    FERRY_TEST_KERNEL. The watchdog names rank 1 at the timeout (the state
    word of a captured call shows it running), and the kernel's own bound, a
    second later, ends its spin either way: the replay must end and the next
    check must name rank 1."""
    kind = os.environ.get("FERRY_TEST_KERNEL", "signals")
    if kind == "signals":
        os.environ["FERRY_SIGNALS"] = "sm"
    algo = "sm" if kind == "sm-path" else "auto"
    import ferry
    import torch

    comm = init(rank, world, port, timeout=2)
    dev = torch.device("cuda", rank)
    out = comm.alloc((world * 4096,), torch.uint8)
    inp = rand_bytes(torch, rank, 4096, dev)
    side = torch.cuda.Stream(device=dev)
    fails = []
    with torch.cuda.stream(side):
        comm.all_gather(out, inp, algo=algo)  # warm: the capture below records a known call
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            comm.all_gather(out, inp, algo=algo)
    comm.synchronize()
    torch.cuda.synchronize()
    if rank == 0:
        t0 = time.monotonic()
        graph.replay()
        torch.cuda.synchronize()  # returns once the kernel stopped waiting
        took = time.monotonic() - t0
        if took > 8:
            fails.append(f"the replay took {took:.1f} s with a 2 s timeout")
        try:
            comm.synchronize()
            fails.append(f"no error after the kernel waited {took:.1f} s for rank 1")
        except ferry.PeerTimeoutError as exc:
            if "rank 1" not in str(exc):
                fails.append(f"the error does not name rank 1: {exc}")
    else:
        time.sleep(8)  # alive, but never replays
    comm.close()
    return fails


def never_joins(rank: int, world: int, port: int) -> list:
    import ferry

    if rank == 1:
        time.sleep(8)  # alive, but never joins
        return []
    t0 = time.monotonic()
    try:
        init(rank, world, port, timeout=2)
    except ferry.PeerTimeoutError as exc:
        took = time.monotonic() - t0
        ok = "rank(s) 1 never arrived" in str(exc) and took < 10
        return [] if ok else [f"bad timeout error after {took:.1f} s: {exc}"]
    return ["init returned although rank 1 never joined"]


def paths_apart(rank: int, world: int, port: int) -> list:
    """Rank 0 runs an all_gather on the SM path, the others on copy engines:
    the SM path writes no ready flag a peer could read, so only what each rank
    publishes of its call shows it. Every rank names the paths at once, not
    after the timeout (30 s here), and the SM kernel gives up with it."""
    import ferry
    import torch

    comm = init(rank, world, port, timeout=30)
    dev = torch.device("cuda", rank)
    out = comm.alloc((world * 65536,), torch.uint8)
    inp = torch.full((65536,), rank, dtype=torch.uint8, device=dev)
    fails = []
    comm.all_gather(out, inp)  # one call in step first
    comm.synchronize()
    t0 = time.monotonic()
    expecter(ferry, fails, f"rank {rank}: ")(
        r"collective #\d+ on (copy engines|the SM path \(algo 'sm'\)) and rank \d+ on .*every rank must take the same "
        r"path",
        lambda: (comm.all_gather(out, inp, algo="sm" if rank == 0 else "auto"), comm.synchronize()),
    )
    if time.monotonic() - t0 > 10:
        fails.append(f"rank {rank}: the paths were named after {time.monotonic() - t0:.1f} s")
    t1 = time.monotonic()
    comm.close()
    if time.monotonic() - t1 > 10:
        fails.append(f"rank {rank}: close took {time.monotonic() - t1:.1f} s")
    return fails


def peer_dies(rank: int, world: int, port: int) -> list:
    import ferry
    import torch

    comm = init(rank, world, port, timeout=20)
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
    most = SM_BYTES  # the SM path's block limit (FERRY_SM_BYTES)
    bufs = comm.alloc((4 * (world * most + 512),), torch.uint8)  # check_two_shot's four regions
    fails = []

    def rand(tag, r, n):
        return rand_bytes(torch, zlib.crc32(f"{tag}/{r}".encode()), n, devs[r])

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
    # Reductions (copy engines or the SM path move, a kernel adds): random
    # values, references added in rank order as ferry adds them, odd counts.
    from _workers_reduce import DTYPES, _randoms, _reduced

    cases = [
        (getattr(torch, d), op, 70001 if (d, op) == ("bfloat16", "sum") else 1001)
        for d in DTYPES
        for op in ("sum", "max", "min")
    ]
    for algo in algos:
        for dtype, op, block in cases:
            tag = f"{algo}/{dtype}/{op}"
            xs = [
                _randoms(torch, zlib.crc32(f"{tag}/{r}".encode()), world * block, devs[r], dtype)
                for r in range(world)
            ]
            full = _reduced(torch, [x.cpu() for x in xs], op)
            rs = [b[: block * xs[0].element_size()].view(dtype) for b in bufs]
            expected = [full[r * block : (r + 1) * block] for r in range(world)]
            call = lambda o=rs, i=xs, a=algo, op=op: comm.reduce_scatter(o, i, op=op, stream=streams, algo=a)  # noqa: E731
            run(f"reduce_scatter/{tag}", call, rs, expected)
            if algo == "sm" and world * block * xs[0].element_size() > most:
                continue  # past the window in one shot (check_two_shot covers two)
            ar = [b[: world * block * xs[0].element_size()].view(dtype) for b in bufs]
            call = lambda o=ar, i=xs, a=algo, op=op: comm.all_reduce(o, i, op=op, stream=streams, algo=a)  # noqa: E731
            run(f"all_reduce/{tag}", call, ar, [full] * world)
    if "sm" in algos and world >= 3:
        from _workers_sm import check_two_shot

        print("sm: two-shot all_reduce", file=sys.stderr, flush=True)
        fails += check_two_shot(torch, comm, list(range(world)), devs, world, bufs, streams=streams)
    # The reduction kernel's grid bound (FERRY_REDUCE_BLOCKS, read when a call
    # is planned: fresh sizes, so no earlier plan is reused): a wide grid
    # reduces the same bits; a bound of 0 is refused, naming the knob.
    for blocks, block in (("132", 300007), ("0", 300011)):
        os.environ["FERRY_REDUCE_BLOCKS"] = blocks
        xs = [_randoms(torch, 77 + r, world * block, devs[r], torch.float32) for r in range(world)]
        rs = [b[: block * 4].view(torch.float32) for b in bufs]
        full = _reduced(torch, [x.cpu() for x in xs], "sum")
        call = lambda o=rs, i=xs: comm.reduce_scatter(o, i, stream=streams, algo="b2b")  # noqa: E731
        if blocks != "0":
            run(
                f"reduce_scatter/{blocks} blocks",
                call,
                rs,
                [full[r * block : (r + 1) * block] for r in range(world)],
            )
            continue
        try:
            call()
            fails.append("FERRY_REDUCE_BLOCKS=0 was taken")
        except ferry.InvalidArgumentError as exc:
            if "FERRY_REDUCE_BLOCKS=0; expected 1..1024" not in str(exc):
                fails.append(f"FERRY_REDUCE_BLOCKS=0 raised {exc!r}")
    os.environ.pop("FERRY_REDUCE_BLOCKS")
    comm.synchronize()
    comm.close()
    return fails


def sm_path_large_grid(world: int) -> list:
    """The SM path on FERRY_SM_MAX_BLOCKS blocks (set by the caller, above the
    default 32, with a FERRY_SM_BYTES window that takes multi-MB calls): the
    grid is bounded by the GPU's occupancy and every collective's bytes are
    right; then a bound past 128 and a negative two-shot threshold are refused,
    naming the knob."""
    import ferry
    import torch

    fails = []
    comm = ferry.init_local(list(range(world)), timeout=60)
    bufs = comm.alloc((world * ((64 << 20) + 8) * 2,), torch.uint8)
    devs = [torch.device("cuda", i) for i in range(world)]
    ranks = list(range(world))
    # Up to the window's edge: uint8 at SM_BYTES / 2 and SM_BYTES, bfloat16 at SM_BYTES.
    sizes = (1, 4096, 1000003, (4 << 20) + 3, SM_BYTES // 2, SM_BYTES)
    fails += check_collectives(
        torch, comm, ranks, devs, world, bufs, sizes=sizes, a2a_sizes=sizes, algos=("sm",)
    )
    fails += check_repeats(torch, comm, ranks, devs, world, bufs, reps=10, n=4 << 20, algo="sm")
    # The reductions, whose kernels fit one block per SM: in place all_reduce and reduce_scatter of small
    # integers (exact sums), 4 MiB and the window's size per peer, against sums on the host.
    for dtype_name in ("bfloat16", "int32"):
        dtype = getattr(torch, dtype_name)
        elem = torch.empty((), dtype=dtype).element_size()
        for nbytes in (4 << 20, SM_BYTES):
            n = nbytes // elem
            ins = [ints(torch, 7 + r, world * n, devs[r], dtype) for r in range(world)]
            ref = sum(t.cpu().to(torch.float64) for t in ins)
            # Outputs in the registered buffers (all_reduce's peers may store into them).
            ar = [b[:nbytes].view(dtype) for b in bufs]
            rs = [b[nbytes : 2 * nbytes].view(dtype) for b in bufs]
            for r in range(world):
                ar[r].copy_(ins[r][:n])
                rs[r].fill_(77)
            comm.all_reduce(ar, ar, algo="sm")
            comm.reduce_scatter(rs, ins, algo="sm")
            comm.synchronize()
            for r in range(world):
                if not torch.equal(ar[r].cpu().to(torch.float64), ref[:n]):
                    fails.append(f"all_reduce {dtype_name} {nbytes} B: rank {r} wrong")
                if not torch.equal(rs[r].cpu().to(torch.float64), ref[r * n : (r + 1) * n]):
                    fails.append(f"reduce_scatter {dtype_name} {nbytes} B: rank {r} wrong")
    if world >= 3:  # all_reduce in two shots, parts up to the 16 MiB window
        from _workers_sm import check_two_shot

        fails += check_two_shot(torch, comm, ranks, devs, world, bufs, window=SM_BYTES)
    comm.close()
    # Knob values a communicator must refuse, naming the knob (each set back after).
    refused = [
        ("FERRY_SM_MAX_BLOCKS", "129", "FERRY_SM_MAX_BLOCKS=129: expected 1 to 128"),
        ("FERRY_SM_TWO_SHOT_BYTES", "-1", "FERRY_SM_TWO_SHOT_BYTES=-1: expected 0 (never) or a byte count"),
    ]
    for knob, value, message in refused:
        before = os.environ.get(knob)
        os.environ[knob] = value
        try:
            ferry.init_local(list(range(world)), timeout=60).close()
            fails.append(f"{knob}={value} was taken")
        except ferry.InvalidArgumentError as exc:
            if message not in str(exc):
                fails.append(f"{knob}={value} raised {exc!r}")
        finally:
            if before is None:
                del os.environ[knob]
            else:
                os.environ[knob] = before
    return fails


def shared_gpu_long_calls(world: int, rounds: int) -> list:
    """check_long_calls with `world` ranks in one process on the visible GPUs,
    several per GPU (FERRY_SHARED_GPUS=1, set by the caller): each rank's part
    on a thread of its own, its GPU-mates' parts beside it on the same GPU."""
    os.environ.update(SAFE_ENV)
    import ferry
    import torch

    gpus = torch.cuda.device_count()
    devs = [torch.device("cuda", r % gpus) for r in range(world)]
    comm = ferry.init_local([d.index for d in devs], timeout=60)
    streams = [torch.cuda.Stream(device=d) for d in devs]
    bufs = comm.alloc((rounds * 4096 + 64,), torch.uint8)
    fails = check_long_calls(torch, comm, devs, world, bufs, streams=streams, rounds=rounds)
    comm.close()
    return fails


if __name__ == "__main__":  # python _workers.py untriggered GATE ALGO (a fresh process)
    if sys.argv[1] == "untriggered":
        problems = untriggered_is_reported(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "shared":  # python _workers.py shared WORLD ALGO,ALGO,...
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ.get("FERRY_TEST_DUMP_S", "240")), exit=True)
        problems = shared_gpu_world(int(sys.argv[2]), sys.argv[3].split(","))
    # python _workers.py sm-grid WORLD, under FERRY_SM_MAX_BLOCKS and FERRY_SM_BYTES
    elif sys.argv[1] == "sm-grid":
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ.get("FERRY_TEST_DUMP_S", "240")), exit=True)
        problems = sm_path_large_grid(int(sys.argv[2]))
    elif sys.argv[1] == "shared-long":  # python _workers.py shared-long WORLD ROUNDS
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ.get("FERRY_TEST_DUMP_S", "240")), exit=True)
        problems = shared_gpu_long_calls(int(sys.argv[2]), int(sys.argv[3]))
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

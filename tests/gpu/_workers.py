"""Code that runs inside the test processes (one per GPU). Each worker returns
a list of failure strings; an empty list is a pass."""

from __future__ import annotations

import os
import time
import traceback
import zlib

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

# Bytes per rank (all_gather) or per block (all_to_all), odd ones included.
SIZES = (1, 3, 4096, 1000003, (64 << 20) + 1)
A2A_SIZES = (1, 3, 4096, 1000003, (16 << 20) + 1)


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
):
    """Runs the correctness matrix for the local ranks `ranks` (one per device
    in `devs`; `buf` is one registered uint8 buffer per local rank) and returns
    failures. Works for one process per GPU (one local rank) and for
    init_local (all ranks local): collectives get lists in the second case."""
    local = len(ranks) > 1
    fails = []

    def call(name, outs, ins, **kw):
        getattr(comm, name)(outs if local else outs[0], ins if local else ins[0], **kw)

    def verify(label, outs, expected):
        for r, o, e in zip(ranks, outs, expected):
            torch.cuda.synchronize(o.device)
            bad = int((o != e).sum().item())
            if bad:
                fails.append(f"rank {r} {label}: {bad} wrong bytes of {e.numel()}")

    import ferry

    if not ferry.native.pcpy_supported(world):
        algos = tuple(a for a in algos if a != "pcpy")  # refused at this world size (tested below)
    cases = []
    for algo in algos:
        for n in sizes:
            cases.append(("all_gather", algo, n, "sm", 0, False))
        cases.append(("all_gather", algo, 1000003, "ce", 1, False))  # odd out offset, CE local copy
        cases.append(("all_gather", algo, 4096 * 3 + 5, "auto", 0, True))  # in-place
        for n in a2a_sizes:
            cases.append(("all_to_all", algo, n, "auto", 0, False))
        cases.append(("all_to_all", algo, 1000003, "auto", 3, False))
    for op, algo, n, lc, off, in_place in cases:
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            elem = torch.empty((), dtype=dtype).element_size()
            nbytes = n * elem
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
                f"{op} {algo} n={n} {dtype_name} local_copy={lc} offset={off} in_place={in_place}",
                [o.view(torch.uint8) for o in outs],
                expected,
            )
    return fails


def check_repeats(torch, comm, ranks, devs, world, buf, reps=1000, n=4096, streams=None):
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
                    f"rank {r}: {op} x{reps}{' on alternating streams' if streams else ''}: {bad} wrong bytes"
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
    expect(ferry.InvalidArgumentError, "overlap", lambda: comm.all_to_all(out, out))
    if not ferry.native.pcpy_supported(world):
        expect(ferry.UnsupportedError, "hardware queues", lambda: comm.all_gather(out, inp, algo="pcpy"))
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
        r"called all_gather\(bytes_per_rank=\d+.*must match",
        lambda: (comm.all_gather(out[: world * n], inp[:n]), comm.synchronize()),
    )
    if time.monotonic() - t0 > 30:
        fails.append(f"mismatch took {time.monotonic() - t0:.1f} s to report")
    expect(ferry.BrokenError, "broken by an earlier error", lambda: comm.all_gather(out, inp))
    comm.close()
    expect(ferry.ClosedError, "closed", lambda: comm.all_gather(out, inp))
    expect(ferry.ClosedError, "already closed", comm.close)
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


def run(target, rank, world, port, queue):
    try:
        queue.put((rank, target(rank, world, port)))
    except Exception:  # noqa: BLE001
        queue.put((rank, [traceback.format_exc()]))

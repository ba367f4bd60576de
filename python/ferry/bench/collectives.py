"""ferry against NCCL, one process per GPU, same buffers, same run.

Method (also in bench/README.md): for every op, size and implementation, the
output is poisoned, `warmup` collectives run, then `runs` timed runs of
`iters` back-to-back collectives each, bracketed by CUDA events on the
issuing stream after a barrier; time per collective = run time / iters; the
median run counts and the slowest rank's median is reported. Launch is
included (ferry and NCCL eager enqueue on the critical path); 'nccl-graph'
replays the `iters` collectives captured in one CUDA graph. After timing,
every byte of the output is compared with the expected data (#wrong).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import time

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

IMPLS = ("ferry-b2b", "ferry-pcpy", "ferry-seq", "nccl", "nccl-graph")


def _iters_for(total_bytes: int) -> int:
    if total_bytes <= 4 << 20:
        return 50
    if total_bytes <= 256 << 20:
        return 10
    return 3


def _log(rank: int, msg: str) -> None:
    if rank == 0:
        print(msg, file=sys.stderr, flush=True)


def _worker(rank: int, world: int, port: int, opts: dict, queue) -> None:
    os.environ.update(SAFE_ENV)
    import torch
    import torch.distributed as dist

    import ferry
    from ferry._native import require
    from ferry.bench.report import bandwidths, format_size

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev
    )
    comm = ferry.Communicator.from_torch(timeout=opts["timeout"])
    sizes, ops = opts["sizes"], opts["ops"]
    max_bytes = max(sizes)
    out_all = comm.alloc((world * max_bytes,), torch.uint8)
    inp_all = torch.empty(max_bytes, dtype=torch.uint8, device=dev)
    stream = torch.cuda.Stream(device=dev)
    gpu = torch.cuda.get_device_name(dev)
    today = datetime.date.today().isoformat()
    records = []

    def rand_bytes(seed: int, n: int):
        g = torch.Generator(device=dev)
        g.manual_seed(seed)
        return torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev, generator=g)

    def barrier():
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()

    def slowest(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def total(x: int) -> int:
        t = torch.tensor([x], dtype=torch.int64, device=dev)
        dist.all_reduce(t)
        return int(t.item())

    for op in ops:
        for n in sizes:
            if op == "all_to_all" and n % world:
                continue
            out_n = world * n if op == "all_gather" else n
            out, inp = out_all[:out_n], inp_all[:n]
            seed = lambda r: 1000003 * r + n
            inp.copy_(rand_bytes(seed(rank), n))
            if op == "all_gather":
                expected = torch.cat([rand_bytes(seed(r), n) for r in range(world)])
            else:
                blk = n // world
                expected = torch.cat(
                    [rand_bytes(seed(r), n)[rank * blk : (rank + 1) * blk] for r in range(world)]
                )
            iters = _iters_for(out_n)
            _log(rank, f"{op} {format_size(n)}: {iters} iterations x {opts['runs']} runs")

            def issue(impl):
                if impl.startswith("ferry"):
                    getattr(comm, op)(out, inp, algo=impl.split("-")[1], local_copy=opts["local_copy"])
                elif op == "all_gather":
                    dist.all_gather_into_tensor(out, inp)
                else:
                    dist.all_to_all_single(out, inp)

            for impl in opts["impls"]:
                if impl == "ferry-pcpy" and not require().pcpy_supported(world):
                    continue  # more streams than CUDA's hardware queues: refused (docs/architecture.md)
                if impl == "nccl-graph" and op == "all_to_all" and n > (1 << 20):
                    # all_to_all_single x50 captured in one graph hung at 4 MB on the H200 x4 machine
                    # (NCCL 2.28.9, 2026-11-22, twice); not investigated. NCCL eager stays in the table.
                    continue
                t_point = time.time()
                out.fill_(0xA5)
                barrier()
                graph = None
                with torch.cuda.stream(stream):
                    for _ in range(opts["warmup"]):
                        issue(impl)
                    if impl == "nccl-graph":
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph, stream=stream):
                            for _ in range(iters):
                                issue(impl)
                        graph.replay()
                barrier()
                times = []
                for _ in range(opts["runs"]):
                    barrier()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    with torch.cuda.stream(stream):
                        start.record(stream)
                        if graph is not None:
                            graph.replay()
                        else:
                            for _ in range(iters):
                                issue(impl)
                        end.record(stream)
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1000.0 / iters)
                if impl.startswith("ferry"):
                    comm.synchronize()
                barrier()
                wrong = total(int((out != expected).sum().item()))
                del graph
                t_us = slowest(statistics.median(times))
                algbw, busbw = bandwidths(op, world, n, t_us)
                rec = dict(
                    op=op,
                    impl="nccl" if impl.startswith("nccl") else impl,
                    impl_label=impl,
                    world=world,
                    bytes_per_rank=n,
                    time_us=round(t_us, 2),
                    algbw_gbps=round(algbw, 2),
                    busbw_gbps=round(busbw, 2),
                    graph=impl == "nccl-graph",
                    gpu=gpu,
                    date=today,
                    wrong=wrong,
                    warmup=opts["warmup"],
                    iters=iters,
                    runs=opts["runs"],
                    stat="median of runs, max over ranks",
                    local_copy=opts["local_copy"] if impl.startswith("ferry") else None,
                )
                records.append(rec)
                _log(
                    rank,
                    f"  {op:<10} {format_size(n):>6} {impl:<11} {t_us:>10.1f} us {busbw:>7.1f} GB/s  wrong={wrong}"
                    f"  [{time.time() - t_point:.1f} s]",
                )

    overlap = _overlap(comm, out_all, inp_all, world, rank, opts, barrier, slowest) if opts["overlap"] else []
    local = _local_copy_probe(dev, opts) if (opts["local_copy_probe"] and rank == 0) else []
    comm.close()
    dist.destroy_process_group()
    if rank == 0:
        queue.put({"records": records, "overlap": overlap, "local_copy": local, "gpu": gpu})


def _overlap(comm, out_all, inp_all, world, rank, opts, barrier, slowest) -> list:
    """A bf16 GEMM loop alone, then with all-gathers running beside it on
    another stream: ferry, then NCCL. Reports the GEMM loop's time."""
    import torch
    import torch.distributed as dist

    dev = out_all.device
    n = opts["overlap_bytes"]
    out, inp = out_all[: world * n], inp_all[:n]
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    gemms = opts["overlap_gemms"]
    compute, side = torch.cuda.Stream(device=dev), torch.cuda.Stream(device=dev)

    def gemm_loop():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(compute):
            start.record(compute)
            for _ in range(gemms):
                torch.mm(a, b)
            end.record(compute)
        return start, end

    def coll(impl):
        if impl == "nccl":
            dist.all_gather_into_tensor(out, inp)
        else:
            comm.all_gather(out, inp, algo="auto", local_copy=impl.split(":")[1])

    def timed_collectives(impl, count):
        barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(side):
            start.record(side)
            for _ in range(count):
                coll(impl)
            end.record(side)
        end.synchronize()
        return start.elapsed_time(end) / count

    for _ in range(3):
        torch.mm(a, b)
    results = []

    def gemm_alone():
        barrier()
        s, e = gemm_loop()
        e.synchronize()
        return s.elapsed_time(e)

    def gemm_beside(impl, count):
        barrier()
        with torch.cuda.stream(side):
            for _ in range(count):
                coll(impl)
        s, e = gemm_loop()
        e.synchronize()
        torch.cuda.synchronize()
        return s.elapsed_time(e)

    # Alone and beside alternate, so clock and thermal drift hits both alike.
    reps = opts["overlap_reps"]
    for impl in ("ferry:sm", "ferry:ce", "nccl"):
        t_coll = slowest(timed_collectives(impl, 5))
        # Every rank must issue the same number of collectives: derive it from
        # the slowest rank's times, not this rank's own.
        count = int(slowest(gemm_alone()) / max(t_coll, 1e-3)) + 2
        alone, beside = [], []
        for _ in range(reps):
            alone.append(gemm_alone())
            beside.append(gemm_beside(impl, count))
        if impl.startswith("ferry"):
            comm.synchronize()
        t_alone, t_beside = slowest(statistics.median(alone)), slowest(statistics.median(beside))
        label = {
            "ferry:ce": "ferry (local copy by cudaMemcpy hint ce)",
            "ferry:sm": "ferry (default: 32-block local copy)",
            "nccl": "nccl",
        }[impl]
        results.append(
            dict(
                impl=label,
                world=world,
                bytes_per_rank=n,
                gemms=gemms,
                gemm_shape="8192x8192x8192 bf16",
                gemm_alone_ms=round(t_alone, 3),
                gemm_beside_ms=round(t_beside, 3),
                slowdown_pct=round(100 * (t_beside / t_alone - 1), 2),
                reps=reps,
                stat="median of reps (alone and beside alternate), max over ranks",
                collective_alone_ms=round(t_coll, 3),
                collectives_beside=count,
            )
        )
        if rank == 0:
            r = results[-1]
            print(
                f"  overlap {label:<40} gemm {t_alone:8.2f} -> {t_beside:8.2f} ms ({r['slowdown_pct']:+.1f}%), "
                f"all_gather alone {t_coll:.3f} ms",
                file=sys.stderr,
                flush=True,
            )
    return results


def _local_copy_probe(dev, opts) -> list:
    """How fast one GPU copies a block within itself: copy engine (batched call
    with the copy-engine hint), plain cudaMemcpyAsync, ferry's SM kernel."""
    import torch

    from ferry._native import require

    native = require()
    out = []
    stream = torch.cuda.Stream(device=dev)
    for n in (4096, 1 << 20, 16 << 20, 256 << 20):
        src = torch.empty(n, dtype=torch.uint8, device=dev).random_()
        dst = torch.empty(n + 1, dtype=torch.uint8, device=dev)
        for how in ("ce", "memcpy", "sm"):
            for off in (0, 1):
                times = []
                for _ in range(5):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record(stream)
                    for _ in range(10):
                        native.copy_local(dst.data_ptr() + off, src.data_ptr(), n, how, stream.cuda_stream)
                    e.record(stream)
                    e.synchronize()
                    times.append(s.elapsed_time(e) * 100.0)  # us per copy
                ok = bool(torch.equal(dst[off : off + n], src))
                t = statistics.median(times)
                out.append(
                    dict(
                        bytes=n,
                        method=how,
                        dst_offset=off,
                        time_us=round(t, 2),
                        gbps=round(n / (t * 1e-6) / 1e9, 1),
                        correct=ok,
                    )
                )
                print(
                    f"  local copy {n:>10} B {how:<7} offset {off}: {t:9.1f} us {n / (t * 1e-6) / 1e9:8.1f} GB/s"
                    f" {'ok' if ok else 'WRONG'}",
                    file=sys.stderr,
                    flush=True,
                )
    return out


def run(world: int, opts: dict) -> dict:
    """Spawns one process per GPU and returns rank 0's results."""
    import socket

    import torch.multiprocessing as mp

    os.environ.update(SAFE_ENV)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, port, opts, queue)) for r in range(world)]
    t0 = time.time()
    for p in procs:
        p.start()
    result = None
    while result is None:
        try:
            result = queue.get(timeout=5)
        except Exception:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise RuntimeError("a benchmark process failed; see its output above")
    for p in procs:
        p.join(60)
    result["seconds"] = round(time.time() - t0, 1)
    return result


def save(result: dict, world: int, out_dir: str, command: str, plot: bool) -> str:
    from ferry.bench.report import format_table, ratio_table
    from ferry.bench.report import plot as plot_png

    os.makedirs(out_dir, exist_ok=True)
    today = datetime.date.today().isoformat()
    gpu = result["gpu"].replace(" ", "-")
    stem = os.path.join(out_dir, f"{today}-{gpu}-x{world}")
    payload = dict(
        command=command,
        date=today,
        gpu=result["gpu"],
        world=world,
        method=__doc__.strip(),
        records=result["records"],
        overlap=result["overlap"],
        local_copy=result["local_copy"],
    )
    with open(stem + ".json", "w") as f:
        json.dump(payload, f, indent=1)
    text = [
        f"# {command}",
        f"# {result['gpu']} x{world}, {today}",
        "",
        format_table(result["records"]),
        "",
        ratio_table(result["records"]),
    ]
    with open(stem + ".txt", "w") as f:
        f.write("\n".join(text) + "\n")
    if plot:
        plot_png(result["records"], stem + ".png", f"{result['gpu']} x{world}")
    return stem

"""ferry against NCCL, one process per GPU, same buffers, same run.

Method (also in bench/README.md): for every op, size and implementation, the
output is poisoned, `warmup` collectives run, then `runs` timed runs of
`iters` back-to-back collectives each, bracketed by CUDA events on the
issuing stream after a barrier; time per collective = run time / iters; the
median run counts and the slowest rank's median is reported. Launch is
included (ferry and NCCL eager enqueue on the critical path; ferry's eager
calls repeat with the same buffers, so from the second one on ferry launches
them from the graph it captured for the call, as it does for any user:
FERRY_REPLAY_CALLS=0 times the plain path); 'nccl-graph' replays the `iters`
collectives captured in one CUDA graph. After timing,
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


# ferry-sm*: not copy engines (algo "sm": one SM kernel), measured beside them.
# ferry-ksig*: the selector's copy-engine variant with its two signal rounds
# sent by a one-block kernel (signals="kernel"; the default set has the graph
# form); ferry-auto: the selector's choice, eager (with a tuning table that
# names "sm" or signals, not SM-free), not in the default set.
IMPLS = (
    "ferry-auto",
    "ferry-b2b",
    "ferry-pcpy",
    "ferry-seq",
    "ferry-graph",
    "ferry-sm",
    "ferry-sm-graph",
    "ferry-ksig",
    "ferry-ksig-graph",
    "nccl",
    "nccl-graph",
)
DEFAULT_IMPLS = tuple(i for i in IMPLS if i not in ("ferry-auto", "ferry-ksig"))


def _iters_for(total_bytes: int) -> int:
    if total_bytes <= 4 << 20:
        return 50
    if total_bytes <= 256 << 20:
        return 10
    return 3


def _log(rank: int, msg: str) -> None:
    if rank == 0:
        print(msg, file=sys.stderr, flush=True)


class Ctx:
    """What every measurement of one rank shares."""

    def __init__(self, torch, dist, comm, rank, world, opts):
        self.torch, self.dist, self.comm, self.rank, self.world, self.opts = (
            torch,
            dist,
            comm,
            rank,
            world,
            opts,
        )
        self.dev = torch.device("cuda", rank)
        self.stream = torch.cuda.Stream(device=self.dev)
        # Host-only group: while a prepared collective is armed, no GPU work may
        # be needed to trigger it (an NCCL barrier could queue behind the armed
        # wait in a shared hardware queue; see docs/api.md, Prelaunch).
        self.host_group = dist.new_group(backend="gloo")

    def barrier(self):
        self.torch.cuda.synchronize()
        self.dist.barrier()
        self.torch.cuda.synchronize()

    def slowest(self, x: float) -> float:
        t = self.torch.tensor([x], dtype=self.torch.float64, device=self.dev)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item())

    def total(self, x: float) -> float:
        t = self.torch.tensor([x], dtype=self.torch.float64, device=self.dev)
        self.dist.all_reduce(t)
        return float(t.item())

    def log(self, msg: str) -> None:
        _log(self.rank, msg)

    def case(self, op: str, n: int, out_all, inp_all):
        """The Case of `op` at `n` bytes per rank, as the options ask (--in-place)."""
        from ferry.bench.cases import Case

        return Case(
            self.torch,
            self.dist,
            self.comm,
            op,
            n,
            self.world,
            self.rank,
            out_all,
            inp_all,
            in_place=self.opts.get("in_place", False),
        )


def _worker(rank: int, world: int, port: int, opts: dict, queue) -> None:
    os.environ.update(SAFE_ENV)
    if opts.get("prelaunch"):
        # The chain measurement triggers armed collectives from a torch stream;
        # with CUDA's default 8 hardware queues that stream can share one with
        # ferry's armed stream and wait behind it (docs/api.md, Prelaunch).
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    import faulthandler

    faulthandler.enable()  # a crash in native code still says where
    if os.environ.get("FERRY_BENCH_DUMP_S"):  # where a stuck run stands (device time is scarce)
        faulthandler.dump_traceback_later(float(os.environ["FERRY_BENCH_DUMP_S"]), exit=False)
    import torch
    import torch.distributed as dist

    import ferry
    from ferry.bench import energy, overlap, prelaunch

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev
    )
    comm = ferry.Communicator.from_torch(timeout=opts["timeout"])
    if opts.get("tuning") is not None:
        comm.set_tuning(opts["tuning"])
    ctx = Ctx(torch, dist, comm, rank, world, opts)
    max_bytes = max(opts["sizes"] + (list(opts["overlap_sizes"]) if opts["overlap"] else []))
    out_all = comm.alloc((world * max_bytes,), torch.uint8)
    inp_all = torch.empty(max_bytes, dtype=torch.uint8, device=dev)
    gpu = torch.cuda.get_device_name(dev)
    result = {"gpu": gpu}
    result["records"] = _sweep(ctx, out_all, inp_all, gpu) if opts["impls"] else []
    if opts.get("prelaunch"):
        result["prelaunch"] = prelaunch.trigger_to_done(ctx, out_all, inp_all)
        result["chain"] = prelaunch.chain(ctx, out_all, inp_all)
    if opts.get("phases"):
        result["phases"] = prelaunch.phases(ctx, out_all, inp_all)
    if opts["overlap"]:
        result["overlap"] = overlap.run(ctx, out_all, inp_all)
    if opts.get("energy"):
        result["energy"] = energy.run(ctx, out_all, inp_all)
    if opts["local_copy_probe"] and rank == 0:
        result["local_copy"] = _local_copy_probe(dev, opts)
    comm.close()
    dist.destroy_process_group()
    if rank == 0:
        queue.put(result)


def _sweep(ctx: Ctx, out_all, inp_all, gpu: str) -> list:
    from ferry.bench.cases import fits, impl_options, sm_fits
    from ferry.bench.report import bandwidths, format_size
    from ferry.tune import selection_bytes

    torch, opts, world = ctx.torch, ctx.opts, ctx.world
    today = datetime.date.today().isoformat()
    records = []
    for op in opts["ops"]:
        for n in opts["sizes"]:
            if not fits(op, n, world):
                continue
            case = ctx.case(op, n, out_all, inp_all)
            iters = _iters_for(case.out.numel() * case.out.element_size())
            ctx.log(f"{op} {format_size(n)}: {iters} iterations x {opts['runs']} runs")
            for impl in opts["impls"]:
                if (
                    impl == "nccl-graph"
                    and op in ("all_to_all", "all_to_allv")
                    and n > (1 << 20)
                    and not opts.get("a2a_nccl_graph")
                ):
                    # all_to_all_single x50 captured in one graph hung at 4 MB on the H200 x4 machine
                    # (NCCL 2.28.9, twice) and on x2 (--a2a-nccl-graph, killed after 200 s:
                    # bench/results/raw/2026-11-23-x2-twelfth-a2a-nccl-graph-hang.log); not investigated. NCCL eager stays in the table; --a2a-nccl-graph
                    # tries it anyway (run it under a timeout).
                    continue
                if impl.startswith("ferry-sm") and not sm_fits(ctx.comm, op, n, world):
                    continue  # past the SM path's window (FERRY_SM_BYTES)
                t_point = time.time()
                case.reset()
                ctx.barrier()
                graph = None
                with torch.cuda.stream(ctx.stream):
                    for _ in range(opts["warmup"]):
                        case.issue(impl, opts["local_copy"])
                    if impl.endswith("-graph"):
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph, stream=ctx.stream):
                            for _ in range(iters):
                                case.issue(impl, opts["local_copy"])
                        graph.replay()
                ctx.barrier()
                times = []
                for _ in range(opts["runs"]):
                    ctx.barrier()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    with torch.cuda.stream(ctx.stream):
                        start.record(ctx.stream)
                        if graph is not None:
                            graph.replay()
                        else:
                            for _ in range(iters):
                                case.issue(impl, opts["local_copy"])
                        end.record(ctx.stream)
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1000.0 / iters)
                ctx.comm.synchronize()
                ctx.barrier()
                if graph is not None and impl.startswith("ferry"):  # the captured calls themselves
                    case.reset()
                    ctx.barrier()
                    with torch.cuda.stream(ctx.stream):
                        graph.replay()
                    wrong = int(ctx.total(case.wrong_bytes()))
                else:
                    with torch.cuda.stream(ctx.stream):
                        wrong = int(ctx.total(case.check(impl)))
                ctx.comm.synchronize()
                del graph
                t_us = ctx.slowest(statistics.median(times))
                algbw, busbw = bandwidths(op, world, n, t_us)
                algo, signals = impl_options(impl) if impl.startswith("ferry") else (None, None)
                records.append(
                    dict(
                        op=op,
                        impl="nccl" if impl.startswith("nccl") else impl,
                        impl_label=impl,
                        algo=ctx.comm.choose_algo(op, selection_bytes(op, n, world))
                        if algo == "auto"
                        else algo,
                        signals=ctx.comm.choose_signals(op, selection_bytes(op, n, world))
                        if signals == "auto"
                        else signals,
                        world=world,
                        bytes_per_rank=n,
                        time_us=round(t_us, 2),
                        algbw_gbps=round(algbw, 2),
                        busbw_gbps=round(busbw, 2),
                        graph=impl.endswith("-graph"),
                        gpu=gpu,
                        date=today,
                        wrong=wrong,
                        warmup=opts["warmup"],
                        iters=iters,
                        runs=opts["runs"],
                        stat="median of runs, max over ranks",
                        local_copy=opts["local_copy"] if impl.startswith("ferry") else None,
                        in_place=case.in_place,
                    )
                )
                ctx.log(
                    f"  {op:<14} {format_size(n):>6} {impl:<11} {t_us:>10.1f} us {busbw:>7.1f} GB/s  wrong={wrong}"
                    f"  [{time.time() - t_point:.1f} s]"
                )
    return records


def _local_copy_probe(dev, opts) -> list:
    """How fast one GPU copies a block within itself: cudaMemcpyAsync (CUDA's
    copy kernel) and ferry's SM kernel (32 blocks)."""
    import torch

    from ferry._native import hooks as load_hooks

    hooks = load_hooks()
    out = []
    stream = torch.cuda.Stream(device=dev)
    for n in (4096, 1 << 20, 16 << 20, 256 << 20):
        src = torch.empty(n, dtype=torch.uint8, device=dev).random_()
        dst = torch.empty(n + 1, dtype=torch.uint8, device=dev)
        for how in ("driver", "sm"):
            for off in (0, 1):
                times = []
                for _ in range(5):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record(stream)
                    for _ in range(10):
                        hooks.copy_local(dst.data_ptr() + off, src.data_ptr(), n, how, stream.cuda_stream)
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


def run_repeated(world: int, opts: dict, repeat: int) -> dict:
    """`run`, then the sweep `repeat - 1` more times in fresh processes (the
    other measurements only the first time), each point's median repeat kept
    with every repeat's time (report.merge_repeats): one process can sit
    5-10 us slower than the next at small sizes."""
    from ferry.bench.report import merge_repeats

    result = run(world, opts)
    if repeat > 1:
        sweep_only = dict(
            opts, overlap=False, prelaunch=False, phases=False, energy=False, local_copy_probe=False
        )
        runs = [result["records"]]
        for k in range(2, repeat + 1):
            _log(0, f"repeat {k} of {repeat}")
            runs.append(run(world, sweep_only)["records"])
        result["records"] = merge_repeats(runs)
        result["repeats"] = repeat
    return result


def save(result: dict, world: int, out_dir: str, command: str, plot: bool, tag: str = "") -> tuple:
    from ferry.bench.report import format_table, ratio_table
    from ferry.bench.report import plot as plot_png

    os.makedirs(out_dir, exist_ok=True)
    today = datetime.date.today().isoformat()
    gpu = result["gpu"].replace(" ", "-")
    stem = os.path.join(out_dir, f"{today}-{gpu}-x{world}" + (f"-{tag}" if tag else ""))
    payload = dict(
        command=command,
        date=today,
        gpu=result["gpu"],
        world=world,
        method=__doc__.strip(),
        records=result["records"],
        **{
            k: result[k]
            for k in ("repeats", "prelaunch", "chain", "phases", "overlap", "energy", "local_copy")
            if k in result
        },
    )
    with open(stem + ".json", "w") as f:
        json.dump(payload, f, indent=1)
    text = [f"# {command}", f"# {result['gpu']} x{world}, {today}"]
    if result["records"]:  # none with --impls ""
        text += ["", format_table(result["records"]), "", ratio_table(result["records"])]
    from ferry.bench.report import format_sections

    text += format_sections(result)
    with open(stem + ".txt", "w") as f:
        f.write("\n".join(text) + "\n")
    pngs = []
    if plot:
        from ferry.bench.report import plot_overlap, plot_phases

        title = f"{result['gpu']} x{world}"
        for key, draw, suffix in (
            ("records", plot_png, ".png"),
            ("phases", plot_phases, "-phases.png"),
            ("overlap", plot_overlap, "-overlap.png"),
        ):
            # Each returns False without matplotlib.
            if result.get(key) and draw(result[key], stem + suffix, title):
                pngs.append(stem + suffix)
    return stem, pngs

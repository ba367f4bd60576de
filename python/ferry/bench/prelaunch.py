"""Prelaunch: how long a prepared collective takes from its trigger to its
end, and the phase breakdown (control, schedule, copy, sync) derived from it.

Trigger-to-done: every rank arms the collective, then all ranks trigger from
the host at the same CLOCK_MONOTONIC instant (one clock for all processes of
the host) and spin on the run's end event; the time from that instant to the
end, max over ranks, median over runs. Done means this rank's output is
complete (every peer's data landed) and its flags are reset.
"""

from __future__ import annotations

import statistics
import time


def _start_instant(ctx, lead_s: float = 0.003) -> int:
    """An instant `lead_s` from now on rank 0's monotonic clock, known to all ranks."""
    torch = ctx.torch
    t = torch.tensor([time.monotonic_ns() + int(lead_s * 1e9)], dtype=torch.int64)
    ctx.dist.broadcast(t, src=0, group=ctx.host_group)
    return int(t.item())


def measure(ctx, case, algo: str, runs: int) -> float:
    """Median over runs of the slowest rank's trigger-to-done time (us)."""
    comm, torch = ctx.comm, ctx.torch
    if case.op == "broadcast":  # in place from rank 0, as Case issues it
        h = comm.prepare("broadcast", case.out, None, root=0, algo=algo)
    else:
        h = comm.prepare(case.op, case.out, case.inp, algo=algo)
    from ferry._native import hooks as load_hooks

    native, hooks = comm._c, load_hooks()
    lat = []
    try:
        for i in range(runs + 2):
            case.reset()
            torch.cuda.synchronize()
            h.arm(ctx.stream)
            ctx.dist.barrier(group=ctx.host_group)  # every rank armed; the ready handshake runs meanwhile
            start = _start_instant(ctx)
            t0, t1 = hooks.timed_trigger(lambda: native.trigger(h._h), native.finished_event(h._h, 0), start)
            if i >= 2:  # two warm-up runs
                lat.append((t1 - start) / 1000.0)
        wrong = case.wrong_bytes()
    finally:
        if not h.armed:  # else an error left it armed: close() opens its gate
            comm.synchronize()
            h.release()
    if ctx.total(wrong):
        raise RuntimeError(f"prelaunched {case.op} {algo} n={case.n}: wrong output")
    return ctx.slowest(statistics.median(lat))


def trigger_to_done(ctx, out_all, inp_all) -> list:
    """The selector's variant, and ferry's SM path where the size allows it."""
    from ferry.bench.cases import fits, sm_fits
    from ferry.bench.report import format_size
    from ferry.tune import selection_bytes

    opts, out = ctx.opts, []
    for op in opts["prelaunch_ops"]:
        for n in opts["prelaunch_sizes"]:
            if not fits(op, n, ctx.world):
                continue
            case = ctx.case(op, n, out_all, inp_all)
            algos = [ctx.comm.choose_algo(op, selection_bytes(op, n, ctx.world))]
            algos += ["sm"] if sm_fits(ctx.comm, op, n, ctx.world) else []
            for algo in algos:
                t = measure(ctx, case, algo, opts["prelaunch_runs"])
                out.append(
                    dict(
                        op=op,
                        world=ctx.world,
                        bytes_per_rank=n,
                        algo=algo,
                        trigger_to_done_us=round(t, 2),
                        runs=opts["prelaunch_runs"],
                        trigger="host store at one instant on every rank",
                        stat="median of runs, max over ranks",
                    )
                )
                ctx.log(f"  prelaunch {op:<14} {format_size(n):>6} {algo:<5} trigger->done {t:8.1f} us")
    return out


def phases(ctx, out_all, inp_all) -> list:
    """Per variant and size: control (host time to enqueue one collective),
    in-stream time, prelaunched trigger-to-done, and by difference
    schedule = in-stream - trigger-to-done (what arming ahead takes off the
    critical path: submission and the ready handshake), sync = trigger-to-done
    at 1 byte (the done message's floor) and copy = trigger-to-done - sync."""
    from ferry.bench.report import format_size

    torch, opts, out = ctx.torch, ctx.opts, []
    op = "all_gather"
    for algo in opts["phase_algos"]:
        floor = measure(ctx, ctx.case(op, 1, out_all, inp_all), algo, opts["prelaunch_runs"])
        for n in opts["phase_sizes"]:
            case = ctx.case(op, n, out_all, inp_all)
            case.reset()
            iters = 20
            ctx.barrier()
            host, gpu = [], []
            for _ in range(opts["runs"]):
                ctx.barrier()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with torch.cuda.stream(ctx.stream):
                    s.record(ctx.stream)
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        case.issue(f"ferry-{algo}")
                    host.append((time.perf_counter() - t0) * 1e6 / iters)
                    e.record(ctx.stream)
                e.synchronize()
                gpu.append(s.elapsed_time(e) * 1000.0 / iters)
            ctx.comm.synchronize()
            control = ctx.slowest(statistics.median(host))
            in_stream = ctx.slowest(statistics.median(gpu))
            pre = measure(ctx, case, algo, opts["prelaunch_runs"])
            rec = dict(
                op=op,
                world=ctx.world,
                algo=algo,
                bytes_per_rank=n,
                control_us=round(control, 2),
                in_stream_us=round(in_stream, 2),
                trigger_to_done_us=round(pre, 2),
                schedule_us=round(max(in_stream - pre, 0.0), 2),
                sync_us=round(floor, 2),
                copy_us=round(max(pre - floor, 0.0), 2),
                derivation="schedule = in_stream - trigger_to_done; sync = trigger_to_done at 1 byte; copy = rest",
            )
            out.append(rec)
            ctx.log(
                f"  phases {algo:<5} {format_size(n):>6} control {control:7.1f} schedule {rec['schedule_us']:7.1f} "
                f"copy {rec['copy_us']:8.1f} sync {floor:6.1f} (in-stream {in_stream:8.1f}) us"
            )
    return out


CHAIN_SPIN_NS = 100_000  # the producer kernel: long enough that the host stays ahead
CHAIN_ITERS = 30


def _chain_time(ctx, step, runs: int) -> float:
    """Median over runs of the GPU time per iteration of `step` (us), this rank."""
    torch, times = ctx.torch, []
    for _ in range(runs):
        ctx.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(ctx.stream):
            start.record(ctx.stream)
            for _ in range(CHAIN_ITERS):
                step()
            end.record(ctx.stream)
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / CHAIN_ITERS)
    return statistics.median(times)


def chain(ctx, out_all, inp_all) -> list:
    """What a collective adds to a chain producer kernel -> collective ->
    next producer kernel, in steady state: GPU time per iteration minus that of
    the producer kernel alone (a 100 us spin, then a store), on one stream.
    Every rank's iterations wait for every other rank's, so the chain measures
    the critical path without comparing clocks across GPUs. Prelaunched
    variants arm before the producer (the ready handshake overlaps it) and are
    released by a stream write after it (trigger(stream)) or by the producer
    kernel itself (device trigger), with the gate in host or GPU memory; NCCL
    runs eagerly or as a captured graph of one call after the producer. Where
    the size allows it, ferry's SM path (algo "sm", not copy engines) runs the
    same ways."""
    from ferry.bench.cases import fits, sm_fits
    from ferry.bench.report import format_size

    torch, opts, s = ctx.torch, ctx.opts, ctx.stream
    from ferry._native import hooks as load_hooks

    hooks = load_hooks()
    word = torch.zeros(1, dtype=torch.int64, device=ctx.dev)
    runs = max(3, opts["runs"])

    def produce(w=word.data_ptr(), value=1):
        hooks.launch_trigger_kernel(w, value, CHAIN_SPIN_NS, s.cuda_stream)

    base = ctx.slowest(_chain_time(ctx, produce, runs))
    ctx.log(f"  chain: producer kernel alone {base:.1f} us per iteration")
    out = []
    for op in opts["prelaunch_ops"]:
        for n in opts["prelaunch_sizes"]:
            if not fits(op, n, ctx.world):
                continue
            case = ctx.case(op, n, out_all, inp_all)
            h = ctx.comm.prepare(op, case.out, case.inp)
            # The own block by the SM kernel instead of the default (through a
            # peer up to 1 MiB): what that trip costs on the critical path.
            h_sm = ctx.comm.prepare(op, case.out, case.inp, local_copy="sm")
            sm_path = sm_fits(ctx.comm, op, n, ctx.world)
            h_kernel = ctx.comm.prepare(op, case.out, case.inp, algo="sm") if sm_path else None

            def prepared(trigger, gate, handle=h):
                def step():
                    handle.arm(s, gate=gate)
                    if trigger == "stream":  # a stream write after the producer
                        produce()
                        handle.trigger(s)
                    else:  # the producer kernel fires it
                        produce(*handle.device_trigger())
                    handle.wait(s)

                return step

            def eager(impl):
                def step():
                    produce()
                    case.issue(impl)

                return step

            graphs = []

            def graphed(impl):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.stream(s):
                    case.issue(impl)
                    with torch.cuda.graph(graph, stream=s):
                        case.issue(impl)
                graphs.append(graph)

                def step():
                    produce()
                    graph.replay()

                return step

            variants = [
                ("ferry, stream trigger, host gate", prepared("stream", "host"), True),
                ("ferry, stream trigger, device gate", prepared("stream", "device"), True),
                ("ferry, kernel trigger, host gate", prepared("kernel", "host"), True),
                ("ferry, kernel trigger, device gate", prepared("kernel", "device"), True),
                ("ferry, stream trigger, own block by SMs", prepared("stream", "host", h_sm), True),
                ("ferry, eager", eager("ferry"), True),
                ("nccl, eager", eager("nccl"), False),
                ("nccl, graph", graphed("nccl"), False),
            ]
            if sm_path:
                variants += [
                    ("ferry sm, eager", eager("ferry-sm"), True),
                    ("ferry sm, graph", graphed("ferry-sm"), True),
                    ("ferry sm, kernel trigger, device gate", prepared("kernel", "device", h_kernel), True),
                ]
            try:
                for name, step, check in variants:
                    case.reset()
                    t = ctx.slowest(_chain_time(ctx, step, runs))
                    ctx.comm.synchronize()
                    wrong = int(ctx.total(case.wrong_bytes())) if check else 0
                    rec = dict(
                        op=op,
                        world=ctx.world,
                        bytes_per_rank=n,
                        variant=name,
                        added_us=round(t - base, 2),
                        iteration_us=round(t, 2),
                        producer_us=round(base, 2),
                        wrong=wrong,
                        iters=CHAIN_ITERS,
                        runs=runs,
                        stat="median of runs, max over ranks; added = iteration - producer alone",
                    )
                    out.append(rec)
                    ctx.log(
                        f"  chain {op:<11} {format_size(n):>6} {name:<36} +{t - base:7.1f} us  wrong={wrong}"
                    )
                    if wrong:
                        raise RuntimeError(f"chain {op} n={n} {name}: wrong output")
            finally:
                ctx.comm.synchronize()
                h.release()
                h_sm.release()
                if h_kernel is not None:
                    h_kernel.release()
                graphs.clear()
    return out

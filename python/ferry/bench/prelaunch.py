"""Prelaunch: how long a prepared collective takes from its trigger to its
end, and the phase breakdown of seed 000 section 3.2 derived from it.

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
    native = comm._c
    lat = []
    try:
        for i in range(runs + 2):
            case.reset()
            torch.cuda.synchronize()
            h.arm(ctx.stream)
            ctx.dist.barrier(group=ctx.host_group)  # every rank armed; the ready handshake runs meanwhile
            start = _start_instant(ctx)
            t0, t1 = native.timed_trigger(h._h, start)
            if i >= 2:  # two warm-up runs
                lat.append((t1 - start) / 1000.0)
        wrong = case.wrong_bytes()
    finally:
        comm.synchronize()
        h.release()
    if ctx.total(wrong):
        raise RuntimeError(f"prelaunched {case.op} {algo} n={case.n}: wrong output")
    return ctx.slowest(statistics.median(lat))


def trigger_to_done(ctx, out_all, inp_all) -> list:
    from ferry.bench.cases import Case, fits
    from ferry.bench.report import format_size
    from ferry.tune import selection_bytes

    opts, out = ctx.opts, []
    for op in opts["prelaunch_ops"]:
        for n in opts["prelaunch_sizes"]:
            if not fits(op, n, ctx.world):
                continue
            case = Case(ctx.torch, ctx.dist, ctx.comm, op, n, ctx.world, ctx.rank, out_all, inp_all)
            algo = ctx.comm.choose_algo(op, selection_bytes(op, n, ctx.world))
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
    from ferry.bench.cases import Case
    from ferry.bench.report import format_size

    torch, opts, out = ctx.torch, ctx.opts, []
    op = "all_gather"
    for algo in opts["phase_algos"]:
        floor = measure(
            ctx,
            Case(torch, ctx.dist, ctx.comm, op, 1, ctx.world, ctx.rank, out_all, inp_all),
            algo,
            opts["prelaunch_runs"],
        )
        for n in opts["phase_sizes"]:
            case = Case(torch, ctx.dist, ctx.comm, op, n, ctx.world, ctx.rank, out_all, inp_all)
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

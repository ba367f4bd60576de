"""Compute beside communication (all-gathers, or another collective with
--overlap-op). For each size: a loop of bf16 GEMMs alone;
the collective alone; then both started together on two streams, timing the
GEMM loop (its slowdown) and the end-to-end time until both are done. The
collective count is chosen so that the collectives alone take about as long
as the GEMM loop for the slowest implementation, and every implementation
moves the same number of collectives (the same count on every rank), so their
end-to-end times compare the same work. Alone and beside alternate,
so clock and thermal drift hit both alike; medians of reps, max over ranks.

While the GEMMs run (alone and beside), NVML is read every 0.5 ms: the SM
clock, the board power and whether the driver holds clocks down for power.
A GEMM that slows beside an SM-free collective, at the same clock, lost
memory bandwidth; at a lower clock under the power cap, it lost power."""

from __future__ import annotations

import statistics

# key: (label, what Case.issue runs, local_copy). "ferry-sm-path" is not copy
# engines (algo "sm", one SM kernel); it runs where its window takes the size.
# "ferry-ksig" (signal rounds by kernel) runs when the sweep's --impls name it.
IMPLS = {
    "ferry": ("ferry (default local copy)", "ferry", "auto"),
    "ferry-peer": ("ferry (own block through a peer, no SM)", "ferry", "peer"),
    "ferry-local-sm": ("ferry (local copy by 32-block kernel)", "ferry", "sm"),
    "ferry-driver": ("ferry (local copy by cudaMemcpyAsync)", "ferry", "driver"),
    "ferry-sm-path": ("ferry algo 'sm' (SM kernel, not copy engines)", "ferry-sm", "auto"),
    "ferry-ksig": ("ferry signals='kernel' (rounds by a 1-block kernel)", "ferry-ksig", "auto"),
    "nccl": ("nccl", "nccl", "auto"),
}


def clock_fields(ctx, seen: list) -> dict:
    """What NVML read during one kind of measurement in each rep (dicts from
    ClockSampler.stop): median over reps, mean over ranks."""
    out = {}
    for key, name in (
        ("mean_sm_mhz", "sm_mhz"),
        ("mean_power_w", "power_w"),
        ("power_capped", "power_capped"),
    ):
        mine = statistics.median(s[key] for s in seen) if seen else 0.0
        out[name] = round(ctx.total(mine) / ctx.world, 3 if name == "power_capped" else 1)
    return out


def run(ctx, out_all, inp_all) -> list:
    from ferry._native import require
    from ferry.bench.cases import sm_fits
    from ferry.bench.report import format_size

    torch, opts, world = ctx.torch, ctx.opts, ctx.world
    dev = ctx.dev
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    gemms = opts["overlap_gemms"]
    compute, side = torch.cuda.Stream(device=dev), torch.cuda.Stream(device=dev)
    for _ in range(3):
        torch.mm(a, b)

    def ev():
        return torch.cuda.Event(enable_timing=True)

    def issue(case, impl, count):
        _, runs, local_copy = IMPLS[impl]
        for _ in range(count):
            case.issue(runs, local_copy)

    def run_gemms():
        for _ in range(gemms):
            torch.mm(a, b)

    native = require()
    clocks = native.ClockSampler(native.pci_bus_id(dev.index), 500)

    def time_alone(stream, work):
        """(ms of `work` on `stream` with nothing beside it, what NVML read meanwhile)."""
        ctx.barrier()
        s, e = ev(), ev()
        clocks.start()
        with torch.cuda.stream(stream):
            s.record(stream)
            work()
            e.record(stream)
        e.synchronize()
        seen = clocks.stop()
        ctx.comm.synchronize()
        return s.elapsed_time(e), seen

    def gemm_alone():
        return time_alone(compute, run_gemms)

    def coll_alone(case, impl, count):
        return time_alone(side, lambda: issue(case, impl, count))

    def together(case, impl, count):
        ctx.barrier()
        start = ev()
        start.record(torch.cuda.current_stream(dev))
        compute.wait_event(start)
        side.wait_event(start)
        gs, ge, ce = ev(), ev(), ev()
        clocks.start()
        # The GEMMs first (30 launches take well under a millisecond of host
        # time), then the collectives: issued the other way round, the host's
        # time to enqueue hundreds of small collectives passed before the
        # first GEMM was enqueued, and the GEMMs ran partly alone.
        with torch.cuda.stream(compute):
            gs.record(compute)
            run_gemms()
            ge.record(compute)
        with torch.cuda.stream(side):
            issue(case, impl, count)
            ce.record(side)
        ge.synchronize()
        seen = clocks.stop()
        ce.synchronize()
        ctx.comm.synchronize()
        return gs.elapsed_time(ge), max(start.elapsed_time(ge), start.elapsed_time(ce)), seen

    results = []
    op = opts.get("overlap_op", "all_gather")
    for n in opts["overlap_sizes"]:
        case = ctx.case(op, n, out_all, inp_all)
        case.reset()
        ksig = any("ksig" in i for i in opts.get("impls", ()))
        # Reductions have no own block to copy: one ferry row, not four alike.
        own_block = op not in ("reduce_scatter", "all_reduce")
        impls = [
            i
            for i in IMPLS
            if (i != "ferry-sm-path" or sm_fits(ctx.comm, op, n, world))
            and (i != "ferry-ksig" or ksig)
            and (own_block or IMPLS[i][2] == "auto")
        ]
        # Warm first: ferry captures a repeated call into a graph on its second
        # run, and a cold estimate (capture included) made the count several
        # times too small (64 KB on x2: 102 all-gathers, 3 ms beside 15 ms of GEMMs).
        for impl in impls:
            coll_alone(case, impl, 5)
        # The better of two timings per implementation: one hiccup (one 1.4 ms
        # timing of a 1 MB all_gather) made the count 34 instead
        # of about 1100 and the row meaningless.
        slowest_one = max(
            ctx.slowest(min(coll_alone(case, impl, 20)[0] for _ in range(2)) / 20) for impl in impls
        )
        count = int(ctx.slowest(gemm_alone()[0]) / max(slowest_one, 1e-3)) + 1
        for impl in impls:
            alone, c_alone, beside, e2e = [], [], [], []
            seen_alone, seen_coll, seen_beside = [], [], []

            def measure_alone():
                t, seen = gemm_alone()
                alone.append(t)
                seen_alone.append(seen)
                t, seen = coll_alone(case, impl, count)
                c_alone.append(t)
                seen_coll.append(seen)

            def measure_together():
                g, t, seen = together(case, impl, count)
                beside.append(g)
                e2e.append(t)
                seen_beside.append(seen)

            for rep in range(opts["overlap_reps"]):
                # Alone first on even reps, beside first on odd ones: a drift of the
                # clocks within a pair (the GEMMs run at the power cap) cancels.
                for step in (measure_alone, measure_together)[:: 1 if rep % 2 == 0 else -1]:
                    step()
            t_alone, t_coll = ctx.slowest(statistics.median(alone)), ctx.slowest(statistics.median(c_alone))
            t_beside, t_e2e = ctx.slowest(statistics.median(beside)), ctx.slowest(statistics.median(e2e))
            ratios = [b / a for a, b in zip(alone, beside)]
            paired = ctx.slowest(statistics.median(ratios))
            # The spread of the per-rep ratios over reps and ranks: how far one
            # pair may land from the median (the GEMMs run at the power cap).
            spread = (-ctx.slowest(-min(ratios)), ctx.slowest(max(ratios)))
            c_alone_, c_beside = clock_fields(ctx, seen_alone), clock_fields(ctx, seen_beside)
            c_coll = clock_fields(ctx, seen_coll)
            rec = dict(
                op=op,
                impl=IMPLS[impl][0],
                impl_key=impl,
                world=world,
                bytes_per_rank=n,
                gemms=gemms,
                gemm_shape="8192x8192x8192 bf16",
                collectives=count,
                gemm_alone_ms=round(t_alone, 3),
                collectives_alone_ms=round(t_coll, 3),
                gemm_beside_ms=round(t_beside, 3),
                end_to_end_ms=round(t_e2e, 3),
                serial_ms=round(t_alone + t_coll, 3),
                slowdown_pct=round(100 * (t_beside / t_alone - 1), 2),
                # The median of each rep's own ratio (alone and beside measured
                # back to back): less exposed to drift between reps.
                slowdown_paired_pct=round(100 * (paired - 1), 2),
                slowdown_paired_range_pct=[round(100 * (x - 1), 2) for x in spread],
                collectives_alone_power_w=c_coll["power_w"],
                **{f"gemm_alone_{k}": v for k, v in c_alone_.items()},
                **{f"gemm_beside_{k}": v for k, v in c_beside.items()},
                reps=opts["overlap_reps"],
                stat="median of reps (alone and together alternate, in turn first), max over ranks; "
                "clocks and power: median of reps, mean over ranks",
            )
            results.append(rec)
            ctx.log(
                f"  overlap {format_size(n):>6} {impl:<14} gemm {t_alone:7.2f} -> {t_beside:7.2f} ms "
                f"({rec['slowdown_pct']:+.1f}%, paired {rec['slowdown_paired_pct']:+.1f}%), "
                f"{count} {op}s alone {t_coll:7.2f} ms ({c_coll['power_w']:.0f} W), "
                f"end-to-end {t_e2e:7.2f} ms (serial {t_alone + t_coll:7.2f}); "
                f"SM clock {c_alone_['sm_mhz']:.0f} -> {c_beside['sm_mhz']:.0f} MHz, "
                f"power {c_alone_['power_w']:.0f} -> {c_beside['power_w']:.0f} W, "
                f"power-capped {c_alone_['power_capped']:.0%} -> {c_beside['power_capped']:.0%}"
            )
    return results

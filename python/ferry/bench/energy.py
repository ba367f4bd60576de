"""Energy: NVML's total-energy counter of every GPU over a long loop of one
collective, against the same GPUs idle for as long. Joules per GB moved
(every byte that crosses a link: world x (world - 1) x block for all-gather
and all-to-all), above idle and in total."""

from __future__ import annotations

import time


def _energy_j(ctx) -> float:
    """This rank's GPU's energy counter in joules (NaN without NVML)."""
    from ferry._native import require

    native = require()
    if not hasattr(ctx, "_bus"):
        # Not probe_topology(): its NVLink queries crashed inside benchmark
        # processes (segfault, all ranks, on an H200 x4 machine); cause not found.
        ctx._bus = native.pci_bus_id(ctx.rank)
    mj = native.total_energy_mj(ctx._bus)
    return mj / 1000.0 if mj >= 0 else float("nan")


# No GPU of this class draws more than this; a reading above it (or at or
# below zero) means NVML's counter did not cover the loop (seen: 6,420 W on 4
# H200s and 0 W on 2, both for NCCL's 1 MB all_to_all over a 1 s loop).
MAX_WATTS_PER_GPU = 1000.0


def invalid_reason(joules: float, seconds: float, world: int) -> str:
    """Why an energy reading cannot be right, or "" when it is plausible."""
    if seconds <= 0:
        return "the loop took no measurable time"
    watts = joules / seconds
    if watts <= 0:
        return f"{watts:.0f} W: the counter did not advance; use a longer --energy-seconds"
    if watts > MAX_WATTS_PER_GPU * world:
        return f"{watts:.0f} W for {world} GPUs is not physical; use a longer --energy-seconds"
    return ""


def run(ctx, out_all, inp_all) -> list:
    from ferry.bench.report import format_size

    torch, opts, world, results = ctx.torch, ctx.opts, ctx.world, []
    seconds = opts["energy_seconds"]
    ctx.barrier()
    e0 = _energy_j(ctx)
    time.sleep(seconds)
    idle_w = ctx.total(_energy_j(ctx) - e0) / seconds
    for n in opts["energy_sizes"]:
        for op in ("all_gather", "all_to_all"):
            case = ctx.case(op, n, out_all, inp_all)
            case.reset()
            moved = world * (world - 1) * (n if op == "all_gather" else n // world)
            for impl in ("ferry", "nccl"):
                # Calibrate a loop of about `seconds`, the same count on every rank.
                ctx.barrier()
                t0 = time.perf_counter()
                with torch.cuda.stream(ctx.stream):
                    for _ in range(5):
                        case.issue(impl)
                torch.cuda.synchronize()
                count = max(10, int(seconds / max(ctx.slowest((time.perf_counter() - t0) / 5), 1e-6)))
                ctx.barrier()
                e0, t0 = _energy_j(ctx), time.perf_counter()
                with torch.cuda.stream(ctx.stream):
                    for _ in range(count):
                        case.issue(impl)
                torch.cuda.synchronize()
                ctx.comm.synchronize()
                dt = ctx.slowest(time.perf_counter() - t0)
                joules = ctx.total(_energy_j(ctx) - e0)
                gb = count * moved / 1e9
                rec = dict(
                    op=op,
                    impl=impl,
                    world=world,
                    bytes_per_rank=n,
                    collectives=count,
                    seconds=round(dt, 3),
                    joules=round(joules, 2),
                    gb_moved=round(gb, 2),
                    j_per_gb=round(joules / gb, 4),
                    j_per_gb_above_idle=round((joules - idle_w * dt) / gb, 4),
                    idle_watts_all_gpus=round(idle_w, 1),
                    stat="one loop per point; NVML total energy summed over GPUs",
                    invalid=invalid_reason(joules, dt, world),
                )
                results.append(rec)
                ctx.log(
                    f"  energy {op:<10} {format_size(n):>6} {impl:<6} {rec['j_per_gb']:.3f} J/GB "
                    f"({rec['j_per_gb_above_idle']:.3f} above idle; {joules / dt:.0f} W over {dt:.1f} s)"
                )
    return results

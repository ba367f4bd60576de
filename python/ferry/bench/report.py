"""Pure parts of the benchmark: sizes, bandwidth formulas, the table, the plot."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Dict, List

_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "M": 2**20, "MB": 2**20, "G": 2**30, "GB": 2**30}


def parse_size(text: str) -> int:
    """'1K', '64MB', '1G', '4096' -> bytes (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?B?)\s*", text.upper())
    if not m:
        raise ValueError(f"size {text!r} is not like 4096, 64K, 16MB or 1G")
    return int(m.group(1)) * _UNITS[m.group(2)]


def prelaunch_sizes(lo: int, hi: int, factor: int, cap: int = 1 << 20) -> List[int]:
    """The sweep's sizes up to `cap` (prelaunch is about small-size latency),
    or the smallest size alone when the sweep starts above `cap`."""
    return [s for s in size_range(lo, hi, factor) if s <= cap] or [lo]


def size_range(lo: int, hi: int, factor: int) -> List[int]:
    if lo <= 0 or hi < lo or factor < 2:
        raise ValueError("expected 0 < min <= max and factor >= 2")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def format_size(n: int) -> str:
    for unit, div in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def bandwidths(op: str, world: int, bytes_per_rank: int, time_us: float):
    """(algbw, busbw) in GB/s, nccl-tests conventions. all_gather: size is the
    output (world x bytes_per_rank); the others: one rank's buffer
    (bytes_per_rank). busbw = algbw x (world - 1) / world, except broadcast
    (x 1) and all_reduce (x 2 (world - 1) / world)."""
    size = bytes_per_rank * world if op == "all_gather" else bytes_per_rank
    if time_us <= 0:
        return 0.0, 0.0
    algbw = size / (time_us * 1e-6) / 1e9
    factor = {"broadcast": 1.0, "all_reduce": 2 * (world - 1) / world}.get(op, (world - 1) / world)
    return algbw, algbw * factor


def format_table(records: Sequence[dict]) -> str:
    """An nccl-tests-style table: one row per (op, size), one column group per impl."""
    impls = []
    for r in records:
        if r["impl_label"] not in impls:
            impls.append(r["impl_label"])
    rows: Dict[tuple, Dict[str, dict]] = {}
    for r in records:
        rows.setdefault((r["op"], r["bytes_per_rank"]), {})[r["impl_label"]] = r
    head = f"{'op':<11}{'bytes/rank':>11}"
    for impl in impls:
        head += f" | {impl:>26}"
    sub = f"{'':<22}" + "".join(f" | {'time us':>9}{'busbw':>8}{'#wrong':>9}" for _ in impls)
    lines = [head, sub, "-" * len(sub)]
    for (op, size), by_impl in rows.items():
        line = f"{op:<11}{format_size(size):>11}"
        for impl in impls:
            r = by_impl.get(impl)
            line += f" | {r['time_us']:>9.1f}{r['busbw_gbps']:>8.1f}{r['wrong']:>9d}" if r else f" | {'':>26}"
        lines.append(line)
    return "\n".join(lines)


def ratios(records: Sequence[dict], baseline: str = "nccl") -> List[tuple]:
    """(op, bytes per rank, impl label, time over the better of the baseline's
    eager and graph runs at that point) for every other record that has the
    baseline beside it, in the records' order."""
    best: Dict[tuple, float] = {}
    for r in records:
        if r["impl"] == baseline:
            key = (r["op"], r["bytes_per_rank"])
            best[key] = min(best.get(key, math.inf), r["time_us"])
    out = []
    for r in records:
        key = (r["op"], r["bytes_per_rank"])
        if r["impl"] != baseline and key in best:
            out.append((r["op"], r["bytes_per_rank"], r["impl_label"], r["time_us"] / best[key]))
    return out


def merge_repeats(runs: Sequence[Sequence[dict]]) -> List[dict]:
    """One record per (op, size, impl) from several whole sweeps (`ferry bench
    --repeat`, one set of processes each): the repeat with the median time
    (the lower middle for an even count), with every repeat's time in
    `time_us_repeats` (in repeat order) and the wrong bytes of all of them."""
    groups: Dict[tuple, List[dict]] = {}
    for run in runs:
        for r in run:
            groups.setdefault((r["op"], r["bytes_per_rank"], r["impl_label"]), []).append(r)
    out = []
    for group in groups.values():
        middle = sorted(group, key=lambda r: r["time_us"])[(len(group) - 1) // 2]
        merged = dict(middle)
        merged["time_us_repeats"] = [r["time_us"] for r in group]
        merged["wrong"] = sum(r["wrong"] for r in group)
        out.append(merged)
    return out


def ratio_ranges(records: Sequence[dict], baseline: str = "nccl") -> Dict[tuple, tuple]:
    """Where records carry `time_us_repeats`: per (op, size, impl label), the
    lowest and highest of the per-repeat ratios, each repeat's ferry time over
    the same repeat's NCCL best (how far one run can land from the median)."""
    repeated = [r for r in records if "time_us_repeats" in r]
    out: Dict[tuple, tuple] = {}
    for j in range(min((len(r["time_us_repeats"]) for r in repeated), default=0)):
        one_repeat = [dict(r, time_us=r["time_us_repeats"][j]) for r in repeated]
        for op, size, impl, ratio in ratios(one_repeat, baseline):
            lo, hi = out.get((op, size, impl), (ratio, ratio))
            out[(op, size, impl)] = (min(lo, ratio), max(hi, ratio))
    return out


def ratio_table(records: Sequence[dict], baseline: str = "nccl") -> str:
    """ferry time over the better of NCCL eager and graph, per op and size;
    with repeats, the range of the per-repeat ratios beside the median's."""
    spread = ratio_ranges(records, baseline)
    head = f"{'op':<11}{'bytes/rank':>11}  impl          ferry/NCCL(best)"
    lines = [head + ("  repeats from..to" if spread else "")]
    for op, size, impl, ratio in ratios(records, baseline):
        line = f"{op:<11}{format_size(size):>11}  {impl:<13} {ratio:>6.2f}"
        if (op, size, impl) in spread:
            lo, hi = spread[(op, size, impl)]
            line += f"        {lo:.2f}..{hi:.2f}"
        lines.append(line)
    return "\n".join(lines)


def plot(records: Sequence[dict], path: str, title: str) -> bool:
    """Per op: time per collective against size, one line per impl; below it,
    where NCCL ran too, ferry's time over NCCL's best (the issue's targets are
    ratios, and a log time axis hides a 15% gap). False without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return False
    ops = sorted({r["op"] for r in records})
    rel = ratios(records)
    rows = 2 if rel else 1
    fig, axes = plt.subplots(rows, len(ops), figsize=(6.5 * len(ops), 4.5 * rows), squeeze=False)
    for col, op in enumerate(ops):
        top = axes[0][col]
        for impl in sorted({r["impl_label"] for r in records if r["op"] == op}):
            pts = sorted(
                (r["bytes_per_rank"], r["time_us"])
                for r in records
                if r["op"] == op and r["impl_label"] == impl
            )
            top.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        top.set_yscale("log")
        top.set_ylabel("time per collective (us)")
        top.set_title(f"{op} - {title}")
        if rel:
            low = axes[1][col]
            for impl in sorted({x[2] for x in rel if x[0] == op}):
                pts = sorted((x[1], x[3]) for x in rel if x[0] == op and x[2] == impl)
                low.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
            low.axhline(1.0, color="black", linewidth=0.8)
            low.set_yscale("log", base=2)
            low.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
            low.set_ylabel("time / NCCL's best (eager or graph)")
            low.set_title(f"{op}: below 1, ferry is faster")
        for ax in (axes[k][col] for k in range(rows)):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("bytes per rank")
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:  # an op without NCCL has no ratio lines
                ax.legend(fontsize=8)
    return save_figure(plt, fig, path)


def chain_table(records: List[dict]) -> List[str]:
    """One row per (op, size), one column per variant: us added to a
    producer -> collective -> producer chain."""
    variants = list(dict.fromkeys(r["variant"] for r in records))
    rows = list(dict.fromkeys((r["op"], r["bytes_per_rank"]) for r in records))
    added = {(r["op"], r["bytes_per_rank"], r["variant"]): r["added_us"] for r in records}
    out = [
        "",
        "# chain: us a collective adds between a producer kernel and the next (steady state, max over ranks)",
    ]
    w = max(len(v) for v in variants) + 2
    out += [f"{'op':<12}{'bytes/rank':>11}  " + "".join(f"{v:>{w}}" for v in variants)]
    for op, n in rows:
        cells = [added.get((op, n, v)) for v in variants]
        out.append(
            f"{op:<12}{format_size(n):>11}  "
            + "".join(f"{'' if c is None else f'{c:.1f}':>{w}}" for c in cells)
        )
    return out


def format_sections(result: dict) -> List[str]:
    """Text tables for the optional measurements (prelaunch, phases, overlap, energy)."""
    out: List[str] = []
    if result.get("prelaunch"):
        out += ["", "# prelaunch: trigger -> done (us), host trigger at one instant on every rank"]
        out += [f"{'op':<15}{'bytes/rank':>11}  {'algo':<5}{'us':>9}"]
        for r in result["prelaunch"]:
            out.append(
                f"{r['op']:<15}{format_size(r['bytes_per_rank']):>11}  {r['algo']:<5}{r['trigger_to_done_us']:>9.1f}"
            )
    if result.get("chain"):
        out += chain_table(result["chain"])
    if result.get("phases"):
        out += [
            "",
            "# phases (us): control = host enqueue; schedule = in-stream - trigger->done; "
            "sync = trigger->done at 1 byte; copy = the rest",
        ]
        out += [
            f"{'algo':<6}{'bytes/rank':>11}{'control':>9}{'schedule':>10}{'copy':>9}{'sync':>8}{'in-stream':>11}"
        ]
        for r in result["phases"]:
            out.append(
                f"{r['algo']:<6}{format_size(r['bytes_per_rank']):>11}{r['control_us']:>9.1f}{r['schedule_us']:>10.1f}"
                f"{r['copy_us']:>9.1f}{r['sync_us']:>8.1f}{r['in_stream_us']:>11.1f}"
            )
    if result.get("overlap"):
        op = result["overlap"][0].get("op", "all_gather")
        out += ["", f"# overlap: bf16 GEMM loop beside {op}s (ms)"]
        out += [
            f"{'bytes/rank':>10}  {'impl':<40}{'gemm':>8}{'beside':>8}{'slow%':>7}{'paired':>7}{'pairs from..to':>16}"
            f"{'coll':>8}{'e2e':>8}{'serial':>8}"
            f"{'MHz':>12}{'W':>10}{'capped':>12}{'coll W':>8}"
        ]
        for r in result["overlap"]:
            # The per-rep paired slowdowns' lowest and highest (older records lack them).
            lo_hi = r.get("slowdown_paired_range_pct")
            spread = f"{lo_hi[0]:+7.1f}..{lo_hi[1]:+.1f}" if lo_hi else ""
            # Clocks while the GEMMs ran, alone -> beside (older records lack them).
            clocks = (
                f"{r['gemm_alone_sm_mhz']:>6.0f}{r['gemm_beside_sm_mhz']:>6.0f}"
                f"{r['gemm_alone_power_w']:>5.0f}{r['gemm_beside_power_w']:>5.0f}"
                f"{r['gemm_alone_power_capped']:>6.0%}{r['gemm_beside_power_capped']:>6.0%}"
                f"{r.get('collectives_alone_power_w', float('nan')):>8.0f}"
                if "gemm_alone_sm_mhz" in r
                else ""
            )
            out.append(
                f"{format_size(r['bytes_per_rank']):>10}  {r['impl']:<40}{r['gemm_alone_ms']:>8.2f}"
                f"{r['gemm_beside_ms']:>8.2f}{r['slowdown_pct']:>7.1f}"
                f"{r.get('slowdown_paired_pct', float('nan')):>7.1f}{spread:>16}{r['collectives_alone_ms']:>8.2f}"
                f"{r['end_to_end_ms']:>8.2f}{r['serial_ms']:>8.2f}{clocks}"
            )
    if result.get("energy"):
        out += ["", "# energy: NVML, all GPUs, J per GB moved"]
        out += [f"{'op':<11}{'bytes/rank':>11}  {'impl':<6}{'J/GB':>8}{'above idle':>12}{'W':>7}"]
        for r in result["energy"]:
            out.append(
                f"{r['op']:<11}{format_size(r['bytes_per_rank']):>11}  {r['impl']:<6}{r['j_per_gb']:>8.3f}"
                f"{r['j_per_gb_above_idle']:>12.3f}{r['joules'] / max(r['seconds'], 1e-9):>7.0f}"
                + (f"  INVALID: {r['invalid']}" if r.get("invalid") else "")
            )
    return out


def save_figure(plt, fig, path: str, rect=None) -> bool:
    """Lays out, writes (PNG, 110 dpi) and closes a figure; True, for the plot
    functions to return."""
    fig.tight_layout(rect=rect) if rect else fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None


def plot_phases(phases: Sequence[dict], path: str, title: str) -> bool:
    """Per variant and size, the share of schedule, copy and sync in the
    collective's in-stream time (stacked shares per size), with that time and
    the host's control time (which overlaps the GPU's work) written above."""
    plt = _pyplot()
    if plt is None:
        return False
    algos = sorted({r["algo"] for r in phases})
    fig, axes = plt.subplots(1, len(algos), figsize=(5.5 * len(algos), 4.4), squeeze=False, sharey=True)
    for ax, algo in zip(axes[0], algos):
        rows = [r for r in phases if r["algo"] == algo]
        x = list(range(len(rows)))
        bottom = [0.0] * len(rows)
        for key, label in (("schedule_us", "schedule"), ("copy_us", "copy"), ("sync_us", "sync")):
            share = [100 * r[key] / max(r["schedule_us"] + r["copy_us"] + r["sync_us"], 1e-9) for r in rows]
            ax.bar(x, share, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, share)]
        for i, r in enumerate(rows):
            ax.text(
                i, 101, f"{r['in_stream_us']:.0f} us\nhost {r['control_us']:.0f}", ha="center", fontsize=7
            )
        ax.set_xticks(x)
        ax.set_xticklabels([format_size(r["bytes_per_rank"]) for r in rows])
        ax.set_ylim(0, 118)
        ax.set_title(f"all_gather {algo} - {title}")
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("% of in-stream time")
        ax.legend(fontsize=8, loc="lower left")
    return save_figure(plt, fig, path)


def slowdown_key(overlap: Sequence[dict]) -> str:
    """The overlap records' slowdown to plot: the paired one where every record
    has it (less exposed to drift between reps), else the medians' ratio."""
    return (
        "slowdown_paired_pct"
        if overlap and all("slowdown_paired_pct" in r for r in overlap)
        else "slowdown_pct"
    )


def plot_overlap(overlap: Sequence[dict], path: str, title: str) -> bool:
    """GEMM slowdown and end-to-end time against size, per implementation."""
    plt = _pyplot()
    if plt is None:
        return False
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    key = slowdown_key(overlap)
    paired = key == "slowdown_paired_pct"
    for impl in sorted({r["impl"] for r in overlap}):
        pts = sorted(
            (r["bytes_per_rank"], r[key], r["end_to_end_ms"] / r["serial_ms"])
            for r in overlap
            if r["impl"] == impl
        )
        a1.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        a2.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=impl)
    op = overlap[0].get("op", "all_gather") if overlap else "all_gather"
    slow = f"GEMM slowdown beside {op}s (%{', paired' if paired else ''})"
    for ax, yl in ((a1, slow), (a2, "end-to-end / serial")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"{op} bytes per rank")
        ax.set_ylabel(yl)
        ax.grid(True, alpha=0.3)
        ax.set_title(title)
    # One legend under both panels: inside them it covered points.
    handles, labels = a1.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    return save_figure(plt, fig, path, rect=(0, 0.12, 1, 1))

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
    output (world x bytes_per_rank); all_to_all: size is one rank's input
    (bytes_per_rank, world blocks). busbw = algbw x (world - 1) / world."""
    size = bytes_per_rank * world if op == "all_gather" else bytes_per_rank
    if time_us <= 0:
        return 0.0, 0.0
    algbw = size / (time_us * 1e-6) / 1e9
    return algbw, algbw * (world - 1) / world


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


def ratio_table(records: Sequence[dict], baseline: str = "nccl") -> str:
    """ferry time over the better of NCCL eager and graph, per op and size."""
    best: Dict[tuple, float] = {}
    for r in records:
        if r["impl"] == baseline:
            key = (r["op"], r["bytes_per_rank"])
            best[key] = min(best.get(key, math.inf), r["time_us"])
    lines = [f"{'op':<11}{'bytes/rank':>11}  impl          ferry/NCCL(best)"]
    for r in records:
        if r["impl"] == baseline:
            continue
        key = (r["op"], r["bytes_per_rank"])
        if key in best:
            lines.append(
                f"{r['op']:<11}{format_size(r['bytes_per_rank']):>11}  {r['impl_label']:<13} "
                f"{r['time_us'] / best[key]:>6.2f}"
            )
    return "\n".join(lines)


def plot(records: Sequence[dict], path: str, title: str) -> bool:
    """Time per collective against size, one line per impl; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ops = sorted({r["op"] for r in records})
    fig, axes = plt.subplots(1, len(ops), figsize=(6.5 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for impl in sorted({r["impl_label"] for r in records if r["op"] == op}):
            pts = sorted(
                (r["bytes_per_rank"], r["time_us"])
                for r in records
                if r["op"] == op and r["impl_label"] == impl
            )
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("time per collective (us)")
        ax.set_title(f"{op} - {title}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True

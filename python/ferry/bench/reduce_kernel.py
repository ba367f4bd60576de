"""The reduction kernel of reduce_scatter and all_reduce on one GPU, against
torch's own reduction over the same sources, side by side in one process.

    python -m ferry.bench.reduce_kernel [--worlds 2,4,8] [--dtypes float32,bfloat16]
        [--min 1M] [--max 512M] [--blocks 32,64,sms] [--runs 5] [--iters 20] [--out DIR]

Each point reduces `world` sources of one rank's result (the bytes on the x
axis) into one output: ferry's kernel (`reduce_local`, the grid bounded at
each --blocks value; 32 is what the collectives use) and torch.sum over the
stacked sources (dim 0, all the GPU's SMs). Bandwidth counts the HBM traffic:
world reads and one write of the result. Warm-up 3 launches, then the median
over --runs of the mean of --iters back-to-back launches timed with CUDA
events; no graphs. Every ferry output is compared, element by element, with
a reference added in rank order (in float for 16-bit types, rounded once)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from typing import List

from .report import _pyplot, format_size, parse_size, save_figure, size_range


def hbm_tbps(world: int, result_bytes: int, time_us: float) -> float:
    """TB/s of HBM traffic: `world` sources read and the result written once."""
    return (world + 1) * result_bytes / (time_us * 1e-6) / 1e12 if time_us > 0 else 0.0


def _time_us(torch, launch, runs: int, iters: int) -> float:
    for _ in range(3):
        launch()
    samples = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            launch()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / iters)
    return statistics.median(samples)


def measure(
    world: int, dtype_name: str, result_bytes: int, blocks: List[int], runs: int, iters: int
) -> List[dict]:
    import torch

    from ferry._native import hooks as load_hooks

    hooks = load_hooks()
    dtype = getattr(torch, dtype_name)
    elem = torch.empty((), dtype=dtype).element_size()
    count = result_bytes // elem
    g = torch.Generator(device="cuda").manual_seed(world * 1000 + count % 997)
    sources = torch.randn((world, count), device="cuda", generator=g).to(dtype)
    out = torch.empty(count, device="cuda", dtype=dtype)
    stream = torch.cuda.current_stream().cuda_stream
    wide = torch.float32 if elem == 2 else dtype
    reference = sources[0].to(wide)
    for p in range(1, world):
        reference = reference + sources[p].to(wide)
    reference = reference.to(dtype)
    records = []
    base = dict(world=world, dtype=dtype_name, result_bytes=result_bytes)

    def record(impl: str, t: float, wrong: int = 0, **extra) -> None:
        records.append(
            dict(base, impl=impl, time_us=t, hbm_tbps=hbm_tbps(world, result_bytes, t), wrong=wrong, **extra)
        )

    for b in blocks:

        def ferry_launch(b=b):
            # Rank 0's own contribution is slot 0 itself: one buffer of `world` slots.
            hooks.reduce_local(
                out.data_ptr(), sources.data_ptr(), sources.data_ptr(), count * elem, 0, world, count,
                dtype_name, "sum", stream, b,
            )  # fmt: skip

        out.fill_(float("nan") if dtype.is_floating_point else 0)  # poison
        ferry_launch()
        torch.cuda.synchronize()
        wrong = int((out != reference).sum().item())
        record(f"ferry-{b}-blocks", _time_us(torch, ferry_launch, runs, iters), wrong, blocks=b)
    record("torch.sum", _time_us(torch, lambda: torch.sum(sources, dim=0, out=out), runs, iters))
    return records


def format_records(records: List[dict]) -> str:
    impls = list(dict.fromkeys(r["impl"] for r in records))
    lines = [f"{'world':>5} {'dtype':>9} {'result':>7}  " + "  ".join(f"{i:>22}" for i in impls)]
    keys = list(dict.fromkeys((r["world"], r["dtype"], r["result_bytes"]) for r in records))
    for w, d, n in keys:
        cells = []
        for i in impls:
            r = next(
                (
                    r
                    for r in records
                    if (r["world"], r["dtype"], r["result_bytes"], r["impl"]) == (w, d, n, i)
                ),
                None,
            )
            cells.append(f"{r['time_us']:9.1f} us {r['hbm_tbps']:5.2f} TB/s" if r else " " * 22)
        lines.append(f"{w:>5} {d:>9} {format_size(n):>7}  " + "  ".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def plot(records: List[dict], path: str, title: str) -> bool:
    plt = _pyplot()
    if plt is None:
        return False
    worlds = list(dict.fromkeys(r["world"] for r in records))
    dtypes = list(dict.fromkeys(r["dtype"] for r in records))
    fig, axes = plt.subplots(
        len(dtypes), len(worlds), figsize=(4.2 * len(worlds), 3.4 * len(dtypes)), squeeze=False
    )
    for row, d in enumerate(dtypes):
        for col, w in enumerate(worlds):
            ax = axes[row][col]
            mine = [r for r in records if (r["world"], r["dtype"]) == (w, d)]
            for impl in dict.fromkeys(r["impl"] for r in mine):
                pts = sorted((r["result_bytes"], r["hbm_tbps"]) for r in mine if r["impl"] == impl)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{w} sources, {d}")
            ax.set_xlabel("result bytes")
            ax.set_ylabel("HBM TB/s (reads + write)")
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    return save_figure(plt, fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--min", default="1M")
    ap.add_argument("--max", default="512M")
    ap.add_argument("--factor", type=int, default=8)
    ap.add_argument("--blocks", default="32,64,sms", help="grid bounds to time; 'sms': the GPU's SM count")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--tag", default="reduce-kernel")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("ferry.bench.reduce_kernel needs a GPU", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    blocks = [props.multi_processor_count if b == "sms" else int(b) for b in args.blocks.split(",")]
    records = []
    for w in (int(x) for x in args.worlds.split(",")):
        for d in args.dtypes.split(","):
            for n in size_range(parse_size(args.min), parse_size(args.max), args.factor):
                if w * n > props.total_memory // 3:
                    continue
                print(f"  {w} sources, {d}, {format_size(n)}", file=sys.stderr, flush=True)
                records += measure(w, d, n, blocks, args.runs, args.iters)
    gpu = props.name.replace(" ", "-")
    stem = os.path.join(args.out, f"{datetime.date.today()}-{gpu}-{args.tag}")
    os.makedirs(args.out, exist_ok=True)
    command = "python -m ferry.bench.reduce_kernel " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = dict(
        gpu=props.name, sms=props.multi_processor_count, command=command, runs=args.runs, iters=args.iters
    )
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta, records=records), f, indent=1)
    table = format_records(records)
    with open(stem + ".txt", "w") as f:
        f.write(
            f"# {command}\n# {props.name}, {props.multi_processor_count} SMs; median of {args.runs} runs "
        )
        f.write(f"of {args.iters} launches each, after 3 warm-up launches; no graphs\n{table}\n")
    plot(records, stem + ".png", f"reduction kernel vs torch.sum, {props.name}")
    print(table)
    wrong = sum(r["wrong"] for r in records)
    print(f"wrong elements: {wrong}; results: {stem}.*")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

"""Summarizes `scripts/device-check knob-ab`: `ferry bench` JSON files tagged
`r<round>-<knob>-<value>` (one per round and value of a FERRY_* knob, same
machine, values alternating within each round), as one table per op and
size: ferry's median time over the rounds and the median over the rounds of
its ratio to NCCL's time in the same run. Also writes every record, with its
round and value, into one JSON file.

    python bench/knob_ab.py DIR [--impl ferry-sm-graph] [--out combined.json]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import statistics


def load(folder: str):
    """(knob, value, round, records) for every tagged file in `folder`."""
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        m = re.search(r"-r(\d+)-(FERRY_[A-Z_]+)-(\d+)\.json$", path)
        if not m:
            continue
        with open(path) as f:
            records = json.load(f)["records"]
        runs.append((m.group(2), int(m.group(3)), int(m.group(1)), records))
    return runs


def table(runs, impl: str) -> str:
    cells = collections.defaultdict(list)  # (knob, op, bytes, value) -> [(time, ratio, wrong)]
    for knob, value, _, records in runs:
        by = {(r["op"], r["bytes_per_rank"], r["impl"]): r for r in records}
        for (op, size, name), r in by.items():
            other = by.get((op, size, "nccl"))
            if name == impl and other:
                cells[(knob, op, size, value)].append(
                    (r["time_us"], r["time_us"] / other["time_us"], r["wrong"])
                )
    lines = []
    for knob in sorted({k[0] for k in cells}):
        values = sorted({k[3] for k in cells if k[0] == knob})
        lines.append(
            f"{knob}: {impl} us, median over rounds (median ratio to NCCL in the same run) [wrong bytes]"
        )
        lines.append("| op | bytes | " + " | ".join(str(v) for v in values) + " |")
        lines.append("|---|---|" + "---|" * len(values))
        for op, size in sorted({(k[1], k[2]) for k in cells if k[0] == knob}):
            row = []
            for v in values:
                xs = cells.get((knob, op, size, v), [])
                row.append(
                    f"{statistics.median(x[0] for x in xs):.1f} ({statistics.median(x[1] for x in xs):.2f})"
                    f"{' [' + str(sum(x[2] for x in xs)) + ']' if any(x[2] for x in xs) else ''}"
                    if xs
                    else "-"
                )
            lines.append(f"| {op} | {size} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--impl", default="ferry-sm-graph")
    p.add_argument("--out", default="")
    args = p.parse_args()
    runs = load(args.folder)
    if not runs:
        raise SystemExit(f"{args.folder}: no r<round>-FERRY_<KNOB>-<value> JSON files")
    print(table(runs, args.impl))
    if args.out:
        combined = [dict(r, knob=k, value=v, round=n) for k, v, n, records in runs for r in records]
        with open(args.out, "w") as f:
            json.dump({"records": combined}, f, indent=1)


if __name__ == "__main__":
    main()

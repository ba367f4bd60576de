"""Summarizes `MULTIPATH_STEPS=ab scripts/device-check multipath`: multipath
benchmark JSON files tagged `r<round>-<variant>` (variants alternating within
each round on one machine), as one table per direction and size: each
variant's median GB/s over the rounds and its median ratio to the plain copy
of the same run.

    python bench/multipath_ab.py DIR
"""

from __future__ import annotations

import glob
import json
import os
import re
import statistics
import sys
from collections import defaultdict


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder = argv[0] if argv else "."
    gbps = defaultdict(list)  # (op, bytes, paths, variant) -> [GB/s by round]
    ratio = defaultdict(list)
    variants = []
    for path in sorted(glob.glob(os.path.join(folder, "*-multipath-r*.json"))):
        m = re.search(r"-multipath-r(\d+)-(.+)\.json$", path)
        if not m:
            continue
        variant = m.group(2)
        if variant not in variants:
            variants.append(variant)
        records = json.load(open(path))["records"]
        plain = {(r["op"], r["bytes"]): r["gbps"] for r in records if r["impl"] == "plain"}
        for r in records:
            if r["impl"] != "ferry":
                continue
            key = (r["op"], r["bytes"], r["paths"], variant)
            gbps[key].append(r["gbps"])
            if plain.get((r["op"], r["bytes"])):
                ratio[key].append(r["gbps"] / plain[(r["op"], r["bytes"])])
    rows = sorted({k[:3] for k in gbps})
    print("op bytes paths | " + " | ".join(f"{v}: GB/s (x plain)" for v in variants))
    for op, nbytes, paths in rows:
        cells = []
        for v in variants:
            g, x = gbps.get((op, nbytes, paths, v)), ratio.get((op, nbytes, paths, v))
            cells.append(f"{statistics.median(g):6.1f} ({statistics.median(x):.2f})" if g and x else "-")
        print(f"{op} {nbytes >> 20}M {paths} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

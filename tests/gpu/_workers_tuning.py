"""The table a communicator starts with, on real GPUs: run as
`python _workers_tuning.py WORLD` in a fresh process (FERRY_SHARED_GPUS=1 lets
a 2-rank world share one GPU). The native layer picks FERRY_TUNING's table,
else the shipped one of the GPU model (src/coll/tuning.hpp); these checks
compare its choices with the same tables read through ferry.tune, and move
bytes with a table from a file."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import zlib

from _checks import SAFE_ENV, rand_bytes

SIZES = (1, 4096, 1 << 20, 4 << 20, 1 << 30)


def choices(comm, world):
    from ferry import tune

    return {(op, n): (comm.choose_algo(op, n), comm.choose_signals(op, n)) for op in tune.OPS for n in SIZES}


def expected_choices(rules, world):
    """What the rules say, as choose_algo/choose_signals report it ("auto"
    signals: the communicator's FERRY_SIGNALS, unset here: copy); no rules:
    the native built-in default (select_variant with an empty table)."""
    from ferry import tune
    from ferry._native import require

    out = {}
    for op in tune.OPS:
        for n in SIZES:
            algo, signals = (
                tune.select(rules, op, world, n) if rules else require().select_variant(op, world, n)
            )
            out[(op, n)] = (algo, "copy" if signals == "auto" else signals)
    return out


def start_tables(world: int) -> list:
    os.environ.update(SAFE_ENV)
    os.environ.pop("FERRY_TUNING", None)
    os.environ.pop("FERRY_SIGNALS", None)
    import ferry
    import torch
    from ferry import tune

    gpus = torch.cuda.device_count()
    devs = [r % gpus for r in range(world)]
    name = torch.cuda.get_device_name(0)
    fails = []

    # 1. Unset FERRY_TUNING: the shipped sm-free table of this GPU model (or the built-in default).
    shipped = tune.default_rules(name, world, {})
    print(
        f"GPU {name!r}: shipped table {'found' if shipped else 'none: the built-in default'}", file=sys.stderr
    )
    comm = ferry.init_local(devs, timeout=30)
    start = choices(comm, world)
    if start != expected_choices(shipped, world):
        diff = {k: v for k, v in start.items() if v != expected_choices(shipped, world)[k]}
        fails.append(f"the starting table differs from the shipped one at {sorted(diff.items())[:6]}")
    # 2. A preset by name, then back to the start with an empty table.
    latency = tune.preset_rules(name, world, "latency")
    try:
        comm.set_tuning("latency")
        if latency is None:
            fails.append("set_tuning('latency') was taken on a GPU with no shipped latency table")
        elif choices(comm, world) != expected_choices(latency, world):
            fails.append("set_tuning('latency') did not take the shipped latency table")
    except ferry.InvalidArgumentError as exc:
        if latency is not None or "ships no 'latency' table" not in str(exc):
            fails.append(f"set_tuning('latency') raised {exc!r}")
    try:
        comm.set_tuning("fastest")
        fails.append("set_tuning('fastest') was taken")
    except ferry.InvalidArgumentError as exc:
        if "preset is 'fastest'" not in str(exc):
            fails.append(f"set_tuning('fastest') raised {exc!r}")
    comm.set_tuning([])
    if choices(comm, world) != start:
        fails.append("set_tuning([]) did not restore the starting table")
    comm.close()

    # 3. A FERRY_TUNING that is neither a preset nor a file: creation refuses, naming it.
    os.environ["FERRY_TUNING"] = "/nonexistent/ferry-table.json"
    try:
        ferry.init_local(devs, timeout=30).close()
        fails.append("a communicator was made with FERRY_TUNING naming no file")
    except ferry.InvalidArgumentError as exc:
        if "FERRY_TUNING='/nonexistent/ferry-table.json' is neither a preset" not in str(exc):
            fails.append(f"bad FERRY_TUNING raised {exc!r}")

    # 4. A `ferry tune` file: its rules, and bytes moved by the variant they name.
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"rules": [{"op": "all_gather", "world": 0, "max_bytes": None, "algo": "pcpy"}]}, f)
    os.environ["FERRY_TUNING"] = f.name
    comm = ferry.init_local(devs, timeout=30)  # after the refusal above: nothing was left behind
    os.environ.pop("FERRY_TUNING")
    os.unlink(f.name)
    if comm.choose_algo("all_gather", 4096) != "pcpy" or comm.choose_algo("all_gather", 1 << 30) != "pcpy":
        fails.append("the FERRY_TUNING file's rule was not taken")
    n = 1000003
    ins = [
        rand_bytes(torch, zlib.crc32(f"tables/{r}".encode()), n, torch.device("cuda", devs[r]))
        for r in range(world)
    ]
    outs = comm.alloc((world * n,), torch.uint8)  # one registered buffer per rank
    for o in outs:
        o.fill_(0xA5)  # poison
    streams = [torch.cuda.Stream(device=d) for d in devs]  # one per rank (FERRY_SHARED_GPUS)
    comm.all_gather(outs, ins, stream=streams)
    comm.synchronize()
    expected = torch.cat([x.cpu() for x in ins])
    for r, o in enumerate(outs):
        bad = int((o.cpu() != expected).sum())
        if bad:
            fails.append(f"all_gather with the file's table: rank {r}: {bad} wrong bytes of {world * n}")
    comm.close()
    return fails


if __name__ == "__main__":
    problems = start_tables(int(sys.argv[1]))
    print("\n".join(problems[:40]) or "ok")
    sys.exit(1 if problems else 0)

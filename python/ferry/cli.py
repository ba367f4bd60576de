"""`ferry topo`, `ferry doctor`, `ferry bench`, `ferry tune`, `ferry kv-tune`."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys


def _topology(args):
    from . import topo

    return topo.load(args.file) if args.file else topo.probe()


def cmd_topo(args) -> int:
    from . import topo

    d = _topology(args)
    print(json.dumps(d, indent=1) if args.json else topo.format_text(d))
    return 0


def cmd_doctor(args) -> int:
    from . import topo, tune
    from ._native import IMPORT_ERROR, native

    print(f"ferry {__import__('ferry').__version__}, python {sys.version.split()[0]}")
    if native is None:
        print(f"[fail] native extension not importable: {IMPORT_ERROR}")
        return 1
    failed = False
    if args.file:
        d = topo.load(args.file)
    elif not native.driver_available():
        print(f"[fail] no CUDA driver: {native.driver_missing_hint()}")
        d = None
        failed = True
    else:
        d = topo.probe()
    if d is not None:
        checks = topo.doctor_checks(d) + topo.environment_checks(dict(os.environ))
        if d["gpus"]:
            checks.append(tune.describe(d["gpus"][0]["name"], len(d["gpus"]), dict(os.environ)))
        for status, msg in checks:
            print(f"[{status}] {msg}")
            failed |= status == "fail"
    for var, want in (
        ("NCCL_NVLS_ENABLE", "0"),
        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
        ("NVSHMEM_DISABLE_NVLS", "1"),
    ):
        if os.environ.get(var) != want:
            print(f"[note] {var} is not {want}: on shared hosts where NVLink multicast must stay off, set it")
    # A knob set to what its first reader will refuse (not a number, or out of range).
    for problem in native.knob_problems():
        print(f"[fail] {problem}")
        failed = True
    print("\nenvironment knobs:")
    for name, typ, default, doc, values in native.knobs():
        value = os.environ.get(name)
        shown = f"{value} (set)" if value is not None else f"{default or '(empty)'} (default)"
        print(f"  {name:<20} {typ:<6} {shown:<16} {doc}" + (f" ({values})" if values else ""))
    return 1 if failed else 0


def bench_parts(only: str, world: int, collective_args_given: bool):
    """(what `ferry bench` runs, what it skips and why): every benchmark this
    machine allows, or those `--only` names. Naming the collectives' --ops or
    --impls means the collectives alone unless --only says otherwise."""
    parts = (
        [p for p in only.split(",") if p]
        if only
        else (["collectives"] if collective_args_given else ["kv", "collectives"])
    )
    bad = [p for p in parts if p not in ("kv", "collectives", "multipath")]
    if bad:
        raise SystemExit(f"--only: unknown {bad}; expected kv, collectives and/or multipath")
    run, skipped = [], []
    for p in parts:
        if p == "collectives" and world < 2:
            skipped.append(f"collectives against NCCL: they need at least 2 GPUs; {world} visible")
        elif p in ("kv", "multipath") and world < 1:
            skipped.append(("KV transfers" if p == "kv" else "multipath copies") + ": no GPU visible")
        else:
            run.append(p)
    return run, skipped


def cmd_bench(args) -> int:
    import torch

    world = args.gpus or torch.cuda.device_count()
    given = args.ops is not None or args.impls is not None
    args.ops = args.ops or "all_gather,all_to_all"
    if args.impls is None:
        from .bench import collectives

        args.impls = ",".join(collectives.DEFAULT_IMPLS)
    parts, skipped = bench_parts(args.only, world, given)
    print(f"ferry bench: {world} GPU(s); running {', '.join(parts) or 'nothing'}", file=sys.stderr)
    status = 0
    if "kv" in parts:
        status |= bench_kv(args)
    if "collectives" in parts:
        status |= bench_collectives(args, world)
    if "multipath" in parts:
        status |= bench_multipath(args)
    for s in skipped:
        print(f"skipped: {s}")
    return status


def bench_multipath(args) -> int:
    """python -m ferry.bench.multipath with --multipath-args (its own options),
    its results in --out."""
    import shlex

    from .bench import multipath

    argv = shlex.split(args.multipath_args) + ["--out", args.out or "bench/results"]
    if args.tag:
        argv += ["--tag", args.tag]
    return multipath.main(argv)


def bench_kv(args) -> int:
    from .bench import kv

    opts = kv.make_options(
        args.kv_pages,
        args.kv_counts,
        args.kv_ops,
        max_bytes=args.kv_max_bytes,
        reps=args.kv_reps,
        gemm=True,
        urgent=True,
    )
    print(
        f"KV transfers on one GPU: {len(kv.points(opts['pages'], opts['counts'], opts['max_bytes']))} points x "
        f"{opts['ops']} x {len(opts['impls'])} impls",
        file=sys.stderr,
    )
    result = kv.run(opts, progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(kv.summary(result))
    if args.out:
        command = recorded_command(sys.argv[1:], os.environ)
        files = kv.save(result, args.out, command, args.tag, not args.no_plot)
        print("wrote " + ", ".join(os.path.basename(f) for f in files))
    return 0 if all(r["wrong"] == 0 for r in result["records"]) else 1


def bench_collectives(args, world: int) -> int:
    import torch  # noqa: F401

    from .bench import collectives
    from .bench.report import format_table, parse_size, prelaunch_sizes, ratio_table, size_range

    impls = [i for i in args.impls.split(",") if i]
    bad = [i for i in impls if i not in collectives.IMPLS]
    if bad:
        print(f"--impls: unknown {bad}; expected some of {','.join(collectives.IMPLS)}", file=sys.stderr)
        return 2
    opts = dict(
        sizes=size_range(parse_size(args.min), parse_size(args.max), args.factor),
        ops=args.ops.split(","),
        impls=impls,
        warmup=args.warmup,
        runs=args.runs,
        timeout=args.timeout,
        local_copy=args.local_copy,
        in_place=args.in_place,
        a2a_nccl_graph=args.a2a_nccl_graph,
        overlap=args.overlap,
        overlap_gemms=args.overlap_gemms,
        overlap_reps=args.overlap_reps,
        overlap_sizes=[parse_size(x) for x in (args.overlap_size or args.overlap_sizes).split(",") if x],
        overlap_op=args.overlap_op,
        local_copy_probe=args.local_copy_probe,
        prelaunch=args.prelaunch,
        prelaunch_ops=prelaunch_ops(args.ops.split(",")),
        prelaunch_sizes=prelaunch_sizes(parse_size(args.min), parse_size(args.max), args.factor),
        prelaunch_runs=args.prelaunch_runs,
        phases=args.phases,
        phase_algos=["b2b", "seq", "pcpy"],
        phase_sizes=[1 << 10, 16 << 10, 256 << 10, 4 << 20, 64 << 20],
        energy=args.energy,
        energy_sizes=[parse_size(x) for x in args.energy_sizes.split(",")],
        energy_seconds=args.energy_seconds,
        tuning=None,
    )
    from .bench.cases import OPS

    unknown = [o for o in opts["ops"] if o not in OPS]
    if unknown:
        print(f"--ops: unknown {unknown}; expected some of {','.join(OPS)}", file=sys.stderr)
        return 2
    print(f"ferry bench: {world} GPUs, {len(opts['sizes'])} sizes, {opts['ops']}, {impls}", file=sys.stderr)
    result = collectives.run_repeated(world, opts, args.repeat)
    from .bench.report import format_sections

    if result["records"]:
        print(format_table(result["records"]))
        print()
        print(ratio_table(result["records"]))
    print("\n".join(format_sections(result)))
    if args.out:
        command = recorded_command(sys.argv[1:], os.environ)
        stem, pngs = collectives.save(result, world, args.out, command, plot=not args.no_plot, tag=args.tag)
        print(f"\nwrote {stem}.json, .txt" + "".join(f", {os.path.basename(p)}" for p in pngs))
        if not args.no_plot and not pngs:
            print("no plots: matplotlib is not installed (pip install 'ferry[plot]')")
    return 0 if all(r["wrong"] == 0 for r in result["records"]) else 1


def prelaunch_ops(ops) -> list:
    """What `ferry bench --prelaunch` prepares: all_gather and all_to_all, those
    of `ops` if it names any."""
    both = ["all_gather", "all_to_all"]
    return [o for o in both if o in ops] or both


def recorded_command(argv, environ) -> str:
    """The command line a result file records, with the FERRY_* knobs that
    were set (they change what ran: e.g. FERRY_SIGNALS=kernel), so that it can
    be run again as written."""
    knobs = [f"{k}={shlex.quote(v)}" for k, v in sorted(environ.items()) if k.startswith("FERRY_")]
    return " ".join(knobs + ["ferry"] + [shlex.quote(a) for a in argv])


def cmd_tune(args) -> int:
    import json

    import torch

    from . import tune
    from .bench.report import parse_size, size_range

    world = args.gpus or torch.cuda.device_count()
    if world < 2:
        print(f"ferry tune needs at least 2 GPUs; {world} visible", file=sys.stderr)
        return 2
    sizes = size_range(parse_size(args.min), parse_size(args.max), args.factor)
    print(
        f"ferry tune: {world} GPUs, {len(sizes)} sizes, variants {tune.candidates(args.sm)}", file=sys.stderr
    )
    table = tune.run(
        world, args.ops.split(","), sizes, args.runs, args.timeout, sm=args.sm, repeat=args.repeat
    )
    table["command"] = recorded_command(sys.argv[1:], os.environ)
    out = args.out or os.path.expanduser(
        f"~/.cache/ferry/tuning-{table['gpu'].replace(' ', '-')}-x{world}.json"
    )
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(table, f, indent=1)
    for r in table["rules"]:
        bound = "any size" if r["max_bytes"] is None else f"<= {r['max_bytes']} B"
        signals = f", signals {r['signals']}" if "signals" in r else ""
        print(f"  {r['op']:<15} world {r['world']}: {bound:<16} -> {r['algo']}{signals}")
    print(f"wrote {out}; use it with FERRY_TUNING={out}")
    return 0 if all(r["wrong"] == 0 for r in table["records"]) else 1


def cmd_kv_tune(args) -> int:
    from .bench import kv

    opts = kv.make_options(
        args.pages, args.counts, "fetch,save", ",".join(kv.TUNED), args.max_bytes, args.reps
    )
    # Whole passes over the grid, one after another: each mode's time at a
    # point is its median over them (kv.median_over_passes).
    records = []
    for k in range(args.passes):

        def progress(message: str, k: int = k) -> None:
            print(f"pass {k + 1}/{args.passes}: {message}", file=sys.stderr, flush=True)

        result = kv.run(opts, progress=progress)
        records += result["records"]
    result = dict(result, records=records)
    out = args.out or os.path.expanduser(f"~/.cache/ferry/kv-{result['gpu'].replace(' ', '-')}.json")
    kv.write_table(result, out, recorded_command(sys.argv[1:], os.environ))
    print(kv.format_table(kv.median_over_passes(records)))
    print(f"wrote {out}; use it with FERRY_KV_TUNING={out}")
    return 0 if all(r["wrong"] == 0 for r in result["records"]) else 1


def at_least_one(text: str) -> int:
    """argparse type of a count that must be positive (e.g. --repeat)."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {n}")
    return n


def main(argv=None) -> int:
    from .bench import collectives as bench_collectives  # no torch at import: its list of impls
    from .bench import kv as bench_kv_module  # no torch at import: its defaults

    p = argparse.ArgumentParser(prog="ferry", description="copy-engine collectives for multi-GPU ML")
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("topo", help="show the GPUs, their links and copy engines")
    t.add_argument("--json", action="store_true", help="print JSON (loadable with ferry.topo.load)")
    t.add_argument("--file", help="read a topology JSON instead of probing")
    t.set_defaults(fn=cmd_topo)
    d = sub.add_parser("doctor", help="check that ferry can run here, and list its environment knobs")
    d.add_argument("--file", help="judge a topology JSON instead of this machine")
    d.set_defaults(fn=cmd_doctor)
    b = sub.add_parser(
        "bench",
        help="every benchmark this machine allows: KV transfers on one GPU, collectives against NCCL on 2+",
    )
    b.add_argument("--gpus", type=int, default=0, help="number of GPUs (default: all)")
    b.add_argument(
        "--only",
        default="",
        help="kv, collectives and/or multipath (default: kv and collectives where the machine allows; naming "
        "--ops or --impls means collectives)",
    )
    b.add_argument(
        "--multipath-args",
        default="--min 1M --max 1G --factor 2",
        help="options of python -m ferry.bench.multipath, for --only multipath (e.g. '--static --contention')",
    )
    b.add_argument("--kv-pages", default=bench_kv_module.DEFAULT_PAGES, help="KV page sizes")
    b.add_argument("--kv-counts", default=bench_kv_module.DEFAULT_COUNTS, help="KV pages per transfer")
    b.add_argument("--kv-ops", default="fetch,save,both")
    b.add_argument("--kv-max-bytes", default="1G", help="skip KV points moving more than this")
    b.add_argument("--kv-reps", type=int, default=5)
    b.add_argument(
        "--ops",
        default=None,
        help="any of all_gather, all_to_all, all_to_allv (uneven MoE-style counts), broadcast, reduce_scatter, "
        "all_reduce",
    )
    b.add_argument(
        "--impls",
        default=None,
        help=f"what to time, comma-separated (default: {','.join(bench_collectives.DEFAULT_IMPLS)}; ferry-ksig-graph is the selector's variant "
        "with signals='kernel', which --overlap then measures too; also ferry-auto, the selector's choice eager, "
        "and ferry-ksig, kernel signals eager); empty: only the optional measurements below",
    )
    b.add_argument("--min", default="1K", help="smallest bytes per rank")
    b.add_argument("--max", default="1G", help="largest bytes per rank")
    b.add_argument("--factor", type=int, default=4, help="size step")
    b.add_argument("--warmup", type=int, default=5)
    b.add_argument("--runs", type=int, default=7, help="timed runs per point; the median counts")
    b.add_argument(
        "--repeat",
        type=at_least_one,
        default=1,
        help="the whole sweep this many times, each in fresh processes: the median repeat counts, and the "
        "ratio table shows the range (small sizes can move by 5 us from one process to the next)",
    )
    b.add_argument("--timeout", type=float, default=120.0)
    b.add_argument("--local-copy", default="auto", choices=("auto", "peer", "sm", "driver"))
    b.add_argument(
        "--in-place",
        action="store_true",
        help="all_gather with each rank's input a slice of the output (FSDP's pattern; no own-block copy)",
    )
    b.add_argument(
        "--a2a-nccl-graph",
        action="store_true",
        help="also capture NCCL's all_to_all(v) above 1 MB per rank in a graph (it hung on H200 x2 and x4)",
    )
    b.add_argument("--overlap", action="store_true", help="also measure a bf16 GEMM loop beside all-gathers")
    b.add_argument("--overlap-size", default="", help="one size instead of --overlap-sizes")
    b.add_argument("--overlap-gemms", type=int, default=30)
    b.add_argument(
        "--overlap-op",
        default="all_gather",
        choices=("all_gather", "all_to_all", "all_to_allv", "broadcast", "reduce_scatter", "all_reduce"),
        help="the collective beside the GEMMs (bytes per rank as in the sweep: reduce_scatter's input)",
    )
    b.add_argument("--overlap-reps", type=int, default=7, help="alternating alone/beside measurements")
    b.add_argument(
        "--overlap-sizes",
        default="64K,1M,16M,256M",
        help="bytes per rank of the collectives beside the GEMMs",
    )
    b.add_argument("--local-copy-probe", action="store_true", help="also time copies within one GPU")
    b.add_argument("--prelaunch", action="store_true", help="also time prepared collectives trigger -> done")
    b.add_argument("--prelaunch-runs", type=int, default=15)
    b.add_argument(
        "--phases", action="store_true", help="also break all_gather into control/schedule/copy/sync"
    )
    b.add_argument("--energy", action="store_true", help="also measure NVML energy per GB, ferry vs NCCL")
    b.add_argument("--energy-sizes", default="1M,64M")
    b.add_argument("--energy-seconds", type=float, default=2.0)
    b.add_argument("--out", default="", help="folder for JSON, text table and PNG plot")
    b.add_argument("--no-plot", action="store_true")
    b.add_argument("--tag", default="", help="suffix of the result files' names")
    b.set_defaults(fn=cmd_bench)
    tu = sub.add_parser("tune", help="measure which variant is fastest per size here; write a tuning JSON")
    tu.add_argument("--gpus", type=int, default=0, help="number of GPUs (default: all)")
    tu.add_argument("--ops", default="all_gather,all_to_all")
    tu.add_argument("--min", default="1K")
    tu.add_argument("--max", default="256M")
    tu.add_argument("--factor", type=int, default=4)
    tu.add_argument("--runs", type=int, default=5)
    tu.add_argument(
        "--repeat",
        type=at_least_one,
        default=3,
        help="the measurement in this many sets of fresh processes; medians decide",
    )
    tu.add_argument("--timeout", type=float, default=120.0)
    tu.add_argument(
        "--out", default="", help="where to write (default ~/.cache/ferry/tuning-<gpu>-x<n>.json)"
    )
    tu.add_argument(
        "--sm",
        action="store_true",
        help="also measure ferry's SM path (algo 'sm': an SM kernel, not copy engines) and the copy-engine "
        "variants with their signal rounds sent by a one-block kernel (signals 'kernel'), and let them win the "
        "sizes where they are faster; load the file with FERRY_TUNING to use it",
    )
    tu.set_defaults(fn=cmd_tune)
    kt = sub.add_parser(
        "kv-tune", help="measure which KV transfer mode is fastest here; write the table auto uses"
    )
    kt.add_argument("--pages", default=bench_kv_module.DEFAULT_PAGES)
    kt.add_argument("--counts", default=bench_kv_module.DEFAULT_COUNTS)
    kt.add_argument("--max-bytes", default="1G")
    kt.add_argument("--reps", type=int, default=5)
    kt.add_argument(
        "--passes",
        type=at_least_one,
        default=3,
        help="whole passes over the grid; the table takes each mode's median over them (default 3)",
    )
    kt.add_argument("--out", default="", help="the table's path (default: ~/.cache/ferry/kv-<gpu>.json)")
    kt.set_defaults(fn=cmd_kv_tune)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())

"""Host and GPU time per call of every collective and variant, with every rank
of the world on one GPU (FERRY_SHARED_GPUS=1, one process, a stream per
rank): the timing for changes to ferry's host path (planning, memory,
emission), made where only one GPU is lent. Bandwidth here means nothing
(every rank shares one GPU's copy engines); compare host time and time per
call between two trees on one machine, alternating runs:

    python bench/shared_world.py --world 4 --out DIR --tag after
    PYTHONPATH=/tmp/ferry-base python bench/shared_world.py --world 4 --out DIR --tag before

It uses ferry's public API only, so the same script times any tree. Each
case is checked once against a reference (random bytes, poisoned output)
before it is timed; a wrong case is reported and left out. Per case: a
warm-up, then `--runs` runs of `--iters` calls, each run timed from the
first call's enqueue to the last rank's stream finishing (time per call)
and for the enqueueing alone (host per call); the medians are reported.
Eager calls (repeated eager calls replay a captured graph by default,
FERRY_REPLAY_CALLS). JSON records `{op, impl, world, bytes, time_us,
host_us, gpu, date, shared_gpus: true}`."""

import argparse
import datetime
import json
import os
import statistics
import sys
import time

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
OPS = ("all_gather", "all_to_all", "all_to_allv", "broadcast", "reduce_scatter", "all_reduce")
ALGOS = ("auto", "b2b", "seq", "pcpy", "sm")


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--sizes", default="1K,64K,4M", help="bytes per rank, comma-separated (K, M suffixes)")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--algos", default=",".join(ALGOS))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=".")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    os.environ.update(SAFE_ENV)
    os.environ["FERRY_SHARED_GPUS"] = "1"
    # As in the shared-GPU tests: with CUDA's default of 8 hardware queues, one
    # rank's done message can queue behind another rank's wait on the same GPU
    # (docs/architecture.md, "Streams and CUDA's hardware queues").
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    import ferry
    import torch

    world = args.world
    comm = ferry.init_local([0] * world, timeout=60)
    dev = torch.device("cuda", 0)
    streams = [torch.cuda.Stream(device=dev) for _ in range(world)]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    biggest = max(sizes)
    outs = comm.alloc((world * biggest + 4096,), torch.uint8)
    gen = torch.Generator(device=dev).manual_seed(7)
    ins = [
        torch.randint(0, 256, (world * biggest,), dtype=torch.uint8, device=dev, generator=gen)
        for _ in range(world)
    ]
    records, wrong = [], []

    def case(op: str, nbytes: int):
        """(call, outputs, expected per rank) for `op` with `nbytes` per rank."""
        n = nbytes
        if op == "all_gather":
            o = [t[: world * n] for t in outs]
            i = [x[:n] for x in ins]
            exp = [torch.cat(i)] * world
            return (lambda **kw: comm.all_gather(o, i, stream=streams, **kw)), o, exp
        if op == "all_to_all":
            o = [t[: world * n] for t in outs]
            i = [x[: world * n] for x in ins]
            exp = [torch.cat([i[s][r * n : (r + 1) * n] for s in range(world)]) for r in range(world)]
            return (lambda **kw: comm.all_to_all(o, i, stream=streams, **kw)), o, exp
        if op == "all_to_allv":
            counts = [[n if (s + d) % 3 else n // 2 for d in range(world)] for s in range(world)]
            o = [t[: sum(counts[s][r] for s in range(world))] for r, t in enumerate(outs)]
            i = [x[: sum(counts[r])] for r, x in enumerate(ins)]
            exp = []
            for r in range(world):
                parts = []
                for s in range(world):
                    off = sum(counts[s][:r])
                    parts.append(i[s][off : off + counts[s][r]])
                exp.append(torch.cat(parts))
            return (lambda **kw: comm.all_to_allv(o, i, counts, stream=streams, **kw)), o, exp
        if op == "broadcast":
            o = [t[:n] for t in outs]
            i = [x[:n] for x in ins]
            return (
                (lambda **kw: comm.broadcast(o, i, root=world - 1, stream=streams, **kw)),
                o,
                [i[-1]] * world,
            )
        count = max(1, n // 4)
        vals = [(x[: world * count * 4].view(torch.int32) % 1000) for x in ins]
        if op == "reduce_scatter":
            o = [torch.empty(count, dtype=torch.int32, device=dev) for _ in range(world)]
            total = torch.stack(vals).sum(0, dtype=torch.int32)
            exp = [total[r * count : (r + 1) * count] for r in range(world)]
            return (lambda **kw: comm.reduce_scatter(o, vals, stream=streams, **kw)), o, exp
        o = [t[: count * 4].view(torch.int32) for t in outs]
        i = [v[:count].contiguous() for v in vals]
        total = torch.stack(i).sum(0, dtype=torch.int32)
        return (lambda **kw: comm.all_reduce(o, i, stream=streams, **kw)), o, [total] * world

    def checked(call, o, exp, algo) -> bool:
        for t in o:
            t.view(torch.uint8).fill_(0xA5)
        torch.cuda.synchronize(dev)
        call(algo=algo)
        comm.synchronize()
        return all(torch.equal(t, e) for t, e in zip(o, exp))

    def timed(call, algo):
        for _ in range(3):
            call(algo=algo)
        comm.synchronize()
        per_call, host = [], []
        for _ in range(args.runs):
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            for _ in range(args.iters):
                call(algo=algo)
            t1 = time.perf_counter()
            for s in streams:
                s.synchronize()
            t2 = time.perf_counter()
            per_call.append((t2 - t0) / args.iters * 1e6)
            host.append((t1 - t0) / args.iters * 1e6)
        return statistics.median(per_call), statistics.median(host)

    gpu = torch.cuda.get_device_name(dev)
    date = datetime.date.today().isoformat()
    for op in args.ops.split(","):
        for n in sizes:
            call, o, exp = case(op, n)
            for algo in args.algos.split(","):
                if algo == "pcpy" and world > 4:
                    continue  # a stream per peer and rank on one GPU: more than its hardware queues
                impl = f"ferry-{algo}"
                try:
                    ok = checked(call, o, exp, algo)
                except ferry.InvalidArgumentError as exc:
                    if algo == "sm":  # a size or world the SM path does not take
                        print(f"{op:15s} {n:>9d} {impl:11s} not taken: {exc}", flush=True)
                        continue
                    wrong.append(f"{op} {n} {impl}: {exc}")
                    continue
                except ferry.FerryError as exc:
                    # A timeout breaks the communicator: every later case would fail the same way.
                    wrong.append(f"{op} {n} {impl}: {exc}")
                    return finish(comm, args, world, records, wrong, argv)
                if not ok:
                    wrong.append(f"{op} {n} {impl}: wrong result")
                    continue
                try:
                    t, h = timed(call, algo)
                except ferry.FerryError as exc:
                    wrong.append(f"{op} {n} {impl} (timed): {exc}")
                    return finish(comm, args, world, records, wrong, argv)
                records.append(
                    dict(
                        op=op,
                        impl=impl,
                        world=world,
                        bytes=n,
                        time_us=round(t, 2),
                        host_us=round(h, 2),
                        gpu=gpu,
                        date=date,
                        shared_gpus=True,
                    )
                )
                print(f"{op:15s} {n:>9d} {impl:11s} {t:9.1f} us/call  host {h:7.1f} us/call", flush=True)
    return finish(comm, args, world, records, wrong, argv)


def finish(comm, args, world, records, wrong, argv) -> int:
    import ferry

    try:
        comm.close()
    except ferry.FerryError as exc:  # after a failure: the error is in `wrong` already
        print(f"close: {exc}", flush=True)
    date = datetime.date.today().isoformat()
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{date}-shared-world-{world}" + (f"-{args.tag}" if args.tag else ""))
    with open(stem + ".json", "w") as f:
        json.dump(
            {
                "command": "python bench/shared_world.py " + " ".join(argv or sys.argv[1:]),
                "ferry": ferry.__file__,
                "records": records,
                "wrong": wrong,
            },
            f,
            indent=1,
        )
    print(f"wrote {stem}.json")
    for w in wrong:
        print(f"WRONG {w}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

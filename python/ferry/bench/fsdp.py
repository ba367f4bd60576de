"""FSDP2 training steps with the parameter all-gathers on NCCL (FSDP's
default) and on ferry (ferry.torch.use_for_fsdp), side by side in one process
per GPU: two copies of the same model, stepped in turn (ABAB, so clock and
thermal drift hit both alike), reduce-scatters on NCCL in both.

    torchrun --nproc-per-node 2 -m ferry.bench.fsdp --out bench/results

Each configuration: a stack of bias-free Linear+GELU layers (hidden x hidden,
fp32 parameters, bf16 compute), each layer its own FSDP unit, `tokens` rows
per step. Reports the median step time per side (max over ranks), ferry /
NCCL, ferry's all-gathers per step, and the host's time to enqueue a step
(close to the step time: the host sets the pace)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

from .collectives import SAFE_ENV


def build(torch, fully_shard, mp, layers: int, hidden: int, dev, seed: int):
    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden, bias=False), torch.nn.GELU()]
    model = torch.nn.Sequential(*mods).to(dev)
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model, torch.optim.SGD(model.parameters(), lr=1e-4)


def step_ms(torch, model, opt, x) -> tuple:
    """(GPU ms, host ms to enqueue the step): the two close together mean the
    host, not the GPU, sets the pace."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    model(x).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    end.record()
    host = (time.perf_counter() - t0) * 1e3
    end.synchronize()
    return start.elapsed_time(end), host


def run_config(torch, dist, comm, layers: int, hidden: int, tokens: int, steps: int, warmup: int) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import ferry.torch

    dev = torch.device("cuda", torch.cuda.current_device())
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    nccl_model, nccl_opt = build(torch, fully_shard, mp, layers, hidden, dev, 0)
    ferry_model, ferry_opt = build(torch, fully_shard, mp, layers, hidden, dev, 0)
    gather = ferry.torch.use_for_fsdp(ferry_model, comm)
    x = torch.randn(tokens, hidden, device=dev)
    times = {"nccl": [], "ferry": []}
    host = {"nccl": [], "ferry": []}
    for i in range(warmup + steps):
        for name, model, opt in (("nccl", nccl_model, nccl_opt), ("ferry", ferry_model, ferry_opt)):
            t, h = step_ms(torch, model, opt, x)
            if i >= warmup:
                times[name].append(t)
                host[name].append(h)
    # The slowest rank's median decides (a step ends when every rank's does).
    both = torch.tensor(
        [statistics.median(v) for v in (times["nccl"], times["ferry"], host["nccl"], host["ferry"])],
        device=dev,
    )
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    gather.pool.close()
    del nccl_model, ferry_model, nccl_opt, ferry_opt
    torch.cuda.empty_cache()
    nccl_ms, ferry_ms, nccl_host_ms, ferry_host_ms = both.tolist()
    return dict(
        layers=layers,
        hidden=hidden,
        tokens=tokens,
        steps=steps,
        warmup=warmup,
        nccl_ms=nccl_ms,
        ferry_ms=ferry_ms,
        ratio=ferry_ms / nccl_ms,
        nccl_host_ms=nccl_host_ms,
        ferry_host_ms=ferry_host_ms,
        ferry_all_gathers_per_step=gather.calls // (warmup + steps),
        all_gather_bytes_per_rank=hidden * hidden * 2 // dist.get_world_size(),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ferry.bench.fsdp", description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--tokens", default="2048,8192", help="rows per step, one configuration each")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default="", help="folder for <date>-<gpu>-x<n>-fsdp[-tag].{json,txt}")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    os.environ.update(SAFE_ENV)
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    import ferry.torch

    comm = ferry.torch.communicator()
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        if rank == 0:
            print(f"fsdp: {args.layers} x {args.hidden}^2, {tokens} tokens ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        rows.append(run_config(torch, dist, comm, args.layers, args.hidden, tokens, args.steps, args.warmup))
        if rank == 0:
            print(f"  done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    if rank == 0:
        gpu = torch.cuda.get_device_name(local)
        lines = [
            f"# {' '.join(['torchrun', '--nproc-per-node', str(world), '-m', 'ferry.bench.fsdp'] + sys.argv[1:])}",
            f"# {gpu} x{world}, {datetime.date.today().isoformat()}; median step (max over ranks), "
            f"{args.warmup} warm-up + {args.steps} steps per side, ABAB",
            "",
            f"{'layers':>6} {'hidden':>6} {'tokens':>6} {'AG MB/rank':>10} {'NCCL ms':>8} {'ferry ms':>8} "
            f"{'ferry/NCCL':>10} {'AG/step':>7} {'host ms: NCCL':>13} {'ferry':>6}",
        ]
        for r in rows:
            lines.append(
                f"{r['layers']:>6} {r['hidden']:>6} {r['tokens']:>6} {r['all_gather_bytes_per_rank'] / 2**20:>10.0f} "
                f"{r['nccl_ms']:>8.2f} {r['ferry_ms']:>8.2f} {r['ratio']:>10.3f} {r['ferry_all_gathers_per_step']:>7} "
                f"{r['nccl_host_ms']:>13.2f} {r['ferry_host_ms']:>6.2f}"
            )
        print("\n".join(lines))
        if args.out:
            stem = os.path.join(
                args.out,
                f"{datetime.date.today().isoformat()}-{gpu.replace(' ', '-')}-x{world}-fsdp"
                + (f"-{args.tag}" if args.tag else ""),
            )
            with open(stem + ".json", "w") as f:
                json.dump(dict(command=lines[0][2:], gpu=gpu, world=world, rows=rows), f, indent=1)
            with open(stem + ".txt", "w") as f:
                f.write("\n".join(lines) + "\n")
            print(f"wrote {stem}.json, .txt")
    comm.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

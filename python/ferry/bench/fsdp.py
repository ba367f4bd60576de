"""FSDP2 training steps with the collectives on NCCL (FSDP's default), with
the parameter all-gathers on ferry (ferry.torch.use_for_fsdp), and with the
gradient reduce-scatters on ferry too (use_for_fsdp(..., reduce_scatter=True)),
side by side in one process per GPU: three copies of the same model, stepped
in turn (ABCABC, so clock and thermal drift hit all alike).

    torchrun --nproc-per-node 2 -m ferry.bench.fsdp --out bench/results

Each configuration: a stack of bias-free Linear+GELU layers (hidden x hidden,
fp32 parameters, bf16 compute), each layer its own FSDP unit, `tokens` rows
per step. Reports the median step time per side (max over ranks), each
ferry side over NCCL, ferry's all-gathers per step, and the host's time to
enqueue a step (close to the step time: the host sets the pace)."""

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


SIDES = ("nccl", "ferry", "ferry-rs")  # FSDP's default; ferry's all-gather; and its reduce-scatter too


def run_config(torch, dist, comm, layers: int, hidden: int, tokens: int, steps: int, warmup: int) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import ferry.torch

    dev = torch.device("cuda", torch.cuda.current_device())
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    models = {side: build(torch, fully_shard, mp, layers, hidden, dev, 0) for side in SIDES}
    gathers = {
        side: ferry.torch.use_for_fsdp(models[side][0], comm, reduce_scatter=side == "ferry-rs")
        for side in SIDES[1:]
    }
    x = torch.randn(tokens, hidden, device=dev)
    times = {side: [] for side in SIDES}
    host = {side: [] for side in SIDES}
    for i in range(warmup + steps):
        for side in SIDES:
            t, h = step_ms(torch, *models[side], x)
            if i >= warmup:
                times[side].append(t)
                host[side].append(h)
    # The slowest rank's median decides (a step ends when every rank's does).
    medians = torch.tensor(
        [statistics.median(times[s]) for s in SIDES] + [statistics.median(host[s]) for s in SIDES], device=dev
    )
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    calls = gathers["ferry"].calls
    for g in gathers.values():
        g.pool.close()
    del models, gathers
    torch.cuda.empty_cache()
    ms, host_ms = medians.tolist()[: len(SIDES)], medians.tolist()[len(SIDES) :]
    return dict(
        layers=layers,
        hidden=hidden,
        tokens=tokens,
        steps=steps,
        warmup=warmup,
        nccl_ms=ms[0],
        ferry_ms=ms[1],
        ferry_rs_ms=ms[2],
        ratio=ms[1] / ms[0],
        ratio_rs=ms[2] / ms[0],
        nccl_host_ms=host_ms[0],
        ferry_host_ms=host_ms[1],
        ferry_rs_host_ms=host_ms[2],
        ferry_all_gathers_per_step=calls // (warmup + steps),
        all_gather_bytes_per_rank=hidden * hidden * 2 // dist.get_world_size(),
        reduce_scatter_input_bytes=hidden * hidden * 4,
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
            f"{args.warmup} warm-up + {args.steps} steps per side, in turn",
            "",
            "ferry: ferry's all-gathers, NCCL's reduce-scatters; +RS: ferry's reduce-scatters too (FSDP's "
            "force-sum scaling)",
            "",
            f"{'layers':>6} {'hidden':>6} {'tokens':>6} {'AG MB/rank':>10} {'NCCL ms':>8} {'ferry ms':>8} "
            f"{'+RS ms':>7} {'ferry/NCCL':>10} {'+RS/NCCL':>8} {'AG/step':>7} {'host ms: NCCL':>13} {'ferry':>6} "
            f"{'+RS':>6}",
        ]
        for r in rows:
            lines.append(
                f"{r['layers']:>6} {r['hidden']:>6} {r['tokens']:>6} {r['all_gather_bytes_per_rank'] / 2**20:>10.0f} "
                f"{r['nccl_ms']:>8.2f} {r['ferry_ms']:>8.2f} {r['ferry_rs_ms']:>7.2f} {r['ratio']:>10.3f} "
                f"{r['ratio_rs']:>8.3f} {r['ferry_all_gathers_per_step']:>7} {r['nccl_host_ms']:>13.2f} "
                f"{r['ferry_host_ms']:>6.2f} {r['ferry_rs_host_ms']:>6.2f}"
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

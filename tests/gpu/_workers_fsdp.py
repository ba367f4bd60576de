"""Workers for ferry.torch: the symmetric pool, and FSDP2 training with its
parameter all-gathers and gradient reduce-scatters on ferry, and its refusals
of bad input (one process per GPU)."""

from __future__ import annotations

import os

from _checks import SAFE_ENV, expecter, init, rand_bytes


def symmetric_pool(rank: int, world: int, port: int) -> list:
    """Pool tensors are valid all_gather outputs on every rank (same offsets),
    a range comes back only when its last view dies, and reuse keeps the
    reservation flat."""
    import torch
    from ferry.torch import SymmetricPool

    comm = init(rank, world, port, timeout=30)
    dev = torch.device("cuda", rank)
    fails = []
    pool = SymmetricPool(comm, chunk_bytes=4 << 20)
    try:
        # Odd sizes and dtypes, and one larger than a chunk (a second chunk).
        for k, (n, dtype) in enumerate(((1, torch.uint8), (1001, torch.bfloat16), (3 << 20, torch.float32))):
            out = pool.empty((world * n,), dtype)
            mine = out[rank * n : (rank + 1) * n]
            elem = dtype.itemsize
            want = torch.cat([rand_bytes(torch, 100 * k + q, n * elem, dev) for q in range(world)])
            out.view(torch.uint8).fill_(0xEE)  # poison
            mine.view(torch.uint8).copy_(want[rank * n * elem : (rank + 1) * n * elem])
            comm.all_gather(out, mine)  # in place, as FSDP gathers
            torch.cuda.synchronize(dev)
            bad = int((out.view(torch.uint8) != want).sum().item())
            if bad:
                fails.append(f"rank {rank} pool all_gather n={n} {dtype}: {bad} wrong bytes")
        if pool.bytes_reserved < (4 << 20) + world * (3 << 20) * 4:
            fails.append(
                f"rank {rank}: a request past the chunk size did not add a chunk ({pool.bytes_reserved})"
            )
        # Lifetime: the range stays taken while a view of it lives.
        before = pool.bytes_in_use
        t = pool.empty((4096,), torch.uint8)
        view = t[100:200]
        del t
        if pool.bytes_in_use != before + 4096:
            fails.append(f"rank {rank}: the range came back while a view was alive")
        del view
        if pool.bytes_in_use != before:
            fails.append(
                f"rank {rank}: the range did not come back after its last view ({pool.bytes_in_use})"
            )
        # Reuse: the same requests again and again reserve nothing more.
        reserved = pool.bytes_reserved
        for i in range(50):
            out = pool.empty((world * 65536,), torch.uint8)
            out[rank * 65536 : (rank + 1) * 65536].fill_(i % 256)
            comm.all_gather(out, out[rank * 65536 : (rank + 1) * 65536])
            del out
        comm.synchronize()
        if pool.bytes_reserved != reserved:
            fails.append(
                f"rank {rank}: 50 equal requests grew the pool from {reserved} to {pool.bytes_reserved}"
            )
        # A tensor that outlives close() is harmless to a pool used again.
        survivor = pool.empty((1024,), torch.uint8)
        pool.close()
        del survivor
        again = pool.empty((world * 8,), torch.uint8)
        comm.all_gather(again, again[rank * 8 : (rank + 1) * 8])
        comm.synchronize()
        del again
    finally:
        pool.close()
        comm.close()
    return fails


def fsdp_training(rank: int, world: int, port: int) -> list:
    """The same FSDP2 training from the same seed with NCCL (FSDP's default),
    with ferry's all-gather, and with ferry's all-gather and reduce-scatter.
    With ferry's all-gather every loss and final parameter must be bitwise
    equal to NCCL's (an all-gather only moves bytes); with its reduce-scatter
    too, equal to NCCL's with the same force-sum scaling: bitwise on 2 ranks
    (a sum of two numbers has one rounding), within float32 rounding on more
    (ferry adds in rank order, NCCL's ring in another). ferry must have run,
    and its pool must not grow after the first step."""
    os.environ.update(SAFE_ENV)
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS: equal GEMMs give equal bits
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.use_deterministic_algorithms(True)
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        dist.destroy_process_group()
        return []  # no FSDP2 in this PyTorch: nothing to test
    import ferry.torch

    dev = torch.device("cuda", rank)
    fails = []
    comm = ferry.torch.communicator(timeout=30)

    def train(mode: str):
        torch.manual_seed(0)
        # Odd widths: FSDP pads each shard, so the all-gathers have odd sizes.
        widths = [256, 333, 512, 129, 64]
        layers = []
        for a, b in zip(widths, widths[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.GELU()]
        model = torch.nn.Sequential(*layers).to(dev)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        gather = None
        if mode == "nccl-sum":  # the scaling use_for_fsdp(reduce_scatter=True) sets, on NCCL
            for m in model.modules():
                if hasattr(m, "set_force_sum_reduction_for_comms"):
                    m.set_force_sum_reduction_for_comms(True)
        elif mode != "nccl":
            gather = ferry.torch.use_for_fsdp(model, comm, reduce_scatter=mode == "ferry-rs")
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        losses, reserved = [], []
        g = torch.Generator(device=dev).manual_seed(1000 + rank)
        for _ in range(4):
            x = torch.randn(64, widths[0], device=dev, generator=g)
            loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().clone())
            if gather is not None:
                reserved.append(gather.pool.bytes_reserved)
        params = [p.full_tensor().detach().clone() for p in model.parameters()]
        if gather is not None:
            if gather.calls == 0:
                fails.append(f"rank {rank} {mode}: ferry's all-gather was never called")
            if mode == "ferry-rs" and gather.reduce_scatter.calls == 0:
                fails.append(f"rank {rank} {mode}: ferry's reduce-scatter was never called")
            if len(set(reserved[1:])) > 1 or reserved[-1] > reserved[0]:
                fails.append(f"rank {rank} {mode}: the pool grew after the first step: {reserved}")
            gather.pool.close()
        return losses, params

    def compare(what, ref, got, exact):
        for i, (a, b) in enumerate(zip(ref[0], got[0])):
            same = torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-5, atol=1e-7)
            if not same:
                fails.append(f"rank {rank} {what}: step {i} loss {b.item()} against {a.item()}")
        for i, (a, b) in enumerate(zip(ref[1], got[1])):
            same = torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-4, atol=1e-6)
            if not same:
                fails.append(
                    f"rank {rank} {what}: parameter {i} differs after training ({int((a != b).sum())} elements)"
                )

    try:
        compare("ferry all-gather vs NCCL", train("nccl"), train("ferry"), exact=True)
        compare(
            "ferry all-gather + reduce-scatter vs NCCL (force-sum)",
            train("nccl-sum"),
            train("ferry-rs"),
            exact=world == 2,
        )
    finally:
        comm.close()
        dist.destroy_process_group()
    return fails


def fsdp_bad_inputs(rank: int, world: int, port: int) -> list:
    """ferry.torch's refusals, each naming what it got and what it expects:
    a buffer on another device, a group of another size, an op ferry does not
    reduce with (a premultiplied sum)."""
    os.environ.update(SAFE_ENV)
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    import ferry
    import ferry.torch

    fails = []
    expect = expecter(ferry, fails, f"rank {rank}: ")
    comm = ferry.torch.communicator(timeout=30)
    try:
        gather = ferry.torch.FSDPAllGather(comm)
        scatter = ferry.torch.FSDPReduceScatter(comm)
        for who, c in (("FSDPAllGather", gather), ("FSDPReduceScatter", scatter)):
            expect(
                rf"{who}.allocate: device is cpu; expected cuda:{rank}",
                lambda c=c: c.allocate((16,), dtype=torch.float32, device=torch.device("cpu")),
            )
            other = (rank + 1) % torch.cuda.device_count()
            expect(
                rf"{who}.allocate: device is cuda:{other}; expected cuda:{rank}",
                lambda c=c: c.allocate((16,), dtype=torch.float32, device=torch.device("cuda", other)),
            )
        # A group of one rank (each rank its own): not the communicator's.
        solo = [dist.new_group([r]) for r in range(world)][rank]
        out = gather.allocate((4 * world,), dtype=torch.float32, device=torch.device("cuda", rank))
        expect(
            rf"FSDPAllGather: FSDP's group has 1 ranks .*the ferry communicator has {world}",
            lambda: gather(out, out[rank * 4 : (rank + 1) * 4], group=solo),
        )
        inp = torch.zeros(4 * world, device=torch.device("cuda", rank))
        expect(
            rf"FSDPReduceScatter: FSDP's group has 1 ranks .*the ferry communicator has {world}",
            lambda: scatter(inp[:4].clone(), inp, group=solo, op=dist.ReduceOp.SUM),
        )
        premul = dist._make_nccl_premul_sum(0.5)
        expect(
            r"FSDPReduceScatter: op is .*; ferry reduces with SUM, AVG, MAX or MIN",
            lambda: scatter(inp[:4].clone(), inp, group=dist.group.WORLD, op=premul),
        )
        # AVG: summed, then divided, on every rank alike.
        x = torch.full((4 * world,), float(rank + 1), device=torch.device("cuda", rank))
        y = torch.empty(4, device=x.device)
        scatter(y, x, group=dist.group.WORLD, op=dist.ReduceOp.AVG)
        want = sum(range(1, world + 1)) / world
        if not torch.equal(y, torch.full_like(y, want)):
            fails.append(f"rank {rank}: AVG gave {y.tolist()}, expected {want}")
        gather.pool.close()
    finally:
        comm.close()
        dist.destroy_process_group()
    return fails

"""Workers for ferry.torch: the symmetric pool, and FSDP2 training with its
parameter all-gathers on ferry (one process per GPU)."""

from __future__ import annotations

import os

from _checks import SAFE_ENV, init, rand_bytes


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
    """The same FSDP2 training twice from the same seed, all-gathers by NCCL
    (FSDP's default) and by ferry: every loss and every final parameter must
    be bitwise equal (an all-gather only moves bytes), ferry must have run,
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

    def train(use_ferry: bool):
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
        gather = ferry.torch.use_for_fsdp(model, comm) if use_ferry else None
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
        return losses, params, gather, reserved

    try:
        ref_losses, ref_params, _, _ = train(False)
        losses, params, gather, reserved = train(True)
        if gather.calls == 0:
            fails.append(f"rank {rank}: ferry's all-gather was never called")
        for i, (a, b) in enumerate(zip(ref_losses, losses)):
            if not torch.equal(a, b):
                fails.append(f"rank {rank}: step {i} loss {b.item()} with ferry, {a.item()} with NCCL")
        for i, (a, b) in enumerate(zip(ref_params, params)):
            if not torch.equal(a, b):
                fails.append(
                    f"rank {rank}: parameter {i} differs after training ({int((a != b).sum())} elements)"
                )
        if len(set(reserved[1:])) > 1 or reserved[-1] > reserved[0]:
            fails.append(f"rank {rank}: the pool grew after the first step: {reserved}")
        gather.pool.close()
    finally:
        comm.close()
        dist.destroy_process_group()
    return fails

"""Triton kernels on ferry's symmetric heap, through pointer tables: each rank
puts its data into its right neighbour's buffer and signals it (a release
at system scope), waits for its left neighbour's signal (an acquire, bounded:
a wait that gives up says so instead of hanging), then every rank sums every
rank's buffer, read in place over NVLink. Checked against torch.

    python examples/symm_triton.py                                  # one process, a rank per visible GPU
    FERRY_SHARED_GPUS=1 python examples/symm_triton.py --ranks 4    # 4 ranks sharing the GPUs
    torchrun --nproc-per-node 4 examples/symm_triton.py             # one process per GPU

``heap.peer_ptrs(t)`` is an int64 tensor of every rank's address of ``t``;
a Triton kernel loads the entry of the rank it wants and casts it to a
pointer. (Equivalently: ``t``'s own address plus ``(peer - rank) *
heap.handle().stride``.)
"""

from __future__ import annotations

import argparse
import os

import ferry
import ferry.symm
import torch
import triton
import triton.language as tl

SPINS = 1 << 24  # polls of a signal before the wait gives up (seconds, not forever)


# One compiled variant for every rank, round and size (Triton otherwise
# specializes integers equal to 1 or divisible by 16): it is compiled and
# loaded at the warm-up, before any kernel spins.
@triton.jit(do_not_specialize=["n", "rank", "world", "round_"])
def ring_put_signal(
    src, x_table, flag_table, n, rank, world, round_, gave_up, BLOCK: tl.constexpr, SPINS: tl.constexpr
):
    """Copies src into the right neighbour's x, signals it `round_`, and waits
    until this rank's own flag holds `round_` (set by the left neighbour)."""
    right = (rank + 1) % world
    right_x = tl.load(x_table + right).to(tl.pointer_type(tl.float32))
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(right_x + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)
    # Every thread's stores are done before one release carries them (the
    # release is cumulative over what its thread saw at the barrier).
    tl.debug_barrier()
    right_flag = tl.load(flag_table + right).to(tl.pointer_type(tl.int64))
    want = tl.zeros((), dtype=tl.int64) + round_
    tl.atomic_xchg(right_flag, want, sem="release", scope="sys")
    own_flag = tl.load(flag_table + rank).to(tl.pointer_type(tl.int64))
    seen = tl.atomic_add(own_flag, 0, sem="acquire", scope="sys")
    spins = 0
    while (seen < want) & (spins < SPINS):
        seen = tl.atomic_add(own_flag, 0, sem="acquire", scope="sys")
        spins += 1
    if seen < want:
        tl.store(gave_up, 1)


@triton.jit(do_not_specialize=["n", "world"])
def sum_of_every_rank(x_table, out, n, world, BLOCK: tl.constexpr):
    """out = the sum of every rank's x (read in place, rank order)."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for r in range(0, world):
        x = tl.load(x_table + r).to(tl.pointer_type(tl.float32))
        acc += tl.load(x + offs, mask=offs < n, other=0.0)
    tl.store(out + offs, acc, mask=offs < n)


def values(rank: int, rnd: int, n: int, dev) -> torch.Tensor:
    """Whole numbers in float32, so that sums are exact in any order."""
    g = torch.Generator(device="cpu")
    g.manual_seed(1000 * rnd + rank)
    return torch.randint(-1000, 1000, (n,), generator=g).to(torch.float32).to(dev)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=0, help="one process: ranks (default: one per visible GPU)")
    p.add_argument("--elements", type=int, default=(1 << 20) + 3)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    for var, value in (
        ("NCCL_NVLS_ENABLE", "0"),
        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
        ("NVSHMEM_DISABLE_NVLS", "1"),
    ):
        os.environ[var] = value

    local = "RANK" not in os.environ
    if local:  # one process drives every rank; heap calls give one tensor per rank
        gpus = torch.cuda.device_count()
        comm = ferry.init_local([r % gpus for r in range(args.ranks or gpus)])
        ranks, devs = list(range(comm.world)), comm.devices
    else:  # torchrun: one process per GPU
        comm = ferry.init()
        ranks, devs = [comm.rank], [comm.device]
        torch.cuda.set_device(comm.device)
    W, n = comm.world, args.elements
    heap = ferry.symm.Heap(comm, capacity=1 << 30)

    def each(v):
        return v if local else [v]

    xs = each(heap.zeros((n,), torch.float32))
    flags = each(heap.zeros((1,), torch.int64))
    x_tables = [heap.peer_ptrs(x) for x in xs]
    flag_tables = [heap.peer_ptrs(f) for f in flags]
    gave_up = [torch.zeros(1, dtype=torch.int32, device=d) for d in devs]
    streams = [torch.cuda.Stream(device=d) for d in devs]
    BLOCK = 1024

    def ring(rnd, srcs, count):
        for i, r in enumerate(ranks):
            with torch.cuda.device(devs[i]), torch.cuda.stream(streams[i]):
                ring_put_signal[(1,)](
                    srcs[i],
                    x_tables[i],
                    flag_tables[i],
                    count,
                    r,
                    W,
                    rnd,
                    gave_up[i],
                    BLOCK=BLOCK,
                    SPINS=SPINS,
                )

    def summed(outs):
        for i in range(len(ranks)):
            with torch.cuda.device(devs[i]), torch.cuda.stream(streams[i]):
                sum_of_every_rank[(triton.cdiv(n, BLOCK),)](x_tables[i], outs[i], n, W, BLOCK=BLOCK)

    def barrier():
        heap.barrier_on_stream(streams if local else streams[0])

    for i, s in enumerate(streams):
        s.wait_stream(torch.cuda.current_stream(devs[i]))
    # Compiled and loaded once where nothing waits (round 0 passes at once;
    # each rank copies its zeros): a kernel's first launch may wait for the
    # GPU, and so for a spinning one.
    ring(0, [x for x in xs], n)
    summed([torch.empty(n, dtype=torch.float32, device=d) for d in devs])
    barrier()
    failed = 0
    for rnd in range(1, args.rounds + 1):
        srcs = [values(r, rnd, n, devs[i]) for i, r in enumerate(ranks)]
        outs = [torch.full((n,), float("nan"), device=d) for d in devs]
        for i, s in enumerate(streams):
            s.wait_stream(torch.cuda.current_stream(devs[i]))  # after the inputs and the poison
        ring(rnd, srcs, n)
        barrier()  # every rank's x written before any rank reads them all
        summed(outs)
        barrier()  # every rank has read every x before the next round's puts
        for s in streams:
            s.synchronize()
        heap.check()
        total = sum(values(q, rnd, n, "cpu") for q in range(W))
        for i, r in enumerate(ranks):
            left = (r - 1) % W
            ok_ring = torch.equal(xs[i].cpu(), values(left, rnd, n, "cpu"))
            ok_sum = torch.equal(outs[i].cpu(), total)
            if int(gave_up[i].item()) or not ok_ring or not ok_sum:
                failed += 1
                print(
                    f"symm_triton: rank {r} round {rnd}: wait gave up {bool(gave_up[i].item())}, "
                    f"left neighbour's data {'ok' if ok_ring else 'wrong'}, sum {'ok' if ok_sum else 'wrong'}"
                )
    print(f"symm_triton: {args.rounds} rounds x {len(ranks)} rank(s) of {W}, {n} floats: {failed} failed")
    heap.close()
    comm.close()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

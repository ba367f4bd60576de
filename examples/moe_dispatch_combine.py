"""An MoE dispatch/combine kernel pair written on ferry's device API
(examples/moe_dispatch_combine.cu), checked against a torch reference.

    python examples/moe_dispatch_combine.py                    # one process, a rank per visible GPU
    FERRY_SHARED_GPUS=1 python examples/moe_dispatch_combine.py --ranks 4   # 4 ranks sharing the GPUs
    torchrun --nproc-per-node 4 examples/moe_dispatch_combine.py            # one process per GPU

Each rank has 128 tokens of hidden size 7168 (bf16), each routed to 8 of the
experts (4 per rank). Dispatch puts every token's row straight into a slot of
each chosen expert's rank and signals; the expert (here: multiply by e + 1)
writes its result straight back into the token's rank and signals; combine
sums the 8 results with their weights. The kernels are built with
ferry.symm.load_kernels (torch's cpp_extension against ferry.get_include()),
or --library names a build of examples/moe_dispatch_combine.cu (CMake makes one).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

import ferry
import ferry.symm
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def load(path: str = ""):
    """The kernels: a build given by path, else built now against ferry's headers."""
    if path:
        lib = ctypes.CDLL(path)
    else:
        lib = ferry.symm.load_kernels("ferry_moe_example", [os.path.join(HERE, "moe_dispatch_combine.cu")])
    P, I, U = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64
    common = [P, I, I, I, I, I]
    lib.moe_dispatch.argtypes = common + [P, P, P, P, P, P, U, P]
    lib.moe_expert.argtypes = common + [P, P, P, P, P, P, U, P, P]
    lib.moe_combine.argtypes = common + [P, P, P, P, P, U, P, P]
    for f in (lib.moe_dispatch, lib.moe_expert, lib.moe_combine):
        f.restype = I
    return lib


def routing(rank: int, rnd: int, tokens: int, topk: int, experts: int, dev):
    """Random inputs of one rank and round: rows, distinct top-k experts, weights."""
    g = torch.Generator(device="cpu")
    g.manual_seed(1000 * rank + rnd)
    idx = torch.rand(tokens, experts, generator=g).argsort(dim=1)[:, :topk].to(torch.int32)
    w = torch.rand(tokens, topk, generator=g).softmax(dim=1)
    return idx.to(dev), w.to(dev)


def rows(rank: int, rnd: int, tokens: int, hidden: int, dev):
    g = torch.Generator(device="cpu")
    g.manual_seed(7 + 1000 * rank + rnd)
    return torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(dev)


def reference(x, idx, w):
    """out[t] = sum_k w[t, k] * bf16(x[t] * (e + 1)), in float64."""
    y = (x.float()[:, None, :] * (idx.float()[:, :, None] + 1)).to(torch.bfloat16).double()
    return (w.double()[:, :, None] * y).sum(1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=0, help="one process: ranks (default: one per visible GPU)")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts-per-rank", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--library", default="", help="a build of moe_dispatch_combine.cu (default: build it now)")
    args = p.parse_args(argv)
    for var, value in (
        ("NCCL_NVLS_ENABLE", "0"),
        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
        ("NVSHMEM_DISABLE_NVLS", "1"),
    ):
        os.environ[var] = value

    if "RANK" in os.environ:  # torchrun: one process per GPU
        comm = ferry.init()
        ranks, devs = [comm.rank], [comm.device]
        torch.cuda.set_device(comm.device)
    else:
        n = torch.cuda.device_count()
        world = args.ranks or n
        comm = ferry.init_local([r % n for r in range(world)])
        ranks, devs = list(range(world)), comm.devices
    W, T, H, K, epr = comm.world, args.tokens, args.hidden, args.topk, args.experts_per_rank
    E = W * epr
    if K > E:
        raise SystemExit(f"--topk {K} needs at least {K} experts; {W} ranks x {epr} give {E}")
    lib = load(args.library)

    heap = ferry.symm.Heap(comm, capacity=1 << 30)
    local = "RANK" not in os.environ  # init_local: every heap call gives one tensor per rank

    def each(v):
        return v if local else [v]

    recv_x = each(heap.empty((epr, W, T, H), torch.bfloat16))
    recv_meta = each(heap.empty((epr, W, T), torch.int32))
    recv_count = each(heap.zeros((epr, W), torch.int32))
    recv_flag = each(heap.zeros((epr, W), torch.int64))
    combine_in = each(heap.empty((T, K, H), torch.bfloat16))
    combine_flag = each(heap.zeros((E,), torch.int64))
    streams = [torch.cuda.Stream(device=d) for d in devs]
    handles = [heap.handle(i).as_bytes() for i in range(len(ranks))]
    for i, s in enumerate(streams):
        s.wait_stream(torch.cuda.current_stream(devs[i]))
    heap.barrier_on_stream(streams if local else streams[0])  # every rank's flags are zero before round 1

    def ptr(t):
        return t.data_ptr()

    worst, failed = 0.0, 0
    for rnd in range(1, args.rounds + 1):
        inputs, outs, oks = [], [], []
        for i, r in enumerate(ranks):
            with torch.cuda.device(devs[i]), torch.cuda.stream(streams[i]):
                x = rows(r, rnd, T, H, devs[i])
                idx, w = routing(r, rnd, T, K, E, devs[i])
                inputs.append((x, idx, w))
                outs.append(torch.full((T, H), float("nan"), dtype=torch.bfloat16, device=devs[i]))
                oks.append(torch.ones(1, dtype=torch.int32, device=devs[i]))
        shape = (T, H, K, E, epr)
        # Every rank's dispatch, then every rank's experts, then every rank's
        # combine: each waits for signals of the step before on all ranks.
        for i in range(len(ranks)):
            x, idx, _ = inputs[i]
            err = lib.moe_dispatch(
                handles[i],
                *shape,
                ptr(x),
                ptr(idx),
                ptr(recv_x[i]),
                ptr(recv_meta[i]),
                ptr(recv_count[i]),
                ptr(recv_flag[i]),
                rnd,
                streams[i].cuda_stream,
            )
            assert err == 0, f"moe_dispatch: CUDA error {err}"
        for i in range(len(ranks)):
            err = lib.moe_expert(
                handles[i],
                *shape,
                ptr(recv_x[i]),
                ptr(recv_meta[i]),
                ptr(recv_count[i]),
                ptr(recv_flag[i]),
                ptr(combine_in[i]),
                ptr(combine_flag[i]),
                rnd,
                ptr(oks[i]),
                streams[i].cuda_stream,
            )
            assert err == 0, f"moe_expert: CUDA error {err}"
        for i in range(len(ranks)):
            _, idx, w = inputs[i]
            err = lib.moe_combine(
                handles[i],
                *shape,
                ptr(idx),
                ptr(w),
                ptr(combine_in[i]),
                ptr(combine_flag[i]),
                ptr(outs[i]),
                rnd,
                ptr(oks[i]),
                streams[i].cuda_stream,
            )
            assert err == 0, f"moe_combine: CUDA error {err}"
        # Every rank is done with the round before any rank starts the next:
        # a rank that sent an expert no rows does not wait for it in combine,
        # and must not rewrite that expert's slots while it still reads them.
        heap.barrier_on_stream(streams if local else streams[0])
        for s in streams:
            s.synchronize()
        heap.check()
        for i, r in enumerate(ranks):
            x, idx, w = inputs[i]
            ref = reference(x, idx, w)
            got = outs[i].double()
            rel = float((got - ref).norm() / ref.norm())
            bad = int(oks[i].item()) != 1 or not torch.isfinite(got).all() or rel > 1e-2
            worst = max(worst, rel)
            failed += bad
            if bad:
                print(f"moe: rank {r} round {rnd}: relative error {rel:.2e}, kernels ok {int(oks[i].item())}")
    print(
        f"moe: {args.rounds} rounds x {len(ranks)} rank(s) of {W}, {T} tokens, hidden {H}, top-{K} of {E} experts: "
        f"worst relative error {worst:.2e}, {failed} failed"
    )
    heap.close()
    comm.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Probe: where the host time of one small inline page transfer goes.

    python bench/probes/kv_host_cost.py [--pages 64] [--page-bytes 4096] [--calls 300] [--tensors 2,16,64]

Fetches `pages` scattered pages of a ferry HostPool into a GPU buffer (as the
KV benchmark's inline rows do) and prints the median host time per call of:
a torch kernel launch (the machine's floor), ferry.kv.copy_blocks in each
mode, its Python steps alone (_sides, _id_pair, the stream lookup), and the
native call alone with those steps done beforehand; then the sides' checks
and whole calls with T tensors a side (page-first host pool); then a
cProfile of the kernel mode's calls. Nothing here is checked: the KV tests check the bytes.
"""

import argparse
import cProfile
import io
import pstats
import random
import statistics
import time


def median_us(fn, calls: int, sync=None) -> float:
    for _ in range(20):
        fn()
    if sync:
        sync()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if sync and len(times) % 16 == 0:
            sync()  # keep the stream's queue short, as a serving loop's is
    if sync:
        sync()
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=64)
    ap.add_argument("--page-bytes", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument(
        "--tensors",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[2, 16, 64],
        help="T list, e.g. 2,16,64",
    )
    a = ap.parse_args()

    import ferry.kv as kv
    import torch
    from ferry import kv as kvmod

    n, pb = a.pages, a.page_bytes
    pool = kv.HostPool(4 * n * pb)
    host = pool.tensor((4 * n, pb), torch.uint8)
    gpu = torch.empty((4 * n, pb), dtype=torch.uint8, device="cuda")
    rng = random.Random(1)
    src_ids = rng.sample(range(4 * n), n)
    dst_ids = rng.sample(range(4 * n), n)
    sync = torch.cuda.synchronize
    x = torch.zeros(1, device="cuda")
    print(f"{n} pages of {pb} bytes, host -> GPU, median host us over {a.calls} calls")
    print(f"  torch x.add_(1)                      {median_us(lambda: x.add_(1), a.calls, sync):8.1f}")
    for mode in ("kernel", "batched", "per_page", "auto"):
        us = median_us(lambda: kv.copy_blocks(gpu, host, dst_ids, src_ids, mode=mode), a.calls, sync)
        print(f"  copy_blocks mode={mode:<9}             {us:8.1f}")
    us = median_us(lambda: kv.copy_blocks(gpu, host, dst_ids, src_ids, zero_sm=True), a.calls, sync)
    print(f"  copy_blocks zero_sm=True               {us:8.1f}")
    t_src, t_dst = torch.tensor(src_ids), torch.tensor(dst_ids)
    us = median_us(lambda: kv.copy_blocks(gpu, host, t_dst, t_src, mode="kernel"), a.calls, sync)
    print(f"  copy_blocks mode=kernel, CPU tensors   {us:8.1f}")

    print("  Python steps alone:")
    print(
        f"    _sides                               {median_us(lambda: kvmod._sides(gpu, host), a.calls):8.1f}"
    )
    print(
        f"    _id_pair (lists)                     {median_us(lambda: kvmod._id_pair(dst_ids, src_ids), a.calls):8.1f}"
    )
    print(
        f"    _stream_handle                       {median_us(lambda: kvmod._stream_handle(None, 0), a.calls):8.1f}"
    )
    native = kvmod.require()
    device, dr, sr = kvmod._sides(gpu, host)
    d, s = kvmod._id_pair(dst_ids, src_ids)
    h = kvmod._stream_handle(None, device)
    us = median_us(lambda: native.kv_direction(device, dr, sr), a.calls)
    print(f"    native.kv_direction                  {us:8.1f}")
    for mode in ("kernel", "batched", "per_page"):

        def call(mode=mode):
            native.kv_copy(
                device,
                dr,
                sr,
                d.ptr,
                s.ptr,
                d.count,
                d.is_64,
                False,
                mode,
                False,
                False,
                False,
                True,
                True,
                0,
                0,
                0,
                0,
                h,
            )

        print(f"  native.kv_copy mode={mode:<9}          {median_us(call, a.calls, sync):8.1f}")

    # Many tensors a side (every layer's K and V, as one call for all layers
    # passes them): the sides' checks grow with the count, the rest does not.
    print(f"  with T tensors a side ({n} pages of {pb} bytes each):")
    for t in a.tensors:
        gbig = torch.empty((t, 4 * n, pb), dtype=torch.uint8, device="cuda")
        hbig = kv.HostPool(4 * n * t * pb).tensor((4 * n, t, pb), torch.uint8)  # page-first
        gs, hs = list(gbig), [hbig[:, i] for i in range(t)]
        sides_us = median_us(lambda: kvmod._sides(gs, hs), a.calls)
        kern_us = median_us(lambda: kv.copy_blocks(gs, hs, dst_ids, src_ids, mode="kernel"), a.calls, sync)
        zero_us = median_us(lambda: kv.copy_blocks(gs, hs, dst_ids, src_ids, zero_sm=True), a.calls, sync)
        pages = getattr(kv, "Pages", None)  # (not in trees before it)
        pages_us = float("nan")
        if pages is not None:
            gp, hp = pages(gs), pages(hs)
            pages_us = median_us(
                lambda: kv.copy_blocks(gp, hp, dst_ids, src_ids, mode="kernel"), a.calls, sync
            )
        dev_t, dr_t, sr_t = kvmod._sides(gs, hs)
        locate_us = median_us(lambda: native.kv_direction(dev_t, dr_t, sr_t), a.calls)

        def native_kernel(dr_t=dr_t, sr_t=sr_t, dev_t=dev_t):
            native.kv_copy(
                dev_t, dr_t, sr_t, d.ptr, s.ptr, d.count, d.is_64, False, "kernel", False, False, False, True, True,
                0, 0, 0, 0, h,
            )  # fmt: skip

        native_us = median_us(native_kernel, a.calls, sync)
        print(
            f"    T={t:<4} _sides {sides_us:8.1f}   copy_blocks kernel {kern_us:8.1f}   "
            f"zero_sm {zero_us:8.1f}   native: locating {locate_us:8.1f}, kernel call {native_us:8.1f}   "
            f"kernel with kv.Pages {pages_us:8.1f}"
        )

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.calls):
        kv.copy_blocks(gpu, host, dst_ids, src_ids, mode="kernel")
    prof.disable()
    sync()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    print("cProfile, mode=kernel, by own time:")
    print("\n".join(out.getvalue().splitlines()[:40]))


if __name__ == "__main__":
    main()

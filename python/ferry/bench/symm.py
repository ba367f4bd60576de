"""The symmetric heap measured against the field, in one run, on one machine.

    torchrun --nproc-per-node 4 -m ferry.bench.symm --out results/
    python -m ferry.bench.symm --out results/      # one process driving every visible GPU (ferry only)

What it measures (CUDA events around one launch that repeats the operation,
after a warm-up launch; the median of --reps launches; graphs off). In-kernel
rows (ferry's and NVSHMEM's device API) are the slope between launches of
--iters and 5 x --iters operations, alternating, so that what a launch costs
once (the host's launch onto an idle stream, the ranks' skew at their first
meeting, the kernel's start and end) is left out; their records' once_us is
that cost. Copy-engine and on-stream rows are per call, host included:
- put and get bandwidth to and from one peer by size: the device API (block
  scope, 1, 8, 16 and 32 blocks; thread and warp scope on 8 blocks, each
  thread or warp moving its own slice; a get loads over NVLink where a put
  stores) and the copy engines (heap.put and heap.get on a stream); every
  device put's and get's bytes checked;
- put latency (8 B and 4 KB, put then quiet, by one thread, warp or block)
  and g latency (dependent loads of a peer's word);
- half round trip of a signal between ranks 0 and 1 (kernels ping-ponging);
- barrier latency: the device API in a kernel, barrier_on_stream;
- bf16 all-reduce latency by size: the device API's all_reduce (1 and 8
  blocks) against NCCL (torch.distributed) and PyTorch SymmetricMemory's
  one-shot and two-shot all-reduce, where torchrun gives one process per GPU,
  each per host call and captured into a CUDA graph ("-graph", the slope
  between replays of one graph and of five);
- NVSHMEM, the same measurements written against its API
  (nvshmem_bench.cu, built against the nvidia-nvshmem wheel and run after
  ferry's part, one process per GPU; --no-nvshmem skips it).
Records: {op, impl, world, bytes, time_us, gbps, scope, graph, gpu, date}. Ranks sharing a GPU (FERRY_SHARED_GPUS) say nothing
about speed: the run refuses them.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import sys
from typing import Dict, List, Sequence

from . import nvshmem
from .report import format_size, parse_size, size_range

HERE = os.path.dirname(os.path.abspath(__file__))

# Issue targets on 4 H200s (docs/symm.md): put from 1 MiB, barrier, all-reduce by size.
TARGETS = {
    "put_gbps_from_1m": 370.0,
    "barrier_kernel_us": 2.0,
    "barrier_stream_us": 4.0,
    "all_reduce_us": {8 << 10: 6.0, 512 << 10: 9.0, 4 << 20: 25.0},
    # Multi-CTA all-reduce at large sizes: at least this share of NCCL's bus
    # bandwidth in the same run (the same formula on both sides, so the
    # ratio of times), from this size up.
    "all_reduce_large_from": 64 << 20,
    "all_reduce_large_vs_nccl": 0.9,
}


PUT_BLOCKS = (1, 8, 16, 32)
ALL_REDUCE_BLOCKS = (8, 32, 64)
# AllReduceAlgo's values (include/ferry/device/coll_algo.cuh) and their names in the records;
# the low-latency ones only where they fit (low_latency_fits).
ALL_REDUCE_ALGOS = ((0, "auto"), (1, "ll"), (4, "ll2shot"), (2, "1shot"), (3, "2shot"), (5, "2shot-blocks"))
LOW_LATENCY_BLOCK_LINES = 2048  # kLowLatencyBlockLines
LOW_LATENCY_MAX_RANKS = 8


def low_latency_fits(algo: int, nbytes: int, world: int, blocks: int) -> bool:
    """Whether a low-latency algorithm (1: one-shot, 4: two-shot) runs as asked, as choose_all_reduce decides:
    its lines per block fit a block's region of a receive slot (4 data bytes a line)."""
    units = (nbytes + 3) // 4
    if world > LOW_LATENCY_MAX_RANKS:
        return False
    if algo == 1:
        return -(-units // blocks) <= LOW_LATENCY_BLOCK_LINES
    part = -(-units // world)
    return world >= 2 and -(-part // blocks) <= LOW_LATENCY_BLOCK_LINES // 2


# How long streams sleep before "-ahead" timings start: longer than the host takes to queue a launch's calls.
AHEAD_US = 5000.0
# In-kernel rows: launches of `iters` and of SLOPE * iters operations; per operation is the slope (_Ranks.per_op).
SLOPE = 5


def slope(short_us: Sequence[float], long_us: Sequence[float], iters: int) -> tuple:
    """(us per operation, us a launch costs once) from launches of `iters`
    operations (short_us) and of SLOPE * iters (long_us): the medians'
    difference over the difference in count, and what the short launches
    took beyond their operations."""
    t1, t2 = statistics.median(short_us), statistics.median(long_us)
    per = (t2 - t1) / ((SLOPE - 1) * iters)
    return per, t1 - iters * per


def record(op, impl, world, nbytes, time_us, scope, gpu, date, graph=False, once_us=None) -> dict:
    """once_us: for rows timed by their slope (_Ranks.per_op), what a launch cost once beyond its operations."""
    gbps = nbytes / (time_us * 1e-6) / 1e9 if time_us > 0 and nbytes else 0.0
    r = {
        "op": op,
        "impl": impl,
        "world": world,
        "bytes": nbytes,
        "time_us": round(time_us, 3),
        "gbps": round(gbps, 2),
        "scope": scope,
        "graph": graph,
        "gpu": gpu,
        "date": date,
    }
    if once_us is not None:
        r["once_us"] = round(once_us, 3)
    return r


def format_table(records: Sequence[dict]) -> str:
    """One row per (op, bytes), one column per impl: time in us (and GB/s for puts)."""
    impls: List[str] = []
    rows: Dict[tuple, Dict[str, dict]] = {}
    for r in records:
        if r["impl"] not in impls:
            impls.append(r["impl"])
        rows.setdefault((r["op"], r["bytes"]), {})[r["impl"]] = r
    out = ["| op | bytes | " + " | ".join(impls) + " |", "|---|---|" + "---|" * len(impls)]
    for (op, nbytes), by in rows.items():
        cells = []
        for impl in impls:
            r = by.get(impl)
            if r is None:
                cells.append("")
            elif op in ("put", "get"):
                cells.append(f"{r['time_us']:.1f} us, {r['gbps']:.0f} GB/s")
            else:
                cells.append(f"{r['time_us']:.2f} us")
        out.append(f"| {op} | {format_size(nbytes) if nbytes else '-'} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _by_name(impl: str) -> bool:
    """An all-reduce row of an algorithm asked by name whose contract is each
    block's share of dst (the low-latency ones and the per-block two-shot)."""
    return any(f"-{name}-" in impl for name in ("ll", "ll2shot", "2shot-blocks"))


def target_lines(records: Sequence[dict]) -> List[str]:
    """The issue's targets against this run (met or missed, with the numbers)."""
    lines = []
    puts = [
        r
        for r in records
        if r["op"] == "put" and r["impl"].startswith("ferry-device") and r["bytes"] >= 1 << 20
    ]
    if puts:
        worst = min(max(r["gbps"] for r in puts if r["bytes"] == b) for b in {r["bytes"] for r in puts})
        ok = worst >= TARGETS["put_gbps_from_1m"]
        lines.append(
            f"put to one peer from 1 MiB >= {TARGETS['put_gbps_from_1m']:.0f} GB/s: "
            f"{'met' if ok else 'missed'} (slowest size {worst:.0f} GB/s)"
        )
    for impl, key, what in (
        ("ferry-device", "barrier_kernel_us", "in a kernel"),
        ("ferry-stream", "barrier_stream_us", "on a stream"),
        ("ferry-stream-ahead", "barrier_stream_us", "on a stream, queued ahead"),
        ("ferry-stream-kernel", "barrier_stream_us", "on a stream, kernel form"),
        ("ferry-stream-kernel-ahead", "barrier_stream_us", "on a stream, kernel form queued ahead"),
    ):
        got = [r["time_us"] for r in records if r["op"] == "barrier" and r["impl"] == impl]
        if got:
            ok = min(got) <= TARGETS[key]
            lines.append(
                f"barrier {what} <= {TARGETS[key]:.0f} us: {'met' if ok else 'missed'} ({min(got):.2f} us)"
            )
    for op, ours, theirs, what in (
        ("signal_half_rtt", "ferry-device", "nvshmem-device", "signal half round trip"),
        ("barrier", "ferry-device", "nvshmem-device", "barrier in a kernel"),
        ("barrier", "ferry-stream", "nvshmem-stream", "barrier on a stream"),
        ("barrier", "ferry-stream-kernel", "nvshmem-stream", "barrier on a stream, kernel form"),
    ):
        a = [
            r["time_us"] for r in records if r["op"] == op and (r["impl"] == ours or r["impl"] == ours + "-p")
        ]
        b = [r["time_us"] for r in records if r["op"] == op and r["impl"] == theirs]
        if a and b:
            ok = min(a) <= min(b)
            lines.append(
                f"{what} no slower than NVSHMEM: {'met' if ok else 'missed'} "
                f"({min(a):.2f} us against {min(b):.2f} us)"
            )
    for nbytes, limit in TARGETS["all_reduce_us"].items():
        got = [
            r
            for r in records
            if r["op"] == "all_reduce" and r["bytes"] == nbytes and r["impl"].startswith("ferry-device")
        ]
        if got:
            best = min(got, key=lambda r: r["time_us"])
            # Named: an algorithm asked by name leaves only each block's share of dst done on return.
            ok = best["time_us"] <= limit
            lines.append(
                f"all-reduce {format_size(nbytes)} <= {limit:.0f} us: {'met' if ok else 'missed'} "
                f"({best['time_us']:.1f} us, {best['impl']}"
                + (", asked by name: each block's share of dst" if _by_name(best["impl"]) else "")
                + ")"
            )
    large = []  # (size, NCCL's time / ferry's best: the bus bandwidth ratio)
    for nbytes in sorted({r["bytes"] for r in records if r["op"] == "all_reduce"}):
        if nbytes < TARGETS["all_reduce_large_from"]:
            continue
        ours = [
            r["time_us"]
            for r in records
            if r["op"] == "all_reduce" and r["bytes"] == nbytes and r["impl"].startswith("ferry-device")
        ]
        nccl = [
            r["time_us"]
            for r in records
            if r["op"] == "all_reduce" and r["bytes"] == nbytes and r["impl"] in ("nccl", "nccl-graph")
        ]
        if ours and nccl:
            large.append((nbytes, min(nccl) / min(ours)))
    if large:
        size, worst = min(large, key=lambda x: x[1])
        share = TARGETS["all_reduce_large_vs_nccl"]
        lines.append(
            f"all-reduce from {format_size(TARGETS['all_reduce_large_from'])} >= {share:.1f}x NCCL's bus bandwidth: "
            f"{'met' if worst >= share else 'missed'} (worst {format_size(size)}: {worst:.2f}x)"
        )
    return lines


# ---------------------------------------------------------------- GPU side


# The launchers' C signatures (symm_kernels.cu's extern "C" functions, each
# returning a cudaError_t): p a pointer or handle, i an int, u a uint64.
KERNEL_ARGS = {
    "bench_put": "pppuiiip",
    "bench_put_bulk": "pppuiiip",
    "bench_put_wide": "pppuiiiiip",
    "bench_get_wide": "pppuiiiiip",
    "bench_get": "pppuiiip",
    "bench_scoped": "pppuiiiiip",
    "bench_put_latency": "pppuiiip",
    "bench_g_latency": "ppiipp",
    "bench_pingpong": "ppuipp",
    "bench_pingpong_p": "ppuipp",
    "bench_pingpong_p_relaxed_poll": "ppuipp",
    "bench_barrier": "pipp",
    "bench_barrier_relaxed_poll": "pipp",
    "bench_barrier_reference_acquire_poll": "pipp",
    "bench_all_reduce": "pppuiiipp",
    "bench_grid_barrier": "piipp",
    "bench_stream_barrier_plain": "ppp",
    "bench_two_shot_data": "pppuiiip",
    "bench_all_reduce_threads": "pppuiiiipp",
}


def _load(path: str):
    import ferry.symm

    lib = (
        ctypes.CDLL(path)
        if path
        else ferry.symm.load_kernels("ferry_symm_bench", [os.path.join(HERE, "symm_kernels.cu")])
    )
    types = {"p": ctypes.c_void_p, "i": ctypes.c_int, "u": ctypes.c_uint64}
    for name, sig in KERNEL_ARGS.items():
        getattr(lib, name).argtypes = [types[c] for c in sig]
        getattr(lib, name).restype = ctypes.c_int
    return lib


class _Ranks:
    """This process's ranks (every rank with init_local, one with torchrun) and how to time them together."""

    def __init__(self, torch, comm, heap):
        self.torch, self.comm, self.heap = torch, comm, heap
        self.local = comm._local
        self.devs = [torch.device("cuda", d) for d in comm.devices]
        self.ranks = list(range(comm.world)) if self.local else [comm.rank]
        self.streams = [torch.cuda.Stream(device=d) for d in self.devs]
        self.handles = [heap.handle(i).as_bytes() for i in range(len(self.ranks))]

    def each(self, v):
        return v if self.local else [v]

    def barrier(self):
        for i, s in enumerate(self.streams):
            s.wait_stream(self.torch.cuda.current_stream(self.devs[i]))
        self.heap.barrier_on_stream(self.streams if self.local else self.streams[0])
        for s in self.streams:
            s.synchronize()
        self.heap.check()

    def _once(self, launch, ahead_us: float) -> float:
        """Rank 0's (or this process's first rank's) event time in us of
        `launch(i, stream)` run on every local rank at once, after a barrier."""
        torch = self.torch
        self.barrier()
        ev = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in self.ranks
        ]
        if ahead_us > 0:
            for i in range(len(self.ranks)):
                with torch.cuda.stream(self.streams[i]):
                    torch.cuda._sleep(int(ahead_us * 2000))  # cycles at up to 2 GHz
        for i in range(len(self.ranks)):
            ev[i][0].record(self.streams[i])
            launch(i, self.streams[i])
            ev[i][1].record(self.streams[i])
        for s in self.streams:
            s.synchronize()
        return ev[0][0].elapsed_time(ev[0][1]) * 1000.0

    def timed(self, launch, reps: int, ahead_us: float = 0.0) -> float:
        """Median over `reps` (after a warm-up) of _once(launch).
        ahead_us > 0: each stream first sleeps that long (one SM spinning), so the
        host has queued everything before the first start event: GPU time alone."""
        times = [self._once(launch, ahead_us) for _ in range(reps + 1)]  # the first is the warm-up
        self.heap.check()
        return statistics.median(times[1:])

    def per_op(self, launch, iters: int, reps: int) -> tuple:
        """(us per operation, us a launch costs once) of `launch(i, stream, n)`,
        a kernel repeating an operation n times: launches of `iters` and of
        SLOPE * iters operations alternate `reps` times (after a warm-up of
        each), and the difference of their medians over the difference in
        count is the time per operation. What a launch costs once drops out of
        it: the host's launch onto an idle stream (from Python, more than
        NVSHMEM's C++ pays), the ranks' skew at their first meeting, the
        kernel's start and its final quiet."""
        short, long_ = [], []
        for k in range(reps + 1):
            a = self._once(lambda i, s: launch(i, s, iters), 0.0)
            b = self._once(lambda i, s: launch(i, s, SLOPE * iters), 0.0)
            if k:  # the first pair is the warm-up
                short.append(a)
                long_.append(b)
        self.heap.check()
        return slope(short, long_, iters)


def _put_launch(kernel, R, dst, src, nbytes, W, blocks):
    """launch(i, stream, iters): `kernel` (bench_put or bench_put_bulk) putting
    `nbytes` from local rank i's src into the next rank's dst; with bench_get,
    getting the next rank's src into local rank i's dst."""

    def launch(i, s, iters):
        _ok(
            kernel(
                R.handles[i],
                dst[i].data_ptr(),
                src[i].data_ptr(),
                nbytes,
                (R.ranks[i] + 1) % W,
                iters,
                blocks,
                s.cuda_stream,
            )
        )

    return launch


def _bulk_put(R, lib, dst, src, put_source, nbytes, W, iters, reps, gpu, date, records) -> List[str]:
    """The experiment of symm_kernels.cu's put_bulk_kernel: timed as the device
    put is, then once more into a poisoned dst and every byte checked on the
    receiving rank against the sender's bytes."""
    return _timed_and_checked(
        R, lib.bench_put_bulk, dst, src, put_source, "put", "experiment-tma", lambda r: (r - 1) % W,
        nbytes, W, iters, reps, gpu, date, records,
    )  # fmt: skip


# --put-experiments: (blocks, threads, 16-byte words in flight per thread); the benchmark's device put runs 512
# threads, and the API keeps 8 words in flight; the 4-word shapes are the comparison.
PUT_SHAPES = tuple(
    (b, t, w) for b in (8, 16, 32) for t, w in ((512, 4), (512, 8), (1024, 4), (1024, 8), (256, 16))
)


# --put-experiments for gets: loads wait for a round trip over NVLink, so more words in flight may pay there.
GET_SHAPES = tuple((b, t, w) for b in (8, 16, 32) for t, w in ((512, 4), (512, 8), (512, 16), (1024, 8)))


def _wide(
    R, kernel, op, shapes, dst, src, put_source, source_rank, nbytes, W, iters, reps, gpu, date, records
):
    """symm_kernels.cu's put_wide_kernel or get_wide_kernel (`kernel`) in
    each of `shapes`, timed as the device put is, then once more into a
    poisoned dst, every byte checked against put_source(source_rank(rank))."""
    wrong = []
    for blocks, threads, words in shapes:

        def launch(i, s, m, blocks=blocks, threads=threads, words=words):
            peer = (R.ranks[i] + 1) % W
            _ok(
                kernel(
                    R.handles[i], dst[i].data_ptr(), src[i].data_ptr(), nbytes, peer, m, blocks, threads, words,
                    s.cuda_stream,
                )
            )  # fmt: skip

        t, once = R.per_op(launch, iters, reps)
        impl = f"experiment-wide-{blocks}b-{threads}t-{words}w"
        records.append(record(op, impl, W, nbytes, t, "block", gpu, date, once_us=once))
        wrong += _checked_once(R, launch, dst, nbytes, source_rank, put_source, f"{impl} {op} {nbytes}")
    return wrong


def _timed_and_checked(
    R, kernel, dst, src, put_source, op, name, source_rank, nbytes, W, iters, reps, gpu, date, records
) -> List[str]:
    """`kernel` with each of PUT_BLOCKS blocks, timed as the put is (records
    `op`, impl `name-<blocks>b`), then once more into a poisoned dst, every
    byte checked against put_source(source_rank(rank)) (_checked_once)."""
    wrong = []
    for blocks in PUT_BLOCKS:
        launch = _put_launch(kernel, R, dst, src, nbytes, W, blocks)
        t, once = R.per_op(launch, iters, reps)
        impl = f"{name}-{blocks}b"
        records.append(record(op, impl, W, nbytes, t, "block", gpu, date, once_us=once))
        wrong += _checked_once(R, launch, dst, nbytes, source_rank, put_source, f"{impl} {op} {nbytes}")
    return wrong


def _checked_once(R, launch, dst, nbytes, source_rank, put_source, what) -> List[str]:
    """`launch` once more into a poisoned dst on every local rank; every byte
    checked against put_source(source_rank(rank))."""
    for i in range(len(R.ranks)):
        dst[i][:nbytes].fill_(0xA5)
    R.barrier()
    for i in range(len(R.ranks)):
        launch(i, R.streams[i], 1)
    R.barrier()
    wrong = []
    for i in range(len(R.ranks)):
        expected = put_source(source_rank(R.ranks[i]), R.devs[i])[:nbytes]
        bad = int((dst[i][:nbytes] != expected).sum().item())
        if bad:
            wrong.append(f"rank {R.ranks[i]} {what}: {bad} bytes wrong")
    return wrong


def _gets(R, lib, heap, src, put_source, W, iters, reps, gpu, date, records, opts, progress) -> List[str]:
    """Get from the next rank by size: the device API's block get with each
    of PUT_BLOCKS blocks and the heap's copy-engine get, timed as the put is;
    then each size once more into a poisoned dst, every byte checked against
    the next rank's bytes."""
    torch = R.torch
    gsrc = R.each(heap.empty((opts["max_bytes"],), torch.uint8))
    for i in range(len(R.ranks)):
        gsrc[i].copy_(src[i])
    gdst = [torch.empty(opts["max_bytes"], dtype=torch.uint8, device=d) for d in R.devs]
    R.barrier()
    wrong = []
    for nbytes in size_range(opts["min_bytes"], opts["max_bytes"], 4):
        wrong += _timed_and_checked(
            R, lib.bench_get, gdst, gsrc, put_source, "get", "ferry-device", lambda r: (r + 1) % W,
            nbytes, W, iters, reps, gpu, date, records,
        )  # fmt: skip
        t = R.timed(
            lambda i, s: [
                heap.get(gdst[i][:nbytes], gsrc[i][:nbytes], (R.ranks[i] + 1) % W, stream=s)
                for _ in range(iters)
            ],
            reps,
        )
        records.append(record("get", "ferry-copy-engine", W, nbytes, t / iters, "stream", gpu, date))
        progress(
            f"get {format_size(nbytes)}: "
            + ", ".join(f"{r['impl']} {r['gbps']:.0f} GB/s" for r in records[-1 - len(PUT_BLOCKS) :])
        )
        if opts.get("put_experiments"):
            wrong += _wide(
                R, lib.bench_get_wide, "get", GET_SHAPES, gdst, gsrc, put_source, lambda r: (r + 1) % W,
                nbytes, W, iters, reps, gpu, date, records,
            )  # fmt: skip
            best = max(records[-len(GET_SHAPES) :], key=lambda r: r["gbps"])
            progress(
                f"get {format_size(nbytes)}, wider pipelines: best {best['impl']} {best['gbps']:.0f} GB/s"
            )
    return wrong


SCOPE_BLOCKS = 8
LATENCY_BYTES = (8, 4096)
LATENCY_LINES = 4096  # g_latency_kernel's kLatencyLines: the words g reads, a 128-byte line apart


def _scopes(
    R, lib, heap, dst, src, put_source, W, iters, reps, gpu, date, records, opts, progress
) -> List[str]:
    """Put into and get from the next rank at thread and warp scope (8 blocks
    of 512 threads, each thread or warp its own slice), by size, timed as the
    block put is, each checked once into a poisoned dst; then a put's latency
    at every scope and g's."""
    torch = R.torch
    gsrc = R.each(heap.empty((opts["max_bytes"],), torch.uint8))
    for i in range(len(R.ranks)):
        gsrc[i].copy_(src[i])
    gdst = [torch.empty(opts["max_bytes"], dtype=torch.uint8, device=d) for d in R.devs]
    R.barrier()
    wrong = []
    for nbytes in size_range(opts["min_bytes"], opts["max_bytes"], 4):
        for op, get, to, frm, source_rank in (
            ("put", 0, dst, src, lambda r: (r - 1) % W),
            ("get", 1, gdst, gsrc, lambda r: (r + 1) % W),
        ):
            for scope_id, scope in ((0, "thread"), (1, "warp")):

                def launch(i, s, m, get=get, to=to, frm=frm, scope_id=scope_id, nbytes=nbytes):
                    peer = (R.ranks[i] + 1) % W
                    _ok(
                        lib.bench_scoped(
                            R.handles[i], to[i].data_ptr(), frm[i].data_ptr(), nbytes, peer, m, SCOPE_BLOCKS,
                            scope_id, get, s.cuda_stream,
                        )
                    )  # fmt: skip

                t, once = R.per_op(launch, iters, reps)
                impl = f"ferry-device-{SCOPE_BLOCKS}b-{scope}"
                records.append(record(op, impl, W, nbytes, t, scope, gpu, date, once_us=once))
                wrong += _checked_once(
                    R, launch, to, nbytes, source_rank, put_source, f"{impl} {op} {nbytes}"
                )
        progress(
            f"put/get {format_size(nbytes)} by thread and warp: "
            + ", ".join(f"{r['op']} {r['scope']} {r['gbps']:.0f} GB/s" for r in records[-4:])
        )
    for nbytes in LATENCY_BYTES:
        for scope_id, scope in ((0, "thread"), (1, "warp"), (2, "block")):
            t, once = R.per_op(
                lambda i, s, m, scope_id=scope_id, nbytes=nbytes: _ok(
                    lib.bench_put_latency(
                        R.handles[i], dst[i].data_ptr(), src[i].data_ptr(), nbytes, (R.ranks[i] + 1) % W, m,
                        scope_id, s.cuda_stream,
                    )
                ),
                iters,
                reps,
            )  # fmt: skip
            records.append(
                record("put_latency", f"ferry-device-{scope}", W, nbytes, t, scope, gpu, date, once_us=once)
            )
    zeros = R.each(heap.zeros((LATENCY_LINES * 16,), torch.int64))
    outs = [torch.full((1,), -1, dtype=torch.int64, device=d) for d in R.devs]
    R.barrier()
    t, once = R.per_op(
        lambda i, s, m: _ok(
            lib.bench_g_latency(
                R.handles[i], zeros[i].data_ptr(), (R.ranks[i] + 1) % W, m, outs[i].data_ptr(), s.cuda_stream
            )
        ),
        iters,
        reps,
    )
    records.append(record("g_latency", "ferry-device", W, 8, t, "thread", gpu, date, once_us=once))
    R.barrier()
    wrong += [
        f"rank {R.ranks[i]} g returned {int(o.item())}, expected 0" for i, o in enumerate(outs) if o.item()
    ]
    got = {(r["op"], r["bytes"], r["scope"]): r["time_us"] for r in records if r["op"] == "put_latency"}
    progress(
        "put latency 8 B: "
        + ", ".join(f"{sc} {got['put_latency', 8, sc]:.2f} us" for sc in ("thread", "warp", "block"))
        + f"; g latency {records[-1]['time_us']:.2f} us"
    )
    return wrong


TWO_SHOT_THREADS = (128, 256, 512)


def _two_shot_phases(
    R, lib, oks, a_dst, a_src, expected, sizes, W, iters, reps, gpu, date, wrong
) -> List[dict]:
    """The experiment of --two-shot-phases: the grid-wide barrier a two-shot
    all-reduce runs twice; its data phase with no barrier around it (timing
    only: without the barriers its result is not an all-reduce); and the whole
    two-shot with 128, 256 and 512 threads per block (checked against
    `expected`; mismatches go into `wrong`): with 512 threads and 64 blocks
    each thread takes one pair of vectors at 4 MB, so its loads and its
    stores never overlap."""
    out = []
    for blocks in ALL_REDUCE_BLOCKS:
        t, once = R.per_op(
            lambda i, s, m, blocks=blocks: _ok(
                lib.bench_grid_barrier(R.handles[i], m, blocks, oks[i].data_ptr(), s.cuda_stream)
            ),
            iters,
            reps,
        )
        out.append(
            record(
                "all_reduce_phase",
                f"experiment-grid-barrier-{blocks}b",
                W,
                0,
                t,
                "grid",
                gpu,
                date,
                once_us=once,
            )
        )
        for nbytes in sizes:
            if nbytes < 256 << 10:
                continue
            count = nbytes // 2
            for threads in TWO_SHOT_THREADS:

                def timed(kernel, *tail, blocks=blocks, count=count, threads=threads):
                    """kernel(handle, dst, src, count, n, blocks, threads, *tail, stream) on every rank,
                    per operation (_Ranks.per_op); each of `tail` gives an argument by local rank."""
                    return R.per_op(
                        lambda i, s, m: _ok(
                            kernel(
                                R.handles[i],
                                a_dst[i].data_ptr(),
                                a_src[i].data_ptr(),
                                count,
                                m,
                                blocks,
                                threads,
                                *[arg(i) for arg in tail],
                                s.cuda_stream,
                            )
                        ),
                        iters,
                        reps,
                    )[0]

                t = timed(lib.bench_two_shot_data)
                out.append(
                    record(
                        "all_reduce_phase",
                        f"experiment-two-shot-data-{blocks}b-{threads}t",
                        W,
                        nbytes,
                        t,
                        "grid",
                        gpu,
                        date,
                    )
                )
                two_shot = 3  # AllReduceAlgo::kTwoShot
                t = timed(lib.bench_all_reduce_threads, lambda i: two_shot, lambda i: oks[i].data_ptr())
                impl = f"experiment-2shot-{blocks}b-{threads}t"
                out.append(record("all_reduce", impl, W, nbytes, t, "grid", gpu, date))
                for i in range(len(R.ranks)):
                    bad = int((a_dst[i][:count] != expected[i][:count]).sum().item())
                    if bad:
                        wrong.append(f"rank {R.ranks[i]} {impl} {nbytes}: {bad} wrong")
                    a_dst[i].fill_(float("nan"))
    return out


def _ok(lib_call):
    err = lib_call
    if err:
        raise RuntimeError(f"benchmark kernel launch failed: CUDA error {err}")


def run(opts: dict, progress=print) -> dict:
    import torch

    if int(os.environ.get("RANK", "0")) != 0:
        progress = lambda *_: None  # one table, from rank 0

    import ferry
    import ferry.symm

    torchrun = "RANK" in os.environ
    if torchrun:
        import torch.distributed as dist

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
        comm = ferry.Communicator.from_torch()
    else:
        comm = ferry.init_local()
    devices = comm.devices if comm._local else None
    if devices is not None and len(set(devices)) < len(devices):
        raise SystemExit("ferry.bench.symm: ranks share a GPU; that measures nothing about speed")
    W = comm.world
    if W < 2:
        raise SystemExit("ferry.bench.symm: needs at least 2 GPUs")
    gpu = torch.cuda.get_device_name(comm.device)
    date = datetime.date.today().isoformat()
    lib = _load(opts["library"])
    # Address space for the put/get buffers and the all-reduce's two (physical memory is mapped as they are made).
    ar_bytes = 2 * max(opts["all_reduce_sizes"])
    heap = ferry.symm.Heap(comm, capacity=max(opts["max_bytes"] * 4 + ar_bytes + (64 << 20), 1 << 30))
    R = _Ranks(torch, comm, heap)
    reps, iters, records = opts["reps"], opts["iters"], []
    n = len(R.ranks)

    # Put bandwidth to the next rank.
    dst = R.each(heap.empty((opts["max_bytes"],), torch.uint8))

    def put_source(rank, dev):  # the same bytes wherever they are made, so the receiver can check them
        g = torch.Generator(device=dev)
        g.manual_seed(500 + rank)
        return torch.randint(0, 256, (opts["max_bytes"],), dtype=torch.uint8, device=dev, generator=g)

    src = [put_source(R.ranks[i], d) for i, d in enumerate(R.devs)]
    put_wrong: List[str] = []
    for nbytes in size_range(opts["min_bytes"], opts["max_bytes"], 4):
        for blocks in PUT_BLOCKS:
            launch = _put_launch(lib.bench_put, R, dst, src, nbytes, W, blocks)
            t, once = R.per_op(launch, iters, reps)
            records.append(
                record("put", f"ferry-device-{blocks}b", W, nbytes, t, "block", gpu, date, once_us=once)
            )
        for ahead, impl in ((0.0, "ferry-copy-engine"), (AHEAD_US, "ferry-copy-engine-ahead")):
            t = R.timed(
                lambda i, s: [
                    heap.put(dst[i][:nbytes], src[i][:nbytes], (R.ranks[i] + 1) % W, stream=s)
                    for _ in range(iters)
                ],
                reps,
                ahead_us=ahead,
            )
            records.append(record("put", impl, W, nbytes, t / iters, "stream", gpu, date))
        progress(
            f"put {format_size(nbytes)}: "
            + ", ".join(f"{r['impl']} {r['gbps']:.0f} GB/s" for r in records[-2 - len(PUT_BLOCKS) :])
        )
        if opts.get("put_experiments"):
            put_wrong += _wide(
                R, lib.bench_put_wide, "put", PUT_SHAPES, dst, src, put_source, lambda r: (r - 1) % W,
                nbytes, W, iters, reps, gpu, date, records,
            )  # fmt: skip
            best = max(records[-len(PUT_SHAPES) :], key=lambda r: r["gbps"])
            progress(
                f"put {format_size(nbytes)}, wider pipelines: best {best['impl']} {best['gbps']:.0f} GB/s"
            )
        if opts.get("bulk_put"):
            put_wrong += _bulk_put(R, lib, dst, src, put_source, nbytes, W, iters, reps, gpu, date, records)
            progress(
                f"put {format_size(nbytes)}, TMA bulk copies: "
                + ", ".join(f"{r['impl']} {r['gbps']:.0f} GB/s" for r in records[-len(PUT_BLOCKS) :])
            )

    # Get bandwidth from the next rank: loads over NVLink, and the copy engine.
    put_wrong += _gets(R, lib, heap, src, put_source, W, iters, reps, gpu, date, records, opts, progress)
    put_wrong += _scopes(
        R, lib, heap, dst, src, put_source, W, iters, reps, gpu, date, records, opts, progress
    )

    # Signal half round trip between ranks 0 and 1; barriers.
    oks = [torch.ones(1, dtype=torch.int32, device=d) for d in R.devs]
    # signal_op (a release) and p (no release, as NVSHMEM's signal_op), each on a word of its own.
    # "-relaxed-poll": a reference wait (relaxed looks, then one acquire read), for the A/B.
    for kernel, impl in (
        (lib.bench_pingpong, "ferry-device"),
        (lib.bench_pingpong_p, "ferry-device-p"),
        (lib.bench_pingpong_p_relaxed_poll, "ferry-device-p-relaxed-poll"),
    ):
        sig = R.each(heap.zeros((1,), torch.int64))
        done = [0] * n

        def pingpong(i, s, m, kernel=kernel, sig=sig, done=done):
            base = done[i]  # every launch of a rank goes on counting where the last stopped
            done[i] += m
            if R.ranks[i] < 2:
                _ok(kernel(R.handles[i], sig[i].data_ptr(), base, m, oks[i].data_ptr(), s.cuda_stream))

        t, once = R.per_op(pingpong, iters, reps)
        records.append(record("signal_half_rtt", impl, W, 8, t / 2, "thread", gpu, date, once_us=once))
    # "-reference": a plain one-block barrier (bench code) polling as the API did before, and with acquire loads.
    for kernel, impl in (
        (lib.bench_barrier, "ferry-device"),
        (lib.bench_barrier_relaxed_poll, "ferry-device-reference-relaxed-poll"),
        (lib.bench_barrier_reference_acquire_poll, "ferry-device-reference-acquire-poll"),
    ):
        t, once = R.per_op(
            lambda i, s, m, kernel=kernel: _ok(kernel(R.handles[i], m, oks[i].data_ptr(), s.cuda_stream)),
            iters,
            reps,
        )
        records.append(record("barrier", impl, W, 0, t, "block", gpu, date, once_us=once))
    for kernel, ahead, impl in (
        (False, 0.0, "ferry-stream"),
        (False, AHEAD_US, "ferry-stream-ahead"),
        (True, 0.0, "ferry-stream-kernel"),
        (True, AHEAD_US, "ferry-stream-kernel-ahead"),
    ):
        t = R.timed(
            lambda i, s: (
                [heap.barrier_on_stream(R.streams if R.local else s, kernel=kernel) for _ in range(iters)]
                if i == 0 or not R.local
                else None
            ),
            reps,
            ahead_us=ahead,
        )
        records.append(record("barrier", impl, W, 0, t / iters, "stream", gpu, date))
    # "-reference-plain-launch": the kernel form's barrier launched without PDL (bench code), for the A/B.
    for ahead, impl in ((0.0, "ferry-stream-kernel-reference-plain-launch"),
                        (AHEAD_US, "ferry-stream-kernel-ahead-reference-plain-launch")):  # fmt: skip
        t = R.timed(
            lambda i, s: [
                _ok(lib.bench_stream_barrier_plain(R.handles[i], oks[i].data_ptr(), s.cuda_stream))
                for _ in range(iters)
            ],
            reps,
            ahead_us=ahead,
        )
        records.append(record("barrier", impl, W, 0, t / iters, "stream", gpu, date))
    got = {(r["op"], r["impl"]): r["time_us"] for r in records}
    progress(
        f"signal half round trip {got['signal_half_rtt', 'ferry-device']:.2f} us (p: "
        f"{got['signal_half_rtt', 'ferry-device-p']:.2f}, polled as before: "
        f"{got['signal_half_rtt', 'ferry-device-p-relaxed-poll']:.2f}), barrier in a kernel "
        f"{got['barrier', 'ferry-device']:.2f} us (polled as before: {got['barrier', 'ferry-device-reference-relaxed-poll']:.2f}, "
        f"that with acquire polls: {got['barrier', 'ferry-device-reference-acquire-poll']:.2f}), "
        f"on a stream {got['barrier', 'ferry-stream']:.2f} us ({got['barrier', 'ferry-stream-ahead']:.2f} us queued "
        f"ahead; kernel form {got['barrier', 'ferry-stream-kernel']:.2f}, {got['barrier', 'ferry-stream-kernel-ahead']:.2f}; "
        f"launched plainly {got['barrier', 'ferry-stream-kernel-reference-plain-launch']:.2f}, "
        f"{got['barrier', 'ferry-stream-kernel-ahead-reference-plain-launch']:.2f})"
    )

    # bf16 all-reduce by size.
    ar_max = max(opts["all_reduce_sizes"])
    a_src = R.each(heap.empty((ar_max // 2,), torch.bfloat16))
    a_dst = R.each(heap.empty((ar_max // 2,), torch.bfloat16))

    def ar_input(rank, dev):
        g = torch.Generator(device=dev)
        g.manual_seed(1000 + rank)
        return torch.randint(-4, 5, (ar_max // 2,), device=dev, generator=g).to(torch.bfloat16)

    for i in range(n):
        a_src[i].copy_(ar_input(R.ranks[i], R.devs[i]))
    # Every rank's expected sum, made here from the same seeds (exact in bf16).
    ar_expected = [sum(ar_input(r, d).double() for r in range(W)).to(torch.bfloat16) for d in R.devs]
    wrong: List[str] = list(put_wrong)
    for nbytes in opts["all_reduce_sizes"]:
        count = nbytes // 2
        for algo, name in ALL_REDUCE_ALGOS:
            for blocks in opts["all_reduce_blocks"]:
                if algo in (1, 4) and not low_latency_fits(algo, nbytes, W, blocks):
                    continue
                t, once = R.per_op(
                    lambda i, s, m: _ok(
                        lib.bench_all_reduce(
                            R.handles[i],
                            a_dst[i].data_ptr(),
                            a_src[i].data_ptr(),
                            count,
                            m,
                            blocks,
                            algo,
                            oks[i].data_ptr(),
                            s.cuda_stream,
                        )
                    ),
                    iters,
                    reps,
                )
                records.append(
                    record(
                        "all_reduce",
                        f"ferry-device-{name}-{blocks}b",
                        W,
                        nbytes,
                        t,
                        "grid",
                        gpu,
                        date,
                        once_us=once,
                    )
                )
                for i in range(n):
                    bad_elems = int((a_dst[i][:count] != ar_expected[i][:count]).sum().item())
                    if bad_elems:
                        wrong.append(f"rank {R.ranks[i]} {records[-1]['impl']} {nbytes}: {bad_elems} wrong")
                    a_dst[i].fill_(float("nan"))
        if torchrun:
            records += _field_all_reduce(torch, nbytes, W, reps, iters, gpu, date)
        progress(
            f"all_reduce {format_size(nbytes)}: "
            + ", ".join(
                f"{r['impl']} {r['time_us']:.1f} us"
                for r in records
                if r["op"] == "all_reduce" and r["bytes"] == nbytes
            )
        )
    if opts.get("two_shot_phases"):
        records += _two_shot_phases(
            R, lib, oks, a_dst, a_src, ar_expected, opts["all_reduce_sizes"], W, iters, reps, gpu, date, wrong
        )
        progress(
            "two-shot phases: "
            + ", ".join(
                f"{r['impl']} {format_size(r['bytes']) if r['bytes'] else ''} {r['time_us']:.1f} us"
                for r in records
                if r["op"] == "all_reduce_phase" or r["impl"].startswith("experiment-2shot")
            )
        )
    bad = [i for i in range(n) if int(oks[i].item()) != 1]
    major, minor = torch.cuda.get_device_capability(R.devs[0])
    heap.close()
    comm.close()
    checks: List[str] = []
    if opts.get("nvshmem", True) and int(os.environ.get("RANK", "0")) == 0:
        try:
            got, checks = nvshmem.measure(
                W,
                opts["min_bytes"],
                opts["max_bytes"],
                iters,
                reps,
                opts["all_reduce_sizes"],
                arch=f"{major}{minor}",
            )
            # A measurement whose result was wrong measured nothing: it is left out, its check line says so.
            records += [
                record(g["op"], g["impl"], W, g["bytes"], g["time_us"], g["scope"], gpu, date)
                for g in nvshmem.checked(got, checks)
            ]
            progress("NVSHMEM: " + "; ".join(checks))
        except nvshmem.Unavailable as exc:
            progress(f"ferry.bench.symm: NVSHMEM not measured: {exc}")
    return {
        "records": records,
        "gpu": gpu,
        "world": W,
        "date": date,
        "failed_ranks": bad,
        "wrong_results": wrong,
        "nvshmem_checks": checks,
    }


def _field_all_reduce(torch, nbytes, world, reps, iters, gpu, date) -> List[dict]:
    """NCCL (torch.distributed) and PyTorch SymmetricMemory's one-shot and
    two-shot all-reduce, same sizes: each per host call (its launch in the
    number), and each captured `iters` times into one CUDA graph ("-graph":
    replays of one graph and of SLOPE graphs alternate, the slope per call),
    which leaves the host's launches out as ferry's in-kernel rows do."""
    import torch.distributed as dist

    out, count = [], nbytes // 2
    dev = torch.device("cuda", torch.cuda.current_device())
    t = torch.randint(-4, 5, (count,), device=dev).to(torch.bfloat16)

    def events():
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(fn) -> float:
        times = []
        for _ in range(reps + 1):
            dist.barrier()
            a, b = events()
            a.record()
            for _ in range(iters):
                fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000.0 / iters)
        return statistics.median(times[1:])

    def graph_timed(fn) -> float:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                fn()

        def replays(k) -> float:
            dist.barrier()
            torch.cuda.synchronize()
            a, b = events()
            a.record()
            for _ in range(k):
                g.replay()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) * 1000.0

        short, long_ = [], []
        for k in range(reps + 1):
            one, many = replays(1), replays(SLOPE)
            if k:
                short.append(one)
                long_.append(many)
        return (statistics.median(long_) - statistics.median(short)) / ((SLOPE - 1) * iters)

    def both(impl, fn, scope):
        out.append(record("all_reduce", impl, world, nbytes, timed(fn), scope, gpu, date))
        try:
            out.append(
                record("all_reduce", impl + "-graph", world, nbytes, graph_timed(fn), scope, gpu, date, True)
            )
        except Exception as exc:  # noqa: BLE001 - a capture this torch refuses: say so, measure the rest
            print(f"ferry.bench.symm: {impl} in a CUDA graph not measured: {exc}", file=sys.stderr)

    both("nccl", lambda: dist.all_reduce(t), "stream")
    try:
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.group.WORLD.group_name
        buf = symm_mem.empty(count, device=dev, dtype=torch.bfloat16)
        symm_mem.rendezvous(buf, group)
        buf.copy_(t)
        both(
            "torch-symm-one-shot", lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group), "kernel"
        )
        both(
            "torch-symm-two-shot",
            lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group),
            "kernel",
        )
    except Exception as exc:  # noqa: BLE001 - an older or newer torch: say so, measure the rest
        print(f"ferry.bench.symm: PyTorch SymmetricMemory not measured: {exc}", file=sys.stderr)
    return out


def _grid_sizes(text: str) -> List[int]:
    """--all-reduce-blocks: grid sizes from 1 to 64 (kMaxGridBlocks)."""
    try:
        sizes = [int(b) for b in text.split(",") if b]
    except ValueError:
        raise SystemExit(f"--all-reduce-blocks {text!r}: expected comma-separated integers") from None
    bad = [b for b in sizes if not 1 <= b <= 64]
    if not sizes or bad:
        raise SystemExit(
            f"--all-reduce-blocks {text!r}: each grid from 1 to 64 blocks (the device API's most)"
        )
    return sizes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results", help="folder for the JSON and the table")
    p.add_argument(
        "--put-min",
        default="4K",
        help="smallest put (not --min: torchrun takes that for its own --max-restarts and the like)",
    )
    p.add_argument("--put-max", default="256M", help="largest put")
    p.add_argument("--all-reduce-sizes", default="8K,64K,256K,512K,4M")
    p.add_argument(
        "--all-reduce-blocks",
        default=",".join(str(b) for b in ALL_REDUCE_BLOCKS),
        help="grid sizes of the device all-reduces, each timed",
    )
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--iters", type=int, default=20, help="operations per timed launch")
    p.add_argument("--library", default="", help="a build of symm_kernels.cu (default: build it now)")
    p.add_argument("--no-nvshmem", action="store_true", help="measure ferry and the field without NVSHMEM")
    p.add_argument(
        "--two-shot-phases",
        action="store_true",
        help="also time the two-shot all-reduce's grid barrier and its data phase apart (an experiment)",
    )
    p.add_argument(
        "--bulk-put",
        action="store_true",
        help="also time an experimental put by TMA bulk copies (symm_kernels.cu), every byte checked",
    )
    p.add_argument(
        "--put-experiments",
        action="store_true",
        help="also time puts and gets with more words in flight per thread and other block shapes "
        "(symm_kernels.cu), every byte checked",
    )
    p.add_argument("--tag", default="")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    opts = {
        "min_bytes": parse_size(args.put_min),
        "max_bytes": parse_size(args.put_max),
        "reps": args.reps,
        "iters": args.iters,
        "library": args.library,
        "nvshmem": not args.no_nvshmem,
        "bulk_put": args.bulk_put,
        "put_experiments": args.put_experiments,
        "two_shot_phases": args.two_shot_phases,
        "all_reduce_sizes": [parse_size(s) for s in args.all_reduce_sizes.split(",")],
        "all_reduce_blocks": _grid_sizes(args.all_reduce_blocks),
    }
    result = run(opts)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    records = result["records"]
    table = format_table(records)
    lines = target_lines(records)
    print(table)
    print("\n".join(lines))
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(
        args.out,
        f"{result['date']}-{result['gpu'].replace(' ', '-')}-x{result['world']}-symm"
        + (f"-{args.tag}" if args.tag else ""),
    )
    launcher = f"torchrun --nproc-per-node {result['world']} " if "RANK" in os.environ else "python "
    command = launcher + "-m ferry.bench.symm " + " ".join(argv if argv is not None else sys.argv[1:])
    with open(stem + ".json", "w") as f:
        json.dump({"command": command, **result}, f, indent=1)
    with open(stem + ".txt", "w") as f:
        f.write(command + "\n\n" + table + "\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {stem}.json, {stem}.txt")
    for w in result["wrong_results"]:
        print(f"WRONG {w}")
    for c in nvshmem.failed_checks(result["nvshmem_checks"]):
        print(f"NVSHMEM result wrong, left out of the table: {c}")
    return 1 if result["failed_ranks"] or result["wrong_results"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""Paged KV transfers between pinned host memory and one GPU: every ferry mode
and the field's approaches, side by side in one process.

    python -m ferry.bench.kv [--pages 4K,16K,64K,256K,1M,4M] [--counts 64,256,1024,4096,16384]
        [--ops fetch,save,both] [--max-bytes 1G] [--reps 5] [--warmup 1] [--gemm] [--gemm-reps 5] [--urgent] [--urgent-pages 16K,64K]
        [--tensors 1] [--layout stacked|page-first] [--out DIR] [--tag TAG] [--no-plot]

Each point copies `count` scattered pages of `page` bytes (a random sample of
twice as many pages on each side, so that no runs merge): fetch (host -> GPU),
save (GPU -> host), or both at once on two streams (bytes of both counted).

--tensors N (N > 1): each page has N tensors of `page` bytes (a model's K and
V of every layer), passed as lists of N tensors sharing the page mapping;
bytes of every tensor counted. The GPU side is one [N, pages, page] tensor;
the host side the same (--layout stacked) or one [pages, N, page] tensor
(--layout page-first: a page's tensors end to end). ferry's copy-engine modes
then take a page's tensors as one pitched copy (docs/kv.md, "Pitched
copies"); vllm-batched and per-page copy every tensor's page by itself.
ahead-batched holds one pitched copy per page behind its gate, at most
FERRY_KV_ARMED_MAX (512) of them: at points with more pages it is refused
(printed) and has no record.

Submitted inline: CUDA events around the submission on an idle stream, so the
time includes the host's submission (what a serving engine pays when it
issues the copy on the critical path); host_us is the wall time of the call.
Submitted ahead: a prepared transfer armed beforehand, timed from the stream
trigger to the end of its copies; for kernels, the kernel launched with its
index lists already on the GPU. Every impl is checked once per point on a
poisoned destination: every byte up to 64 MiB, a random sample of 256 pages
above. Warm-up --warmup calls, then the median of --reps; no graphs. Impls
alternate within each round (each round in an order of its own, seeded), so
that the host's drift over a point falls on every impl alike.

Impls: ferry's modes (per-page, batched, streams, kernel, auto, auto-zero-sm,
ahead-batched) and the field's, re-implemented: vllm-batched (one batched call,
one copy per page, source order Any for fetches), sglang-kernel (2 CTAs x 1024
threads, a warp per page), vllm-kernel (12 blocks), kernel-gpu-ids (ferry's
kernel with index lists on the GPU, submitted ahead); asked by name only:
kernel-32b, kernel-64b, kernel-132b (ferry's kernel on that many blocks).

--gemm: a bf16 8192^3 GEMM loop (one CUDA graph) alone and beside continuous
fetches of 1024 x 64 KB pages fed by a thread of their own (zero_sm; the same
64 MB as one plain copy; ferry's kernel; the 2-CTA kernel), each side's pair
(alone, beside) within each of --gemm-reps rounds, in an order of the round's
own, median slowdown.
--urgent: the latency of a small fetch issued while a 1 GiB bulk fetch runs:
behind it on the same stream, on another stream, and with urgent=True, the
bulk submitted at once and in 4 MiB slices (slice_bytes); its page sizes from
--urgent-pages (default 16K,64K,256K: below and above the size from which
host-to-GPU copies queue behind each other); and the bulk's GB/s both ways.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import os
import random
import statistics
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

from .report import _pyplot, format_size, parse_size, save_figure

OPS = ("fetch", "save", "both")
INLINE = {
    "per-page": dict(mode="per_page"),
    "batched": dict(mode="batched"),
    "streams": dict(mode="streams"),
    "kernel": dict(mode="kernel"),
    "auto": dict(mode="auto"),
    "auto-zero-sm": dict(mode="auto", zero_sm=True),
    # One cudaMemcpyBatchAsync call for the whole transfer, whatever its copies (_batched_once).
    "vllm-batched": dict(mode="batched", merge=False, pitched=False, settled_fetch=True),
    "sglang-kernel": dict(mode="kernel", kernel_blocks=2, kernel_threads=1024, kernel_chunk=1 << 62),
    "vllm-kernel": dict(mode="kernel", kernel_blocks=12, kernel_threads=512),
    # ferry's kernel on more SMs than its default 16: how many host reads in flight the link needs.
    "kernel-32b": dict(mode="kernel", kernel_blocks=32),
    "kernel-64b": dict(mode="kernel", kernel_blocks=64),
    "kernel-132b": dict(mode="kernel", kernel_blocks=132),
}
AHEAD = ("ahead-batched", "kernel-gpu-ids")
# Every impl, in table order; by default all but the kernel's grid-size
# experiment (--impls names them), which no target compares against.
ALL_IMPLS = tuple(INLINE) + AHEAD
IMPLS = tuple(k for k in ALL_IMPLS if not k.startswith("kernel-"))
# The modes `ferry kv-tune` measures, by the name the auto table gives them.
TUNED = {"per-page": "per_page", "batched": "batched", "streams": "streams", "kernel": "kernel"}
DEFAULT_PAGES = "4K,16K,64K,256K,1M,4M"
DEFAULT_SLICE = 4 << 20  # FERRY_KV_SLICE_BYTES's default
DEFAULT_URGENT_PAGES = "16K,64K,256K"
DEFAULT_COUNTS = "64,256,1024,4096,16384"
LAYOUTS = ("stacked", "page-first")
ZERO_SM = ("per-page", "batched", "streams", "auto-zero-sm", "vllm-batched", "ahead-batched")
CHECK_ALL_BELOW = 64 << 20


def points(pages: Sequence[int], counts: Sequence[int], max_bytes: int, tensors: int = 1) -> List[tuple]:
    """(page_bytes, count) pairs within the byte budget (every tensor's pages), small first."""
    return [(p, c) for p in sorted(pages) for c in sorted(counts) if p * c * tensors <= max_bytes]


def record(
    op, impl, page_bytes, pages, time_us, host_us, sms, submitted, gpu, date, wrong=0, tensors=1, layout=None
) -> dict:
    nbytes = page_bytes * pages * tensors * (2 if op == "both" else 1)
    return {
        "op": f"kv_{op}",
        "impl": impl,
        "page_bytes": page_bytes,
        "pages": pages,
        "time_us": round(time_us, 2),
        "gbps": round(nbytes / (time_us * 1e-6) / 1e9, 2) if time_us > 0 else 0.0,
        "host_us": round(host_us, 2) if host_us is not None else None,
        "sms": sms,
        "submitted": submitted,
        "gpu": gpu,
        "date": date,
        "wrong": wrong,
        "tensors": tensors,
        "layout": layout if tensors > 1 else "one",
    }


def best_by_point(records: Sequence[dict], impls: Optional[Sequence[str]] = None) -> Dict[tuple, dict]:
    out: Dict[tuple, dict] = {}
    for r in records:
        if impls is not None and r["impl"] not in impls:
            continue
        k = (r["op"], r["page_bytes"], r["pages"])
        if k not in out or r["time_us"] < out[k]["time_us"]:
            out[k] = r
    return out


def format_table(records: Sequence[dict]) -> str:
    """GB/s per point and impl, with the best marked."""
    impls = [i for i in ALL_IMPLS if any(r["impl"] == i for r in records)]
    by = {(r["op"], r["page_bytes"], r["pages"], r["impl"]): r for r in records}
    keys = sorted({(r["op"], r["page_bytes"], r["pages"]) for r in records})
    head = f"{'op':<8} {'page':>6} {'pages':>6} " + " ".join(f"{i[:14]:>14}" for i in impls)
    lines = ["GB/s (time us); * best of the point", head]
    best = best_by_point(records)
    for k in keys:
        cells = []
        for i in impls:
            r = by.get(k + (i,))
            if not r:
                cells.append(f"{'-':>14}")
                continue
            mark = "*" if best[k]["impl"] == i else " "
            bad = "!" if r["wrong"] else ""
            cells.append(f"{r['gbps']:>5.1f}({r['time_us']:>6.0f}){mark}{bad}".rjust(14))
        lines.append(f"{k[0][3:]:<8} {format_size(k[1]):>6} {k[2]:>6} " + " ".join(cells))
    return "\n".join(lines)


def target_lines(records: Sequence[dict]) -> List[str]:
    """The issue's targets, point by point: ratios measured in this run."""
    by = {(r["op"], r["page_bytes"], r["pages"], r["impl"]): r for r in records}
    keys = sorted({(r["op"], r["page_bytes"], r["pages"]) for r in records})
    out = []
    inline = [i for i in INLINE if i not in ("auto", "auto-zero-sm") and not i.startswith("kernel-")]
    best_inline = best_by_point(records, inline)
    auto_gap, zs_vs_page, ahead_vs_kernel, ahead_gbps = [], [], [], []
    for k in keys:
        a, b = by.get(k + ("auto",)), best_inline.get(k)
        if a and b:
            auto_gap.append((a["time_us"] / b["time_us"], k))
        z, p = by.get(k + ("auto-zero-sm",)), by.get(k + ("per-page",))
        if z and p and k[1] <= 64 << 10:
            zs_vs_page.append((p["time_us"] / z["time_us"], k))
        h, kk = by.get(k + ("ahead-batched",)), by.get(k + ("kernel",))
        if h and kk:
            ahead_vs_kernel.append((h["time_us"] / kk["time_us"], k))
        if h:
            ahead_gbps.append((h["gbps"], k))
    fmt = lambda k: f"{k[0][3:]} {format_size(k[1])}x{k[2]}"  # noqa: E731
    if auto_gap:
        worst = max(auto_gap)
        within = sum(1 for g, _ in auto_gap if g <= 1.10)
        out.append(
            f"auto / best inline: within 10% at {within} of {len(auto_gap)} points; worst {worst[0]:.2f} ({fmt(worst[1])})"
        )
    if zs_vs_page:
        worst = min(zs_vs_page)
        out.append(
            f"per-page / auto-zero-sm up to 64 KB: lowest {worst[0]:.2f}x ({fmt(worst[1])}); target >= 3"
        )
    if ahead_vs_kernel:
        worst = max(ahead_vs_kernel)
        n_ok = sum(1 for g, _ in ahead_vs_kernel if g <= 1.0)
        out.append(
            f"ahead-batched / kernel time: <= 1 at {n_ok} of {len(ahead_vs_kernel)} points; worst {worst[0]:.2f} ({fmt(worst[1])})"
        )
    for op in ("kv_fetch", "kv_save", "kv_both"):
        big = [g for g, k in ahead_gbps if k[0] == op and k[1] >= 64 << 10]
        mid = [g for g, k in ahead_gbps if k[0] == op and 16 << 10 <= k[1] <= 32 << 10]
        if big:
            out.append(f"{op} ahead-batched from 64 KB pages: {min(big):.1f}-{max(big):.1f} GB/s")
        if mid:
            out.append(f"{op} ahead-batched 16-32 KB pages: {min(mid):.1f}-{max(mid):.1f} GB/s")
    return out


# The streams strategy submits from several host threads (FERRY_KV_STREAMS);
# the table takes it only where it is this much faster than the next mode. Measured
# on an idle host it was within noise of batched from 32 KB pages, and beside
# a model launching its kernels eagerly it lost (one H200, Llama-3.1-8B
# prefilling while 16K-token prefixes were fetched: 9.4 tokens/s against
# batched's 12.9).
STREAMS_MARGIN = 1.10


def _fastest(at: Sequence[dict]) -> dict:
    best = min(at, key=lambda r: r["time_us"])
    if best["impl"] == "streams":
        others = [r for r in at if r["impl"] != "streams"]
        runner_up = min(others, key=lambda r: r["time_us"]) if others else None
        if runner_up and runner_up["time_us"] <= best["time_us"] * STREAMS_MARGIN:
            return runner_up
    return best


def median_over_passes(records: Sequence[dict]) -> List[dict]:
    """One record per (op, page size, page count, impl): the pass's record
    with the median time (the lower middle one of an even count) among the
    passes that measured it (`ferry kv-tune --passes`). On one H200 a mode
    moved 13 GB/s in one run and 25 in the next, 11 s later: a single run's
    fastest mode is partly the host's moment."""
    by: Dict[tuple, List[dict]] = {}
    for r in records:
        by.setdefault((r["op"], r["page_bytes"], r["pages"], r["impl"]), []).append(r)
    return [sorted(rs, key=lambda r: r["time_us"])[(len(rs) - 1) // 2] for rs in by.values()]


def tune_rules(records: Sequence[dict]) -> List[dict]:
    """The auto table from inline measurements: per direction, page size and
    page count, the fastest mode and the fastest that launches no kernel
    (streams only where it beats the next mode by STREAMS_MARGIN), by each
    mode's median time over the passes that measured it. Bounds sit at the
    geometric mean between measured sizes."""
    modes = TUNED
    rules = []
    good = median_over_passes([r for r in records if r["impl"] in modes and not r["wrong"]])
    for op, direction in (("kv_fetch", "h2d"), ("kv_save", "d2h")):
        rs = [r for r in good if r["op"] == op]
        pages = sorted({r["page_bytes"] for r in rs})
        for pi, p in enumerate(pages):
            counts = sorted({r["pages"] for r in rs if r["page_bytes"] == p})
            p_bound = None if pi == len(pages) - 1 else int((p * pages[pi + 1]) ** 0.5)
            for ci, c in enumerate(counts):
                at = [r for r in rs if r["page_bytes"] == p and r["pages"] == c]
                best = _fastest(at)
                no_kernel = [r for r in at if r["impl"] != "kernel"]
                best_zs = _fastest(no_kernel) if no_kernel else best
                c_bound = None if ci == len(counts) - 1 else int((c * counts[ci + 1]) ** 0.5)
                rules.append(
                    {
                        "direction": direction,
                        "max_copy_bytes": p_bound,
                        "max_copies": c_bound,
                        "strategy": modes[best["impl"]],
                        "zero_sm": modes[best_zs["impl"]] if best_zs["impl"] != "kernel" else "batched",
                    }
                )
    return rules


# ---------------------------------------------------------------- GPU side


class Buffers:
    """One pinned host pool and one GPU buffer, split in halves A and B (both
    directions at once use one each), viewed as pages per point."""

    def __init__(self, torch, kv, half_bytes: int):
        self.torch, self.half = torch, half_bytes
        self.pool = kv.HostPool(2 * half_bytes)
        self.host = self.pool.tensor((2 * half_bytes,), torch.uint8)
        self.gpu = torch.empty(2 * half_bytes, dtype=torch.uint8, device="cuda")
        chunk = 256 << 20
        for off in range(0, 2 * half_bytes, chunk):
            n = min(chunk, 2 * half_bytes - off)
            r = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
            self.gpu[off : off + n].copy_(r)
            self.host[off : off + n].copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()

    def pages(self, half: int, page_bytes: int, n: int):
        off = half * self.half
        h = self.host[off : off + n * page_bytes].view(n, page_bytes)
        g = self.gpu[off : off + n * page_bytes].view(n, page_bytes)
        return h, g

    def sides(self, half: int, page_bytes: int, n: int, tensors: int, layout: str):
        """(host, gpu): one [n, page] tensor each, or with tensors > 1 lists of
        `tensors` of them: the GPU's views of one [tensors, n, page] tensor,
        the host's the same (stacked) or of one [n, tensors, page] tensor
        (page-first)."""
        if tensors == 1:
            return self.pages(half, page_bytes, n)
        off, size = half * self.half, tensors * n * page_bytes
        g = self.gpu[off : off + size].view(tensors, n, page_bytes)
        h = self.host[off : off + size]
        if layout == "page-first":
            h = h.view(n, tensors, page_bytes).transpose(0, 1)
        else:
            h = h.view(tensors, n, page_bytes)
        return [h[i] for i in range(tensors)], [g[i] for i in range(tensors)]


def _as_list(side) -> list:
    return side if isinstance(side, list) else [side]


def _check(torch, dst, src, dst_ids, src_ids, poison_fn, run_fn) -> int:
    """Poisons the destination pages, runs once, compares (all pages up to
    CHECK_ALL_BELOW bytes, else a sample of 256) of every tensor. Returns
    wrong pages (a page counts once per tensor that differs)."""
    dsts, srcs = _as_list(dst), _as_list(src)
    n = len(dst_ids)
    nbytes = n * dsts[0].shape[1] * len(dsts)
    idx = list(range(n)) if nbytes <= CHECK_ALL_BELOW else random.Random(n).sample(range(n), min(256, n))
    poison_fn()
    run_fn()
    torch.cuda.synchronize()
    d = torch.tensor([dst_ids[i] for i in idx])
    s = torch.tensor([src_ids[i] for i in idx])
    wrong = 0
    for dt, st in zip(dsts, srcs):
        got = dt[d.to(dt.device)] if dt.is_cuda else dt[d]
        want = st[s.to(st.device)] if st.is_cuda else st[s]
        wrong += int((got.cpu() != want.cpu()).any(dim=1).sum())
    return wrong


def _events(torch):
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def measure_point(
    torch, kv, bufs, op, page_bytes, count, impls, reps, warmup, gpu, date, tensors=1, layout="stacked"
) -> List[dict]:
    rng = random.Random(page_bytes * 7919 + count)
    space = 2 * count
    sides = []
    for half, direction in ((0, "fetch"), (1, "save")):
        if op != "both" and op != direction:
            continue
        h, g = bufs.sides(half, page_bytes, space, tensors, layout)
        dst_ids = rng.sample(range(space), count)
        src_ids = rng.sample(range(space), count)
        dst, src = (g, h) if direction == "fetch" else (h, g)
        sides.append((direction, dst, src, dst_ids, src_ids))
    main = torch.cuda.Stream()
    other = torch.cuda.Stream()
    point = dict(
        op=op, page_bytes=page_bytes, count=count, reps=reps, warmup=warmup, gpu=gpu, date=date, tensors=tensors,
        layout=layout,
    )  # fmt: skip
    runs = {}

    def failed(impl, exc):  # one impl's failure must not hide the others'
        print(
            f"  {op} {format_size(page_bytes)}x{count} {impl}: {type(exc).__name__}: {exc}", file=sys.stderr
        )
        runs.pop(impl, None)

    for impl in impls:
        try:
            runs[impl] = _ImplRun(torch, kv, impl, sides, (main, other), point)
        except Exception as exc:
            failed(impl, exc)
    # Impls alternate: each round runs every impl once, in an order of its
    # own (seeded), so that the host's drift over a point (another process,
    # clocks, the allocator) and what one impl leaves for the next fall on
    # every impl alike rather than on whichever ran last.
    shuffle = random.Random(rng.random())
    for rnd in range(warmup + reps):
        for impl in shuffle.sample(list(runs), len(runs)):
            try:
                runs[impl].once(keep=rnd >= warmup)
            except Exception as exc:
                failed(impl, exc)
    out = []
    for impl in list(runs):
        try:
            out.append(runs[impl].record())
        except Exception as exc:
            failed(impl, exc)
    return out


class _ImplRun:
    """One impl at one point (measure_point's `point`: op, page_bytes, count,
    reps, warmup, gpu, date, tensors, layout): once() times a call, record()
    checks the bytes and gives the record."""

    def __init__(self, torch, kv, impl, sides, streams, point: dict):
        self.torch, self.kv, self.impl, self.sides, self.streams, self.point = (
            torch,
            kv,
            impl,
            sides,
            streams,
            point,
        )
        self.submitted = "ahead" if impl in AHEAD else "inline"
        self.sms = 0
        self.samples = []
        self.prepared = None
        if impl == "ahead-batched":
            self.prepared = [kv.prepare(dst, src, d, s) for (_, dst, src, d, s) in sides]
        self.dev_ids = None
        if impl == "kernel-gpu-ids":
            self.dev_ids = [
                (torch.tensor(d, device="cuda"), torch.tensor(s, device="cuda"))
                for (_, dst, src, d, s) in sides
            ]

    def submit(self):
        """Enqueues the transfer(s) on main (and other for 'both'); returns host seconds."""
        kv, streams = self.kv, self.streams
        t0 = time.perf_counter()
        for k, (direction, dst, src, d, s) in enumerate(self.sides):
            st = streams[k]
            if self.prepared is not None:
                self.prepared[k].trigger_on(st)
                self.prepared[k].wait(st)
            elif self.dev_ids is not None:
                rep = kv.copy_blocks(
                    dst, src, self.dev_ids[k][0], self.dev_ids[k][1], stream=st, mode="kernel"
                )
                self.sms = max(self.sms, rep["sms"])
            elif self.impl == "vllm-batched":
                # `kv` may bring its own (the CPU tests' stand-in does); ferry.kv does not.
                once = getattr(kv, "batched_once", None) or (
                    lambda *a, **k: _batched_once(self.torch, *a, **k)
                )
                once(dst, src, d, s, st, any_order=direction == "fetch")
            else:
                kw = dict(INLINE[self.impl])
                settled = kw.pop("settled_fetch", False) and direction == "fetch"
                rep = kv.copy_blocks(dst, src, d, s, stream=st, settled_source=settled, **kw)
                self.sms = max(self.sms, rep["sms"])
        return time.perf_counter() - t0

    def arm(self):
        # Settle everything first: a device-wide synchronize after arming would
        # wait for the armed stream itself, which waits for its trigger.
        self.torch.cuda.synchronize()
        if self.prepared is not None:
            for k, p in enumerate(self.prepared):
                p.arm(self.streams[k])

    def once(self, keep=True):
        main, other = self.streams
        self.arm()
        start, end = _events(self.torch)
        start.record(main)
        other.wait_event(start)
        host_s = self.submit()
        if len(self.sides) > 1:
            main.wait_stream(other)
        end.record(main)
        end.synchronize()
        if keep:
            self.samples.append((start.elapsed_time(end) * 1000.0, host_s * 1e6))

    def record(self):
        torch = self.torch
        wrong = 0
        for k, (direction, dst, src, d, s) in enumerate(self.sides):

            def poison(dst=dst, d=d):
                for t in _as_list(dst):
                    t[torch.tensor(d, device=t.device)] = 0xA5

            def run():
                self.arm()
                self.submit()

            wrong += _check(torch, dst, src, d, s, poison, run)
        time_us = statistics.median(x[0] for x in self.samples)
        host_us = statistics.median(x[1] for x in self.samples) if self.submitted == "inline" else None
        pt = self.point
        return record(
            pt["op"], self.impl, pt["page_bytes"], pt["count"], time_us, host_us, self.sms, self.submitted,
            pt["gpu"], pt["date"], wrong, pt["tensors"], pt["layout"],
        )  # fmt: skip


def _batched_once(torch, dst, src, dst_ids, src_ids, stream, any_order: bool) -> None:
    """vLLM's submission re-implemented: one copy per page and tensor, their
    addresses computed with tensor arithmetic, all in one cudaMemcpyBatchAsync
    call however many there are (ferry splits its batched calls at
    FERRY_BATCH_MAX copies); the sources read in any order for fetches."""
    from ferry._native import hooks

    d = torch.as_tensor(dst_ids, dtype=torch.int64)
    s = torch.as_tensor(src_ids, dtype=torch.int64)
    dsts, srcs, sizes = [], [], []
    for a, b in zip(_as_list(dst), _as_list(src)):
        page = a[0].numel() * a.element_size()
        dsts.append(a.data_ptr() + d * (a.stride(0) * a.element_size()))
        srcs.append(b.data_ptr() + s * (b.stride(0) * b.element_size()))
        sizes.append(torch.full_like(d, page))
    dsts, srcs, sizes = torch.cat(dsts), torch.cat(srcs), torch.cat(sizes)
    hooks().memcpy_batch_once(
        dsts.data_ptr(), srcs.data_ptr(), sizes.data_ptr(), dsts.numel(), any_order, stream.cuda_stream
    )


class Feeder:
    """Calls `fn` over and over from a thread of its own, its work on
    `stream`, at most two calls in flight: from entering (once the first call
    is queued) until leaving, which waits for the calls in flight. An error in
    the thread is raised on leaving; a thread that does not stop within
    `timeout_s` is a TimeoutError. What a GEMM is timed beside."""

    def __init__(self, torch, fn, stream, timeout_s: float = 60.0):
        self.torch, self.fn, self.stream, self.timeout_s = torch, fn, stream, timeout_s
        self.stop, self.started, self.errors = threading.Event(), threading.Event(), []
        self.thread = threading.Thread(target=self._feed, daemon=True)

    def _feed(self):
        torch = self.torch
        try:
            with torch.cuda.stream(self.stream):
                ring = []
                while not self.stop.is_set():
                    self.fn()
                    e = torch.cuda.Event()
                    e.record(self.stream)
                    ring.append(e)
                    self.started.set()
                    if len(ring) > 2:
                        ring.pop(0).synchronize()
                for e in ring:
                    e.synchronize()
        except BaseException as exc:
            self.errors.append(exc)
            self.started.set()

    def __enter__(self):
        self.thread.start()
        if not self.started.wait(self.timeout_s):
            self.stop.set()  # its first call, when it returns, is its last
            raise TimeoutError(f"the feeding thread queued nothing within {self.timeout_s} s")
        return self

    def __exit__(self, kind, value, tb):
        self.stop.set()
        self.thread.join(self.timeout_s)
        if self.thread.is_alive():
            raise TimeoutError(f"the feeding thread did not stop within {self.timeout_s} s")
        if self.errors and kind is None:
            raise self.errors[0]
        return False


GEMM_SIDES = ("auto-zero-sm", "plain-copy", "kernel", "sglang-kernel")


def measure_gemm(torch, kv, bufs, reps: int, gpu: str, date: str, gemms: int = 30) -> List[dict]:
    """GEMM slowdown beside continuous fetches of 1024 x 64 KB pages.

    The GEMMs (bf16 8192^3) are one CUDA graph, so that no host thread can
    gap them; the fetches run from a thread of their own, two calls in
    flight, from before the first GEMM until the last ends. Each round runs
    every side's pair (alone, then beside), the sides in an order of the
    round's own, so that the GPU's drift in power and temperature falls on
    every side alike. plain-copy moves the same 64 MB as one copy: what the
    link's bytes cost a GEMM with the least submission there is."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    gs, xs = torch.cuda.Stream(), torch.cuda.Stream()
    h, g = bufs.pages(0, 64 << 10, 2048)
    rng = random.Random(5)
    d, s = rng.sample(range(2048), 1024), rng.sample(range(2048), 1024)
    flat_h, flat_g = h.view(-1)[: 64 << 20], g.view(-1)[64 << 20 : 128 << 20]
    sides = {
        "auto-zero-sm": lambda: kv.copy_blocks(g, h, d, s, stream=xs, mode="auto", zero_sm=True),
        "plain-copy": lambda: flat_g.copy_(flat_h, non_blocking=True),
        "kernel": lambda: kv.copy_blocks(g, h, d, s, stream=xs, mode="kernel"),
        "sglang-kernel": lambda: kv.copy_blocks(
            g, h, d, s, stream=xs, mode="kernel", kernel_blocks=2, kernel_threads=1024, kernel_chunk=1 << 62
        ),
    }
    with torch.cuda.stream(gs):
        torch.matmul(a, b, out=c)  # cuBLAS warmed up before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=gs):
        for _ in range(gemms):
            torch.matmul(a, b, out=c)

    def gemm_ms(side):
        torch.cuda.synchronize()
        with Feeder(torch, sides[side], xs) if side else contextlib.nullcontext():
            start, end = _events(torch)
            with torch.cuda.stream(gs):
                # The stream sleeps (untimed) while the host goes on to the
                # replay: getting the GIL back from the feeding thread between
                # the two calls would otherwise count as GEMM time, beside only.
                torch.cuda._sleep(4_000_000)
                start.record()
                graph.replay()
                end.record()
            end.synchronize()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    order = list(GEMM_SIDES)
    slow = {side: [] for side in order}

    def beside(side, alone_ms):  # one side's failure must not lose the others'
        try:
            ms = gemm_ms(side)
            if alone_ms:
                slow[side].append(ms / alone_ms - 1)
        except Exception as exc:
            print(f"  GEMM beside {side}: {type(exc).__name__}: {exc}", file=sys.stderr)
            slow.pop(side)

    for side in order:  # warm-up: every side once, the GEMMs alone once
        beside(side, None)
    gemm_ms(None)
    shuffle = random.Random(11)
    for _ in range(reps):
        # Each round every side's pair, in an order of its own: the GPU's
        # drift in power and temperature falls on every side alike.
        for side in shuffle.sample(list(slow), len(slow)):
            beside(side, gemm_ms(None))
    return [
        {
            "op": "kv_gemm_slowdown",
            "impl": side,
            "page_bytes": 64 << 10,
            "pages": 1024,
            "gemms": gemms,
            "slowdown": round(statistics.median(slow[side]), 4),
            "samples": [round(x, 4) for x in slow[side]],
            "gpu": gpu,
            "date": date,
        }
        for side in order
        if slow.get(side)
    ]


def measure_urgent(
    torch, kv, bufs, reps: int, gpu: str, date: str, page_sizes: List[int], slice_bytes: int = DEFAULT_SLICE
) -> List[dict]:
    """Latency of a 32-page fetch (each of `page_sizes`) issued 1 ms into a
    1 GiB bulk fetch, from its submission (host clock) to its completion seen
    by the host: behind the bulk on its stream, on another stream, and with
    urgent=True; the bulk submitted all at once and in slices of
    `slice_bytes`. The page size matters: the copy engines serve host-to-GPU
    copies from 64 KiB first in, first out across streams, and smaller ones
    may skip that queue (docs/multipath.md, "Hazards"). Also the bulk's own
    GB/s alone, all at once and sliced."""
    bulk_pages = min(1024, bufs.half // (1 << 20) // 2)
    hb, gb = bufs.pages(0, 1 << 20, 2 * bulk_pages)
    bulk_ids = list(range(bulk_pages))
    small_d, small_s = list(range(0, 64, 2)), list(range(1, 64, 2))
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    bulks = {"bulk at once": 0, f"bulk in {format_size(slice_bytes)} slices": slice_bytes}
    out = []
    for bulk, sl in bulks.items():
        ts = []
        for _ in range(reps + 1):
            torch.cuda.synchronize()
            start, end = _events(torch)
            start.record(a)
            kv.copy_blocks(gb, hb, bulk_ids, bulk_ids, stream=a, mode="batched", zero_sm=True, slice_bytes=sl)
            end.record(a)
            end.synchronize()
            ts.append(start.elapsed_time(end) * 1e-3)
        gbps = bulk_pages * (1 << 20) / statistics.median(ts[1:]) / 1e9
        out.append({"op": "kv_bulk", "impl": bulk, "slice_bytes": sl, "bytes": bulk_pages << 20,
                    "gbps": round(gbps, 2), "gpu": gpu, "date": date})  # fmt: skip
    for page_bytes, (bulk, sl), impl in itertools.product(
        page_sizes, bulks.items(), ("same-stream", "other-stream", "urgent")
    ):
        hs, gsm = bufs.pages(1, page_bytes, 64)
        lat = []
        for _ in range(reps + 1):
            torch.cuda.synchronize()
            kv.copy_blocks(gb, hb, bulk_ids, bulk_ids, stream=a, mode="batched", zero_sm=True, slice_bytes=sl)
            time.sleep(0.001)
            st = a if impl == "same-stream" else b
            done = torch.cuda.Event()
            t0 = time.perf_counter()
            kv.copy_blocks(gsm, hs, small_d, small_s, stream=st, mode="batched", urgent=impl == "urgent")
            done.record(st)
            while not done.query():
                pass
            lat.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        out.append(
            {
                "op": "kv_urgent",
                "impl": impl,
                "bulk": bulk,
                "slice_bytes": sl,
                "page_bytes": page_bytes,
                "pages": 32,
                "bulk_bytes": bulk_pages << 20,
                "latency_us": round(statistics.median(lat[1:]), 1),
                "gpu": gpu,
                "date": date,
            }
        )
    return out


def pcie_peak(torch, bufs) -> dict:
    """One 1 GiB copy each way and both at once (median of 3), GB/s."""
    n = min(1 << 30, bufs.half)
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    res = {}
    for name in ("h2d", "d2h", "both"):
        ts = []
        for _ in range(3):
            torch.cuda.synchronize()
            start, end = _events(torch)
            start.record(a)
            b.wait_event(start)
            if name in ("h2d", "both"):
                with torch.cuda.stream(a):
                    bufs.gpu[:n].copy_(bufs.host[:n], non_blocking=True)
            if name in ("d2h", "both"):
                with torch.cuda.stream(b):
                    bufs.host[bufs.half : bufs.half + n].copy_(
                        bufs.gpu[bufs.half : bufs.half + n], non_blocking=True
                    )
            a.wait_stream(b)
            end.record(a)
            end.synchronize()
            ts.append(start.elapsed_time(end) / 1000.0)
        res[name] = round((2 if name == "both" else 1) * n / statistics.median(ts) / 1e9, 1)
    return res


def run(opts: dict, progress=print) -> dict:
    import torch

    import ferry.kv as kv

    gpu = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    tensors, layout = opts.get("tensors", 1), opts.get("layout", "stacked")
    pts = points(opts["pages"], opts["counts"], opts["max_bytes"], tensors)
    if not pts:
        raise SystemExit(f"--max-bytes: no point of --pages x --counts x {tensors} tensors fits")
    half = 2 * max(p * c * tensors for p, c in pts)
    if opts.get("gemm"):
        half = max(half, 128 << 20)  # the GEMM's fetches: 2048 pages of 64 KB to pick from
    bufs = Buffers(torch, kv, half)
    peak = pcie_peak(torch, bufs)
    progress(f"pcie peak (torch copies, 1 GiB): {peak}")
    records = []
    total = len(pts) * len(opts["ops"])
    done = 0
    t0 = time.time()
    for op in opts["ops"]:
        for p, c in pts:
            records += measure_point(
                torch, kv, bufs, op, p, c, opts["impls"], opts["reps"], opts["warmup"], gpu, date, tensors, layout
            )  # fmt: skip
            done += 1
            progress(f"  {done}/{total}: {op} {format_size(p)} x {c} pages, {time.time() - t0:.0f} s")
    extra = []
    if opts.get("gemm"):
        extra += measure_gemm(torch, kv, bufs, opts.get("gemm_reps", 5), gpu, date)
    if opts.get("urgent"):
        extra += measure_urgent(torch, kv, bufs, opts.get("urgent_reps", 5), gpu, date, opts["urgent_pages"])
    return {"gpu": gpu, "date": date, "pcie_peak_gbps": peak, "records": records, "extra": extra}


def plot(result: dict, path: str) -> bool:
    plt = _pyplot()
    if plt is None:
        return False
    recs = result["records"]
    ops = [o for o in ("kv_fetch", "kv_save", "kv_both") if any(r["op"] == o for r in recs)]
    counts = sorted({r["pages"] for r in recs})
    count = 1024 if 1024 in counts else counts[len(counts) // 2]
    fig, axes = plt.subplots(1, len(ops), figsize=(6 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for impl in ALL_IMPLS:
            rs = sorted(
                (r for r in recs if r["op"] == op and r["impl"] == impl and r["pages"] == count),
                key=lambda r: r["page_bytes"],
            )
            if rs:
                style = "-" if impl in ZERO_SM else "--"
                ax.plot(
                    [r["page_bytes"] for r in rs],
                    [r["gbps"] for r in rs],
                    style,
                    marker="o",
                    ms=3,
                    label=impl,
                )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("page bytes")
        ax.set_ylabel("GB/s")
        ax.set_title(f"{op[3:]}: {count} scattered pages ({result['gpu']})")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, title="solid: no SM")
    return save_figure(plt, fig, path)


def save(result: dict, out_dir: str, command: str, tag: str = "", make_plot: bool = True) -> List[str]:
    os.makedirs(out_dir, exist_ok=True)
    gpu = result["gpu"].replace(" ", "-")
    stem = os.path.join(out_dir, f"{result['date']}-{gpu}-kv" + (f"-{tag}" if tag else ""))
    result = dict(result, command=command)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".txt", "w") as f:
        f.write(command + "\n\n" + summary(result) + "\n")
    files = [stem + ".json", stem + ".txt"]
    if make_plot and plot(result, stem + ".png"):
        files.append(stem + ".png")
    return files


def summary(result: dict) -> str:
    lines = [
        f"{result['gpu']}, {result['date']}; PCIe peak (1 GiB torch copy): {result['pcie_peak_gbps']} GB/s"
    ]
    recs = result["records"]
    if recs and recs[0].get("tensors", 1) > 1:
        lines.append(
            f"{recs[0]['tensors']} tensors per page, host side {recs[0]['layout']}, GPU side stacked; "
            "'page' is one tensor's page, GB/s count every tensor"
        )
    lines.append("")
    lines.append(format_table(result["records"]))
    lines.append("")
    lines += target_lines(result["records"])
    for e in result.get("extra", []):
        if e["op"] == "kv_gemm_slowdown":
            lines.append(
                f"GEMM slowdown beside {e['impl']} fetches (1024 x 64 KB): {100 * e['slowdown']:+.1f}% "
                f"(median of {len(e['samples'])} pairs, {100 * min(e['samples']):+.1f} to {100 * max(e['samples']):+.1f})"
            )
        elif e["op"] == "kv_urgent":
            lines.append(
                f"urgent 32 x {format_size(e['page_bytes'])} fetch during a "
                f"{format_size(e['bulk_bytes'])} {e.get('bulk', 'bulk')} fetch, {e['impl']}: "
                f"{e['latency_us']:.0f} us"
            )
        elif e["op"] == "kv_bulk":
            lines.append(f"{format_size(e['bytes'])} fetch of 1 MB pages, {e['impl']}: {e['gbps']:.1f} GB/s")
    host = [r for r in result["records"] if r.get("host_us") is not None]
    if host:
        lines.append("")
        lines.append("host us per call (median), 1024 pages where measured:")
        for impl in INLINE:
            rs = [r for r in host if r["impl"] == impl and r["pages"] == 1024 and r["op"] == "kv_fetch"]
            if rs:
                lines.append(
                    f"  {impl:<14} "
                    + ", ".join(f"{format_size(r['page_bytes'])}: {r['host_us']:.0f}" for r in rs)
                )
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m ferry.bench.kv", description=__doc__.split("\n")[0])
    p.add_argument("--pages", default=DEFAULT_PAGES, help="page sizes")
    p.add_argument("--counts", default=DEFAULT_COUNTS, help="pages per transfer")
    p.add_argument("--ops", default="fetch,save,both")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--max-bytes", default="1G", help="skip points moving more than this")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--gemm", action="store_true")
    p.add_argument(
        "--gemm-reps", type=int, default=5, help="paired GEMM runs (alone, beside) per impl (--gemm)"
    )
    p.add_argument("--urgent", action="store_true")
    p.add_argument(
        "--urgent-pages", default=DEFAULT_URGENT_PAGES, help="page sizes of the urgent fetch (--urgent)"
    )
    p.add_argument("--out", default="")
    p.add_argument("--tag", default="")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--tune-out", default="", help="also write the auto table measured here (ferry kv-tune)")
    p.add_argument(
        "--tensors", type=int, default=1, help="tensors per page (a model's K and V of every layer)"
    )
    p.add_argument(
        "--layout",
        default="stacked",
        help=f"host side with --tensors > 1: {' or '.join(LAYOUTS)} (GPU: stacked)",
    )
    return p.parse_args(argv)


def make_options(
    pages: str = DEFAULT_PAGES,
    counts: str = DEFAULT_COUNTS,
    ops: str = "fetch,save,both",
    impls: str = ",".join(IMPLS),
    max_bytes: str = "1G",
    reps: int = 5,
    warmup: int = 1,
    gemm: bool = False,
    urgent: bool = False,
    urgent_pages: str = DEFAULT_URGENT_PAGES,
    gemm_reps: int = 5,
    tensors: int = 1,
    layout: str = "stacked",
) -> dict:
    """run()'s options from the command line's text forms (also what
    `ferry bench` and `ferry kv-tune` pass); unknown names exit naming the option."""
    op_list = [o for o in ops.split(",") if o]
    bad = [o for o in op_list if o not in OPS]
    if bad:
        raise SystemExit(f"--ops: unknown {bad}; expected some of {','.join(OPS)}")
    if gemm_reps < 1:
        raise SystemExit(f"--gemm-reps: {gemm_reps}; expected at least 1")
    if tensors < 1:
        raise SystemExit(f"--tensors: {tensors}; expected at least 1")
    if layout not in LAYOUTS:
        raise SystemExit(f"--layout: unknown {layout!r}; expected one of {','.join(LAYOUTS)}")
    impl_list = [i for i in impls.split(",") if i]
    bad = [i for i in impl_list if i not in ALL_IMPLS]
    if bad:
        raise SystemExit(f"--impls: unknown {bad}; expected some of {','.join(ALL_IMPLS)}")
    return dict(
        pages=[parse_size(x) for x in pages.split(",") if x],
        counts=[int(x) for x in counts.split(",") if x],
        ops=op_list,
        impls=impl_list,
        max_bytes=parse_size(max_bytes),
        reps=reps,
        warmup=warmup,
        gemm=gemm,
        urgent=urgent,
        urgent_pages=[parse_size(x) for x in urgent_pages.split(",") if x],
        gemm_reps=gemm_reps,
        tensors=tensors,
        layout=layout,
    )


def options(args) -> dict:
    return make_options(
        args.pages,
        args.counts,
        args.ops,
        args.impls,
        args.max_bytes,
        args.reps,
        args.warmup,
        args.gemm,
        args.urgent,
        args.urgent_pages,
        args.gemm_reps,
        args.tensors,
        args.layout,
    )


def write_table(result: dict, path: str, command: str) -> None:
    table = {
        "gpu": result["gpu"],
        "date": result["date"],
        "command": command,
        "rules": tune_rules(result["records"]),
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(table, f, indent=1)


def main(argv=None) -> int:
    args = parse_args(argv)
    opts = options(args)
    if args.tune_out and opts["tensors"] > 1:
        raise SystemExit(
            "--tune-out: the auto table is measured with one tensor per page (--tensors 1): it decides by rows"
        )
    command = "python -m ferry.bench.kv " + " ".join(sys.argv[1:] if argv is None else argv)
    result = run(opts, progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(summary(result))
    if args.out:
        files = save(result, args.out, command, args.tag, not args.no_plot)
        print("wrote " + ", ".join(os.path.basename(f) for f in files))
    if args.tune_out:
        write_table(result, args.tune_out, command)
        print(f"wrote {args.tune_out}; use it with FERRY_KV_TUNING={args.tune_out}")
    return 0 if all(r["wrong"] == 0 for r in result["records"]) else 1


if __name__ == "__main__":
    sys.exit(main())

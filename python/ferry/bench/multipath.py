"""Multipath host<->GPU copies against the plain copy, in one run, on one machine.

    python -m ferry.bench.multipath --out results/            # every visible GPU
    python -m ferry.bench.multipath --min 1M --max 8G --paths 1,2,4

What it measures, per direction (host to GPU 0, GPU 0 to host) and size:
- plain: one ``cudaMemcpyAsync`` (``tensor.copy_(non_blocking=True)``) over GPU 0's own link;
- ferry: ``ferry.multipath.Engine`` over the host links of GPUs 0..paths-1 (paths >= 2);
- ferry-head (--head SIZE): the same engines with ``head_bytes=SIZE`` (the caller's
  stream copies that much of the copy's head itself while the engine starts the rest);
- ferry-own-share-on, ferry-own-share-off (--own-share): the same engines with
  ``own_share_on_stream`` set either way (the caller's stream copies the target
  link's even share, or the engine schedules that link's chunks), side by side;
- ferry-loopback: the engine with relays through GPU 0 itself (one physical
  link): what chunking, staging and the stream gate cost over the plain copy;
- static-1:1, static-1:2 (--static, two GPUs or more): the field's static split
  re-implemented (part over the target's link, part relayed through GPU 1 in
  chunks, by fixed ratios);
- aggregate: every GPU copying its own buffer over its own link at once, the
  machine's host bandwidth that multipath can at best reach (same run).
--contention adds a foreign copy hogging GPU 0's link in each direction
(ferry's share of the capacity left) and an unrelated GPU 1 -> GPU 0 peer copy
beside ferry with and without own link first.
--programs N runs N processes at once, process i copying between its own
pinned memory and GPU i, each with an engine over every GPU (and, for
comparison, each with the plain copy): each one's GB/s while all of them ran,
their sum against all links at once, and how evenly they shared:
{op: "multipath_programs", impl, direction, bytes, programs, program, gbps,
series_gbps, aggregate_gbps, gpu, date}.
Time: CUDA events on the caller's stream around one copy (the engine's start
event and gate included), the median of --reps after one warm-up; graphs off.
host_us is the caller's time in the call; cpu_us the process's CPU time per
copy while the caller sleeps on a blocking event (the engine's thread
included). The largest size of every impl is
checked byte for byte. Records: {op: "multipath_h2d"|"multipath_d2h", impl,
bytes, paths, gbps, aggregate_gbps, time_us, host_us, cpu_us, gpu, date}.
--sleep-models adds sleep and wake of a model's weights (ferry.offload against
one synchronous copy per allocation): {op: "model_sleep"|"model_wake", impl,
model, bytes, paths, seconds, gbps, gpu, date}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from typing import Sequence

from .kv_e2e import MODELS as KV_MODELS
from .report import _pyplot, format_size, parse_size, save_figure, size_range

OPS = {"h2d": "multipath_h2d", "d2h": "multipath_d2h"}
LEAD_S = 0.02  # contention: the background's head start
PEER_HOLD_S = 0.1  # contention: how long the peer copies wait for the host to queue them all


def record(op, impl, nbytes, paths, time_us, aggregate_gbps, host_us, cpu_us, gpu, date) -> dict:
    gbps = nbytes / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
    return {
        "op": op,
        "impl": impl,
        "bytes": nbytes,
        "paths": paths,
        "gbps": round(gbps, 2),
        "aggregate_gbps": round(aggregate_gbps, 2),
        "time_us": round(time_us, 2),
        "host_us": round(host_us, 2),
        "cpu_us": round(cpu_us, 2),
        "gpu": gpu,
        "date": date,
    }


def impl_label(r: dict) -> str:
    return (
        f"{r['impl']} x{r['paths']}"
        if r["impl"].startswith("ferry") and r["impl"] != "ferry-loopback"
        else r["impl"]
    )


def break_even(records: Sequence[dict], op: str, impl_paths: tuple) -> int:
    """The smallest size from which the impl is at least as fast as the plain
    copy at every larger size measured (0: never)."""
    plain = {r["bytes"]: r["gbps"] for r in records if r["op"] == op and r["impl"] == "plain"}
    mine = {
        r["bytes"]: r["gbps"]
        for r in records
        if r["op"] == op and (r["impl"], r["paths"]) == impl_paths and r["bytes"] in plain
    }
    sizes = sorted(mine)
    best = 0
    for s in reversed(sizes):
        if mine[s] >= plain[s]:
            best = s
        else:
            break
    return best


def format_table(records: Sequence[dict]) -> str:
    impls = []
    for r in records:
        key = (r["impl"], r["paths"])
        if key not in impls:
            impls.append(key)
    lines = []
    for op in OPS.values():
        rows = [r for r in records if r["op"] == op]
        if not rows:
            continue
        agg = max(r["aggregate_gbps"] for r in rows)
        lines.append(f"# {op}: GB/s (aggregate of every GPU's own link at once: {agg:.1f} GB/s)")
        heads = [impl_label({"impl": i, "paths": p}) for i, p in impls]
        lines.append(f"{'size':>8}" + "".join(f"{h:>16}" for h in heads))
        for size in sorted({r["bytes"] for r in rows}):
            cells = []
            for key in impls:
                hit = [r for r in rows if r["bytes"] == size and (r["impl"], r["paths"]) == key]
                cells.append(f"{hit[0]['gbps']:>16.1f}" if hit else f"{'-':>16}")
            lines.append(f"{format_size(size):>8}" + "".join(cells))
        for key in impls:
            if key[0] == "plain":
                continue
            be = break_even(records, op, key)
            lines.append(
                f"  {impl_label({'impl': key[0], 'paths': key[1]})}: at least the plain copy's speed from "
                + (format_size(be) if be else "no measured size")
            )
        lines.append("")
    return "\n".join(lines)


def sleep_table(records: Sequence[dict]) -> str:
    """Sleep and wake per model: ferry against one copy per allocation."""
    if not records:
        return ""
    lines = ["# model sleep/wake: seconds (GB/s); ferry against one synchronous copy per allocation"]
    for model in sorted({r["model"] for r in records}):
        for op in ("model_sleep", "model_wake"):
            by = {r["impl"]: r for r in records if r["model"] == model and r["op"] == op}
            if "ferry" in by and "per-allocation" in by:
                f, b = by["ferry"], by["per-allocation"]
                lines.append(
                    f"{model:>14} {op:>12}: ferry {f['seconds']:.3f} s ({f['gbps']:.1f}), per allocation "
                    f"{b['seconds']:.3f} s ({b['gbps']:.1f}): {b['seconds'] / f['seconds']:.2f}x"
                )
    return "\n".join(lines) + "\n"


def contention_table(records: Sequence[dict]) -> str:
    """The foreign-copy and peer-copy cases, one line each."""
    lines = []
    for r in records:
        if r["op"] == "multipath_foreign":
            who = "plain copy" if r["impl"] == "plain" else f"{r['impl']} x{r['paths']}"
            way = f" ({r['direction']})" if r.get("direction") else ""
            lines.append(
                f"foreign copy on GPU 0's link{way}: {who} {r['gbps']:.1f} GB/s, foreign {r['foreign_gbps']:.1f},"
                f" {r['share_of_left']:.0%} of the capacity left on its links (target 90%), bytes by link {r.get('link_shares')}"
            )
        elif r["op"] == "p2p_beside":
            lines.append(
                f"GPU 1 -> GPU 0 peer copy: alone {r['alone_gbps']:.1f} GB/s, beside ferry ({r['impl']}) {r['gbps']:.1f}"
            )
    return ("# contention\n" + "\n".join(lines) + "\n") if lines else ""


def programs_table(records: Sequence[dict]) -> str:
    """The --programs case, one line per direction and impl."""
    lines = []
    for key in sorted({(r["direction"], r["impl"]) for r in records}):
        rows = sorted((r for r in records if (r["direction"], r["impl"]) == key), key=lambda r: r["program"])
        total = sum(r["gbps"] for r in rows)
        agg = rows[0]["aggregate_gbps"]
        lines.append(
            f"{len(rows)} programs at once ({key[0]}), {key[1]}: "
            + " + ".join(f"{r['gbps']:.1f}" for r in rows)
            + f" = {total:.1f} GB/s while all ran ({total / agg:.0%} of all links at once, {agg:.1f}); "
            f"lowest / highest {min(r['gbps'] for r in rows) / max(max(r['gbps'] for r in rows), 1e-9):.2f}"
        )
    return ("# programs\n" + "\n".join(lines) + "\n") if lines else ""


def plot(records: Sequence[dict], path: str, title: str) -> bool:
    plt = _pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, op in zip(axes, OPS.values()):
        rows = [r for r in records if r["op"] == op]
        for key in sorted({(r["impl"], r["paths"]) for r in rows}):
            pts = sorted((r["bytes"], r["gbps"]) for r in rows if (r["impl"], r["paths"]) == key)
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                label=impl_label({"impl": key[0], "paths": key[1]}),
            )
        if rows:
            ax.axhline(
                max(r["aggregate_gbps"] for r in rows), color="grey", ls="--", label="all GPUs at once"
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes")
        ax.set_ylabel("GB/s")
        ax.set_title(op)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return save_figure(plt, fig, path)


def _median_time(torch, stream, fn, reps: int):
    """(median us on the stream, median host us in the call, CPU us per call)."""
    fn()  # warm-up
    stream.synchronize()
    times, host = [], []
    cpu0 = time.process_time()
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(
            enable_timing=True, blocking=True
        )  # the caller sleeps: its CPU time is the work's
        a.record(stream)
        t = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t) * 1e6)
        b.record(stream)
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    cpu = (time.process_time() - cpu0) * 1e6 / reps
    return statistics.median(times), statistics.median(host), cpu


def _aggregates(torch, nbytes: int, direction: str, reps: int, counts) -> dict:
    """The first p GPUs' own links at once, for each p in `counts`: {p: bytes
    moved by all / time until the last landed, GB/s}."""
    n = max(counts)
    hosts = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(n)]
    devs = [torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{d}") for d in range(n)]
    streams = [torch.cuda.Stream(d) for d in range(n)]
    out = {}
    for p in counts:
        best = []
        for rep in range(reps + 1):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for d in range(p):
                with torch.cuda.stream(streams[d]):
                    if direction == "h2d":
                        devs[d].copy_(hosts[d], non_blocking=True)
                    else:
                        hosts[d].copy_(devs[d], non_blocking=True)
            for st in streams[:p]:
                st.synchronize()
            if rep:
                best.append(time.perf_counter() - t)
        out[p] = p * nbytes / statistics.median(best) / 1e9
    return out


# Shapes of public models' configs for the sleep/wake case (weights random):
# Qwen2.5-7B here, and the end-to-end KV benchmark's models.
SLEEP_MODELS = {
    "qwen2.5-7b": dict(
        family="qwen2", layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128,
        intermediate=18944, vocab=152064, tie=False,
    ),
    **KV_MODELS,
}  # fmt: skip


def sleep_wake(torch, name: str, reps: int, gpu: str, date: str, progress=print) -> tuple:
    """A transformers model from its config (random bf16 weights) put to sleep
    and woken up by ferry.offload and by one synchronous copy per allocation
    (vLLM's sleep mode), alternating, into the same pinned host memory; the
    median of `reps` each; the weights checked after every wake."""
    import ferry.offload as offload

    from .kv_e2e import build_model

    model = build_model(torch, SLEEP_MODELS[name])
    ref = [p.detach().clone().cpu() for p in list(model.parameters())[:4]]
    state = offload.Offloaded(model)  # the host pool, carved once (not timed)
    entries = state._entries
    paths = len(state._engine.links)

    def per_allocation(direction):
        for e in entries:
            if direction == "sleep":
                e.host.copy_(e.tensor.data)  # synchronous: one cudaMemcpy per allocation
                e.tensor.data = torch.empty(0, dtype=e.dtype, device=e.tensor.device)
            else:
                g = torch.empty(e.shape, dtype=e.dtype, device=f"cuda:{state.device}")
                g.copy_(e.host)
                e.tensor.data = g
        torch.cuda.synchronize()

    times = {("model_sleep", "ferry"): [], ("model_wake", "ferry"): [], ("model_sleep", "per-allocation"): [],
             ("model_wake", "per-allocation"): []}  # fmt: skip
    failures = []
    for _ in range(reps + 1):  # the first round warms up
        for impl in ("ferry", "per-allocation"):
            for op in ("model_sleep", "model_wake"):
                torch.cuda.synchronize()
                t = time.perf_counter()
                if impl == "ferry":
                    state.sleep() if op == "model_sleep" else state.wake()
                else:
                    per_allocation("sleep" if op == "model_sleep" else "wake")
                    state.asleep = op == "model_sleep"
                times[(op, impl)].append(time.perf_counter() - t)
            got = [p.detach().cpu() for p in list(model.parameters())[:4]]
            if not all(torch.equal(a, b) for a, b in zip(ref, got)):
                failures.append(f"{name} {impl}: weights differ after wake")
    out = []
    for (op, impl), ts in times.items():
        sec = statistics.median(ts[1:])
        r = {"op": op, "impl": impl, "model": name, "bytes": state.nbytes, "paths": paths if impl == "ferry" else 1,
             "seconds": round(sec, 4), "gbps": round(state.nbytes / sec / 1e9, 2), "gpu": gpu, "date": date}  # fmt: skip
        out.append(r)
        progress(
            f"{name} {op} {impl}: {sec * 1e3:.1f} ms, {r['gbps']:.1f} GB/s ({state.nbytes / 1e9:.1f} GB)"
        )
    if state.asleep:
        state.wake()
    torch.cuda.empty_cache()
    return out, failures


class Runtime:
    """The CUDA runtime torch loaded, through ctypes, for copies that must be
    exactly one cudaMemcpyAsync on the stream named (torch's copy_ between two
    GPUs adds a barrier with both GPUs' current streams)."""

    def __init__(self):
        import ctypes

        for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
            try:
                self.rt = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            self.rt.cudaMemcpyAsync.argtypes = [
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_size_t,
                ctypes.c_int,
                ctypes.c_void_p,
            ]
            self.rt.cudaMemcpyAsync.restype = ctypes.c_int
            return
        raise SystemExit("this needs the CUDA runtime library (libcudart)")

    def copy(self, dst: int, src: int, n: int, stream) -> None:
        rc = self.rt.cudaMemcpyAsync(dst, src, n, 4, stream.cuda_stream)  # 4: cudaMemcpyDefault
        if rc:
            raise RuntimeError(f"cudaMemcpyAsync returned CUDA error {rc}")

    def enable_peer_access(self, devices: Sequence[int]) -> None:
        """Every pair of `devices` peer to peer (copies between them over
        NVLink, not through host memory); the current GPU is left as it was."""
        import ctypes

        current = ctypes.c_int()
        self.rt.cudaGetDevice(ctypes.byref(current))
        for d in devices:
            self.rt.cudaSetDevice(d)
            for other in devices:
                if other != d:
                    rc = self.rt.cudaDeviceEnablePeerAccess(other, 0)
                    if rc not in (0, 704):  # 704: already enabled
                        raise SystemExit(f"cudaDeviceEnablePeerAccess({other}) on {d}: error {rc}")
        self.rt.cudaGetLastError()
        self.rt.cudaSetDevice(current.value)


class StaticSplit:
    """The field's static split, re-implemented for comparison: the copy cut by
    fixed ratios (e.g. [1, 2]: GPU 1 relays two bytes for each byte over the
    target's own link); part 0 over the target's link, part i through GPU i
    in chunks with two staging buffers (host to GPU i, then GPU i to the
    target over NVLink; GPU to host the reverse), one cudaMemcpyAsync each.
    Ordered in `stream` like a copy. Target: GPU 0."""

    def __init__(self, torch, ratio: Sequence[int], chunk: int = 8 << 20):
        self.torch, self.ratio, self.chunk = torch, list(ratio), chunk
        self.rt = Runtime()
        relays = range(1, len(self.ratio))
        self.own = torch.cuda.Stream(0)
        self.stage = {
            i: [torch.empty(chunk, dtype=torch.uint8, device=f"cuda:{i}") for _ in range(2)] for i in relays
        }
        self.pcie = {i: torch.cuda.Stream(i) for i in relays}
        self.nvlink = {i: torch.cuda.Stream(i) for i in relays}
        self.hop = {i: [torch.cuda.Event() for _ in range(2)] for i in relays}
        self.free = {i: [torch.cuda.Event() for _ in range(2)] for i in relays}

    def streams(self) -> list:
        return [self.own] + list(self.pcie.values()) + list(self.nvlink.values())

    def _copy(self, dst: int, src: int, n: int, stream) -> None:
        with self.torch.cuda.device(stream.device):
            self.rt.copy(dst, src, n, stream)

    def copy(self, dst, src, to_device: bool, stream) -> None:
        n = dst.numel()
        total = sum(self.ratio)
        cuts = [0]
        for r in self.ratio:
            cuts.append(min(n, cuts[-1] + n * r // total))
        cuts[-1] = n
        d, s0 = dst.data_ptr(), src.data_ptr()
        for s in self.streams():
            s.wait_stream(stream)
        self._copy(d + cuts[0], s0 + cuts[0], cuts[1] - cuts[0], self.own)
        for i in range(1, len(self.ratio)):
            first, second = (self.pcie[i], self.nvlink[i]) if to_device else (self.nvlink[i], self.pcie[i])
            for j, off in enumerate(range(cuts[i], cuts[i + 1], self.chunk)):
                slot, m = j % 2, min(self.chunk, cuts[i + 1] - off)
                stage = self.stage[i][slot].data_ptr()
                first.wait_event(self.free[i][slot])  # the slot's last chunk went on
                self._copy(stage, s0 + off, m, first)
                self.hop[i][slot].record(first)
                second.wait_event(self.hop[i][slot])
                self._copy(d + off, stage, m, second)
                self.free[i][slot].record(second)
        for s in self.streams():
            stream.wait_stream(s)


def contention(
    torch, engines: dict, nbytes: int, reps: int, aggregates: dict, gpu: str, date: str, progress=print
):
    """Two contention cases, `nbytes` per copy:
    - a foreign copy (plain, its own stream and buffer) hogging GPU 0's link in
      one direction while ferry copies the same way, for each direction in
      `aggregates` ({"h2d"|"d2h": {p: the first p GPUs' links at once,
      GB/s}}): its GB/s against the capacity left on the links it may use
      (those links at once, less what the foreign copy took in the same
      window; the plain copy's is GPU 0's link);
    - an unrelated GPU 1 -> GPU 0 peer copy beside ferry's host-to-GPU copies,
      with and without own link first: the peer copy's GB/s alone and beside.
    Records {op: "multipath_foreign"|"p2p_beside", impl, bytes, paths, gbps,
    direction, ...}."""
    import ferry.multipath as mp

    out = []
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    f_host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    f_dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    s, f = torch.cuda.Stream(0), torch.cuda.Stream(0)

    def timed(stream):
        e = torch.cuda.Event(enable_timing=True)
        e.record(stream)
        return e

    # The foreground starts LEAD_S after the background, so that it meets the
    # background in its steady state (not racing it for the copy engine's
    # queue). Its sleep kernel runs once here: a kernel's first launch while a
    # copy holds a stream would wait (lazy loading, docs/multipath.md).
    lead_cycles = int(LEAD_S * torch.cuda.get_device_properties(0).clock_rate * 1e3)
    with torch.cuda.stream(s):
        torch.cuda._sleep(1)
    torch.cuda.synchronize()

    def window(background_stream, background, foreground, count, bg_bytes):
        """`count` background copies of `bg_bytes` and, LEAD_S after they
        began, `reps` foreground ones: (foreground GB/s, background GB/s within
        the foreground's window, counting the background copies that completed
        in it)."""
        torch.cuda.synchronize()
        t0 = timed(background_stream)
        s.wait_event(t0)
        with torch.cuda.stream(s):
            torch.cuda._sleep(lead_cycles)
        marks = []
        for _ in range(count):
            background()
            marks.append(timed(background_stream))
        a = timed(s)
        for _ in range(reps):
            foreground()
        b = timed(s)
        torch.cuda.synchronize()
        lo, hi = t0.elapsed_time(a), t0.elapsed_time(b)
        inside = sum(1 for e in marks if lo < t0.elapsed_time(e) <= hi)
        span = max(hi - lo, 1e-6) * 1e-3
        return reps * nbytes / span / 1e9, inside * bg_bytes / span / 1e9

    for direction, by_paths in aggregates.items():
        to_gpu = direction == "h2d"

        def foreign(to_gpu=to_gpu):
            with torch.cuda.stream(f):
                f_dev.copy_(f_host, non_blocking=True) if to_gpu else f_host.copy_(f_dev, non_blocking=True)

        for key, eng in [(("plain", 1), None)] + list(engines.items()):
            before = eng.bytes_by_link() if eng else None
            dst, src = (dev, host) if to_gpu else (host, dev)

            def fg(eng=eng, dst=dst, src=src):
                if eng:
                    eng.copy(dst, src, stream=s)
                else:
                    with torch.cuda.stream(s):
                        dst.copy_(src, non_blocking=True)

            fg_gbps, bg_gbps = window(f, foreign, fg, count=4 * reps + 4, bg_bytes=nbytes)
            moved = [b - a for a, b in zip(before, eng.bytes_by_link())] if eng else [reps * nbytes]
            shares = [round(m / max(sum(moved), 1), 3) for m in moved]
            aggregate = by_paths[key[1]]
            left = max(aggregate - bg_gbps, 1e-9)
            label = "plain copy" if eng is None else f"{key[0]} x{key[1]}"
            progress(
                f"foreign copy on GPU 0's link ({direction}): {label} {fg_gbps:.1f} GB/s, foreign {bg_gbps:.1f}, "
                f"capacity left {left:.1f}: {fg_gbps / left:.0%} of it; bytes by link {shares}"
            )
            out.append({"op": "multipath_foreign", "impl": "plain" if eng is None else key[0], "bytes": nbytes,
                        "paths": key[1], "direction": direction, "gbps": round(fg_gbps, 2),
                        "foreign_gbps": round(bg_gbps, 2), "aggregate_gbps": round(aggregate, 2),
                        "share_of_left": round(fg_gbps / left, 3), "link_shares": shares, "gpu": gpu,
                        "date": date})  # fmt: skip
    # The peer copies are one cudaMemcpyAsync each on a stream of GPU 1, held
    # by a sleep until the host has queued them all: queued one by one as the
    # GPU ran them, they ended as fast as the host queued them, before the
    # engine's copies began (0-10 GB/s "beside" on hosts with a slow CPU).
    # Every event of the window is on GPU 1: the foreground's start and end
    # are GPU 0's stream s seen from a GPU 1 stream that waits for it.
    # 16 MB each (a few tens of microseconds over NVLink), enough of them to
    # outlast the head start and the engine's copies.
    rt = Runtime()
    rt.enable_peer_access([0, 1])
    peer_bytes = min(nbytes, 16 << 20)
    peer_count = int((LEAD_S + reps * nbytes / 50e9 + 0.01) * 350e9 / peer_bytes) + 1
    peer_src = torch.empty(peer_bytes, dtype=torch.uint8, device="cuda:1")
    peer_dst = torch.empty(peer_bytes, dtype=torch.uint8, device="cuda:0")
    p1, q1 = torch.cuda.Stream(1), torch.cuda.Stream(1)
    hold_cycles = int(PEER_HOLD_S * torch.cuda.get_device_properties(1).clock_rate * 1e3)
    with torch.cuda.device(1), torch.cuda.stream(p1):
        torch.cuda._sleep(1)  # loaded before it holds a stream
    rt.copy(peer_dst.data_ptr(), peer_src.data_ptr(), peer_bytes, p1)  # warm-up

    def peer_window(count, foreground=None):
        """`count` peer copies held until queued, then (LEAD_S after they began)
        `reps` foreground copies: (GB/s of the peer copies that ended inside the
        foreground's window, or over all of them without a foreground)."""
        for d in (0, 1):
            torch.cuda.synchronize(d)
        with torch.cuda.device(1):
            with torch.cuda.stream(p1):
                torch.cuda._sleep(hold_cycles)
            t0 = timed(p1)
            marks = []
            for _ in range(count):
                rt.copy(peer_dst.data_ptr(), peer_src.data_ptr(), peer_bytes, p1)
                marks.append(timed(p1))
        if foreground is None:
            for d in (0, 1):
                torch.cuda.synchronize(d)
            return count * peer_bytes / (t0.elapsed_time(marks[-1]) * 1e-3) / 1e9
        s.wait_event(t0)
        with torch.cuda.stream(s):
            torch.cuda._sleep(lead_cycles)
        start = torch.cuda.Event()
        start.record(s)
        q1.wait_event(start)
        a = timed(q1)
        for _ in range(reps):
            foreground()
        end = torch.cuda.Event()
        end.record(s)
        q1.wait_event(end)
        b = timed(q1)
        for d in (0, 1):
            torch.cuda.synchronize(d)
        lo, hi = t0.elapsed_time(a), t0.elapsed_time(b)
        inside = sum(1 for e in marks if lo < t0.elapsed_time(e) <= hi)
        return inside * peer_bytes / (max(hi - lo, 1e-6) * 1e-3) / 1e9

    alone = peer_window(50)
    for own_first in (True, False):
        eng = mp.Engine(devices=[0, 1], own_link_first=own_first)
        eng.copy(dev, host, stream=s)  # the relays' first chunks, outside the window
        s.synchronize()

        def fg(eng=eng):
            eng.copy(dev, host, stream=s)

        beside = peer_window(peer_count, fg)
        eng.close()
        impl = "own-link-first" if own_first else "relay-first"
        progress(f"GPU 1 -> GPU 0 peer copy: alone {alone:.1f} GB/s, beside ferry ({impl}) {beside:.1f}")
        out.append({"op": "p2p_beside", "impl": impl, "bytes": peer_bytes, "paths": 2, "gbps": round(beside, 2),
                    "alone_gbps": round(alone, 2), "gpu": gpu, "date": date})  # fmt: skip
    return out


def _program(index: int, nbytes: int, reps: int, start, results) -> None:
    """One process of --programs: between its pinned memory and GPU `index`,
    for each impl (plain, ferry over every GPU) and direction, `reps` copies
    of `nbytes` queued at once after every process is ready (`start`, a
    barrier), each copy's end seen by the host on the system's monotonic clock,
    which every process shares; the bytes checked after each series. Puts
    (index, impl, direction, start time, [end times], error or "") on
    `results`."""
    import torch

    import ferry.multipath as mp

    eng = None
    try:
        torch.cuda.set_device(index)
        eng = mp.Engine(devices=list(range(torch.cuda.device_count())), head_bytes=0)
        g = torch.Generator().manual_seed(1000 + index)
        src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g).pin_memory()
        out = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        dev = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{index}")
        stream = torch.cuda.Stream(index)
        for impl in ("plain", "ferry"):
            for direction in OPS:
                dst, src_ = (dev, src) if direction == "h2d" else (out, dev)

                def one(dst=dst, src_=src_, impl=impl):
                    if impl == "ferry":
                        eng.copy(dst, src_, stream=stream)
                    else:
                        with torch.cuda.stream(stream):
                            dst.copy_(src_, non_blocking=True)

                if direction == "d2h":
                    dev.copy_(src)
                one()  # warm-up
                stream.synchronize()
                dst.fill_(0xA5)
                torch.cuda.synchronize(index)
                start.wait(timeout=300)
                ends = [torch.cuda.Event() for _ in range(reps)]
                t0 = time.monotonic()
                for e in ends:
                    one()
                    e.record(stream)
                times = []
                for e in ends:
                    while not e.query():
                        time.sleep(20e-6)
                    times.append(time.monotonic())
                eng.check()
                got = dev.cpu() if direction == "h2d" else out
                wrong = "" if torch.equal(got, src) else f"program {index}: {impl} {direction}: wrong bytes"
                results.put((index, impl, direction, t0, times, wrong))
    except Exception as e:  # the parent names it; a program that dies says why
        results.put((index, "", "", 0.0, [], f"program {index}: {type(e).__name__}: {e}"))
    finally:
        if eng is not None:
            eng.close()


def _bytes_at(t: float, t0: float, ends: Sequence[float], nbytes: int) -> float:
    """Bytes a series had moved by time t: its copies' ends joined by straight lines from (t0, 0)."""
    pts = [(t0, 0.0)] + [(e, (k + 1) * float(nbytes)) for k, e in enumerate(ends)]
    if t <= pts[0][0]:
        return 0.0
    for (ta, ba), (tb, bb) in zip(pts, pts[1:]):
        if t <= tb:
            return ba + (bb - ba) * (t - ta) / max(tb - ta, 1e-12)
    return pts[-1][1]


def programs(count: int, nbytes: int, reps: int, aggregates: dict, gpu: str, date: str, progress=print):
    """--programs: `count` processes at once, process i copying into and out of
    GPU i (_program). Each one's GB/s is its bytes between the last program's
    start and the first program's end of series, over that window: the time
    all of them ran. Returns (records, failures)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(count), ctx.Queue()
    procs = [ctx.Process(target=_program, args=(i, nbytes, reps, start, results)) for i in range(count)]
    for p in procs:
        p.start()
    got, failures = {}, []
    try:
        for _ in range(count * 2 * len(OPS)):
            index, impl, direction, t0, ends, wrong = results.get(timeout=600)
            if not impl:
                failures.append(wrong)
                break
            if wrong:
                failures.append(wrong)
            got.setdefault((impl, direction), {})[index] = (t0, ends)
    except Exception as e:  # queue.Empty: a program hung
        failures.append(f"programs: no result within 600 s ({type(e).__name__})")
    finally:
        start.abort()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    out = []
    for (impl, direction), series in got.items():
        if len(series) != count:
            continue
        lo = max(t0 for t0, _ in series.values())
        hi = min(ends[-1] for _, ends in series.values())
        agg = aggregates[direction][max(aggregates[direction])]
        for index, (t0, ends) in sorted(series.items()):
            moved = _bytes_at(hi, t0, ends, nbytes) - _bytes_at(lo, t0, ends, nbytes)
            gbps = moved / max(hi - lo, 1e-9) / 1e9
            out.append({"op": "multipath_programs", "impl": impl, "direction": direction, "bytes": nbytes,
                        "programs": count, "program": index, "gbps": round(gbps, 2),
                        "series_gbps": round(reps * nbytes / max(ends[-1] - t0, 1e-9) / 1e9, 2),
                        "window_ms": round((hi - lo) * 1e3, 2), "aggregate_gbps": round(agg, 2),
                        "gpu": gpu, "date": date})  # fmt: skip
    table = programs_table(out)
    if table:
        progress(table.rstrip())
    return out, failures


def run(opts: dict, progress=print) -> dict:
    import torch

    import ferry.multipath as mp

    n_gpu = torch.cuda.device_count()
    if n_gpu == 0:
        raise SystemExit("ferry.bench.multipath needs a GPU")
    if opts.get("programs", 0) and not 2 <= opts["programs"] <= n_gpu:
        raise SystemExit(f"--programs: {opts['programs']}; expected 0 (none) or 2 to {n_gpu} (one GPU each)")
    gpu = torch.cuda.get_device_name(0)
    date = datetime.date.today().isoformat()
    sizes = size_range(opts["min_bytes"], opts["max_bytes"], opts["factor"])
    paths = [p for p in opts["paths"] if 2 <= p <= n_gpu] if opts["paths"] else list(range(2, n_gpu + 1))
    reps = opts["reps"]
    top = sizes[-1]
    host = torch.empty(top, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(top, dtype=torch.uint8, device="cuda:0")
    ref = torch.randint(0, 256, (top,), dtype=torch.uint8, device="cuda:0")
    stream = torch.cuda.Stream(0)
    engines = {("ferry", p): mp.Engine(devices=list(range(p)), head_bytes=0) for p in paths}
    if opts.get("head", 0) > 0:  # the same engines with a head on the caller's stream, side by side
        engines.update(
            {("ferry-head", p): mp.Engine(devices=list(range(p)), head_bytes=opts["head"]) for p in paths}
        )
    if opts.get("own_share"):  # both settings of own_share_on_stream, whatever the default
        for on in (True, False):
            engines.update(
                {
                    (f"ferry-own-share-{'on' if on else 'off'}", p): mp.Engine(
                        devices=list(range(p)), head_bytes=0, own_share_on_stream=on
                    )
                    for p in paths
                }
            )
    for n in opts.get("outstanding", []):  # the same engines with deeper link queues, side by side
        engines.update(
            {
                (f"ferry-outstanding-{n}", p): mp.Engine(devices=list(range(p)), head_bytes=0, outstanding=n)
                for p in paths
            }
        )
    if opts["loopback"] > 0:
        engines[("ferry-loopback", 1)] = mp.Engine(devices=[0], loopback=opts["loopback"], head_bytes=0)
    statics = {}
    if n_gpu >= 2 and opts.get("static"):
        statics = {(f"static-{a}:{b}", 2): StaticSplit(torch, [a, b]) for a, b in ((1, 1), (1, 2))}
    records, failures = [], []
    # With contention, also the links of each path count at once: the capacity a copy over them has.
    counts = sorted({1, n_gpu, *paths}) if opts.get("contention") else [n_gpu]
    link_aggs = {}
    for direction, op in OPS.items():
        link_aggs[direction] = _aggregates(torch, min(top, 1 << 30), direction, reps, counts)
        agg = link_aggs[direction][n_gpu]
        progress(
            f"{op}: every GPU's own link at once {agg:.1f} GB/s"
            + "".join(
                f"; the first {p} at once {g:.1f}" for p, g in link_aggs[direction].items() if p != n_gpu
            )
        )
        impls = [("plain", 1)] + list(engines) + list(statics)
        for size in sizes:
            h, d = host[:size], dev[:size]
            for key in impls:
                if key[0] == "plain":
                    if direction == "h2d":
                        fn = lambda: d.copy_(h, non_blocking=True)  # noqa: E731
                    else:
                        fn = lambda: h.copy_(d, non_blocking=True)  # noqa: E731
                elif key in statics:
                    sp = statics[key]
                    if direction == "h2d":
                        fn = lambda sp=sp: sp.copy(d, h, True, stream)  # noqa: E731
                    else:
                        fn = lambda sp=sp: sp.copy(h, d, False, stream)  # noqa: E731
                else:
                    e = engines[key]
                    fn = (
                        (lambda e=e: e.copy(d, h, stream=stream))
                        if direction == "h2d"
                        else (lambda e=e: e.copy(h, d, stream=stream))
                    )
                if size == top:  # every byte, once per impl
                    if direction == "h2d":
                        host.copy_(ref.cpu())
                        dev.fill_(0xA5)
                    else:
                        dev.copy_(ref)
                        host.fill_(0xA5)
                    torch.cuda.synchronize()
                with torch.cuda.stream(stream):
                    t_us, host_us, cpu_us = _median_time(torch, stream, fn, reps)
                if size == top:
                    got = dev if direction == "h2d" else host.to("cuda:0")
                    if not torch.equal(got, ref):
                        failures.append(f"{op} {key} {size}: wrong bytes")
                if key in engines:
                    engines[key].check()
                records.append(record(op, key[0], size, key[1], t_us, agg, host_us, cpu_us, gpu, date))
            progress(
                f"{op} {format_size(size)}: "
                + ", ".join(
                    f"{impl_label(r)} {r['gbps']:.1f}"
                    for r in records
                    if r["op"] == op and r["bytes"] == size
                )
            )
    extra = []
    if opts.get("contention") and n_gpu >= 2:
        ferry_engines = {
            k: v for k, v in engines.items() if k[0].startswith("ferry") and k[0] != "ferry-loopback"
        }
        extra = contention(torch, ferry_engines, min(top, 256 << 20), reps, link_aggs, gpu, date, progress)
    for e in engines.values():
        e.close()
    together = []
    if opts.get("programs", 0) >= 2:
        together, bad = programs(opts["programs"], min(top, 256 << 20), max(reps, 8), link_aggs, gpu, date,
                                 progress)  # fmt: skip
        failures += bad
    sleeps = []
    for name in opts.get("sleep_models", []):
        got, bad = sleep_wake(torch, name, reps, gpu, date, progress)
        sleeps += got
        failures += bad
    return {
        "gpu": gpu,
        "gpus": n_gpu,
        "date": date,
        "records": records,
        "sleep": sleeps,
        "contention": extra,
        "programs": together,
        "failures": failures,
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results", help="folder for the JSON, the table and the plot")
    p.add_argument("--min", default="1M")
    p.add_argument("--max", default="1G")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--paths", default="", help="path counts to measure, e.g. 2,4 (default: 2..GPUs)")
    p.add_argument(
        "--loopback", type=int, default=2, help="relays through GPU 0 itself for ferry-loopback; 0: skip"
    )
    p.add_argument(
        "--sleep-models", default="", help=f"sleep and wake these models' weights ({', '.join(SLEEP_MODELS)})"
    )
    p.add_argument(
        "--static", action="store_true", help="also the static 1:1 and 1:2 splits (two GPUs or more)"
    )
    p.add_argument(
        "--contention",
        action="store_true",
        help="also a foreign copy on GPU 0's link, and a peer copy beside",
    )
    p.add_argument(
        "--head",
        default="0",
        help="also the engines with this head_bytes (e.g. 4M): the caller's stream copies the head itself",
    )
    p.add_argument(
        "--own-share",
        action="store_true",
        help="also the engines with own_share_on_stream on and off, side by side",
    )
    p.add_argument(
        "--programs",
        type=int,
        default=0,
        help="also N processes at once, process i copying to and from GPU i over every link (N <= GPUs)",
    )
    p.add_argument(
        "--outstanding",
        default="",
        help="also the engines with these outstanding chunks per link (e.g. 2,4; the default is 3), side by side",
    )
    p.add_argument("--tag", default="")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    opts = {
        "min_bytes": parse_size(args.min),
        "max_bytes": parse_size(args.max),
        "factor": args.factor,
        "reps": args.reps,
        "paths": [int(x) for x in args.paths.split(",") if x],
        "loopback": args.loopback,
        "sleep_models": [m for m in args.sleep_models.split(",") if m],
        "static": args.static,
        "contention": args.contention,
        "head": parse_size(args.head) if args.head not in ("", "0") else 0,
        "own_share": args.own_share,
        "programs": args.programs,
        "outstanding": [int(x) for x in args.outstanding.split(",") if x],
    }
    for m in opts["sleep_models"]:
        if m not in SLEEP_MODELS:
            raise SystemExit(f"--sleep-models: unknown model {m!r}; known: {', '.join(SLEEP_MODELS)}")
    result = run(opts)
    table = (
        format_table(result["records"])
        + sleep_table(result["sleep"])
        + contention_table(result["contention"])
        + programs_table(result["programs"])
    )
    print(table)
    for f in result["failures"]:
        print("FAILED:", f)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(
        args.out,
        f"{result['date']}-{result['gpu'].replace(' ', '-')}-x{result['gpus']}-multipath"
        + (f"-{args.tag}" if args.tag else ""),
    )
    with open(stem + ".json", "w") as f:
        json.dump({"command": " ".join(sys.argv), **result}, f, indent=1)
    with open(stem + ".txt", "w") as f:
        f.write(table + "\n")
    if plot(result["records"], stem + ".png", f"multipath copies, {result['gpus']} x {result['gpu']}"):
        print(f"wrote {stem}.png")
    print(f"wrote {stem}.json, {stem}.txt")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

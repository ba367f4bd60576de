"""End to end: time to first token (TTFT) and throughput of Hugging Face
transformers models whose KV cache comes back from pinned host memory through
ferry.kv.copy_blocks, every fetch strategy side by side in one run.

    python -m ferry.bench.kv_e2e [--models qwen2.5-0.5b,llama-3.2-1b,llama-3.1-8b]
        [--prompts 4096,8192,32768] [--hits 1.0,0.5] [--ops ttft,throughput]
        [--impls ferry-auto,ferry-zero-sm,per-page,batched,kernel] [--reps 5] [--warmup 2]
        [--requests 16] [--request-prefix 2048] [--batch 4] [--decode-tokens 4] [--new-tokens 0]
        [--out bench/results] [--tag TAG] [--no-plot]

Models: the shapes of Qwen2.5-0.5B, Llama-3.2-1B and Llama-3.1-8B built from
transformers configs with random weights (nothing is downloaded), bf16, sdpa
attention, on the GPU, eval, no_grad. KV: 16-token pages. The host pool holds,
per layer, a K and a V tensor [host pages, 16, kv heads, head dim] (bf16) from
ferry.kv.pinned_empty, filled with random values; a prefix's pages are a random
sample of the pool's page ids in random order (a permutation when the prefix
fills the pool), so no two consecutive pages of a prefix are adjacent in host
memory except by chance. On the GPU a prefix lands in pages 0..n-1 of per-layer
K and V tensors [n, 16, kv heads, head dim], in token order, viewed (no copy) as
[batch, kv heads, tokens, head dim] for the model's DynamicCache.

Impls (ferry.kv.copy_blocks modes): ferry-auto (mode="auto"), ferry-zero-sm
(mode="auto", zero_sm=True), per-page (one cudaMemcpyAsync per page, the
baseline), batched (a copy per page and tensor, contiguous runs merged, submitted
by ferry in cudaMemcpyBatchAsync calls of FERRY_BATCH_MAX copies; vLLM's one call
for the whole transfer is python -m ferry.bench.kv's vllm-batched), kernel (an
SM gather kernel reading pinned host memory in place). Per point, every impl
runs once untimed with its destination poisoned (all bits set), and its fetched
KV is compared byte for byte with the host pool (throughput: the last wave's)
and its tokens with the per-page impl's; an impl that raises there is dropped
from the point and listed (exit status 1, as for a failed check); then --warmup + --reps rounds, each round running every impl
once (the order rotated by one each round, so no impl always runs first); the
medians of the --reps timed rounds are reported. Before every run the GPU is
idle (torch.cuda.synchronize), and times are CUDA events from before the first
fetch call to after the last token, so the host's time to submit the copies
counts wherever it delays the GPU.

1. ttft, hit 1.0: the KV of all P prompt tokens (P/16 pages per layer, K and V)
   is in the host pool. One copy_blocks call fetches all of it (a list of
   2 x layers tensors, one page mapping; each side a kv.Pages made once at
   set-up, or with --sides lists the lists themselves) in the current stream; then the model
   runs one token at position P with that KV as its past (a DynamicCache whose
   layers hold the fetched GPU pages as views) and the argmax of its logits is
   the first token. --cache in-place (the default) writes the new tokens' KV
   into room left after the fetched pages, as a serving engine writes into its
   pages; --cache copy keeps DynamicCache's own update, which concatenates and
   so copies the whole past at every step (on Llama-3.1-8B at 32K, 13 ms of
   the step's 20 ms of GPU time, bench/probes/kv_step.py). With the in-place
   cache the step is a CUDA graph captured before the runs (--graph, the
   default there), as a serving engine captures its decode step, so that the
   eager step's host time (about 33 ms on the 8B model) does not decide when
   the GPU can run it. ttft_ms: fetch start -> first token. fetch_ms: fetch start
   -> fetch done in the stream. pcie_bound_ms: kv_bytes over the host->GPU
   peak measured at the start of the run (one pinned copy of --pcie-bytes,
   default 1 GiB, median of 5); over_pcie_bound = ttft_ms / pcie_bound_ms.
   --layerwise: the fetch goes layer by layer on a side stream and each
   decoder layer waits for its own pages, as at hit 0.5 below, so the
   one-token step overlaps the fetch (records: layerwise); in the graph each
   layer's part waits on its layer's event (an event-wait node).
   --trace: each impl once more under torch.profiler, its timeline summed up
   in its record (timeline_summary).
2. ttft, hit 0.5: the first P/2 tokens' KV is in the host pool, the last P/2
   tokens are prefilled. On a side stream, one copy_blocks call per layer (its
   K and V) followed by an event; a forward pre-hook on decoder layer i makes
   the compute stream wait for layer i's event, so the fetch of later layers
   overlaps the prefill of earlier ones. The prefill of the P/2 new tokens uses
   the fetched half as past KV; the argmax at the last position is the first
   token. All fetch calls are submitted before the forward starts (a strategy
   whose submission takes host time delays the prefill's launch by that much).
   ttft_ms: first fetch start -> first token; kv_bytes: the fetched half.
3. throughput: --requests requests (default 16) of --request-prefix tokens
   (default 2048), every one a full hit, decoded in waves of --batch requests
   (default 4): a wave's KV (all its requests, all layers: one copy_blocks call)
   is fetched on a side stream into one of two GPU buffers, then the wave
   decodes --decode-tokens tokens per request (default 4, batched, greedy) on the
   compute stream. The fetch of wave w+1 is submitted before wave w's decode,
   so it overlaps that decode; a buffer is refilled only after the wave that
   used it is done (an event). tokens_per_s = requests x decode tokens / (first
   fetch start -> last token). With --new-tokens N each request first
   prefills N new tokens on its fetched prefix (a new turn of a long
   conversation; its first decode step), so the next wave's fetch overlaps
   compute-bound work, where an SM taken by a copy kernel costs the most;
   tokens_per_s still counts decoded tokens, and the wave runs eagerly. With --graph (the default) a wave's whole
   decode is one CUDA graph per buffer, captured before the runs, as a serving
   engine captures its decode; with --no-graph it is Hugging Face's eager
   decode (launch-bound at small batches). Either way this measures what a
   fetch strategy costs a model that is busy, in SMs (kernel) and in host time
   (per-page), not a tuned serving engine's throughput. Its records' prompt_tokens is the
   request prefix, hit 1.0, kv_bytes all requests' KV. --fetch-thread
   submits every wave's fetch from a thread of its own instead (as a serving
   engine's transfer thread would; copy_blocks releases the GIL), each once
   the decode that frees its buffer has been queued: the submission's host
   time then overlaps the decode's launches (records: fetch_thread).

Records: {op: "ttft"|"throughput", model, prompt_tokens, hit, impl,
ttft_ms | tokens_per_s, gpu, date} plus kv_bytes, pcie_peak_gbps, the per-rep
values, fetch_ms (ttft), wall_ms (host clock, same span), and the checks
(kv_equal, token_equal, and ref_repeatable: whether the reference impl's
tokens were the same in two runs, without which a token mismatch says nothing
about the fetch). A point that does not fit in GPU (or host) memory is
skipped and listed. Results: DIR/<date>-<gpu>-kv-e2e[-TAG].json, .txt (the
table and the ratios: > 1 means ferry is better) and .png (with matplotlib).
The default run takes about 2-4 minutes on one H100 or H200."""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import random
import statistics
import sys
import time
import traceback
from typing import Dict, List, Optional, Sequence

from .report import _pyplot, format_size, parse_size, save_figure

PAGE_TOKENS = 16
BF16_BYTES = 2
DEVICE = "cuda"  # where the model and the fetched pages live (the GPU: torch's current device)

# Shapes of the public models' configs (weights random).
MODELS: Dict[str, dict] = {
    "qwen2.5-0.5b": dict(
        family="qwen2", layers=24, hidden=896, heads=14, kv_heads=2, head_dim=64,
        intermediate=4864, vocab=151936, tie=True,
    ),
    "llama-3.2-1b": dict(
        family="llama", layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64,
        intermediate=8192, vocab=128256, tie=True,
    ),
    "llama-3.1-8b": dict(
        family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
        intermediate=14336, vocab=128256, tie=False,
    ),
}  # fmt: skip

# impl name -> ferry.kv.copy_blocks arguments
IMPLS: Dict[str, dict] = {
    "ferry-auto": dict(mode="auto", zero_sm=False),
    "ferry-zero-sm": dict(mode="auto", zero_sm=True),
    "per-page": dict(mode="per_page", zero_sm=False),
    # The field's approach (vLLM): a copy per page and tensor, batched (ferry splits the calls at FERRY_BATCH_MAX).
    "batched": dict(mode="batched", zero_sm=False, pitched=False),
    "kernel": dict(mode="kernel", zero_sm=False),
}
FERRY_IMPLS = ("ferry-auto", "ferry-zero-sm")
BASELINE = "per-page"
ALTERNATIVES = ("per-page", "batched", "kernel")
OPS = ("ttft", "throughput")
VALUE_KEY = {"ttft": "ttft_ms", "throughput": "tokens_per_s"}
UNIT = {"ttft": "ms", "throughput": "tok/s"}


# ---------------------------------------------------------------- pure parts


def _csv(text: str) -> List[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked: lists parsed, names known, sizes whole pages."""
    ap = argparse.ArgumentParser(
        prog="python -m ferry.bench.kv_e2e", description=(__doc__ or "").split("\n\n")[0]
    )
    ap.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    ap.add_argument("--prompts", default="4096,8192,32768", help="prompt tokens (whole 16-token pages)")
    ap.add_argument(
        "--hits", default="1.0,0.5", help="share of the prompt's KV in host memory: 1.0 and/or 0.5"
    )
    ap.add_argument("--ops", default=",".join(OPS), help="ttft and/or throughput")
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"of {', '.join(IMPLS)}")
    ap.add_argument("--reps", type=int, default=5, help="timed rounds (medians reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    ap.add_argument("--requests", type=int, default=16, help="throughput: requests")
    ap.add_argument("--request-prefix", type=int, default=2048, help="throughput: prefix tokens per request")
    ap.add_argument("--batch", type=int, default=4, help="throughput: requests decoded together (a wave)")
    ap.add_argument("--decode-tokens", type=int, default=4, help="throughput: tokens decoded per request")
    ap.add_argument(
        "--new-tokens",
        type=int,
        default=0,
        help="throughput: tokens each request prefills after its fetched prefix (its new turn), "
        "the first of its --decode-tokens steps; 0: decode only",
    )
    ap.add_argument(
        "--layerwise",
        action="store_true",
        help="ttft at hit 1.0: fetch layer by layer on a side stream, each decoder layer waiting for its own "
        "pages (as the 0.5 hit does), instead of the whole fetch before the one-token step",
    )
    ap.add_argument(
        "--fetch-thread",
        action="store_true",
        help="throughput: submit each wave's fetch from a thread of its own, as a serving engine's transfer "
        "thread would, instead of on the decoding thread",
    )
    ap.add_argument(
        "--cache",
        choices=("in-place", "copy"),
        default="in-place",
        help="in-place: new tokens' KV written into spare room in the fetched pages, as a serving engine does; "
        "copy: transformers' DynamicCache, which concatenates (copies the whole past) at every step",
    )
    ap.add_argument(
        "--layout",
        choices=("per-layer", "stacked", "page-first"),
        default="per-layer",
        help="per-layer: every layer's K and V a tensor of its own, on the host and on the GPU (as vLLM and "
        "SGLang allocate them); stacked: one [2 x layers, pages, ...] tensor on each side, whose page copies "
        "ferry submits as one pitched copy per page (per-page and batched still copy every tensor's page); "
        "page-first: the GPU side stacked, the host pool one [pages, 2 x layers, ...] tensor (a page's K and V "
        "of every layer one span, as SGLang's page-first host layout), pitched at any page size",
    )
    ap.add_argument(
        "--graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ttft at hit 1.0: the one-token step is a CUDA graph captured before the runs, as a serving engine "
        "captures its decode step (with --layerwise, each layer's part waits for its pages); throughput: each "
        "buffer's wave decode is one graph. Default: on with --cache in-place, which it needs",
    )
    ap.add_argument(
        "--deterministic",
        action="store_true",
        help="torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG=:4096:8: tells whether tokens "
        "that differ between impls come from the model's own kernels rather than from the fetch",
    )
    ap.add_argument(
        "--trace",
        action="store_true",
        help="ttft: run each impl once more under torch.profiler; its chrome trace goes next to the results "
        "and a summary of its timeline (when the fetch ended, what the model ran after it) into its record",
    )
    ap.add_argument(
        "--sides",
        choices=("pages", "lists"),
        default="pages",
        help="pages: each fetch's GPU and host sides are kv.Pages made once at set-up, as a serving engine makes "
        "them with its caches; lists: lists of tensors, which every call reads and checks again",
    )
    ap.add_argument("--pcie-bytes", default="1G", help="size of the host->GPU copy that measures the peak")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--tag", default="")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)

    args.models = [m.lower() for m in _csv(args.models)]
    for m in args.models:
        if m not in MODELS:
            ap.error(f"--models: unknown model {m!r}; known: {', '.join(MODELS)}")
    try:
        args.prompts = [int(p) for p in _csv(args.prompts)]
        args.hits = [float(h) for h in _csv(args.hits)]
        args.pcie_bytes = parse_size(args.pcie_bytes)
    except ValueError as e:
        ap.error(str(e))
    for h in args.hits:
        if h not in (1.0, 0.5):
            ap.error(f"--hits: {h} is not 1.0 or 0.5")
    args.ops = _csv(args.ops)
    for op in args.ops:
        if op not in OPS:
            ap.error(f"--ops: unknown op {op!r}; known: {', '.join(OPS)}")
    args.impls = _csv(args.impls)
    for i in args.impls:
        if i not in IMPLS:
            ap.error(f"--impls: unknown impl {i!r}; known: {', '.join(IMPLS)}")
    if not args.models or not args.ops or not args.impls:
        ap.error("--models, --ops and --impls need at least one name each")
    if "ttft" in args.ops and (not args.prompts or not args.hits):
        ap.error("ttft needs --prompts and --hits")
    step = PAGE_TOKENS * (2 if 0.5 in args.hits else 1)
    for p in args.prompts:
        if p <= 0 or p % step:
            ap.error(
                f"--prompts: {p} is not a positive multiple of {step} "
                f"({'half a prompt must be whole 16-token pages' if step > PAGE_TOKENS else 'whole pages'})"
            )
    if args.graph and args.cache != "in-place":
        ap.error("--graph needs --cache in-place (the graph writes the token's KV into the pages' room)")
    if args.graph is None:
        args.graph = args.cache == "in-place"
    if args.reps < 1 or args.warmup < 0:
        ap.error("--reps must be at least 1 and --warmup at least 0")
    if "throughput" in args.ops:
        if min(args.requests, args.batch, args.decode_tokens, args.request_prefix) < 1:
            ap.error("--requests, --batch, --decode-tokens and --request-prefix must be positive")
        if args.new_tokens < 0:
            ap.error(f"--new-tokens ({args.new_tokens}) must be 0 or more")
        if args.requests % args.batch:
            ap.error(f"--requests ({args.requests}) must be a multiple of --batch ({args.batch})")
        if args.request_prefix % PAGE_TOKENS:
            ap.error(f"--request-prefix ({args.request_prefix}) must be a multiple of {PAGE_TOKENS}")
    return args


def page_bytes(spec: dict) -> int:
    """Bytes of one 16-token page of one layer's K (or V)."""
    return PAGE_TOKENS * spec["kv_heads"] * spec["head_dim"] * BF16_BYTES


def kv_bytes(spec: dict, tokens: int) -> int:
    """Bytes of the KV of `tokens` tokens, all layers, K and V."""
    return 2 * spec["layers"] * tokens * spec["kv_heads"] * spec["head_dim"] * BF16_BYTES


def param_count(spec: dict) -> int:
    h, q, kv = spec["hidden"], spec["heads"] * spec["head_dim"], spec["kv_heads"] * spec["head_dim"]
    layer = h * q + 2 * h * kv + q * h + 3 * h * spec["intermediate"] + 2 * h
    embed = spec["vocab"] * h * (1 if spec["tie"] else 2)
    return spec["layers"] * layer + embed + h


def gpu_bytes_needed(spec: dict, prompt_tokens: int, hit: float) -> int:
    """About how many GPU bytes a ttft point needs beside the model's weights:
    the fetched pages, the cache the model builds from them (DynamicCache
    copies), one layer's working set for the new tokens (activations, the
    causal mask as bool and as a float bias, the KV repeated to every head)."""
    fetched_tokens = int(prompt_tokens * hit)
    new = max(prompt_tokens - fetched_tokens, 1)
    total = prompt_tokens + 1
    h, i, q = spec["hidden"], spec["intermediate"], spec["heads"] * spec["head_dim"]
    activations = new * (8 * h + 3 * i + 4 * q) * BF16_BYTES
    mask = new * total * (1 + BF16_BYTES) if new > 1 else 0
    repeated = 2 * total * q * BF16_BYTES
    return kv_bytes(spec, fetched_tokens) + kv_bytes(spec, total) + activations + mask + repeated


def throughput_bytes_needed(
    spec: dict, batch: int, prefix: int, decode_tokens: int, new_tokens: int = 0
) -> int:
    """GPU bytes of the throughput run beside the weights: two wave buffers and
    one wave's cache (a second copy, then growing by a token per step), and
    with new tokens one layer's working set for their prefill (as in
    gpu_bytes_needed)."""
    total = prefix + new_tokens + decode_tokens
    out = 2 * kv_bytes(spec, batch * prefix) + 2 * kv_bytes(spec, batch * total)
    if new_tokens:
        h, i, q = spec["hidden"], spec["intermediate"], spec["heads"] * spec["head_dim"]
        out += batch * new_tokens * (8 * h + 3 * i + 4 * q) * BF16_BYTES  # activations
        out += batch * new_tokens * total * (1 + BF16_BYTES)  # the causal mask, bool and bias
        out += batch * 2 * total * q * BF16_BYTES  # the KV repeated to every head
    return out


def host_pool_pages(args) -> int:
    """Pages per layer tensor of the host pool: enough for the longest prompt
    and, with throughput, for every request's prefix at once."""
    n = max(args.prompts) // PAGE_TOKENS if "ttft" in args.ops else 0
    if "throughput" in args.ops:
        n = max(n, args.requests * args.request_prefix // PAGE_TOKENS)
    return n


def host_page_ids(num_host_pages: int, count: int, seed: int) -> List[int]:
    """`count` distinct host page ids in random order (a random permutation of
    all of them when count == num_host_pages): where a prefix's pages sit."""
    if not 0 < count <= num_host_pages:
        raise ValueError(f"need 0 < count ({count}) <= num_host_pages ({num_host_pages})")
    return random.Random(seed).sample(range(num_host_pages), count)


def rotated(impls: Sequence[str], round_index: int) -> List[str]:
    """The impls in the order of one round: rotated by one each round."""
    if not impls:
        return []
    k = round_index % len(impls)
    return list(impls[k:]) + list(impls[:k])


def check_order(impls: Sequence[str]) -> List[str]:
    """Order of the untimed checking runs: the baseline first (its tokens are the reference)."""
    return sorted(impls, key=lambda i: i != BASELINE)


def make_record(
    op: str, model: str, prompt_tokens: int, hit: float, impl: str, value: float, gpu: str, date: str,
    **extra,
) -> dict:  # fmt: skip
    """One result: ttft_ms for op "ttft", tokens_per_s for "throughput"."""
    if op not in VALUE_KEY:
        raise ValueError(f"op {op!r} is not one of {', '.join(VALUE_KEY)}")
    r = dict(op=op, model=model, prompt_tokens=int(prompt_tokens), hit=float(hit), impl=impl)
    r[VALUE_KEY[op]] = float(value)
    r.update(gpu=gpu, date=date)
    r.update(extra)
    return r


def value_of(r: dict) -> float:
    return r[VALUE_KEY[r["op"]]]


def speedup(op: str, mine: float, other: float) -> float:
    """How many times better `mine` is than `other` (above 1: mine is better).
    TTFT is a time (lower is better), throughput a rate (higher is better)."""
    if op == "ttft":
        return other / mine if mine > 0 else math.inf
    return mine / other if other > 0 else math.inf


def point_key(r: dict) -> tuple:
    return (r["op"], r["model"], r["prompt_tokens"], r["hit"])


def _points(records: Sequence[dict]) -> Dict[tuple, Dict[str, dict]]:
    out: Dict[tuple, Dict[str, dict]] = {}
    for r in records:
        out.setdefault(point_key(r), {})[r["impl"]] = r
    return out


def format_table(records: Sequence[dict]) -> str:
    """One row per (op, model, prompt, hit), one column per impl: TTFT in ms
    or tokens/s; KV: the bytes fetched (throughput: all requests'); the
    last column, for TTFT: those bytes over the measured PCIe peak, in ms."""
    impls = list(dict.fromkeys(r["impl"] for r in records))
    w = max([14] + [len(i) + 2 for i in impls])
    head = f"{'op':<10} {'model':<13} {'prompt':>7} {'hit':>4} {'unit':>5} {'KV':>6}"
    head += "".join(f"{i:>{w}}" for i in impls) + f"{'KV/peak ms':>12}"
    lines = [head]
    for (op, model, prompt, hit), by in _points(records).items():
        any_r = next(iter(by.values()))
        kvb = any_r.get("kv_bytes")
        kv_text = _short_bytes(kvb) if kvb else ""
        line = f"{op:<10} {model:<13} {prompt:>7} {hit:>4.1f} {UNIT[op]:>5} {kv_text:>6}"
        line += "".join(f"{value_of(by[i]):>{w}.1f}" if i in by else " " * w for i in impls)
        bound = any_r.get("pcie_bound_ms") if op == "ttft" else None
        line += f"{bound:>12.1f}" if bound else ""
        lines.append(line)
    return "\n".join(lines)


def _short_bytes(n: int) -> str:
    for unit, div in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= div:
            v = n / div
            return f"{v:.0f}{unit}" if v == int(v) or v >= 100 else f"{v:.1f}{unit}"
    return str(n)


def ratio_rows(records: Sequence[dict]) -> List[dict]:
    """For each point and each ferry impl: its speedup over each alternative
    (per-page, batched, kernel; above 1: ferry is better), the best
    alternative and the speedup over it, and for TTFT at hit 1.0 its time
    over kv_bytes / measured PCIe peak, and its fetch's (the rest of a TTFT is
    the model's one-token step, which no transfer shortens)."""
    out = []
    for (op, model, prompt, hit), by in _points(records).items():
        alts = [a for a in ALTERNATIVES if a in by]
        best: Optional[str] = None
        if alts:
            pick = min if op == "ttft" else max
            best = pick(alts, key=lambda a: value_of(by[a]))
        for f in FERRY_IMPLS:
            if f not in by:
                continue
            mine = value_of(by[f])
            row = dict(
                op=op, model=model, prompt_tokens=prompt, hit=hit, impl=f,
                vs={a: speedup(op, mine, value_of(by[a])) for a in alts},
                best_alt=best, vs_best=speedup(op, mine, value_of(by[best])) if best else None,
            )  # fmt: skip
            bound = by[f].get("pcie_bound_ms")
            if op == "ttft" and hit == 1.0 and bound:
                row["over_pcie_bound"] = mine / bound
                if by[f].get("fetch_ms"):
                    row["fetch_over_pcie_bound"] = by[f]["fetch_ms"] / bound
            out.append(row)
    return out


def format_ratios(records: Sequence[dict]) -> str:
    rows = ratio_rows(records)
    head = (
        f"{'op':<10} {'model':<13} {'prompt':>7} {'hit':>4} {'impl':<14}"
        + "".join(f"{'x ' + a:>12}" for a in ALTERNATIVES)
        + f"{'x best alt':>12}  {'(which)':<9}{'TTFT/bound':>11}{'fetch/bound':>12}"
    )
    lines = [
        "# ferry's speedup over each alternative (above 1: ferry is better; TTFT: their time / ferry's,",
        "# throughput: ferry's tokens/s / theirs); TTFT/bound: ferry's TTFT over kv_bytes / measured PCIe peak;",
        "# fetch/bound: the same for its fetch alone (the rest of the TTFT is the model's one-token step)",
        head,
    ]
    for r in rows:
        cells = "".join(f"{r['vs'][a]:>12.2f}" if a in r["vs"] else " " * 12 for a in ALTERNATIVES)
        best = f"{r['vs_best']:>12.2f}  {r['best_alt']:<9}" if r["best_alt"] else " " * 23
        bound = f"{r['over_pcie_bound']:>11.2f}" if "over_pcie_bound" in r else ""
        if "fetch_over_pcie_bound" in r:
            bound += f"{r['fetch_over_pcie_bound']:>12.2f}"
        lines.append(
            f"{r['op']:<10} {r['model']:<13} {r['prompt_tokens']:>7} {r['hit']:>4.1f} {r['impl']:<14}"
            f"{cells}{best}{bound}"
        )
    return "\n".join(lines)


def check_failures(records: Sequence[dict]) -> List[str]:
    """Records whose fetched KV differed from the host pool, whose tokens
    differed from the reference impl's or whose logits were not finite (a
    step that read poisoned pages), as lines to print."""
    out = []
    for r in records:
        bad = [k for k in ("kv_equal", "token_equal", "finite") if r.get(k) is False]
        if bad:
            out.append(
                f"{r['op']} {r['model']} {r['prompt_tokens']} hit {r['hit']} {r['impl']}: "
                + ", ".join(f"{k} False" for k in bad)
                + (
                    f" (tokens against {r['token_ref']})"
                    if "token_equal" in bad and r.get("token_ref")
                    else ""
                )
                + (
                    f"; {r['token_ref']}'s own two runs differ too: the decode is not deterministic here"
                    if "token_equal" in bad and r.get("ref_repeatable") is False
                    else ""
                )
            )
    return out


FETCH_KERNELS = ("page_gather",)  # ferry's kv kernel; copy-engine fetches show as memcpys


def timeline_summary(trace: dict) -> dict:
    """Where a run's GPU time went, from a torch.profiler chrome trace: its GPU
    events (kernels, memcpys, memsets) split into the fetch (host-to-GPU
    copies and ferry's page kernel) and the rest (the model), times in ms
    from the first GPU event. fetch_end: the last fetch event's end;
    tail_ms: from there to the last event's end; after_busy_ms: the model's
    GPU time after fetch_end; before_busy_ms: the model's GPU time before it;
    last_launch_ms: when the host made its last launch or copy call (graph
    launches included)."""
    gpu, host = [], []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or "ts" not in e:
            continue
        cat = e.get("cat", "")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            name = e.get("name", "")
            fetch = (cat == "gpu_memcpy" and "HtoD" in name and "Pinned" in name) or any(
                k in e.get("name", "") for k in FETCH_KERNELS
            )
            gpu.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), fetch))
        elif cat in ("cuda_runtime", "cuda_driver") and any(
            k in e.get("name", "") for k in ("Launch", "Memcpy")
        ):
            host.append(float(e["ts"]))
    if not gpu:
        return {}
    t0 = min(g[0] for g in gpu)
    fetch_end = max((g[1] for g in gpu if g[2]), default=t0)
    end = max(g[1] for g in gpu)
    model = [g for g in gpu if not g[2]]
    after = sum(max(0.0, b - max(a, fetch_end)) for a, b, _ in model)
    before = sum(max(0.0, min(b, fetch_end) - a) for a, b, _ in model)
    ms = lambda us: round(us / 1e3, 3)  # noqa: E731
    return dict(
        fetch_end_ms=ms(fetch_end - t0), end_ms=ms(end - t0), tail_ms=ms(end - fetch_end),
        after_busy_ms=ms(after), before_busy_ms=ms(before),
        model_events=len(model), model_events_after=sum(1 for g in model if g[1] > fetch_end),
        last_launch_ms=ms(max(host) - t0) if host else None,
    )  # fmt: skip


def result_stem(out_dir: str, date: str, gpu: str, tag: str = "") -> str:
    """DIR/<date>-<gpu>-kv-e2e[-TAG] (spaces in the GPU's name become dashes)."""
    name = f"{date}-{gpu.replace(' ', '-')}-kv-e2e" + (f"-{tag}" if tag else "")
    return os.path.join(out_dir, name)


def format_report(
    records: Sequence[dict], skipped: Sequence[dict], meta: dict
) -> str:  # fmt: skip
    """The text file: how it ran, the table, the ratios, failed checks, skipped points."""
    lines = [
        f"# {meta.get('command', '')}",
        f"# {meta.get('gpu', '')}; host->GPU peak {meta.get('pcie_peak_gbps', 0):.1f} GB/s "
        f"({format_size(meta.get('pcie_bytes', 0))} pinned copy, median of 5); median of "
        f"{meta.get('reps')} rounds after {meta.get('warmup')} warm-up rounds, impls alternating",
        f"# torch {meta.get('torch', '?')}, transformers {meta.get('transformers', '?')}; "
        f"KV bf16 in {PAGE_TOKENS}-token pages",
        format_table(records),
        "",
        format_ratios(records),
    ]
    failures = check_failures(records)
    if failures:
        lines += [
            "",
            "# checks FAILED (fetched KV against the host pool, tokens against the reference impl's):",
        ]
        lines += [f"#   {f}" for f in failures]
    else:
        lines += [
            "",
            "# checks: every impl's fetched KV equal to the host pool, its tokens equal to per-page's (or the first impl's)",
        ]
    if skipped:
        lines += ["", "# skipped:"]
        lines += [f"#   {skip_label(s)}: {s['reason']}" for s in skipped]
    return "\n".join(lines) + "\n"


def skip_label(s: dict) -> str:
    """What a skipped entry covers: a whole model, a point, or one impl at a point."""
    parts = [s.get("op"), s.get("model")]
    if s.get("prompt_tokens") is not None:
        parts.append(f"{s['prompt_tokens']} tokens")
    if s.get("hit") is not None:
        parts.append(f"hit {s['hit']}")
    parts.append(s.get("impl"))
    return " ".join(str(p) for p in parts if p)


def _color(impl: str) -> str:
    """One colour per impl in every panel, whichever impls a panel has."""
    return f"C{list(IMPLS).index(impl) % 10}" if impl in IMPLS else "C9"


def plot(records: Sequence[dict], path: str, title: str) -> bool:
    """Per model (columns): TTFT against prompt tokens at hit 1.0 (with
    kv_bytes / PCIe peak dashed) and at 0.5, and tokens/s per impl (bars).
    False without matplotlib."""
    plt = _pyplot()
    if plt is None or not records:
        return False
    models = list(dict.fromkeys(r["model"] for r in records))
    rows = [
        (op, hit)
        for op, hit in (("ttft", 1.0), ("ttft", 0.5), ("throughput", None))
        if any(r["op"] == op and (hit is None or r["hit"] == hit) for r in records)
    ]
    fig, axes = plt.subplots(
        len(rows), len(models), figsize=(4.8 * len(models), 3.6 * len(rows)), squeeze=False
    )
    for ri, (op, hit) in enumerate(rows):
        for ci, model in enumerate(models):
            ax = axes[ri][ci]
            mine = [
                r
                for r in records
                if r["op"] == op and r["model"] == model and (hit is None or r["hit"] == hit)
            ]
            impls = list(dict.fromkeys(r["impl"] for r in mine))
            if op == "ttft":
                for impl in impls:
                    pts = sorted((r["prompt_tokens"], r["ttft_ms"]) for r in mine if r["impl"] == impl)
                    ax.plot(
                        [p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl, color=_color(impl)
                    )
                bound = sorted(
                    {(r["prompt_tokens"], r["pcie_bound_ms"]) for r in mine if r.get("pcie_bound_ms")}
                )
                if bound and hit == 1.0:
                    ax.plot(
                        [b[0] for b in bound], [b[1] for b in bound], "k--", linewidth=1,
                        label="KV bytes / PCIe peak",
                    )  # fmt: skip
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                plain = plt.FuncFormatter(lambda v, _: f"{v:g}")
                ax.yaxis.set_major_formatter(plain)
                lo, hi = ax.get_ylim()
                # Minor ticks labelled only where the axis spans less than a decade (else they crowd).
                ax.yaxis.set_minor_formatter(plain if hi < 10 * lo else plt.NullFormatter())
                ax.set_xlabel("prompt tokens")
                ax.set_ylabel("TTFT (ms)")
                ax.set_title(f"{model}: TTFT, {hit:.0%} of the prompt in host memory", fontsize=9)
            else:
                vals = [next(r["tokens_per_s"] for r in mine if r["impl"] == i) for i in impls]
                ax.bar(range(len(impls)), vals, color=[_color(i) for i in impls])
                ax.set_xticks(range(len(impls)))
                ax.set_xticklabels(impls, rotation=30, ha="right", fontsize=8)
                ax.set_ylabel("tokens/s")
                prefix = mine[0]["prompt_tokens"] if mine else 0
                ax.set_title(f"{model}: throughput, {prefix}-token prefixes fetched", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if op == "ttft" and ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.suptitle(title)
    return save_figure(plt, fig, path)


# ---------------------------------------------------------------- GPU parts


def _host_available_bytes() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _is_oom(torch, e: BaseException) -> bool:
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower()


def build_model(torch, spec: dict):
    """A causal LM with the model's shapes and random weights, bf16, sdpa, on
    the GPU (weights created there: fast even for 8B), eval."""
    import transformers

    common = dict(
        vocab_size=spec["vocab"], hidden_size=spec["hidden"], intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"], max_position_embeddings=131072,
        tie_word_embeddings=spec["tie"], use_cache=True,
    )  # fmt: skip
    if spec["family"] == "qwen2":
        cfg = transformers.Qwen2Config(use_sliding_window=False, **common)  # head_dim = hidden / heads = 64
    else:
        cfg = transformers.LlamaConfig(head_dim=spec["head_dim"], **common)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        try:
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, dtype=torch.bfloat16, attn_implementation="sdpa"
            )
        except TypeError:  # transformers before 4.56 named it torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa"
            )
    first = next(model.parameters())
    if first.device.type != torch.device(DEVICE).type:
        model = model.to(DEVICE)
    if first.dtype != torch.bfloat16:  # (a plain .to(bf16) would also round the fp32 RoPE buffers)
        model = model.to(dtype=torch.bfloat16)
    return model.eval()


def _cache_kwarg(model) -> str:
    """transformers 5.x renamed the model's `past_key_values` argument to
    `cache` (the old name still accepted for a while): whichever forward takes."""
    import inspect

    try:
        params = inspect.signature(model.model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


_COPY_WARNED = []


def make_cache(pairs, allow_copy: bool, room=None):
    """A DynamicCache whose layer i holds pairs[i] = (K, V) [batch, kv heads,
    tokens, head dim] as they are (views of the fetched pages, not copies):
    built from empty slices, then the layers' tensors replaced. Nothing reads
    the tensors here, so pages still in flight on another stream are fine.
    With room[i] = (K, V) views of the same pages that go on past the fetched
    tokens, the model's new tokens are written into that room in place (as a
    serving engine writes them into its pages) instead of DynamicCache's
    concatenation, which copies the whole cache at every step. Where a
    transformers version keeps its tensors elsewhere, allow_copy builds it the
    documented way (one copy, reading the pages now); otherwise that is an
    error."""
    from transformers import DynamicCache

    tokens = pairs[0][0].shape[-2]
    cache = DynamicCache([(k[:, :, :0], v[:, :, :0]) for k, v in pairs])
    layers = getattr(cache, "layers", None)
    if layers is not None and len(layers) == len(pairs):
        for layer, (k, v) in zip(layers, pairs):
            layer.keys, layer.values = k, v
        if cache.get_seq_length() == tokens and layers[0].keys is pairs[0][0]:
            if room is not None:
                for layer, (k, v) in zip(layers, room):
                    layer.update = _in_place_update(layer, k, v)
            return cache
    if not allow_copy or room is not None:
        raise RuntimeError(
            "this transformers version's DynamicCache does not keep the layers' tensors in "
            "cache.layers[i].keys/.values; the overlapped fetch and the in-place cache need one that does"
        )
    if not _COPY_WARNED:
        _COPY_WARNED.append(True)
        print(
            "note: DynamicCache built by copying the fetched KV (one more HBM copy in TTFT)", file=sys.stderr
        )
    return DynamicCache(list(pairs))


def _in_place_update(layer, k_room, v_room):
    """DynamicLayer.update that writes the new tokens' K and V into the room
    after the ones it holds and returns views: no copy of the past."""

    def update(key_states, value_states, *args, **kwargs):
        t, n = layer.keys.shape[-2], key_states.shape[-2]
        if t + n > k_room.shape[-2]:
            raise RuntimeError(f"in-place cache: {t} + {n} tokens do not fit its room of {k_room.shape[-2]}")
        k_room[:, :, t : t + n].copy_(key_states)
        v_room[:, :, t : t + n].copy_(value_states)
        layer.keys, layer.values = k_room[:, :, : t + n], v_room[:, :, : t + n]
        return layer.keys, layer.values

    return update


def next_token(model, cache_kw: str, input_ids, cache, finite=None):
    """Run the decoder on input_ids [batch, n] with `cache` as the past; the
    argmax of the logits at the last position, [batch]. The LM head runs on
    the last position only (no [n, vocab] logits). `finite`: a bool tensor
    that stays True only while every step's logits are finite (pages read
    before they landed hold the poison, NaN, which argmax would turn into an
    ordinary-looking token)."""
    out = model.model(input_ids=input_ids, use_cache=True, **{cache_kw: cache})
    hidden = out.last_hidden_state[:, -1, :]
    logits = model.lm_head(hidden)
    if finite is not None:
        finite.logical_and_(logits.isfinite().all())
    return logits.argmax(dim=-1)


def as_bhsd(pages, batch: int = 1):
    """[n pages, 16, heads, dim] contiguous -> a [batch, heads, n*16/batch, dim] view."""
    n, pt, h, d = pages.shape
    return pages.view(batch, n * pt // batch, h, d).transpose(1, 2)


class LayerGate:
    """Forward pre-hooks on every decoder layer: while `events` is set, layer
    i's forward makes the current stream wait for events[i] first. With
    `external` set (while a CUDA graph is captured) the wait becomes an
    event-wait node of the graph: each replay then waits for the event's
    latest record, made outside the graph by that replay's fetch."""

    def __init__(self, torch, model):
        self.torch, self.events, self.waits, self.external = torch, None, 0, False
        self.handles = [
            layer.register_forward_pre_hook(self._hook(i)) for i, layer in enumerate(model.model.layers)
        ]

    def _hook(self, index: int):
        def pre_hook(module, args):
            if self.events is not None:
                stream = self.torch.cuda.current_stream()
                if self.external:
                    _wait_external(stream, self.events[index])
                else:
                    stream.wait_event(self.events[index])
                self.waits += 1

        return pre_hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


_LIBCUDA = []


def _wait_external(stream, event) -> None:
    """cuStreamWaitEvent(stream, event, CU_EVENT_WAIT_EXTERNAL) (torch does
    not pass that flag): under stream capture, an event-wait node."""
    import ctypes

    if not _LIBCUDA:
        _LIBCUDA.append(ctypes.CDLL("libcuda.so.1"))
    rc = _LIBCUDA[0].cuStreamWaitEvent(
        ctypes.c_void_p(stream.cuda_stream), ctypes.c_void_p(event.cuda_event), ctypes.c_uint(1)
    )
    if rc != 0:
        raise RuntimeError(f"cuStreamWaitEvent(CU_EVENT_WAIT_EXTERNAL) failed: CUresult {rc}")


def measure_pcie_peak(torch, kv, nbytes: int, reps: int = 5) -> List[float]:
    """GB/s of one pinned host -> GPU copy of `nbytes` (host memory from
    ferry's pool), after 2 warm-up copies: one sample per rep."""
    host = kv.pinned_empty((nbytes,), torch.uint8)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    for _ in range(2):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dev.copy_(host, non_blocking=True)
        e.record()
        e.synchronize()
        out.append(nbytes / (s.elapsed_time(e) * 1e-3) / 1e9)
    del host, dev
    torch.cuda.empty_cache()
    return out


def make_host_pool(torch, kv, spec: dict, pages: int, seed: int, layout: str = "per-layer") -> list:
    """2 x layers pinned tensors [pages, 16, kv heads, head dim] (K0, V0, K1,
    ...), random bf16 values (drawn on the GPU, copied over in chunks). With
    layout `stacked`, the views of one [2 x layers, pages, ...] tensor; with
    `page-first`, of one [pages, 2 x layers, ...] tensor (pages strided apart)."""
    shape = (pages, PAGE_TOKENS, spec["kv_heads"], spec["head_dim"])
    chunk = max(1, (256 << 20) // page_bytes(spec))
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    pool = []
    regions = 2 * spec["layers"]
    big = None
    if layout == "stacked":
        big = kv.pinned_empty((regions,) + shape, torch.bfloat16)
    elif layout == "page-first":
        big = kv.pinned_empty((pages, regions) + shape[1:], torch.bfloat16).transpose(0, 1)
    for i in range(regions):
        h = big[i] if big is not None else kv.pinned_empty(shape, torch.bfloat16)
        for a in range(0, pages, chunk):
            b = min(pages, a + chunk)
            h[a:b].copy_(torch.randn((b - a,) + shape[1:], device=DEVICE, dtype=torch.bfloat16, generator=g))
        pool.append(h)
    torch.cuda.synchronize()
    return pool


def fetched_equal(torch, dst: list, host: list, dst_ids, src_ids) -> bool:
    """Every destination page dst[t][dst_ids[j]] equals host[t][src_ids[j]], bit for bit."""
    d_ids, s_ids = dst_ids.to(DEVICE), src_ids.to(DEVICE)
    for d, h in zip(dst, host):
        ref = h.to(DEVICE).index_select(0, s_ids)
        got = d.index_select(0, d_ids)
        if not torch.equal(got.view(torch.int16), ref.view(torch.int16)):
            return False
    return True


def gpu_pages(torch, shape, count: int, stacked: bool) -> list:
    """`count` GPU tensors of `shape`: separate allocations, or with `stacked`
    the views of one [count, *shape] tensor."""
    if stacked:
        return list(torch.empty((count,) + tuple(shape), dtype=torch.bfloat16, device=DEVICE))
    return [torch.empty(shape, dtype=torch.bfloat16, device=DEVICE) for _ in range(count)]


def _poison(torch, tensors) -> None:
    for t in tensors:
        t.view(torch.int16).fill_(-1)  # all bits set: NaN in bf16


class Side:
    """One side of every fetch, whole and layer by layer: with --sides pages
    each a kv.Pages made here once, else the lists of tensors themselves."""

    def __init__(self, ctx, tensors: list):
        wrap = ctx.kv.Pages if ctx.pages else list
        self.all = wrap(tensors)
        self.layers = [wrap(tensors[2 * i : 2 * i + 2]) for i in range(len(tensors) // 2)]


def _fetch(kv, dst, src, dst_ids, src_ids, stream, impl: str) -> None:
    m = IMPLS[impl]
    kv.copy_blocks(
        dst, src, dst_ids, src_ids, stream=stream, mode=m["mode"], zero_sm=m["zero_sm"],
        pitched=m.get("pitched", True),
    )  # fmt: skip


_MASK_WARNED: List[bool] = []


def capture_graph(torch, fn, gate=None, events=None):
    """fn() captured as a CUDA graph after two warm-up calls on a side stream;
    returns (graph, what fn returned in the capture: static tensors each
    replay rewrites). With `gate` (a LayerGate), the capture's decoder layers
    wait on `events` as event-wait nodes."""
    import transformers.masking_utils as masking

    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    # While a graph is captured transformers builds a causal mask even where
    # none is needed (it cannot look at a padding mask then), and with a mask
    # its sdpa repeats the KV to every head. Here there is no padding mask
    # and each new token sees the whole past, so the capture keeps the
    # mask-free path it takes outside a capture.
    tracing = getattr(masking, "is_tracing", None)
    if tracing is not None:
        masking.is_tracing = lambda tensor=None: False
    elif not _MASK_WARNED:
        _MASK_WARNED.append(True)
        print(
            "note: transformers.masking_utils has no is_tracing here: captured steps may build a causal mask "
            "and repeat the KV to every head (slower than outside a capture)",
            file=sys.stderr,
        )
    if gate is not None:
        gate.events, gate.waits, gate.external = events, 0, True
    try:
        with torch.cuda.graph(graph):
            out = fn()
    finally:
        if tracing is not None:
            masking.is_tracing = tracing
        if gate is not None:
            gate.events, gate.external = None, False
    return graph, out


class Point:
    """One measured point: `run(impl)` times one fetch + model run and returns
    dict(time_ms, fetch_ms, wall_ms, tokens); `poison()` and `check()` wrap
    the untimed checking run, during which `verify` is set."""

    verify = False
    finite = None  # a bool tensor on the GPU: every step's logits finite since the last poison()

    def all_finite(self) -> bool:
        return self.finite is None or bool(self.finite.item())

    def poison(self) -> None:
        raise NotImplementedError

    def check(self) -> bool:
        raise NotImplementedError

    def run(self, impl: str) -> dict:
        raise NotImplementedError


class TtftPoint(Point):
    def __init__(self, ctx, prompt: int, hit: float):
        torch, spec = ctx.torch, ctx.spec
        self.ctx, self.hit = ctx, hit
        L = spec["layers"]
        n_all = prompt // PAGE_TOKENS
        n = n_all if hit == 1.0 else n_all // 2
        ids = host_page_ids(ctx.pool_pages, n_all, seed=ctx.seed * 1000003 + prompt)[:n]
        self.src_ids = torch.tensor(ids, dtype=torch.int64)
        self.dst_ids = torch.arange(n, dtype=torch.int64)
        new_tokens = 1 if hit == 1.0 else prompt - n * PAGE_TOKENS
        spare = -(-new_tokens // PAGE_TOKENS) if ctx.in_place else 0  # room for the new tokens' KV
        shape = (n + spare, PAGE_TOKENS, spec["kv_heads"], spec["head_dim"])
        self.dst = gpu_pages(torch, shape, 2 * L, ctx.stacked)
        self.dst_side = Side(ctx, self.dst)
        full = [(as_bhsd(self.dst[2 * i]), as_bhsd(self.dst[2 * i + 1])) for i in range(L)]
        past = n * PAGE_TOKENS
        self.pairs = [(k[:, :, :past], v[:, :, :past]) for k, v in full]
        self.room = full if ctx.in_place else None
        g = torch.Generator(device=DEVICE).manual_seed(ctx.seed + prompt)
        self.input_ids = torch.randint(spec["vocab"], (1, new_tokens), device=DEVICE, generator=g)
        self.kv_bytes = kv_bytes(spec, n * PAGE_TOKENS)
        ev = lambda: torch.cuda.Event(enable_timing=True)
        self.start, self.fetched, self.end = ev(), ev(), ev()
        self.layer_events = [ev() for _ in range(L)]
        self.finite = torch.ones((), dtype=torch.bool, device=DEVICE)
        if ctx.graph and hit == 1.0:
            self._capture_step()

    def _capture_step(self) -> None:
        """The one-token step as a CUDA graph, captured once before any timed
        run (as a serving engine captures its decode step at start-up): it
        reads the fetched pages and writes its token's KV into their room in
        place, whatever was fetched into them. --layerwise: each decoder
        layer's part of it first waits for its layer's event, recorded by
        each run's fetch (an event-wait node)."""
        ctx, torch = self.ctx, self.ctx.torch
        if ctx.layerwise:
            for e in (
                self.layer_events
            ):  # torch creates an event at its first record; the capture needs its handle
                e.record(torch.cuda.current_stream())

        def step():
            return next_token(
                ctx.model,
                ctx.cache_kw,
                self.input_ids,
                make_cache(self.pairs, allow_copy=False, room=self.room),
                self.finite,
            )

        gate = ctx.gate if ctx.layerwise else None
        self.step_graph, self.graph_token = capture_graph(torch, step, gate=gate, events=self.layer_events)
        if ctx.layerwise and ctx.gate.waits != len(self.layer_events):
            raise RuntimeError(
                f"the captured step waits for {ctx.gate.waits} layers' events, not {len(self.layer_events)}"
            )

    def poison(self) -> None:
        _poison(self.ctx.torch, self.dst)
        self.finite.fill_(True)

    def check(self) -> bool:
        return fetched_equal(self.ctx.torch, self.dst, self.ctx.host, self.dst_ids, self.src_ids)

    def run(self, impl: str) -> dict:
        ctx = self.ctx
        torch, kv = ctx.torch, ctx.kv
        cur = torch.cuda.current_stream()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.start.record(cur)
        if self.hit == 1.0 and not ctx.layerwise:
            _fetch(kv, self.dst_side.all, ctx.host_side.all, self.dst_ids, self.src_ids, cur, impl)
            self.fetched.record(cur)
            if ctx.graph:
                self.step_graph.replay()
                cache, token = None, self.graph_token
            else:
                cache = make_cache(self.pairs, allow_copy=True, room=self.room)
                token = next_token(ctx.model, ctx.cache_kw, self.input_ids, cache, self.finite)
            fetch_done = self.fetched
        else:
            side = ctx.side
            side.wait_event(self.start)
            for i, e in enumerate(self.layer_events):
                _fetch(
                    kv,
                    self.dst_side.layers[i],
                    ctx.host_side.layers[i],
                    self.dst_ids,
                    self.src_ids,
                    side,
                    impl,
                )
                e.record(side)
            if ctx.graph and self.hit == 1.0:  # its event-wait nodes wait for the records above
                self.step_graph.replay()
                cache, token = None, self.graph_token
            else:
                ctx.gate.events, ctx.gate.waits = self.layer_events, 0
                try:
                    cache = make_cache(self.pairs, allow_copy=False, room=self.room)
                    token = next_token(ctx.model, ctx.cache_kw, self.input_ids, cache, self.finite)
                finally:
                    ctx.gate.events = None
            if not (ctx.graph and self.hit == 1.0) and ctx.gate.waits != len(self.layer_events):
                raise RuntimeError(
                    f"the decoder layers' pre-hooks waited {ctx.gate.waits} times, not "
                    f"{len(self.layer_events)}: the prefill did not wait for the fetch"
                )
            cur.wait_event(self.layer_events[-1])
            fetch_done = self.layer_events[-1]
        self.end.record(cur)
        self.end.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
        del cache
        return dict(
            time_ms=self.start.elapsed_time(self.end), fetch_ms=self.start.elapsed_time(fetch_done),
            wall_ms=wall, tokens=token,
        )  # fmt: skip


class ThroughputPoint(Point):
    def __init__(self, ctx, requests: int, prefix: int, batch: int, decode_tokens: int, new_tokens: int = 0):
        torch, spec = ctx.torch, ctx.spec
        self.ctx, self.decode_tokens, self.new_tokens = ctx, decode_tokens, new_tokens
        L = spec["layers"]
        npp = prefix // PAGE_TOKENS
        self.waves = requests // batch
        wave_pages = batch * npp
        ids = host_page_ids(ctx.pool_pages, requests * npp, seed=ctx.seed * 1000003 + 7)
        self.src_ids = [
            torch.tensor(ids[w * wave_pages : (w + 1) * wave_pages], dtype=torch.int64)
            for w in range(self.waves)
        ]
        # Each request's pages are followed by room for its decoded tokens' KV (in place).
        per_request = npp + (-(-(new_tokens + decode_tokens) // PAGE_TOKENS) if ctx.in_place else 0)
        self.dst_ids = torch.tensor(
            [r * per_request + j for r in range(batch) for j in range(npp)], dtype=torch.int64
        )
        shape = (batch * per_request, PAGE_TOKENS, spec["kv_heads"], spec["head_dim"])
        self.bufs = [gpu_pages(torch, shape, 2 * L, ctx.stacked) for _ in range(min(2, self.waves))]
        self.buf_sides = [Side(ctx, b) for b in self.bufs]
        full = [
            [(as_bhsd(b[2 * i], batch), as_bhsd(b[2 * i + 1], batch)) for i in range(L)] for b in self.bufs
        ]
        self.pairs = [[(k[:, :, :prefix], v[:, :, :prefix]) for k, v in f] for f in full]
        self.room = full if ctx.in_place else [None] * len(full)
        self.finite = torch.ones((), dtype=torch.bool, device=DEVICE)
        # One graph per buffer: a wave's whole decode, its first ids copied in before each replay.
        # (Not with new tokens: a prefill's causal mask over a past is built with
        # host checks that a capture refuses; its GPU time dwarfs its launches.)
        self.decode_graphs = []
        if ctx.graph and not new_tokens:
            for b in range(len(self.bufs)):
                first = torch.zeros((batch, 1), dtype=torch.int64, device=DEVICE)
                graph, outs = capture_graph(torch, lambda b=b, first=first: self._decode(b, first))
                self.decode_graphs.append((graph, first, outs))
        g = torch.Generator(device=DEVICE).manual_seed(ctx.seed + 99)
        self.first_ids = torch.randint(
            spec["vocab"], (self.waves, batch, max(new_tokens, 1)), device=DEVICE, generator=g
        )
        self.kv_bytes = kv_bytes(spec, requests * prefix)
        self.tokens = requests * decode_tokens
        ev = lambda: torch.cuda.Event(enable_timing=True)
        self.start, self.end = ev(), ev()
        self.fetched = [torch.cuda.Event() for _ in range(self.waves)]
        self.waves_equal: List[bool] = []
        self.freed = [torch.cuda.Event() for _ in range(self.waves)]

    def _decode(self, b: int, ids) -> list:
        """--decode-tokens greedy steps of the wave in buffer b from ids
        [batch, 1], or [batch, --new-tokens] (the first step prefills them):
        each step's ids."""
        ctx = self.ctx
        cache = make_cache(self.pairs[b], allow_copy=False, room=self.room[b])
        out = []
        for _ in range(self.decode_tokens):
            ids = next_token(ctx.model, ctx.cache_kw, ids, cache, self.finite).unsqueeze(-1)
            out.append(ids)
        return out

    def poison(self) -> None:
        for b in self.bufs:
            _poison(self.ctx.torch, b)
        self.waves_equal = []
        self.finite.fill_(True)

    def check(self) -> bool:
        """Every wave's fetched KV, checked right after that wave's decode (in
        the checking run: the decode did not overwrite it, nor did a later
        fetch), and the last wave's again at the end. That the decode read the
        pages after they landed shows in all_finite (the poison is NaN)."""
        last = self.waves - 1  # its buffer still holds it after the run
        return (
            len(self.waves_equal) == self.waves
            and all(self.waves_equal)
            and fetched_equal(
                self.ctx.torch, self.bufs[last % 2], self.ctx.host, self.dst_ids, self.src_ids[last]
            )
        )

    def run(self, impl: str) -> dict:
        ctx = self.ctx
        torch, kv, side = ctx.torch, ctx.kv, ctx.side
        cur = torch.cuda.current_stream()

        def fetch(w: int) -> None:
            if w >= 2:
                side.wait_event(self.freed[w - 2])  # that wave's decode is done with the buffer
            _fetch(
                kv, self.buf_sides[w % 2].all, ctx.host_side.all, self.dst_ids, self.src_ids[w], side, impl
            )
            self.fetched[w].record(side)

        # The thread starts before the clock: its start-up is not the fetch's cost.
        fetcher = _FetchThread(torch, fetch, self.waves) if ctx.fetch_thread else None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.start.record(cur)
        side.wait_event(self.start)
        out = []
        try:
            if fetcher:
                fetcher.allow(0)
                fetcher.allow(1)
            else:
                fetch(0)
            for w in range(self.waves):
                if fetcher:
                    fetcher.recorded(w)  # fetched[w] is recorded: the wait below is on it, not a no-op
                elif w + 1 < self.waves:
                    fetch(w + 1)  # overlaps wave w's decode below
                cur.wait_event(self.fetched[w])
                if self.decode_graphs:
                    graph, first, outs = self.decode_graphs[w % 2]
                    first.copy_(self.first_ids[w])
                    graph.replay()
                    out.extend(o.clone() for o in outs)  # the next replay of this graph rewrites them
                else:
                    out.extend(self._decode(w % 2, self.first_ids[w]))
                if self.verify:  # before the buffer is freed for the fetch two waves on
                    self.waves_equal.append(
                        fetched_equal(torch, self.bufs[w % 2], ctx.host, self.dst_ids, self.src_ids[w])
                    )
                self.freed[w].record(cur)
                if fetcher:
                    fetcher.allow(w + 2)  # its fetch waits for freed[w], now recorded
        finally:
            if fetcher:
                fetcher.join()  # on an error too: no fetch may be submitted after this run
        self.end.record(cur)
        self.end.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
        return dict(
            time_ms=self.start.elapsed_time(self.end), wall_ms=wall, tokens=torch.cat(out, dim=1).flatten()
        )


class _FetchThread:
    """Runs fetch(0), fetch(1), ... on a thread of its own, each once the
    decoding thread allows it (after recording the event that fetch's stream
    waits for: a wait on an event not yet recorded would not wait), and lets
    the decoding thread wait until a fetch's own event is recorded. Bounded:
    an error or a stall on either side is raised in the decoding thread;
    join() stops the thread before any fetch not yet allowed."""

    LIMIT_S = 120.0

    def __init__(self, torch, fetch, waves: int):
        import threading

        self.waves = waves
        self._allowed = [threading.Event() for _ in range(waves + 2)]
        self._done = [threading.Event() for _ in range(waves)]
        self._stop = threading.Event()
        self._error: List[BaseException] = []
        device = torch.cuda.current_device()

        def work():
            try:
                torch.cuda.set_device(device)
                for w in range(waves):
                    while not self._allowed[w].wait(0.05):
                        if self._stop.is_set():
                            return
                    if self._stop.is_set():
                        return
                    fetch(w)
                    self._done[w].set()
            except BaseException as e:  # handed to the decoding thread
                self._error.append(e)
            finally:
                for d in self._done:
                    d.set()

        self._thread = threading.Thread(target=work, name="kv-e2e-fetch", daemon=True)
        self._thread.start()

    def allow(self, w: int) -> None:
        if w < len(self._allowed):
            self._allowed[w].set()

    def recorded(self, w: int) -> None:
        if not self._done[w].wait(self.LIMIT_S):
            raise TimeoutError(f"fetch thread: wave {w}'s fetch not submitted within {self.LIMIT_S:.0f} s")
        if self._error:
            raise self._error[0]

    def join(self) -> None:
        """Stops the thread before its next fetch not yet allowed, waits for it
        (bounded) and raises its error."""
        self._stop.set()
        self._thread.join(self.LIMIT_S)
        if self._thread.is_alive():
            raise TimeoutError(f"fetch thread: still running {self.LIMIT_S:.0f} s after it was told to stop")
        if self._error:
            raise self._error[0]


def run_point(torch, point: Point, impls: Sequence[str], warmup: int, reps: int, trace: Optional[str] = None):
    """The untimed checking run of every impl (destination poisoned first),
    then warmup + reps rounds of every impl, alternating. Returns (timed
    results per impl, checks per impl, error text per impl that failed).
    trace: a path prefix; each impl then runs once more under torch.profiler,
    its chrome trace is written to <trace>-<impl>.json and its
    timeline_summary is added to its checks as "timeline"."""
    checks: Dict[str, dict] = {}
    failed: Dict[str, str] = {}
    ref = None
    for impl in check_order(impls):
        try:
            point.poison()
            point.verify = True
            try:
                res = point.run(impl)
                kv_ok = point.check()
                finite = point.all_finite()
            finally:
                point.verify = False
        except Exception as e:  # an impl that cannot run: reported, the others go on
            if _is_oom(torch, e):
                raise
            failed[impl] = f"{type(e).__name__}: {e}"
            torch.cuda.synchronize()  # nothing of it still in flight into the next impl's check
            continue
        tokens = res["tokens"].cpu()
        if ref is None:
            # The reference runs twice: if its own tokens differ, the decode
            # is not deterministic here and a token mismatch says nothing
            # about the fetch.
            point.poison()
            again = point.run(impl)["tokens"].cpu()
            ref = (impl, tokens, bool(torch.equal(tokens, again)))
        checks[impl] = dict(
            kv_equal=bool(kv_ok), token_equal=bool(torch.equal(tokens, ref[1])), token_ref=ref[0],
            ref_repeatable=ref[2], finite=finite,
        )  # fmt: skip
    live = [i for i in impls if i not in failed]
    samples: Dict[str, List[dict]] = {i: [] for i in live}
    for k in range(warmup + reps):
        for impl in rotated(live, k):
            res = point.run(impl)
            res.pop("tokens")
            if k >= warmup:
                samples[impl].append(res)
    if trace:
        from torch.profiler import ProfilerActivity, profile

        for impl in live:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                point.run(impl)
            path = f"{trace}-{impl}.json"
            prof.export_chrome_trace(path)
            with open(path) as f:
                checks[impl]["timeline"] = timeline_summary(json.load(f))
    return samples, checks, failed


class _Ctx:
    pass


def run_model(
    torch, kv, name: str, args, peak_gbps: float, gpu: str, date: str, records: list, skipped: list, log
) -> None:
    """Every point of one model, appended to `records` (and `skipped`) as measured."""
    spec = MODELS[name]
    pool_pages = host_pool_pages(args)
    host_need = 2 * spec["layers"] * pool_pages * page_bytes(spec)
    avail = _host_available_bytes()
    if avail is not None and host_need > 0.8 * avail:
        reason = f"the host pool needs {host_need / 2**30:.1f} GiB pinned, {avail / 2**30:.1f} GiB available"
        skipped.append(dict(model=name, reason=reason))
        log(f"{name}: skipped, {reason}")
        return
    ctx = _Ctx()
    ctx.torch, ctx.kv, ctx.spec, ctx.seed, ctx.pool_pages = torch, kv, spec, args.seed, pool_pages
    ctx.fetch_thread = bool(getattr(args, "fetch_thread", False))
    ctx.layerwise = bool(getattr(args, "layerwise", False))
    ctx.in_place = getattr(args, "cache", "in-place") == "in-place"
    ctx.layout = getattr(args, "layout", "per-layer")
    ctx.stacked = ctx.layout in ("stacked", "page-first")  # the GPU side in one allocation
    ctx.pages = getattr(args, "sides", "pages") == "pages"
    ctx.graph = bool(getattr(args, "graph", ctx.in_place))
    if ctx.graph and not ctx.in_place:
        raise ValueError(
            "the captured step needs the in-place cache (it writes the token's KV into the pages' room)"
        )
    ctx.model = ctx.gate = ctx.host = None
    try:
        _run_points(ctx, name, args, peak_gbps, gpu, date, records, skipped, log)
    finally:
        if ctx.gate is not None:
            ctx.gate.remove()
        ctx.model = ctx.host = ctx.gate = None
        gc.collect()
        torch.cuda.empty_cache()


def _run_points(ctx, name: str, args, peak_gbps: float, gpu: str, date: str, records, skipped, log) -> None:
    torch, kv, spec, pool_pages = ctx.torch, ctx.kv, ctx.spec, ctx.pool_pages
    t0 = time.perf_counter()
    ctx.model = build_model(torch, spec)
    ctx.cache_kw = _cache_kwarg(ctx.model)
    ctx.gate = LayerGate(torch, ctx.model)
    ctx.side = torch.cuda.Stream()
    log(
        f"{name}: model built in {time.perf_counter() - t0:.1f} s ({param_count(spec) / 1e9:.2f} B "
        f"parameters; the decoder takes its past KV as {ctx.cache_kw!r})"
    )
    ctx.host = make_host_pool(torch, kv, spec, pool_pages, seed=args.seed + 17, layout=ctx.layout)
    ctx.host_side = Side(ctx, ctx.host)
    log(f"{name}: host pool {2 * spec['layers']} x {pool_pages} pages of {format_size(page_bytes(spec))}")
    pcie = dict(pcie_peak_gbps=peak_gbps)
    common = dict(
        reps=args.reps, warmup=args.warmup, page_bytes=page_bytes(spec),
        layout=ctx.layout, sides="pages" if ctx.pages else "lists",
    )  # fmt: skip

    def measure(op, prompt, hit, make, need, extra):
        free = torch.cuda.mem_get_info()[0]
        if need * 1.1 + (1 << 30) > free:
            reason = f"needs about {need / 2**30:.1f} GiB of GPU memory, {free / 2**30:.1f} GiB free"
            skipped.append(dict(op=op, model=name, prompt_tokens=prompt, hit=hit, reason=reason))
            log(f"{name} {op} {prompt} hit {hit}: skipped, {reason}")
            return
        log(f"{name} {op} {prompt} tokens, hit {hit}")
        oom = None
        try:
            trace = None
            if getattr(args, "trace", False) and op == "ttft":
                trace = result_stem(args.out, date, gpu, args.tag) + f"-trace-{name}-{prompt}-{hit}"
            samples, checks, failed = run_point(torch, make(), args.impls, args.warmup, args.reps, trace)
        except Exception as e:
            if not _is_oom(torch, e):
                raise
            oom = f"out of GPU memory ({str(e).splitlines()[0][:120]})"
        # Here, out of the except clause, the traceback (and the point's buffers) are gone.
        gc.collect()
        torch.cuda.empty_cache()
        if oom:
            skipped.append(dict(op=op, model=name, prompt_tokens=prompt, hit=hit, reason=oom))
            log(f"{name} {op} {prompt} hit {hit}: skipped, {oom}")
            return
        for impl, err in failed.items():
            skipped.append(dict(op=op, model=name, prompt_tokens=prompt, hit=hit, impl=impl, reason=err))
            log(f"  {impl} failed: {err}")
        for impl in args.impls:
            if impl not in samples:
                continue
            times = [s["time_ms"] for s in samples[impl]]
            t = statistics.median(times)
            rec = dict(common, **pcie, **extra(t), **checks[impl])
            rec["wall_ms"] = statistics.median(s["wall_ms"] for s in samples[impl])
            if op == "ttft":
                rec["ttft_ms_reps"] = times
                rec["fetch_ms"] = statistics.median(s["fetch_ms"] for s in samples[impl])
                value = t
            else:
                rec["elapsed_ms_reps"] = times
                value = rec["tokens"] / (t * 1e-3)
                rec["tokens_per_s_reps"] = [rec["tokens"] / (x * 1e-3) for x in times]
            records.append(make_record(op, name, prompt, hit, impl, value, gpu, date, **rec))
            log(f"  {impl:<14} {value:10.1f} {UNIT[op]}")
            if "timeline" in rec:
                log(f"    timeline {rec['timeline']}")

    if "ttft" in args.ops:
        for prompt in args.prompts:
            for hit in args.hits:
                fetched_tokens = prompt if hit == 1.0 else prompt // 2

                def extra(t, fetched_tokens=fetched_tokens, hit=hit):
                    kvb = kv_bytes(spec, fetched_tokens)
                    bound = kvb / (peak_gbps * 1e9) * 1e3
                    out = dict(kv_bytes=kvb, pcie_bound_ms=bound)
                    if hit == 1.0:  # at 0.5 the prefill is in the TTFT too
                        out["over_pcie_bound"] = t / bound
                        out["layerwise"] = ctx.layerwise
                        out["graph"] = ctx.graph
                    return out

                measure(
                    "ttft", prompt, hit, lambda prompt=prompt, hit=hit: TtftPoint(ctx, prompt, hit),
                    gpu_bytes_needed(spec, prompt, hit), extra,
                )  # fmt: skip
    if "throughput" in args.ops:
        r, p, b, d, n = args.requests, args.request_prefix, args.batch, args.decode_tokens, args.new_tokens

        def tp_extra(t):
            return dict(
                kv_bytes=kv_bytes(spec, r * p), requests=r, batch=b, decode_tokens=d, new_tokens=n,
                tokens=r * d, elapsed_ms=t, fetch_thread=ctx.fetch_thread, graph=ctx.graph and not n,
            )  # fmt: skip

        measure(
            "throughput", p, 1.0, lambda: ThroughputPoint(ctx, r, p, b, d, n),
            throughput_bytes_needed(spec, b, p, d, n), tp_extra,
        )  # fmt: skip


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.deterministic:  # before torch starts cuBLAS
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    if args.deterministic:
        torch.use_deterministic_algorithms(True)

    if not torch.cuda.is_available():
        print("ferry.bench.kv_e2e needs a GPU", file=sys.stderr)
        return 2
    import transformers

    from ferry import kv

    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f} s] {msg}", file=sys.stderr, flush=True)

    props = torch.cuda.get_device_properties(0)
    gpu, date = props.name, datetime.date.today().isoformat()
    os.makedirs(args.out, exist_ok=True)  # --trace writes there during the runs
    records: List[dict] = []
    skipped: List[dict] = []
    errors = 0
    with torch.no_grad():
        samples = measure_pcie_peak(torch, kv, args.pcie_bytes)
        peak = statistics.median(samples)
        log(f"host->GPU peak {peak:.1f} GB/s ({format_size(args.pcie_bytes)} pinned copy, median of 5)")
        for name in args.models:
            error = None
            try:
                run_model(torch, kv, name, args, peak, gpu, date, records, skipped, log)
            except Exception as e:  # the other models still run, and what was measured is written
                traceback.print_exc()
                error = f"error: {type(e).__name__}: {e}"
            if error:  # out of the except clause: the traceback's frames (and their GPU buffers) are gone
                skipped.append(dict(model=name, reason=error))
                errors += 1
                gc.collect()
                torch.cuda.empty_cache()
    command = "python -m ferry.bench.kv_e2e " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = dict(
        gpu=gpu, date=date, command=command, sms=props.multi_processor_count, reps=args.reps,
        warmup=args.warmup, pcie_peak_gbps=peak, pcie_peak_gbps_samples=samples, pcie_bytes=args.pcie_bytes,
        page_tokens=PAGE_TOKENS, torch=torch.__version__, transformers=transformers.__version__,
        cache=args.cache, layout=args.layout, graph=args.graph, deterministic=args.deterministic,
        impls={i: IMPLS[i] for i in args.impls}, models={m: MODELS[m] for m in args.models},
        throughput=dict(
            requests=args.requests, request_prefix=args.request_prefix, batch=args.batch,
            decode_tokens=args.decode_tokens, new_tokens=args.new_tokens,
        ),
    )  # fmt: skip
    stem = result_stem(args.out, date, gpu, args.tag)
    os.makedirs(args.out, exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta, records=records, skipped=skipped), f, indent=1)
    report = format_report(records, skipped, meta)
    with open(stem + ".txt", "w") as f:
        f.write(report)
    if not args.no_plot:
        if not plot(records, stem + ".png", f"KV fetch end to end, {gpu}"):
            print("note: no plot (matplotlib is not installed, or nothing was measured)", file=sys.stderr)
    print(report, end="")
    failures = check_failures(records)
    failed_impls = sum(1 for s in skipped if s.get("impl"))
    log(f"results: {stem}.*")
    return 1 if failures or errors or failed_impls else 0


if __name__ == "__main__":
    sys.exit(main())

"""The one-token step after a 100%-hit fetch, without the fetch: where its
time goes with transformers' DynamicCache (which concatenates, copying the
whole past at every step) and with the in-place cache the end-to-end
benchmark uses by default (new tokens written into room after the fetched
pages).

    python bench/probes/kv_step.py [--model llama-3.1-8b] [--tokens 32768] [--reps 5] [--profile]

Builds the model as ferry.bench.kv_e2e does (random weights, bf16, sdpa),
fills a past of --tokens tokens of random KV on the GPU in 16-token pages,
and times one next_token call per cache: from an event before to one
recorded after the call returns (so the later of the GPU's and the host's
time) and the host's time alone. The GPU's own time is the profiler's
total (--profile). Median of --reps after two
warm-ups, no graphs. The two caches' tokens must match. --profile prints
each one's ten costliest kernels and their total.
"""

import argparse
import statistics
import time

import torch
from ferry.bench import kv_e2e as E


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    spec = E.MODELS[a.model]
    torch.manual_seed(1)
    import transformers

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}"
    )
    model = E.build_model(torch, spec)
    kw = E._cache_kwarg(model)
    n = a.tokens // E.PAGE_TOKENS
    shape = (n + 1, E.PAGE_TOKENS, spec["kv_heads"], spec["head_dim"])
    pages = [torch.randn(shape, dtype=torch.bfloat16, device="cuda") for _ in range(2 * spec["layers"])]
    full = [(E.as_bhsd(pages[2 * i]), E.as_bhsd(pages[2 * i + 1])) for i in range(spec["layers"])]
    past = n * E.PAGE_TOKENS
    pairs = [(k[:, :, :past], v[:, :, :past]) for k, v in full]
    ids = torch.randint(spec["vocab"], (1, 1), device="cuda")

    variants = ["copy", "in-place"]
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    tokens = {}
    with torch.no_grad():
        for cache_kind in variants:
            room = full if cache_kind == "in-place" else None

            def step():
                cache = E.make_cache(pairs, allow_copy=True, room=room)
                return E.next_token(model, kw, ids, cache)

            times, host = [], []
            for r in range(2 + a.reps):
                torch.cuda.synchronize()
                s, e = ev(), ev()
                s.record()
                t0 = time.perf_counter()
                tok = step()
                t1 = time.perf_counter()
                e.record()
                e.synchronize()
                if r >= 2:
                    times.append(s.elapsed_time(e))
                    host.append((t1 - t0) * 1e3)
            tokens[cache_kind] = tok.item()
            print(
                f"cache {cache_kind:<8} step {statistics.median(times):7.2f} ms (events: the later of GPU and host), host "
                f"{statistics.median(host):6.2f} ms (samples {', '.join(f'{t:.2f}' for t in times)}); "
                f"token {tok.item()}"
            )
            if a.profile:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    step()
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10))
    if len(set(tokens.values())) > 1:
        print(f"FAIL: the caches' tokens differ: {tokens}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

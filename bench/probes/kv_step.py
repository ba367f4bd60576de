"""The one-token step after a 100%-hit fetch, without the fetch: where its
time goes, for each cache and attention the end-to-end benchmark offers.

    python bench/probes/kv_step.py [--model llama-3.1-8b] [--tokens 32768] [--reps 5] [--profile]

Builds the model as ferry.bench.kv_e2e does (random weights, bf16), fills a
past of --tokens tokens of random KV on the GPU in 16-token pages, and times
one next_token call per variant: DynamicCache's concatenation or the
in-place cache, transformers' sdpa or the split-past decode attention
(ferry.bench.decode_attention). Median of --reps after two warm-ups (CUDA
events, no graphs). The variants' tokens are compared (they round
differently, so a mismatch is printed, not fatal), and the decode
attention's output is checked first against an fp32 reference on one
layer's tensors (exit 1 if it disagrees). --profile prints each variant's ten costliest
kernels.
"""

import argparse
import statistics

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

    # decode_attention against sdpa on one layer's past (fp32 reference of both).
    q = torch.randn(1, spec["heads"], 1, spec["head_dim"], dtype=torch.bfloat16, device="cuda")
    k, v = full[0]
    g = spec["heads"] // spec["kv_heads"]
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(g, dim=1), v.float().repeat_interleave(g, dim=1)
    ).transpose(1, 2)
    E.use_decode_attention(False)
    mine, _ = E.decode_attention(model.model.layers[0].self_attn, q, k, v, None)
    err = (mine.float() - ref).abs().max().item()
    print(f"decode_attention against an fp32 reference on one layer: max abs error {err:.2e}")
    if err > 5e-2:
        print("FAIL: decode_attention disagrees with the reference")
        return 1

    variants = [("copy", "sdpa"), ("in-place", "sdpa"), ("copy", "decode"), ("in-place", "decode")]
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    tokens = {}
    with torch.no_grad():
        for cache_kind, attention in variants:
            E.use_decode_attention(attention == "decode")
            room = full if cache_kind == "in-place" else None

            def step():
                cache = E.make_cache(pairs, allow_copy=True, room=room)
                return E.next_token(model, kw, ids, cache)

            times = []
            for r in range(2 + a.reps):
                torch.cuda.synchronize()
                s, e = ev(), ev()
                s.record()
                tok = step()
                e.record()
                e.synchronize()
                if r >= 2:
                    times.append(s.elapsed_time(e))
            tokens[(cache_kind, attention)] = tok.item()
            calls = E._DECODE_CALLS[0]
            print(
                f"cache {cache_kind:<8} attention {attention:<6} step {statistics.median(times):7.2f} ms "
                f"(samples {', '.join(f'{t:.2f}' for t in times)}); token {tok.item()}; "
                f"decode_attention calls so far {calls}"
            )
            if a.profile:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    step()
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10))
    E.use_decode_attention(False)
    if len(set(tokens.values())) > 1:
        print(f"note: the variants' tokens differ: {tokens}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

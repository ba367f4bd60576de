"""Pure parts of the end-to-end KV benchmark (ferry.bench.kv_e2e): options,
model shapes, host page ids, records, ratios, the table and the plot. No
torch needed: the module imports torch only inside its GPU functions."""

import subprocess
import sys

import pytest
from ferry.bench import kv_e2e as E


def test_import_does_not_import_torch():
    code = (
        "import sys, ferry; before = 'torch' in sys.modules; import ferry.bench.kv_e2e; "
        "sys.exit(0 if before or 'torch' not in sys.modules else 1)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_defaults():
    a = E.parse_args([])
    assert a.models == ["qwen2.5-0.5b", "llama-3.2-1b", "llama-3.1-8b"]
    assert a.prompts == [4096, 8192, 32768] and a.hits == [1.0, 0.5]
    assert a.ops == ["ttft", "throughput"]
    assert a.impls == ["ferry-auto", "ferry-zero-sm", "per-page", "batched", "kernel"]
    assert (a.reps, a.warmup, a.tag, a.no_plot) == (5, 2, "", False)
    assert (a.requests, a.request_prefix, a.batch, a.decode_tokens) == (16, 2048, 4, 4)
    assert a.pcie_bytes == 1 << 30
    assert (a.layerwise, a.fetch_thread) == (False, False)
    assert (a.cache, a.graph, a.trace, a.layout) == ("in-place", True, False, "per-layer")
    assert a.sides == "pages" and E.parse_args(["--sides", "lists"]).sides == "lists"
    b = E.parse_args(["--layerwise", "--fetch-thread", "--layout", "stacked"])
    assert (b.layerwise, b.fetch_thread, b.layout) == (True, True, "stacked")
    assert E.parse_args(["--layout", "page-first"]).layout == "page-first"
    # The field's batched call copies every tensor's page by itself, whatever the layout.
    assert E.IMPLS["batched"]["pitched"] is False


def test_options():
    a = E.parse_args(
        "--models Llama-3.1-8B --prompts 4096,32768 --hits 1.0 --reps 3 --warmup 1 "
        "--out d --tag t --no-plot --impls per-page,ferry-auto --ops ttft".split()
    )
    assert a.models == ["llama-3.1-8b"] and a.prompts == [4096, 32768] and a.hits == [1.0]
    assert (a.reps, a.warmup, a.out, a.tag, a.no_plot) == (3, 1, "d", "t", True)
    assert a.impls == ["per-page", "ferry-auto"] and a.ops == ["ttft"]
    # A prompt of whole pages but an odd number of them: fine at hit 1.0 only.
    assert E.parse_args(["--prompts", "4112", "--hits", "1.0"]).prompts == [4112]


@pytest.mark.parametrize(
    "argv",
    [
        ["--models", "gpt-2"],
        ["--prompts", "4100"],
        ["--prompts", "4112"],  # half of it is not whole 16-token pages
        ["--prompts", "lots"],
        ["--hits", "0.7"],
        ["--impls", "nccl"],
        ["--ops", "prefill"],
        ["--requests", "10", "--batch", "4"],
        ["--request-prefix", "100"],
        ["--reps", "0"],
        ["--layout", "cross-layer"],
    ],
)
def test_bad_options(argv, capsys):
    with pytest.raises(SystemExit) as e:
        E.parse_args(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


def test_model_shapes():
    qwen, small, big = (E.MODELS[m] for m in ("qwen2.5-0.5b", "llama-3.2-1b", "llama-3.1-8b"))
    # One 16-token page of one layer's K: 16 x kv heads x head dim x 2 bytes.
    assert (E.page_bytes(qwen), E.page_bytes(small), E.page_bytes(big)) == (4096, 16384, 32768)
    assert E.kv_bytes(big, 32768) == 4 << 30  # the "4 GiB of KV" for the 8B at 32K
    assert E.kv_bytes(qwen, 16) == 2 * 24 * E.page_bytes(qwen)
    # The public models' parameter counts (weights tied in the two small ones).
    assert E.param_count(qwen) == pytest.approx(0.494e9, rel=0.01)
    assert E.param_count(small) == pytest.approx(1.236e9, rel=0.01)
    assert E.param_count(big) == pytest.approx(8.03e9, rel=0.01)


def test_memory_estimates():
    big = E.MODELS["llama-3.1-8b"]
    full = E.gpu_bytes_needed(big, 32768, 1.0)
    assert 8 << 30 <= full < 10 << 30  # fetched pages + the cache the model builds + one layer's work
    assert E.gpu_bytes_needed(big, 4096, 1.0) < full
    assert E.gpu_bytes_needed(big, 32768, 0.5) > E.kv_bytes(big, 32768)  # prefill of 16K tokens on top
    assert E.throughput_bytes_needed(big, 4, 2048, 4) >= 2 * E.kv_bytes(big, 4 * 2048)
    # New tokens prefilled per request: their room in the cache and their working set.
    assert E.throughput_bytes_needed(big, 2, 8192, 1, 1024) > E.throughput_bytes_needed(big, 2, 8192, 1) + (
        2 * E.kv_bytes(big, 2 * 1024)
    )


def test_host_page_ids():
    ids = E.host_page_ids(2048, 2048, seed=1)
    assert sorted(ids) == list(range(2048)) and ids != sorted(ids)  # a permutation, scattered
    assert ids == E.host_page_ids(2048, 2048, seed=1) and ids != E.host_page_ids(2048, 2048, seed=2)
    part = E.host_page_ids(2048, 256, seed=3)
    assert len(set(part)) == 256 and all(0 <= i < 2048 for i in part)
    adjacent = sum(1 for a, b in zip(part, part[1:]) if b == a + 1)
    assert adjacent < 8  # no contiguous runs for the batched strategy to merge, but by chance
    for bad in ((10, 11), (10, 0)):
        with pytest.raises(ValueError):
            E.host_page_ids(*bad, seed=0)


def test_new_tokens_argument():
    assert E.parse_args([]).new_tokens == 0
    assert E.parse_args(["--ops", "throughput", "--new-tokens", "1024"]).new_tokens == 1024
    with pytest.raises(SystemExit):
        E.parse_args(["--ops", "throughput", "--new-tokens", "-1"])


def test_host_pool_pages():
    assert E.host_pool_pages(E.parse_args([])) == 2048  # 32K tokens, and 16 x 2K-token requests
    assert E.host_pool_pages(E.parse_args(["--prompts", "4096", "--ops", "ttft"])) == 256
    a = E.parse_args(["--ops", "throughput", "--requests", "8", "--request-prefix", "1024", "--batch", "2"])
    assert E.host_pool_pages(a) == 8 * 1024 // 16


def test_rounds_alternate():
    impls = ["a", "b", "c"]
    rounds = [E.rotated(impls, k) for k in range(3)]
    assert rounds[1] == ["b", "c", "a"]
    assert sorted(r[0] for r in rounds) == impls  # each impl runs first once in len(impls) rounds
    assert all(sorted(r) == impls for r in rounds)
    assert E.rotated([], 4) == []
    assert E.check_order(["ferry-auto", "batched", "per-page"]) == ["per-page", "ferry-auto", "batched"]


def test_make_record():
    r = E.make_record(
        "ttft", "llama-3.1-8b", 32768, 1, "ferry-auto", 91.5, "NVIDIA H100 80GB HBM3", "2026-11-25",
        kv_bytes=4 << 30, pcie_peak_gbps=55.0,
    )  # fmt: skip
    assert r == dict(
        op="ttft", model="llama-3.1-8b", prompt_tokens=32768, hit=1.0, impl="ferry-auto", ttft_ms=91.5,
        gpu="NVIDIA H100 80GB HBM3", date="2026-11-25", kv_bytes=4 << 30, pcie_peak_gbps=55.0,
    )  # fmt: skip
    t = E.make_record("throughput", "qwen2.5-0.5b", 2048, 1.0, "kernel", 1234.0, "g", "d")
    assert t["tokens_per_s"] == 1234.0 and "ttft_ms" not in t
    with pytest.raises(ValueError):
        E.make_record("prefill", "m", 1, 1.0, "i", 1.0, "g", "d")


def _records():
    rec = lambda op, impl, v, prompt=32768, hit=1.0, **kw: E.make_record(
        op, "llama-3.1-8b", prompt, hit, impl, v, "GPU", "2026-11-25", **kw
    )
    out = [
        rec(
            "ttft",
            i,
            t,
            kv_bytes=4 << 30,
            pcie_bound_ms=80.0,
            **({"fetch_ms": 84.0} if i == "ferry-auto" else {}),
        )
        for i, t in (
            ("ferry-auto", 90.0),
            ("ferry-zero-sm", 100.0),
            ("per-page", 300.0),
            ("batched", 120.0),
            ("kernel", 95.0),
        )
    ]
    out += [
        rec("ttft", i, t, hit=0.5, kv_bytes=2 << 30, pcie_bound_ms=40.0)
        for i, t in (("ferry-auto", 500.0), ("per-page", 650.0))
    ]
    out += [
        rec("throughput", i, v, prompt=2048, kv_bytes=4 << 30)
        for i, v in (("ferry-auto", 1100.0), ("per-page", 500.0), ("kernel", 1000.0))
    ]
    return out


def test_speedup_direction():
    assert E.speedup("ttft", 50.0, 100.0) == 2.0  # half the time: twice as good
    assert E.speedup("throughput", 110.0, 100.0) == pytest.approx(1.1)  # more tokens/s: better


def test_ratio_rows():
    rows = {(r["op"], r["hit"], r["impl"]): r for r in E.ratio_rows(_records())}
    auto = rows[("ttft", 1.0, "ferry-auto")]
    assert auto["vs"]["per-page"] == pytest.approx(300 / 90)
    assert auto["best_alt"] == "kernel" and auto["vs_best"] == pytest.approx(95 / 90)
    assert auto["over_pcie_bound"] == pytest.approx(90 / 80)
    assert auto["fetch_over_pcie_bound"] == pytest.approx(84 / 80)
    zero = rows[("ttft", 1.0, "ferry-zero-sm")]
    assert "fetch_over_pcie_bound" not in zero  # no fetch time recorded
    assert zero["vs_best"] == pytest.approx(0.95)  # slower than the kernel: below 1
    half = rows[("ttft", 0.5, "ferry-auto")]
    assert half["vs"] == {"per-page": pytest.approx(1.3)} and "over_pcie_bound" not in half
    tp = rows[("throughput", 1.0, "ferry-auto")]
    assert tp["vs"]["kernel"] == pytest.approx(1.1) and tp["best_alt"] == "kernel"
    assert ("throughput", 1.0, "ferry-zero-sm") not in rows  # not measured: no row


def test_tables():
    recs = _records()
    table = E.format_table(recs)
    lines = table.splitlines()
    assert "ferry-zero-sm" in lines[0] and "kernel" in lines[0]
    assert len(lines) == 1 + 3  # header + one row per point
    assert "300.0" in lines[1] and "4G" in lines[1] and "80.0" in lines[1]
    assert "1100.0" in lines[3] and "tok/s" in lines[3]
    ratios = E.format_ratios(recs)
    assert (
        "3.33" in ratios and "1.06" in ratios and "1.12" in ratios and "1.05" in ratios
    )  # x per-page, x best (kernel), TTFT/bound, fetch/bound
    assert "kernel" in ratios


def test_check_failures_and_report():
    recs = _records()
    assert E.check_failures(recs) == []
    recs[3] = dict(recs[3], kv_equal=False, token_equal=True)
    recs[4] = dict(recs[4], kv_equal=True, token_equal=False, token_ref="per-page")
    failures = E.check_failures(recs)
    assert len(failures) == 2 and "batched: kv_equal False" in failures[0] and "per-page" in failures[1]
    assert "not deterministic" not in failures[1]
    recs[4] = dict(recs[4], ref_repeatable=False)
    assert "own two runs differ too" in E.check_failures(recs)[1]
    meta = dict(command="python -m ferry.bench.kv_e2e", gpu="GPU", pcie_peak_gbps=55.2, pcie_bytes=1 << 30)
    meta.update(reps=5, warmup=2, torch="2.11", transformers="5.0")
    skipped = [dict(op="ttft", model="llama-3.1-8b", prompt_tokens=131072, hit=1.0, reason="needs 20 GiB")]
    text = E.format_report(recs, skipped, meta)
    assert "55.2 GB/s" in text and "1G pinned copy" in text and "needs 20 GiB" in text
    assert "checks FAILED" in text and E.format_table(recs) in text


def test_result_stem():
    assert E.result_stem("bench/results", "2026-11-25", "NVIDIA H100 80GB HBM3") == (
        "bench/results/2026-11-25-NVIDIA-H100-80GB-HBM3-kv-e2e"
    )
    assert E.result_stem("d", "2026-11-25", "NVIDIA H200", "rerun").endswith(
        "2026-11-25-NVIDIA-H200-kv-e2e-rerun"
    )


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "kv.png"
    assert E.plot(_records(), str(path), "test")
    assert path.stat().st_size > 1000
    assert not E.plot([], str(tmp_path / "none.png"), "empty")


def test_skip_label():
    assert E.skip_label(dict(model="llama-3.1-8b", reason="x")) == "llama-3.1-8b"
    point = dict(op="ttft", model="qwen2.5-0.5b", prompt_tokens=32768, hit=0.5, reason="x")
    assert E.skip_label(point) == "ttft qwen2.5-0.5b 32768 tokens hit 0.5"
    assert E.skip_label(dict(point, impl="kernel")).endswith("hit 0.5 kernel")


def _fake_torch():
    import types

    return types.SimpleNamespace(
        cuda=types.SimpleNamespace(current_device=lambda: 0, set_device=lambda d: None)
    )


def test_fetch_thread_runs_each_fetch_only_once_allowed(monkeypatch):
    import threading
    import time

    monkeypatch.setattr(E._FetchThread, "LIMIT_S", 5.0)
    done, gate = [], threading.Event()

    def fetch(w):
        done.append(w)
        if w == 1:
            gate.set()

    t = E._FetchThread(_fake_torch(), fetch, 3)
    t.allow(0)
    t.recorded(0)
    time.sleep(0.2)  # a thread that ignored the missing allow(1) would have run fetch(1) by now
    assert done == [0]
    t.allow(1)
    assert gate.wait(5) and done == [0, 1]
    t.allow(2)
    t.recorded(2)
    t.join()
    assert done == [0, 1, 2]
    t.allow(5)  # past the last wave: nothing


def test_fetch_thread_hands_its_error_to_the_caller(monkeypatch):
    monkeypatch.setattr(E._FetchThread, "LIMIT_S", 5.0)

    def fetch(w):
        raise RuntimeError(f"wave {w} failed")

    t = E._FetchThread(_fake_torch(), fetch, 2)
    t.allow(0)
    with pytest.raises(RuntimeError, match="wave 0 failed"):
        t.recorded(0)
    with pytest.raises(RuntimeError):
        t.recorded(1)  # never submitted: the first error again, not a wait
    with pytest.raises(RuntimeError):
        t.join()


def test_fetch_thread_join_stops_before_fetches_not_allowed(monkeypatch):
    """The decoding thread failed after allowing wave 0: join() must leave
    wave 1 unsubmitted (a late fetch would write into freed buffers)."""
    monkeypatch.setattr(E._FetchThread, "LIMIT_S", 5.0)
    done = []
    t = E._FetchThread(_fake_torch(), done.append, 3)
    t.allow(0)
    t.recorded(0)
    t.join()
    t.allow(1)
    import time

    time.sleep(0.2)
    assert done == [0]


def test_graph_needs_the_in_place_cache():
    assert E.parse_args(["--graph"]).graph
    assert not E.parse_args(["--no-graph"]).graph
    assert not E.parse_args(["--cache", "copy"]).graph  # off by default there
    with pytest.raises(SystemExit):
        E.parse_args(["--graph", "--cache", "copy"])


def _ev(cat, name, ts, dur):
    return dict(ph="X", cat=cat, name=name, ts=ts, dur=dur)


def test_timeline_summary_splits_fetch_from_model():
    trace = {
        "traceEvents": [
            _ev("cuda_runtime", "cudaLaunchKernel", 990, 5),
            _ev("kernel", "page_gather(PageKernelArgs)", 1000, 4000),  # fetch: 0-4 ms
            _ev("kernel", "nvjet_gemm", 2000, 1000),  # model, before the fetch's end: 1 ms
            _ev("kernel", "nvjet_gemm", 5000, 1000),  # model, after: 1 ms
            _ev("kernel", "sdpa", 4500, 1000),  # straddles: 0.5 before, 0.5 after
            _ev("cuda_runtime", "cudaLaunchKernel", 3000, 5),
            _ev("cuda_runtime", "cudaEventSynchronize", 9000, 5),  # not a launch: ignored
            dict(ph="i", cat="kernel", name="instant", ts=0),  # not a complete event: ignored
        ]
    }
    t = E.timeline_summary(trace)
    assert t["fetch_end_ms"] == 4.0 and t["end_ms"] == 5.0 and t["tail_ms"] == 1.0
    assert t["after_busy_ms"] == 1.5 and t["before_busy_ms"] == 1.5
    assert t["model_events"] == 3 and t["model_events_after"] == 2
    assert t["last_launch_ms"] == 2.0


def test_timeline_summary_copy_engine_fetch_and_empty():
    trace = {
        "traceEvents": [
            _ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 0, 3000),
            _ev("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 3000, 100),  # the model's own copy
            _ev("kernel", "gemm", 3100, 900),
        ]
    }
    t = E.timeline_summary(trace)
    assert t["fetch_end_ms"] == 3.0 and t["tail_ms"] == 1.0 and t["after_busy_ms"] == 1.0
    assert t["last_launch_ms"] is None
    assert E.timeline_summary({"traceEvents": []}) == {}


def test_a_side_is_made_once_whole_and_layer_by_layer():
    """Each fetch's side, as kv.Pages made at set-up (--sides pages) or the
    lists themselves: the whole side, and each layer's K and V in order."""
    import types

    made = []

    class Pages:
        def __init__(self, tensors):
            made.append(list(tensors))
            self.tensors = list(tensors)

    tensors = [f"t{i}" for i in range(6)]  # 3 layers' K and V
    side = E.Side(types.SimpleNamespace(kv=types.SimpleNamespace(Pages=Pages), pages=True), tensors)
    assert side.all.tensors == tensors
    assert [p.tensors for p in side.layers] == [["t0", "t1"], ["t2", "t3"], ["t4", "t5"]]
    assert len(made) == 4  # once each, at set-up
    side = E.Side(types.SimpleNamespace(kv=None, pages=False), tensors)
    assert side.all == tensors and side.layers == [["t0", "t1"], ["t2", "t3"], ["t4", "t5"]]

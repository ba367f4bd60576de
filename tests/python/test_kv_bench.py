"""The KV benchmark's pure parts (no GPU): which points run, the records, the
auto table it derives, its tables; and what `ferry bench` runs where."""

import contextlib
import statistics
import threading
import time
import types

import pytest
from ferry.bench import kv
from ferry.cli import bench_parts


def rec(op, impl, page, pages, time_us, wrong=0, submitted="inline"):
    return kv.record(op, impl, page, pages, time_us, 1.0, 0, submitted, "G", "2026-11-25", wrong)


def test_points_respect_the_byte_budget():
    pts = kv.points([4096, 1 << 20], [64, 4096], 1 << 30)
    assert pts == [(4096, 64), (4096, 4096), (1 << 20, 64)]  # 1 MiB x 4096 = 4 GiB is skipped


def test_points_and_records_count_every_tensor():
    # 16 KB x 4096 pages x 64 tensors = 4 GiB: over a 1 GiB budget; 1024 pages fit.
    assert kv.points([16 << 10], [1024, 4096], 1 << 30, tensors=64) == [(16 << 10, 1024)]
    one = kv.record("fetch", "batched", 4096, 1000, 1000.0, 1.0, 0, "inline", "G", "d")
    many = kv.record("fetch", "batched", 4096, 1000, 1000.0, 1.0, 0, "inline", "G", "d", 0, 48, "page-first")
    assert many["gbps"] == pytest.approx(48 * one["gbps"], rel=1e-3)
    assert (one["tensors"], one["layout"], many["tensors"], many["layout"]) == (1, "one", 48, "page-first")


def test_multi_tensor_options_checked():
    o = kv.options(kv.parse_args(["--tensors", "48", "--layout", "page-first"]))
    assert (o["tensors"], o["layout"]) == (48, "page-first")
    assert kv.options(kv.parse_args([]))["tensors"] == 1
    with pytest.raises(SystemExit, match="--tensors"):
        kv.options(kv.parse_args(["--tensors", "0"]))
    with pytest.raises(SystemExit, match="--layout"):
        kv.options(kv.parse_args(["--tensors", "4", "--layout", "layer-first"]))
    # The auto table decides by rows: it is measured with one tensor per page.
    with pytest.raises(SystemExit, match="--tune-out"):
        kv.main(["--tensors", "4", "--tune-out", "/tmp/never-written.json"])


def test_the_field_batched_call_is_never_pitched():
    assert kv.INLINE["vllm-batched"]["pitched"] is False


def test_record_counts_both_directions():
    r = rec("both", "batched", 1 << 20, 1000, 1000.0)
    assert r["op"] == "kv_both" and r["gbps"] == pytest.approx(2 * (1 << 20) * 1000 / 1e-3 / 1e9, rel=1e-3)
    assert rec("fetch", "batched", 1 << 20, 1000, 1000.0)["gbps"] == pytest.approx(r["gbps"] / 2, rel=1e-3)


def test_tune_rules_pick_the_fastest_and_never_a_kernel_without_sms():
    recs = []
    for page, kernel_us, batched_us in ((4096, 10, 50), (1 << 20, 100, 80)):
        for pages in (64, 1024):
            recs += [
                rec("fetch", "kernel", page, pages, kernel_us),
                rec("fetch", "batched", page, pages, batched_us),
                rec("fetch", "per-page", page, pages, 500),
                rec("fetch", "streams", page, pages, batched_us + 1),
            ]
    recs.append(rec("fetch", "batched", 4096, 64, 1, wrong=1))  # a wrong result never wins
    rules = kv.tune_rules(recs)
    assert [r["direction"] for r in rules] == ["h2d"] * 4
    small, large = rules[0], rules[-1]
    assert small["strategy"] == "kernel" and small["zero_sm"] == "batched"
    assert small["max_copy_bytes"] == int((4096 * (1 << 20)) ** 0.5) and small["max_copies"] == 256
    assert large["strategy"] == "batched" and large["max_copy_bytes"] is None and large["max_copies"] is None
    assert all(r["zero_sm"] != "kernel" for r in rules)


def test_tune_rules_take_streams_only_where_it_wins_clearly():
    recs = []
    for pages, streams_us in ((1024, 95), (4096, 80)):  # 5% faster: batched; 20% faster: streams
        recs += [
            rec("fetch", "kernel", 16384, pages, 200),
            rec("fetch", "batched", 16384, pages, 100),
            rec("fetch", "streams", 16384, pages, streams_us),
        ]
    rules = kv.tune_rules(recs)
    assert [(r["strategy"], r["zero_sm"]) for r in rules] == [("batched", "batched"), ("streams", "streams")]


def test_tune_rules_take_each_modes_median_over_passes():
    # Batched fast in one pass of three, slow in two; streams steady in between: by medians, streams
    # (20% faster than batched's median), where the one fast pass alone would have given batched.
    recs = []
    for batched_us, streams_us in ((60, 80), (100, 81), (105, 79)):
        recs += [
            rec("fetch", "kernel", 16384, 1024, 200),
            rec("fetch", "batched", 16384, 1024, batched_us),
            rec("fetch", "streams", 16384, 1024, streams_us),
        ]
    assert [(r["strategy"], r["zero_sm"]) for r in kv.tune_rules(recs)] == [("streams", "streams")]
    assert [(r["strategy"], r["zero_sm"]) for r in kv.tune_rules(recs[:3])] == [("batched", "batched")]
    medians = {r["impl"]: r["time_us"] for r in kv.median_over_passes(recs)}
    assert medians == {"kernel": 200, "batched": 100, "streams": 80}
    # A wrong result of one pass is left out; the others still count.
    recs.append(rec("fetch", "batched", 16384, 1024, 1, wrong=1))
    assert [(r["strategy"], r["zero_sm"]) for r in kv.tune_rules(recs)] == [("streams", "streams")]


def test_tables_and_targets_read_the_records():
    recs = [
        rec("fetch", "per-page", 4096, 64, 300),
        rec("fetch", "kernel", 4096, 64, 30),
        rec("fetch", "auto", 4096, 64, 31),
        rec("fetch", "auto-zero-sm", 4096, 64, 100),
        rec("fetch", "ahead-batched", 4096, 64, 25, submitted="ahead"),
    ]
    table = kv.format_table(recs)
    assert "fetch" in table and "*" in table
    lines = "\n".join(kv.target_lines(recs))
    assert "within 10% at 1 of 1" in lines
    assert "lowest 3.00x" in lines
    assert "<= 1 at 1 of 1" in lines


def test_kernel_grid_experiment_shows_but_sets_no_target():
    recs = [
        rec("fetch", "kernel", 4096, 64, 30),
        rec("fetch", "kernel-132b", 4096, 64, 20),  # faster, on every SM
        rec("fetch", "auto", 4096, 64, 31),
    ]
    head, row = kv.format_table(recs).splitlines()[1:3]
    assert "kernel-132b" in head and "*" in row  # its column, and the best of the point marked there
    assert "within 10% at 1 of 1" in "\n".join(kv.target_lines(recs))  # auto against the 16-block kernel
    assert "kernel-132b" not in kv.IMPLS and "kernel-132b" in kv.ALL_IMPLS


def test_urgent_page_sizes_parse_and_print():
    opts = kv.options(kv.parse_args(["--urgent", "--urgent-pages", "16K,64K"]))
    assert opts["urgent"] and opts["urgent_pages"] == [16 << 10, 64 << 10]
    assert kv.options(kv.parse_args([]))["urgent_pages"] == [16 << 10, 64 << 10, 256 << 10]
    extra = [{"op": "kv_urgent", "impl": "other-stream", "page_bytes": 64 << 10, "pages": 32,
              "latency_us": 18000.0, "bulk_bytes": 1 << 30, "bulk": "bulk at once"},
             {"op": "kv_bulk", "impl": "bulk in 4M slices", "bytes": 1 << 30, "gbps": 53.25}]  # fmt: skip
    text = kv.summary({"gpu": "G", "date": "d", "pcie_peak_gbps": 55, "records": [], "extra": extra})
    assert "urgent 32 x 64K fetch during a 1G bulk at once fetch, other-stream: 18000 us" in text
    assert "1G fetch of 1 MB pages, bulk in 4M slices: 53.2 GB/s" in text


def test_options_refuse_unknown_names():
    with pytest.raises(SystemExit, match="--ops"):
        kv.options(kv.parse_args(["--ops", "fetch,push"]))
    with pytest.raises(SystemExit, match="--impls"):
        kv.options(kv.parse_args(["--impls", "magic"]))


def test_ferry_bench_runs_what_the_machine_allows():
    assert bench_parts("", 1, False) == (
        ["kv"],
        ["collectives against NCCL: they need at least 2 GPUs; 1 visible"],
    )
    assert bench_parts("", 4, False) == (["kv", "collectives"], [])
    assert bench_parts("", 4, True) == (["collectives"], [])  # --ops/--impls name the collectives
    assert bench_parts("kv", 8, True) == (["kv"], [])
    assert bench_parts("multipath", 2, False) == (["multipath"], [])
    assert bench_parts("multipath,kv", 0, False) == (
        [],
        ["multipath copies: no GPU visible", "KV transfers: no GPU visible"],
    )
    with pytest.raises(SystemExit, match="--only"):
        bench_parts("nccl", 2, False)


# ---- measure_point with stand-ins for torch and ferry.kv (no GPU): the
# benchmark's plumbing and its byte check, for one tensor per page and many.


class _Ids(list):
    def to(self, device):
        return self


class _Rows:
    """Pages as rows of bytes; indexing by an id list gives those rows (shared)."""

    def __init__(self, rows, cuda=False):
        self.rows, self.is_cuda, self.device = rows, cuda, "cuda" if cuda else "cpu"

    shape = property(lambda self: (len(self.rows), len(self.rows[0])))

    def cpu(self):
        return self

    def __getitem__(self, ids):
        return _Rows([self.rows[i] for i in ids], self.is_cuda)

    def __setitem__(self, ids, value):
        for i in ids:
            self.rows[i][:] = bytes([value]) * len(self.rows[i])

    def __ne__(self, other):
        return _Count(sum(a != b for a, b in zip(self.rows, other.rows)))


class _Count(int):
    def any(self, dim):
        return self

    def sum(self):
        return self


def _stand_ins(copies_bytes):
    import random
    import types

    class Event:
        record = synchronize = lambda self, *a: None
        elapsed_time = lambda self, other: 1.0  # noqa: E731

    class Stream:
        wait_event = wait_stream = lambda self, *a: None

    def copy(dst, src, d, s, **kw):
        for dt, st in zip(kv._as_list(dst), kv._as_list(src)):
            for i, j in zip(d, s):
                if copies_bytes:
                    dt.rows[i][:] = st.rows[j]
        return {"sms": 0}

    class Prepared:
        def __init__(self, *args):
            self.args = args

        arm = wait = lambda self, stream: None
        trigger_on = lambda self, stream: copy(*self.args)  # noqa: E731

    torch = types.SimpleNamespace(
        tensor=lambda x, device="cpu": _Ids(x),
        cuda=types.SimpleNamespace(
            Event=lambda enable_timing: Event(), Stream=Stream, synchronize=lambda: None
        ),
    )
    ferry_kv = types.SimpleNamespace(
        copy_blocks=copy,
        prepare=Prepared,
        batched_once=lambda dst, src, d, s, stream, any_order: copy(dst, src, d, s),
    )

    class Buffers:
        def sides(self, half, page_bytes, n, tensors, layout):
            rng = random.Random(half)
            side = [[bytearray(rng.randbytes(page_bytes)) for _ in range(n)] for _ in range(tensors)]
            gpu = [[bytearray(rng.randbytes(page_bytes)) for _ in range(n)] for _ in range(tensors)]
            h, g = [_Rows(t) for t in side], [_Rows(t, True) for t in gpu]
            return (h[0], g[0]) if tensors == 1 else (h, g)

    return torch, ferry_kv, Buffers()


@pytest.mark.parametrize("tensors,layout", [(1, "stacked"), (4, "page-first"), (3, "stacked")])
def test_measure_point_checks_every_tensor(tensors, layout):
    impls = ["batched", "vllm-batched", "ahead-batched", "kernel-gpu-ids"]
    for op in ("fetch", "save", "both"):
        torch, ferry_kv, bufs = _stand_ins(copies_bytes=True)
        recs = kv.measure_point(torch, ferry_kv, bufs, op, 64, 8, impls, 2, 1, "G", "d", tensors, layout)
        assert [r["impl"] for r in recs] == impls
        assert all(r["wrong"] == 0 and r["tensors"] == tensors for r in recs), recs
        # A transfer that copies nothing leaves the poison: every page of every tensor is counted wrong.
        torch, ferry_kv, bufs = _stand_ins(copies_bytes=False)
        recs = kv.measure_point(torch, ferry_kv, bufs, op, 64, 8, impls, 2, 1, "G", "d", tensors, layout)
        sides = 2 if op == "both" else 1
        assert all(r["wrong"] == 8 * tensors * sides for r in recs), recs


def test_measure_point_runs_every_impl_once_a_round_in_orders_that_vary():
    torch, ferry_kv, bufs = _stand_ins(copies_bytes=True)
    calls = []
    copy = ferry_kv.copy_blocks

    def logged(dst, src, d, s, **kw):
        calls.append(kw["mode"])
        return copy(dst, src, d, s, **kw)

    ferry_kv.copy_blocks = logged
    impls = ["batched", "kernel", "per-page"]
    recs = kv.measure_point(torch, ferry_kv, bufs, "fetch", 64, 8, impls, 7, 1, "G", "d")
    assert [r["impl"] for r in recs] == impls and all(r["wrong"] == 0 for r in recs)
    modes = {"batched", "kernel", "per_page"}
    # A warm-up round and seven measured ones, each every impl once; then one checked call each.
    rounds = [calls[i : i + 3] for i in range(0, 24, 3)]
    assert all(set(r) == modes for r in rounds), rounds
    assert len({tuple(r) for r in rounds}) > 1, rounds  # not one fixed order
    assert len({r[0] for r in rounds}) > 1, rounds  # nor one impl always first
    assert calls[24:] == ["batched", "kernel", "per_page"]


def test_measure_point_keeps_only_the_measured_rounds():
    """The n-th timed call (warm-up or not) takes n ms: an impl's median
    comes from its measured rounds, never from its warm-up."""
    torch, ferry_kv, bufs = _stand_ins(copies_bytes=True)
    records = [0]
    order = []
    copy = ferry_kv.copy_blocks

    def logged(dst, src, d, s, **kw):
        order.append(kw["mode"])
        return copy(dst, src, d, s, **kw)

    def event(enable_timing):
        def record(*a):
            records[0] += 1  # start and end: two a call

        return types.SimpleNamespace(
            record=record, synchronize=lambda: None, elapsed_time=lambda other: records[0] / 2
        )

    ferry_kv.copy_blocks = logged
    torch.cuda.Event = event
    warmup, reps = 2, 3
    recs = kv.measure_point(
        torch, ferry_kv, bufs, "fetch", 64, 8, ["batched", "kernel"], reps, warmup, "G", "d"
    )
    timed = order[: 2 * (warmup + reps)]  # the rest are the byte checks' calls, untimed
    assert len(recs) == 2
    for rec in recs:
        calls = [i + 1 for i, m in enumerate(timed) if m == rec["impl"]]
        assert len(calls) == warmup + reps
        assert rec["time_us"] == statistics.median(calls[warmup:]) * 1000.0, (rec, timed)


def test_measure_point_drops_an_impl_that_fails_and_keeps_the_others(capsys):
    torch, ferry_kv, bufs = _stand_ins(copies_bytes=True)
    copy = ferry_kv.copy_blocks
    seen = []

    def flaky(dst, src, d, s, **kw):
        if kw["mode"] == "kernel":
            seen.append(1)
            if len(seen) == 2:  # the kernel fails in its second call
                raise RuntimeError("boom")
        return copy(dst, src, d, s, **kw)

    ferry_kv.copy_blocks = flaky
    recs = kv.measure_point(torch, ferry_kv, bufs, "fetch", 64, 8, ["batched", "kernel"], 3, 1, "G", "d")
    assert [r["impl"] for r in recs] == ["batched"]
    assert "kernel: RuntimeError: boom" in capsys.readouterr().err


def _feeder_torch():
    """torch.cuda stand-ins for kv.Feeder: streams as context managers, events
    that record which calls they follow."""

    class Event:
        def record(self, stream):
            pass

        def synchronize(self):
            pass

    return types.SimpleNamespace(
        cuda=types.SimpleNamespace(Event=Event, stream=lambda s: contextlib.nullcontext())
    )


def test_feeder_calls_until_left_and_stops():
    calls = []
    with kv.Feeder(_feeder_torch(), lambda: calls.append(1), "xs", timeout_s=5) as f:
        assert calls, "entering returns once the first call is queued"
        time.sleep(0.01)
    n = len(calls)
    time.sleep(0.01)
    assert len(calls) == n and not f.thread.is_alive()


def test_feeder_raises_the_threads_error_on_leaving():
    def fails():
        raise RuntimeError("copy refused")

    with pytest.raises(RuntimeError, match="copy refused"):
        with kv.Feeder(_feeder_torch(), fails, "xs", timeout_s=5):
            pass


def test_feeder_that_queues_nothing_is_a_bounded_error():
    gate = threading.Event()
    with pytest.raises(TimeoutError, match="queued nothing within 0.05 s"):
        with kv.Feeder(_feeder_torch(), lambda: gate.wait(0.2), "xs", timeout_s=0.05):
            pass
    gate.set()

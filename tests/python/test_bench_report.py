"""Pure parts of the benchmark report: bandwidth conventions and section tables."""

import pytest
from ferry.bench import report
from ferry.bench.cases import fits


def test_busbw_conventions():
    assert report.bandwidths("all_gather", 4, 1000, 1.0)[0] == 4000 / 1e-6 / 1e9
    _, bus = report.bandwidths("broadcast", 4, 1000, 1.0)
    assert bus == 1000 / 1e-6 / 1e9
    alg, bus = report.bandwidths("all_reduce", 4, 1000, 1.0)
    assert abs(bus - alg * 1.5) < 1e-9
    alg, bus = report.bandwidths("reduce_scatter", 4, 1000, 1.0)
    assert abs(bus - alg * 0.75) < 1e-9


def test_sizes_that_fit_each_op():
    assert fits("all_gather", 3, 4)
    assert not fits("all_to_all", 6, 4)
    assert fits("reduce_scatter", 64, 4) and not fits("reduce_scatter", 8, 4)


# One overlap record as ferry bench wrote it before the clock columns existed.
OVERLAP_ROW = dict(
    bytes_per_rank=1 << 20,
    impl="nccl",
    gemm_alone_ms=10,
    gemm_beside_ms=12,
    slowdown_pct=20,
    collectives_alone_ms=9,
    end_to_end_ms=12.5,
    serial_ms=19,
)


def test_sections_render_every_measurement():
    result = dict(
        prelaunch=[dict(op="all_gather", bytes_per_rank=1024, algo="b2b", trigger_to_done_us=12.3)],
        phases=[
            dict(
                algo="b2b",
                bytes_per_rank=1024,
                control_us=20,
                schedule_us=30,
                copy_us=1,
                sync_us=11,
                in_stream_us=45,
            )
        ],
        overlap=[OVERLAP_ROW],
        energy=[
            dict(
                op="all_gather",
                bytes_per_rank=1 << 20,
                impl="ferry",
                j_per_gb=0.1,
                j_per_gb_above_idle=0.05,
                joules=100,
                seconds=2,
            )
        ],
    )
    text = "\n".join(report.format_sections(result))
    for needle in ("trigger -> done", "12.3", "phases", "overlap", "energy", "0.050"):
        assert needle in text


def test_overlap_rows_show_paired_slowdown_and_clocks_where_recorded():
    old = OVERLAP_ROW
    new = dict(
        old,
        impl="ferry (default local copy)",
        slowdown_paired_pct=1.7,
        slowdown_paired_range_pct=[-1.8, 3.4],
        collectives_alone_power_w=612,
        gemm_alone_sm_mhz=1688,
        gemm_beside_sm_mhz=1511,
        gemm_alone_power_w=702,
        gemm_beside_power_w=709,
        gemm_alone_power_capped=1.0,
        gemm_beside_power_capped=0.5,
    )
    lines = report.format_sections(dict(overlap=[old, new]))
    row_old = next(line for line in lines if "nccl" in line)
    row_new = next(line for line in lines if "default local copy" in line)
    assert "nan" in row_old and "MHz" not in row_old  # records from before the clocks: no columns invented
    assert ".." not in row_old  # no spread invented for records without one
    for needle in ("1.7", "-1.8..+3.4", "1688", "1511", "709", "100%", "50%", "612"):
        assert needle in row_new, (needle, row_new)


def test_overlap_plot_prefers_the_paired_slowdown(tmp_path):
    rows = [
        dict(
            bytes_per_rank=n,
            impl="ferry",
            slowdown_pct=9.0,
            slowdown_paired_pct=1.0,
            end_to_end_ms=10,
            serial_ms=20,
        )
        for n in (1 << 16, 1 << 20)
    ]
    assert report.slowdown_key(rows) == "slowdown_paired_pct"
    older = [{k: v for k, v in r.items() if k != "slowdown_paired_pct"} for r in rows]
    assert report.slowdown_key(rows + older) == "slowdown_pct"  # mixed files: one measure for all
    pytest.importorskip("matplotlib")
    assert report.plot_overlap(rows, str(tmp_path / "o.png"), "t")
    assert (tmp_path / "o.png").stat().st_size > 0


def test_impossible_energy_readings_are_marked():
    from ferry.bench import energy

    assert energy.invalid_reason(1000.0, 1.0, 4) == ""
    assert "not physical" in energy.invalid_reason(6420.0, 1.0, 4)
    assert "did not advance" in energy.invalid_reason(0.0, 1.0, 2)
    row = dict(
        op="all_to_all",
        bytes_per_rank=1 << 20,
        impl="nccl",
        j_per_gb=408.1,
        j_per_gb_above_idle=370.0,
        joules=6420.0,
        seconds=1.0,
        invalid=energy.invalid_reason(6420.0, 1.0, 4),
    )
    text = "\n".join(report.format_sections(dict(energy=[row])))
    assert "INVALID" in text


def test_chain_table_pivots_variants_into_columns():
    recs = [
        dict(
            op="all_gather", bytes_per_rank=1024, variant="ferry, stream trigger, device gate", added_us=27.7
        ),
        dict(op="all_gather", bytes_per_rank=1024, variant="nccl, graph", added_us=9.2),
        dict(op="all_to_all", bytes_per_rank=1 << 20, variant="nccl, graph", added_us=15.7),
    ]
    lines = report.chain_table(recs)
    header = next(line for line in lines if line.startswith("op"))
    assert "ferry, stream trigger, device gate" in header and "nccl, graph" in header
    ag = next(line for line in lines if line.startswith("all_gather"))
    a2a = next(line for line in lines if line.startswith("all_to_all"))
    assert ag.split()[-2:] == ["27.7", "9.2"]
    assert a2a.split()[-1] == "15.7" and len(a2a.split()) == 3  # the missing cell stays empty
    assert lines == report.format_sections({"chain": recs})


def test_saved_text_has_no_empty_sweep_table(tmp_path):
    from ferry.bench.collectives import save

    chain = [dict(op="all_gather", bytes_per_rank=1024, variant="nccl, graph", added_us=9.2)]
    save({"gpu": "GPU", "records": [], "chain": chain}, 2, str(tmp_path), "ferry bench", plot=False)
    (txt,) = tmp_path.glob("*.txt")
    text = txt.read_text()
    assert "# chain" in text and "ferry/NCCL" not in text and "#wrong" not in text


def test_save_names_the_plots_it_wrote(tmp_path):
    from ferry.bench.collectives import save

    records = [_sweep_record("nccl", "nccl", 1024, 10.0), _sweep_record("ferry", "ferry-b2b", 1024, 20.0)]
    for r in records:
        r.update(busbw_gbps=0.0, wrong=0)
    stem, pngs = save({"gpu": "GPU", "records": records}, 2, str(tmp_path), "ferry bench", plot=True)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert pngs == []  # the CLI then says matplotlib is missing
    else:
        assert pngs == [stem + ".png"] and (tmp_path / (stem.rsplit("/", 1)[1] + ".png")).exists()


def test_all_to_allv_counts_are_uneven_and_fit_the_buffers():
    from ferry.bench.cases import fits, skewed_counts, sm_fits

    class Comm:  # records what the benchmark asks the communicator
        def __init__(self):
            self.asked = []

        def sm_path_takes(self, op, nbytes):
            self.asked.append((op, nbytes))
            return True

    for world in (2, 4, 8):
        n = 4096 * world
        c = skewed_counts(n, world)
        assert {x for row in c for x in row} == {n // world, n // world // 2}
        sent = [sum(row) for row in c]
        received = [sum(c[s][d] for s in range(world)) for d in range(world)]
        assert max(sent) <= n and max(received) <= n
        assert len(set(sent)) > 1 or len(set(received)) > 1 or world == 2
        assert fits("all_to_allv", n, world) and not fits("all_to_allv", n + 1, world)
    comm = Comm()
    assert sm_fits(comm, "all_to_allv", 4 << 20, 4) and sm_fits(comm, "all_gather", 4096, 4)
    assert comm.asked == [("all_to_allv", 1 << 20), ("all_gather", 4096)]  # per-peer blocks


def _sweep_record(impl, label, size, t, op="all_gather"):
    return dict(op=op, impl=impl, impl_label=label, bytes_per_rank=size, time_us=t)


def test_ratios_use_the_better_of_nccl_eager_and_graph():
    records = [
        _sweep_record("nccl", "nccl", 1024, 10.0),
        _sweep_record("nccl", "nccl-graph", 1024, 5.0),
        _sweep_record("ferry", "ferry-b2b", 1024, 20.0),
        _sweep_record("ferry", "ferry-b2b", 4096, 7.0),  # no NCCL at this size: no ratio
        _sweep_record("ferry", "ferry-sm", 1024, 4.0, op="all_to_all"),  # nor for this op
    ]
    assert report.ratios(records) == [("all_gather", 1024, "ferry-b2b", 4.0)]
    assert "4.00" in report.ratio_table(records)


def test_sweep_plot_has_a_ratio_row_where_nccl_ran(tmp_path):
    pytest.importorskip("matplotlib")
    with_nccl = [_sweep_record("nccl", "nccl", 1024, 10.0), _sweep_record("ferry", "ferry-b2b", 1024, 20.0)]
    alone = [_sweep_record("ferry", "ferry-b2b", 1024, 20.0)]
    for name, records, rows in (("both", with_nccl, 2), ("alone", alone, 1)):
        path = tmp_path / f"{name}.png"
        assert report.plot(records, str(path), "test")
        import matplotlib.image

        height = matplotlib.image.imread(str(path)).shape[0]
        assert height == pytest.approx(4.5 * rows * 110, abs=2)


def _repeat(impl, label, size, times, wrong=0):
    return [dict(_sweep_record(impl, label, size, t), wrong=wrong) for t in times]


def test_repeats_keep_the_median_run_and_every_time():
    runs = list(
        zip(
            _repeat("ferry", "ferry-pcpy", 4 << 20, [42.0, 31.6, 40.0]),
            _repeat("nccl", "nccl-graph", 4 << 20, [33.5, 36.4, 31.9], wrong=1),
        )
    )
    merged = {r["impl_label"]: r for r in report.merge_repeats(runs)}
    assert merged["ferry-pcpy"]["time_us"] == 40.0
    assert merged["ferry-pcpy"]["time_us_repeats"] == [42.0, 31.6, 40.0]
    assert merged["nccl-graph"]["time_us"] == 33.5 and merged["nccl-graph"]["wrong"] == 3
    # Per-repeat ratios pair each repeat with its own NCCL time: 42/33.5, 31.6/36.4, 40/31.9.
    lo, hi = report.ratio_ranges(list(merged.values()))[("all_gather", 4 << 20, "ferry-pcpy")]
    assert lo == pytest.approx(31.6 / 36.4) and hi == pytest.approx(40.0 / 31.9)
    table = report.ratio_table(list(merged.values()))
    assert "repeats from..to" in table and "0.87..1.25" in table


def test_an_even_number_of_repeats_keeps_the_lower_middle():
    runs = [[r] for r in _repeat("ferry", "ferry-b2b", 1024, [30.0, 20.0, 25.0, 40.0])]
    (merged,) = report.merge_repeats(runs)
    assert merged["time_us"] == 25.0 and "repeats" not in report.ratio_table([merged])


def test_repeated_runs_rerun_only_the_sweep_and_merge_it(monkeypatch):
    from ferry.bench import collectives

    calls = []

    def fake_run(world, opts):
        calls.append(opts)
        t = [40.0, 30.0, 35.0][len(calls) - 1]
        return {"gpu": "GPU", "records": _repeat("ferry", "ferry-b2b", 1024, [t]), "overlap": ["first only"]}

    monkeypatch.setattr(collectives, "run", fake_run)
    opts = dict(overlap=True, prelaunch=True, phases=True, energy=True, local_copy_probe=True)
    result = collectives.run_repeated(2, opts, 3)
    assert calls[0] is opts and all(not any(o.values()) for o in calls[1:])
    (rec,) = result["records"]
    assert rec["time_us"] == 35.0 and rec["time_us_repeats"] == [40.0, 30.0, 35.0]
    assert result["repeats"] == 3 and result["overlap"] == ["first only"]


def test_repeat_counts_must_be_positive():
    import argparse

    from ferry.cli import at_least_one

    assert at_least_one("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="at least 1, got 0"):
        at_least_one("0")


def test_impl_labels_map_to_call_options():
    from ferry.bench.cases import impl_options
    from ferry.bench.collectives import DEFAULT_IMPLS, IMPLS

    assert impl_options("ferry-pcpy") == ("pcpy", "auto")
    assert impl_options("ferry-graph") == ("auto", "auto")
    assert impl_options("ferry-sm-graph") == ("sm", "auto")
    assert impl_options("ferry-ksig") == ("auto", "kernel")
    assert impl_options("ferry-ksig-graph") == ("auto", "kernel")
    # Every label the benchmark accepts means something; the default run (the
    # README's main job) has kernel signals in a graph only, and no eager auto.
    for impl in IMPLS:
        if impl.startswith("ferry"):
            assert impl_options(impl)[0] in ("auto", "b2b", "pcpy", "seq", "sm")
    assert impl_options("ferry-auto") == ("auto", "auto")
    assert [i for i in DEFAULT_IMPLS if "ksig" in i or i == "ferry-auto"] == ["ferry-ksig-graph"]


def test_reduce_kernel_bench_counts_hbm_traffic_and_tabulates():
    from ferry.bench import reduce_kernel

    # 2 sources of 1 MB read and 1 MB written in 1 us: 3 TB/s.
    assert reduce_kernel.hbm_tbps(2, 10**6, 1.0) == pytest.approx(3.0)
    assert reduce_kernel.hbm_tbps(8, 10**6, 0.0) == 0.0
    records = [
        dict(world=2, dtype="float32", result_bytes=1 << 20, impl=i, time_us=t, hbm_tbps=b)
        for i, t, b in (("ferry-32-blocks", 2.0, 1.5), ("torch.sum", 1.0, 3.0))
    ]
    table = reduce_kernel.format_records(records).splitlines()
    assert "ferry-32-blocks" in table[0] and "torch.sum" in table[0]
    assert "1M" in table[1] and "1.50 TB/s" in table[1] and "3.00 TB/s" in table[1]

"""The multipath benchmark's pure parts: records, break-even, the table."""

from ferry.bench.multipath import break_even, format_table, record


def _rows():
    out = []
    for size, plain, ferry in (
        (1 << 20, 20.0, 8.0),
        (4 << 20, 40.0, 35.0),
        (16 << 20, 50.0, 70.0),
        (64 << 20, 52.0, 100.0),
    ):
        t = size / (plain * 1e9) * 1e6
        out.append(record("multipath_h2d", "plain", size, 1, t, 105.0, 3.0, 4.0, "H200", "2026-11-25"))
        t = size / (ferry * 1e9) * 1e6
        out.append(record("multipath_h2d", "ferry", size, 2, t, 105.0, 9.0, 30.0, "H200", "2026-11-25"))
    return out


def test_record_has_the_issue_fields():
    r = _rows()[1]
    assert set(r) >= {"op", "impl", "bytes", "paths", "gbps", "aggregate_gbps", "gpu", "date"}
    assert r["op"] == "multipath_h2d" and r["paths"] == 2 and abs(r["gbps"] - 8.0) < 0.05


def test_break_even_is_the_size_from_which_it_stays_ahead():
    rows = _rows()
    assert break_even(rows, "multipath_h2d", ("ferry", 2)) == 16 << 20
    slower = [dict(r, gbps=1.0) if r["impl"] == "ferry" else r for r in rows]
    assert break_even(slower, "multipath_h2d", ("ferry", 2)) == 0


def test_table_names_impls_and_the_aggregate():
    text = format_table(_rows())
    assert "ferry x2" in text and "aggregate" in text and "105.0" in text
    assert "from 16M" in text or "from 16 M" in text or "16M" in text.split("ferry x2: ")[-1]


def test_sleep_table_gives_the_ratio():
    from ferry.bench.multipath import sleep_table

    rows = [
        {"op": "model_sleep", "impl": "ferry", "model": "m", "seconds": 0.1, "gbps": 150.0},
        {"op": "model_sleep", "impl": "per-allocation", "model": "m", "seconds": 0.3, "gbps": 50.0},
    ]
    text = sleep_table(rows)
    assert "3.00x" in text and "model_sleep" in text
    assert sleep_table([]) == ""


def test_contention_table_lines():
    from ferry.bench.multipath import contention_table

    rows = [
        {"op": "multipath_foreign", "impl": "plain", "paths": 1, "gbps": 25.0, "foreign_gbps": 30.0,
         "share_of_left": 0.32, "link_shares": [1.0]},
        {"op": "multipath_foreign", "impl": "ferry", "paths": 2, "gbps": 60.0, "foreign_gbps": 40.0,
         "share_of_left": 0.88, "link_shares": [0.1, 0.9]},
        {"op": "multipath_foreign", "impl": "ferry", "paths": 2, "direction": "d2h", "gbps": 50.0,
         "foreign_gbps": 45.0, "share_of_left": 0.91, "link_shares": [0.0, 1.0]},
        {"op": "p2p_beside", "impl": "own-link-first", "alone_gbps": 300.0, "gbps": 250.0},
    ]  # fmt: skip
    text = contention_table(rows)
    assert "plain copy 25.0 GB/s" in text and "32% of the capacity left" in text
    assert "ferry x2 60.0 GB/s" in text and "88% of the capacity left" in text and "[0.1, 0.9]" in text
    assert "link (d2h): ferry x2 50.0 GB/s" in text and "91% of the capacity left" in text
    assert "beside ferry (own-link-first) 250.0" in text
    assert contention_table([]) == ""


def test_engine_variants_are_labelled_and_parsed():
    from ferry.bench.multipath import impl_label, parse_args

    assert impl_label({"impl": "ferry-head", "paths": 2}) == "ferry-head x2"
    assert impl_label({"impl": "ferry", "paths": 4}) == "ferry x4"
    assert impl_label({"impl": "static-1:1", "paths": 2}) == "static-1:1"
    assert impl_label({"impl": "ferry-own-share-on", "paths": 4}) == "ferry-own-share-on x4"
    assert impl_label({"impl": "ferry-loopback", "paths": 1}) == "ferry-loopback"
    assert parse_args(["--head", "4M"]).head == "4M"
    assert parse_args(["--own-share"]).own_share and not parse_args([]).own_share
    assert impl_label({"impl": "ferry-outstanding-4", "paths": 4}) == "ferry-outstanding-4 x4"
    assert parse_args(["--outstanding", "3,4"]).outstanding == "3,4" and parse_args([]).outstanding == ""


def test_bytes_at_joins_the_copies_ends_by_straight_lines():
    from ferry.bench.multipath import _bytes_at

    ends = [1.0, 2.0, 4.0]  # three copies of 10 bytes, started at 0
    assert _bytes_at(-1.0, 0.0, ends, 10) == 0.0
    assert _bytes_at(0.5, 0.0, ends, 10) == 5.0
    assert _bytes_at(3.0, 0.0, ends, 10) == 25.0
    assert _bytes_at(9.0, 0.0, ends, 10) == 30.0


def test_programs_table_sums_the_programs_and_gives_the_evenness():
    from ferry.bench.multipath import programs_table

    rows = [
        {"op": "multipath_programs", "impl": "ferry", "direction": "h2d", "program": i, "gbps": g,
         "aggregate_gbps": 160.0}
        for i, g in ((0, 80.0), (1, 60.0))
    ]  # fmt: skip
    text = programs_table(rows)
    assert "80.0 + 60.0 = 140.0 GB/s" in text and "88% of all links at once" in text and "0.75" in text
    assert programs_table([]) == ""

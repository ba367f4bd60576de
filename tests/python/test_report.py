import pytest
from ferry.bench.report import (
    bandwidths,
    format_size,
    format_table,
    parse_size,
    prelaunch_sizes,
    ratio_table,
    size_range,
)


def test_sizes():
    assert parse_size("1K") == 1024 and parse_size("64MB") == 64 << 20 and parse_size("1g") == 1 << 30
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError, match="not like"):
        parse_size("lots")
    assert size_range(1024, 1 << 30, 4)[-1] == 1 << 30 and len(size_range(1024, 1 << 30, 4)) == 11
    assert format_size(64 << 20) == "64M" and format_size(1000) == "1000"


def test_bandwidth_conventions():
    # all_gather: 4 ranks x 1 GB in 10 ms = 400 GB/s algbw, 300 busbw
    alg, bus = bandwidths("all_gather", 4, 10**9, 10_000)
    assert alg == pytest.approx(400) and bus == pytest.approx(300)
    alg, bus = bandwidths("all_to_all", 4, 10**9, 10_000)
    assert alg == pytest.approx(100) and bus == pytest.approx(75)


def test_tables():
    recs = [
        dict(op="all_gather", bytes_per_rank=1024, impl=i, impl_label=l, time_us=t, busbw_gbps=1.0, wrong=0)
        for i, l, t in (
            ("ferry-b2b", "ferry-b2b", 20.0),
            ("nccl", "nccl", 30.0),
            ("nccl", "nccl-graph", 10.0),
        )
    ]
    assert "ferry-b2b" in format_table(recs)
    assert "2.00" in ratio_table(recs)  # 20 us against the best NCCL (graph, 10 us)


def test_prelaunch_sizes_cover_small_sizes_and_never_fail():
    assert prelaunch_sizes(1024, 1 << 30, 32) == [1024, 32 << 10, 1 << 20]
    # A sweep that starts above 1 MB still gets one prelaunch size (it used to raise).
    assert prelaunch_sizes(4 << 20, 256 << 20, 4) == [4 << 20]

"""The symmetric heap benchmark's pure parts: records, the table, the targets."""

from ferry.bench import symm


def _rec(op, impl, nbytes, time_us):
    return symm.record(op, impl, 4, nbytes, time_us, "block", "NVIDIA H200", "2026-11-25")


def test_record_fields_and_bandwidth():
    r = _rec("put", "ferry-device-8b", 1 << 20, 2.0)
    assert set(r) == {"op", "impl", "world", "bytes", "time_us", "gbps", "scope", "graph", "gpu", "date"}
    assert r["gbps"] == round((1 << 20) / 2e-6 / 1e9, 2)
    assert _rec("barrier", "ferry-device", 0, 1.5)["gbps"] == 0.0
    assert r["graph"] is False


def test_table_has_a_row_per_op_and_size_and_a_column_per_impl():
    recs = [
        _rec("put", "ferry-device-1b", 4096, 3.0),
        _rec("put", "ferry-copy-engine", 4096, 5.0),
        _rec("all_reduce", "nccl", 8192, 20.0),
    ]
    table = symm.format_table(recs).splitlines()
    assert table[0] == "| op | bytes | ferry-device-1b | ferry-copy-engine | nccl |"
    assert len(table) == 4
    assert "3.0 us" in table[2] and "5.0 us" in table[2]
    assert table[3].startswith("| all_reduce | 8K |") and "20.00 us" in table[3]


def test_targets_met_and_missed():
    recs = [
        _rec("put", "ferry-device-8b", 1 << 20, 2.0),  # 524 GB/s
        _rec("put", "ferry-device-8b", 4 << 20, 20.0),  # 210 GB/s: the slowest size decides
        _rec("barrier", "ferry-device", 0, 1.5),
        _rec("barrier", "ferry-stream", 0, 9.0),
        _rec("all_reduce", "ferry-device-8b", 8 << 10, 5.0),
        _rec("all_reduce", "ferry-device-1b", 8 << 10, 7.0),
        _rec("all_reduce", "ferry-device-8b", 4 << 20, 40.0),
    ]
    lines = symm.target_lines(recs)
    assert lines[0].startswith("put to one peer from 1 MiB >= 370 GB/s: missed (slowest size 210 GB/s)")
    assert "barrier in a kernel <= 2 us: met (1.50 us)" in lines
    assert "barrier on a stream <= 4 us: missed (9.00 us)" in lines
    assert "all-reduce 8K <= 6 us: met (5.0 us)" in lines
    assert "all-reduce 4M <= 25 us: missed (40.0 us)" in lines
    assert not any("512K" in x for x in lines)  # not measured, not claimed

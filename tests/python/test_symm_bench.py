"""The symmetric heap benchmark's pure parts: records, the table, the targets."""

import os
import sys

import pytest
from ferry.bench import nvshmem, symm


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


def test_get_rows_show_bandwidth_as_put_rows_do():
    table = symm.format_table([_rec("get", "ferry-device-8b", 1 << 20, 7.0)]).splitlines()
    assert table[2].startswith("| get | 1M |") and "7.0 us, 150 GB/s" in table[2], table


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
    assert "all-reduce 8K <= 6 us: met (5.0 us, ferry-device-8b)" in lines
    assert "all-reduce 4M <= 25 us: missed (40.0 us, ferry-device-8b)" in lines
    assert not any("512K" in x for x in lines)  # not measured, not claimed


def test_the_large_all_reduce_target_compares_with_nccl_in_the_same_run():
    recs = [
        _rec("all_reduce", "ferry-device-2shot-64b", 64 << 20, 400.0),
        _rec("all_reduce", "ferry-device-2shot-32b", 64 << 20, 380.0),  # the best grid counts
        _rec("all_reduce", "nccl", 64 << 20, 350.0),
        _rec("all_reduce", "ferry-device-2shot-64b", 256 << 20, 1500.0),
        _rec("all_reduce", "nccl", 256 << 20, 1200.0),  # 0.80x: the worst size decides
        _rec("all_reduce", "ferry-device-2shot-64b", 4 << 20, 100.0),  # under 64M: not this target
        _rec("all_reduce", "nccl", 4 << 20, 40.0),
    ]
    lines = symm.target_lines(recs)
    assert "all-reduce from 64M >= 0.9x NCCL's bus bandwidth: missed (worst 256M: 0.80x)" in lines, lines
    recs = recs[:3]
    assert "all-reduce from 64M >= 0.9x NCCL's bus bandwidth: met (worst 64M: 0.92x)" in symm.target_lines(
        recs
    )
    # No NCCL in the run (python -m, not torchrun): nothing claimed.
    assert not any("bus bandwidth" in x for x in symm.target_lines(recs[:2]))


def test_an_all_reduce_target_met_by_name_says_so():
    recs = [
        _rec("all_reduce", "ferry-device-2shot-64b", 4 << 20, 27.0),
        _rec("all_reduce", "ferry-device-2shot-blocks-64b", 4 << 20, 24.0),
        _rec("all_reduce", "ferry-device-ll2shot-64b", 512 << 10, 8.0),
        _rec("all_reduce", "ferry-device-auto-64b", 8 << 10, 5.0),
    ]
    lines = symm.target_lines(recs)
    assert (
        "all-reduce 4M <= 25 us: met (24.0 us, ferry-device-2shot-blocks-64b, asked by name: each block's share of dst)"
        in lines
    ), lines
    assert any(
        x.startswith("all-reduce 512K <= 9 us: met (8.0 us, ferry-device-ll2shot-64b, asked by name")
        for x in lines
    )
    assert "all-reduce 8K <= 6 us: met (5.0 us, ferry-device-auto-64b)" in lines


def test_experiments_and_references_are_not_the_api():
    recs = [
        _rec("put", "ferry-device-8b", 1 << 20, 4.0),  # 262 GB/s
        _rec("put", "experiment-tma-8b", 1 << 20, 2.0),  # 524 GB/s: not the device API's put
        _rec("barrier", "ferry-device", 0, 2.5),
        _rec("barrier", "ferry-device-reference-relaxed-poll", 0, 1.5),
    ]
    lines = symm.target_lines(recs)
    assert lines[0].endswith("missed (slowest size 262 GB/s)")
    assert "barrier in a kernel <= 2 us: missed (2.50 us)" in lines


def test_targets_against_nvshmem_compare_the_fastest_of_each():
    recs = [
        _rec("signal_half_rtt", "ferry-device", 8, 1.2),
        _rec("signal_half_rtt", "nvshmem-device", 8, 1.0),
        _rec("barrier", "ferry-device", 0, 1.5),
        _rec("barrier", "nvshmem-device", 0, 2.5),
        _rec("barrier", "ferry-stream", 0, 4.0),
    ]
    lines = symm.target_lines(recs)
    assert "signal half round trip no slower than NVSHMEM: missed (1.20 us against 1.00 us)" in lines
    assert "barrier in a kernel no slower than NVSHMEM: met (1.50 us against 2.50 us)" in lines
    # No NVSHMEM number on a stream: no comparison claimed.
    assert not any("on a stream no slower" in line for line in lines)


def test_nvshmem_output_parsed_and_checks_judged():
    out = [
        "some NVSHMEM banner",
        "record put nvshmem-device-8b 1048576 2.500 block",
        "record barrier nvshmem-stream 0 3.250 stream",
        "record too few fields",
        "check put 268435456 bytes: 0 wrong",
        "check all_reduce nvshmem-stream 8192 bytes: 17 wrong",
    ]
    records, checks = nvshmem.parse(out)
    assert records == [
        {"op": "put", "impl": "nvshmem-device-8b", "bytes": 1 << 20, "time_us": 2.5, "scope": "block"},
        {"op": "barrier", "impl": "nvshmem-stream", "bytes": 0, "time_us": 3.25, "scope": "stream"},
    ]
    assert len(checks) == 2
    assert nvshmem.failed_checks(checks) == ["check all_reduce nvshmem-stream 8192 bytes: 17 wrong"]


def test_nvshmem_children_keep_multicast_off_whatever_the_caller_set():
    env = nvshmem.child_env(
        {"NVSHMEM_DISABLE_NVLS": "0", "NCCL_NVLS_ENABLE": "1", "LD_LIBRARY_PATH": "/a"}, "/nv/lib", 1 << 30
    )
    assert env["NVSHMEM_DISABLE_NVLS"] == "1" and env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["LD_LIBRARY_PATH"] == "/nv/lib" + os.pathsep + "/a"
    assert env["NVSHMEM_SYMMETRIC_SIZE"] == str(1 << 30)
    assert env["NVSHMEM_REMOTE_TRANSPORT"] == "none"
    # A caller's own choices for the rest stay.
    assert nvshmem.child_env({"NVSHMEM_SYMMETRIC_SIZE": "5G"}, "/l", 1)["NVSHMEM_SYMMETRIC_SIZE"] == "5G"


def test_nvshmem_found_in_nvshmem_home_or_explained(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.nvshmem", None)  # no wheel: NVSHMEM_HOME alone
    with pytest.raises(nvshmem.Unavailable, match="NVSHMEM_HOME"):
        nvshmem.find({"NVSHMEM_HOME": str(tmp_path)})
    (tmp_path / "include").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "include" / "nvshmem.h").write_text("")
    (tmp_path / "lib" / "libnvshmem_device.a").write_text("")
    (tmp_path / "lib" / "libnvshmem_host.so.3").write_text("")
    inc, lib = nvshmem.find({"NVSHMEM_HOME": str(tmp_path)})
    assert (inc, lib) == (str(tmp_path / "include"), str(tmp_path / "lib"))
    cmd = nvshmem.build_command(inc, lib, "90", "/tmp/x")
    assert "-rdc=true" in cmd and "-gencode=arch=compute_90,code=sm_90" in cmd
    assert "-l:libnvshmem_host.so.3" in cmd and "-lnvshmem_device" in cmd


def test_nvshmem_records_with_wrong_results_are_left_out():
    recs = [
        {"op": "all_reduce", "impl": "nvshmem-device-1b", "bytes": 8192, "time_us": 0.2, "scope": "grid"},
        {"op": "all_reduce", "impl": "nvshmem-stream", "bytes": 8192, "time_us": 10.0, "scope": "stream"},
        {"op": "put", "impl": "nvshmem-device-8b", "bytes": 4096, "time_us": 1.0, "scope": "block"},
    ]
    checks = [
        "check all_reduce nvshmem-device-1b 8192 bytes: 3641 wrong",
        "check all_reduce nvshmem-stream 8192 bytes: 0 wrong",
        "check put 4096 bytes: 0 wrong",
    ]
    assert [r["impl"] for r in nvshmem.checked(recs, checks)] == ["nvshmem-stream", "nvshmem-device-8b"]


def test_low_latency_fits_as_the_device_decides():
    # One-shot: 2048 lines of 4 bytes per block.
    assert symm.low_latency_fits(1, 8192 * 8, 4, 8)
    assert not symm.low_latency_fits(1, 8192 * 8 + 4, 4, 8)
    assert symm.low_latency_fits(1, 512 << 10, 4, 64)
    # Two-shot: each member's part, 1024 lines per block.
    assert symm.low_latency_fits(4, 4 * 4096 * 64, 4, 64)
    assert not symm.low_latency_fits(4, 4 * 4096 * 64 + 16, 4, 64)
    assert not symm.low_latency_fits(1, 64, 9, 1)  # past the receive area's ranks


def test_all_reduce_grids_are_checked():
    assert symm.parse_args(["--all-reduce-blocks", "8,64"]).all_reduce_blocks == "8,64"
    assert symm._grid_sizes("8,16,64") == [8, 16, 64]
    for bad in ("0", "65", "8,x", ""):
        with pytest.raises(SystemExit, match="all-reduce-blocks"):
            symm._grid_sizes(bad)


def test_slope_leaves_out_what_a_launch_costs_once():
    # Launches of 20 and 100 operations of 3 us each, each launch 17 us more (the host's launch, the skew).
    short = [17 + 20 * 3.0 + e for e in (0.4, -0.2, 0.0, 0.9, -0.5)]
    long_ = [17 + 100 * 3.0 + e for e in (-0.3, 0.1, 0.0, 0.6, 0.2)]
    per, once = symm.slope(short, long_, 20)
    assert abs(per - 3.0) < 0.01
    assert abs(once - 17.0) < 0.3


def test_every_launcher_has_its_c_signature():
    """KERNEL_ARGS (what ctypes passes) against symm_kernels.cu's extern "C"
    launchers, parsed from the source: a launcher missing there would get
    ctypes' default int arguments and crash the benchmark."""
    import re

    src = open(os.path.join(os.path.dirname(symm.__file__), "symm_kernels.cu")).read()
    block = src[src.index('extern "C" {') :]
    found = {}
    for name, params in re.findall(r"^int (bench_\w+)\(([^)]*)\)", block, flags=re.M):
        sig = ""
        for param in params.split(","):
            t = " ".join(param.split()[:-1])
            sig += (
                "p"
                if "*" in t or t == "cudaStream_t"
                else "u"
                if t == "uint64_t"
                else "i"
                if t == "int"
                else "?"
            )
        found[name] = sig
    assert found and found == symm.KERNEL_ARGS

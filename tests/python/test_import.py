"""`import ferry` works with no GPU and explains itself when a GPU call is made."""

import os

import ferry
import pytest


def test_import_and_version():
    assert ferry.__version__
    assert ferry.IMPORT_ERROR is None, "the native extension should be built and importable"


@pytest.mark.skipif(ferry.gpu_available(), reason="a CUDA driver is present")
def test_gpu_calls_explain_missing_driver():
    from ferry import topo

    with pytest.raises(ferry.NoGpuError, match="NVIDIA driver"):
        topo.probe()
    with pytest.raises(ferry.NoGpuError, match="driver"):
        ferry.init_local([0, 1])


def test_exception_hierarchy():
    assert issubclass(ferry.InvalidArgumentError, ValueError)
    assert issubclass(ferry.PeerTimeoutError, TimeoutError)
    assert issubclass(ferry.NotRegisteredError, ferry.FerryError)
    assert issubclass(ferry.FerryError, RuntimeError)


def test_selector_from_python():
    assert ferry.select_algo("all_gather", 4, 1024) == "b2b"
    assert ferry.select_algo("all_to_all", 8, 1 << 30) == "seq"
    assert ferry.select_algo("all_gather", 4, 4 << 20) == "seq"
    assert ferry.select_algo("all_gather", 4, 1 << 30, "b2b") == "b2b"
    with pytest.raises(ferry.InvalidArgumentError, match="algo is 'ring'"):
        ferry.select_algo("all_gather", 4, 1024, "ring")
    with pytest.raises(ferry.InvalidArgumentError, match="op is 'reduce'"):
        ferry.select_algo("reduce", 4, 1024)


def _no_ferry_knobs(monkeypatch):
    """Doctor fails on a bad FERRY_* setting: the tests' own environment must not decide."""
    for name in [k for k in os.environ if k.startswith("FERRY_")]:
        monkeypatch.delenv(name)


def test_cli_doctor_and_topo_from_file(capsys, monkeypatch):
    from ferry import cli, topo

    _no_ferry_knobs(monkeypatch)

    path = str(topo.FIXTURES / "h200x4_nvswitch.json")
    assert cli.main(["topo", "--file", path]) == 0
    assert "NVIDIA H200" in capsys.readouterr().out
    assert cli.main(["doctor", "--file", path]) == 0
    out = capsys.readouterr().out
    assert "[ok] every GPU pair reachable" in out and "FERRY_TIMEOUT_S" in out
    assert cli.main(["doctor", "--file", str(topo.FIXTURES / "pcie_x4.json")]) == 1


def test_cli_doctor_flags_a_knob_its_reader_would_refuse(capsys, monkeypatch):
    from ferry import cli, topo

    _no_ferry_knobs(monkeypatch)

    path = str(topo.FIXTURES / "h200x4_nvswitch.json")
    assert cli.main(["doctor", "--file", path]) == 0
    out = capsys.readouterr().out
    assert "FERRY_KV_STREAMS" in out and "(1..64)" in out
    monkeypatch.setenv("FERRY_KV_STREAMS", "0")
    monkeypatch.setenv("FERRY_SCRATCH_BYTES", "lots")
    assert cli.main(["doctor", "--file", path]) == 1
    out = capsys.readouterr().out
    assert "[fail] FERRY_KV_STREAMS=0; expected 1..64" in out
    assert "[fail] FERRY_SCRATCH_BYTES=lots is not an integer" in out
    monkeypatch.delenv("FERRY_KV_STREAMS")
    monkeypatch.delenv("FERRY_SCRATCH_BYTES")
    monkeypatch.setenv("FERRY_DEBUG", "yes")  # its reader takes any value
    assert cli.main(["doctor", "--file", path]) == 0


def test_recorded_command_names_the_ferry_knobs():
    from ferry.cli import recorded_command

    env = {"FERRY_SIGNALS": "sm", "PATH": "/bin", "FERRY_SM_BYTES": "4194304"}
    got = recorded_command(["bench", "--impls", "", "--min", "1K"], env)
    assert got == "FERRY_SIGNALS=sm FERRY_SM_BYTES=4194304 ferry bench --impls '' --min 1K"
    assert recorded_command(["tune"], {}) == "ferry tune"


def test_prelaunch_follows_the_ops_it_can_prepare():
    from ferry.cli import prelaunch_ops

    assert prelaunch_ops(["all_gather"]) == ["all_gather"]
    assert prelaunch_ops(["all_to_all", "broadcast"]) == ["all_to_all"]
    assert prelaunch_ops(["broadcast"]) == ["all_gather", "all_to_all"]

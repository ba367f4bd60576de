import json

import pytest
from ferry import topo


@pytest.mark.parametrize("name,n", [("h200x4_nvswitch", 4), ("h200x8_nvswitch", 8), ("pcie_x4", 4)])
def test_fixtures_load_and_round_trip(name, n, tmp_path):
    d = topo.fixture(name)
    assert len(d["gpus"]) == n
    t = topo.to_native(d)
    assert t.gpus[n - 1].index == n - 1
    back = topo.to_dict(t)
    assert back["p2p"] == d["p2p"] and back["gpus"] == d["gpus"]
    p = tmp_path / "t.json"
    p.write_text(json.dumps(back))
    assert topo.load(p)["gpus"] == d["gpus"]


def test_native_judgement_of_fixtures():
    assert topo.to_native(topo.fixture("h200x8_nvswitch")).fully_connected()
    assert topo.to_native(topo.fixture("h200x8_nvswitch")).nvswitch()
    pcie = topo.to_native(topo.fixture("pcie_x4"))
    assert not pcie.fully_connected() and not pcie.nvswitch()


def test_doctor_checks():
    ok = dict(topo.doctor_checks(topo.fixture("h200x4_nvswitch")))
    assert "fail" not in ok
    checks = topo.doctor_checks(topo.fixture("pcie_x4"))
    fails = [m for s, m in checks if s == "fail"]
    assert len(fails) == 1 and "(0, 2)" in fails[0]
    old = topo.fixture("h200x4_nvswitch")
    old["driver_version"] = 12040
    assert any(s == "warn" and "cudaMemcpyBatchAsync" in m for s, m in topo.doctor_checks(old))
    assert topo.doctor_checks({"gpus": [], "p2p": [], "nvlink": []})[0][0] == "fail"


def test_format_text_shows_links():
    text = topo.format_text(topo.fixture("h200x8_nvswitch"))
    assert "SW" in text and "driver 13.0" in text
    assert "--" in topo.format_text(topo.fixture("pcie_x4"))


def test_validate_names_the_bad_field():
    d = topo.fixture("h200x4_nvswitch")
    d["p2p"] = d["p2p"][:2]
    with pytest.raises(ValueError, match="'p2p' must be a 4x4 matrix"):
        topo.validate(d)
    d = topo.fixture("h200x4_nvswitch")
    del d["gpus"][1]["copy_engines"]
    with pytest.raises(ValueError, match=r"gpus\[1\] lacks copy_engines"):
        topo.validate(d)


def test_environment_checks_warn_about_prelaunch_hazards():
    warns = [m for s, m in topo.environment_checks({}) if s == "warn"]
    assert any("CUDA_DEVICE_MAX_CONNECTIONS is 8 (default)" in m for m in warns)
    assert any("CUDA_MODULE_LOADING is lazy" in m for m in warns)
    ok = topo.environment_checks({"CUDA_DEVICE_MAX_CONNECTIONS": "32", "CUDA_MODULE_LOADING": "EAGER"})
    assert ok == [("ok", "CUDA_DEVICE_MAX_CONNECTIONS=32")]

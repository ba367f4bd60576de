"""ferry._streams: torch's current stream handle, through its raw accessor
where torch has one, else the public API, else 0 (no torch)."""

import sys
import types

import pytest
from ferry import _streams


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(_streams, "_lookup", None)


def fake_torch(monkeypatch, raw: bool):
    calls = []
    torch = types.ModuleType("torch")
    torch._C = types.SimpleNamespace()
    if raw:
        torch._C._cuda_getCurrentRawStream = lambda device: calls.append(("raw", device)) or 1000 + device
    torch.cuda = types.SimpleNamespace(
        current_stream=lambda device: (
            calls.append(("public", device)) or types.SimpleNamespace(cuda_stream=2000 + device)
        )
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    return calls


def test_the_raw_accessor_where_torch_has_one(monkeypatch):
    calls = fake_torch(monkeypatch, raw=True)
    assert _streams.current(3) == 1003 and _streams.current(0) == 1000
    assert calls == [("raw", 3), ("raw", 0)]


def test_the_public_api_otherwise(monkeypatch):
    calls = fake_torch(monkeypatch, raw=False)
    assert _streams.current(1) == 2001
    assert calls == [("public", 1)]


def test_the_default_stream_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert _streams.current(0) == 0

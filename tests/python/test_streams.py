"""ferry._streams: torch's current stream handle, through its raw accessor
where torch has one, else the public API, else 0 (no torch)."""

import sys
import types

import pytest
from ferry import _streams
from ferry.errors import InvalidArgumentError


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


def test_a_stream_of_another_gpu_is_refused_naming_both():
    class Dev:
        def __init__(self, index):
            self.index = index

    class Stream:
        def __init__(self, index, handle):
            self.device, self.cuda_stream = Dev(index), handle

    assert _streams.handle(Stream(1, 1234), 1) == 1234
    assert _streams.handle(5678, 0) == 5678  # a raw handle is taken as it is
    with pytest.raises(InvalidArgumentError, match=r"stream is a stream of cuda:1; expected one of cuda:0"):
        _streams.handle(Stream(1, 1234), 0)

    class ExternalStream(Stream):  # torch's: its device is a guess unless given
        pass

    assert _streams.handle(ExternalStream(1, 99), 0) == 99


def test_a_stream_argument_that_is_no_stream_is_refused_naming_its_type():
    with pytest.raises(
        InvalidArgumentError, match=r"stream is a str; expected a torch.cuda.Stream or an int handle"
    ):
        _streams.handle("s", 0)


def test_page_transfers_and_collectives_read_streams_alike():
    from ferry import comm, kv

    assert comm._stream_handle is _streams.handle and kv._stream_handle is _streams.handle


@pytest.mark.parametrize("stream", [True, False, -1])
def test_a_bool_or_negative_handle_is_no_stream(stream):
    # True would be handle 1, CUDA's legacy default stream.
    with pytest.raises(
        InvalidArgumentError, match=r"stream is .*; expected a torch.cuda.Stream or an int handle"
    ):
        _streams.handle(stream, 0)
    assert _streams.handle(7, 0) == 7

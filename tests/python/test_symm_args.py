"""ferry.symm's argument checks made before any GPU is touched, against a
stand-in native heap (no GPU, no torch)."""

import pytest
from ferry import InvalidArgumentError
from ferry.symm import Heap


class _NativeHeap:
    closed = False
    world = 4


def _heap():
    heap = object.__new__(Heap)
    heap._h = _NativeHeap()
    return heap


@pytest.mark.parametrize("rank", [True, 1.0, "1", None, -1, 4])
def test_peer_names_a_rank_that_is_no_rank(rank):
    with pytest.raises(InvalidArgumentError, match=r"rank is .*; expected .*0\.\.3"):
        _heap().peer(object(), rank)


@pytest.mark.parametrize("bad", [True, 1.9, "1", None])
def test_a_peer_or_word_value_that_is_no_integer_is_named(bad):
    # int() would send to rank 1 for True or 1.9: the wrong rank, silently.
    heap = _heap()
    for call, pattern in [
        (lambda: heap.put(object(), object(), bad), "put: peer is"),
        (lambda: heap.get(object(), object(), bad), "get: peer is"),
        (lambda: heap.signal(object(), bad, 1), "signal: value is"),
        (lambda: heap.signal(object(), 1, bad), "signal: peer is"),
        (lambda: heap.wait(object(), bad), "wait: value is"),
        (lambda: heap.wait(object(), 1, bad), "wait: from_rank is"),
    ]:
        with pytest.raises(InvalidArgumentError, match=pattern + r" .*; expected an integer"):
            call()


@pytest.mark.parametrize(
    "capacity,message",
    [(-1, "capacity is -1; expected bytes"), (1.5, "capacity is 1.5; expected an integer"),
     (False, "capacity is False; expected an integer"), ("1G", "capacity is '1G'; expected an integer")],
)  # fmt: skip
def test_a_heap_capacity_that_is_no_size_is_named(capacity, message, monkeypatch):
    import ferry.comm as comm

    c = object.__new__(comm.Communicator)
    monkeypatch.setattr(comm.Communicator, "_check_open", lambda self, what: None)
    c._local, c._heaps = False, []
    monkeypatch.setattr(comm.Communicator, "devices", property(lambda self: [0]))
    with pytest.raises(InvalidArgumentError, match=message):
        Heap(c, capacity)


@pytest.mark.parametrize("shape", [-1, (4, -1), True, (2, 1.5), "8", None])
def test_a_shape_that_is_no_shape_is_named_before_torch(shape, monkeypatch):
    # Else (-1, 4) would reach the native layer as a negative byte count.
    import ferry.comm as comm

    with pytest.raises(InvalidArgumentError, match=r"empty: shape is .*; expected"):
        _heap().empty(shape)
    c = object.__new__(comm.Communicator)
    monkeypatch.setattr(comm.Communicator, "_check_open", lambda self, what: None)
    with pytest.raises(InvalidArgumentError, match=r"alloc: shape is .*; expected"):
        c.alloc(shape)

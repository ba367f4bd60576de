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

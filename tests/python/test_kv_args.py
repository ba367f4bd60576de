"""Argument checks of ferry.kv that run before any GPU or tensor is needed:
each raises InvalidArgumentError (a ValueError) naming the argument."""

import array
import ctypes

import ferry.kv as kv
import pytest
from ferry import InvalidArgumentError
from ferry._args import shape_of


def test_index_lists_must_pair_up_and_hold_integers():
    with pytest.raises(InvalidArgumentError, match=r"dst_ids has 2 entries and src_ids 1; .*same length"):
        kv._id_pair([1, 2], [0])
    with pytest.raises(InvalidArgumentError, match=r"dst_ids: expected integer page indices"):
        kv._id_pair([1.5], [1])
    with pytest.raises(InvalidArgumentError, match=r"src_ids: expected integer page indices"):
        kv._id_pair([1], ["2"])
    # A mask would be pages 0 and 1: refused.
    with pytest.raises(InvalidArgumentError, match=r"src_ids: expected integer page indices, got bools"):
        kv._id_pair([4, 5, 6], [True, False, True])
    with pytest.raises(InvalidArgumentError, match=r"dst_ids: expected integer page indices, got bools"):
        kv._id_pair((7, 8, False), (0, 1, 2))
    d, s = kv._id_pair(range(3), [0, 1, 2])
    assert (d.count, s.count) == (3, 3)
    # Every entry is looked at, not only the ends.
    with pytest.raises(InvalidArgumentError, match=r"dst_ids: expected integer page indices, got bools"):
        kv._id_pair([4, True, 6], [0, 1, 2])
    with pytest.raises(
        InvalidArgumentError, match=r"src_ids: expected integer page indices \(entry 1 is a float\)"
    ):
        kv._id_pair([4, 5], [0, 1.0])
    with pytest.raises(InvalidArgumentError, match=r"dst_ids: page index at entry 1 is out of range"):
        kv._id_pair([0, 2**63], [0, 1])
    # The values as the native layer reads them: int64, in order.
    d, s = kv._id_pair([7, -1, 2**40], (3, 0, 5))
    assert (d.count, s.count, d.is_64, s.is_64) == (3, 3, True, True)
    assert list(array.array("q", ctypes.string_at(d.ptr, 24))) == [7, -1, 2**40]
    assert list(array.array("q", ctypes.string_at(s.ptr, 24))) == [3, 0, 5]
    d, s = kv._id_pair([], [])
    assert (d.count, d.ptr) == (0, 0)


def test_numpy_index_arrays_must_hold_integers():
    np = pytest.importorskip("numpy")
    d, s = kv._id_pair(np.array([3, 1], dtype=np.int32), np.array([0, 2], dtype=np.uint16))
    assert (d.count, s.count, d.is_64, s.is_64) == (2, 2, True, True)
    assert list(d.keep) == [3, 1] and list(s.keep) == [0, 2]
    # A cast would silently turn 1.7 into page 1 and True into page 1.
    with pytest.raises(
        InvalidArgumentError, match=r"dst_ids: expected integer page indices, got dtype float64"
    ):
        kv._id_pair(np.array([1.7, 2.0]), [1, 2])
    with pytest.raises(InvalidArgumentError, match=r"src_ids: expected integer page indices, got dtype bool"):
        kv._id_pair([1, 2], np.array([True, False]))
    # numpy bools in a list have __index__ (numpy only warns): taken as pages 1 and 0 unless refused.
    with pytest.raises(
        InvalidArgumentError,
        match=r"dst_ids: expected integer page indices, got bools \(entry 0 is a numpy.bool",
    ):
        kv._id_pair(list(np.array([True, False])), [3, 4])
    d, s = kv._id_pair(list(np.array([3, 1], dtype=np.int16)), [0, 2])
    assert list(array.array("q", ctypes.string_at(d.ptr, 16))) == [3, 1]
    with pytest.raises(
        InvalidArgumentError, match=r"dst_ids: expected a 1-D array of page indices, got shape \(2, 1\)"
    ):
        kv._id_pair(np.array([[1], [2]]), [0, 1])
    # A uint64 past int64 would wrap to a negative index and be named as such.
    with pytest.raises(
        InvalidArgumentError, match=r"dst_ids: page index 18446744073709551615 is out of range"
    ):
        kv._id_pair(np.array([2**64 - 1], dtype=np.uint64), [0])


def test_shapes_of_new_host_tensors():
    assert shape_of(1024, "HostPool.tensor") == (1024,)
    assert shape_of((8, 0, 3), "HostPool.tensor") == (8, 0, 3)
    # -1 must not move the pool's next offset back: the next tensor would overlap the one before.
    for shape in [(-1, 4096), ("4", 2), (True, 2), 2.5, None]:
        with pytest.raises(InvalidArgumentError, match="HostPool.tensor: shape is"):
            shape_of(shape, "HostPool.tensor")


def test_torch_bools_in_a_list_are_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(InvalidArgumentError, match=r"src_ids: expected integer page indices, got bools"):
        kv._id_pair([3, 4], [torch.tensor(1), torch.tensor(True)])
    d, s = kv._id_pair([torch.tensor(3), torch.tensor(1)], [0, 2])
    assert list(array.array("q", ctypes.string_at(d.ptr, 16))) == [3, 1]


def test_copy_options_are_checked_first():
    with pytest.raises(InvalidArgumentError, match=r"slice_bytes is -1; expected a byte count >= 0"):
        kv.copy_blocks(None, None, [], [], slice_bytes=-1)
    with pytest.raises(InvalidArgumentError, match=r"mode: 'fast' is not one of auto, per_page"):
        kv.copy_blocks(None, None, [], [], mode="fast")
    with pytest.raises(InvalidArgumentError, match=r"zero_sm=True forbids"):
        kv.copy_blocks(None, None, [], [], mode="kernel", zero_sm=True)


@pytest.mark.parametrize("nbytes", [True, 0, -4096, 4096.0, "4096"])
def test_a_host_pool_size_that_is_no_size_is_named(nbytes):
    # True is no size (int() would make it a pool of one byte). Checked before the native layer.
    with pytest.raises(InvalidArgumentError, match="nbytes: expected a positive number of bytes"):
        kv.HostPool(nbytes)

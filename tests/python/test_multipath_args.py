"""ferry.multipath's argument checks, made before any GPU is touched (they run
on the CPU-only CI machine too)."""

import ferry
import ferry.multipath as mp
import pytest


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"devices": [0, 0]}, "lists a GPU twice"),
        ({"devices": []}, "expected at least one GPU"),
        ({"devices": [0], "loopback": -1}, "loopback is -1"),
        ({"devices": [0], "relays": "idle"}, "expected 'all' or a list"),
        ({"devices": [0, 1], "relays": [2]}, r"relays: \[2\] are not among devices \[0, 1\]"),
        ({"devices": [0], "chunk_bytes": -1}, "chunk_bytes is -1"),
        ({"devices": [0], "min_bytes": -5}, "min_bytes is -5"),
        ({"devices": [0], "outstanding": 0}, "outstanding is 0"),
        ({"devices": [0], "timeout": -1.0}, "timeout is -1.0"),
        ({"devices": [0], "timeout": float("nan")}, "timeout is nan"),
    ],
)
def test_bad_engine_arguments_are_named(kwargs, message):
    with pytest.raises(ferry.InvalidArgumentError, match=message):
        mp.Engine(**kwargs)


def test_multipath_copy_is_exported():
    assert ferry.multipath_copy is mp.copy
    assert "multipath_copy" in ferry.__all__

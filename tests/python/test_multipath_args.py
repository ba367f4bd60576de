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
        ({"devices": [0], "relays": "busy"}, "relays is 'busy'; expected 'all', 'idle' or a list"),
        ({"devices": [0, 1], "relays": [2]}, r"relays: \[2\] are not among devices \[0, 1\]"),
        ({"devices": [0], "chunk_bytes": -1}, "chunk_bytes is -1"),
        ({"devices": [0], "min_bytes": -5}, "min_bytes is -5"),
        ({"devices": [0], "outstanding": 0}, "outstanding is 0"),
        ({"devices": [0], "outstanding": 17}, "outstanding is 17"),
        ({"devices": [0], "timeout": -1.0}, "timeout is -1.0"),
        ({"devices": [0], "timeout": float("nan")}, "timeout is nan"),
        ({"devices": [0], "head_bytes": -2}, "head_bytes is -2"),
        ({"devices": [0], "head_bytes": "4M"}, "head_bytes is '4M'; expected an integer"),
        ({"devices": [0], "chunk_bytes": 1 << 70}, "chunk_bytes is"),
        ({"devices": [0], "chunk_bytes": 4096}, r"chunk_bytes is 4096; expected 64 KiB \(65536\) to 1 TiB"),
        ({"devices": ["x"]}, "devices is 'x'"),
        ({"devices": [0], "loopback": 1000}, "loopback is 1000"),
        ({"devices": 4}, "devices is 4; expected a list of GPU ordinals"),
        ({"devices": [0], "relays": 1}, "relays is 1; expected 'all', 'idle' or a list"),
        ({"devices": [0], "relays": None}, "relays is None"),
        ({"devices": [0], "min_bytes": float("inf")}, "min_bytes is inf; expected an integer"),
        # int() would take these as GPU 1, GPU 0, 64 KiB and one chunk in flight.
        ({"devices": [True]}, "devices is True; expected an integer"),
        ({"devices": [0.9]}, "devices is 0.9; expected an integer"),
        ({"devices": [0], "chunk_bytes": 65536.9}, "chunk_bytes is 65536.9; expected an integer"),
        ({"devices": [0], "outstanding": True}, "outstanding is True; expected an integer"),
        ({"devices": [0, 1], "relays": [True]}, "relays is True; expected an integer"),
        ({"devices": [0], "timeout": None}, "timeout is None; expected seconds"),
        ({"devices": [0], "timeout": True}, "timeout is True; expected seconds"),
    ],
)
def test_bad_engine_arguments_are_named(kwargs, message):
    with pytest.raises(ferry.InvalidArgumentError, match=message):
        mp.Engine(**kwargs)


def test_multipath_copy_is_exported():
    assert ferry.multipath_copy is mp.copy
    assert "multipath_copy" in ferry.__all__


def test_offload_plan_is_page_aligned():
    from ferry.offload import plan

    class T:
        def __init__(self, n, size):
            self.n, self.size = n, size

        def numel(self):
            return self.n

        def element_size(self):
            return self.size

    offsets, total = plan([T(10, 2), T(4096, 4), T(1, 1)])
    assert offsets == [0, 4096, 4096 + 16384]
    assert total == 4096 + 16384 + 1
    assert plan([]) == ([], 1)

"""The symmetric pool's allocator (ferry.ranges, the native PoolRanges): the
same requests give the same offsets, ranges come back to their own stream
only, neighbours merge. tests/cpu/test_pool_ranges.cpp checks the same in C++."""

import random

import pytest
from ferry.ranges import ALIGN, Ranges, chunk_for


def test_first_fit_then_tail_then_none():
    r = Ranges()
    assert r.allocate(100, stream=1) is None  # no chunk yet: the caller adds one
    r.add_chunk(4 * ALIGN)
    assert r.allocate(100, 1) == (0, 0)
    assert r.allocate(ALIGN + 1, 1) == (0, ALIGN)  # rounded up to 2 x ALIGN
    assert r.allocate(ALIGN, 1) == (0, 3 * ALIGN)
    assert r.allocate(1, 1) is None  # full
    r.add_chunk(8 * ALIGN)
    assert r.allocate(1, 1) == (1, 0)
    assert r.bytes_in_use() == 5 * ALIGN


def test_freed_ranges_serve_their_own_stream_only():
    r = Ranges()
    r.add_chunk(4 * ALIGN)
    a = r.allocate(2 * ALIGN, stream=7)
    r.allocate(2 * ALIGN, stream=8)
    r.release(*a)
    # Stream 8 may not take stream 7's range (it may still be in use there).
    assert r.allocate(ALIGN, stream=8) is None
    assert r.allocate(ALIGN, stream=7) == (0, 0)  # first fit, split
    assert r.allocate(ALIGN, stream=7) == (0, ALIGN)


def test_neighbours_merge_and_a_large_request_reuses_them():
    r = Ranges()
    r.add_chunk(8 * ALIGN)
    spots = [r.allocate(ALIGN, 0) for _ in range(4)]
    for s in (spots[2], spots[0], spots[1]):
        r.release(*s)
    assert r.free_ranges(0) == [(0, 0, 3 * ALIGN)]
    assert r.allocate(3 * ALIGN, 0) == (0, 0)


def test_same_sequence_same_offsets():
    """What makes the pool symmetric: two ranks that make the same calls get
    the same answers, whatever the sizes and the order of frees."""

    def replay(seed):
        rng = random.Random(seed)
        r, live, out = Ranges(), [], []
        r.add_chunk(64 * ALIGN)
        for _ in range(500):
            if live and rng.random() < 0.45:
                r.release(*live.pop(rng.randrange(len(live))))
                continue
            n, stream = rng.randint(1, 6 * ALIGN), rng.choice((1, 2))
            spot = r.allocate(n, stream)
            if spot is None:
                r.add_chunk(64 * ALIGN)
                spot = r.allocate(n, stream)
            out.append(spot)
            live.append(spot)
            # No two ranges in use overlap.
            spans = sorted((c, o, o + size) for (c, o), (size, _) in r.in_use().items())
            assert all(a[2] <= b[1] for a, b in zip(spans, spans[1:]) if a[0] == b[0])
        return out

    assert replay(3) == replay(3)
    assert replay(3) != replay(4)


def test_bad_chunk_sizes_are_refused():
    with pytest.raises(ValueError, match="not a positive multiple of 512"):
        Ranges().add_chunk(1000)


def test_a_new_chunk_is_the_pools_size_or_the_requests():
    mib = 1 << 20
    assert chunk_for(100, 256 * mib) == 256 * mib
    assert chunk_for(300 * mib + 1, 256 * mib) == 302 * mib
    assert chunk_for(0, 1) == 2 * mib

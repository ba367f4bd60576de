"""ferry.offload's choice of engine, with stand-ins for the engine and the
stream (no GPU): a sleep or wake whose copy broke the default engine leaves
the next one a new engine, while the host copy stays where it was."""

import pytest
from ferry import multipath, offload
from ferry.errors import BrokenError


class _Engine:
    def __init__(self, breaks: bool):
        self.breaks, self.copies, self.closed = breaks, 0, False

    def check(self):
        if self.breaks and self.copies:
            raise BrokenError("multipath: a chunk on the link of cuda:1 failed")

    def copy_batch(self, dsts, srcs, stream=None):
        self.copies += 1

    def close(self):
        self.closed = True


class _Stream:
    def synchronize(self):
        pass


def _state(engine=None):
    state = object.__new__(offload.Offloaded)
    state._engine = engine
    return state


def test_a_broken_default_engine_is_replaced_for_the_next_sleep_or_wake(monkeypatch):
    broken, fresh = _Engine(breaks=True), _Engine(breaks=False)
    monkeypatch.setattr(multipath, "_default", broken)
    state = _state()
    with pytest.raises(BrokenError, match="cuda:1 failed"):
        state._copy_batch([], [], _Stream())
    assert broken.copies == 1 and broken.closed and multipath._default is None
    monkeypatch.setattr(multipath, "_default", fresh)
    state._copy_batch([], [], _Stream())
    assert fresh.copies == 1 and not fresh.closed


def test_an_engine_given_is_used_and_left_to_its_owner(monkeypatch):
    mine = _Engine(breaks=True)
    monkeypatch.setattr(multipath, "_default", None)
    state = _state(mine)
    with pytest.raises(BrokenError):
        state._copy_batch([], [], _Stream())
    assert mine.copies == 1 and not mine.closed and multipath._default is None

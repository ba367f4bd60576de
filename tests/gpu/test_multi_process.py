"""One process per GPU: byte-exact collectives, bad input, missing and dying peers."""

import _workers
import _workers_prelaunch
import _workers_reduce
import _workers_sm
import pytest
from conftest import GPU_COUNT, worlds_to_test
from harness import run_on_every_rank, spawn

pytestmark = pytest.mark.multigpu

WORLDS = worlds_to_test(2, 4, GPU_COUNT)


@pytest.mark.parametrize("world", WORLDS)
def test_collectives_byte_exact(world):
    run_on_every_rank(_workers.correctness, world)


def test_bad_inputs_are_named():
    results = spawn(_workers.bad_inputs, 2, timeout=90)
    assert len(results) == 2
    fails = [f"rank {r}: {f}" for r, fs in results.items() for f in fs]
    assert not fails, "\n".join(fails)


@pytest.mark.parametrize("world", WORLDS)
def test_ranks_on_other_paths_are_named(world):
    run_on_every_rank(_workers.paths_apart, world, timeout=120)


def test_peer_that_never_joins_is_named():
    results = spawn(_workers.never_joins, 2, timeout=60)
    assert results.get(0) == [], results


def test_peer_that_dies_yields_a_bounded_error():
    results = spawn(_workers.peer_dies, 2, timeout=90)
    assert results.get(0) == [], results


@pytest.mark.parametrize("world", WORLDS)
def test_more_collectives_byte_exact(world):
    run_on_every_rank(_workers.more_collectives, world, timeout=300)


@pytest.mark.parametrize("world", WORLDS)
def test_reductions_in_rounds_byte_exact(world):
    run_on_every_rank(_workers_reduce.reductions_in_rounds, world, timeout=300)


@pytest.mark.parametrize("world", worlds_to_test(2, GPU_COUNT))
def test_prelaunch_and_graphs(world):
    run_on_every_rank(_workers_prelaunch.prelaunch_and_graphs, world, timeout=150)


@pytest.mark.parametrize("world", WORLDS)
def test_sm_path(world):
    run_on_every_rank(_workers_sm.sm_path, world, timeout=300)


# FERRY_SIGNALS=sm: the same protocol with its messages sent by kernels.
@pytest.mark.parametrize("world", WORLDS)
def test_kernel_signals_byte_exact(world):
    run_on_every_rank(_workers.correctness_kernel_signals, world)


@pytest.mark.parametrize("world", worlds_to_test(2, GPU_COUNT))
def test_kernel_signals_more_collectives(world):
    """all_to_allv, broadcast, reductions (two exchanges with a kernel between)
    and in-place all_to_all in rounds, with the rounds sent by kernels."""
    run_on_every_rank(_workers.more_collectives_kernel_signals, world, timeout=300)


@pytest.mark.parametrize("world", worlds_to_test(2, GPU_COUNT))
def test_kernel_signals_prelaunch_and_graphs(world):
    run_on_every_rank(_workers.prelaunch_and_graphs_kernel_signals, world, timeout=150)


@pytest.mark.parametrize("kind", ["signals", "sm-path"])
def test_kernel_gives_up_in_a_graph_and_names_the_peer(kind, monkeypatch):
    monkeypatch.setenv("FERRY_TEST_KERNEL", kind)
    run_on_every_rank(_workers.kernel_gives_up_in_a_graph, 2, timeout=90)


@pytest.mark.parametrize("default", ["copy", "kernel"])
@pytest.mark.parametrize("world", worlds_to_test(2, GPU_COUNT))
def test_copy_signals_need_no_sm_and_kernel_signals_do(world, default, monkeypatch):
    monkeypatch.setenv("FERRY_SIGNALS", default)  # what a call's signals="auto" means
    run_on_every_rank(_workers.which_calls_need_sms, world, timeout=120)


@pytest.mark.parametrize("world", WORLDS)
def test_latency_preset_byte_exact(world):
    run_on_every_rank(_workers.latency_preset, world, timeout=300)


def test_mixed_signals_byte_exact():
    run_on_every_rank(_workers.mixed_signals, 2)


def test_kernel_signals_skipped_call_is_named():
    run_on_every_rank(_workers.kernel_signals_skipped_call, 2, timeout=60)

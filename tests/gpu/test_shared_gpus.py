"""Worlds larger than the machine: 2, 3, 4 and 8 ranks in one process on the
visible GPUs, several ranks per GPU (FERRY_SHARED_GPUS=1, testing only), so
that the code of a larger world runs where fewer GPUs are lent (on one GPU,
every world here). Ranks of one GPU copy to each other on SMs, so this says
nothing about speed."""

import os
import subprocess
import sys

import _checks
import pytest
from conftest import GPU_COUNT

CASES = [
    (2, "auto,b2b,pcpy,seq,sm", "copy", {}),
    # An odd world: the reduction's last source has no partner to load with.
    (3, "auto,b2b,seq,sm", "copy", {}),
    (4, "auto,b2b,pcpy,seq,sm", "copy", {}),
    # The copy-engine variants with their signal rounds sent by kernels
    # (FERRY_SIGNALS=sm): every rank's one-block kernels beside its GPU-mates'.
    (4, "auto,b2b,pcpy,seq", "sm", {}),
    # Eight ranks: the variants that keep each rank's work on its own stream
    # (pcpy's per-peer streams would exceed the hardware queues of a GPU).
    # All in one process: the replay cache once captured a call while two
    # ranks of its GPU waited for it, and the host stuck there (docs/
    # architecture.md, "Repeated eager calls").
    (8, "auto,b2b,seq,sm", "copy", {}),
    # The SM path's low-latency format on more blocks than its default:
    # 1 KB of data per block, so calls from 8 KB up run on 8 blocks and more,
    # up to the cap for ranks sharing a GPU (16 for four ranks on an H200).
    (4, "sm", "copy", {"FERRY_SM_LL_BLOCK_BYTES": "1024"}),
]


@pytest.mark.parametrize(
    "world,algos,signals,extra", [c for c in CASES if c[0] > GPU_COUNT], ids=lambda x: str(x)
)
def test_world_larger_than_the_machine(world, algos, signals, extra):
    env = dict(
        os.environ,
        FERRY_SHARED_GPUS="1",
        FERRY_SIGNALS=signals,
        CUDA_DEVICE_MAX_CONNECTIONS="32",
        **_checks.SAFE_ENV,
        **extra,
    )
    here = os.path.dirname(os.path.abspath(_checks.__file__))
    run = subprocess.run(
        [sys.executable, os.path.join(here, "_workers.py"), "shared", str(world), algos],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]


@pytest.mark.parametrize("world", [w for w in (3, 4) if w > GPU_COUNT])
def test_long_calls_with_ranks_sharing_gpus(world):
    """Calls of 2,048 rounds with several ranks per GPU in one process: each
    rank's part enqueued on a thread of its own beside its GPU-mates' (the
    parts of a call longer than a stream's queue), every byte compared."""
    env = dict(os.environ, FERRY_SHARED_GPUS="1", CUDA_DEVICE_MAX_CONNECTIONS="32", **_checks.SAFE_ENV)
    here = os.path.dirname(os.path.abspath(_checks.__file__))
    run = subprocess.run(
        [sys.executable, os.path.join(here, "_workers.py"), "shared-long", str(world), "2048"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]


@pytest.mark.parametrize("world", [3, 4])
def test_two_shot_all_reduce_in_several_processes(world, monkeypatch):
    """The SM path's two-shot all_reduce with one process per rank; ranks
    share GPUs where they outnumber them, else each has its own."""
    import _workers_sm
    from harness import run_on_every_rank

    if world > GPU_COUNT:
        monkeypatch.setenv("FERRY_SHARED_GPUS", "1")
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    for k, v in _checks.SAFE_ENV.items():
        monkeypatch.setenv(k, v)
    run_on_every_rank(_workers_sm.two_shot_processes, world, timeout=240)

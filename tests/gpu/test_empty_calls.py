"""Empty calls (zero-element tensors, ranks that send or receive nothing in
all_to_allv) in every collective, variant and signal kind, eager, prepared
and in CUDA graphs: tests/gpu/_workers_empty.py says what each checks."""

import os
import subprocess
import sys

import _checks
import _workers_empty
import pytest
from conftest import GPU_COUNT, worlds_to_test
from harness import run_on_every_rank

# Every rank in one process, on the visible GPUs (several per GPU where there
# are fewer: FERRY_SHARED_GPUS, testing only). pcpy where each GPU's hardware
# queues serve every rank it holds (as in test_shared_gpus.py).
CASES = [(2, "auto,b2b,pcpy,seq,sm"), (3, "auto,b2b,seq,sm"), (4, "auto,b2b,pcpy,seq,sm")]


@pytest.mark.parametrize("world,algos", CASES, ids=lambda x: str(x))
def test_empty_calls_one_process(world, algos):
    env = dict(
        os.environ,
        FERRY_SHARED_GPUS="1",
        CUDA_DEVICE_MAX_CONNECTIONS="32",
        **_checks.SAFE_ENV,
    )
    here = os.path.dirname(os.path.abspath(_checks.__file__))
    run = subprocess.run(
        [sys.executable, os.path.join(here, "_workers_empty.py"), str(world), algos],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]


@pytest.mark.multigpu
@pytest.mark.parametrize("world", worlds_to_test(2, 4, GPU_COUNT))
def test_empty_calls_one_process_per_gpu(world):
    run_on_every_rank(_workers_empty.one_process_per_gpu, world, timeout=300)

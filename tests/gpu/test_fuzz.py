"""The fuzzer (tests/gpu/fuzz.py) in short runs, so that the GPU tier runs
it: random collectives checked byte by byte in one process (ranks sharing the
visible GPUs) and with one process per rank, and a rank killed mid-operation
(every other rank must name it, none may hang). The long run:
`python tests/gpu/fuzz.py --seed 1 --ops 100000` (scripts/device-check fuzz)."""

import os
import subprocess
import sys

import _checks

HERE = os.path.dirname(os.path.abspath(_checks.__file__))


def _fuzz(*args, timeout=300):
    env = dict(os.environ, CUDA_DEVICE_MAX_CONNECTIONS="32", **_checks.SAFE_ENV)
    run = subprocess.run(
        [sys.executable, os.path.join(HERE, "fuzz.py"), *args, "--progress", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-4000:]
    assert " 0 failed" in run.stdout.strip().splitlines()[-1], run.stdout[-3000:]


def test_fuzz_one_process():
    _fuzz("--seed", "1", "--ops", "300", "--world", "2,4")


def test_fuzz_one_process_per_rank():
    _fuzz("--seed", "2", "--ops", "60", "--world", "2", "--procs")


def test_fuzz_a_killed_rank_is_named():
    _fuzz("--seed", "3", "--fault", "1", "--world", "3")

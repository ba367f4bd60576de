"""LD_PRELOAD=libferry_preload.so has no effect on a program that never copies
with CUDA (no GPU needed: it runs in CI)."""

import os
import subprocess
import sys

import ferry.multipath as mp
import pytest


def _library():
    try:
        return mp.preload_library()
    except FileNotFoundError:
        pytest.skip("libferry_preload.so is not built here")


@pytest.mark.parametrize(
    "cmd",
    [
        [sys.executable, "-c", "import json, sys; print(json.dumps({'ok': 1})); sys.stderr.write('')"],
        ["sh", "-c", "echo ok"],
    ],
)
def test_no_effect_without_cuda_copies(cmd):
    env = dict(os.environ, LD_PRELOAD=_library(), FERRY_DEBUG="1")
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "ok" in run.stdout
    assert "ferry" not in run.stderr, run.stderr  # nothing was opened or said

"""Communicators start with FERRY_TUNING's table or the one ferry ships for
the GPU model (read by the native library, so C programs get it too). Two
ranks, on one GPU where only one is visible (FERRY_SHARED_GPUS)."""

import os
import subprocess
import sys

import _checks


def test_communicators_start_with_the_shipped_table():
    env = dict(os.environ, FERRY_SHARED_GPUS="1", **_checks.SAFE_ENV)
    here = os.path.dirname(os.path.abspath(_checks.__file__))
    run = subprocess.run(
        [sys.executable, os.path.join(here, "_workers_tuning.py"), "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]

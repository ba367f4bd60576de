"""Multipath copies and sleep/wake on the GPU: _checks_multipath.py and
_checks_offload.py (their docstrings say what each checks), each in a pytest
process of its own, bounded, so that a copy that holds its stream for good
(a hang) costs minutes and prints its stacks instead of stopping the tier."""

import os
import subprocess
import sys

import _checks
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("checks,limit", [("_checks_multipath.py", 300), ("_checks_offload.py", 240)])
def test_checks_in_a_bounded_process(checks, limit):
    env = dict(os.environ, **_checks.SAFE_ENV)
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
        "-o", f"faulthandler_timeout={limit // 3}", os.path.join(HERE, checks),
    ]  # fmt: skip
    try:
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{checks} did not finish in {limit} s:\n{out[-6000:]}")
    print(f"\n{checks}: {run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ''}")
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-3000:]

"""Shared test setup: GPU tests are marked and skipped where no GPU is, and the
number of skipped GPU tests is printed at the end so CI shows it."""

import os

import pytest

for var, value in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
):
    os.environ[var] = value
# Before CUDA starts in this process (the single-process GPU tests run here),
# as in the multi-process workers: work that triggers an armed collective must
# not share a hardware queue with the armed wait (docs/api.md, Prelaunch).
# test_untriggered_with_few_hardware_queues runs with fewer on purpose.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


GPU_COUNT = _gpu_count()


def worlds_to_test(*candidates: int) -> list:
    """World sizes to test: `candidates` that fit the GPUs here, or the list in
    FERRY_TEST_WORLDS (e.g. "8" on a machine where every minute counts)."""
    env = os.environ.get("FERRY_TEST_WORLDS")
    if env:
        return [int(w) for w in env.split(",") if 2 <= int(w) <= max(GPU_COUNT, 2)]
    return sorted({w for w in candidates if 2 <= w <= GPU_COUNT}) or [2]


_gpu_skips = []


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.gpu)
        need = 2 if item.get_closest_marker("multigpu") else 1 if item.get_closest_marker("gpu") else 0
        if need and GPU_COUNT < need:
            why = (
                "torch with CUDA is not installed"
                if GPU_COUNT == 0
                else f"needs {need} GPUs, {GPU_COUNT} visible"
            )
            item.add_marker(pytest.mark.skip(reason=f"GPU test: {why}"))
            _gpu_skips.append(item.nodeid)


def pytest_runtest_logreport(report):
    """Prints a failure as soon as it happens: on the device machine a run may
    be cut off by its time limit before pytest's summary."""
    if report.failed:
        import sys

        sys.stderr.write(f"\nFAILED {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n")
        sys.stderr.flush()


def pytest_terminal_summary(terminalreporter):
    why = "no GPU here" if GPU_COUNT == 0 else f"they need more than the {GPU_COUNT} GPU(s) here"
    terminalreporter.write_line(f"GPU tests skipped ({why}): {len(_gpu_skips)}")

"""The C API on the GPUs: examples/c_api.c (all_gather, all_to_all, a prepared
all_gather with host and stream triggers, a refused call; every byte checked;
then a pool and a heap that outlive their communicator) built with CMake and
run on every visible GPU, from one process (ferry_comm_init_local) and from one
process per GPU (ferry_comm_init with the example's own all-gather; two
processes share the GPU where there is one); examples/kv_c_api.c (paged KV
transfers in every mode, whole and in slices, prepared transfers released from
the host, a stream and a device trigger, every page checked, and the errors
bad input gets) on GPU 0; examples/multipath_c.c (multipath copies, batches
and the synchronous form, every byte checked) over 1 GPU with two relays on
itself, 2 and 4 GPUs; examples/symm_ring.cu (the symmetric heap's C API and
the device API from a CUDA program of one's own) with 2 and 4 ranks."""

import os
import subprocess

import _checks
import pytest
from _builds import cmake_target
from conftest import GPU_COUNT


def _example_binary(name: str = "ferry_example_c") -> str:
    return cmake_target(name, name)


def _run_example(name: str, *args: str, timeout: float = 300, **env_extra: str) -> str:
    """Runs example `name` (built by CMake) with `args`; its stdout, once it exited 0."""
    env = dict(os.environ, **_checks.SAFE_ENV, **env_extra)
    run = subprocess.run(
        [_example_binary(name), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


@pytest.mark.parametrize("mode", ["one-process", "process-per-gpu"])
def test_c_api_end_to_end(mode):
    args = [] if mode == "one-process" else ["--processes", str(min(max(GPU_COUNT, 2), 8))]
    # Two ranks (or processes) on the one GPU (testing only) where there is one.
    shared = {"FERRY_SHARED_GPUS": "1"} if GPU_COUNT < 2 else {}
    out = _run_example("ferry_example_c", *args, **shared)
    assert out.startswith("ok"), out
    assert "a pool and a heap that outlive their communicator" in out, out


def test_kv_c_api_end_to_end():
    # 64 KiB slices: the 1.6 MB of pages of each sliced call go in 25 of them.
    out = _run_example("ferry_example_kv_c", timeout=120, FERRY_KV_SLICE_BYTES="65536")
    assert "kv_c_api: all checks passed" in out, out
    # Every mode, whole and sliced, ran and left the pages it was not asked to touch alone.
    assert out.count("0 wrong pages, untouched pages intact") == 15, out
    # Prepared: a fetch released three ways and a save, each byte-exact.
    for how in ("host trigger", "stream trigger", "device trigger"):
        assert f"prepared fetch, {how}: 0 wrong pages" in out, out
    assert "prepared save, one copy per page: 0 wrong pages" in out, out


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_multipath_c_api_end_to_end(gpus):
    """examples/multipath_c.c: copies, batches and the synchronous form each
    way, checked byte for byte; with one GPU through two relays on that GPU."""
    if gpus > 1 and gpus > GPU_COUNT:
        pytest.skip(f"needs {gpus} GPUs")
    out = _run_example("ferry_example_multipath_c", str(gpus))
    links = 3 if gpus == 1 else gpus
    assert f"multipath_c: all checks passed ({links} links)" in out, out
    assert out.count(" 0 wrong bytes of ") == 5, out


@pytest.mark.parametrize("ranks", [2, 4])
def test_symm_ring_example(ranks):
    # Several ranks on one GPU (testing only) where there are fewer GPUs.
    shared = {"FERRY_SHARED_GPUS": "1"} if ranks > GPU_COUNT else {}
    out = _run_example("ferry_example_symm_ring", str(ranks), **shared)
    assert "symm_ring: ok" in out, out

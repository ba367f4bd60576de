"""The symmetric heap and its device API on the GPU (_workers_symm.py says
what each run checks): 2, 3, 4 and 8 ranks driven by one process, and 2, 4
and 8 ranks in one process each; ranks share the visible GPUs where the world is
larger (FERRY_SHARED_GPUS=1, testing only), so that everything runs on one GPU.
Also the examples written on the device API."""

import os
import subprocess
import sys

import _builds
import _checks
import _workers_symm
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(*args, timeout=240, **extra_env):
    # A run that hangs prints its stacks and ends itself before the timeout, so
    # a failure costs minutes, not the whole tier's time.
    env = dict(
        os.environ,
        FERRY_SHARED_GPUS="1",
        CUDA_DEVICE_MAX_CONNECTIONS="32",
        SYMM_STACKS_AFTER_S=str(timeout - 30),
        **_checks.SAFE_ENV,
        **extra_env,
    )
    run = subprocess.run(
        [sys.executable, os.path.join(HERE, "_workers_symm.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = run.stdout[-8000:] + run.stderr[-4000:]
    assert run.returncode == 0, out
    assert " 0 failed" in run.stdout, out
    print(
        f"\n_workers_symm.py {' '.join(args)}: "
        + " | ".join(line for line in run.stdout.splitlines() if line.startswith(("symm:", "---")))
    )


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_heap_one_process(world):
    _run("local", str(world))


@pytest.mark.parametrize("world", [2, 4, 8])
def test_heap_process_per_rank(world):
    _run("procs", str(world))


def test_heap_from_torch_distributed():
    """Heap.from_torch: two processes joined by a gloo group, a put and the
    device API's checks over the communicator it bootstraps."""
    _run("torch-procs", "2")


@pytest.mark.parametrize("mode", ["local", "procs"])
def test_register_torch_expandable_segments(mode):
    """Tensors from PyTorch's allocator with expandable segments (CUDA VMM)
    registered into the heap, besides the registered check's own VMM buffers."""
    _run(
        mode,
        "2",
        PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
        SYMM_CHECKS="registered,comm_registered",
    )


def test_stream_wait_past_the_timeout_is_released():
    _run("stream-timeout", "2", timeout=45)


@pytest.mark.parametrize("world,build", [(2, "cmake"), (4, "cmake"), (2, "cpp_extension")])
def test_moe_dispatch_combine_example(world, build, tmp_path):
    """examples/moe_dispatch_combine.py against its torch reference, its
    kernels from CMake's build or built at run time by torch's cpp_extension
    against ferry.get_include() (ferry.symm.load_kernels, as a user would)."""
    env = dict(os.environ, FERRY_SHARED_GPUS="1", CUDA_DEVICE_MAX_CONNECTIONS="32", **_checks.SAFE_ENV)
    example = os.path.join(_builds.ROOT, "examples", "moe_dispatch_combine.py")
    cmd = [sys.executable, example, "--ranks", str(world)]
    if build == "cmake":
        cmd += ["--library", _workers_symm.built_library("ferry_example_moe")]
    else:
        env["TORCH_EXTENSIONS_DIR"] = str(tmp_path)  # a fresh build, not one cached by an earlier run
        env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    out = run.stdout[-4000:] + run.stderr[-4000:]
    assert run.returncode == 0, out
    assert ", 0 failed" in run.stdout, out
    print("\n" + run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("world", [2, 4])
def test_triton_example(world):
    """examples/symm_triton.py: Triton kernels that put, signal and wait
    through the heap's pointer tables, and read every rank's buffer in place,
    against torch."""
    pytest.importorskip("triton")
    env = dict(os.environ, FERRY_SHARED_GPUS="1", CUDA_DEVICE_MAX_CONNECTIONS="32", **_checks.SAFE_ENV)
    example = os.path.join(_builds.ROOT, "examples", "symm_triton.py")
    run = subprocess.run(
        [sys.executable, example, "--ranks", str(world)], env=env, capture_output=True, text=True, timeout=300
    )
    out = run.stdout[-4000:] + run.stderr[-4000:]
    assert run.returncode == 0, out
    assert f"of {world}, " in run.stdout and ": 0 failed" in run.stdout, out
    print("\n" + run.stdout.strip().splitlines()[-1])

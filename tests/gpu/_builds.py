"""The CMake targets the GPU tests run (example programs, test kernels):
scripts/test's build where it has them, else one build of our own."""

import fcntl
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cmake_target(target: str, filename: str) -> str:
    """The path of `filename`, which CMake target `target` makes."""
    built = os.path.join(ROOT, "build", "cpu-tests", filename)
    if os.path.exists(built):
        return built
    build = os.path.join(ROOT, "build", "gpu-tests")
    os.makedirs(build, exist_ok=True)
    # Ranks in processes of their own ask at once: one builds, the others wait
    # (two CMake runs in one build folder corrupt it).
    with open(os.path.join(build, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cmds = [["cmake", "--build", build, "--target", target]]
        if not os.path.exists(os.path.join(build, "build.ninja")):
            cmds.insert(0, ["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DFERRY_BUILD_TESTS=OFF"])
        for cmd in cmds:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if run.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
    return os.path.join(build, filename)

"""NVSHMEM's side of ``ferry.bench.symm``: the same measurements written against its API.

``nvshmem_bench.cu`` is built here with nvcc against the ``nvidia-nvshmem``
wheel (or ``NVSHMEM_HOME``) and run as one process per GPU, bootstrapped by
NVSHMEM's unique id passed through a file. NVLink multicast stays off
(``NVSHMEM_DISABLE_NVLS=1`` is forced) and no network transport is loaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "nvshmem_bench.cu")


class Unavailable(RuntimeError):
    """NVSHMEM cannot be measured here; the message says why."""


def find(env: Optional[Dict[str, str]] = None) -> Tuple[str, str]:
    """(include folder, lib folder) of an NVSHMEM install: NVSHMEM_HOME, else the nvidia-nvshmem wheel."""
    env = os.environ if env is None else env
    roots = []
    if env.get("NVSHMEM_HOME"):
        roots.append(env["NVSHMEM_HOME"])
    try:
        import nvidia.nvshmem as wheel  # the nvidia-nvshmem-cu12/cu13 wheels

        roots += list(getattr(wheel, "__path__", []))
    except ImportError:
        pass
    for root in roots:
        inc, lib = os.path.join(root, "include"), os.path.join(root, "lib")
        if os.path.isfile(os.path.join(inc, "nvshmem.h")) and os.path.isfile(
            os.path.join(lib, "libnvshmem_device.a")
        ):
            return inc, lib
    raise Unavailable(
        "no NVSHMEM found: install nvidia-nvshmem-cu13 (or cu12) or set NVSHMEM_HOME to a folder "
        "with include/nvshmem.h and lib/libnvshmem_device.a"
        + (f" (looked in {', '.join(roots)})" if roots else "")
    )


def host_library(lib: str) -> str:
    """The host library's file name (the wheels ship only the versioned name)."""
    names = sorted(n for n in os.listdir(lib) if n.startswith("libnvshmem_host.so"))
    if not names:
        raise Unavailable(f"no libnvshmem_host.so* in {lib}")
    return names[0]


def build_command(inc: str, lib: str, arch: str, out: str) -> List[str]:
    """nvcc's command line: relocatable device code, NVSHMEM's device library linked statically."""
    return [
        "nvcc",
        "-O3",
        "-std=c++17",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        "-rdc=true",
        f"-I{inc}",
        SOURCE,
        "-o",
        out,
        f"-L{lib}",
        "-lnvshmem_device",
        f"-l:{host_library(lib)}",
        "-Xlinker",
        f"-rpath={lib}",
    ]


def build(arch: str, cache: Optional[str] = None) -> Tuple[str, str]:
    """(program, lib folder): the benchmark built for sm_`arch`, reused while its source and NVSHMEM are unchanged."""
    inc, lib = find()
    if shutil.which("nvcc") is None:
        raise Unavailable("nvcc is not on PATH")
    with open(SOURCE, "rb") as f:
        key = hashlib.sha256(f.read() + inc.encode() + arch.encode()).hexdigest()[:16]
    cache = cache or os.path.join(tempfile.gettempdir(), "ferry-nvshmem-bench")
    os.makedirs(cache, exist_ok=True)
    exe = os.path.join(cache, f"nvshmem_bench-{key}")
    if not os.path.isfile(exe):
        cmd = build_command(inc, lib, arch, exe + ".part")
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise Unavailable(f"building {SOURCE} failed:\n{done.stderr[-3000:]}")
        os.replace(exe + ".part", exe)
    return exe, lib


def child_env(base: Dict[str, str], lib: str, heap_bytes: int) -> Dict[str, str]:
    """The environment of each rank: multicast off, no network transport, one host."""
    env = dict(base)
    env["NVSHMEM_DISABLE_NVLS"] = "1"
    env["NCCL_NVLS_ENABLE"] = "0"
    env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    env.setdefault("NVSHMEM_REMOTE_TRANSPORT", "none")
    env.setdefault("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo")
    env.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(heap_bytes))
    env["LD_LIBRARY_PATH"] = lib + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def parse(lines: Sequence[str]) -> Tuple[List[dict], List[str]]:
    """Rank 0's output: its "record op impl bytes time_us scope" lines as dicts, and its "check" lines."""
    records, checks = [], []
    for line in lines:
        parts = line.split()
        if len(parts) == 6 and parts[0] == "record":
            _, op, impl, nbytes, time_us, scope = parts
            records.append(
                {"op": op, "impl": impl, "bytes": int(nbytes), "time_us": float(time_us), "scope": scope}
            )
        elif parts and parts[0] == "check":
            checks.append(line.strip())
    return records, checks


def failed_checks(checks: Sequence[str]) -> List[str]:
    """The check lines that found a wrong byte or element."""
    return [c for c in checks if not c.endswith(": 0 wrong")]


def checked(records: Sequence[dict], checks: Sequence[str]) -> List[dict]:
    """The records whose results were right: a failed "check OP IMPL BYTES bytes: N wrong" drops that record."""
    bad = set()
    for c in failed_checks(checks):
        parts = c.split()
        if len(parts) >= 6 and parts[4] == "bytes:":
            bad.add((parts[1], parts[2], int(parts[3])))
    return [r for r in records if (r["op"], r["impl"], r["bytes"]) not in bad]


def measure(
    world: int,
    min_bytes: int,
    max_bytes: int,
    iters: int,
    reps: int,
    all_reduce_sizes: Sequence[int],
    arch: str = "90",
    timeout: float = 300.0,
) -> Tuple[List[dict], List[str]]:
    """Run the benchmark on `world` GPUs: (records without world/gpu/date, check lines). Raises Unavailable."""
    exe, lib = build(arch)
    heap = max_bytes + 2 * max(all_reduce_sizes) + (512 << 20)
    env = child_env(os.environ, lib, heap)
    with tempfile.TemporaryDirectory(prefix="ferry-nvshmem-") as tmp:
        uid = os.path.join(tmp, "uid")
        sizes = ",".join(str(s) for s in all_reduce_sizes)
        procs = [
            subprocess.Popen(
                [exe, str(r), str(world), uid, str(min_bytes), str(max_bytes), str(iters), str(reps), sizes],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(world)
        ]
        outs = []
        try:
            for r, p in enumerate(procs):
                outs.append(p.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            tails = []
            for r, p in enumerate(procs):
                _, err = p.communicate()
                tails.append(f"rank {r}: {err.strip()[-400:]}")
            raise Unavailable(f"NVSHMEM benchmark did not finish in {timeout:.0f} s\n" + "\n".join(tails))
        bad = [(r, p.returncode, outs[r][1]) for r, p in enumerate(procs) if p.returncode not in (0, 1)]
        if bad:
            raise Unavailable(
                "NVSHMEM benchmark failed: "
                + "; ".join(f"rank {r} exit {rc}: {err.strip()[-600:]}" for r, rc, err in bad)
            )
        return parse(outs[0][0].splitlines())

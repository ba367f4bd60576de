"""Machine topology as plain data: probe it, save and load it as JSON, print
it, and judge it (`ferry doctor`). Everything but probe() works without a GPU,
so decisions are tested from the fixtures under ferry/fixtures/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

from ._native import require

FIXTURES = Path(__file__).parent / "fixtures"

GPU_FIELDS = (
    "index",
    "name",
    "pci_bus_id",
    "numa_node",
    "copy_engines",
    "sm_count",
    "memory_bytes",
    "stream_memops",
    "memops_64bit",
    "vmm_posix_fd",
    "nvswitch_links",
)


def probe() -> dict:
    """The local machine, read through the CUDA driver and NVML."""
    return to_dict(require().probe_topology())


def to_dict(topo) -> dict:
    return {
        "source": topo.source,
        "driver_version": topo.driver_version,
        "runtime_version": topo.runtime_version,
        "gpus": [{f: getattr(g, f) for f in GPU_FIELDS} for g in topo.gpus],
        "p2p": [list(r) for r in topo.p2p],
        "nvlink": [list(r) for r in topo.nvlink],
    }


def validate(d: dict) -> dict:
    """Checks a topology dict's shape; raises ValueError naming the bad field."""
    for key in ("gpus", "p2p", "nvlink"):
        if key not in d:
            raise ValueError(f"topology: missing field '{key}'")
    n = len(d["gpus"])
    for key in ("p2p", "nvlink"):
        m = d[key]
        if len(m) != n or any(len(row) != n for row in m):
            raise ValueError(f"topology: '{key}' must be a {n}x{n} matrix (one row and column per GPU)")
    for i, g in enumerate(d["gpus"]):
        missing = [f for f in GPU_FIELDS if f not in g]
        if missing:
            raise ValueError(f"topology: gpus[{i}] lacks {', '.join(missing)}")
    return d


def load(path) -> dict:
    with open(path) as f:
        d = validate(json.load(f))
    d.setdefault("source", str(path))
    return d


def fixture(name: str) -> dict:
    """A shipped topology: 'h200x4_nvswitch', 'h200x8_nvswitch', 'pcie_x4'."""
    return load(FIXTURES / f"{name}.json")


def to_native(d: dict):
    """The C++ Topology for a dict, for the native decision functions."""
    native = require()
    t = native.Topology()
    gpus = []
    for g in validate(d)["gpus"]:
        gi = native.GpuInfo()
        for f in GPU_FIELDS:
            setattr(gi, f, g[f])
        gpus.append(gi)
    t.gpus = gpus
    t.p2p = d["p2p"]
    t.nvlink = d["nvlink"]
    t.driver_version = d.get("driver_version", 0)
    t.runtime_version = d.get("runtime_version", 0)
    t.source = d.get("source", "")
    return t


def _version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}" if v else "unknown"


def format_text(d: dict) -> str:
    lines = [
        f"driver {_version(d.get('driver_version', 0))}, runtime {_version(d.get('runtime_version', 0))}, "
        f"{len(d['gpus'])} GPU(s)  [{d.get('source', '')}]",
        "",
        f"{'gpu':>3}  {'name':<24} {'pci bus id':<14} {'numa':>4} {'CEs':>3} {'SMs':>4} {'memory':>9} "
        f"{'memops':>6} {'vmm-fd':>6} {'nvswitch':>8}",
    ]
    for g in d["gpus"]:
        lines.append(
            f"{g['index']:>3}  {g['name'][:24]:<24} {g['pci_bus_id']:<14} {g['numa_node']:>4} "
            f"{g['copy_engines']:>3} {g['sm_count']:>4} {g['memory_bytes'] / 2**30:>6.0f}GiB "
            f"{('64-bit' if g['memops_64bit'] else 'yes' if g['stream_memops'] else 'no'):>6} "
            f"{('yes' if g['vmm_posix_fd'] else 'no'):>6} {g['nvswitch_links']:>8}"
        )
    n = len(d["gpus"])
    if n > 1:
        lines += ["", "reachability (NVn: n direct NVLinks, SW: both on NVSwitch, P2P: PCIe peer, --: none)"]
        lines.append("     " + "".join(f"{j:>5}" for j in range(n)))
        for i in range(n):
            row = []
            for j in range(n):
                if i == j:
                    row.append("X")
                elif d["nvlink"][i][j]:
                    row.append(f"NV{d['nvlink'][i][j]}")
                elif d["p2p"][i][j] and d["gpus"][i]["nvswitch_links"] and d["gpus"][j]["nvswitch_links"]:
                    row.append("SW")
                elif d["p2p"][i][j]:
                    row.append("P2P")
                else:
                    row.append("--")
            lines.append(f"{i:>5}" + "".join(f"{c:>5}" for c in row))
    return "\n".join(lines)


def environment_checks(env: Dict[str, str]) -> List[Tuple[str, str]]:
    """Settings that matter for prepared (prelaunched) collectives: an armed
    collective parks a stream on a wait (docs/api.md, Prelaunch). Pure."""
    out: List[Tuple[str, str]] = []
    conn = env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    n = int(conn) if conn and conn.isdigit() else 8
    if n < 16:
        out.append(
            (
                "warn",
                f"CUDA_DEVICE_MAX_CONNECTIONS is {n}{'' if conn else ' (default)'}: an armed prepared collective "
                "can hold work of streams that share its hardware queue; 32 makes that rarer",
            )
        )
    else:
        out.append(("ok", f"CUDA_DEVICE_MAX_CONNECTIONS={n}"))
    if env.get("CUDA_MODULE_LOADING", "LAZY").upper() == "LAZY":
        out.append(
            (
                "warn",
                "CUDA_MODULE_LOADING is lazy: a kernel's first launch while a prepared collective is armed can "
                "wait for the device forever; run your kernels once before arming, or set it to EAGER",
            )
        )
    return out


def doctor_checks(d: dict) -> List[Tuple[str, str]]:
    """(status, message) pairs, status in 'ok', 'warn', 'fail': what ferry can
    and cannot do on this topology. Pure: tested from fixtures."""
    out: List[Tuple[str, str]] = []
    gpus = d["gpus"]
    if not gpus:
        return [("fail", "no GPU visible: ferry's collectives need NVIDIA GPUs")]
    out.append(("ok", f"{len(gpus)} GPU(s) visible"))
    drv = d.get("driver_version", 0)
    if drv and drv < 12000:
        out.append(("fail", f"driver {_version(drv)} is older than CUDA 12.0; ferry needs 12.0 or newer"))
    elif drv and drv < 12080:
        out.append(
            (
                "warn",
                f"driver {_version(drv)} lacks cudaMemcpyBatchAsync (12.8+): b2b falls back to one copy per call",
            )
        )
    else:
        out.append(("ok", f"driver {_version(drv)}: batched copies available"))
    no_memops = [g["index"] for g in gpus if not (g["stream_memops"] and g["memops_64bit"])]
    if no_memops:
        out.append(("fail", f"GPU(s) {no_memops} lack 64-bit stream memory operations (cuStreamWaitValue64)"))
    else:
        out.append(("ok", "64-bit stream wait operations on every GPU"))
    no_fd = [g["index"] for g in gpus if not g["vmm_posix_fd"]]
    if no_fd:
        out.append(
            (
                "warn",
                f"GPU(s) {no_fd} cannot export VMM memory as file descriptors: a communicator of one process per GPU "
                "(and a symmetric heap across processes) cannot run there; one process driving every GPU "
                "(ferry.init_local) can",
            )
        )
    missing = [(i, j) for i in range(len(gpus)) for j in range(len(gpus)) if i != j and not d["p2p"][i][j]]
    if missing:
        out.append(
            (
                "fail",
                f"no peer-to-peer access between GPU pairs {missing[:8]}{'...' if len(missing) > 8 else ''}: "
                "copy-engine collectives need every pair reachable",
            )
        )
    elif len(gpus) > 1:
        via = "NVSwitch" if all(g["nvswitch_links"] for g in gpus) else "NVLink/PCIe"
        out.append(("ok", f"every GPU pair reachable peer-to-peer ({via})"))
    few = [g["index"] for g in gpus if g["copy_engines"] < 2]
    if few:
        out.append(("warn", f"GPU(s) {few} report fewer than 2 copy engines: pcpy gains little there"))
    return out

"""ferry: copy-engine (DMA) collectives for multi-GPU machine learning.

    import ferry
    comm = ferry.init()                      # one process per GPU (torchrun / mpirun)
    out = comm.alloc((world * n,), torch.bfloat16)
    comm.all_gather(out, inp)                # ordered in the current torch stream

`import ferry` works without a GPU or driver; GPU calls then raise NoGpuError
with an explanation. See docs/api.md.
"""

from . import kv, multipath, offload, symm
from ._native import IMPORT_ERROR, native
from .bootstrap import LaunchInfo, TcpStore, read_launch_env
from .comm import Communicator, PreparedCollective, init, init_local
from .errors import (
    BrokenError,
    ClosedError,
    CudaError,
    FerryError,
    InvalidArgumentError,
    NoGpuError,
    NotRegisteredError,
    OutOfMemoryError,
    PeerTimeoutError,
    SystemCallError,
    UnsupportedError,
)

__version__ = "0.1.0"

multipath_copy = multipath.copy


def gpu_available() -> bool:
    """True when a CUDA driver loads (no GPU call is made otherwise)."""
    return native is not None and native.driver_available()


def get_include() -> str:
    """The folder of ferry's C and CUDA headers (``ferry/ferry.h``, the device
    API ``ferry/device/*.cuh``), for a user's own extension: pass it as an
    include directory (e.g. torch.utils.cpp_extension's extra_include_paths)."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "include"), os.path.join(here, "..", "..", "include")):
        if os.path.isfile(os.path.join(candidate, "ferry", "device", "heap.cuh")):
            return os.path.normpath(candidate)
    raise FileNotFoundError("ferry's headers are not installed next to the package; reinstall ferry")


def select_algo(op: str, world: int, bytes_per_rank: int, algo: str = "auto") -> str:
    """The variant ferry runs for a call: 'pcpy' or 'b2b' (pure; no GPU needed)."""
    from ._native import require

    return require().select_variant(op, world, bytes_per_rank, algo)[0]


__all__ = [
    "IMPORT_ERROR",
    "BrokenError",
    "ClosedError",
    "Communicator",
    "PreparedCollective",
    "CudaError",
    "FerryError",
    "InvalidArgumentError",
    "LaunchInfo",
    "NoGpuError",
    "NotRegisteredError",
    "OutOfMemoryError",
    "PeerTimeoutError",
    "SystemCallError",
    "TcpStore",
    "UnsupportedError",
    "get_include",
    "gpu_available",
    "init",
    "init_local",
    "kv",
    "multipath",
    "multipath_copy",
    "offload",
    "read_launch_env",
    "select_algo",
    "symm",
]

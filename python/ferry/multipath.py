"""Multipath host<->GPU copies: one large copy split into chunks that travel
over several GPUs' host (PCIe) links at once, relayed through peer GPUs over
NVLink, on copy engines only (no kernel, no SM).

    import ferry
    ferry.multipath_copy(gpu_tensor, pinned_cpu_tensor)      # host -> GPU, current stream's order
    ferry.multipath_copy(pinned_cpu_tensor, gpu_tensor)      # GPU -> host

    eng = ferry.multipath.Engine(devices=[0, 1, 2, 3], relays=[1, 2, 3])
    eng.copy(dst, src, stream=s)

Stream order is the one of ``cudaMemcpyAsync``: the copy starts when ``stream``
(default: the current torch stream of the GPU side's device) gets to it, and
work queued there afterwards sees all of it. Between the two, ferry's thread
feeds each link a chunk whenever that link's queue has room (back-pressure:
a busy link takes fewer chunks). A copy runs as one plain ``cudaMemcpyAsync``
below ``min_bytes`` (FERRY_MULTIPATH_MIN_BYTES), for pageable host memory,
while the stream captures a CUDA graph, and where no GPU may relay;
FERRY_DEBUG=1 prints why. docs/multipath.md has the measurements.
"""

from __future__ import annotations

import math
import numbers
import threading
from typing import Any, Optional, Sequence, Union

from . import _streams
from ._args import integer
from ._native import require
from .errors import BrokenError, InvalidArgumentError


def _torch():
    import torch

    return torch


def _side(t, name: str):
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise InvalidArgumentError(f"{name} is a {type(t).__name__}; expected a torch tensor")
    if not t.is_contiguous():
        raise InvalidArgumentError(f"{name} is not contiguous; multipath copies move one contiguous range")
    return t


_MAX = (1 << 63) - 1


def _int(name: str, v, lo: int, hi: int = _MAX) -> int:
    """`v` as an int in [lo, hi], or an error naming `name`."""
    i = integer(v, name)
    if not lo <= i <= hi:
        raise InvalidArgumentError(f"{name} is {v}; expected {lo}..{hi}")
    return i


def _pair(dst, src, dst_name: str, src_name: str):
    """(bytes, the GPU tensor) of one copy, or an error naming the argument."""
    dst, src = _side(dst, dst_name), _side(src, src_name)
    nbytes = dst.numel() * dst.element_size()
    if nbytes != src.numel() * src.element_size():
        raise InvalidArgumentError(
            f"{dst_name} holds {nbytes} bytes and {src_name} {src.numel() * src.element_size()}; "
            "expected the same size"
        )
    if dst.is_cuda == src.is_cuda:
        where = "CUDA" if dst.is_cuda else "CPU"
        raise InvalidArgumentError(
            f"{dst_name} and {src_name} are both {where} tensors; a multipath copy moves between host and GPU "
            "(one side each)"
        )
    return nbytes, dst if dst.is_cuda else src


def _stream(stream, gpu):
    """(handle, its GPU) of `stream` for a copy whose GPU side is `gpu`. A
    default stream's handle (0) names no GPU: it is `gpu`'s."""
    if stream is None:
        return _streams.current(gpu.device.index), gpu.device.index
    if isinstance(stream, int):
        return _int("stream", stream, 0), gpu.device.index
    handle = getattr(stream, "cuda_stream", None)
    device = getattr(getattr(stream, "device", None), "index", None)
    if handle is None or device is None:
        raise InvalidArgumentError(
            f"stream is a {type(stream).__name__}; expected a torch.cuda.Stream or an int handle"
        )
    return handle, device


class Engine:
    """Multipath copies over the host links of ``devices`` (default: every
    visible GPU). ``relays``: "all", "idle" (a GPU relays only while no
    other program runs on it, as NVML lists them, looked at every half
    second) or the GPUs that may carry other GPUs' chunks. ``chunk_bytes`` / ``min_bytes`` default to the knobs
    FERRY_MULTIPATH_CHUNK_BYTES / FERRY_MULTIPATH_MIN_BYTES. ``outstanding``:
    chunks in flight per link (each relay GPU holds that many staging buffers
    of ``chunk_bytes``). ``own_link_first``: a GPU's link serves its own copies
    before relaying. ``loopback`` (testing on one GPU): add this many relay
    links through ``devices[0]`` itself, so that staging and both pipelines
    run for real over one link. ``head_bytes``: the most of a copy's head
    that the caller's stream copies itself over the target's link while the
    engine starts the rest (-1: FERRY_MULTIPATH_HEAD_BYTES, default 0: none).
    ``own_share_on_stream``: the caller's stream copies the target link's
    share itself and the relays carry the rest, so nothing reaches the target
    GPU after ``copy`` returns (None: FERRY_MULTIPATH_OWN_SHARE_ON_STREAM,
    default off, on under the LD_PRELOAD library; docs/multipath.md, "Hazards").
    Engines of several programs on one machine keep off each other's GPUs'
    links where every GPU is copied by its own program (the link board,
    FERRY_MULTIPATH_BOARD; docs/multipath.md, "How a copy runs")."""

    def __init__(
        self,
        devices: Optional[Sequence[int]] = None,
        *,
        relays: Union[str, Sequence[int]] = "all",
        chunk_bytes: int = 0,
        min_bytes: int = 0,
        outstanding: int = 3,
        own_link_first: bool = True,
        loopback: int = 0,
        timeout: float = 0.0,
        head_bytes: int = -1,
        own_share_on_stream: Optional[bool] = None,
    ):
        if devices is None:
            devices = list(range(_torch().cuda.device_count()))
        if not isinstance(devices, (list, tuple, range)):
            raise InvalidArgumentError(f"devices is {devices!r}; expected a list of GPU ordinals")
        devices = [_int("devices", d, 0) for d in devices]
        if not devices:
            raise InvalidArgumentError("devices: expected at least one GPU")
        if len(set(devices)) != len(devices):
            raise InvalidArgumentError(
                f"devices: {devices} lists a GPU twice (loopback= adds relays through one GPU)"
            )
        loopback = _int("loopback", loopback, 0, 64)
        links = devices + [devices[0]] * loopback
        if isinstance(relays, str):
            if relays not in ("all", "idle"):
                raise InvalidArgumentError(f"relays is '{relays}'; expected 'all', 'idle' or a list of GPUs")
            may_relay = [True] * len(links)
        elif not isinstance(relays, (list, tuple, range, set)):
            raise InvalidArgumentError(f"relays is {relays!r}; expected 'all', 'idle' or a list of GPUs")
        else:
            allowed = {_int("relays", r, 0) for r in relays}
            unknown = allowed - set(devices)
            if unknown:
                raise InvalidArgumentError(f"relays: {sorted(unknown)} are not among devices {devices}")
            may_relay = [d in allowed for d in devices] + [devices[0] in allowed] * loopback
        chunk_bytes = _int("chunk_bytes", chunk_bytes, 0)  # 0: the knob's
        if 0 < chunk_bytes < 65536:  # (checked here too: the engine touches every GPU first)
            raise InvalidArgumentError(
                f"chunk_bytes is {chunk_bytes}; expected 64 KiB (65536) to 1 TiB, or 0 for FERRY_MULTIPATH_CHUNK_BYTES"
            )
        min_bytes = _int("min_bytes", min_bytes, 0)
        head_bytes = _int("head_bytes", head_bytes, -1)  # -1: FERRY_MULTIPATH_HEAD_BYTES, 0: none
        outstanding = _int("outstanding", outstanding, 1, 16)
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise InvalidArgumentError(f"timeout is {timeout!r}; expected seconds, or 0 for FERRY_TIMEOUT_S")
        if not (float(timeout) >= 0 and math.isfinite(float(timeout))):
            raise InvalidArgumentError(f"timeout is {timeout}; expected seconds, or 0 for FERRY_TIMEOUT_S")
        self._e = None
        self._e = require().MultipathEngine(
            links,
            chunk_bytes,
            min_bytes,
            outstanding,
            bool(own_link_first),
            may_relay,
            float(timeout),
            head_bytes,
            -1 if own_share_on_stream is None else int(bool(own_share_on_stream)),
            relays == "idle",
        )

    def _engine(self):
        if self._e is None:
            raise InvalidArgumentError("the multipath engine is closed")
        return self._e

    def copy(self, dst, src, stream=None) -> dict:
        """Copies ``src`` into ``dst`` (same number of bytes; one a CUDA tensor
        on one of ``devices``, the other a CPU tensor, pinned for multipath) in
        ``stream``'s order (None: the GPU tensor's current stream; an int
        handle 0 is the GPU tensor's default stream); a GPU not among
        ``devices`` gets one plain copy. Returns ``{"multipath", "reason", "chunks", "links"}``: what ran and,
        for a plain copy, why. Keep both tensors alive until the stream passed it."""
        nbytes, gpu = _pair(dst, src, "dst", "src")
        handle, device = _stream(stream, gpu)
        multipath, reason, chunks, links = self._engine().copy(
            dst.data_ptr(), src.data_ptr(), nbytes, handle, device
        )
        return {"multipath": multipath, "reason": reason, "chunks": chunks, "links": links}

    def copy_batch(self, dsts: Sequence[Any], srcs: Sequence[Any], stream=None) -> dict:
        """Copies ``srcs[i]`` into ``dsts[i]`` for every i as one copy in
        ``stream``'s order: all host to one GPU, or all from one GPU to host
        (e.g. every weight of a model). One start and one finish, with the
        links kept busy from the first byte to the last instead of filled and
        drained once per tensor. Destinations may not overlap. Below
        ``min_bytes`` in total, each runs as a plain copy. Returns what
        ``copy`` returns."""
        dsts, srcs = list(dsts), list(srcs)
        if len(dsts) != len(srcs):
            raise InvalidArgumentError(f"dsts has {len(dsts)} tensors and srcs {len(srcs)}; expected as many")
        if not dsts:
            return {"multipath": False, "reason": "zero bytes", "chunks": 0, "links": 0}
        sizes, gpus = [], []
        for i, (d, s) in enumerate(zip(dsts, srcs)):
            nbytes, gpu = _pair(d, s, f"dsts[{i}]", f"srcs[{i}]")
            sizes.append(nbytes)
            gpus.append(gpu)
            if gpu.device != gpus[0].device or d.is_cuda != dsts[0].is_cuda:
                side, first = ("dsts" if d.is_cuda else "srcs"), ("dsts" if dsts[0].is_cuda else "srcs")
                raise InvalidArgumentError(
                    f"{side}[{i}] is on {gpu.device}; expected every copy of a batch the way of the first "
                    f"({first}[0] on {gpus[0].device})"
                )
        handle, device = _stream(stream, gpus[0])
        multipath, reason, chunks, links = self._engine().copy_batch(
            [t.data_ptr() for t in dsts], [t.data_ptr() for t in srcs], sizes, handle, device
        )
        return {"multipath": multipath, "reason": reason, "chunks": chunks, "links": links}

    def synchronize(self) -> None:
        """Waits until every copy so far landed (bounded by the timeout); raises
        the error one of them met."""
        self._engine().synchronize()

    def check(self) -> None:
        """Raises the first error a copy met (its stream was let go; the data of
        that copy is not complete)."""
        self._engine().check()

    def bytes_by_link(self) -> list:
        """Host-link bytes each link carried so far, in the order of ``links``."""
        return list(self._engine().bytes_by_link())

    @property
    def links(self) -> list:
        """The GPU of each host link (``devices``, then the loopback relays)."""
        return list(self._engine().link_devices)

    @property
    def relays(self) -> list:
        """Whether each link may relay (False where it may not, cannot reach the
        others peer to peer, or had no room for its staging buffers)."""
        return list(self._engine().may_relay())

    @property
    def staging(self) -> str:
        """Where the relays' staging buffers are: on a symmetric heap over the
        relaying GPUs (ferry's memory layer), plain allocations where the
        heap could not be had (FERRY_DEBUG=1 says why), or "none" where no
        link relays (one GPU without loopback relays)."""
        return self._engine().staging

    @property
    def chunk_bytes(self) -> int:
        return self._engine().chunk_bytes

    @property
    def min_bytes(self) -> int:
        return self._engine().threshold_bytes

    def close(self) -> None:
        """Waits (bounded by the timeout) for the copies in flight, then frees the
        staging buffers (later, once no prepared transfer or collective is armed
        and not yet triggered); a second call does nothing. Past the bound the
        streams waiting on copies are let go (said on stderr). Raises
        BrokenError, once closed, when a copy failed and no call raised it yet."""
        if self._e is not None:
            try:
                self._e.close()
            finally:
                self._e = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def preload_library() -> str:
    """The path of libferry_preload.so: with ``LD_PRELOAD=<it>``, an unmodified
    program's ``cudaMemcpy`` / ``cudaMemcpyAsync`` between pinned host memory
    and a GPU, from FERRY_MULTIPATH_MIN_BYTES up, go through the multipath
    engine over every visible GPU (docs/multipath.md, "Transparent mode")."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    lib = os.path.join(here, "lib")  # installed with the package, beside libferry.so
    if os.path.isfile(os.path.join(lib, "libferry_preload.so")) and os.path.isfile(
        os.path.join(lib, "libferry.so")
    ):
        return os.path.join(lib, "libferry_preload.so")
    raise FileNotFoundError("libferry_preload.so is not installed next to the package; reinstall ferry")


_default: Optional[Engine] = None
_default_lock = threading.Lock()


def default_engine() -> Engine:
    """The engine ``copy`` uses: every visible GPU, made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Engine()
        return _default


def _on_default(call):
    global _default
    engine = default_engine()
    try:
        engine.check()
        return call(engine)
    except BrokenError:
        with _default_lock:
            if _default is engine:
                _default = None
        engine.close()
        raise


def copy(dst, src, stream=None) -> dict:
    """``Engine.copy`` on the default engine (every visible GPU may relay). An
    error a copy met is raised once; the next call gets a new engine."""
    return _on_default(lambda e: e.copy(dst, src, stream))


def copy_batch(dsts, srcs, stream=None) -> dict:
    """``Engine.copy_batch`` on the default engine, as ``copy``."""
    return _on_default(lambda e: e.copy_batch(dsts, srcs, stream))

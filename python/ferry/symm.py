"""Symmetric memory: a heap every rank allocates from in step, so that an
object sits at the same offset on every rank and a kernel reaches a peer's
copy by arithmetic (the device API in ``ferry.get_include()``, headers
``ferry/device/*.cuh``).

    import ferry, ferry.symm
    comm = ferry.init()                          # or ferry.init_local() / Communicator.from_torch()
    heap = ferry.symm.Heap(comm)                 # collective; address space only
    x = heap.empty((1024,), torch.float32)       # collective; the same offset on every rank
    left = heap.peer(x, (comm.rank - 1) % comm.world)   # the left neighbour's x, mapped here
    my_kernel[grid](heap.handle().as_bytes(), x)        # plain struct, by value

With one process per rank every call is made by every process, with the same
arguments in the same order (a rank that does not is named). With
``ferry.init_local()`` one process drives every rank and each call returns or
takes one tensor per local rank. See docs/symm.md.
"""

from __future__ import annotations

import ctypes
import operator
import os
from dataclasses import dataclass
from typing import Any, Optional

from ._args import integer, shape_of
from ._native import require
from .comm import Communicator, _describe, _DeviceMemory, _stream_handle
from .errors import ClosedError, InvalidArgumentError

__all__ = ["Heap", "HeapHandle", "load_kernels"]


def load_kernels(name: str, sources, extra_cuda_cflags=("-O3",)) -> ctypes.CDLL:
    """Builds CUDA sources written on ferry's device API into a shared library
    with torch's cpp_extension (``ferry.get_include()`` on the include path;
    built once, then cached) and loads it with ctypes. Their ``extern "C"``
    launchers take the heap handle as bytes (``HeapHandle.as_bytes()``; in the
    kernel source ``ferry::device::heap_from_bytes``)."""
    from torch.utils import cpp_extension

    from . import get_include

    path = cpp_extension.load(
        name=name,
        sources=list(sources),
        extra_include_paths=[get_include()],
        extra_cuda_cflags=list(extra_cuda_cflags),
        is_python_module=False,
        verbose=False,
    )
    if not isinstance(path, str):  # torch versions that load it without saying where
        path = os.path.join(cpp_extension._get_build_directory(name, False), f"{name}.so")
    return ctypes.CDLL(path)


@dataclass(frozen=True)
class HeapHandle:
    """The heap as one rank's kernels see it: ``ferry::device::Heap``
    (include/ferry/device/heap.cuh). ``as_bytes()`` is that struct, to pass
    by value (ctypes, a raw kernel argument); the fields serve Triton."""

    base: int
    stride: int
    rank: int
    world: int
    fault: int
    timeout_ns: int
    raw: bytes

    def as_bytes(self) -> bytes:
        return self.raw

    def peer_address(self, address: int, peer: int) -> int:
        """`address` (in this rank's heap) as `peer`'s copy of the same object."""
        return address + (peer - self.rank) * self.stride


class Heap:
    """A symmetric heap over the ranks of `comm` (collective).

    `capacity`: bytes of each rank's heap (default FERRY_SYMM_HEAP_BYTES,
    32 GiB). It is address space: physical GPU memory is mapped as
    allocations need it, in chunks of at least FERRY_SYMM_CHUNK_BYTES.
    Allocations larger than 2 GiB are fine. Close the heap before the
    communicator (closing the communicator closes its heaps)."""

    def __init__(self, comm: Communicator, capacity: Optional[int] = None):
        if not isinstance(comm, Communicator):
            raise InvalidArgumentError(f"comm is a {type(comm).__name__}; expected a ferry Communicator")
        comm._check_open("symm.Heap")
        self._comm = comm
        self._local = comm._local
        self._devices = comm.devices  # its ranks' GPUs, also where the native communicator closed first
        capacity = 0 if capacity is None else integer(capacity, "symm.Heap: capacity")
        if capacity < 0:
            raise InvalidArgumentError(
                f"symm.Heap: capacity is {capacity}; expected bytes, or None for FERRY_SYMM_HEAP_BYTES"
            )
        self._h = require().SymmetricHeap.create(comm._c, capacity)
        comm._heaps.append(self)

    @classmethod
    def from_torch(cls, group=None, capacity: Optional[int] = None, device: Optional[int] = None) -> "Heap":
        """A heap over a torch.distributed group (default: the world), with a
        communicator of its own bootstrapped through the group."""
        comm = Communicator.from_torch(group, device=device)
        try:
            heap = cls(comm, capacity)
        except BaseException:
            comm.close()
            raise
        heap._owns_comm = True
        return heap

    # ------------------------------------------------------------ properties

    @property
    def comm(self) -> Communicator:
        return self._comm

    @property
    def capacity(self) -> int:
        return self._h.capacity

    @property
    def used(self) -> int:
        """Bytes in live allocations (each rounded up to 256)."""
        return self._h.used

    @property
    def mapped(self) -> int:
        """Bytes of physical memory mapped under each rank's heap."""
        return self._h.mapped

    @property
    def closed(self) -> bool:
        return self._h.closed

    def _open(self, what: str):
        if self._h.closed:
            raise ClosedError(f"{what}: the heap is closed")

    # ------------------------------------------------------------ memory

    def empty(self, shape, dtype=None, align: int = 256):
        """Uninitialised tensor(s) on the heap, at the same offset on every
        rank (collective). One tensor, or with init_local one per local rank
        (each rank's own copy). Refused while the current stream captures a
        CUDA graph if new memory must be mapped: reserve() first."""
        self._open("empty")
        shape = shape_of(shape, "empty")
        import torch

        dtype = torch.float32 if dtype is None else dtype
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        streams = [_stream_handle(None, d) for d in self._devices]
        offset = self._h.alloc(nbytes, int(align), streams)
        out = [
            self._tensor(self._h.rank(i), offset, nbytes, self._devices[i], dtype, shape)
            for i in range(self._h.local_count)
        ]
        return out if self._local else out[0]

    def zeros(self, shape, dtype=None, align: int = 256):
        """empty(), then zeroed on each rank's current stream (collective)."""
        ts = self.empty(shape, dtype, align)
        for t in ts if self._local else [ts]:
            t.zero_()
        return ts

    def free(self, tensors) -> None:
        """Frees what empty() returned (collective). Views of it become invalid."""
        self._open("free")
        first = self._comm._per_rank(tensors, "free")[0]
        b = _describe(first, "free: tensor")
        _, offset = self._h.locate(b.ptr, max(b.nbytes, 1), "free: tensor")
        self._h.free(offset)

    def reserve(self, nbytes: int) -> None:
        """Maps physical memory under the first `nbytes` of the heap, so that
        allocations within them map nothing (e.g. during graph capture). Collective."""
        self._open("reserve")
        self._h.reserve(int(nbytes))

    def register(self, tensors):
        """Maps existing GPU memory into the heap (collective): returns tensor(s)
        at the heap's addresses over the same memory, of the same shape and
        dtype, at the same offset on every rank, usable with put/get/peer and
        in kernels. Writes through either tensor are writes to the one memory.

        The memory must come from CUDA's virtual memory management
        (``cuMemCreate``): PyTorch's allocator with
        ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, or a ferry heap;
        memory from ``cudaMalloc`` (PyTorch's default) cannot be mapped twice
        and is refused. Each rank's tensor must have the same size and start
        at the same offset within its 2 MiB granule. The heap keeps the memory
        until :meth:`deregister`, even if its owner frees it first. With
        init_local, one tensor per local rank. Refused while the current stream
        captures a CUDA graph."""
        self._open("register")
        ts = self._comm._per_rank(tensors, "register")
        bufs = [_describe(t, "register: tensor") for t in ts]
        if len({b.nbytes for b in bufs}) != 1:
            raise InvalidArgumentError(
                f"register: the tensors have {[b.nbytes for b in bufs]} bytes; expected the same size on every rank"
            )
        streams = [_stream_handle(None, d) for d in self._devices]
        offset = self._h.register_memory([b.ptr for b in bufs], bufs[0].nbytes, streams)
        out = [
            self._tensor(self._h.rank(i), offset, bufs[i].nbytes, self._devices[i], t.dtype, tuple(t.shape))
            for i, t in enumerate(ts)
        ]
        return out if self._local else out[0]

    def deregister(self, tensors) -> None:
        """Unmaps what register() returned (collective); the owner's tensor
        stays valid. Work queued on the heap's addresses of it must be
        finished first (as for free()). Refused during graph capture."""
        self._open("deregister")
        first = self._comm._per_rank(tensors, "deregister")[0]
        _, offset, _ = self._where(first, "deregister: tensor")
        self._h.deregister(offset, [_stream_handle(None, d) for d in self._devices])

    def _tensor(self, rank: int, offset: int, nbytes: int, device: int, dtype, shape):
        import torch

        itemsize = torch.empty((), dtype=dtype).element_size()
        numel = nbytes // itemsize
        # A zero-size tensor keeps its heap address (free() and peer() find it by it).
        holder = _DeviceMemory(self._h.at(rank, offset), max(nbytes, itemsize), device)
        with torch.cuda.device(device):
            t = torch.as_tensor(holder, device=f"cuda:{device}").view(dtype)
        return t[:numel].view(shape)

    def _where(self, t: Any, what: str, nbytes: Optional[int] = None):
        """(rank, offset, buffer) of a tensor on the heap."""
        b = _describe(t, what)
        rank, offset = self._h.locate(b.ptr, max(b.nbytes if nbytes is None else nbytes, 1), what)
        return rank, offset, b

    def _local_of(self, rank: int, what: str) -> int:
        for i in range(self._h.local_count):
            if self._h.rank(i) == rank:
                return i
        raise InvalidArgumentError(
            f"{what} is rank {rank}'s copy; this process drives ranks "
            f"{[self._h.rank(i) for i in range(self._h.local_count)]}"
        )

    def peer(self, tensor, rank: int):
        """`rank`'s copy of `tensor` (a heap tensor, or a view inside one),
        mapped in this process: same shape and dtype, on the device of
        `tensor`. Reads and writes go over NVLink (or PCIe) from SMs."""
        self._open("peer")
        if isinstance(rank, bool) or not hasattr(rank, "__index__"):
            raise InvalidArgumentError(f"rank is {rank!r}; expected an integer 0..{self._h.world - 1}")
        rank = operator.index(rank)
        if not 0 <= rank < self._h.world:
            raise InvalidArgumentError(f"rank is {rank!r}; expected 0..{self._h.world - 1}")
        import torch

        _, offset, b = self._where(tensor, "peer: tensor")
        ptr = self._h.at(rank, offset)
        base = torch.as_tensor(_DeviceMemory(ptr, b.nbytes, tensor.device.index), device=tensor.device)
        return base.view(tensor.dtype).view(tensor.shape)

    def peer_ptrs(self, tensor):
        """Every rank's address of `tensor` as an int64 tensor on its device
        (a pointer table for Triton kernels)."""
        import torch

        _, offset, _ = self._where(tensor, "peer_ptrs: tensor")
        return torch.tensor(
            [self._h.at(r, offset) for r in range(self._h.world)], dtype=torch.int64, device=tensor.device
        )

    def handle(self, local: int = 0) -> HeapHandle:
        """The handle kernels of local rank `local` take (by value)."""
        self._open("handle")
        base, stride, rank, world, fault, timeout_ns, raw = self._h.handle(int(local))
        return HeapHandle(base, stride, rank, world, fault, timeout_ns, bytes(raw))

    def check(self) -> None:
        """Raises PeerTimeoutError naming the rank a device-side or stream
        wait gave up on (the waits of the device API and of this class are
        bounded by the communicator's timeout), or InvalidArgumentError for a
        call a kernel refused (a team without this rank, a grid too large, a
        root outside the team). Such a fault stays with the heap: from then on
        wait() and barrier_on_stream() are refused and device waits give up,
        so close the heap. After close(), raises what the heap had then."""
        self._h.check()

    # ------------------------------------------------------------ on a stream (copy engines, no kernel)

    def _call_args(self, t: Any, what: str, nbytes: Optional[int] = None):
        rank, _, b = self._where(t, what, nbytes)
        local = self._local_of(rank, what)
        return local, b

    def put(self, dst, src, peer: int, stream=None) -> None:
        """Copies `src` (device memory) into `peer`'s copy of `dst` (a heap
        tensor of this rank), in stream order, on a copy engine."""
        self._open("put")
        peer = integer(peer, "put: peer")
        s = _describe(src, "put: src")
        local, d = self._call_args(dst, "put: dst")
        if s.nbytes != d.nbytes:
            raise InvalidArgumentError(
                f"put: src has {s.nbytes} bytes and dst {d.nbytes}; expected equal sizes"
            )
        self._h.put(local, d.ptr, s.ptr, d.nbytes, peer, _stream_handle(stream, self._devices[local]))

    def get(self, dst, src, peer: int, stream=None) -> None:
        """Copies `peer`'s copy of `src` (a heap tensor of this rank) into
        `dst`, in stream order, on a copy engine."""
        self._open("get")
        peer = integer(peer, "get: peer")
        d = _describe(dst, "get: dst")
        local, s = self._call_args(src, "get: src")
        if s.nbytes != d.nbytes:
            raise InvalidArgumentError(
                f"get: src has {s.nbytes} bytes and dst {d.nbytes}; expected equal sizes"
            )
        self._h.get(local, d.ptr, s.ptr, d.nbytes, peer, _stream_handle(stream, self._devices[local]))

    def _word(self, sig, what: str):
        local, b = self._call_args(sig, what, 8)
        if b.nbytes < 8 or b.ptr % 8:
            raise InvalidArgumentError(f"{what} must be an aligned 64-bit heap word (int64 or uint64 tensor)")
        return local, b

    def signal(self, sig, value: int, peer: int, stream=None) -> None:
        """Sets `peer`'s copy of the 64-bit word `sig` to `value` once the
        stream gets there (a copy-engine copy of 8 bytes)."""
        self._open("signal")
        value, peer = integer(value, "signal: value"), integer(peer, "signal: peer")
        local, b = self._word(sig, "signal: sig")
        self._h.signal(local, b.ptr, value, peer, _stream_handle(stream, self._devices[local]))

    def wait(self, sig, value: int, from_rank: int = -1, stream=None) -> None:
        """Holds the stream until this rank's `sig` is at least `value`. Bounded
        by the communicator's timeout: past it the stream is let go and check()
        raises, naming `from_rank` (the rank expected to signal)."""
        self._open("wait")
        value, from_rank = integer(value, "wait: value"), integer(from_rank, "wait: from_rank")
        local, b = self._word(sig, "wait: sig")
        self._h.wait(local, b.ptr, value, from_rank, _stream_handle(stream, self._devices[local]))

    def barrier_on_stream(self, stream=None, kernel: bool = False) -> None:
        """Holds each rank's stream until every rank's stream got to this
        barrier (collective; with init_local, one stream per local rank or
        None). By default copy engines carry it and no kernel runs; it cannot
        be captured in a CUDA graph. kernel=True: one warp per rank runs the
        device API's barrier instead (an SM for a few microseconds, about a
        third of the copy engines' GPU time; docs/symm.md), which can be
        captured. It is launched as a programmatic dependent: its launch
        overlaps the end of the kernel before it on the stream."""
        self._open("barrier_on_stream")
        devices = self._devices
        if self._local:
            streams = [None] * len(devices) if stream is None else self._comm._per_rank(stream, "stream")
        else:
            streams = [stream]
        self._h.barrier_on_stream(
            [_stream_handle(s, devices[i]) for i, s in enumerate(streams)], bool(kernel)
        )

    def quiet(self, stream=None) -> None:
        """Holds `stream` until every put, get and signal of this rank (with
        init_local: of each local rank, one stream each or None) made through
        the heap on any stream has completed, so that a peer told afterwards
        sees them; no kernel. Calls on `stream` itself are before it already.
        A stream capturing a CUDA graph is refused (the graph orders what it
        captured)."""
        self._open("quiet")
        devices = self._devices
        if self._local:
            streams = [None] * len(devices) if stream is None else self._comm._per_rank(stream, "stream")
        else:
            streams = [stream]
        for i, s in enumerate(streams):
            self._h.quiet(i, _stream_handle(s, devices[i]))

    def close(self) -> None:
        """Unmaps this process's view of the heap (not collective). Tensors on it
        become invalid: finish the work that uses them first (synchronize their
        streams); closing does not wait for it. While a prepared transfer or
        collective is armed and not yet triggered, the memory is unmapped
        later, once none is (unmapping waits for every stream of the GPU, the
        armed one too)."""
        if not self._h.closed:
            self._h.close()
        if self in self._comm._heaps:
            self._comm._heaps.remove(self)
        if getattr(self, "_owns_comm", False):
            self._comm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

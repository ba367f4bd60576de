"""The Python face of a ferry communicator: torch tensors (or any object with
__cuda_array_interface__) in, collectives ordered in the caller's stream."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, List, Optional

from ._native import require
from .bootstrap import AllGather, TcpStore, TorchStore, group_allgather, read_launch_env, store_allgather
from .errors import ClosedError, InvalidArgumentError

_ALGOS = ("auto", "pcpy", "b2b", "seq")
_LOCAL_COPIES = ("auto", "ce", "sm")


@dataclass
class _Buffer:
    ptr: int
    nbytes: int
    device: int
    dtype: str


def _describe(obj: Any, what: str) -> _Buffer:
    """Pointer, size, device and dtype of a tensor-like argument, with an error
    naming `what` for anything ferry cannot use."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous"):  # a torch.Tensor
        if not obj.is_cuda:
            raise InvalidArgumentError(f"{what} is on {obj.device}; expected a CUDA tensor")
        if not obj.is_contiguous():
            raise InvalidArgumentError(f"{what} is not contiguous; pass {what}.contiguous()")
        return _Buffer(obj.data_ptr(), obj.numel() * obj.element_size(), obj.device.index, str(obj.dtype))
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        raise InvalidArgumentError(
            f"{what} is a {type(obj).__name__}; expected a CUDA torch.Tensor or an object with "
            "__cuda_array_interface__ (host arrays cannot be used)"
        )
    shape, typestr = tuple(cai["shape"]), cai["typestr"]
    itemsize = int(typestr[2:])
    n = 1
    for s in shape:
        n *= s
    strides = cai.get("strides")
    if strides is not None:
        expected, acc = [], itemsize
        for s in reversed(shape):
            expected.append(acc)
            acc *= s
        if tuple(reversed(expected)) != tuple(strides) and n > 1:
            raise InvalidArgumentError(f"{what} is not contiguous (strides {strides})")
    # The native layer checks where the pointer lives (host, which GPU).
    return _Buffer(cai["data"][0], n * itemsize, -1, typestr)


def _stream_handle(stream: Any, device: int) -> int:
    if stream is None:
        try:
            import torch

            return torch.cuda.current_stream(device).cuda_stream
        except ImportError:
            return 0
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        raise InvalidArgumentError(
            f"stream is a {type(stream).__name__}; expected a torch.cuda.Stream or an int handle"
        )
    return handle


class Communicator:
    """A set of ranks (one GPU each) that run copy-engine collectives together.

    Create one with :func:`ferry.init` (one process per GPU, under torchrun or
    mpirun), :meth:`from_torch` (reuse a torch.distributed group), or
    :func:`ferry.init_local` (one process driving several GPUs). In the last
    case every tensor argument is a list with one tensor per GPU.
    """

    def __init__(self, native_comm, local: bool):
        self._c = native_comm
        self._local = local
        self._allocs: dict = {}
        self._store = None  # ferry's own TCP store, kept for later collective calls

    # ------------------------------------------------------------ creation

    @classmethod
    def create(cls, rank: int, world: int, device: int, allgather: AllGather, timeout: float = 0.0):
        return cls(require().Communicator.create(rank, world, device, allgather, timeout), local=False)

    @classmethod
    def from_torch(cls, group=None, device: Optional[int] = None, timeout: float = 0.0):
        """A communicator over the ranks of a torch.distributed process group
        (default: the world), bootstrapped through the group itself."""
        import torch
        import torch.distributed as dist

        rank, world = dist.get_rank(group), dist.get_world_size(group)
        if device is None:
            device = torch.cuda.current_device()
        return cls.create(rank, world, device, group_allgather(group), timeout)

    # ------------------------------------------------------------ properties

    @property
    def world(self) -> int:
        return self._c.world

    @property
    def rank(self) -> int:
        """This process's rank (for init_local: rank of the first GPU, i.e. 0)."""
        return self._c.rank(0)

    @property
    def device(self) -> int:
        return self._c.device(0)

    @property
    def devices(self) -> List[int]:
        return [self._c.device(i) for i in range(self._c.local_count)]

    @property
    def closed(self) -> bool:
        return self._c.closed

    def _check_open(self, what: str):
        if self._c.closed:
            raise ClosedError(f"{what}: the communicator is closed")

    def _per_rank(self, value: Any, what: str) -> list:
        if self._local:
            if not isinstance(value, (list, tuple)) or len(value) != self._c.local_count:
                raise InvalidArgumentError(
                    f"{what}: this communicator drives {self._c.local_count} GPUs; pass a list with one per GPU"
                )
            return list(value)
        return [value]

    # ------------------------------------------------------------ buffers

    def alloc(self, shape, dtype=None):
        """Peer-visible device memory (CUDA VMM), registered with this
        communicator, as torch tensor(s) of `shape` and `dtype` (default uint8).
        Valid until :meth:`free` or :meth:`close`. Collective."""
        import torch

        self._check_open("alloc")
        dtype = torch.uint8 if dtype is None else dtype
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        ptrs = self._c.alloc(nbytes)
        tensors = []
        for i, ptr in enumerate(ptrs):
            dev = self._c.device(i)
            holder = _DeviceMemory(ptr, nbytes, dev)
            with torch.cuda.device(dev):
                t = torch.as_tensor(holder, device=f"cuda:{dev}").view(dtype).view(shape)
            tensors.append(t)
        self._allocs[ptrs[0]] = ptrs
        return tensors if self._local else tensors[0]

    def free(self, tensors) -> None:
        """Releases memory from :meth:`alloc` (tensors using it become invalid)."""
        ptrs = [_describe(t, "tensor").ptr for t in self._per_rank(tensors, "free")]
        self._c.free(ptrs)
        self._allocs.pop(ptrs[0], None)

    def register(self, tensors) -> None:
        """Makes existing device tensors (cudaMalloc memory, e.g. PyTorch's
        default allocator) peer-visible, through CUDA IPC. Collective.
        Deregister before the memory is freed."""
        bufs = [_describe(t, "register: tensor") for t in self._per_rank(tensors, "register")]
        self._c.register_buffers([b.ptr for b in bufs], [b.nbytes for b in bufs])

    def deregister(self, tensors) -> None:
        bufs = [_describe(t, "deregister: tensor") for t in self._per_rank(tensors, "deregister")]
        self._c.deregister([b.ptr for b in bufs])

    # ------------------------------------------------------------ collectives

    def _collective(self, name, outs, ins, stream, algo, local_copy, out_factor, in_factor):
        self._check_open(name)
        if algo not in _ALGOS:
            raise InvalidArgumentError(f"algo is {algo!r}; expected one of {', '.join(_ALGOS)}")
        if local_copy not in _LOCAL_COPIES:
            raise InvalidArgumentError(
                f"local_copy is {local_copy!r}; expected one of {', '.join(_LOCAL_COPIES)}"
            )
        outs, ins = self._per_rank(outs, f"{name}: out"), self._per_rank(ins, f"{name}: in")
        if self._local and stream is None:
            streams = [None] * self._c.local_count  # each GPU's current torch stream
        else:
            streams = self._per_rank(stream, f"{name}: stream")
        world = self._c.world
        out_ptrs, in_ptrs, handles = [], [], []
        bytes_per_rank = None
        for i, (o, x) in enumerate(zip(outs, ins)):
            ob, ib = _describe(o, "out"), _describe(x, "in")
            dev = self._c.device(i)
            for b, what in ((ob, "out"), (ib, "in")):
                if b.device not in (dev, -1):
                    raise InvalidArgumentError(f"{name}: {what} is on GPU {b.device}; expected GPU {dev}")
            if ob.dtype != ib.dtype and ob.dtype.startswith("torch.") == ib.dtype.startswith("torch."):
                raise InvalidArgumentError(
                    f"{name}: out is {ob.dtype} and in is {ib.dtype}; expected the same dtype"
                )
            if ib.nbytes % in_factor(world):
                raise InvalidArgumentError(
                    f"{name}: in has {ib.nbytes} bytes, not a multiple of the world size {world}"
                )
            per_rank = ib.nbytes // in_factor(world)
            if ob.nbytes != per_rank * out_factor(world):
                raise InvalidArgumentError(
                    f"{name}: out has {ob.nbytes} bytes; expected {per_rank * out_factor(world)} "
                    f"({out_factor(world)} x {per_rank} bytes per rank)"
                )
            if bytes_per_rank not in (None, per_rank):
                raise InvalidArgumentError(
                    f"{name}: the GPUs' tensors differ in size; expected the same on every GPU"
                )
            bytes_per_rank = per_rank
            out_ptrs.append(ob.ptr)
            in_ptrs.append(ib.ptr)
            handles.append(_stream_handle(streams[i], dev))
        getattr(self._c, name)(out_ptrs, in_ptrs, bytes_per_rank, handles, algo, local_copy)

    def all_gather(self, out, inp, stream=None, algo: str = "auto", local_copy: str = "auto") -> None:
        """out (world x inp.nbytes, registered) receives every rank's `inp` in
        rank order, ordered in `stream` (default: the current torch stream).
        `inp` may be this rank's own slice of `out` (in-place: no local copy).
        algo: 'auto' | 'pcpy' | 'b2b' | 'seq'. local_copy: how this rank's own block is
        copied: 'auto'/'sm' (a small SM kernel; the copy engine is slow within
        one GPU) or 'ce' (copy engine: no SM used)."""
        self._collective("all_gather", out, inp, stream, algo, local_copy, lambda w: w, lambda w: 1)

    def all_to_all(self, out, inp, stream=None, algo: str = "auto", local_copy: str = "auto") -> None:
        """Block j of rank i's `inp` lands in block i of rank j's `out` (blocks
        of inp.nbytes / world). out registered; out and inp must not overlap."""
        self._collective("all_to_all", out, inp, stream, algo, local_copy, lambda w: w, lambda w: w)

    # ------------------------------------------------------------ completion

    def check(self) -> None:
        """Raises the first asynchronous error (a peer that timed out or exited)."""
        self._c.check()

    def synchronize(self) -> None:
        """Waits (bounded by the timeout) for every collective enqueued so far."""
        self._c.synchronize()

    def close(self) -> None:
        """Releases everything; a second close raises ClosedError."""
        self._c.close()
        self._allocs.clear()
        if self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._c.closed:
            self.close()


class _DeviceMemory:
    """Exposes a raw device allocation through __cuda_array_interface__ (bytes)."""

    def __init__(self, ptr: int, nbytes: int, device: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


def init(
    rank: Optional[int] = None,
    world: Optional[int] = None,
    device: Optional[int] = None,
    store=None,
    timeout: float = 0.0,
) -> Communicator:
    """A communicator for this process's GPU, one process per GPU.

    Rank and world come from the arguments, else from torchrun / mpirun / srun.
    Ranks meet through `store` (a torch.distributed Store) if given, else
    through ferry's own TCP store served by rank 0 at MASTER_ADDR and port
    FERRY_PORT (default MASTER_PORT + 1). `device` defaults to the local rank.
    """
    native = require()
    info = read_launch_env()
    if rank is None or world is None:
        if info is None:
            raise InvalidArgumentError(
                "ferry.init: rank and world were not given and no launcher environment "
                "(torchrun, mpirun, srun) was found; pass rank= and world=, or use ferry.init_local()"
            )
        rank, world = info.rank, info.world
    if device is None:
        device = info.local_rank if info is not None else rank
    limit = timeout if timeout > 0 else float(native.knob_string("FERRY_TIMEOUT_S"))
    own_store = None
    if store is None:
        addr = info.master_addr if info else os.environ.get("MASTER_ADDR", "127.0.0.1")
        master_port = info.master_port if info else int(os.environ.get("MASTER_PORT", "29500"))
        port = int(native.knob_string("FERRY_PORT")) or master_port + 1
        own_store = TcpStore(addr, port, is_server=(rank == 0), timeout=limit)
        kv = own_store
    else:
        kv = store if hasattr(store, "get_many") else TorchStore(store)
    try:
        comm = Communicator.create(rank, world, device, store_allgather(kv, rank, world, limit), timeout)
    except BaseException:
        if own_store is not None:
            own_store.close()
        raise
    comm._store = own_store  # register() and alloc() meet through it again
    return comm


def init_local(devices: Optional[Sequence[int]] = None, timeout: float = 0.0) -> Communicator:
    """One process driving several GPUs (default: all visible). Collectives then
    take lists: one tensor (and optionally one stream) per GPU."""
    native = require()
    if devices is None:
        import torch

        devices = list(range(torch.cuda.device_count()))
    return Communicator(native.Communicator.create_local(list(devices), timeout), local=True)

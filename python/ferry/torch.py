"""PyTorch conveniences (importing this module imports torch): a communicator
over a torch.distributed group, a pool of symmetric tensors, and FSDP2's
all-gather and reduce-scatter on copy engines.

    import ferry.torch
    comm = ferry.torch.communicator()          # over the default group
    model = fully_shard(...)                   # FSDP2, as usual
    ferry.torch.use_for_fsdp(model, comm)      # its parameter all-gathers: ferry, no SM
    # or, gradients' reduce-scatters too (copy engines + a small SM reduction kernel):
    ferry.torch.use_for_fsdp(model, comm, reduce_scatter=True)

docs/api.md, "PyTorch and FSDP2"."""

from __future__ import annotations

import collections
import math

import torch

from .comm import Communicator, _DeviceMemory, _stream_handle
from .errors import InvalidArgumentError
from .ranges import Ranges, chunk_for

try:  # FSDP2's interfaces for a custom all-gather and reduce-scatter (tested with PyTorch 2.11)
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _FsdpAllGather
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _FsdpReduceScatter
except ImportError:  # older PyTorch: duck-typed, set_custom_* do not exist there anyway
    _FsdpAllGather = _FsdpReduceScatter = object


def communicator(group=None, timeout: float = 0.0) -> Communicator:
    """A ferry communicator over a torch.distributed group, on the current CUDA device."""
    return Communicator.from_torch(group, device=torch.cuda.current_device(), timeout=timeout)


class _PoolRange(_DeviceMemory):
    """One range of a pool's chunk as __cuda_array_interface__. torch keeps
    this object alive as long as any tensor uses the memory; when it goes,
    the range is queued for reuse (taken up at the pool's next request)."""

    def __init__(self, ptr: int, nbytes: int, device: int, spot, freed: collections.deque):
        super().__init__(ptr, nbytes, device)
        self._spot, self._freed = spot, freed

    def __del__(self):
        self._freed.append(self._spot)  # atomic: may run in any thread that drops the last tensor


class SymmetricPool:
    """Tensors that ferry's collectives accept as outputs, from a few large
    registered chunks instead of one collective `alloc` per buffer.

    Every rank must make the same requests in the same order (SPMD code such
    as FSDP does): a request's offset depends only on that sequence (the
    deterministic allocator of ferry.ranges), so a tensor sits at the same
    offset of the same registration on every rank, as a collective needs. A
    request that does not fit adds a chunk with `comm.alloc`, which is
    collective. Memory is reused like PyTorch's caching allocator reuses it:
    a tensor's range comes back when torch frees its last view, for later
    requests on the stream it was requested on. Should ranks ever diverge, a
    collective on the diverged buffers fails with a timeout that names the
    peer; it never writes into the wrong place (docs/api.md)."""

    def __init__(self, comm: Communicator, chunk_bytes: int = 256 << 20):
        if comm._local:
            raise InvalidArgumentError(
                "SymmetricPool: the communicator drives several GPUs in one process; "
                "the pool is for one process per GPU (ferry.init, ferry.torch.communicator)"
            )
        if chunk_bytes <= 0:
            raise InvalidArgumentError(f"SymmetricPool: chunk_bytes is {chunk_bytes}; expected > 0")
        self._comm = comm
        self._device = comm.device
        self._torch_device = torch.device("cuda", comm.device)
        self._chunk_bytes = chunk_for(0, chunk_bytes)
        self._ranges = Ranges()
        self._chunks: list = []  # the chunks' tensors, from comm.alloc
        self._freed: collections.deque = collections.deque()

    @property
    def bytes_reserved(self) -> int:
        return sum(c.numel() for c in self._chunks)

    @property
    def bytes_in_use(self) -> int:
        self._take_freed()
        return self._ranges.bytes_in_use()

    def _take_freed(self) -> None:
        while self._freed:
            self._ranges.release(*self._freed.popleft())

    def empty(self, shape, dtype=torch.uint8, stream=None) -> torch.Tensor:
        """An uninitialized tensor from the pool, on the communicator's GPU.
        `stream` (default: the current one) is where it will first be used."""
        # FSDP asks once per all-gather, on its critical host path: no torch
        # Stream objects, no device switch (as_tensor reads the pointer's device).
        self._comm._check_open("SymmetricPool.empty")
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        handle = _stream_handle(stream, self._device)
        self._take_freed()
        spot = self._ranges.allocate(nbytes, handle)
        if spot is None:
            size = chunk_for(nbytes, self._chunk_bytes)
            self._chunks.append(self._comm.alloc((size,), torch.uint8))
            self._ranges.add_chunk(size)
            spot = self._ranges.allocate(nbytes, handle)
        chunk, offset = spot
        memory = _PoolRange(self._chunks[chunk].data_ptr() + offset, nbytes, self._device, spot, self._freed)
        return torch.as_tensor(memory, device=self._torch_device).view(dtype).view(shape)

    def close(self) -> None:
        """Frees the chunks (collective). Tensors from the pool become invalid."""
        for c in self._chunks:
            self._comm.free(c)
        self._chunks.clear()
        self._ranges = Ranges()
        # Tensors that outlive the chunks still queue their ranges when they
        # go: into the old queue, which nothing reads any more.
        self._freed = collections.deque()


def _check_device(who: str, device, comm: Communicator) -> None:
    device = device if isinstance(device, torch.device) else torch.device(device)
    if device.type != "cuda" or (device.index is not None and device.index != comm.device):
        raise InvalidArgumentError(
            f"{who}: device is {device}; expected cuda:{comm.device}, this communicator's GPU"
        )


class _GroupCheck:
    """FSDP passes its process group with every call (the same one each
    time): it must have the communicator's ranks."""

    def __init__(self, comm: Communicator, who: str):
        self._comm, self._who = comm, who
        self._checked: set = set()

    def __call__(self, group) -> None:
        if group is None or id(group) in self._checked:
            return
        if group.size() != self._comm.world or group.rank() != self._comm.rank:
            raise InvalidArgumentError(
                f"{self._who}: FSDP's group has {group.size()} ranks (this one rank {group.rank()}); "
                f"the ferry communicator has {self._comm.world} (rank {self._comm.rank}): create it over "
                "the same group (ferry.torch.communicator(group))"
            )
        self._checked.add(id(group))


class FSDPAllGather(_FsdpAllGather):
    """FSDP2's parameter all-gather on ferry: `allocate` hands out FSDP's
    all-gather buffers from a SymmetricPool, and the call gathers in place
    (FSDP copies each rank's shard into its slice of the output first), so
    no SM takes part with the default table: copy engines move every byte.
    Install it with `use_for_fsdp`, or `module.set_custom_all_gather(it)` on
    each FSDP module. `options` (algo, local_copy, signals) go to every call."""

    def __init__(self, comm: Communicator, pool: SymmetricPool = None, **options):
        self.comm = comm
        self.pool = pool if pool is not None else SymmetricPool(comm)
        self.options = options
        self.calls = 0
        self.reduce_scatter = None  # the FSDPReduceScatter that use_for_fsdp installed beside, if any
        self._check_group = _GroupCheck(comm, "FSDPAllGather")

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        _check_device("FSDPAllGather.allocate", device, self.comm)
        return self.pool.empty(size, dtype)

    def __call__(self, output_tensor, input_tensor, group=None, async_op: bool = False):
        self._check_group(group)
        self.comm.all_gather(output_tensor, input_tensor, **self.options)
        self.calls += 1
        # Ordered in the current stream: FSDP records its event there after this call.
        return None


def _reduction_name(op) -> str:
    """torch.distributed's reduce op as ferry's name ("avg" for AVG); else an error."""
    import torch.distributed as dist

    if op is None:
        return "sum"
    for known in ("SUM", "AVG", "MAX", "MIN"):
        try:
            if op == getattr(dist.ReduceOp, known):
                return known.lower()
        except (TypeError, RuntimeError):  # a premultiplied sum compares with nothing here
            pass
    raise InvalidArgumentError(
        f"FSDPReduceScatter: op is {op!r}; ferry reduces with SUM, AVG, MAX or MIN (use_for_fsdp turns on "
        "FSDP's force_sum_reduction_for_comms, so that FSDP scales gradients itself and passes SUM)"
    )


class FSDPReduceScatter(_FsdpReduceScatter):
    """FSDP2's gradient reduce-scatter on ferry: copy engines move each rank's
    blocks into its peers' scratch, and a small SM kernel (at most 32 blocks)
    adds them in rank order; from 128 MiB of result per rank in rounds, each
    round's addition beside the next round's copies. There is no SM-free
    reduction: the kernel is the better tool for arithmetic. FSDP's buffers
    are ordinary tensors (ferry's reduce_scatter needs no registered memory).
    `use_for_fsdp(..., reduce_scatter=True)` installs it and turns on FSDP's
    force_sum_reduction_for_comms, so FSDP divides the gradients itself and
    passes SUM; an AVG is summed, then divided by the world size here (one
    more elementwise kernel). `options` (algo, signals) go to every call."""

    def __init__(self, comm: Communicator, **options):
        self.comm = comm
        self.options = options
        self.calls = 0
        self._check_group = _GroupCheck(comm, "FSDPReduceScatter")

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        _check_device("FSDPReduceScatter.allocate", device, self.comm)
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group=None, op=None, async_op: bool = False):
        self._check_group(group)
        name = _reduction_name(op)
        self.comm.reduce_scatter(
            output_tensor, input_tensor, op="sum" if name == "avg" else name, **self.options
        )
        if name == "avg":
            output_tensor.div_(self.comm.world)
        self.calls += 1
        return None  # ordered in the current stream, as FSDP expects


def use_for_fsdp(module, comm: Communicator, reduce_scatter: bool = False, **options) -> FSDPAllGather:
    """Makes every FSDP2 module in `module` (after fully_shard) gather its
    parameters with ferry, sharing one pool; with `reduce_scatter`, also
    reduce-scatter its gradients with ferry (FSDPReduceScatter: copy engines
    and a small SM reduction kernel) and scale them in FSDP
    (force_sum_reduction_for_comms). Returns the FSDPAllGather; the
    FSDPReduceScatter, when installed, is its `reduce_scatter` attribute."""
    gather = FSDPAllGather(comm, **options)
    gather.reduce_scatter = FSDPReduceScatter(comm, **options) if reduce_scatter else None
    found = 0
    for m in module.modules():
        if hasattr(m, "set_custom_all_gather"):
            m.set_custom_all_gather(gather)
            if gather.reduce_scatter is not None:
                if not hasattr(m, "set_custom_reduce_scatter"):
                    raise InvalidArgumentError(
                        "use_for_fsdp: reduce_scatter=True needs FSDP2's set_custom_reduce_scatter "
                        "(PyTorch 2.11 has it)"
                    )
                m.set_custom_reduce_scatter(gather.reduce_scatter)
                m.set_force_sum_reduction_for_comms(True)
            found += 1
    if not found:
        raise InvalidArgumentError(
            "use_for_fsdp: no FSDP2 module in `module` (call fully_shard first; FSDP2 modules "
            "of a PyTorch that has set_custom_all_gather)"
        )
    return gather

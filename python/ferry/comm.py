"""The Python face of a ferry communicator: torch tensors (or any object with
__cuda_array_interface__) in, collectives ordered in the caller's stream."""

from __future__ import annotations

import numbers
import operator
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, List, Optional

from . import _streams, tune
from ._args import integer, shape_of
from ._native import require
from .bootstrap import (
    AllGather,
    TcpStore,
    TorchStore,
    env_int,
    group_allgather,
    group_on_host,
    read_launch_env,
    store_allgather,
)
from .errors import ClosedError, InvalidArgumentError


@dataclass
class _Buffer:
    ptr: int
    nbytes: int
    device: int
    dtype: str
    itemsize: int = 1


# Reductions by element type: torch names and __cuda_array_interface__ typestrs.
_REDUCTION_DTYPES = {
    "torch.float32": "float32",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.int32": "int32",
    "torch.float64": "float64",
    "torch.int64": "int64",
    "<f4": "float32",
    "<f2": "float16",
    "<i4": "int32",
    "<f8": "float64",
    "<i8": "int64",
}


def _reduction_dtype(b: "_Buffer", op: str) -> str:
    name = _REDUCTION_DTYPES.get(b.dtype)
    if name is None:
        raise InvalidArgumentError(
            f"{op}: dtype {b.dtype} cannot be reduced; expected float32, float16, bfloat16, int32, float64 or int64"
        )
    return name


def _counts_matrix(counts, world: int) -> List[int]:
    """counts as a flat list of world * world non-negative ints, [src * world + dst]:
    a world x world matrix (rows of world each) or a flat list of world * world."""
    expected = f"expected a {world} x {world} matrix (counts[src][dst])"
    if hasattr(counts, "tolist"):
        counts = counts.tolist()
    if not isinstance(counts, (list, tuple)):
        raise InvalidArgumentError(f"all_to_allv: counts is {counts!r}; {expected}")
    flat = []
    rows = [isinstance(row, (list, tuple)) for row in counts]
    if any(rows):
        # Rows of other lengths would be read as other ranks' counts.
        if not all(rows) or len(counts) != world or any(len(row) != world for row in counts):
            lengths = [len(row) if isinstance(row, (list, tuple)) else "a number" for row in counts]
            raise InvalidArgumentError(f"all_to_allv: counts has rows of {lengths} entries; {expected}")
        for row in counts:
            flat.extend(row)
    else:
        flat = list(counts)
    if len(flat) != world * world:
        raise InvalidArgumentError(f"all_to_allv: counts has {len(flat)} entries; {expected}")
    # A bool is an int to Python: a mask would be taken as counts of 0 and 1 bytes.
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in flat):
        raise InvalidArgumentError("all_to_allv: counts must be non-negative integers (elements), not bools")
    return flat


# torch dtype names as __cuda_array_interface__ typestrs without the byte order,
# so a torch.Tensor and a raw CUDA array of the same element type compare equal.
_TORCH_TYPESTRS = {
    "torch.uint8": "u1",
    "torch.int8": "i1",
    "torch.int16": "i2",
    "torch.int32": "i4",
    "torch.int64": "i8",
    "torch.float16": "f2",
    "torch.float32": "f4",
    "torch.float64": "f8",
    "torch.bool": "b1",
}


def _element_type(dtype: str) -> str:
    if dtype.startswith("torch."):
        return _TORCH_TYPESTRS.get(dtype, dtype)
    return dtype[1:]  # typestr: drop the byte-order character


# (str(dtype), itemsize) by torch dtype object. Each torch attribute read costs
# a few hundred nanoseconds and every call describes two tensors, so the
# description reads as few as it can: get_device() is -1 off the GPU.
_DTYPE_INFO: dict = {}


def _empty_tensor_address(t: Any, itemsize: int) -> int:
    """Where a zero-element torch tensor lies. torch gives every empty tensor
    a null data pointer, but an empty slice of a registered buffer (recv[:0]
    for a rank that receives nothing in all_to_allv) still marks a place in
    it, and ferry finds the peers' outputs at that place's offset. A tensor
    with no memory of its own stays null, which ferry accepts wherever no
    byte moves through it."""
    try:
        base = t.untyped_storage().data_ptr()
        return base + t.storage_offset() * itemsize if base else 0
    except (AttributeError, RuntimeError):
        return 0


def _describe(obj: Any, what: str) -> _Buffer:
    """Pointer, size, device and dtype of a tensor-like argument, with an error
    naming `what` for anything ferry cannot use."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous"):  # a torch.Tensor
        device = obj.get_device()
        if device < 0:
            raise InvalidArgumentError(f"{what} is on {obj.device}; expected a CUDA tensor")
        if not obj.is_contiguous():
            raise InvalidArgumentError(f"{what} is not contiguous; pass {what}.contiguous()")
        dtype = obj.dtype
        info = _DTYPE_INFO.get(dtype)
        if info is None:
            info = _DTYPE_INFO[dtype] = (str(dtype), obj.itemsize)
        ptr, nbytes = obj.data_ptr(), obj.nbytes
        if ptr == 0 and nbytes == 0:
            ptr = _empty_tensor_address(obj, info[1])
        return _Buffer(ptr, nbytes, device, info[0], info[1])
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
    return _Buffer(cai["data"][0], n * itemsize, -1, typestr, itemsize)


_stream_handle = _streams.handle


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
        self._heaps: list = []  # symmetric heaps over this communicator (ferry.symm), closed before it
        self._warn_if_preset_missing()

    def _warn_if_preset_missing(self) -> None:
        """The native layer started with FERRY_TUNING's table, else the shipped
        one for this GPU model (coll/tuning.hpp); a preset asked for by name
        and not shipped for this GPU falls back to the built-in default, which
        deserves a word."""
        setting = os.environ.get("FERRY_TUNING")
        name = self._c.gpu_name
        if setting in tune.PRESETS and tune.preset_rules(name, self._c.world, setting) is None:
            warnings.warn(
                f"FERRY_TUNING={setting}: ferry ships no such table for {name}; "
                "the built-in default applies (measure one with `ferry tune`)",
                stacklevel=3,
            )

    # ------------------------------------------------------------ creation

    @classmethod
    def create(
        cls,
        rank: int,
        world: int,
        device: int,
        allgather: AllGather,
        timeout: float = 0.0,
        allgather_on_host: bool = False,
    ):
        """`allgather_on_host`: `allgather` moves its bytes on the host alone (a
        store, a gloo group), so it cannot wait for a GPU; only then does a
        rank that refuses the setup while a transfer is armed tell its peers at
        once (otherwise they wait for it until the timeout)."""
        native = require().Communicator.create(rank, world, device, allgather, timeout, allgather_on_host)
        return cls(native, local=False)

    @classmethod
    def from_torch(cls, group=None, device: Optional[int] = None, timeout: float = 0.0):
        """A communicator over the ranks of a torch.distributed process group
        (default: the world), bootstrapped through the group itself. `device`:
        this rank's GPU; default: the launcher's local rank (torchrun, mpirun,
        srun; as ferry.init), else the current CUDA device."""
        import torch
        import torch.distributed as dist

        rank, world = dist.get_rank(group), dist.get_world_size(group)
        if device is None:
            info = read_launch_env()
            device = info.local_rank if info is not None else torch.cuda.current_device()
        return cls.create(rank, world, device, group_allgather(group, device), timeout, group_on_host(group))

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
        self._check_open("alloc")
        shape = shape_of(shape, "alloc")
        import torch

        dtype = torch.uint8 if dtype is None else dtype
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
        """Releases memory from :meth:`alloc` (tensors using it become invalid)
        and gives it back to the driver. Collective: every rank frees the same
        buffers in the same order."""
        ptrs = [_describe(t, "tensor").ptr for t in self._per_rank(tensors, "free")]
        self._c.free(ptrs)
        self._allocs.pop(ptrs[0], None)

    def register(self, tensors) -> None:
        """Makes existing device tensors peer-visible (collective): cudaMalloc
        memory (PyTorch's default allocator) through CUDA IPC; memory from
        CUDA's virtual memory management (PyTorch with
        expandable_segments:True) by exporting its physical allocations.
        Deregister before the memory is freed."""
        bufs = [_describe(t, "register: tensor") for t in self._per_rank(tensors, "register")]
        self._c.register_buffers([b.ptr for b in bufs], [b.nbytes for b in bufs])

    def reserve_scratch(self, nbytes: int) -> None:
        """Makes ferry's scratch at least `nbytes` per rank (reduce_scatter and
        all_reduce need world x their per-rank block, rounded up; in-place
        all_to_all at most FERRY_SCRATCH_BYTES). Collective. Those calls grow
        it themselves on first use, except during CUDA graph capture, where
        they raise and name the size to reserve first."""
        self._check_open("reserve_scratch")
        self._c.reserve_scratch(int(nbytes))

    def deregister(self, tensors) -> None:
        bufs = [_describe(t, "deregister: tensor") for t in self._per_rank(tensors, "deregister")]
        self._c.deregister([b.ptr for b in bufs])

    # ------------------------------------------------------------ collectives

    def _streams(self, stream, what: str) -> List[int]:
        if self._local and stream is None:
            streams = [None] * self._c.local_count  # each GPU's current torch stream
        else:
            streams = self._per_rank(stream, f"{what}: stream")
        return [_stream_handle(s, self._c.device(i)) for i, s in enumerate(streams)]

    def _native_args(
        self,
        op,
        outs,
        ins,
        stream,
        algo="auto",
        local_copy="auto",
        signals="auto",
        root=0,
        counts=None,
        red_op="sum",
    ) -> dict:
        """Checks what only the tensors tell (devices, dtypes, sizes) and turns
        the call into the native call's arguments; the native layer checks the
        rest for Python and C alike (the option strings, root, counts, buffers,
        and, where ranks share a GPU, that each has a stream of its own)."""
        self._check_open(op)
        world = self._c.world
        outs = self._per_rank(outs, f"{op}: out")
        ins = [None] * len(outs) if ins is None else self._per_rank(ins, f"{op}: in")
        args = dict(op=op, algo=algo, local_copy=local_copy, signals=signals, root=root, red_op=red_op)
        out_ptrs, in_ptrs, shapes = [], [], []
        for i, (o, x) in enumerate(zip(outs, ins)):
            dev, r = self._c.device(i), self._c.rank(i)
            ob = _describe(o, f"{op}: out")
            # A broadcast's non-root ranks send nothing: their `in` is ignored.
            ib = ob if (x is None or (op == "broadcast" and r != root)) else _describe(x, f"{op}: in")
            for b, what in ((ob, "out"), (ib, "in")):
                if b.device not in (dev, -1):
                    raise InvalidArgumentError(f"{op}: {what} is on GPU {b.device}; expected GPU {dev}")
            if _element_type(ob.dtype) != _element_type(ib.dtype):
                raise InvalidArgumentError(
                    f"{op}: out is {ob.dtype} and in is {ib.dtype}; expected the same dtype"
                )
            shapes.append(self._shape(op, ob, ib, world, r, counts, root))
            out_ptrs.append(ob.ptr)
            in_ptrs.append(ib.ptr)
        if any(sh != shapes[0] for sh in shapes):
            raise InvalidArgumentError(
                f"{op}: the GPUs' tensors differ in size; expected the same on every GPU"
            )
        args.update(shapes[0])
        args.update(outs=out_ptrs, ins=in_ptrs, streams=self._streams(stream, op))
        return args

    @staticmethod
    def _shape(op, ob: _Buffer, ib: _Buffer, world: int, rank: int, counts, root) -> dict:
        def need(cond, msg):
            if not cond:
                raise InvalidArgumentError(f"{op}: {msg}")

        if op == "all_gather":
            need(
                ob.nbytes == ib.nbytes * world,
                f"out has {ob.nbytes} bytes; expected world x in = {world} x {ib.nbytes}",
            )
            return dict(bytes=ib.nbytes)
        if op == "all_to_all":
            need(
                ib.nbytes % world == 0, f"in has {ib.nbytes} bytes, not a multiple of the world size {world}"
            )
            need(
                (ib.nbytes // world) % ib.itemsize == 0,
                f"in has {ib.nbytes // ib.itemsize} elements, not a multiple of the world size {world}: "
                "each rank's block would split an element",
            )
            need(ob.nbytes == ib.nbytes, f"out has {ob.nbytes} bytes; expected {ib.nbytes} like in")
            return dict(bytes=ib.nbytes // world)
        if op == "all_to_allv":
            flat = _counts_matrix(counts, world)
            sent = sum(flat[rank * world + d] for d in range(world)) * ib.itemsize
            got = sum(flat[s * world + rank] for s in range(world)) * ob.itemsize
            need(ib.nbytes >= sent, f"in has {ib.nbytes} bytes; counts send {sent} from rank {rank}")
            need(ob.nbytes >= got, f"out has {ob.nbytes} bytes; counts send {got} to rank {rank}")
            return dict(counts=[c * ib.itemsize for c in flat])
        if op == "broadcast":
            need(ib.nbytes == ob.nbytes, f"in has {ib.nbytes} bytes; expected {ob.nbytes} like out")
            return dict(bytes=ob.nbytes)
        dtype = _reduction_dtype(ob, op)
        if op == "reduce_scatter":
            need(
                ib.nbytes == ob.nbytes * world,
                f"in has {ib.nbytes} bytes; expected world x out = {world} x {ob.nbytes}",
            )
            return dict(count=ob.nbytes // ob.itemsize, dtype=dtype)
        need(ib.nbytes == ob.nbytes, f"in has {ib.nbytes} bytes; expected {ob.nbytes} like out")
        return dict(count=ob.nbytes // ob.itemsize, dtype=dtype)  # all_reduce

    def _run(self, prepare: bool, op: str, outs, ins, stream, **options):
        """Runs (or, with `prepare`, prepares) `op`; `options` are the
        method's keyword arguments (algo, local_copy, signals, root, ...)."""
        args = self._native_args(op, outs, ins, stream, **options)
        if prepare:
            return PreparedCollective(self, self._c.prepare(**args), op)
        self._c.run(**args)

    def all_gather(
        self, out, inp, stream=None, algo: str = "auto", local_copy: str = "auto", signals: str = "auto"
    ) -> None:
        """out (world x inp.nbytes, registered) receives every rank's `inp` in
        rank order, ordered in `stream` (default: the current torch stream).
        `inp` may be this rank's own slice of `out` (in-place: no local copy).
        algo: 'auto' | 'pcpy' | 'b2b' | 'seq' (copy engines) | 'sm' (not copy
        engines: one SM kernel of up to 32 blocks (FERRY_SM_MAX_BLOCKS), the lowest latency for
        blocks up to FERRY_SM_BYTES, 1 MiB). local_copy: how this rank's own
        block is copied: 'peer' through a peer on copy engines (no SM; one more
        block over NVLink; all_to_all bounces it via the next rank), 'sm' ferry's kernel on
        32 SMs, 'driver' cudaMemcpyAsync (CUDA's kernel on every SM, for a
        shorter time), 'auto' peer up to 1 MiB per rank, else sm. CUDA has no
        SM-free copy within one GPU. signals (every collective; copy-engine
        variants): how ranks tell each other "you may write" and "written":
        'copy' small copy-engine copies and stream waits (no SM), 'kernel' a
        one-block kernel per round ('sm', its first name, works too) (5-13 us less per call on 2 H200s, but it
        waits for an SM beside a GPU-filling kernel), 'auto' FERRY_SIGNALS
        (default 'copy')."""
        self._run(False, "all_gather", out, inp, stream, algo=algo, local_copy=local_copy, signals=signals)

    def all_to_all(
        self, out, inp, stream=None, algo: str = "auto", local_copy: str = "auto", signals: str = "auto"
    ) -> None:
        """Block j of rank i's `inp` lands in block i of rank j's `out` (blocks
        of inp.nbytes / world). `out` registered. In-place when `inp` is `out`:
        then the exchange runs in rounds through a bounded scratch buffer
        (FERRY_SCRATCH_BYTES) instead of a full-size temporary; other overlaps
        are errors. algo, local_copy, signals: as for all_gather."""
        self._run(False, "all_to_all", out, inp, stream, algo=algo, local_copy=local_copy, signals=signals)

    def all_to_allv(
        self,
        out,
        inp,
        counts,
        stream=None,
        algo: str = "auto",
        local_copy: str = "auto",
        signals: str = "auto",
    ) -> None:
        """MoE dispatch/combine: counts[s][d] elements go from rank s to rank d.
        `inp` is packed by destination rank, `out` (registered) by source rank.
        `counts` is the whole world x world matrix (a nested list, or a CPU
        tensor), the same on every rank; a rank that passes other counts is
        named in the error."""
        self._run(
            False,
            "all_to_allv",
            out,
            inp,
            stream,
            algo=algo,
            local_copy=local_copy,
            signals=signals,
            counts=counts,
        )

    def broadcast(
        self,
        out,
        inp=None,
        root: int = 0,
        stream=None,
        algo: str = "auto",
        local_copy: str = "auto",
        signals: str = "auto",
    ) -> None:
        """Root's `inp` (default: root's `out`) into every rank's `out` (registered)."""
        self._run(
            False, "broadcast", out, inp, stream, algo=algo, local_copy=local_copy, signals=signals, root=root
        )

    def reduce_scatter(
        self, out, inp, op: str = "sum", stream=None, algo: str = "auto", signals: str = "auto"
    ) -> None:
        """out = the reduction (sum/max/min) over ranks of block `rank` of `inp`
        (world x out), every rank's contribution added in rank order. The data
        moves on copy engines into ferry's scratch on each rank; the reduction
        runs in a small SM kernel (at most 32 blocks), the only SM work; from
        128 MiB of result in rounds, each reduced beside the next one's copies.
        algo="sm": one SM kernel instead (up to FERRY_SM_BYTES of result).
        Neither tensor needs registering."""
        self._run(False, "reduce_scatter", out, inp, stream, algo=algo, signals=signals, red_op=op)

    def all_reduce(
        self, out, inp=None, op: str = "sum", stream=None, algo: str = "auto", signals: str = "auto"
    ) -> None:
        """out = the reduction over ranks of `inp` (default: in place on `out`,
        which must be registered), in rank order: the same bits on every rank.
        Copy engines move the data, a small SM kernel adds (the only SM work):
        on 2 ranks up to 64 MiB each rank's whole buffer goes to the other and
        both reduce it; otherwise reduce-scatter then all-gather. algo="sm":
        one SM kernel instead: every rank's whole buffer to every peer (up to
        FERRY_SM_BYTES), or, from FERRY_SM_TWO_SHOT_BYTES (1 MiB) on 3 or
        more ranks, in two shots (each rank reduces one part of the buffer and
        stores it into every peer's `out`; in rounds of FERRY_SM_BYTES per
        part, so any size)."""
        self._run(False, "all_reduce", out, inp, stream, algo=algo, signals=signals, red_op=op)

    def prepare(self, collective: str, out, inp=None, **kw) -> "PreparedCollective":
        """A collective validated and planned once, to arm ahead of time and
        trigger later (prelaunch); see :class:`PreparedCollective`.
        `collective` names the method ('all_gather', 'all_to_all',
        'all_to_allv', 'broadcast', 'reduce_scatter', 'all_reduce'); the other
        arguments are that method's (`op="max"` is a reduction's operator);
        `stream` is not used (arm() takes it)."""
        ops = ("all_gather", "all_to_all", "all_to_allv", "broadcast", "reduce_scatter", "all_reduce")
        if collective not in ops:
            raise InvalidArgumentError(
                f"prepare: collective is {collective!r}; expected one of {', '.join(ops)}"
            )
        if collective in ("reduce_scatter", "all_reduce"):
            kw["red_op"] = kw.pop("op", "sum")
        elif "op" in kw:
            raise InvalidArgumentError(f"prepare: op is a reduction's operator; {collective} takes none")
        if collective == "all_reduce" and inp is None:
            inp = out
        kw.pop("stream", None)
        return self._run(True, collective, out, inp, None, **kw)

    def set_tuning(self, rules) -> None:
        """Replaces the variant selector's table with a shipped preset's or
        with rules of your own. A preset: "sm-free" (the default: copy
        engines only) or "latency" (the SM path and kernel signals where
        they are faster; they wait for SMs beside compute), as shipped for
        this GPU model. Rules: a list of (op, world, max_bytes_per_rank,
        algo[, signals]) (or dicts with those keys), tried in order (world 0:
        any; signals 'auto', 'copy' or 'kernel', default 'auto': FERRY_SIGNALS);
        see `ferry tune`; an empty list restores the table the communicator
        started with (FERRY_TUNING's, else the shipped one). A bad
        preset or rule raises InvalidArgumentError naming it."""
        if isinstance(rules, str):
            try:
                self._c.set_selector_preset(rules)
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"set_tuning: {exc}") from None
            return
        try:
            checked = tune.validate(rules)
        except ValueError as exc:
            raise InvalidArgumentError(f"set_tuning: {exc}") from None
        self._c.set_selector_table(checked)

    def sm_path_takes(self, op: str, nbytes: int) -> bool:
        """Whether algo 'sm' runs `op` of `nbytes` per rank here: all_gather's
        input, one all_to_all block, the broadcast, reduce_scatter's result,
        all_reduce's whole buffer (any size from FERRY_SM_TWO_SHOT_BYTES on 3
        or more ranks: its parts go in rounds of the window), or all_to_allv's
        largest count; each block at most FERRY_SM_BYTES, at most 8 ranks."""
        return self._c.sm_path_takes(op, nbytes)

    def choose_algo(self, op: str, bytes_per_rank: int) -> str:
        """The variant 'auto' picks for `op` at this size on this communicator."""
        return self._c.choose(op, bytes_per_rank)[0]

    def choose_signals(self, op: str, bytes_per_rank: int) -> str:
        """'copy' or 'kernel': how a call with signals='auto' at this size signals
        (the tuning table's rule, else FERRY_SIGNALS)."""
        return self._c.choose(op, bytes_per_rank)[1]

    # ------------------------------------------------------------ completion

    def check(self) -> None:
        """Raises the first asynchronous error (a peer that timed out or exited)."""
        self._c.check()

    def synchronize(self) -> None:
        """Waits (bounded by the timeout) for every collective enqueued so far.
        Raises InvalidArgumentError at once while a prepared collective is
        armed and not triggered (the wait would include it)."""
        self._c.synchronize()

    def close(self) -> None:
        """Releases everything; a second close raises ClosedError. This one's
        armed handles are let go. While a prepared transfer or another
        communicator's prepared collective is armed and not yet triggered, the
        memory is freed later, once none is (freeing waits for every stream of
        the GPU, the armed one too)."""
        for heap in list(self._heaps):
            heap.close()
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


class PreparedCollective:
    """A collective planned once and run many times with little on the critical
    path (prelaunch). Each step:

        h = comm.prepare("all_gather", out, inp)   # once
        h.arm()              # ahead: enqueue behind a trigger; ready handshake runs now
        ...compute inp...
        h.trigger()          # host; or h.trigger(stream): a stream memory write after
                             # the work on `stream` (no kernel, no host round trip);
                             # or word, value = h.device_trigger(): a kernel stores it
        h.wait()             # the current stream waits for the collective

    Handles run in the order they (and plain collectives) were armed or called.
    The buffers are fixed at prepare(); their contents may change until the
    trigger. free()/deregister() refuse buffers of unreleased handles."""

    def __init__(self, comm: "Communicator", handle: int, op: str):
        self._comm, self._h, self.op = comm, handle, op

    def _streams(self, stream, what):
        return self._comm._streams(stream, what)

    @property
    def armed(self) -> bool:
        return self._comm._c.armed(self._h)

    def arm(self, stream=None, gate: str = "host") -> "PreparedCollective":
        """Enqueues the collective on ferry's armed stream, after the work enqueued
        so far on `stream` (default: the current torch stream). Arming twice
        without a trigger in between is an error. Where runs handed to kernels
        (device_trigger) that have not fired yet and this one would pass what
        the armed stream's queue takes, it waits for them first and raises
        PeerTimeoutError naming them at the timeout.

        `gate`: where the trigger word lives. "host" (pinned host memory): any
        trigger works. "device" (GPU memory): a stream trigger or a kernel
        trigger releases the collective sooner (no PCIe round trip), and the
        host cannot trigger it (trigger() without a stream raises)."""
        self._comm._check_open("arm")
        if gate not in ("host", "device"):
            raise InvalidArgumentError(f"arm: gate is {gate!r}; expected 'host' or 'device'")
        self._comm._c.arm(self._h, self._streams(stream, "arm"), gate == "device")
        return self

    def trigger(self, stream=None) -> None:
        """Releases the armed collective: now (stream=None), or once `stream`
        reaches this point (a stream memory write; no kernel)."""
        if stream is None:
            self._comm._c.trigger(self._h)
        else:
            self._comm._c.trigger_on(self._h, self._streams(stream, "trigger"))

    def device_trigger(self):
        """(word, value): a kernel releases the collective by storing `value` at
        `word` after a __threadfence_system() (include/ferry/device.cuh). One pair
        per GPU for a single-process communicator. Counts as triggering."""
        pairs = [self._comm._c.device_trigger(self._h, i) for i in range(self._comm._c.local_count)]
        return pairs if self._comm._local else pairs[0]

    def wait(self, stream=None) -> None:
        """Makes `stream` (default: current) wait for the last armed run."""
        self._comm._c.wait(self._h, self._streams(stream, "wait"))

    def release(self) -> None:
        self._comm._c.release(self._h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._comm.closed:
            self.release()


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
    if (rank is None) != (world is None):
        given, missing = ("rank", "world") if world is None else ("world", "rank")
        raise InvalidArgumentError(
            f"ferry.init: {given} was given and {missing} was not; pass both, or neither under a launcher"
        )
    if rank is None or world is None:
        if info is None:
            raise InvalidArgumentError(
                "ferry.init: rank and world were not given and no launcher environment "
                "(torchrun, mpirun, srun) was found; pass rank= and world=, or use ferry.init_local()"
            )
        rank, world = info.rank, info.world
    # Before the store: a rank that cannot take part would otherwise leave
    # its peers waiting for it until the bootstrap's timeout.
    try:
        if isinstance(rank, bool) or isinstance(world, bool):
            raise TypeError
        rank, world = operator.index(rank), operator.index(world)
    except TypeError:
        raise InvalidArgumentError(
            f"ferry.init: rank is {rank!r} and world {world!r}; expected integers"
        ) from None
    if world < 1 or not 0 <= rank < world:
        raise InvalidArgumentError(
            f"ferry.init: rank is {rank} and world {world}; expected 0 <= rank < world"
        )
    if device is None:
        device = info.local_rank if info is not None else rank
    device = integer(device, "ferry.init: device")
    if device < 0:
        raise InvalidArgumentError(
            f"ferry.init: device is {device} (LOCAL_RANK under a launcher); expected a GPU ordinal, 0 or more"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise InvalidArgumentError(
            f"ferry.init: timeout is {timeout!r}; expected seconds (0: FERRY_TIMEOUT_S)"
        )
    # The native bounds (nan, at most 1e6 s, FERRY_TIMEOUT_S's own): a store
    # whose deadline is nan would be waited for without end.
    limit = native.timeout_seconds(float(timeout), "timeout")
    own_store = None
    if store is None:
        addr = info.master_addr if info else os.environ.get("MASTER_ADDR", "127.0.0.1")
        if info:
            master_port = info.master_port
        else:
            master_port = env_int(os.environ, "MASTER_PORT") if "MASTER_PORT" in os.environ else 29500
        port = native.knob_int_in("FERRY_PORT") or master_port + 1
        if not 1 <= port <= 65535:
            raise InvalidArgumentError(
                f"ferry.init: the bootstrap store's port is {port} (FERRY_PORT, or MASTER_PORT + 1); "
                "expected 1..65535"
            )
        own_store = TcpStore(addr, port, is_server=(rank == 0), timeout=limit)
        kv = own_store
    else:
        kv = store if hasattr(store, "get_many") else TorchStore(store)
    try:
        comm = Communicator.create(
            rank, world, device, store_allgather(kv, rank, world, limit), timeout, allgather_on_host=True
        )
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
    if not isinstance(devices, (list, tuple, range)):
        raise InvalidArgumentError(f"init_local: devices is {devices!r}; expected a list of GPU ordinals")
    return Communicator(native.Communicator.create_local(list(devices), timeout), local=True)

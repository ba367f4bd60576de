"""Paged KV-cache transfers between host and GPU memory, on copy engines.

    import ferry.kv as kv
    host = kv.pinned_empty((num_host_pages, 16, heads, head_dim), torch.bfloat16)   # pinned, NUMA-local
    kv.copy_blocks(gpu_cache, host, dst_ids=[7, 8, 9], src_ids=[120, 4, 33])        # fetch: host -> GPU
    kv.copy_blocks(host, gpu_cache, dst_ids=[5], src_ids=[2], zero_sm=True)        # save, no kernel

A side (``dst`` or ``src``) is a tensor whose first dimension is the page, or a
list of such tensors that share one page mapping (one per layer, or K and V of
each layer: ``[t[0], t[1]]`` for vLLM's ``[2, num_blocks, ...]`` layer tensors).
Each page ``t[i]`` must be contiguous; pages may be strided apart. Paired
tensors need the same dtype and page shape. Where both sides keep their
tensors at one stride in one allocation (``list(t)`` of a
``[2 * layers, pages, ...]`` tensor on each side, in the same order), a page's
tensors go as one pitched copy: one host call per page instead of one per
page and tensor (docs/kv.md, "Pitched copies"). Up to 8 KiB a tensor's page
(``FERRY_KV_PITCHED_ROW_BYTES``), or at any size where one side keeps a
page's tensors end to end (a page-first host pool: ``[t[:, i] for i in
range(2 * layers)]`` of a ``[pages, 2 * layers, ...]`` tensor). Copies are ordered in ``stream``
(default: the current torch stream) like ``cudaMemcpyAsync``: work enqueued
there after the call sees the pages, and the call sees all earlier work. Keep
the tensors alive until the stream has passed the copy (ferry's host pools
guarantee that for their memory themselves).

A side checked once, ``kv.Pages(tensors)``, can be passed instead, as often
as needed: a call then reads nothing of its tensors (with every layer's K and
V in one call, reading them costs the host about 2 us a tensor).

Modes (docs/kv.md says which to use when):
  auto      ferry's table for this GPU picks per direction and page size
  per_page  one cudaMemcpyAsync per page (the baseline)
  batched   cudaMemcpyBatchAsync in bounded batches, runs of adjacent pages merged
  streams   the batched copies spread over several of ferry's streams, each
            stream's part submitted by a host thread of its own
  kernel    an SM kernel gathering the pages (uses SMs; reads pinned host memory in place)

``zero_sm=True`` never launches a kernel (``auto`` then picks among the
copy-engine modes); a transfer within one GPU refuses it, since CUDA copies
within a GPU on SMs whichever call submits them. ``urgent=True`` runs the copies on ferry's highest-priority
stream, still after the work queued on ``stream``: it keeps them apart from
bulk transfers on other streams (docs/kv.md says what that buys).
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Sequence

from . import _streams
from ._args import shape_of
from ._native import require
from .errors import InvalidArgumentError

MODES = ("auto", "per_page", "batched", "streams", "kernel")
PAGE_ALIGN = 4096


def _torch():
    import torch

    return torch


_stream_handle = _streams.handle


def _tensors(side, name: str) -> list:
    torch = _torch()
    if isinstance(side, torch.Tensor):
        return [side]
    if isinstance(side, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in side):
        if not side:
            raise InvalidArgumentError(f"{name}: an empty list; expected a tensor or a list of tensors")
        return list(side)
    raise TypeError(
        f"{name}: expected a torch.Tensor or a list of tensors (first dimension = page), got {type(side)}"
    )


def _region(t, name: str):
    """(base, stride, bytes, pages) of a tensor whose dim 0 is the page."""
    if t.dim() < 1:
        raise InvalidArgumentError(f"{name}: a 0-d tensor; the first dimension must be the page")
    pages = t.shape[0]
    item = t.element_size()
    page_elems = 1
    for s in t.shape[1:]:
        page_elems *= s
    # Each page must be one contiguous range of memory.
    expect = 1
    for size, stride in reversed(list(zip(t.shape[1:], t.stride()[1:]))):
        if size != 1 and stride != expect:
            raise InvalidArgumentError(
                f"{name}: a page (t[i]) is not contiguous (shape {tuple(t.shape)}, strides {t.stride()}); "
                "pages must be contiguous, though they may be strided apart"
            )
        expect *= size
    stride = t.stride(0) * item if pages > 1 else page_elems * item
    return (t.data_ptr() if t.numel() else 0, stride, page_elems * item, pages)


def _read(ts: list) -> list:
    """Each tensor's (dtype, shape, strides): its layout."""
    return [(t.dtype, t.shape, t.stride()) for t in ts]


def _check_pairs(dm: list, sm: list) -> None:
    if len(dm) != len(sm):
        raise InvalidArgumentError(
            f"dst has {len(dm)} tensors and src {len(sm)}; they must pair up one to one"
        )
    for i, (a, b) in enumerate(zip(dm, sm)):
        if a[0] != b[0]:
            raise InvalidArgumentError(
                f"dst[{i}] is {a[0]} and src[{i}] is {b[0]}; paired tensors need one dtype"
            )
        if a[1][1:] != b[1][1:]:
            raise InvalidArgumentError(
                f"dst[{i}] has pages of shape {tuple(a[1][1:])} and src[{i}] of {tuple(b[1][1:])}; "
                "paired tensors need one page layout"
            )


def _gpus(ts: list, name) -> dict:
    """The GPUs of `ts`, each with the name of its first tensor there;
    refuses a tensor neither on a GPU nor on the host. `name(i)` names tensor i."""
    devices = {}
    for i, t in enumerate(ts):
        if t.is_cuda:
            devices.setdefault(t.get_device(), name(i))
        elif not t.is_cpu:
            raise InvalidArgumentError(f"{name(i)} is on {t.device}; expected cuda or (pinned) cpu memory")
    return devices


def _on_several(devices: dict) -> str:
    """'dst[0] is on cuda:0 and src[1] on cuda:1' for GPUs found by _gpus."""
    (d0, n0), *rest = sorted(devices.items())
    return f"{n0} is on cuda:{d0} and " + " and ".join(f"{n} on cuda:{d}" for d, n in rest)


def _one_gpu(devices: dict) -> int:
    if len(devices) > 1:
        raise InvalidArgumentError(f"{_on_several(devices)}; one transfer runs on one GPU")
    return next(iter(devices)) if devices else _torch().cuda.current_device()


def _regions(ts: list, ms: list, name: str) -> list:
    """(base, stride, bytes, pages) of each tensor; each layout is checked
    once (the views of one stacked cache, every layer's K and V, share one)."""
    layouts, out = {}, []
    for i, (t, m) in enumerate(zip(ts, ms)):
        lay = layouts.get(m)
        if lay is None:
            _, stride, nbytes, pages = _region(t, f"{name}[{i}]")
            lay = layouts[m] = (t.numel() != 0, stride, nbytes, pages)
        out.append((t.data_ptr() if lay[0] else 0, lay[1], lay[2], lay[3]))
    return out


class Pages:
    """One side of page transfers, read and checked once: a tensor whose
    first dimension is the page, or a list of tensors sharing one page
    mapping, as ``copy_blocks`` and ``prepare`` take for ``dst`` and ``src``.
    Pass it there instead, as often as needed: the call then reads nothing of
    its tensors. Reading a side costs the host about 2 us a tensor (125 us for
    every layer's K and V of a 32-layer model, one H200 host), so a serving
    engine that moves all layers in one call makes its Pages once, where it
    sets up its caches.

        gpu = kv.Pages(list(gpu_cache.view(2 * layers, num_blocks, *page)))
        host = kv.Pages([host_cache[:, i] for i in range(2 * layers)])
        kv.copy_blocks(gpu, host, dst_ids, src_ids)     # fetch
        kv.copy_blocks(host, gpu, dst_ids, src_ids)     # save

    It keeps its tensors alive, and they must keep their storage, shape and
    strides while it is used: after resizing or replacing a cache, make a
    new one."""

    def __init__(self, tensors, *, _name: str = "pages"):
        ts = _tensors(tensors, _name)
        self._meta = _read(ts)
        gpus = _gpus(ts, lambda i: f"{_name}[{i}]")
        if len(gpus) > 1:
            raise InvalidArgumentError(f"{_name}: {_on_several(gpus)}; one side's GPU tensors are on one GPU")
        self.gpu = next(iter(gpus)) if gpus else None  # None: host memory
        self.regions = _regions(ts, self._meta, _name)
        self._tensors = ts
        # id(other Pages) -> a weak reference to it: pairs checked already.
        # Weak, so that two Pages used both ways, or one made per call, keep
        # no tensors alive.
        self._paired = {}

    def __len__(self) -> int:
        return len(self._tensors)

    def _check_pair(self, src: "Pages") -> None:
        ref = self._paired.get(id(src))
        if ref is not None and ref() is src:
            return
        _check_pairs(self._meta, src._meta)
        if len(self._paired) >= 16:  # a new Pages per call must not grow this
            self._paired.clear()
        self._paired[id(src)] = weakref.ref(src)


def _sides(dst, src):
    """(device, dst regions, src regions): each side's tensors read once, each
    layout checked once; nothing read of a side given as Pages."""
    if isinstance(dst, Pages) or isinstance(src, Pages):
        dp = dst if isinstance(dst, Pages) else Pages(dst, _name="dst")
        sp = src if isinstance(src, Pages) else Pages(src, _name="src")
        if dp is dst and sp is src:
            dp._check_pair(sp)
        else:  # one side made for this call alone: nothing to remember
            _check_pairs(dp._meta, sp._meta)
        gpus = {x.gpu: side for x, side in ((sp, "src"), (dp, "dst")) if x.gpu is not None}
        return _one_gpu(gpus), dp.regions, sp.regions
    d, s = _tensors(dst, "dst"), _tensors(src, "src")
    dm, sm = _read(d), _read(s)
    _check_pairs(dm, sm)
    device = _one_gpu(_gpus(d + s, lambda i: f"{'dst' if i < len(d) else 'src'}[{i % len(d)}]"))
    return device, _regions(d, dm, "dst"), _regions(s, sm, "src")


class _Ids:
    """An index list as (pointer, count, is_64, on_device), kept alive while used."""

    def __init__(self, ids, name: str):
        self.keep = None
        self.on_device = False
        try:
            torch = _torch()
        except ImportError:  # pragma: no cover
            torch = None
        if torch is not None and isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise InvalidArgumentError(
                    f"{name}: expected a 1-D tensor of page indices, got shape {tuple(ids.shape)}"
                )
            if ids.dtype not in (torch.int32, torch.int64):
                raise InvalidArgumentError(f"{name}: expected int32 or int64 page indices, got {ids.dtype}")
            ids = ids.contiguous()
            self.keep = ids
            self.on_device = ids.device.type == "cuda"
            self.ptr = ids.data_ptr() if ids.numel() else 0
            self.count = ids.numel()
            self.is_64 = ids.dtype == torch.int64
            return
        if isinstance(ids, (list, tuple, range)):
            # Read by the native layer in one pass, every entry checked (a bool
            # among them refused: a mask would be taken as pages 0 and 1).
            a = require().kv_id_list(ids, name)
            self.keep, self.ptr, self.count, self.is_64 = a, a.ptr, a.count, True
            return
        if hasattr(ids, "__array__"):
            import numpy as np

            a = np.asarray(ids)
            if a.ndim != 1:
                raise InvalidArgumentError(
                    f"{name}: expected a 1-D array of page indices, got shape {a.shape}"
                )
            if a.dtype.kind not in "iu":  # a cast would truncate floats and take bools as 0 and 1
                raise InvalidArgumentError(f"{name}: expected integer page indices, got dtype {a.dtype}")
            if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
                raise InvalidArgumentError(f"{name}: page index {int(a.max())} is out of range")
            a = np.ascontiguousarray(a, dtype=np.int64)
            self.keep = a
            self.ptr, self.count, self.is_64 = a.ctypes.data if a.size else 0, a.size, True
            return
        raise TypeError(f"{name}: expected a list, a numpy array or an int tensor of page indices")

    def to_host(self):
        """A host copy (synchronizes the current stream: the cost of a GPU list on copy engines)."""
        return _Ids(self.keep.cpu(), "ids")


def _id_pair(dst_ids, src_ids):
    """Both index lists, checked against each other, in one integer width
    (int64 where they differ; only an int32 tensor is narrower)."""
    d, s = _Ids(dst_ids, "dst_ids"), _Ids(src_ids, "src_ids")
    if d.count != s.count:
        raise InvalidArgumentError(
            f"dst_ids has {d.count} entries and src_ids {s.count}; they must have the same length"
        )
    if d.on_device != s.on_device:
        raise InvalidArgumentError("dst_ids and src_ids must both be on the GPU or both on the host")
    if d.is_64 != s.is_64:
        d, s = [x if x.is_64 else _Ids(x.keep.long(), name) for x, name in ((d, "dst_ids"), (s, "src_ids"))]
    return d, s


def _check_mode(mode: str):
    if mode not in MODES:
        raise InvalidArgumentError(f"mode: '{mode}' is not one of {', '.join(MODES)}")


def copy_blocks(
    dst,
    src,
    dst_ids,
    src_ids,
    *,
    stream=None,
    mode: str = "auto",
    zero_sm: bool = False,
    urgent: bool = False,
    settled_source: bool = False,
    merge: bool = True,
    pitched: bool = True,
    kernel_blocks: int = 0,
    kernel_threads: int = 0,
    kernel_chunk: int = 0,
    slice_bytes: int = 0,
) -> dict:
    """Copies page ``src_ids[i]`` of ``src`` to page ``dst_ids[i]`` of ``dst``, for every i,
    in every tensor of the two sides. Returns what ran: ``{"strategy", "direction",
    "copies", "bytes", "sms", "pitched"}`` (``copies``: copies submitted, of which
    ``pitched`` take several tensors' pages as the rows of one pitched copy).

    ``merge`` merges runs of adjacent pages into one copy; ``pitched`` takes a
    page's tensors that lie at one stride on both sides as one pitched copy
    (copy-engine modes but ``per_page``, the baseline).

    Index lists are lists, numpy arrays or int32/int64 tensors. A CUDA index
    tensor is read in place by ``mode="kernel"`` (no host sync; entries are
    bounds-checked in the kernel, duplicates are not detected); copy-engine
    modes copy it to the host first, which waits for the current stream.

    ``settled_source=True`` lets a fetch's copy engine read the host pages out
    of stream order: only when nothing queued before still writes them.

    ``slice_bytes`` (copy-engine modes): submit the copies in slices of about
    this many bytes, at most two on the copy engine at a time (0: all at
    once). A GPU's copy engine serves host-to-GPU copies first in, first out
    across streams whatever their priority, so a fetch issued on another
    stream (``urgent=True``) during a bulk fetch waits behind every copy the
    bulk already queued; behind a sliced bulk it waits for two slices at most.
    docs/kv.md has the measured cost and the latency.
    """
    _check_mode(mode)
    if isinstance(slice_bytes, bool) or not isinstance(slice_bytes, int) or slice_bytes < 0:
        raise InvalidArgumentError(
            f"slice_bytes is {slice_bytes!r}; expected a byte count >= 0 (0: no slices)"
        )
    if zero_sm and mode == "kernel":
        raise InvalidArgumentError("mode='kernel' launches a kernel, which zero_sm=True forbids")
    native = require()
    device, dr, sr = _sides(dst, src)
    d, s = _id_pair(dst_ids, src_ids)
    h = _stream_handle(stream, device)
    if d.on_device:
        torch = _torch()
        for ids, name in ((d, "dst_ids"), (s, "src_ids")):
            if ids.keep.device.index != device:
                raise InvalidArgumentError(
                    f"{name} is on {ids.keep.device}; the transfer runs on cuda:{device}"
                )
        use_kernel = mode == "kernel"
        if mode == "auto" and not zero_sm:
            direction = native.kv_direction(device, dr, sr)
            copies = d.count * len(dr)
            nbytes = d.count * sum(r[2] for r in dr)
            use_kernel = native.kv_choose(device, direction, copies, nbytes, False) == "kernel"
        # The lists (and any conversion made here) come from the current
        # stream; the copies run on `stream`. Copied to the host, they wait
        # for the current stream only: not for `stream`, which may be held
        # behind a gate this thread opens later.
        current = torch.cuda.current_stream(device)
        other = None if h == current.cuda_stream else torch.cuda.ExternalStream(h, device=device)
        if not use_kernel:
            d, s = d.to_host(), s.to_host()
        elif other is not None:
            other.wait_stream(current)
            d.keep.record_stream(other)
            s.keep.record_stream(other)
    strategy, direction, copies, nbytes, sms, n_pitched = native.kv_copy(
        device,
        dr,
        sr,
        d.ptr,
        s.ptr,
        d.count,
        d.is_64,
        d.on_device,
        mode,
        zero_sm,
        urgent,
        settled_source,
        merge,
        pitched,
        kernel_blocks,
        kernel_threads,
        kernel_chunk,
        slice_bytes,
        h,
    )
    return {
        "strategy": strategy,
        "direction": direction,
        "copies": copies,
        "bytes": nbytes,
        "sms": sms,
        "pitched": n_pitched,
    }


class PreparedTransfer:
    """A page transfer planned once and enqueued ahead behind a gate, then
    released by a trigger from the host, a stream or a kernel: on the critical
    path only the copies remain. Copy engines only (``mode`` "batched",
    "streams" or "per_page"); at most FERRY_KV_ARMED_MAX (512) host calls: a
    batched call of up to FERRY_BATCH_MAX (32) plain copies, a pitched copy,
    or with "per_page" each copy.

        t = kv.prepare(gpu_cache, host, dst_ids, src_ids)
        t.arm()             # enqueued now, behind the gate, after the current stream's work
        ...                 # later, when the pages are wanted:
        t.trigger()         # or t.trigger_on(stream), or fire t.device_trigger() in a kernel
        t.wait()            # the current stream waits for the pages
    """

    def __init__(
        self, dst, src, dst_ids, src_ids, mode: str = "batched", merge: bool = True, pitched: bool = True
    ):
        _check_mode(mode)
        if mode in ("auto", "kernel"):
            raise InvalidArgumentError(
                f"prepare: mode='{mode}'; a prepared transfer runs on copy engines: 'batched', 'streams' or 'per_page'"
            )
        native = require()
        self.device, dr, sr = _sides(dst, src)
        d, s = _id_pair(dst_ids, src_ids)
        if d.on_device:
            d, s = d.to_host(), s.to_host()
        self._keep = (dst, src)
        self._impl = native.PreparedPages(
            self.device,
            dr,
            sr,
            d.ptr,
            s.ptr,
            d.count,
            d.is_64,
            "batched" if mode == "streams" else mode,
            merge,
            pitched,
        )

    @property
    def armed(self) -> bool:
        return self._impl.armed

    @property
    def copies(self) -> int:
        return self._impl.copies

    @property
    def nbytes(self) -> int:
        return self._impl.bytes

    @property
    def direction(self) -> str:
        return self._impl.direction

    def arm(self, stream=None) -> None:
        """Enqueues the copies behind the gate, after the work enqueued so far on ``stream``.
        Armed again before an earlier trigger handed out (to a stream or a
        kernel) has landed, where those runs and this one would pass what the
        stream's queue takes, it waits for that trigger first and raises
        PeerTimeoutError at FERRY_TIMEOUT_S."""
        self._impl.arm(_stream_handle(stream, self.device))

    def trigger(self) -> None:
        """Opens the gate from the host."""
        self._impl.trigger()

    def trigger_on(self, stream=None) -> None:
        """Opens the gate in ``stream``'s order (a stream memory write, no kernel)."""
        self._impl.trigger_on(_stream_handle(stream, self.device))

    def device_trigger(self) -> tuple:
        """(word address, value): a kernel stores value at word to open the gate
        (``ferry_device_trigger_fire`` in include/ferry/device.cuh)."""
        return self._impl.device_trigger()

    def wait(self, stream=None) -> None:
        """Makes ``stream`` wait for the last armed run's copies."""
        self._impl.wait(_stream_handle(stream, self.device))

    def synchronize(self, timeout: float = 60.0) -> None:
        """Host wait for the last armed run; PeerTimeoutError says whether the gate was ever opened."""
        self._impl.synchronize(timeout)


def prepare(
    dst, src, dst_ids, src_ids, *, mode: str = "batched", merge: bool = True, pitched: bool = True
) -> PreparedTransfer:
    """A PreparedTransfer for these pages (see its docstring)."""
    return PreparedTransfer(dst, src, dst_ids, src_ids, mode=mode, merge=merge, pitched=pitched)


class HostPool:
    """Pinned host memory for KV pages, mapped for the GPU and placed on its NUMA
    node (mmap + cudaHostRegister from 64 MiB, with huge pages where the system
    has them; cudaHostAlloc below). Tensors carved from it keep it alive, and
    its memory is never freed while a transfer that touches it is in flight.

        pool = kv.HostPool(8 << 30)
        k = pool.tensor((pages, 16, heads, head_dim), torch.bfloat16)
    """

    def __init__(
        self, nbytes: int, *, device: int | None = None, numa_node: int | None = None, huge_pages=None
    ):
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise InvalidArgumentError(f"nbytes: expected a positive number of bytes, got {nbytes!r}")
        native = require()
        hp = {None: -1, False: 0, True: 1}.get(huge_pages)
        if hp is None:
            raise InvalidArgumentError(
                f"huge_pages: expected None (where available), False or True, got {huge_pages!r}"
            )
        self._impl = native.HostPool.create(
            nbytes,
            -1 if device is None else device,
            -2 if numa_node is None else numa_node,
            hp,
        )
        self._next = 0

    @property
    def nbytes(self) -> int:
        return self._impl.nbytes

    @property
    def numa_node(self) -> int:
        """The NUMA node the pages are bound to (-1: none, e.g. cudaHostAlloc)."""
        return self._impl.numa_node

    @property
    def backing(self) -> str:
        return self._impl.backing

    @property
    def huge_pages(self) -> str:
        return self._impl.huge_pages

    @property
    def data_ptr(self) -> int:
        return self._impl.data_ptr

    def in_flight(self) -> bool:
        return self._impl.in_flight()

    def tensor(self, shape: Sequence[int], dtype) -> Any:
        """A new tensor from the pool's unused memory (page-aligned)."""
        torch = _torch()
        dims = shape_of(shape, "HostPool.tensor")
        nbytes = math.prod(dims) * torch.empty((), dtype=dtype).element_size()
        start = (self._next + PAGE_ALIGN - 1) // PAGE_ALIGN * PAGE_ALIGN
        if start + nbytes > self.nbytes:
            raise InvalidArgumentError(
                f"HostPool.tensor: {nbytes} bytes do not fit; {self.nbytes - min(start, self.nbytes)} of "
                f"{self.nbytes} are left (make the pool larger)"
            )
        t = self._impl.view(start, nbytes).view(dtype).view(dims)
        self._next = start + nbytes  # only once the view exists
        return t

    def close(self) -> None:
        """Frees the memory now. Refused while a transfer touching the pool is in
        flight, or while tensors carved from it are alive (they would dangle).
        While another prepared transfer is armed and not yet triggered, the
        memory is freed later, once none is: freeing pinned memory waits for
        every stream of the GPU, the armed one too."""
        self._impl.close()


def pinned_empty(shape: Sequence[int], dtype, *, device: int | None = None) -> Any:
    """An uninitialised CPU tensor in pinned, NUMA-local host memory of its own
    (a HostPool that lives as long as the tensor)."""
    torch = _torch()
    dims = shape_of(shape, "pinned_empty")
    nbytes = max(1, math.prod(dims) * torch.empty((), dtype=dtype).element_size())
    return HostPool(nbytes, device=device).tensor(dims, dtype)


def choose(
    direction: str, copies: int, nbytes: int, *, zero_sm: bool = False, device: int | None = None
) -> str:
    """The mode ``auto`` runs for ``copies`` copies of ``nbytes`` in all in
    ``direction`` ("h2d", "d2h", "d2d") on this GPU."""
    native = require()
    if device is None:
        device = _torch().cuda.current_device()
    return native.kv_choose(device, direction, copies, nbytes, zero_sm)


def set_table(table, *, device: int | None = None) -> None:
    """Makes ``auto`` use ``table`` (a `ferry kv-tune` file's path or its parsed
    JSON) on this GPU, for this process."""
    import json

    native = require()
    if device is None:
        device = _torch().cuda.current_device()
    text = open(table).read() if isinstance(table, str) else json.dumps(table)
    native.kv_set_table(device, text)

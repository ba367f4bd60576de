"""Sleep and wake of a model's weights: every CUDA parameter and buffer of a
torch module moved to pinned host memory and back with multipath copies
(ferry.multipath), so that its GPU memory is free in between (model
switching, weight swaps in RL loops, serving several models on one GPU).

    state = ferry.offload.sleep(model)     # weights in pinned host memory; GPU memory freed
    ...                                    # another model uses the GPU
    state.wake()                           # the same Parameter objects, on the GPU again
    state.sleep()                          # and again: the host memory is kept and reused

Each call is one batched multipath copy of every tensor
(``Engine.copy_batch``). The host side is one ``ferry.kv.HostPool`` (pinned, on the GPU's NUMA node,
huge pages where the system has them), carved once at the first sleep. Copies
run on ``stream`` (default: the current stream of the module's GPU) and both
calls wait for them before returning, because sleep frees the GPU memory and
wake hands the weights back to the caller. Tensors of one module must be on
one GPU, and no two may share memory unless they are the same tensor (tied
weights are one Parameter, handled once).
"""

from __future__ import annotations

from typing import Any, List

from .errors import InvalidArgumentError

_ALIGN = 4096  # each tensor's host copy starts on a page


class _Entry:
    __slots__ = ("tensor", "shape", "dtype", "nbytes", "offset", "host")

    def __init__(self, tensor, offset: int):
        self.tensor = tensor  # the Parameter or buffer object; its .data moves
        self.shape = tuple(tensor.shape)
        self.dtype = tensor.dtype
        self.nbytes = tensor.numel() * tensor.element_size()
        self.offset = offset
        self.host = None


def plan(tensors: List[Any]) -> tuple:
    """Host offsets for `tensors` (page-aligned, in order) and the pool size:
    ([offset], total). Pure: no GPU."""
    offsets, at = [], 0
    for t in tensors:
        at = (at + _ALIGN - 1) // _ALIGN * _ALIGN
        offsets.append(at)
        at += t.numel() * t.element_size()
    return offsets, max(at, 1)


def _weights(module) -> List[Any]:
    seen, out = set(), []
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) in seen or t.numel() == 0:
            continue
        seen.add(id(t))
        out.append(t)
    return out


def _check(tensors: List[Any]) -> int:
    if not tensors:
        raise InvalidArgumentError("module: it has no non-empty parameters or buffers to move")
    devices = {t.device for t in tensors}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise InvalidArgumentError(
            f"module: its parameters and buffers are on {sorted(str(d) for d in devices)}; expected one CUDA device"
        )
    spans = []
    for t in tensors:
        if not t.is_contiguous():
            raise InvalidArgumentError(f"module: a tensor of shape {tuple(t.shape)} is not contiguous")
        start = t.data_ptr()
        spans.append((start, start + t.numel() * t.element_size(), tuple(t.shape)))
    spans.sort()
    for a, b in zip(spans, spans[1:]):
        if b[0] < a[1]:
            raise InvalidArgumentError(
                f"module: tensors of shapes {a[2]} and {b[2]} share memory; sleep moves each tensor on its own"
            )
    return next(iter(devices)).index


class Offloaded:
    """A module's weights and where they are; made by :func:`sleep`."""

    def __init__(self, module, engine=None):
        import torch

        from . import multipath
        from .kv import HostPool

        tensors = _weights(module)
        self.device = _check(tensors)
        offsets, total = plan(tensors)
        self._entries = [_Entry(t, o) for t, o in zip(tensors, offsets)]
        self._pool = HostPool(total, device=self.device)
        base = self._pool.tensor((total,), torch.uint8)
        for e in self._entries:
            e.host = base[e.offset : e.offset + e.nbytes].view(e.dtype).view(e.shape)
        # None: the default engine at each call, so that a copy that broke it
        # leaves the next sleep or wake a new one (the host copy is intact).
        self._engine = engine
        if engine is None:  # made now: a machine where none can be made fails here, not at the first sleep
            multipath.default_engine()
        self.asleep = False

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries)

    @property
    def tensors(self) -> int:
        return len(self._entries)

    def _copy_batch(self, dsts, srcs, s) -> None:
        """One batched engine copy on `s`, waited for; an error it met is raised."""
        from . import multipath

        def run(engine):
            engine.copy_batch(dsts, srcs, stream=s)
            s.synchronize()
            engine.check()

        if self._engine is not None:
            run(self._engine)
        else:
            multipath._on_default(run)

    def _stream(self, stream):
        import torch

        if stream is None:
            return torch.cuda.current_stream(self.device)
        # Both calls wait on it and run the allocations of wake on it: a torch stream.
        if not isinstance(stream, torch.cuda.Stream):
            raise InvalidArgumentError(
                f"stream is a {type(stream).__name__}; expected a torch.cuda.Stream or None"
            )
        return stream

    def sleep(self, stream=None) -> None:
        """Copies every weight to the host, waits, then frees its GPU memory
        (the tensors keep their objects, with empty data, until wake)."""
        import torch

        if self.asleep:
            raise InvalidArgumentError("sleep: the module is asleep already")
        s = self._stream(stream)
        for e in self._entries:
            if (
                tuple(e.tensor.shape) != e.shape
                or e.tensor.dtype != e.dtype
                or e.tensor.device.index != self.device
            ):
                raise InvalidArgumentError(
                    f"sleep: a tensor changed shape, dtype or device since the first sleep ({e.shape}, {e.dtype})"
                )
        # One batch: the links stay busy across tensors instead of filling
        # and draining once per tensor.
        self._copy_batch([e.host for e in self._entries], [e.tensor.data for e in self._entries], s)
        empty = {}
        for e in self._entries:
            if e.dtype not in empty:
                empty[e.dtype] = torch.empty(0, dtype=e.dtype, device=f"cuda:{self.device}")
            e.tensor.data = empty[e.dtype]
        self.asleep = True

    def wake(self, stream=None) -> None:
        """Allocates every weight on the GPU again and copies it back; returns
        once they are there."""
        import torch

        if not self.asleep:
            raise InvalidArgumentError("wake: the module is awake (sleep it first)")
        s = self._stream(stream)
        fresh = []
        with torch.cuda.stream(s):
            for e in self._entries:
                fresh.append(torch.empty(e.shape, dtype=e.dtype, device=f"cuda:{self.device}"))
            self._copy_batch(fresh, [e.host for e in self._entries], s)
        for e, g in zip(self._entries, fresh):
            e.tensor.data = g
        self.asleep = False


def sleep(module, *, engine=None, stream=None) -> Offloaded:
    """Moves `module`'s CUDA parameters and buffers to pinned host memory and
    frees their GPU memory; returns the handle whose ``wake()`` brings them
    back. ``engine``: a ferry.multipath.Engine (default: every visible GPU).
    ``stream``: a torch.cuda.Stream (default: the current one)."""
    state = Offloaded(module, engine)
    state.sleep(stream)
    return state

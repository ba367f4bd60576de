"""The handle of torch's current CUDA stream on a GPU, looked up as cheaply as
torch allows: its raw-stream accessor (what torch's own compiled code calls;
no Stream object is built, about 3 us less a call than
``torch.cuda.current_stream(device).cuda_stream``), else the public API, and
0 (the default stream) without torch."""

from __future__ import annotations

_lookup = None


def _make():
    try:
        import torch
    except ImportError:
        return lambda device: 0
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device: torch.cuda.current_stream(device).cuda_stream


def current(device: int) -> int:
    """The handle of torch's current stream on GPU `device`."""
    global _lookup
    if _lookup is None:
        _lookup = _make()
    return _lookup(device)

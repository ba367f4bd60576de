"""ferry's exception types. Every one derives from FerryError (a RuntimeError);
argument errors are also ValueErrors and timeouts also TimeoutErrors."""

from ._native import native

if native is not None:
    FerryError = native.FerryError
    InvalidArgumentError = native.InvalidArgumentError
    NoGpuError = native.NoGpuError
    CudaError = native.CudaError
    SystemCallError = native.SystemCallError
    PeerTimeoutError = native.PeerTimeoutError
    NotRegisteredError = native.NotRegisteredError
    ClosedError = native.ClosedError
    UnsupportedError = native.UnsupportedError
    BrokenError = native.BrokenError
    OutOfMemoryError = native.OutOfMemoryError
else:  # pragma: no cover - only without the extension

    class FerryError(RuntimeError):
        pass

    class InvalidArgumentError(FerryError, ValueError):
        pass

    class NoGpuError(FerryError):
        pass

    class CudaError(FerryError):
        pass

    class SystemCallError(FerryError, OSError):
        pass

    class PeerTimeoutError(FerryError, TimeoutError):
        pass

    class NotRegisteredError(FerryError, ValueError):
        pass

    class ClosedError(FerryError):
        pass

    class UnsupportedError(FerryError):
        pass

    class BrokenError(FerryError):
        pass

    class OutOfMemoryError(FerryError, MemoryError):
        pass


__all__ = [
    "BrokenError",
    "ClosedError",
    "CudaError",
    "FerryError",
    "InvalidArgumentError",
    "NoGpuError",
    "NotRegisteredError",
    "OutOfMemoryError",
    "PeerTimeoutError",
    "SystemCallError",
    "UnsupportedError",
]

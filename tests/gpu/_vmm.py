"""GPU memory made with CUDA's virtual memory management through ctypes, as
a user's allocator would make it (several physical allocations mapped back to
back in one address range), for the heap's registration tests. Independent
of ferry: it calls libcuda directly."""

from __future__ import annotations

import ctypes

_PINNED, _POSIX_FD, _DEVICE, _READ_WRITE = 1, 1, 1, 3
_MINIMUM = 0


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _Prop(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _Access(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_cu = None


def _driver():
    global _cu
    if _cu is None:
        _cu = ctypes.CDLL("libcuda.so.1")
        u64, sz = ctypes.c_uint64, ctypes.c_size_t
        _cu.cuMemAddressReserve.argtypes = [ctypes.POINTER(u64), sz, sz, u64, ctypes.c_ulonglong]
        _cu.cuMemCreate.argtypes = [ctypes.POINTER(u64), sz, ctypes.POINTER(_Prop), ctypes.c_ulonglong]
        _cu.cuMemMap.argtypes = [u64, sz, sz, u64, ctypes.c_ulonglong]
        _cu.cuMemSetAccess.argtypes = [u64, sz, ctypes.POINTER(_Access), sz]
        _cu.cuMemUnmap.argtypes = [u64, sz]
        _cu.cuMemRelease.argtypes = [u64]
        _cu.cuMemAddressFree.argtypes = [u64, sz]
        _cu.cuMemGetAllocationGranularity.argtypes = [ctypes.POINTER(sz), ctypes.POINTER(_Prop), ctypes.c_int]
    return _cu


def _check(rc: int, what: str):
    if rc != 0:
        raise RuntimeError(f"{what}: CUDA driver error {rc}")


class _Array:
    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


class VmmBuffer:
    """Physical allocations of `pieces` bytes each (multiples of the granule),
    mapped back to back on GPU `device`; exportable as POSIX fds unless told not."""

    def __init__(self, torch, device: int, pieces, exportable: bool = True):
        cu = _driver()
        self.torch, self.device = torch, device
        with torch.cuda.device(device):
            torch.cuda.current_stream()  # the device's primary context is current from here
            prop = _Prop()
            prop.type = _PINNED
            prop.requestedHandleTypes = _POSIX_FD if exportable else 0
            prop.location = _Location(_DEVICE, device)
            g = ctypes.c_size_t()
            _check(
                cu.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop), _MINIMUM), "granularity"
            )
            self.granule = g.value
            self.size = sum(pieces)
            base = ctypes.c_uint64()
            _check(
                cu.cuMemAddressReserve(ctypes.byref(base), self.size, self.granule, 0, 0),
                "cuMemAddressReserve",
            )
            self.base, self.maps = base.value, []
            at = self.base
            for n in pieces:
                assert n % self.granule == 0, (n, self.granule)
                h = ctypes.c_uint64()
                _check(cu.cuMemCreate(ctypes.byref(h), n, ctypes.byref(prop), 0), "cuMemCreate")
                _check(cu.cuMemMap(at, n, 0, h.value, 0), "cuMemMap")
                self.maps.append((at, n, h.value))
                at += n
            access = _Access(_Location(_DEVICE, device), _READ_WRITE)
            _check(cu.cuMemSetAccess(self.base, self.size, ctypes.byref(access), 1), "cuMemSetAccess")

    def tensor(self, offset: int, nbytes: int):
        """A uint8 tensor over [base + offset, + nbytes)."""
        assert 0 <= offset and offset + nbytes <= self.size
        with self.torch.cuda.device(self.device):
            return self.torch.as_tensor(_Array(self.base + offset, nbytes), device=f"cuda:{self.device}")

    def free(self):
        """Unmaps and releases everything (tensors over it become invalid)."""
        cu = _driver()
        self.torch.cuda.synchronize(self.device)
        for at, n, h in self.maps:
            _check(cu.cuMemUnmap(at, n), "cuMemUnmap")
            _check(cu.cuMemRelease(h), "cuMemRelease")
        self.maps = []
        _check(cu.cuMemAddressFree(self.base, self.size), "cuMemAddressFree")

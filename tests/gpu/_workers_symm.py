"""The symmetric heap on the GPU (tests/gpu/test_symm.py runs this file):

    python _workers_symm.py local WORLD   # one process drives WORLD ranks (init_local)
    python _workers_symm.py procs WORLD   # one process per rank (ferry.init), spawned here
    python _workers_symm.py stream-timeout WORLD   # a stream wait nobody signals is released

SYMM_CHECKS=a,b runs only those checks.

Ranks share the visible GPUs (rank r on GPU r % N; FERRY_SHARED_GPUS=1 where
the world is larger), so every check runs on one GPU. Every rank's data is
random bytes from a seed of (rank, salt), which any process can make again:
each result is compared byte for byte with data the checking process made
itself, never with what ferry moved. Outputs are poisoned first. The device
API is driven by test kernels (symm_kernels.cu, through ctypes) that take the
heap handle as the raw bytes of ferry::device::Heap.

Prints "symm: N checks, 0 failed" and exits 0 when every check passed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
import time
import traceback
import zlib

from _builds import cmake_target

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
POISON = 0xA5
SIZES = [(1, 0), (3, 5), (4096, 0), (100003, 7), ((1 << 20) + 13, 16)]  # (bytes, offset)


def built_library(target: str = "ferry_symm_test_kernels") -> str:
    """A CMake target's shared library (_builds.py)."""
    return cmake_target(target, f"lib{target}.so")


class Kernels:
    def __init__(self):
        lib = ctypes.CDLL(built_library())
        P, I, U = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64
        sig = {
            "ft_put": [P, I, P, P, U, I, I, P],
            "ft_put_signal": [P, I, P, P, U, P, U, I, I, P],
            "ft_wait_copy": [P, P, U, I, P, P, U, P, P],
            "ft_wait_until": [P, P, ctypes.c_int32, I, P, P],
            "ft_p_g": [P, P, ctypes.c_int64, I, P, P, P],
            "ft_test": [P, ctypes.c_int32, P, P],
            "ft_handoff": [P, P, I, P, I, I, P, P],
            "ft_atomic": [P, I, I, P, U, I, I, I, I, P, P],
            "ft_barrier": [P, I, I, I, I, P, I, P, P],
            "ft_coll": [P, I, I, I, P, P, U, I, I, I, I, I, P, P],
            "ft_grid_sync_fault": [P, P, P],
        }
        for name, args in sig.items():
            getattr(lib, name).argtypes = args
            getattr(lib, name).restype = I
        self.lib = lib
        self.handle_size = lib.ft_handle_size()

    def __getattr__(self, name):
        fn = getattr(self.lib, "ft_" + name)

        def call(*args):
            err = fn(*args)
            if err:
                raise RuntimeError(f"ft_{name}: CUDA error {err}")

        return call


def data(torch, rank: int, salt: str, n: int, dev):
    g = torch.Generator(device=dev)
    g.manual_seed(zlib.crc32(f"{rank}/{salt}".encode()))
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev, generator=g)


class Suite:
    """Runs the checks over this process's ranks (all of them, or one)."""

    def __init__(self, ferry, torch, comm, world: int, local: bool):
        import ferry.symm

        self.ferry, self.torch, self.comm, self.world, self.local = ferry, torch, comm, world, local
        self.k = Kernels()
        self.heap = ferry.symm.Heap(comm, capacity=1 << 30)
        self.ranks = list(range(world)) if local else [comm.rank]
        self.devs = [torch.device("cuda", d) for d in comm.devices]
        # Ranks sharing one GPU (FERRY_SHARED_GPUS): a collective's blocks spin until the same block of every
        # member runs, so every rank's grid must be resident on the GPU at once.
        self.per_gpu = -(-world // torch.cuda.device_count())
        self.streams = [torch.cuda.Stream(device=d) for d in self.devs]
        self.side = [torch.cuda.Stream(device=d) for d in self.devs]
        self.handles = [self.heap.handle(i) for i in range(len(self.ranks))]
        self.raw = [ctypes.create_string_buffer(h.as_bytes(), len(h.as_bytes())) for h in self.handles]
        self.checks = 0
        self.fails: list = []
        self.warm_up()

    def warm_up(self):
        """Launches every test kernel once per rank where nothing waits: a
        kernel's first launch under lazy module loading can wait for the
        device, and so for a kernel of another rank spinning on it."""
        torch = self.torch
        scratch = self.each(self.heap.zeros((8,), torch.int64))
        outs = [torch.zeros(4, dtype=torch.int64, device=d) for d in self.devs]
        for i, d in enumerate(self.devs):
            self.streams[i].wait_stream(torch.cuda.current_stream(d))  # after the zeroing
        for i, r in enumerate(self.ranks):
            raw, s, w = self.raw[i], self.streams[i].cuda_stream, self.ptr(scratch[i])
            o = self.ptr(outs[i])
            for scope in (0, 1, 2):
                self.k.put(raw, scope, 0, 0, 0, r, 0, s)
                self.k.put(raw, scope, 0, 0, 0, r, 1, s)
                self.k.put_signal(raw, scope, 0, 0, 0, w, 0, 0, r, s)
                self.k.barrier(raw, scope, r, 1, 1, w + 32, 1, o, s)
            self.k.wait_copy(raw, w, 0, -1, 0, 0, 0, o, s)
            self.k.wait_until(raw, w + 40, 0, -1, o, s)
            self.k.p_g(raw, w + 8, 0, r, w + 16, o, s)
            self.k.test(w + 40, 0, o, s)
            self.k.handoff(raw, w, 0, w + 48, 0, 0, o, s)
            self.k.atomic(raw, 0, 64, w + 24, 0, r, 0, 1, 1, 0, s)
            self.k.atomic(raw, 0, 32, w + 24, 0, r, 0, 1, 1, 0, s)
            self.k.coll(raw, 6, 0, 0, w, w, 0, 0, r, 1, 1, 1, o, s)  # barrier_all over a team of one
            with torch.cuda.stream(self.streams[i]):
                torch.cuda._sleep(1)  # the tests' late ranks sleep while other ranks' kernels spin
        self.sync()
        self.heap.free(scratch if self.local else scratch[0])

    # ------------------------------------------------------------ helpers

    def each(self, v):
        """A heap call's result as a list over this process's ranks."""
        return v if self.local else [v]

    def sync(self):
        for d in self.devs:
            self.torch.cuda.synchronize(d)

    def barrier(self):
        """Every rank's streams drained and past one barrier_on_stream."""
        for i, s in enumerate(self.streams):
            s.wait_stream(self.torch.cuda.current_stream(self.devs[i]))
            s.wait_stream(self.side[i])
        self.heap.barrier_on_stream(self.streams if self.local else self.streams[0])
        self.sync()
        self.heap.check()

    def expect_equal(self, label, got, exp):
        self.checks += 1
        self.torch.cuda.synchronize(got.device)
        bad = int((got.view(self.torch.uint8) != exp.view(self.torch.uint8)).sum().item())
        if bad:
            self.fails.append(f"{label}: {bad} wrong bytes of {exp.numel() * exp.element_size()}")

    def expect(self, label, cond):
        self.checks += 1
        if not cond:
            self.fails.append(label)

    def expect_error(self, label, pattern, fn, kind=None):
        import re

        self.checks += 1
        try:
            fn()
        except self.ferry.FerryError as exc:
            if not re.search(pattern, str(exc)) or (kind is not None and not isinstance(exc, kind)):
                self.fails.append(
                    f"{label}: expected {kind.__name__ if kind else 'an error'} /{pattern}/, got "
                    f"{type(exc).__name__}: {exc}"
                )
            return
        self.fails.append(f"{label}: expected /{pattern}/, nothing raised")

    def ptr(self, t) -> int:
        return t.data_ptr()

    @contextlib.contextmanager
    def capturing(self, stream):
        """Inside: `stream` captures a CUDA graph (relaxed mode, so that the
        calls' pointer queries are allowed); the capture is ended after,
        whether or not anything was captured."""
        g = self.torch.cuda.CUDAGraph()
        with self.torch.cuda.stream(stream):
            g.capture_begin(capture_error_mode="relaxed")
            try:
                yield
            finally:
                try:
                    g.capture_end()
                except Exception as exc:  # noqa: BLE001 - an empty graph
                    if "empty" not in str(exc).lower():
                        self.fails.append(f"capture: {exc}")

    def put_right(self, raws, dsts, salt: str, nbytes: int):
        """Each rank's data(salt) put by a block-scope kernel into its right
        neighbour's copy of dsts[i] (an address in this rank's heap), then a barrier."""
        torch = self.torch
        for i, r in enumerate(self.ranks):
            src = data(torch, r, salt, nbytes, self.devs[i])
            self.streams[i].wait_stream(torch.cuda.current_stream(self.devs[i]))  # src is made there
            self.k.put(
                raws[i],
                2,
                dsts[i],
                self.ptr(src),
                nbytes,
                (r + 1) % self.world,
                0,
                self.streams[i].cuda_stream,
            )
            self.streams[i].synchronize()
        self.barrier()

    # ------------------------------------------------------------ checks

    def rma(self):
        """put and get at thread, warp and block scope; odd sizes, unaligned offsets."""
        torch, W = self.torch, self.world
        buf = self.each(self.heap.empty(((1 << 20) + 64,), torch.uint8))
        for scope in (0, 1, 2):
            for size, off in SIZES:
                for get in (0, 1):
                    salt = f"rma/{scope}/{size}/{off}/{get}"
                    srcs, outs = [], []
                    for i, r in enumerate(self.ranks):
                        buf[i].fill_(POISON)
                        if get:
                            buf[i][off : off + size].copy_(data(torch, r, salt, size, self.devs[i]))
                        src = torch.empty(size + off, dtype=torch.uint8, device=self.devs[i])
                        src[off:].copy_(data(torch, r, salt, size, self.devs[i]))
                        srcs.append(src)
                        outs.append(
                            torch.full((size + off + 64,), POISON, dtype=torch.uint8, device=self.devs[i])
                        )
                    self.barrier()
                    for i, r in enumerate(self.ranks):
                        peer = (r + 1) % W
                        # get: the peer's heap copy into a local buffer; put: the reverse.
                        dst, src = (outs[i], buf[i]) if get else (buf[i], srcs[i])
                        self.k.put(
                            self.raw[i],
                            scope,
                            self.ptr(dst) + off,
                            self.ptr(src) + off,
                            size,
                            peer,
                            int(get),
                            self.streams[i].cuda_stream,
                        )
                    self.barrier()
                    for i, r in enumerate(self.ranks):
                        label = f"rank {r} {'get' if get else 'put'} scope {scope} {size} B at +{off}"
                        if get:
                            exp = data(torch, (r + 1) % W, salt, size, self.devs[i])
                            self.expect_equal(label, outs[i][off : off + size], exp)
                            self.expect_equal(
                                label + " (around)",
                                outs[i][off + size :],
                                torch.full((64,), POISON, dtype=torch.uint8, device=self.devs[i]),
                            )
                        else:
                            exp = data(torch, (r - 1) % W, salt, size, self.devs[i])
                            self.expect_equal(label, buf[i][off : off + size], exp)
                            around = torch.cat([buf[i][:off], buf[i][off + size : off + size + 64]])
                            self.expect_equal(label + " (around)", around, torch.full_like(around, POISON))
        self.heap.free(buf if self.local else buf[0])

    def put_signal(self):
        """A put and its signal: what the waiting peer copies once it sees the signal is all of the data."""
        torch, W = self.torch, self.world
        n = (1 << 20) + 3
        buf = self.each(self.heap.empty((n,), torch.uint8))
        sig = self.each(self.heap.zeros((1,), torch.int64))
        value = 0
        for rnd, (scope, add) in enumerate([(0, 0), (1, 0), (2, 0), (2, 1), (1, 1)]):
            value = value + 1 if add else rnd + 10
            salt = f"ps/{rnd}"
            srcs, outs, oks = [], [], []
            for i, r in enumerate(self.ranks):
                buf[i].fill_(POISON)
                srcs.append(data(torch, r, salt, n, self.devs[i]))
                outs.append(torch.full((n,), POISON, dtype=torch.uint8, device=self.devs[i]))
                oks.append(torch.zeros(1, dtype=torch.int32, device=self.devs[i]))
            self.barrier()
            for i, r in enumerate(self.ranks):
                self.k.wait_copy(
                    self.raw[i],
                    self.ptr(sig[i]),
                    value,
                    (r - 1) % W,
                    self.ptr(buf[i]),
                    self.ptr(outs[i]),
                    n,
                    self.ptr(oks[i]),
                    self.side[i].cuda_stream,
                )
            for i, r in enumerate(self.ranks):
                self.k.put_signal(
                    self.raw[i],
                    scope,
                    self.ptr(buf[i]),
                    self.ptr(srcs[i]),
                    n,
                    self.ptr(sig[i]),
                    1 if add else value,
                    add,
                    (r + 1) % W,
                    self.streams[i].cuda_stream,
                )
            self.barrier()
            for i, r in enumerate(self.ranks):
                label = f"rank {r} put_signal scope {scope} {'add' if add else 'set'}"
                self.expect(f"{label}: the wait gave up", int(oks[i].item()) == 1)
                self.expect_equal(label, outs[i], data(torch, (r - 1) % W, salt, n, self.devs[i]))
                self.expect(
                    f"{label}: signal {int(sig[i].item())}, expected {value}", int(sig[i].item()) == value
                )
        self.heap.free(buf if self.local else buf[0])
        self.heap.free(sig if self.local else sig[0])

    def p_g(self):
        torch, W = self.torch, self.world
        words = self.each(self.heap.empty((2,), torch.int64))
        outs = []
        for i, r in enumerate(self.ranks):
            words[i][0] = -1
            words[i][1] = r * 31 + 5
            outs.append(torch.full((1,), -7, dtype=torch.int64, device=self.devs[i]))
        self.barrier()
        for i, r in enumerate(self.ranks):
            self.k.p_g(
                self.raw[i],
                self.ptr(words[i]),
                r * 1000 + 7,
                (r + 1) % W,
                self.ptr(words[i]) + 8,
                self.ptr(outs[i]),
                self.streams[i].cuda_stream,
            )
        self.barrier()
        for i, r in enumerate(self.ranks):
            self.expect(f"rank {r} g: {int(outs[i].item())}", int(outs[i].item()) == ((r + 1) % W) * 31 + 5)
            self.expect(
                f"rank {r} p: {int(words[i][0].item())}", int(words[i][0].item()) == ((r - 1) % W) * 1000 + 7
            )
        self.heap.free(words if self.local else words[0])

    def atomics(self):
        """Every rank's atomics on rank 0's words; read back through peer
        views. The fetching ones also keep what each call returned (on the
        heap, so that every process reads every rank's): fetch_add and
        fetch_inc must have returned each value from 0 up exactly once, and
        each rank's fetch_or / fetch_and / fetch_xor of its own bit must have
        seen its bit untouched and the others' bits as set by the ones before."""
        torch, W = self.torch, self.world
        c64 = self.each(self.heap.zeros((16,), torch.int64))
        c32 = self.each(self.heap.zeros((8,), torch.int32))
        calls = 2 * 64 * 10  # blocks x threads x iterations per rank
        fetched = self.each(self.heap.empty((2, calls), torch.int64))
        bits = self.each(self.heap.empty((4,), torch.int64))
        for i in range(len(self.ranks)):
            c64[i][3] = -1  # the and's start
            c64[i][8] = -1  # the fetch_and's start
            fetched[i].fill_(-1)
            bits[i].fill_(-1)
        olds = [torch.full((1,), -1, dtype=torch.int64, device=d) for d in self.devs]
        self.barrier()
        for i, r in enumerate(self.ranks):
            s = self.streams[i].cuda_stream
            a64, a32 = self.ptr(c64[i]), self.ptr(c32[i])
            f, b = self.ptr(fetched[i]), self.ptr(bits[i])
            self.k.atomic(self.raw[i], 0, 64, a64 + 48, 3, 0, 10, 2, 64, f, s)  # fetch_add, returns kept
            self.k.atomic(self.raw[i], 8, 64, a64 + 56, 0, 0, 10, 2, 64, f + 8 * calls, s)  # fetch_inc
            self.k.atomic(
                self.raw[i], 9, 64, a64 + 64, ((1 << 64) - 1) ^ (1 << r), 0, 1, 1, 1, b, s
            )  # fetch_and
            self.k.atomic(self.raw[i], 10, 64, a64 + 72, 1 << r, 0, 1, 1, 1, b + 8, s)  # fetch_or
            self.k.atomic(self.raw[i], 11, 64, a64 + 80, 1 << r, 0, 1, 1, 1, b + 16, s)  # fetch_xor
            self.k.atomic(self.raw[i], 7, 64, a64 + 88, r + 1, 0, 3, 1, 32, 0, s)  # add (no return)
            self.k.atomic(self.raw[i], 0, 64, a64, 3, 0, 10, 2, 64, 0, s)  # fetch_add
            self.k.atomic(self.raw[i], 1, 64, a64 + 8, 0, 0, 10, 2, 64, 0, s)  # inc
            self.k.atomic(self.raw[i], 2, 64, a64 + 16, 1 << r, 0, 1, 1, 1, 0, s)  # or
            self.k.atomic(self.raw[i], 3, 64, a64 + 24, ((1 << 64) - 1) ^ (1 << r), 0, 1, 1, 1, 0, s)  # and
            self.k.atomic(self.raw[i], 5, 64, a64 + 32, 0, 0, 5, 1, 32, 0, s)  # compare_swap increments
            self.k.atomic(self.raw[i], 6, 64, a64 + 40, r + 1, 0, 1, 1, 1, self.ptr(olds[i]), s)  # swap
            self.k.atomic(self.raw[i], 0, 32, a32, 1, 0, 10, 2, 64, 0, s)  # fetch_add, 32-bit
            self.k.atomic(self.raw[i], 4, 32, a32 + 4, 1 << r, 0, 1, 1, 1, 0, s)  # xor, 32-bit
        self.barrier()
        got64 = self.heap.peer(c64[0], 0).cpu().tolist()
        got32 = self.heap.peer(c32[0], 0).cpu().tolist()
        full = (1 << W) - 1
        exp = {
            "fetch_add": (got64[0], 3 * W * 1280),
            "inc": (got64[1], W * 1280),
            "or": (got64[2], full),
            "and": (got64[3] & ((1 << 64) - 1), ((1 << 64) - 1) ^ full),
            "compare_swap": (got64[4], W * 160),
            "fetch_add32": (got32[0], W * 1280),
            "xor32": (got32[1], full),
        }
        exp["fetch_add (olds kept)"] = (got64[6], 3 * W * calls)
        exp["fetch_inc"] = (got64[7], W * calls)
        exp["fetch_and"] = (got64[8] & ((1 << 64) - 1), ((1 << 64) - 1) ^ full)
        exp["fetch_or"] = (got64[9], full)
        exp["fetch_xor"] = (got64[10], full)
        exp["add"] = (got64[11], 3 * 32 * W * (W + 1) // 2)
        for name, (got, want) in exp.items():
            self.expect(f"rank {self.ranks[0]} atomic {name}: {got}, expected {want}", got == want)
        every = [self.heap.peer(fetched[0], p).cpu() for p in range(W)]
        adds = sorted(v for t in every for v in t[0].tolist())
        incs = sorted(v for t in every for v in t[1].tolist())
        self.expect(f"fetch_add returned {adds[:4]}...{adds[-2:]}", adds == [3 * k for k in range(W * calls)])
        self.expect(f"fetch_inc returned {incs[:4]}...{incs[-2:]}", incs == list(range(W * calls)))
        seen = [self.heap.peer(bits[0], p).cpu().tolist() for p in range(W)]
        mask = (1 << 64) - 1
        for name, col, own_set in (("fetch_and", 0, True), ("fetch_or", 1, False), ("fetch_xor", 2, False)):
            olds_ = [seen[p][col] & mask for p in range(W)]
            # The bits set so far by the others: for fetch_and the cleared ones.
            done = [bin((~o if own_set else o) & full).count("1") for o in olds_]
            own_ok = all(bool(olds_[p] >> p & 1) == own_set for p in range(W))
            self.expect(
                f"{name} returned {[hex(o) for o in olds_]}", own_ok and sorted(done) == list(range(W))
            )
        self.expect(f"swap: final {got64[5]}", 1 <= got64[5] <= W)
        seen = [int(o.item()) for o in olds]
        self.expect(f"swap: old values {seen}", all(0 <= s <= W for s in seen))
        if self.local:  # every value but the last one stored came back once
            self.expect(
                f"swap: old values {seen} and final {got64[5]}",
                sorted(seen + [got64[5]]) == list(range(W + 1)),
            )
        for t in (c64, c32, fetched, bits):
            self.heap.free(t if self.local else t[0])

    def waits(self):
        """wait_until and test on a rank's own word, set by its left
        neighbour's atomic; then put / fence / put and put / quiet / relaxed
        atomic hand-offs of 64 slots to the right neighbour, every word
        checked by the receiving thread after its wait."""
        torch, W = self.torch, self.world
        words = self.each(self.heap.zeros((4,), torch.int32))
        outs = [torch.full((4,), -1, dtype=torch.int32, device=d) for d in self.devs]
        self.barrier()
        for i, r in enumerate(self.ranks):
            s = self.streams[i].cuda_stream
            w, o = self.ptr(words[i]), self.ptr(outs[i])
            self.k.wait_until(self.raw[i], w, 77 + r, (r - 1) % W, o, s)
            self.k.test(w, 77 + r, o + 8, s)
        for i, r in enumerate(self.ranks):  # the left neighbour's or sets the word the wait is for
            s = self.side[i].cuda_stream
            self.k.atomic(
                self.raw[i], 2, 32, self.ptr(words[i]), 77 + (r + 1) % W, (r + 1) % W, 1, 1, 1, 0, s
            )
        self.barrier()
        for i, r in enumerate(self.ranks):
            got = outs[i].cpu().tolist()
            self.expect(f"rank {r} wait_until returned {got[0]}, test {got[2:]}", got == [1, -1, 1, 0])
        n, rounds = 64, 64
        for mode in (0, 1):
            slots = self.each(self.heap.zeros((rounds * n,), torch.int64))
            flag = self.each(self.heap.zeros((1,), torch.int64))
            bad = [torch.full((1,), -7, dtype=torch.int32, device=d) for d in self.devs]
            self.barrier()
            for i, r in enumerate(self.ranks):
                self.k.handoff(
                    self.raw[i], self.ptr(slots[i]), n, self.ptr(flag[i]), rounds, mode, self.ptr(bad[i]),
                    self.streams[i].cuda_stream,
                )  # fmt: skip
            self.barrier()
            for i, r in enumerate(self.ranks):
                got = int(bad[i].item())
                self.expect(f"rank {r} {('fence', 'quiet')[mode]} hand-off: {got} words missing", got == 0)
            for t in (slots, flag):
                self.heap.free(t if self.local else t[0])
        self.heap.free(words if self.local else words[0])

    def barriers(self):
        """barrier and sync over the world and over strided teams, at every scope."""
        torch, W = self.torch, self.world
        teams = [(0, 1, W), (0, 2, (W + 1) // 2)]
        if W >= 3:
            teams.append((1, 2, W // 2))
        for scope in (0, 1, 2):
            for start, stride, size in teams:
                ctr = self.each(self.heap.zeros((1,), torch.int64))
                outs = [torch.full((2,), -1, dtype=torch.int32, device=d) for d in self.devs]
                self.barrier()
                members = []
                for i, r in enumerate(self.ranks):
                    if r >= start and (r - start) % stride == 0 and (r - start) // stride < size:
                        members.append(i)
                        self.k.barrier(
                            self.raw[i],
                            scope,
                            start,
                            stride,
                            size,
                            self.ptr(ctr[i]),
                            5,
                            self.ptr(outs[i]),
                            self.streams[i].cuda_stream,
                        )
                self.barrier()
                for i in members:
                    got = outs[i].tolist()
                    self.expect(
                        f"rank {self.ranks[i]} barrier scope {scope} team {start},{stride},{size}: "
                        f"(early reads, failed) = {got}",
                        got == [0, 0],
                    )
                self.heap.free(ctr if self.local else ctr[0])

    def collectives(self):
        """The device collectives over the world and a strided team, 1 and 4
        blocks, every reduction type and operation; small integers, so that
        float, half and bfloat16 sums are exact."""
        torch, W = self.torch, self.world
        dtypes = [(0, torch.float32), (1, torch.float16), (2, torch.bfloat16), (3, torch.int32)]
        teams = [(0, 1, W)] + ([(1, 2, W // 2)] if W >= 4 else [])
        count = 3001
        src = self.each(self.heap.empty((W * count,), torch.int32))
        dst = self.each(self.heap.empty((W * count,), torch.int32))

        def values(rank, salt, dtype, dev):
            g = torch.Generator(device=dev)
            g.manual_seed(zlib.crc32(f"{rank}/{salt}".encode()))
            return torch.randint(-8, 9, (W * count,), device=dev, generator=g).to(dtype)

        # 7, 8, 9, 10, 13: all_reduce asking for the low-latency, one-shot, two-shot, low-latency two-shot and
        # per-block two-shot algorithms;
        # 11: kAuto, after which the last block copies all of dst in the same kernel; 12: two low-latency calls
        # by name back to back, grid_sync, then kAuto over the first one's result; 14: two per-block two-shots back
        # to back, then kTwoShot over the first one's result (float and int32: exact sums).
        cases = (
            [(c, 3, 0) for c in (0, 1, 2, 6)]
            + [(c, d, op) for c in (3, 4, 5, 7, 8, 9, 10, 13) for d, _ in dtypes for op in (0, 1, 2)]
            + [(11, d, 0) for d, _ in dtypes]
            + [(c, d, 0) for c in (12, 14) for d in (0, 3)]
        )
        for start, stride, size in teams:
            members = [start + i * stride for i in range(size)]
            for blocks in (1, 4):
                for coll, dcode, op in cases:
                    dtype = dtypes[dcode][1]
                    root = (size - 1) if coll in (0, 3) else 0
                    salt = f"coll/{coll}/{dcode}/{op}/{blocks}/{start}"
                    oks = []
                    for i, r in enumerate(self.ranks):
                        s_view, d_view = src[i].view(dtype)[: W * count], dst[i].view(dtype)[: W * count]
                        s_view.copy_(values(r, salt, dtype, self.devs[i]))
                        d_view.fill_(77)
                        oks.append(torch.full((blocks,), -1, dtype=torch.int32, device=self.devs[i]))
                    self.barrier()
                    for i, r in enumerate(self.ranks):
                        if r in members:
                            self.k.coll(
                                self.raw[i],
                                coll,
                                dcode,
                                op,
                                self.ptr(dst[i]),
                                self.ptr(src[i]),
                                count,
                                root,
                                start,
                                stride,
                                size,
                                blocks,
                                self.ptr(oks[i]),
                                self.streams[i].cuda_stream,
                            )
                    self.barrier()
                    for i, r in enumerate(self.ranks):
                        if r not in members:
                            continue
                        my = members.index(r)
                        label = f"rank {r} coll {coll} dtype {dtype} op {op} blocks {blocks} team {start},{stride},{size}"
                        self.expect(f"{label}: returned {oks[i].tolist()}", oks[i].tolist() == [1] * blocks)
                        got = dst[i].view(dtype)[: W * count]
                        dev = self.devs[i]
                        ins = {m: values(m, salt, dtype, dev) for m in members}
                        poison = torch.full((W * count,), 77, dtype=dtype, device=dev)
                        exp = poison.clone()
                        if coll == 0:
                            exp[:count] = ins[members[root]][:count]
                        elif coll == 1:
                            for j, m in enumerate(members):
                                exp[j * count : (j + 1) * count] = ins[m][:count]
                        elif coll == 2:
                            for j, m in enumerate(members):
                                exp[j * count : (j + 1) * count] = ins[m][my * count : (my + 1) * count]
                        elif coll in (12, 14):
                            n = count // 2
                            red = torch.stack([ins[m][:n].double() for m in members]).sum(0)
                            exp[:n] = red.to(dtype)
                            exp[n : 2 * n] = red.to(dtype)
                            exp[2 * n : 3 * n] = (red * len(members)).to(dtype)
                        elif coll in (3, 4, 5, 7, 8, 9, 10, 11, 13):
                            blk = slice(my * count, (my + 1) * count) if coll == 5 else slice(0, count)
                            stack = torch.stack([ins[m][blk].double() for m in members])
                            red = (
                                stack.sum(0)
                                if op == 0
                                else stack.max(0).values
                                if op == 1
                                else stack.min(0).values
                            )
                            if coll != 3 or my == root:
                                exp[:count] = red.to(dtype)
                            if coll == 11:  # the copy made in the kernel right after the call
                                exp[count : 2 * count] = red.to(dtype)
                        self.expect_equal(label, got, exp)
        self.heap.free(src if self.local else src[0])
        self.heap.free(dst if self.local else dst[0])

    def all_reduce_algorithms(self):
        """Each all_reduce algorithm at sizes past the low-latency limit and
        on buffers off 16-byte boundaries (the element paths), over the world,
        small random integers (sums exact in bf16 up to 8 ranks); three calls
        back to back with the source raised by one before each later call, in
        stream order and without a barrier, so a member may run a call ahead
        of another and a stale round would show."""
        torch, W = self.torch, self.world
        # The low-latency one-shot fits 8 KB of data per block and peer. The coll kernel takes a whole SM's
        # registers, so ranks sharing a GPU get at most its SMs between them: every rank's grid resident at once
        # (32 blocks up to four ranks on an H200, 16 with eight).
        sms = torch.cuda.get_device_properties(self.devs[0]).multi_processor_count
        blocks = min(32, sms // self.per_gpu)
        # 280 KB of float: past the low-latency one-shot's limit on 32 blocks and the two-shot threshold,
        # inside the low-latency two-shot's (asked by name) with 3 ranks or more.
        big = 70001
        src = self.each(self.heap.empty((big + 8,), torch.float32))
        dst = self.each(self.heap.empty((big + 8,), torch.float32))
        for dcode, dtype in ((0, torch.float32), (2, torch.bfloat16)):
            # 60000 floats: the low-latency one-shot near its limit with 32 blocks (kLowLatencyBlockLines).
            for count, offset in ((big, 0), (60000, 0), (3001, 1), (big, 3), (1, 0), (0, 0)):
                for coll in (4, 7, 8, 9, 10, 13):
                    salt = f"allreduce/{dcode}/{count}/{offset}/{coll}"
                    label = f"all_reduce algo {coll} dtype {dtype} count {count} offset {offset}"
                    ins = {}
                    oks = []
                    for i, r in enumerate(self.ranks):
                        g = torch.Generator(device=self.devs[i])
                        g.manual_seed(zlib.crc32(f"{r}/{salt}".encode()))
                        ins[r] = torch.randint(-30, 31, (count,), device=self.devs[i], generator=g).to(dtype)
                        src[i].view(dtype)[offset : offset + count].copy_(ins[r])
                        dst[i].view(dtype).fill_(77)
                        oks.append(torch.full((blocks,), -1, dtype=torch.int32, device=self.devs[i]))
                    self.barrier()
                    for rep in range(3):
                        for i, r in enumerate(self.ranks):
                            if rep:
                                with torch.cuda.stream(self.streams[i]):
                                    src[i].view(dtype)[offset : offset + count].add_(1)
                            d_ptr = self.ptr(dst[i]) + offset * dtype.itemsize
                            s_ptr = self.ptr(src[i]) + offset * dtype.itemsize
                            self.k.coll(
                                self.raw[i],
                                coll,
                                dcode,
                                0,
                                d_ptr,
                                s_ptr,
                                count,
                                0,
                                0,
                                1,
                                W,
                                blocks,
                                self.ptr(oks[i]),
                                self.streams[i].cuda_stream,
                            )
                    self.barrier()
                    for i, r in enumerate(self.ranks):
                        self.expect(
                            f"rank {r} {label}: returned {oks[i].tolist()}", oks[i].tolist() == [1] * blocks
                        )
                        dev = self.devs[i]
                        total = torch.zeros(count, dtype=torch.float64, device=dev)
                        for m in range(W):
                            g = torch.Generator(device=dev)
                            g.manual_seed(zlib.crc32(f"{m}/{salt}".encode()))
                            total += (
                                torch.randint(-30, 31, (count,), device=dev, generator=g).to(dtype).double()
                            )
                        exp = torch.full((big + 8,), 77, dtype=dtype, device=dev)
                        exp[offset : offset + count] = (total + 2 * W).to(dtype)
                        self.expect_equal(f"rank {r} {label}", dst[i].view(dtype)[: big + 8], exp)
        self.heap.free(src if self.local else src[0])
        self.heap.free(dst if self.local else dst[0])

    def low_latency_shapes(self):
        """The low-latency all-reduces on a heap of their own (every block's
        rounds start together, as in a fresh program), one call after another
        with no barrier between them, the grid, the count and the algorithm
        changing from each call to the next; the last rank starts call 1 late,
        so the others read their lines of it first. With one receive region
        for all blocks these calls take old lines or overwrite unread ones;
        with a region per block each call's lines are its own. Each call has
        its own source and destination; every element checked."""
        torch, W = self.torch, self.world
        heap = self.ferry.symm.Heap(self.comm, capacity=64 << 20)
        raw = [
            ctypes.create_string_buffer(heap.handle(i).as_bytes(), self.k.handle_size)
            for i in range(len(self.ranks))
        ]
        calls = [
            (7, 1, 1024),
            (7, 2, 1024),
            (10, 2, 2048),
            (7, 4, 512),
            (10, 1, 1024),
            (7, 4, 4096),
            (10, 4, 777),
        ]
        top = max(c for _, _, c in calls)
        src = self.each(heap.empty((len(calls) * top,), torch.float32))
        dst = self.each(heap.empty((len(calls) * top,), torch.float32))

        def values(rank, k, dev):
            g = torch.Generator(device=dev)
            g.manual_seed(zlib.crc32(f"{rank}/shapes/{k}".encode()))
            return torch.randint(-30, 31, (calls[k][2],), device=dev, generator=g).float()

        for i, r in enumerate(self.ranks):
            for k, (_, _, count) in enumerate(calls):
                src[i][k * top : k * top + count].copy_(values(r, k, self.devs[i]))
            dst[i].fill_(77)
        oks = [torch.full((len(calls), 4), -1, dtype=torch.int32, device=d) for d in self.devs]
        self.barrier()
        for k, (coll, blocks, count) in enumerate(calls):
            for i, r in enumerate(self.ranks):
                if k == 1 and r == W - 1:
                    with torch.cuda.stream(self.streams[i]):
                        torch.cuda._sleep(2_000_000)  # about a millisecond
                off = k * top * 4
                self.k.coll(
                    raw[i],
                    coll,
                    0,
                    0,
                    self.ptr(dst[i]) + off,
                    self.ptr(src[i]) + off,
                    count,
                    0,
                    0,
                    1,
                    W,
                    blocks,
                    self.ptr(oks[i]) + k * 16,
                    self.streams[i].cuda_stream,
                )
        self.barrier()
        for i, r in enumerate(self.ranks):
            dev = self.devs[i]
            for k, (coll, blocks, count) in enumerate(calls):
                label = f"rank {r} low-latency call {k} (algo {coll}, {blocks} blocks, {count} floats)"
                self.expect(
                    f"{label}: returned {oks[i][k].tolist()}", oks[i][k, :blocks].tolist() == [1] * blocks
                )
                exp = sum(values(m, k, dev) for m in range(W))
                self.expect_equal(label, dst[i][k * top : k * top + count], exp)
        try:
            heap.check()
        except self.ferry.FerryError as exc:
            self.fails.append(f"low-latency shapes: {exc}")
        heap.close()

    def grid_too_large(self):
        """A collective on a grid past kMaxGridBlocks returns false at once on
        every block and check() names the limit (on a heap of its own: the
        fault stays with the heap)."""
        torch, W = self.torch, self.world
        heap = self.ferry.symm.Heap(self.comm, capacity=64 << 20)
        raw = [
            ctypes.create_string_buffer(heap.handle(i).as_bytes(), self.k.handle_size)
            for i in range(len(self.ranks))
        ]
        blocks = 65
        buf = self.each(heap.zeros((1024,), torch.float32))
        oks = [torch.full((blocks,), -1, dtype=torch.int32, device=d) for d in self.devs]
        self.sync()  # the fills (torch's stream) land before the kernels (the ranks' streams) write
        for i in range(len(self.ranks)):
            p = self.ptr(buf[i])
            self.k.coll(
                raw[i], 4, 0, 0, p, p, 256, 0, 0, 1, W, blocks, self.ptr(oks[i]), self.streams[i].cuda_stream
            )
        self.sync()
        for i, r in enumerate(self.ranks):
            got = oks[i].tolist()
            self.expect(
                f"rank {r} all_reduce on {blocks} blocks returned false: {sorted(set(got))}",
                got == [0] * blocks,
            )
        self.expect_error(
            "a grid past kMaxGridBlocks", "kMaxGridBlocks", heap.check, self.ferry.InvalidArgumentError
        )
        heap.close()

    def stream_ops(self):
        """put, get, signal and wait on streams (copy engines): a kernel writes
        the source just before the put, another reads the result just after the
        wait, each in stream order."""
        torch, W = self.torch, self.world
        n = (4 << 20) + 5
        buf = self.each(self.heap.empty((n,), torch.uint8))
        back = self.each(self.heap.empty((n,), torch.uint8))
        sig = self.each(self.heap.zeros((4,), torch.int64))
        for rnd in range(3):
            salt = f"stream/{rnd}"
            outs, gets = [], []
            for i, r in enumerate(self.ranks):
                buf[i].fill_(POISON)
                back[i].copy_(data(torch, r, salt + "/back", n, self.devs[i]))
                outs.append(torch.full((n,), POISON, dtype=torch.uint8, device=self.devs[i]))
                gets.append(torch.full((n,), POISON, dtype=torch.uint8, device=self.devs[i]))
            self.barrier()
            for i, r in enumerate(self.ranks):
                with torch.cuda.stream(self.streams[i]):
                    src = data(torch, r, salt, n, self.devs[i]) ^ 0  # a kernel writes it, in this stream
                    self.heap.put(buf[i], src, (r + 1) % W, stream=self.streams[i])
                    self.heap.signal(sig[i][0:1], rnd + 1, (r + 1) % W, stream=self.streams[i])
                    self.heap.get(gets[i], back[i], (r + 1) % W, stream=self.streams[i])
                    src.record_stream(self.streams[i])
            for i, r in enumerate(self.ranks):
                self.heap.wait(sig[i][0:1], rnd + 1, from_rank=(r - 1) % W, stream=self.side[i])
                with torch.cuda.stream(self.side[i]):
                    outs[i].copy_(buf[i])  # a kernel reads it after the wait
            self.barrier()
            for i, r in enumerate(self.ranks):
                self.expect_equal(
                    f"rank {r} stream put+signal round {rnd}",
                    outs[i],
                    data(torch, (r - 1) % W, salt, n, self.devs[i]),
                )
                self.expect_equal(
                    f"rank {r} stream get round {rnd}",
                    gets[i],
                    data(torch, (r + 1) % W, salt + "/back", n, self.devs[i]),
                )
        # quiet on another stream: a put held back on its stream by a kernel
        # that sleeps, then quiet and a signal on a side stream; the peer's
        # read after the signal sees the put (without quiet the signal
        # would go out first and the peer read poison).
        for rnd in range(2):
            salt = f"quiet/{rnd}"
            srcs, outs = [], []
            for i, r in enumerate(self.ranks):
                buf[i].fill_(POISON)
                srcs.append(data(torch, r, salt, n, self.devs[i]))
                outs.append(torch.full((n,), POISON, dtype=torch.uint8, device=self.devs[i]))
            self.barrier()
            for i, r in enumerate(self.ranks):
                with torch.cuda.stream(self.streams[i]):
                    torch.cuda._sleep(50_000_000)
                self.heap.put(buf[i], srcs[i], (r + 1) % W, stream=self.streams[i])
            self.heap.quiet(self.side if self.local else self.side[0])
            for i, r in enumerate(self.ranks):
                self.heap.signal(sig[i][1:2], rnd + 1, (r + 1) % W, stream=self.side[i])
            for i, r in enumerate(self.ranks):
                self.heap.wait(sig[i][1:2], rnd + 1, from_rank=(r - 1) % W, stream=self.side[i])
                with torch.cuda.stream(self.side[i]):
                    outs[i].copy_(buf[i])
            self.barrier()
            for i, r in enumerate(self.ranks):
                self.expect_equal(
                    f"rank {r} put, quiet on another stream, signal: round {rnd}",
                    outs[i],
                    data(torch, (r - 1) % W, salt, n, self.devs[i]),
                )
        self.expect_error(
            "quiet on a capturing stream", "quiet: the stream is capturing", lambda: self._quiet_capturing()
        )
        # Many barriers back to back, no host wait between them.
        for _ in range(50):
            self.heap.barrier_on_stream(self.streams if self.local else self.streams[0])
        self.sync()
        self.heap.check()
        self.checks += 1
        for t in (buf, back, sig):
            self.heap.free(t if self.local else t[0])

    def _quiet_capturing(self):
        s = self.side[0]
        with self.capturing(s):
            self.heap.quiet([s] + self.side[1:] if self.local else s)

    def stream_barrier_order(self):
        """barrier_on_stream with copy engines and with its kernel: each rank
        writes the round into its word after sleeping longer the higher its
        rank, then every rank copies every rank's word through peer views
        after the barrier. Without the barrier the slower ranks' words would
        still hold the round before. Then (one process per rank) the kernel
        form captured in a CUDA graph and replayed three times."""
        torch, W = self.torch, self.world
        word = self.each(self.heap.zeros((1,), torch.int64))
        streams = self.streams if self.local else self.streams[0]
        self.barrier()
        views = [[self.heap.peer(word[i], p) for p in range(W)] for i in range(len(self.ranks))]
        for kernel in (False, True):
            for rnd in range(1, 4):
                value = rnd + (100 if kernel else 0)
                for i, r in enumerate(self.ranks):
                    with torch.cuda.stream(self.streams[i]):
                        torch.cuda._sleep(100000 * (r + 1))
                        word[i].fill_(value)
                self.heap.barrier_on_stream(streams, kernel=kernel)
                seen = []
                for i in range(len(self.ranks)):
                    with torch.cuda.stream(self.streams[i]):
                        seen.append(torch.cat(views[i]))
                self.sync()
                for i, r in enumerate(self.ranks):
                    got = seen[i].tolist()
                    self.expect(
                        f"rank {r} barrier_on_stream(kernel={kernel}) round {rnd}: saw {got}",
                        got == [value] * W,
                    )
                self.barrier()  # every rank read this round before any writes the next
        # The kernel form captured in a graph (one rank per process: one stream
        # per call), replayed three times: add one, barrier, read every word.
        if not self.local:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=self.streams[0]):
                torch.cuda._sleep(100000 * (self.ranks[0] + 1))
                word[0].add_(1)
                self.heap.barrier_on_stream(self.streams[0], kernel=True)
                out = torch.cat(views[0])
            self.sync()
            self.barrier()
            start = int(word[0].item())
            for rep in range(3):
                g.replay()
                self.barrier()  # every rank's replay done (its reads too) before any replays again
                got = out.tolist()
                self.expect(
                    f"rank {self.ranks[0]} captured barrier_on_stream(kernel=True) replay {rep}: saw {got}",
                    got == [start + rep + 1] * W,
                )
        self.heap.check()
        self.heap.free(word if self.local else word[0])

    def capture_beside_watched_waits(self):
        """Graphs captured in the global mode (torch's default) while the
        heap's watcher polls the events of copy-engine barriers that wait for
        a late rank: the watcher's queries must not invalidate the captures.
        Each rank but the last reaches the barrier at once; the last sleeps
        about 0.2 s first. Meanwhile every process captures graphs on a side
        stream with capture_begin/capture_end (torch.cuda.graph would first
        synchronize the device, so its captures would begin only once the
        waits had passed), and counts those that ended while its barrier's
        waits were still pending: there must be some."""
        torch, W = self.torch, self.world
        streams = self.streams if self.local else self.streams[0]
        x = [torch.zeros(16, device=d) for d in self.devs]
        self.barrier()
        for i, r in enumerate(self.ranks):
            with torch.cuda.stream(self.streams[i]):
                torch.cuda._sleep(400_000_000 if r == W - 1 else 1000)
        self.heap.barrier_on_stream(streams, kernel=False)
        passed = [torch.cuda.Event() for _ in self.devs]
        for i, e in enumerate(passed):
            e.record(self.streams[i])  # after the barrier's waits on that stream
        graphs, failed, overlapped, t0 = [], [], 0, time.monotonic()
        while time.monotonic() - t0 < 2.0 and len(graphs) + len(failed) < 400:
            if all(e.query() for e in passed):
                break
            for i, d in enumerate(self.devs):
                g = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.device(d), torch.cuda.stream(self.side[i]):
                        g.capture_begin()
                        try:
                            x[i].add_(1)
                        finally:
                            g.capture_end()
                    graphs.append((i, g))
                except Exception as exc:  # an invalidated capture: the check's failure
                    failed.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
                if not passed[i].query():
                    overlapped += 1
        self.sync()
        self.expect(
            f"ranks {self.ranks}: {len(failed)} of {len(failed) + len(graphs)} captures beside the watcher failed"
            + (f" ({failed[0]})" if failed else ""),
            not failed and len(graphs) > 0,
        )
        self.expect(
            f"ranks {self.ranks}: {overlapped} captures ended while the barrier's waits were pending; expected some",
            overlapped > 0,
        )
        for i, g in graphs:
            with torch.cuda.device(self.devs[i]):
                g.replay()
        self.sync()
        runs = [sum(1 for j, _ in graphs if j == i) for i in range(len(self.devs))]
        for i in range(len(self.devs)):
            self.expect(f"rank {self.ranks[i]}: replays added {runs[i]}", x[i].eq(runs[i]).all().item())
        self.heap.check()

    def views_and_sizes(self):
        """peer() and peer_ptrs(); zero-size and > 2 GiB allocations; used and mapped."""
        torch, W = self.torch, self.world
        n = 12345
        t = self.each(self.heap.empty((n,), torch.uint8))
        for i, r in enumerate(self.ranks):
            t[i].copy_(data(torch, r, "views", n, self.devs[i]))
        self.barrier()
        for i, r in enumerate(self.ranks):
            for p in range(W):
                self.expect_equal(
                    f"rank {r} peer({p}) view",
                    self.heap.peer(t[i], p),
                    data(torch, p, "views", n, self.devs[i]),
                )
            ptrs = self.heap.peer_ptrs(t[i]).tolist()
            self.expect(
                f"peer_ptrs {ptrs}",
                ptrs[r] == t[i].data_ptr()
                and all(ptrs[p] - ptrs[0] == p * self.heap.capacity for p in range(W)),
            )
        z = self.heap.empty((0,), torch.float32)
        self.expect("a zero-size allocation", all(x.numel() == 0 for x in self.each(z)))
        self.heap.free(z)
        self.heap.free(t if self.local else t[0])
        self.expect(f"used after free: {self.heap.used}", self.heap.used == 0)

    def large(self):
        """A 3 GiB allocation: its last bytes written on the peer and read back."""
        torch, W = self.torch, self.world
        big_heap = self.ferry.symm.Heap(self.comm, capacity=4 << 30)
        n = 3 << 30
        big = self.each(big_heap.empty((n,), torch.uint8))
        self.expect(f"mapped {big_heap.mapped}", big_heap.mapped >= n)
        raw = [
            ctypes.create_string_buffer(big_heap.handle(i).as_bytes(), self.k.handle_size)
            for i in range(len(self.ranks))
        ]
        tail = 1 << 20
        for i, r in enumerate(self.ranks):
            big[i][n - tail :].fill_(POISON)
        self.barrier()
        self.put_right(raw, [self.ptr(b) + n - tail for b in big], "large", tail)
        for i, r in enumerate(self.ranks):
            self.expect_equal(
                f"rank {r} 3 GiB allocation, last MiB",
                big[i][n - tail :],
                data(torch, (r - 1) % W, "large", tail, self.devs[i]),
            )
        big_heap.close()

    def registered(self):
        """Existing VMM memory registered into the heap: each rank's buffer in
        one or many physical allocations, starting whole granules apart; a copy
        engine put and a kernel put into the peer's buffer seen through the
        owner's own tensor; peer views; the memory outliving its owner's
        mapping; the refusals."""
        import _vmm

        ferry, torch, W = self.ferry, self.torch, self.world
        IA = ferry.InvalidArgumentError
        n = (40 << 20) + 12345
        half = n // 2
        vm, own = [], []
        g = 2 << 20
        # By rank % 3: one 48 MiB allocation; 24 of 2 MiB (more than one
        # message of descriptors); 8 of 6 MiB. The buffer starts a granule
        # further in on each, so the ranks' regions are shifted.
        layouts = [[24 * g], [g] * 24, [3 * g] * 8]
        for i, r in enumerate(self.ranks):
            b = _vmm.VmmBuffer(torch, self.devs[i].index, layouts[r % 3])
            vm.append(b)
            t = b.tensor(4096 + (r % 3) * b.granule, n)
            t.copy_(data(torch, r, "registered", n, self.devs[i]))
            own.append(t)
        self.sync()
        used = self.heap.used
        views = self.each(self.heap.register(own if self.local else own[0]))
        self.expect(f"used grew by the region: {used} -> {self.heap.used}", self.heap.used > used + n)
        for i, r in enumerate(self.ranks):
            self.expect_equal(
                f"rank {r} heap view of its buffer", views[i], data(torch, r, "registered", n, self.devs[i])
            )
            for p in range(W):
                self.expect_equal(
                    f"rank {r} peer({p}) of a registered buffer",
                    self.heap.peer(views[i], p),
                    data(torch, p, "registered", n, self.devs[i]),
                )
        self.barrier()
        # Copy engines: my first half into the right neighbour's second half.
        for i, r in enumerate(self.ranks):
            with torch.cuda.stream(self.streams[i]):
                self.heap.put(views[i][half : 2 * half], views[i][:half], (r + 1) % W)
        self.barrier()
        for i, r in enumerate(self.ranks):
            self.expect_equal(
                f"rank {r} owner's tensor after a peer's put",
                own[i][half : 2 * half],
                data(torch, (r - 1) % W, "registered", n, self.devs[i])[:half],
            )
        # A kernel (block scope): fresh data into the right neighbour's first half.
        self.put_right(self.raw, [self.ptr(v) for v in views], "registered-kernel", half)
        for i, r in enumerate(self.ranks):
            self.expect_equal(
                f"rank {r} owner's tensor after a peer's kernel put",
                own[i][:half],
                data(torch, (r - 1) % W, "registered-kernel", half, self.devs[i]),
            )
        self.expect_error(
            "free() of a registered buffer",
            "deregister it instead",
            lambda: self.heap.free(views if self.local else views[0]),
            IA,
        )
        plain = self.each(self.heap.empty((16,), torch.uint8))
        self.expect_error(
            "deregister of an allocation",
            "not a registered buffer",
            lambda: self.heap.deregister(plain if self.local else plain[0]),
            IA,
        )
        self.heap.free(plain if self.local else plain[0])
        self.heap.deregister(views if self.local else views[0])
        self.expect(f"used after deregister: {self.heap.used} (before {used})", self.heap.used == used)
        for i, r in enumerate(self.ranks):
            self.expect_equal(
                f"rank {r} owner's tensor after deregister",
                own[i][half : 2 * half],
                data(torch, (r - 1) % W, "registered", n, self.devs[i])[:half],
            )
        # The heap holds the memory after its owner let go of it.
        views = self.each(self.heap.register(own if self.local else own[0]))
        for b in vm:
            b.free()
        for i, r in enumerate(self.ranks):
            self.expect_equal(
                f"rank {r} registered memory after its owner freed it",
                views[i][:half],
                data(torch, (r - 1) % W, "registered-kernel", half, self.devs[i]),
            )
        self.barrier()
        self.heap.deregister(views if self.local else views[0])
        # Refusals: every rank is told, naming the rank at fault.
        expandable = "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if not expandable:  # torch's memory is cudaMalloc's
            plain = [torch.empty(n, dtype=torch.uint8, device=d) for d in self.devs]
            self.expect_error(
                "register of cudaMalloc memory",
                "not memory that CUDA's virtual memory management made",
                lambda: self.heap.register(plain if self.local else plain[0]),
                IA,
            )
        vm = [_vmm.VmmBuffer(torch, d.index, [2 << 20]) for d in self.devs]
        skew = [b.tensor(4096 * (r == W - 1), 1000) for b, r in zip(vm, self.ranks)]
        self.expect_error(
            "buffers at different offsets in their granules",
            f"different offsets.*rank {W - 1}",
            lambda: self.heap.register(skew if self.local else skew[0]),
            IA,
        )
        tail = [b.tensor((2 << 20) - 1000, 1000) for b in vm]
        # Memory no other process can map: refused with one process per rank, fine in one process.
        closed = [_vmm.VmmBuffer(torch, d.index, [2 << 20], exportable=False) for d in self.devs]
        private = [b.tensor(0, 1000) for b in closed]
        if self.local:
            got = self.heap.register(private)
            self.heap.deregister(got)
            self.checks += 1
        else:
            self.expect_error(
                "register of memory that cannot be exported",
                "POSIX_FILE_DESCRIPTOR",
                lambda: self.heap.register(private[0]),
                IA,
            )
        for b in closed:
            b.free()
        if self.local:
            self.expect_error(
                "tensors of different sizes",
                "the same size on every rank",
                lambda: self.heap.register([tail[0][:999]] + tail[1:]),
                IA,
            )
        with self.capturing(self.streams[0]):
            self.expect_error(
                "register while capturing",
                "captured",
                lambda: self.heap.register(tail if self.local else tail[0]),
                IA,
            )
        self.sync()
        self.expect(f"used after the refusals: {self.heap.used} (before {used})", self.heap.used == used)
        for b in vm:
            b.free()
        if expandable:
            self.registered_torch()

    def comm_registered(self):
        """The communicator's register() on VMM memory (imported piece by piece
        with one process per rank) and on cudaMalloc memory (CUDA IPC): an
        all-gather into each, every byte checked through the owner's tensor;
        with expandable segments, a torch tensor from them too."""
        import _vmm

        torch, W, comm = self.torch, self.world, self.comm
        n = 1000003
        g = 2 << 20
        k = max(4, -(-(4096 + 2 * g + W * n) // g))  # granules for W blocks behind the largest offset
        layouts = [[k * g], [g] * k, [max(3, -(-k // 2)) * g] * 2]
        vm = [_vmm.VmmBuffer(torch, d.index, layouts[r % 3]) for d, r in zip(self.devs, self.ranks)]
        outs = [b.tensor(4096 + (r % 3) * b.granule, W * n) for b, r in zip(vm, self.ranks)]
        expandable = "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        cases = [("VMM buffer", outs)]
        if not expandable:  # torch's memory is cudaMalloc's: CUDA IPC shares it
            cases.append(
                ("cudaMalloc tensor", [torch.empty(W * n, dtype=torch.uint8, device=d) for d in self.devs])
            )
        if expandable:
            cases.append(
                (
                    "torch tensor (expandable segments)",
                    [torch.empty(W * n, dtype=torch.uint8, device=d) for d in self.devs],
                )
            )
        # Refusals reach every rank, also when one rank alone passes a bad buffer.
        IA = self.ferry.InvalidArgumentError
        one_empty = [o[:0] if r == W - 1 else o for o, r in zip(outs, self.ranks)]
        self.expect_error(
            "register with an empty buffer on the last rank",
            "size must be positive",
            lambda: comm.register(one_empty if self.local else one_empty[0]),
            IA,
        )
        comm.register(outs if self.local else outs[0])
        self.expect_error(
            "register of a buffer registered already",
            "overlaps one already registered",
            lambda: comm.register(outs if self.local else outs[0]),
            IA,
        )
        comm.deregister(outs if self.local else outs[0])
        for label, out in cases:
            comm.register(out if self.local else out[0])
            self.all_gather_checked(out, n, "comm-registered", f"a registered {label}")
            comm.deregister(out if self.local else out[0])
        for b in vm:
            b.free()

    def all_gather_checked(self, out, n: int, salt: str, label: str):
        """The communicator's all_gather of each rank's data(salt) (n bytes)
        into `out` (by local rank, poisoned first), every block of every
        rank's output compared; returns the inputs."""
        torch, comm = self.torch, self.comm
        inp = [data(torch, r, salt, n, self.devs[i]) for i, r in enumerate(self.ranks)]
        for o in out:
            o.fill_(POISON)
        self.sync()
        # One stream per rank: with several ranks on one GPU each needs its own.
        comm.all_gather(
            out if self.local else out[0],
            inp if self.local else inp[0],
            stream=self.streams if self.local else self.streams[0],
        )
        self.sync()
        for i, r in enumerate(self.ranks):
            for p in range(self.world):
                self.expect_equal(
                    f"rank {r} all_gather into {label}, block {p}",
                    out[i][p * n : (p + 1) * n],
                    data(torch, p, salt, n, self.devs[i]),
                )
        return inp

    def gpu_free_bytes(self) -> int:
        """This process's first GPU's free memory, read while every rank stands between two
        barriers (no rank allocates meanwhile), torch's cache emptied first."""
        torch = self.torch
        self.sync()
        torch.cuda.empty_cache()
        self.barrier()
        free = torch.cuda.mem_get_info(self.devs[0])[0]
        self.barrier()
        return free

    def comm_alloc(self):
        """The communicator's alloc() (on its own heap): an all-gather into it,
        every byte checked; freed and allocated again at other sizes, GPU
        memory taken while allocated and given back after free()."""
        torch, W, comm = self.torch, self.world, self.comm
        n_gpus = torch.cuda.device_count()
        # Ranks sit on GPU r % (GPUs); the memory read is this process's first GPU's.
        on_gpu0 = sum(1 for r in range(W) if r % n_gpus == self.devs[0].index)
        mib = 1 << 20
        for step, n in enumerate((16 * mib + 3, 48 * mib + 1, 16 * mib + 3)):
            before = self.gpu_free_bytes()
            out = self.each(comm.alloc((W * n,), torch.uint8))
            taken = before - self.gpu_free_bytes()
            self.expect(
                f"alloc of {W * n} bytes per rank took {taken} bytes of the GPU, expected at least {on_gpu0 * W * n}",
                taken >= on_gpu0 * W * n,
            )
            inp = self.all_gather_checked(out, n, f"comm-alloc/{step}", f"alloc() step {step}")
            held = self.gpu_free_bytes()
            comm.free(out if self.local else out[0])
            self.expect_error(
                f"all_gather into freed alloc() memory, step {step}",
                "expected device memory|not inside a buffer registered",
                lambda o=out, x=inp: comm.all_gather(
                    o if self.local else o[0],
                    x if self.local else x[0],
                    stream=self.streams if self.local else self.streams[0],
                ),
            )
            del out
            back = self.gpu_free_bytes() - held
            self.expect(
                f"free() after alloc step {step} gave back {back} bytes of the GPU, expected at least "
                f"{on_gpu0 * W * n}",
                back >= on_gpu0 * W * n,
            )

    def registered_torch(self):
        """A tensor from PyTorch's allocator with expandable segments, registered and put into."""
        torch, W = self.torch, self.world
        n = 48 << 20
        own = [data(torch, r, "expandable", n, self.devs[i]) for i, r in enumerate(self.ranks)]
        views = self.each(self.heap.register(own if self.local else own[0]))
        self.barrier()
        for i, r in enumerate(self.ranks):
            with torch.cuda.stream(self.streams[i]):
                self.heap.put(views[i][n // 2 :], views[i][: n // 2], (r + 1) % W)
        self.barrier()
        for i, r in enumerate(self.ranks):
            self.expect_equal(
                f"rank {r} torch tensor (expandable segments) after a peer's put",
                own[i][n // 2 :],
                data(torch, (r - 1) % W, "expandable", n, self.devs[i])[: n // 2],
            )
        self.heap.deregister(views if self.local else views[0])

    def bad_input(self):
        ferry, torch, W = self.ferry, self.torch, self.world
        IA = ferry.InvalidArgumentError
        t = self.each(self.heap.empty((64,), torch.int64))
        plain = torch.zeros(64, dtype=torch.int64, device=self.devs[0])
        self.expect_error(
            "peer of a rank out of range", r"rank is .*expected 0\.\.", lambda: self.heap.peer(t[0], W), IA
        )
        self.expect_error(
            "peer of memory not on the heap",
            "not on the symmetric heap",
            lambda: self.heap.peer(plain, 0),
            IA,
        )
        self.expect_error(
            "put to memory not on the heap",
            "put: dst is not on the symmetric heap",
            lambda: self.heap.put(plain, plain, 0),
            IA,
        )
        self.expect_error(
            "put of mismatched sizes", "expected equal sizes", lambda: self.heap.put(t[0], plain[:3], 0), IA
        )
        self.expect_error(
            "put past the allocation",
            "does not lie inside one live allocation",
            lambda: self.heap._h.put(0, t[0].data_ptr() + 256, plain.data_ptr(), 512, 0, 0),
            IA,
        )
        self.expect_error("put to a peer out of range", "peer is", lambda: self.heap.put(t[0], plain, W), IA)
        word = t[0].view(torch.int64)[0]
        self.expect_error(
            "signal to a peer out of range",
            r"signal: peer is -1; expected a rank 0\.\.",
            lambda: self.heap.signal(word, 1, -1),
            IA,
        )
        self.expect_error(
            "wait for a rank out of range",
            rf"wait: from is {W}; expected -1 or a rank",
            lambda: self.heap.wait(word, 1, W),
            IA,
        )
        self.expect_error(
            "signal on an unaligned word",
            "aligned 64-bit",
            lambda: self.heap.signal(t[0].view(torch.uint8)[3:11], 1, 0),
            IA,
        )
        # Heap exhausted: a small heap, a request larger than it.
        small = ferry.symm.Heap(self.comm, capacity=32 << 20)
        self.expect_error(
            "heap exhausted",
            "FERRY_SYMM_HEAP_BYTES",
            lambda: small.empty((64 << 20,), torch.uint8),
            ferry.OutOfMemoryError,
        )
        small.close()
        # Allocation during capture: refused when it needs new memory (the heap
        # maps FERRY_SYMM_CHUNK_BYTES at first), fine after reserve().
        roomy = ferry.symm.Heap(self.comm, capacity=1 << 30)
        need = 512 << 20
        cap = torch.cuda.Stream(device=self.devs[0])
        for reserved in (False, True):
            if reserved:
                roomy.reserve(need + (1 << 20))
            got = None
            with self.capturing(cap):
                if reserved:
                    got = roomy.empty((need,), torch.uint8)
                else:
                    self.expect_error(
                        "allocation during capture",
                        r"captured; call reserve\(",
                        lambda: roomy.empty((need,), torch.uint8),
                        IA,
                    )
            if reserved:
                self.expect(
                    "allocation during capture after reserve()",
                    got is not None and all(x.numel() == need for x in self.each(got)),
                )
        roomy.close()
        # barrier_on_stream cannot be captured (its generation is a value of the call).
        with self.capturing(cap):
            streams = [cap] + self.streams[1:] if self.local else cap
            self.expect_error(
                "barrier_on_stream during capture",
                "cannot be captured",
                lambda: self.heap.barrier_on_stream(streams),
                IA,
            )
        self.heap.free(t if self.local else t[0])
        self.expect_error(
            "free of memory not on the heap",
            "not on the symmetric heap",
            lambda: self.heap.free(plain if not self.local else [plain] * W),
            IA,
        )

    def mismatch(self):
        """Ranks that allocate differently are told which rank strayed (one process per rank only)."""
        torch = self.torch
        r = self.ranks[0]
        self.expect_error(
            "mismatched allocation",
            "different symmetric-heap calls",
            lambda: self.heap.empty((1000 + (r == 1),), torch.uint8),
            self.ferry.InvalidArgumentError,
        )
        # The heap goes on in step afterwards.
        t = self.heap.empty((10,), torch.uint8)
        self.heap.free(t)
        self.checks += 1
        # The communicator's alloc() lives on its own heap: the same check, naming alloc.
        self.expect_error(
            "mismatched comm.alloc",
            r"rank 1 made call #\d+: alloc\(1001 bytes\)",
            lambda: self.comm.alloc((1000 + (r == 1),), torch.uint8),
            self.ferry.InvalidArgumentError,
        )
        t = self.comm.alloc((10,), torch.uint8)
        self.comm.free(t)
        self.checks += 1
        # A free() that one rank refuses (here: rank 1 passes memory that is
        # not from alloc()) is refused on every rank at once, the others
        # naming it; the buffer stays usable and is freed afterwards.
        t = self.comm.alloc((4096,), torch.uint8)
        other = torch.empty(4096, dtype=torch.uint8, device=self.devs[0])
        t0 = time.monotonic()
        self.expect_error(
            "free refused by one rank",
            r"did not come from this communicator's alloc" if r == 1 else r"free: rank 1 failed: .*alloc",
            lambda: self.comm.free(other if r == 1 else t),
            self.ferry.NotRegisteredError,  # every rank, the code of the rank that refused
        )
        self.expect(
            f"rank {r}: the refused free took {time.monotonic() - t0:.1f} s; expected under 10",
            time.monotonic() - t0 < 10,
        )
        self.comm.free(t)  # every rank still holds it, in step
        self.checks += 1
        self.heap_refusals_in_step(r)

    def heap_refusals_in_step(self, r: int):
        """A deregister() one rank refuses (rank 1 passes memory from empty())
        is refused on every rank in the same call, the others naming rank 1,
        and no rank unmaps the buffer; a deregister() on rank 0 against an
        empty() on the others is named a mismatch on every rank. After each,
        the ranks' calls are still in step."""
        import _vmm

        torch, IA = self.torch, self.ferry.InvalidArgumentError
        vm = _vmm.VmmBuffer(torch, self.devs[0].index, [2 << 20])
        own = vm.tensor(0, 1 << 20)
        own.copy_(data(torch, r, "refusals", 1 << 20, self.devs[0]))
        x = self.heap.empty((64,), torch.uint8)
        view = self.heap.register(own)
        self.expect_error(
            "deregister refused by one rank",
            r"not a registered buffer's" if r == 1 else r"rank 1 refused it: .*not a registered buffer's",
            lambda: self.heap.deregister(x if r == 1 else view),
            IA,
        )
        self.barrier()
        self.expect_equal(
            f"rank {r}: the left neighbour's buffer through the registration one rank refused to drop",
            self.heap.peer(view, (r - 1) % self.world),
            data(torch, (r - 1) % self.world, "refusals", 1 << 20, self.devs[0]),
        )
        self.barrier()
        self.expect_error(
            "deregister against empty",
            "different symmetric-heap calls",
            lambda: self.heap.deregister(view) if r == 0 else self.heap.empty((16,), torch.uint8),
            IA,
        )
        t = self.heap.empty((16,), torch.uint8)  # in step: no mismatch now
        self.heap.free(t)
        self.heap.deregister(view)
        self.heap.free(x)
        self.checks += 1
        torch.cuda.synchronize()
        vm.free()

    def growth_refused(self):
        """Memory one rank cannot get while the others can (its GPU-mate took
        it first): a heap growth and a communicator alloc() are refused on
        every rank at once, all with OutOfMemoryError, the others naming the
        rank; the heap grows again afterwards and every byte of the failed
        attempts comes back. One process per rank, every rank on one GPU
        (rank_main runs it only there: elsewhere every rank finds room)."""
        import re

        import ferry.symm

        torch, ferry = self.torch, self.ferry
        total = torch.cuda.mem_get_info(self.devs[0])[1]
        n = int(total * 0.6) // (2 << 20) * (2 << 20)
        big = ferry.symm.Heap(self.comm, capacity=total)
        before = self.gpu_free_bytes()
        me = self.ranks[0]
        for label, attempt in (
            ("heap growth", lambda: big.empty((n,), torch.uint8)),
            ("comm.alloc", lambda: self.comm.alloc((n,), torch.uint8)),
        ):
            t0 = time.monotonic()
            error = None
            try:
                attempt()
            except ferry.FerryError as exc:
                error = exc
            took = time.monotonic() - t0
            # Every rank raises the same kind; the one that got the memory names another.
            self.expect(
                f"rank {me}: a {label} past the GPU's memory raised {error!r}; expected OutOfMemoryError",
                isinstance(error, ferry.OutOfMemoryError)
                and re.search("out of memory", str(error)) is not None,
            )
            self.expect(f"rank {me}: the refused {label} took {took:.1f} s; expected under 10", took < 10)
        t = big.empty((1 << 20,), torch.uint8)
        t.fill_(7)
        self.sync()
        self.expect("the heap grows again after a refused growth", int(t.sum().item()) == 7 << 20)
        big.free(t)
        big.close()
        left = before - self.gpu_free_bytes()
        self.expect(
            f"refused growths left {left} bytes of the GPU taken; expected under 16 MiB", left < 16 << 20
        )

    def run(self, names):
        for name in names:
            t0 = time.monotonic()
            try:
                getattr(self, name)()
            except Exception:  # noqa: BLE001
                self.fails.append(f"ranks {self.ranks}: {name} raised:\n{traceback.format_exc()[-3000:]}")
                break
            finally:
                print(
                    f"symm: ranks {self.ranks} {name}: {self.checks} checks so far, {len(self.fails)} failed, "
                    f"{time.monotonic() - t0:.1f} s",
                    flush=True,
                )
        return self.fails


def timeouts(ferry, torch, world: int, stream_wait: bool) -> list:
    """A peer that never signals or never reaches a barrier: the wait gives up
    after the timeout and check() names the peer (one process, timeout 2 s).
    The device API's waits, or (stream_wait) a wait on a stream."""
    import ferry.symm

    fails = []
    comm = ferry.init_local([r % torch.cuda.device_count() for r in range(world)], timeout=2.0)
    devs = [torch.device("cuda", d) for d in comm.devices]
    streams = [torch.cuda.Stream(device=d) for d in devs]

    def raw(heap, i):
        return ctypes.create_string_buffer(heap.handle(i).as_bytes(), k.handle_size)

    def expect_fault(heap, pattern, kind, label, t0):
        took = time.monotonic() - t0
        try:
            heap.check()
            fails.append(f"{label}: check() raised nothing")
        except ferry.FerryError as exc:
            import re

            if not isinstance(exc, kind) or not re.search(pattern, str(exc)):
                fails.append(
                    f"{label}: expected {kind.__name__} /{pattern}/, got {type(exc).__name__}: {exc}"
                )
        if took > 15:
            fails.append(f"{label}: took {took:.1f} s with a 2 s timeout")
        print(
            f"symm: timeout check '{label}' done after {took:.1f} s, {len(fails)} failed so far", flush=True
        )

    if stream_wait:
        return stream_wait_released(ferry, torch, comm, devs, streams, fails, expect_fault)
    k = Kernels()

    # A signal that never comes (device): rank 0 waits for rank 1.
    heap = ferry.symm.Heap(comm, capacity=64 << 20)
    sig = heap.zeros((1,), torch.int64)
    ok = torch.full((1,), -1, dtype=torch.int32, device=devs[0])
    scratch = torch.empty(16, dtype=torch.uint8, device=devs[0])
    torch.cuda.synchronize()
    t0 = time.monotonic()
    k.wait_copy(
        raw(heap, 0),
        sig[0].data_ptr(),
        1,
        1,
        scratch.data_ptr(),
        scratch.data_ptr(),
        0,
        ok.data_ptr(),
        streams[0].cuda_stream,
    )
    streams[0].synchronize()
    if int(ok.item()) != 0:
        fails.append(f"signal_wait_until with no signal returned {int(ok.item())}")
    expect_fault(
        heap, r"signal_wait_until on rank 0 waited for rank 1", ferry.PeerTimeoutError, "device signal", t0
    )
    heap.close()

    # Three waits queued on one stream for a signal that never comes: the
    # first gives up after the timeout, the ones behind it soon after (they
    # see its fault), not a timeout each.
    heap = ferry.symm.Heap(comm, capacity=64 << 20)
    sig = heap.zeros((1,), torch.int64)
    oks = torch.full((3,), -1, dtype=torch.int32, device=devs[0])
    torch.cuda.synchronize()
    t0 = time.monotonic()
    for i in range(3):
        k.wait_copy(
            raw(heap, 0),
            sig[0].data_ptr(),
            1,
            1,
            scratch.data_ptr(),
            scratch.data_ptr(),
            0,
            oks[i].data_ptr(),
            streams[0].cuda_stream,
        )
    streams[0].synchronize()
    took = time.monotonic() - t0
    if oks.tolist() != [0, 0, 0]:
        fails.append(f"three queued waits with no signal returned {oks.tolist()}")
    if not 1.5 < took < 3.5:
        fails.append(f"three queued waits ended after {took:.2f} s; expected one 2 s timeout and little more")
    expect_fault(
        heap,
        r"signal_wait_until on rank 0 waited for rank 1",
        ferry.PeerTimeoutError,
        "queued device waits",
        t0,
    )
    heap.close()

    # A barrier rank 1 never reaches.
    heap = ferry.symm.Heap(comm, capacity=64 << 20)
    ctr = heap.zeros((1,), torch.int64)
    out = torch.full((2,), -1, dtype=torch.int32, device=devs[0])
    torch.cuda.synchronize()
    t0 = time.monotonic()
    k.barrier(raw(heap, 0), 2, 0, 1, world, ctr[0].data_ptr(), 1, out.data_ptr(), streams[0].cuda_stream)
    streams[0].synchronize()
    if out.tolist()[1] != 1:
        fails.append(f"a barrier without rank 1 returned {out.tolist()}")
    expect_fault(heap, r"a barrier on rank 0 waited for rank 1", ferry.PeerTimeoutError, "device barrier", t0)
    heap.close()

    # A grid whose second block returns before grid_sync: the first block gives up.
    heap = ferry.symm.Heap(comm, capacity=64 << 20)
    out = torch.full((1,), -1, dtype=torch.int32, device=devs[0])
    torch.cuda.synchronize()
    t0 = time.monotonic()
    k.grid_sync_fault(raw(heap, 0), out.data_ptr(), streams[0].cuda_stream)
    streams[0].synchronize()
    if out.tolist() != [0]:
        fails.append(f"grid_sync without the grid's second block returned {out.tolist()}")
    expect_fault(
        heap, r"on rank 0 waited for every block of its grid", ferry.PeerTimeoutError, "grid sync", t0
    )
    heap.close()

    # A team this rank is not in.
    heap = ferry.symm.Heap(comm, capacity=64 << 20)
    ctr = heap.zeros((1,), torch.int64)
    torch.cuda.synchronize()
    k.barrier(
        raw(heap, 1), 0, 0, 2, (world + 1) // 2, ctr[1].data_ptr(), 1, out.data_ptr(), streams[0].cuda_stream
    )
    torch.cuda.synchronize()
    expect_fault(heap, "not a usable member", ferry.InvalidArgumentError, "bad team", time.monotonic())
    heap.close()

    # A broadcast and a reduce whose root is no team rank return false on
    # every rank before any barrier; the fault stays: the stream waits that
    # the watcher would let go at once are refused, and check() still raises
    # once the heap is closed.
    for coll, root in ((0, world), (3, -1)):
        heap = ferry.symm.Heap(comm, capacity=64 << 20)
        buf = heap.zeros((256,), torch.float32)
        sig = heap.zeros((1,), torch.int64)
        oks = [torch.full((2,), -1, dtype=torch.int32, device=d) for d in devs]
        torch.cuda.synchronize()
        for i in range(world):
            p = buf[i].data_ptr()
            k.coll(
                raw(heap, i),
                coll,
                0,
                0,
                p,
                p,
                64,
                root,
                0,
                1,
                world,
                2,
                oks[i].data_ptr(),
                streams[i].cuda_stream,
            )
        torch.cuda.synchronize()
        if any(o.tolist() != [0, 0] for o in oks):
            fails.append(f"collective {coll} with root {root} returned {[o.tolist() for o in oks]}")
        expect_fault(
            heap,
            f"root {root}; expected a team rank",
            ferry.InvalidArgumentError,
            "bad root",
            time.monotonic(),
        )
        for what, call in (
            ("wait", lambda: heap.wait(sig[0], 1, from_rank=1, stream=streams[0])),
            ("barrier_on_stream", lambda: heap.barrier_on_stream(streams)),
        ):
            try:
                call()
                fails.append(f"{what} on a heap with a fault was not refused")
            except ferry.InvalidArgumentError as exc:
                if "faulted earlier" not in str(exc) or f"root {root}" not in str(exc):
                    fails.append(f"{what} on a faulted heap: {exc}")
        heap.close()
        expect_fault(heap, f"root {root};", ferry.InvalidArgumentError, "bad root, closed", time.monotonic())

    comm.close()
    return fails


def stream_wait_released(ferry, torch, comm, devs, streams, fails, expect_fault) -> list:
    """A stream wait for a signal that never comes: past the timeout the
    stream is let go, the work after it runs, and check() names the rank."""
    heap = ferry.symm.Heap(comm, capacity=64 << 20)
    sig = heap.zeros((1,), torch.int64)
    # The kernel that runs after the wait, launched once before it: under lazy
    # module loading a first launch while a stream is held waits for the device.
    done = torch.zeros(1, device=devs[0])
    with torch.cuda.stream(streams[0]):
        done.fill_(0)
    torch.cuda.synchronize()
    t0 = time.monotonic()
    heap.wait(sig[0], 1, from_rank=1, stream=streams[0])
    with torch.cuda.stream(streams[0]):
        done.fill_(1)
    streams[0].synchronize()
    if done.item() != 1:
        fails.append("the work after a released stream wait did not run")
    if time.monotonic() - t0 < 1.5:
        fails.append(
            f"the stream went on after {time.monotonic() - t0:.2f} s; the wait should hold it for the 2 s timeout"
        )
    time.sleep(0.1)
    expect_fault(heap, r"heap.wait.*rank 1", ferry.PeerTimeoutError, "stream wait", t0)
    heap.close()

    # Three stream waits queued behind each other: released together once the
    # first has given up, not a timeout each.
    heap = ferry.symm.Heap(comm, capacity=64 << 20)
    sig = heap.zeros((3,), torch.int64)
    done.zero_()
    torch.cuda.synchronize()
    t0 = time.monotonic()
    for i in range(3):
        heap.wait(sig[0][i], 1, from_rank=1, stream=streams[0])
    with torch.cuda.stream(streams[0]):
        done.fill_(1)
    streams[0].synchronize()
    took = time.monotonic() - t0
    if done.item() != 1:
        fails.append("the work after three released stream waits did not run")
    if not 1.5 < took < 3.5:
        fails.append(
            f"three queued stream waits ended after {took:.2f} s; expected one 2 s timeout and little more"
        )
    time.sleep(0.1)
    expect_fault(heap, r"heap.wait.*rank 1", ferry.PeerTimeoutError, "queued stream waits", t0)
    heap.close()
    comm.close()
    return fails


# The checks every run makes, in order (one process per rank adds "mismatch", one process for all ranks "large").
CHECKS = [
    "rma",
    "put_signal",
    "p_g",
    "atomics",
    "waits",
    "barriers",
    "collectives",
    "all_reduce_algorithms",
    "low_latency_shapes",
    "grid_too_large",
    "stream_ops",
    "stream_barrier_order",
    "capture_beside_watched_waits",
    "views_and_sizes",
    "registered",
    "comm_registered",
    "comm_alloc",
    "bad_input",
]


def _selected() -> list:
    """SYMM_CHECKS: a comma-separated subset of the checks to run instead of all."""
    return [c for c in os.environ.get("SYMM_CHECKS", "").split(",") if c]


def report(fails, checks) -> int:
    for f in fails[:30]:
        print("FAIL", f)
    print(f"symm: {checks} checks, {len(fails)} failed", flush=True)
    return 1 if fails else 0


def local_main(world: int) -> int:
    import ferry
    import torch

    n = torch.cuda.device_count()
    comm = ferry.init_local([r % n for r in range(world)], timeout=30.0)
    suite = Suite(ferry, torch, comm, world, local=True)
    names = _selected() or CHECKS + (["large"] if world == 2 else [])
    fails = suite.run(names)
    checks = suite.checks
    suite.heap.close()
    comm.close()
    fails += timeouts(ferry, torch, world, stream_wait=False)
    return report(fails, checks + 3)


def stream_timeout_main(world: int) -> int:
    import ferry
    import torch

    return report(timeouts(ferry, torch, world, stream_wait=True), 1)


def put_from_left(torch, heap, rank: int, world: int, dev: int, n: int, salt: str):
    """A heap tensor of `n` poisoned bytes that the left neighbour's put fills,
    on a stream of its own between two barriers: (the tensor, the stream,
    whether it holds the left neighbour's data)."""
    d = torch.device("cuda", dev)
    x = heap.empty((n,), torch.uint8)
    x.fill_(0xA5)
    mine = data(torch, rank, salt, n, d)
    s = torch.cuda.Stream()
    # After the poison and the source, both made on the current stream.
    s.wait_stream(torch.cuda.current_stream())
    heap.barrier_on_stream(s)  # every rank's poison is there before any put lands
    heap.put(x, mine, (rank + 1) % world, stream=s)
    heap.barrier_on_stream(s)
    s.synchronize()
    heap.check()
    return x, s, torch.equal(x, data(torch, (rank - 1) % world, salt, n, d))


def heap_outlives_comm(ferry, torch, comm, rank: int, world: int, dev: int) -> list:
    """A C or C++ program may destroy a communicator before a heap made from
    it; Python's close() closes the heaps first, so the native communicator is
    closed here under a fresh heap. The heap then grows (its first chunk: a
    descriptor exchange with every peer, over the communicator's exchange,
    which the heap keeps), takes a put from the left neighbour on a stream,
    and frees. A heap that did not keep the exchange would read freed memory
    when it grows here."""
    fails = []
    heap = ferry.symm.Heap(comm, 1 << 30)
    comm._c.close()
    n = (5 << 20) + 3
    x, s, landed = put_from_left(torch, heap, rank, world, dev, n, "after-close")
    if not landed:
        fails.append(f"rank {rank}: a put into a heap whose communicator closed first differs")
    if heap.mapped < n:
        fails.append(f"rank {rank}: the heap mapped {heap.mapped} bytes for {n}")
    heap.free(x)
    # Every rank has left free's exchange once this barrier passed: only then
    # may rank 0 close the store that exchange went through.
    heap.barrier_on_stream(s)
    s.synchronize()
    heap.close()
    return fails


def rank_main(rank: int, world: int, port: int) -> int:
    os.environ["FERRY_PORT"] = str(port)
    import ferry
    import torch

    dev = rank % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    comm = ferry.init(rank=rank, world=world, device=dev, timeout=30.0)
    suite = Suite(ferry, torch, comm, world, local=False)
    # growth_refused needs every rank on one GPU, where one rank's memory is another's.
    names = _selected() or CHECKS + ["mismatch"] + (
        ["growth_refused"] if torch.cuda.device_count() == 1 else []
    )
    fails = suite.run(names)
    suite.heap.close()
    if _selected():
        comm.close()
        return report(fails, suite.checks)
    try:
        fails += heap_outlives_comm(ferry, torch, comm, rank, world, dev)
    except Exception as e:  # named, not a hang: the peers' waits are bounded
        fails.append(f"rank {rank}: heap_outlives_comm raised {e!r}")
    with contextlib.suppress(ferry.ClosedError):
        comm.close()  # its native half closed above, so this raises before the store closes
    if comm._store is not None:
        comm._store.close()
    return report(fails, suite.checks + 1)


def torch_rank_main(rank: int, world: int, port: int) -> int:
    """A heap bootstrapped from torch.distributed (gloo: ranks share the GPU,
    where NCCL refuses duplicate GPUs): a put on a stream into the right
    neighbour and a barrier, then the device API's checks over the same
    communicator."""
    os.environ["FERRY_PORT"] = str(port)
    import ferry
    import ferry.symm
    import torch
    import torch.distributed as dist

    dev = rank % torch.cuda.device_count()
    torch.cuda.set_device(dev)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    fails = []
    heap = ferry.symm.Heap.from_torch(capacity=256 << 20)
    if (heap.comm.rank, heap.comm.world, heap.comm.device) != (rank, world, dev):
        fails.append(f"from_torch: rank {heap.comm.rank} of {heap.comm.world} on cuda:{heap.comm.device}")
    _, _, landed = put_from_left(torch, heap, rank, world, dev, (1 << 20) + 5, "torch")
    if not landed:
        fails.append(f"rank {rank}: the left neighbour's put over a heap from torch.distributed differs")
    suite = Suite(ferry, torch, heap.comm, world, local=False)
    fails += suite.run(_selected() or ["rma", "p_g", "waits", "barriers"])
    suite.heap.close()
    heap.close()  # and the communicator it made
    dist.destroy_process_group()
    return report(fails, suite.checks + 2)


def procs_main(world: int, rank_mode: str = "rank") -> int:
    import socket

    built_library()  # once, before the ranks load it

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port - 1), **SAFE_ENV)
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, rank_mode, str(r), str(world), str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    status = 0
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            print(f"rank {r}: did not finish in 240 s")
            status = 1
        print(f"--- rank {r} (exit {p.returncode})\n{out[-4000:]}")
        status |= p.returncode != 0
    return status


if __name__ == "__main__":
    os.environ.update(SAFE_ENV)
    if os.environ.get("SYMM_STACKS_AFTER_S"):  # where a run that hangs is stuck
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["SYMM_STACKS_AFTER_S"]), exit=True)
    os.environ.setdefault("FERRY_SHARED_GPUS", "1")
    mode = sys.argv[1]
    if mode == "local":
        sys.exit(local_main(int(sys.argv[2])))
    if mode == "procs":
        sys.exit(procs_main(int(sys.argv[2])))
    if mode == "torch-procs":
        sys.exit(procs_main(int(sys.argv[2]), "torch-rank"))
    if mode == "torch-rank":
        sys.exit(torch_rank_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
    if mode == "stream-timeout":
        sys.exit(stream_timeout_main(int(sys.argv[2])))
    sys.exit(rank_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))

#!/usr/bin/env python3
"""Random collectives, every output byte checked against a reference that torch
computes from the inputs (never ferry).

    python tests/gpu/fuzz.py --seed 1 --ops 100000 --world 2,3,4,8
    python tests/gpu/fuzz.py --seed 1 --ops 2000 --world 3 --procs
    python tests/gpu/fuzz.py --seed 1 --fault 5 --world 2,3,4
    python tests/gpu/fuzz.py --seed 1 --world 4 --replay 12345

Each operation is drawn from its own seed (seed, world, index): the collective,
the dtype, the counts (zero and odd ones; all_to_allv matrices with ranks that
send or receive nothing), unaligned input and output offsets, the variant
(b2b, seq, pcpy, the SM path), local_copy, signals (copy engines or kernels),
the stream (the rank's, a side stream, the current one, the legacy default
one), in place or not, and how it runs: eager, repeated (ferry replays it from
a graph), prepared (armed, triggered from the host, a stream or a kernel, gate
in host or GPU memory) or captured into CUDA graphs and replayed.

Worlds: ranks on GPU r % N of the N visible GPUs (--gpus), several per GPU
where the world is larger (FERRY_SHARED_GPUS, testing only: the logic of the
world runs, not its speed). One process drives every rank (init_local), or
with --procs one process per rank (ferry.init).

Checking: inputs come from random arenas (one per rank and batch, generated
from seeds, so every process can regenerate every rank's input); outputs are
carved at random offsets from a registered pool, and every pool byte is
poisoned before the batch. Each rank's expected pool (poison, with every
operation's reference where its output lies) is built on the GPU before the
batch runs; after it, one comparison per rank counts wrong bytes, including
bytes written outside any output. One host synchronization per batch.

Fault mode (--fault N, process per rank): in each of N trials one rank's
process kills itself (SIGKILL) at a random point of a random operation;
every other rank must get a ferry error that names the dead rank within the
communicator's timeout (--timeout) plus 5 s, and no process may hang. A
survivor whose thread is stuck inside CUDA, where no error reaches it (see
docs/api.md, "When a run hangs or fails"), passes only if ferry's watchdog
ends it (FERRY_EXIT_AFTER_S, --exit-after) with a message naming the dead
rank; --exit-after 0 makes such a survivor fail the trial.

Exit status 0 when every operation passed (and, in fault mode, every trial).
A failure prints the command that replays its operation (--replay INDEX).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import List, Optional

OPS = ("all_gather", "all_to_all", "all_to_allv", "broadcast", "reduce_scatter", "all_reduce")
OP_WEIGHTS = {
    "all_gather": 3,
    "all_to_all": 2,
    "all_to_allv": 4,
    "broadcast": 2,
    "reduce_scatter": 2,
    "all_reduce": 2,
}
REDUCTIONS = ("reduce_scatter", "all_reduce")
MOVE_DTYPES = ("uint8", "int8", "int16", "float16", "bfloat16", "float32", "int32", "int64", "float64")
REDUCE_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64")
ITEMSIZE = {
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "int32": 4,
    "int64": 8,
    "float64": 8,
}
MODES = ("eager", "repeat", "prepared", "graph")
MODE_WEIGHTS = {"eager": 50, "repeat": 10, "prepared": 20, "graph": 20}
# The bytes of an input's offset into its arena (random, element-aligned):
# every alignment from 1 byte up.
IN_OFFSET_SPAN = 4096
ARENA_PAD = 8192
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# Several streams per GPU (a rank's, ferry's) need hardware queues of their own.
CHILD_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "32", "PYTHONUNBUFFERED": "1"}


def seed_of(*parts) -> int:
    digest = hashlib.blake2b("/".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


# ---------------------------------------------------------------- configuration


@dataclass
class Config:
    seed: int
    world: int
    ops: int  # operations of this world
    first: int = 0  # index of the first one
    procs: bool = False
    gpus: int = 1
    batch: int = 256
    max_bytes: int = 4 << 20
    pool_bytes: int = 64 << 20
    timeout: float = 60.0
    sm_bytes: int = 1 << 20
    sm_two_shot_bytes: int = 1 << 20
    ops_allowed: tuple = OPS
    modes: tuple = MODES
    replay: int = -1  # run only this operation (with its batch's layout and data)
    progress_s: float = 5.0
    max_failures: int = 20
    fault: Optional[dict] = None  # victim, kill_op, point, delay_s (fault mode)
    dump_s: float = 3600.0  # a child still running then prints its threads' stacks and exits
    exit_after_s: float = 0.0  # FERRY_EXIT_AFTER_S of the ranks (fault mode)
    stderr_dir: str = ""  # each rank's stderr goes to rank-<r>.err here (fault mode)

    @property
    def ranks_per_gpu(self) -> int:
        return math.ceil(self.world / self.gpus)


def device_of(cfg: Config, rank: int) -> int:
    return rank % cfg.gpus


# ---------------------------------------------------------------- one operation's plan


@dataclass
class Op:
    index: int
    op: str
    dtype: str
    n: int  # elements: all_gather's input, an all_to_all block, the broadcast, reduce_scatter's result, all_reduce's
    counts: Optional[List[List[int]]]  # all_to_allv: elements from s to d
    root: int
    red_op: str
    algo: str
    local_copy: Optional[str]
    signals: str
    in_place: bool
    mode: str
    reps: int  # repeat: calls; graph: replays
    stream: str  # main, side, mixed, current, legacy
    side: List[bool]  # mixed: which ranks use their side stream
    gate: str
    trigger: str  # host, stream, kernel
    spin_ns: int
    input_after_arm: bool
    in_off: List[int]  # per rank: offset into its arena (bytes; elements for reductions)
    out_slack: List[int]  # all_to_allv: extra elements in each rank's out
    in_slack: List[int]  # all_to_allv: extra elements in each rank's in
    null_out: List[bool]  # empty and not a view of the pool (a null pointer)
    null_in: List[bool]
    explicit_in: bool  # all_reduce in place: inp=out rather than None; broadcast: other ranks pass a tensor
    gap: int  # elements of poison before the output region
    out_off: int = 0  # bytes into every rank's pool (the same offset on every rank)
    region: int = 0  # bytes of the pool the operation owns from out_off

    @property
    def es(self) -> int:
        return ITEMSIZE[self.dtype]

    def send(self, s: int) -> int:
        return sum(self.counts[s])

    def recv(self, d: int) -> int:
        return sum(row[d] for row in self.counts)

    def out_elems(self, world: int, r: int) -> int:
        """Elements rank r's output receives."""
        if self.op in ("all_gather", "all_to_all"):
            return world * self.n
        if self.op == "all_to_allv":
            return self.recv(r)
        return self.n

    def in_elems(self, world: int, r: int) -> int:
        """Elements of rank r's input (what the reference reads)."""
        if self.op in ("all_to_all", "reduce_scatter"):
            return world * self.n
        if self.op == "all_to_allv":
            return self.send(r)
        return self.n

    def out_len(self, world: int, r: int) -> int:
        """Bytes of the out tensor rank r passes (reduce_scatter in place: the input region)."""
        if self.op == "reduce_scatter" and self.in_place:
            return world * self.n * self.es
        slack = self.out_slack[r] if self.op == "all_to_allv" else 0
        return (self.out_elems(world, r) + slack) * self.es

    def empty_everywhere(self) -> bool:
        return (self.counts is not None and not any(any(row) for row in self.counts)) or (
            self.counts is None and self.n == 0
        )

    def describe(self) -> str:
        size = f"counts={self.counts}" if self.op == "all_to_allv" else f"n={self.n}"
        how = self.mode
        if self.mode == "prepared":
            how += f"({self.trigger} trigger, gate in {self.gate} memory{', input after arm' if self.input_after_arm else ''})"
        elif self.mode in ("repeat", "graph"):
            how += f" x{self.reps}"
        extra = (
            f" root={self.root}"
            if self.op == "broadcast"
            else f" {self.red_op}"
            if self.op in REDUCTIONS
            else ""
        )
        lc = f" local_copy={self.local_copy}" if self.local_copy else ""
        return (
            f"#{self.index} {self.op} {self.dtype} {size}{extra} algo={self.algo}{lc} signals={self.signals}"
            f" {how} stream={self.stream} in_place={self.in_place} out_off={self.out_off} in_off={self.in_off}"
        )


def draw_bytes(rng: random.Random, max_bytes: int) -> int:
    """A per-peer byte count: zero, small and odd ones often, the SM path's and
    the low-latency format's bounds, now and then up to max_bytes."""
    x = rng.random()
    if x < 0.06:
        return 0
    if x < 0.14:
        b = rng.choice(
            (1, 2, 3, 7, 15, 16, 17, 255, 256, 4095, 4096, 4097, 65535, 65536, 65537)
            + ((1 << 20) - 1, 1 << 20, (1 << 20) + 1, (1 << 20) + 16, max_bytes)
        )
    elif x < 0.38:
        b = rng.randint(1, 64)
    elif x < 0.62:
        b = rng.randint(65, 4096)
    elif x < 0.82:
        b = rng.randint(4097, 1 << 16)
    elif x < 0.96:
        b = rng.randint((1 << 16) + 1, 1 << 20)
    else:
        b = rng.randint((1 << 20) + 1, max(max_bytes, (1 << 20) + 1))
    return min(b, max_bytes)


def draw_counts(rng: random.Random, world: int, es: int, max_bytes: int) -> List[List[int]]:
    """An all_to_allv matrix in elements: zeros at a random density, and often
    a rank that sends nothing, one that receives nothing, or both."""
    max_elems = max_bytes // es
    hi = max(1, min(draw_bytes(rng, max_bytes) // es, max_elems // world))
    p_zero = rng.choice((0.0, 0.2, 0.5, 0.8))
    c = [[0 if rng.random() < p_zero else rng.randint(1, hi) for _ in range(world)] for _ in range(world)]
    x = rng.random()
    if x < 0.25:
        c[rng.randrange(world)] = [0] * world  # a rank sends nothing
    elif x < 0.5:
        d = rng.randrange(world)  # a rank receives nothing
        for row in c:
            row[d] = 0
    elif x < 0.6:
        r = rng.randrange(world)  # a rank sends and receives nothing
        c[r] = [0] * world
        for row in c:
            row[r] = 0
    elif x < 0.64:
        c = [[0] * world for _ in range(world)]
    elif x < 0.68:
        c = [[c[s][d] if s == d else 0 for d in range(world)] for s in range(world)]
    # Every rank's send and receive totals within max_bytes.
    for _ in range(2):
        for s in range(world):
            tot = sum(c[s])
            if tot > max_elems:
                c[s] = [v * max_elems // tot for v in c[s]]
        for d in range(world):
            tot = sum(c[s][d] for s in range(world))
            if tot > max_elems:
                for s in range(world):
                    c[s][d] = c[s][d] * max_elems // tot
    return c


def has_empty_part(op: Op, world: int) -> bool:
    """Some rank sends or receives nothing (a zero count everywhere included)."""
    if op.counts is None:
        return op.n == 0
    return any(op.send(r) == 0 or op.recv(r) == 0 for r in range(world))


def largest_block(op: Op, world: int, two_shot_bytes: int, sm_bytes: int) -> int:
    """What the SM path's window must hold per peer (sm_path_largest_block):
    an all_reduce from FERRY_SM_TWO_SHOT_BYTES on 3 or more ranks sends one
    part per rank in rounds of at most a slot, where a round's chunk is over
    the low-latency format's 64 KiB."""
    if op.op == "all_to_allv":
        return max(max(row) for row in op.counts) * op.es
    n = op.n * op.es
    if op.op == "all_reduce" and world >= 3 and two_shot_bytes > 0 and n >= two_shot_bytes:
        part = (-(-n // world) + 15) // 16 * 16
        slot = (sm_bytes + 255) // 256 * 256 // 16 * 16
        chunk = min(part, slot) if slot else part
        if chunk > 64 << 10:
            return chunk
    return n


def plan_op(cfg: Config, i: int) -> Op:
    """Operation i of this world: a pure function of (seed, world, i), so every
    process plans the same one."""
    rng = random.Random(seed_of("ferry-fuzz", cfg.seed, cfg.world, i))
    W = cfg.world
    names = [o for o in OPS if o in cfg.ops_allowed]
    kind = rng.choices(names, weights=[OP_WEIGHTS[o] for o in names])[0]
    reduction = kind in REDUCTIONS
    dtype = rng.choice(REDUCE_DTYPES if reduction else MOVE_DTYPES)
    es = ITEMSIZE[dtype]
    scaled = kind in ("all_gather", "all_to_all", "reduce_scatter")  # W blocks per rank
    cap = cfg.max_bytes // (W if scaled else 1)
    n = min(draw_bytes(rng, cfg.max_bytes), cap) // es
    counts = draw_counts(rng, W, es, cfg.max_bytes) if kind == "all_to_allv" else None
    op = Op(
        index=i,
        op=kind,
        dtype=dtype,
        n=0 if counts is not None else n,
        counts=counts,
        root=rng.randrange(W),
        red_op=rng.choice(("sum", "max", "min")),
        algo="auto",
        local_copy=None if reduction else rng.choice(("auto", "peer", "sm", "driver")),
        signals=rng.choice(("auto", "copy", "sm")),
        in_place=kind != "all_to_allv" and rng.random() < 0.25,
        mode="eager",
        reps=1,
        stream="main",
        side=[rng.random() < 0.5 for _ in range(W)],
        gate=rng.choice(("host", "device")),
        trigger="host",
        spin_ns=rng.randrange(0, 20000),
        input_after_arm=False,
        in_off=[rng.randrange(0, IN_OFFSET_SPAN // es) * (1 if reduction else es) for _ in range(W)],
        out_slack=[rng.randint(1, 16) if rng.random() < 0.3 else 0 for _ in range(W)],
        in_slack=[rng.randint(1, 16) if rng.random() < 0.3 else 0 for _ in range(W)],
        null_out=[rng.random() < 0.5 for _ in range(W)],
        null_in=[rng.random() < 0.5 for _ in range(W)],
        explicit_in=rng.random() < 0.5,
        gap=rng.randrange(0, 64),
    )
    # The variant: the SM path where its window holds the call (it refuses the
    # rest, checked elsewhere); pcpy's per-peer streams where the GPU's
    # hardware queues suffice for every rank it holds.
    algos = {"auto": 2, "b2b": 2, "seq": 1}
    if cfg.ranks_per_gpu * (W - 1) <= 12:
        algos["pcpy"] = 1
    # On a shared GPU every rank's kernel must be resident at once (each
    # waits for the others'): the library caps the grids there, which the
    # SM-path calls drawn here exercise.
    big = largest_block(op, W, cfg.sm_two_shot_bytes, cfg.sm_bytes)
    if W <= 8 and cfg.sm_bytes > 0 and big <= cfg.sm_bytes:
        algos["sm"] = 2
    op.algo = rng.choices(list(algos), weights=list(algos.values()))[0]
    modes = [m for m in MODES if m in cfg.modes]
    op.mode = rng.choices(modes, weights=[MODE_WEIGHTS[m] for m in modes])[0]
    if op.mode == "repeat":
        op.reps = rng.randint(2, 3)
    elif op.mode == "graph":
        op.reps = 1 if op.in_place else rng.randint(1, 2)
    if op.mode == "prepared":
        op.trigger = rng.choice(("stream", "kernel") if op.gate == "device" else ("host", "stream", "kernel"))
        op.input_after_arm = op.in_place and op.trigger != "host" and rng.random() < 0.5
    # Streams: two ranks of one GPU in one process need streams of their own;
    # the current and the legacy default stream only where a process has one
    # rank per GPU.
    streams = ["main", "side", "mixed"]
    if cfg.procs or cfg.ranks_per_gpu == 1:
        streams += ["current", "legacy"]
    op.stream = rng.choice(streams)
    return op


def layout(cfg: Config, op: Op, cursor: int) -> Optional[int]:
    """Places the operation's region in the pool from `cursor` (the same
    offset on every rank); returns the next cursor, or None when it does not fit."""
    es = op.es
    op.region = max(op.out_len(cfg.world, r) for r in range(cfg.world))
    start = (cursor + es - 1) // es * es + op.gap * es
    if start + op.region > cfg.pool_bytes:
        return None
    op.out_off = start
    return start + op.region


def batches(cfg: Config):
    """(first index, ops) of each batch: up to cfg.batch operations whose
    regions fit the pool, in order."""
    i, end = cfg.first, cfg.first + cfg.ops
    while i < end:
        ops, cursor = [], 0
        while i < end and len(ops) < cfg.batch:
            op = plan_op(cfg, i)
            nxt = layout(cfg, op, cursor)
            if nxt is None:
                if ops:
                    break
                raise RuntimeError(f"op {i} needs {op.region} bytes; the pool holds {cfg.pool_bytes}")
            cursor = nxt
            ops.append(op)
            i += 1
        yield ops[0].index, ops


# ---------------------------------------------------------------- running on the GPUs


def capture_per_rank(torch, devs, capture_streams, call, marks=()):
    """Runs `call` (one ferry call for every local rank, on `capture_streams`)
    while each rank's capture stream records into a CUDA graph of its own,
    all captures open at once (the call takes every local rank's stream).
    `marks`: (tensor, value) per rank, filled inside the graph, so that it is
    never empty (a call that moves nothing records nothing). Returns the graphs."""
    graphs = [torch.cuda.CUDAGraph() for _ in devs]
    begun = []
    try:
        for k, (d, s) in enumerate(zip(devs, capture_streams)):
            with torch.cuda.device(d), torch.cuda.stream(s):
                graphs[k].capture_begin(capture_error_mode="relaxed")
            begun.append(k)
        call()
        for (d, s), (t, v) in zip(zip(devs, capture_streams), marks):
            with torch.cuda.device(d), torch.cuda.stream(s):
                t.fill_(v)
    finally:
        for k in begun:
            with torch.cuda.device(devs[k]), torch.cuda.stream(capture_streams[k]):
                graphs[k].capture_end()
    return graphs


def replay_per_rank(torch, devs, graphs, streams) -> None:
    """Each rank's graph launched on its stream."""
    for d, g, s in zip(devs, graphs, streams):
        with torch.cuda.device(d), torch.cuda.stream(s):
            g.replay()


class FaultInjected(Exception):
    pass


class Fuzzer:
    """Runs a world's operations for the ranks of this process (every rank
    with init_local, one with --procs) and checks them."""

    def __init__(self, cfg: Config, comm, ranks: List[int], devs: list):
        import ferry
        import torch

        self.torch, self.ferry, self.cfg, self.comm = torch, ferry, cfg, comm
        self.ranks, self.devs = ranks, devs
        self.local = not cfg.procs
        self.k_of = {r: k for k, r in enumerate(ranks)}
        self.main, self.side, self.capture = [], [], []
        for d in devs:
            with torch.cuda.device(d):
                self.main.append(torch.cuda.Stream(device=d))
                self.side.append(torch.cuda.Stream(device=d))
                self.capture.append(torch.cuda.Stream(device=d))
        self.gen = {d.index: torch.cuda.Stream(device=d) for d in devs}
        pools = comm.alloc((cfg.pool_bytes,), torch.uint8)
        self.pools = pools if self.local else [pools]
        self.expect = [torch.empty(cfg.pool_bytes, dtype=torch.uint8, device=d) for d in devs]
        self.marker = [torch.zeros(16, dtype=torch.uint8, device=d) for d in devs]
        # Every kernel that runs between an arm() and its trigger runs once
        # before: a kernel's first launch can wait for the armed stream (CUDA's
        # lazy loading). The copies are the batches' own; the trigger kernel:
        for k, d in enumerate(devs):
            with torch.cuda.device(d):
                ferry._native.hooks().launch_trigger_kernel(
                    self.marker[k].data_ptr(), 0, 0, self.main[k].cuda_stream
                )
        # Scratch for every call up front: captures cannot grow it, and a
        # rank's death must not find the others in a collective allocation.
        comm.reserve_scratch(cfg.world * (cfg.max_bytes + 4096))
        self.stats = {
            "ops": 0,
            "passed": 0,
            "failed": 0,
            "wrong_bytes": 0,
            "by_op": {},
            "by_mode": {},
            "by_algo": {},
            "with_empty_parts": 0,
            "notes": [],
        }
        if self.local and len(ranks) > 1 and "graph" in cfg.modes:
            self.probe_graphs()
        self.failures: List[dict] = []
        self.error: Optional[str] = None
        self.error_time: Optional[float] = None
        self.arenas: dict = {}
        self.batch_first = 0

    def probe_graphs(self) -> None:
        """Captures one graph per rank at once, without ferry: where this torch
        cannot, graph mode is left out of this world (and said so)."""
        torch = self.torch
        try:
            marks = [(m, 7) for m in self.marker]
            gs = capture_per_rank(torch, self.devs, self.capture, lambda: None, marks)
            replay_per_rank(torch, self.devs, gs, self.main)
            for d in {d.index for d in self.devs}:
                torch.cuda.synchronize(d)
            if any(int(m[0]) != 7 for m in self.marker):
                raise RuntimeError("a replayed graph did not run")
        except Exception as exc:  # noqa: BLE001
            note = f"graph mode left out: one CUDA graph per rank could not be captured at once ({exc!r})"
            self.stats["notes"].append(note)
            sys.stderr.write(f"fuzz: {note}\n")
            self.cfg.modes = tuple(m for m in self.cfg.modes if m != "graph")

    # -- data

    def dtype(self, name):
        return getattr(self.torch, name)

    def arena(self, dev, q: int, kind: str):
        """Rank q's random input arena of this batch ('u8' bytes, or values of
        a reduction dtype), generated on `dev` from its seed."""
        torch = self.torch
        key = (dev.index, q, kind)
        t = self.arenas.get(key)
        if t is None:
            g = torch.Generator(device=dev)
            g.manual_seed(seed_of("arena", self.cfg.seed, self.cfg.world, self.batch_first, q, kind))
            total = self.cfg.max_bytes + ARENA_PAD
            if kind == "u8":
                t = torch.randint(0, 256, (total,), dtype=torch.uint8, device=dev, generator=g)
            else:
                dt = self.dtype(kind)
                n = total // ITEMSIZE[kind]
                if dt.is_floating_point:
                    t = torch.randn(n, device=dev, generator=g).to(dt)
                else:
                    t = torch.randint(-(1 << 20), 1 << 20, (n,), device=dev, generator=g).to(dt)
            self.arenas[key] = t
        return t

    def source(self, op: Op, dev, q: int):
        """Rank q's input as `dev` sees it: bytes, or typed values for a reduction."""
        n = op.in_elems(self.cfg.world, q)
        if op.op in REDUCTIONS:
            return self.arena(dev, q, op.dtype)[op.in_off[q] : op.in_off[q] + n]
        return self.arena(dev, q, "u8")[op.in_off[q] : op.in_off[q] + n * op.es]

    def reduced(self, op: Op, blocks):
        """What ferry computes: every rank's block in rank order, in float for
        16-bit floats, rounded once."""
        torch = self.torch
        dt = self.dtype(op.dtype)
        wide = torch.float32 if dt in (torch.float16, torch.bfloat16) else dt
        acc = blocks[0].to(wide)
        for b in blocks[1:]:
            b = b.to(wide)
            acc = (
                acc + b
                if op.red_op == "sum"
                else torch.maximum(acc, b)
                if op.red_op == "max"
                else torch.minimum(acc, b)
            )
        return acc.to(dt).view(torch.uint8)

    def expected(self, op: Op, dev, r: int, cache: dict):
        """Rank r's region after the operation, as a list of (offset, bytes)."""
        torch, W = self.torch, self.cfg.world
        es, nb = op.es, op.n * op.es
        src = lambda q: self.source(op, dev, q)  # noqa: E731
        key = (op.index, dev.index)
        if op.op == "all_gather":  # the same on every rank
            if key not in cache:
                cache[key] = torch.cat([src(q) for q in range(W)])
            return [(0, cache[key])]
        if op.op == "all_to_all":
            return [(0, torch.cat([src(q)[r * nb : (r + 1) * nb] for q in range(W)]))]
        if op.op == "all_to_allv":
            pieces = []
            for q in range(W):
                at = sum(op.counts[q][:r]) * es
                pieces.append(src(q)[at : at + op.counts[q][r] * es])
            return [(0, torch.cat(pieces))] if op.recv(r) else []
        if op.op == "broadcast":
            return [(0, src(op.root))]
        if op.op == "all_reduce":
            if key not in cache:
                cache[key] = self.reduced(op, [src(q) for q in range(W)])
            return [(0, cache[key])]
        # reduce_scatter
        if key not in cache:
            cache[key] = self.reduced(op, [src(q) for q in range(W)])
        mine = cache[key][r * nb : (r + 1) * nb]
        if op.in_place:
            return [(0, src(r).view(torch.uint8)), (r * nb, mine)]
        return [(0, mine)]

    def place_input(self, op: Op, k: int) -> None:
        """An in-place call's input into its place in the pool (current stream)."""
        r = self.ranks[k]
        pool, nb = self.pools[k], op.n * op.es
        data = self.source(op, self.devs[k], r)
        if op.op in REDUCTIONS:
            data = data.view(self.torch.uint8)
        if op.op == "all_gather":
            pool[op.out_off + r * nb : op.out_off + (r + 1) * nb].copy_(data)
        elif op.op == "broadcast":
            if r == op.root:
                pool[op.out_off : op.out_off + nb].copy_(data)
        else:
            pool[op.out_off : op.out_off + data.numel()].copy_(data)

    def reset_region(self, op: Op, k: int, poison: int) -> None:
        """The region as before the call: poison, and an in-place input."""
        self.pools[k][op.out_off : op.out_off + op.region].fill_(poison)
        if op.in_place:
            self.place_input(op, k)

    # -- tensors of a call

    def tensors(self, op: Op, k: int):
        torch, W = self.torch, self.cfg.world
        r, dev, pool = self.ranks[k], self.devs[k], self.pools[k]
        dt, es = self.dtype(op.dtype), op.es

        def empty():
            return torch.empty(0, dtype=dt, device=dev)  # no memory: a null data pointer

        region = pool[op.out_off : op.out_off + op.out_len(W, r)].view(dt)
        if op.in_place:
            if op.op == "all_gather":
                return region, region[r * op.n : (r + 1) * op.n]
            if op.op == "all_to_all":
                return region, region
            if op.op == "broadcast":
                return region, None
            if op.op == "all_reduce":
                return region, (region if op.explicit_in else None)
            return region[r * op.n : (r + 1) * op.n], region  # reduce_scatter: out is this rank's block of in
        out = region
        if op.empty_everywhere() and op.null_out[r]:
            out = empty()
        if op.op == "broadcast" and r != op.root:
            return out, (self.source(op, dev, r).view(dt) if op.explicit_in and op.n else None)
        n_in = op.in_elems(W, r) + (op.in_slack[r] if op.op == "all_to_allv" else 0)
        if n_in == 0 and op.null_in[r]:
            return out, empty()
        if op.op in REDUCTIONS:
            arena = self.arena(dev, r, op.dtype)
            return out, arena[op.in_off[r] : op.in_off[r] + n_in]
        arena = self.arena(dev, r, "u8")
        return out, arena[op.in_off[r] : op.in_off[r] + n_in * es].view(dt)

    def kwargs(self, op: Op) -> dict:
        kw = dict(algo=op.algo, signals=op.signals)
        if op.local_copy:
            kw["local_copy"] = op.local_copy
        if op.op == "all_to_allv":
            kw["counts"] = op.counts
        if op.op == "broadcast":
            kw["root"] = op.root
        return kw

    def one(self, xs):
        return xs if self.local else xs[0]

    def call(self, op: Op, outs, ins, streams) -> None:
        kw = self.kwargs(op)
        if op.op in REDUCTIONS:
            kw["op"] = op.red_op
        ins_arg = None if all(x is None for x in ins) else self.one(ins)
        stream_arg = None if streams is None else self.one(streams)
        getattr(self.comm, op.op)(self.one(outs), ins_arg, stream=stream_arg, **kw)

    # -- streams

    def call_streams(self, op: Op):
        """The stream each local rank's call goes to (ordered after its main stream)."""
        torch, out = self.torch, []
        for k, r in enumerate(self.ranks):
            kind = op.stream if op.stream != "mixed" else ("side" if op.side[r] else "main")
            s = {
                "main": self.main[k],
                "current": self.main[k],
                "side": self.side[k],
                "legacy": torch.cuda.default_stream(self.devs[k]) if kind == "legacy" else None,
            }[kind]
            if s is not self.main[k]:
                s.wait_stream(self.main[k])
            out.append(s)
        return out

    def join(self, streams) -> None:
        for k, s in enumerate(streams):
            if s is not self.main[k]:
                self.main[k].wait_stream(s)

    @contextlib.contextmanager
    def current(self, streams):
        """Each rank's stream made torch's current one on its GPU."""
        with contextlib.ExitStack() as stack:
            for d, s in zip(self.devs, streams):
                stack.enter_context(self.torch.cuda.device(d))
                stack.enter_context(self.torch.cuda.stream(s))
            yield

    # -- fault injection

    def maybe_die(self, op: Op, point: str) -> None:
        f = self.cfg.fault
        if not f or self.ranks[0] != f["victim"] or op.index != f["kill_op"]:
            return
        want = f["point"]
        if want == "armed" and op.mode != "prepared":
            want = "after"
        if point != want:
            return
        sys.stderr.write(
            f"fuzz: rank {self.ranks[0]} kills itself at op {op.index} ({point}): {op.describe()}\n"
        )
        sys.stderr.flush()
        if point == "timer":
            delay = f["delay_s"]

            def later():
                time.sleep(delay)
                os.kill(os.getpid(), signal.SIGKILL)

            threading.Thread(target=later, daemon=True).start()
            return
        os.kill(os.getpid(), signal.SIGKILL)

    # -- one operation

    def run_op(self, op: Op, poison: List[int], handles: list, graphs: list) -> None:
        torch = self.torch
        ks = range(len(self.ranks))
        pairs = [self.tensors(op, k) for k in ks]
        outs, ins = [p[0] for p in pairs], [p[1] for p in pairs]
        streams = self.call_streams(op)
        self.maybe_die(op, "before")
        self.maybe_die(op, "timer")
        use = None if op.stream == "current" else streams
        if op.mode in ("eager", "repeat"):
            for rep in range(op.reps):
                if rep:
                    for k in ks:
                        with torch.cuda.device(self.devs[k]), torch.cuda.stream(streams[k]):
                            self.reset_region(op, k, poison[k])
                with self.current(streams) if use is None else contextlib.nullcontext():
                    self.call(op, outs, ins, use)
        elif op.mode == "prepared":
            self.run_prepared(op, outs, ins, streams, handles)
        else:
            self.run_graph(op, outs, ins, streams, graphs)
        self.maybe_die(op, "after")
        self.join(streams)

    def run_prepared(self, op: Op, outs, ins, streams, handles: list) -> None:
        torch = self.torch
        kw = self.kwargs(op)
        if op.op in REDUCTIONS:
            kw["op"] = op.red_op
        ins_arg = None if all(x is None for x in ins) else self.one(ins)
        h = self.comm.prepare(op.op, self.one(outs), ins_arg, **kw)
        handles.append(h)
        h.arm(stream=self.one(streams), gate=op.gate)
        self.maybe_die(op, "armed")
        if op.input_after_arm:  # the trigger says the input is ready: written after arming
            for k in range(len(self.ranks)):
                with torch.cuda.device(self.devs[k]), torch.cuda.stream(streams[k]):
                    self.place_input(op, k)
        if op.trigger == "host":
            h.trigger()
        elif op.trigger == "stream":
            h.trigger(self.one(streams))
        else:
            pairs = h.device_trigger()
            pairs = pairs if self.local else [pairs]
            for (word, value), s in zip(pairs, streams):
                self.ferry._native.hooks().launch_trigger_kernel(word, value, op.spin_ns, s.cuda_stream)
        h.wait(self.one(streams))

    def run_graph(self, op: Op, outs, ins, streams, graphs: list) -> None:
        marks = [(m, op.index & 0xFF) for m in self.marker]
        gs = capture_per_rank(
            self.torch, self.devs, self.capture, lambda: self.call(op, outs, ins, self.capture), marks
        )
        graphs.extend(gs)
        for _ in range(op.reps):
            replay_per_rank(self.torch, self.devs, gs, streams)

    # -- a batch

    def run_batch(self, first: int, ops: List[Op], only: int = -1) -> None:
        torch, cfg = self.torch, self.cfg
        self.arenas = {}
        self.batch_first = first
        todo = [op for op in ops if only < 0 or op.index == only]
        used = max(op.out_off + op.region for op in ops)
        rng = random.Random(seed_of("poison", cfg.seed, cfg.world, first))
        poison = [rng.randrange(256) for _ in range(cfg.world)]
        poison = [poison[r] for r in self.ranks]
        # Before the batch, on each GPU's generator stream: arenas, poisoned
        # pools, in-place inputs, and the expected pools.
        for k, dev in enumerate(self.devs):
            with torch.cuda.device(dev), torch.cuda.stream(self.gen[dev.index]):
                self.pools[k][:used].fill_(poison[k])
                self.expect[k][:used].fill_(poison[k])
        cache: dict = {}
        for op in todo:
            for k, (r, dev) in enumerate(zip(self.ranks, self.devs)):
                with torch.cuda.device(dev), torch.cuda.stream(self.gen[dev.index]):
                    self.source(op, dev, r)  # this rank's own arena, made here and nowhere later
                    if op.in_place and not op.input_after_arm:
                        self.place_input(op, k)
                    for at, data in self.expected(op, dev, r, cache):
                        if data.numel():
                            self.expect[k][op.out_off + at : op.out_off + at + data.numel()].copy_(data)
        for k, dev in enumerate(self.devs):
            self.main[k].wait_stream(self.gen[dev.index])
        handles, graphs, ran = [], [], []
        for op in todo:
            try:
                self.run_op(op, poison, handles, graphs)
                ran.append(op)
            except FaultInjected:
                raise
            except self.ferry.FerryError as exc:
                self.note_error(op, exc)
                if not isinstance(exc, self.ferry.InvalidArgumentError) or not self.local:
                    raise
                # Refused before anything was enqueued: its region stays as it was.
                for k in range(len(self.ranks)):
                    with torch.cuda.device(self.devs[k]), torch.cuda.stream(self.main[k]):
                        a, b = op.out_off, op.out_off + op.region
                        self.expect[k][a:b].copy_(self.pools[k][a:b])
        # One comparison per rank, after everything on its main stream.
        mism = []
        for k, dev in enumerate(self.devs):
            with torch.cuda.device(dev), torch.cuda.stream(self.main[k]):
                mism.append((self.pools[k][:used] != self.expect[k][:used]).sum())
        self.comm.synchronize()
        for dev in {d.index for d in self.devs}:
            torch.cuda.synchronize(dev)
        for h in handles:
            h.release()
        graphs.clear()
        f = cfg.fault
        if f and first + len(ops) > f["kill_op"]:
            self.stats["ops"] += len(ran)  # around a killed rank: no byte is owed
            return
        bad = [int(m) for m in mism]
        failed = set()
        if any(bad):
            failed = self.diagnose(todo, used, bad)
        for op in ran:
            self.stats["ops"] += 1
            self.stats["by_op"][op.op] = self.stats["by_op"].get(op.op, 0) + 1
            self.stats["by_mode"][op.mode] = self.stats["by_mode"].get(op.mode, 0) + 1
            self.stats["by_algo"][op.algo] = self.stats["by_algo"].get(op.algo, 0) + 1
            if has_empty_part(op, self.cfg.world):
                self.stats["with_empty_parts"] += 1
            if op.index in failed:
                self.stats["failed"] += 1
            else:
                self.stats["passed"] += 1

    def note_error(self, op: Op, exc: Exception) -> None:
        f = self.cfg.fault
        if f and op.index >= f["kill_op"]:
            return  # the error the fault mode waits for: the caller reports it
        self.stats["ops"] += 1
        self.stats["failed"] += 1
        self.add_failure(
            {
                "op": op.index,
                "rank": self.ranks,
                "what": f"raised {type(exc).__name__}: {exc}",
                "desc": op.describe(),
            }
        )

    def add_failure(self, f: dict) -> None:
        f["world"] = self.cfg.world
        if len(self.failures) < self.cfg.max_failures:
            self.failures.append(f)

    def diagnose(self, ops: List[Op], used: int, bad: List[int]) -> set:
        """Which operations' outputs hold wrong bytes, and which wrote past
        their output (into the poison up to the next operation's)."""
        failed = set()
        order = sorted(ops, key=lambda o: o.out_off)
        for k, r in enumerate(self.ranks):
            if not bad[k]:
                continue
            self.stats["wrong_bytes"] += bad[k]
            pool, exp = self.pools[k], self.expect[k]
            diff = pool[:used] != exp[:used]
            attributed = 0
            for j, op in enumerate(order):
                end = op.out_off + op.region
                gap_end = order[j + 1].out_off if j + 1 < len(order) else used
                for a, b, where in ((op.out_off, end, "in"), (end, gap_end, "after")):
                    seg = diff[a:b]
                    n = int(seg.sum()) if b > a else 0
                    if not n:
                        continue
                    attributed += n
                    failed.add(op.index)
                    first = int(seg.nonzero()[0])
                    got = pool[a + first : a + first + 8].tolist()
                    want = exp[a + first : a + first + 8].tolist()
                    what = (
                        f"{n} wrong bytes of {op.out_len(self.cfg.world, r)} (region {op.region}), first at byte {first}"
                        if where == "in"
                        else f"{n} bytes changed past its output (first {first} bytes after its region)"
                    )
                    self.add_failure(
                        {
                            "op": op.index,
                            "rank": r,
                            "what": f"{what}: got {got}, expected {want}",
                            "desc": op.describe(),
                        }
                    )
            if attributed < bad[k]:
                self.add_failure(
                    {
                        "op": -1,
                        "rank": r,
                        "what": f"{bad[k] - attributed} bytes changed before the batch's first output",
                        "desc": "",
                    }
                )
        return failed

    # -- the whole run

    def run(self) -> None:
        cfg = self.cfg
        t0 = last = time.monotonic()
        total = cfg.ops if cfg.replay < 0 else 1
        for first, ops in batches(cfg):
            if cfg.replay >= 0:
                if not any(op.index == cfg.replay for op in ops):
                    continue
                self.run_batch(first, ops, only=cfg.replay)
                break
            self.run_batch(first, ops)
            now = time.monotonic()
            if cfg.progress_s and now - last >= cfg.progress_s and self.ranks[0] == 0:
                last = now
                s = self.stats
                sys.stderr.write(
                    f"fuzz: world {cfg.world}{' (procs)' if cfg.procs else ''}: {s['ops']}/{total} ops,"
                    f" {s['failed']} failed, {s['ops'] / (now - t0):.0f} ops/s\n"
                )
                sys.stderr.flush()
        self.stats["elapsed_s"] = time.monotonic() - t0


# ---------------------------------------------------------------- processes


def child_setup(cfg: Config) -> None:
    try:  # Linux: ends with its parent (a timeout that kills the fuzzer leaves no rank behind)
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001
        pass
    os.environ.update(SAFE_ENV)
    for k, v in CHILD_ENV.items():
        os.environ.setdefault(k, v)
    if cfg.ranks_per_gpu > 1:
        os.environ["FERRY_SHARED_GPUS"] = "1"
    import faulthandler

    # A hung child says where every thread is: at its own deadline, and when
    # the parent gives up on it (SIGUSR1, just before it kills it).
    faulthandler.dump_traceback_later(cfg.dump_s, exit=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if os.environ.get("FUZZ_NATIVE_STACK_LIB"):
        with contextlib.suppress(OSError):
            import ctypes

            ctypes.CDLL(os.environ["FUZZ_NATIVE_STACK_LIB"])  # SIGUSR2: this thread's native stack


def result_of(fz: Optional[Fuzzer], rank, error: Optional[str] = None, error_time=None) -> dict:
    out = {"rank": rank, "error": error, "error_time": error_time, "stats": {}, "failures": []}
    if fz is not None:
        out["stats"], out["failures"] = fz.stats, fz.failures
    return out


def report(queue, msg: dict, exit_now: bool = False) -> None:
    """Sends `msg` to the parent; with `exit_now`, flushes it and ends the
    process at once (a survivor of a killed rank: closing could wait on the
    dead rank's leftovers)."""
    queue.put(msg)
    if exit_now:
        queue.close()
        queue.join_thread()
        sys.stderr.flush()
        os._exit(0)


def local_worker(cfg: Config, queue) -> None:
    """Every rank in this process (init_local)."""
    child_setup(cfg)
    fz = None
    try:
        import ferry
        import torch

        devs = [torch.device("cuda", device_of(cfg, r)) for r in range(cfg.world)]
        comm = ferry.init_local([d.index for d in devs], timeout=cfg.timeout)
        fz = Fuzzer(cfg, comm, list(range(cfg.world)), devs)
        fz.run()
        comm.close()
        queue.put(result_of(fz, "all"))
    except Exception:  # noqa: BLE001
        queue.put(result_of(fz, "all", traceback.format_exc()))


def proc_worker(cfg: Config, rank: int, port: int, queue) -> None:
    """One rank (ferry.init). In fault mode a survivor stops at its first
    ferry error and reports it with the time it came."""
    child_setup(cfg)
    if cfg.stderr_dir:  # the parent reads what ferry said before ending this process
        fd = os.open(os.path.join(cfg.stderr_dir, f"rank-{rank}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
    if cfg.exit_after_s:
        os.environ["FERRY_EXIT_AFTER_S"] = str(cfg.exit_after_s)
    os.environ["FERRY_PORT"] = str(port)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    fz = None
    try:
        import ferry
        import torch

        dev = torch.device("cuda", device_of(cfg, rank))
        torch.cuda.set_device(dev)
        comm = ferry.init(rank=rank, world=cfg.world, device=dev.index, timeout=cfg.timeout)
        fz = Fuzzer(cfg, comm, [rank], [dev])
    except Exception:  # noqa: BLE001
        report(queue, result_of(fz, rank, "setup: " + traceback.format_exc()), exit_now=True)
    queue.put({"rank": rank, "ready": time.time()})
    try:
        fz.run()
        if cfg.fault:
            # Still no error: a call every rank takes part in, then wait a
            # timeout for the watchdog to name the dead rank.
            out = fz.pools[0][: cfg.world * 4096]
            comm.all_gather(out, torch.ones(4096, dtype=torch.uint8, device=dev))
            comm.synchronize()
            deadline = time.monotonic() + cfg.timeout + 5
            while time.monotonic() < deadline:
                comm.check()
                time.sleep(0.05)
            report(
                queue, result_of(fz, rank, "no error: every call finished although a rank was killed"), True
            )
        comm.close()
        report(queue, result_of(fz, rank))
    except ferry.FerryError as exc:
        when = time.time()
        report(queue, result_of(fz, rank, f"{type(exc).__name__}: {exc}", when), exit_now=True)
    except Exception:  # noqa: BLE001
        report(queue, result_of(fz, rank, traceback.format_exc(), time.time()), exit_now=True)


CHILDREN: list = []


def build_native_stack_helper() -> None:
    """Compiles native_stack.c (beside this file) where gcc is, for the
    children to load: a hung one then prints its threads' native stacks."""
    import shutil
    import subprocess
    import tempfile

    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native_stack.c")
    if os.environ.get("FUZZ_NATIVE_STACK_LIB") or not shutil.which("gcc") or not os.path.exists(src):
        return
    out = os.path.join(tempfile.mkdtemp(prefix="fuzz-"), "native_stack.so")
    with contextlib.suppress(Exception):
        if (
            subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", out, src], capture_output=True).returncode
            == 0
        ):
            os.environ["FUZZ_NATIVE_STACK_LIB"] = out


def native_stacks(pid: int) -> None:
    """Every thread's native stack of a hung process, where gdb is installed
    (which ferry call a Python frame is stuck in, and where below it)."""
    import shutil
    import subprocess

    lib = os.environ.get("FUZZ_NATIVE_STACK_LIB")
    if lib and not shutil.which("gdb"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        with contextlib.suppress(OSError):
            for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
                libc.syscall(234, pid, int(tid), signal.SIGUSR2)  # tgkill
                time.sleep(0.3)
    if not shutil.which("gdb"):
        # Without gdb: where each thread sits in the kernel (futex: a lock;
        # ioctl: the driver), which tells a lock held elsewhere from a wait
        # on the GPU.
        names = {"202": "futex", "16": "ioctl", "7": "poll", "232": "epoll_wait", "230": "nanosleep"}
        with contextlib.suppress(OSError):
            for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
                t = f"/proc/{pid}/task/{tid}"
                read = lambda f: open(f"{t}/{f}").read().strip()  # noqa: E731
                call = read("syscall").split()[0]
                sys.stderr.write(
                    f"  thread {tid} {read('comm')}: {names.get(call, 'syscall ' + call)}, {read('wchan')}\n"
                )
        return
    with contextlib.suppress(Exception):
        run = subprocess.run(
            ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 25"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        frames = [ln for ln in run.stdout.splitlines() if ln.startswith(("#", "Thread"))]
        sys.stderr.write("\n".join(frames[:400]) + "\n")
        sys.stderr.flush()


def end_children(signum, frame) -> None:
    """SIGTERM (e.g. from `timeout`): the ranks go too."""
    for p in CHILDREN:
        if p.is_alive():
            p.kill()
    sys.exit(128 + signum)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_world(cfg: Config, deadline_s: float):
    """Runs one world; returns (results by rank, processes that hung, death
    time of the fault's victim or None)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    if cfg.procs:
        port = free_port()
        procs = {r: ctx.Process(target=proc_worker, args=(cfg, r, port, queue)) for r in range(cfg.world)}
    else:
        procs = {"all": ctx.Process(target=local_worker, args=(cfg, queue))}
    for p in procs.values():
        p.start()
    CHILDREN[:] = list(procs.values())
    results, ready, died = {}, {}, None
    victim = cfg.fault["victim"] if cfg.fault else None
    limit = time.monotonic() + deadline_s
    while time.monotonic() < limit:
        try:
            msg = queue.get(timeout=0.01)
            if "ready" in msg:
                ready[msg["rank"]] = msg["ready"]
                if cfg.fault and len(ready) == cfg.world:
                    limit = min(limit, time.monotonic() + 120 + 3 * cfg.timeout)  # ops, kill, detection
            else:
                results[msg["rank"]] = msg
        except Exception:  # noqa: BLE001
            pass
        if victim is not None and died is None and procs[victim].exitcode is not None:
            died = time.time()
        waiting = [r for r in procs if r not in results and r != victim]
        if not waiting and (victim is None or died is not None or victim in results):
            break
        if all(p.exitcode is not None for p in procs.values()):
            break
    try:  # results that arrived as the last process ended
        while True:
            msg = queue.get(timeout=0.2)
            if "ready" not in msg:
                results[msg["rank"]] = msg
    except Exception:  # noqa: BLE001
        pass
    hung = []
    for r, p in procs.items():
        p.join(3)
        if p.is_alive():
            hung.append(r)
            sys.stderr.write(f"fuzz: rank {r} hung; its threads' stacks:\n")
            sys.stderr.flush()
            with contextlib.suppress(OSError):
                os.kill(p.pid, signal.SIGUSR1)
            time.sleep(2)
            native_stacks(p.pid)
            p.kill()
            p.join(3)
    exitcodes = {r: p.exitcode for r, p in procs.items()}
    return results, hung, died, exitcodes


# ---------------------------------------------------------------- the two modes


def run_ops(args, worlds: List[int], gpus: int) -> dict:
    summary = {"passed": 0, "failed": 0, "wrong_bytes": 0, "ops": 0, "worlds": [], "failures": []}
    if args.replay >= 0:
        per = [args.replay + 1]  # planned up to it; only it runs
    else:
        per = [args.ops // len(worlds) + (1 if i < args.ops % len(worlds) else 0) for i in range(len(worlds))]
    for world, ops in zip(worlds, per):
        if ops == 0:
            continue
        cfg = make_config(args, world, gpus, ops)
        want = 1 if args.replay >= 0 else ops
        t0 = time.monotonic()
        mode = f"{world} processes" if cfg.procs else "one process"
        print(
            f"fuzz: world {world} ({mode}, {gpus} GPU(s), {cfg.ranks_per_gpu} rank(s) per GPU): {want} ops",
            file=sys.stderr,
            flush=True,
        )
        results, hung, _, codes = spawn_world(cfg, deadline_s=args.deadline)
        w = {"world": world, "procs": cfg.procs, "ops": want, "elapsed_s": round(time.monotonic() - t0, 1)}
        failed_ops, fails, errors, ran = set(), [], [], want
        for r in list(range(world)) if cfg.procs else ["all"]:
            res = results.get(r)
            if res is None:
                errors.append(f"rank {r}: no result ({'hung' if r in hung else f'exit code {codes.get(r)}'})")
                ran = 0
                continue
            st = res.get("stats") or {}
            ran = min(ran, st.get("ops", 0))
            summary["wrong_bytes"] += st.get("wrong_bytes", 0)
            for f in res.get("failures", []):
                failed_ops.add(f["op"])
                fails.append(f)
            if res.get("error"):
                errors.append(f"rank {r}: {res['error']}")
            if r in (0, "all"):
                for key in ("by_op", "by_mode", "by_algo", "with_empty_parts", "notes"):
                    w[key] = st.get(key)
                for note in st.get("notes") or []:
                    print(f"  note: {note}")
                w["ops_per_s"] = round(st.get("ops", 0) / max(st.get("elapsed_s", 0) or 1e-9, 1e-9))
        # Failed: every operation with a failure (bytes changed outside every
        # output count as one), and every one a stopped world never checked.
        n_failed = len(failed_ops - {-1}) + (1 if -1 in failed_ops else 0) + (want - ran)
        n_failed = min(n_failed, want)
        w.update(ran=ran, failed=n_failed, errors=errors)
        summary["failed"] += n_failed
        summary["passed"] += want - n_failed
        summary["ops"] += want
        for f in fails:
            f["replay"] = replay_command(args, world, f["op"]) if f["op"] >= 0 else ""
        summary["failures"] += fails
        summary["worlds"].append(w)
        print(
            f"fuzz: world {world}: {want - n_failed} passed, {n_failed} failed in {w['elapsed_s']} s"
            f" ({w.get('ops_per_s', 0)} ops/s)",
            flush=True,
        )
        for e in errors[:5]:
            print(f"  error: {e.strip()[-3000:]}")
    summary["expected_ops"] = sum(1 if args.replay >= 0 else p for p in per)
    return summary


def run_faults(args, worlds: List[int], gpus: int) -> dict:
    summary = {"trials": [], "passed": 0, "failed": 0}
    rng = random.Random(seed_of("fault", args.seed))
    for t in range(args.fault):
        world = worlds[t % len(worlds)]
        kill_op = rng.randrange(0, args.fault_ops)
        point = rng.choice(("before", "after", "timer", "armed"))
        fault = {
            "victim": rng.randrange(world),
            "kill_op": kill_op,
            "point": point,
            "delay_s": rng.uniform(0, 0.003),
        }
        cfg = make_config(args, world, gpus, kill_op + 64, fault=fault, procs=True)
        import tempfile

        cfg.stderr_dir = tempfile.mkdtemp(prefix="fuzz-fault-")
        victim_op = plan_op(cfg, kill_op)
        label = (
            f"fault trial {t + 1}/{args.fault}: world {world}, rank {fault['victim']} killed ({point}) at"
            f" {victim_op.describe()}"
        )
        print(f"fuzz: {label}", file=sys.stderr, flush=True)
        results, hung, died, codes = spawn_world(cfg, deadline_s=min(args.deadline, 300.0))
        said = {}
        for r in range(world):  # the ranks' stderr, into the log, and kept to judge exits
            with contextlib.suppress(OSError):
                path = os.path.join(cfg.stderr_dir, f"rank-{r}.err")
                said[r] = (open(path, errors="replace").read(), os.path.getmtime(path))
                sys.stderr.write(said[r][0])
        problems, latencies, exits = [], [], []
        if codes.get(fault["victim"]) != -signal.SIGKILL:
            res = results.get(fault["victim"], {})
            problems.append(
                f"rank {fault['victim']} was to be killed but ended with exit code {codes.get(fault['victim'])}"
                + (f": {res.get('error')}" if res.get("error") else "")
            )
        for r in range(world):
            if r == fault["victim"]:
                continue
            res = results.get(r)
            if res is None and codes.get(r) == 75 and cfg.exit_after_s:
                # Stuck where no error reached it; ferry's watchdog ended it
                # (FERRY_EXIT_AFTER_S) after saying why, which must name the victim.
                text, ended = said.get(r, ("", 0.0))
                if not re.search(rf"ferry: ending the process.*\brank {fault['victim']}\b", text):
                    problems.append(
                        f"rank {r}: ended by ferry without naming rank {fault['victim']}: {text[-1500:]}"
                    )
                elif died is not None and ended - died > cfg.timeout + cfg.exit_after_s + 5:
                    problems.append(f"rank {r}: ended {ended - died:.1f} s after rank {fault['victim']} died")
                else:
                    exits.append(r)
                continue
            if res is None:
                problems.append(
                    f"rank {r}: {'HUNG (killed after the deadline)' if r in hung else 'no report'}"
                )
                continue
            err = res.get("error") or ""
            if not re.search(rf"\brank {fault['victim']}\b", err):
                problems.append(
                    f"rank {r}: its error does not name rank {fault['victim']}: {err.strip()[-1500:]}"
                )
                continue
            if died is not None and res.get("error_time"):
                late = res["error_time"] - died
                latencies.append(late)
                if late > cfg.timeout + 5:
                    problems.append(f"rank {r}: named rank {fault['victim']} {late:.1f} s after it died")
            for f in res.get("failures", []):
                # A survivor may be behind the victim and meet its death in an
                # earlier operation: an error naming the victim there is the
                # detection this mode asks for, not a wrong result.
                if re.search(rf"\brank {fault['victim']}\b", f["what"]) and "Error" in f["what"]:
                    continue
                problems.append(f"rank {r}: before the kill: {f['what']} {f['desc']}")
        ok = not problems
        summary["passed" if ok else "failed"] += 1
        lat = f", named within {max(latencies):.2f} s" if latencies else ""
        if exits:
            lat += f"; rank(s) {exits} stuck inside CUDA, ended by ferry (status 75) naming it"
        print(f"fuzz: {label}: {'ok' if ok else 'FAILED'}{lat}")
        for p in problems[:8]:
            print(f"  {p}")
        summary["trials"].append(
            {
                "world": world,
                **fault,
                "op": victim_op.describe(),
                "ok": ok,
                "problems": problems,
                "latencies_s": latencies,
                "ended_by_ferry": exits,
            }
        )
    return summary


# ---------------------------------------------------------------- command line


def make_config(args, world: int, gpus: int, ops: int, fault=None, procs=None) -> Config:
    max_bytes = args.max_bytes
    return Config(
        seed=args.seed,
        world=world,
        ops=ops,
        procs=args.procs if procs is None else procs,
        gpus=gpus,
        batch=args.batch,
        max_bytes=max_bytes,
        pool_bytes=max(args.pool_mib << 20, 4 * max_bytes + (1 << 20)),
        timeout=args.timeout,
        sm_bytes=int(os.environ.get("FERRY_SM_BYTES", str(1 << 20))),
        sm_two_shot_bytes=int(os.environ.get("FERRY_SM_TWO_SHOT_BYTES", str(1 << 20))),
        ops_allowed=tuple(args.only_ops.split(",")) if args.only_ops else OPS,
        modes=tuple(args.modes.split(",")) if args.modes else MODES,
        replay=args.replay,
        progress_s=args.progress,
        fault=fault,
        dump_s=(min(args.deadline, 300.0) if fault else args.deadline)
        + 30,  # after the parent asks (SIGUSR1)
        exit_after_s=args.exit_after if fault else 0.0,
    )


def replay_command(args, world: int, index: int) -> str:
    parts = [f"python tests/gpu/fuzz.py --seed {args.seed} --world {world} --replay {index}"]
    if args.procs:
        parts.append("--procs")
    if args.gpus:
        parts.append(f"--gpus {args.gpus}")
    for flag, value, default in (
        ("--batch", args.batch, 256),
        ("--max-bytes", args.max_bytes, 4 << 20),
        ("--pool-mib", args.pool_mib, 64),
        ("--only-ops", args.only_ops, ""),
        ("--modes", args.modes, ""),
    ):
        if value != default:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ops", type=int, default=1000, help="operations in all, split evenly over the worlds")
    p.add_argument("--world", default="2,3,4,8", help="world sizes, e.g. 4 or 2,3,4,8 (default 2,3,4,8)")
    p.add_argument(
        "--procs", action="store_true", help="one process per rank (default: one process, init_local)"
    )
    p.add_argument(
        "--gpus", type=int, default=0, help="GPUs to use (default: all visible); rank r on GPU r %% N"
    )
    p.add_argument("--batch", type=int, default=256, help="operations per verification (one host sync each)")
    p.add_argument("--max-bytes", type=int, default=4 << 20, help="largest input or output per rank")
    p.add_argument("--pool-mib", type=int, default=64, help="registered output pool per rank (MiB)")
    p.add_argument(
        "--timeout", type=float, default=0.0, help="communicator timeout (default 60, fault mode 10)"
    )
    p.add_argument("--only-ops", default="", help="comma list of collectives to draw from (default all)")
    p.add_argument("--modes", default="", help="comma list of eager,repeat,prepared,graph (default all)")
    p.add_argument("--replay", type=int, default=-1, help="run only this operation (from a failure's report)")
    p.add_argument("--fault", type=int, default=0, help="fault mode: this many trials of a killed rank")
    p.add_argument(
        "--fault-ops", type=int, default=200, help="fault mode: the kill comes within this many ops"
    )
    p.add_argument("--deadline", type=float, default=3600.0, help="seconds before a world counts as hung")
    p.add_argument(
        "--exit-after",
        type=float,
        default=5.0,
        help="fault mode: the ranks' FERRY_EXIT_AFTER_S (a survivor stuck inside CUDA is ended by ferry, "
        "naming the dead rank; 0: such a survivor hangs and fails the trial)",
    )
    p.add_argument("--progress", type=float, default=5.0, help="seconds between progress lines (0: none)")
    p.add_argument("--json", default="", help="write the summary here")
    p.add_argument("--show", type=int, default=10, help="failures printed")
    args = p.parse_args(argv)
    if not args.timeout:
        args.timeout = 10.0 if args.fault else 60.0
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, end_children)
    os.environ.update(SAFE_ENV)
    for k, v in CHILD_ENV.items():
        os.environ.setdefault(k, v)
    build_native_stack_helper()
    import torch

    visible = torch.cuda.device_count()
    if visible == 0:
        print("fuzz: no GPU visible")
        return 2
    gpus = min(args.gpus or visible, visible)
    worlds = [int(w) for w in args.world.split(",")]
    if args.replay >= 0 and len(worlds) != 1:
        print("fuzz: --replay needs one --world")
        return 2
    t0 = time.monotonic()
    command = " ".join(["python", "tests/gpu/fuzz.py"] + (sys.argv[1:] if argv is None else list(argv)))
    if args.fault:
        s = run_faults(args, worlds, gpus)
        line = (
            f"fuzz fault mode: {s['passed']} passed, {s['failed']} failed ({args.fault} trials, worlds"
            f" {args.world}, seed {args.seed}, timeout {args.timeout:g} s) in {time.monotonic() - t0:.0f} s"
        )
        ok = s["failed"] == 0
    else:
        s = run_ops(args, worlds, gpus)
        line = (
            f"fuzz: {s['passed']} passed, {s['failed']} failed, {s['wrong_bytes']} wrong bytes ({s['ops']} ops,"
            f" worlds {args.world}, {'one process per rank' if args.procs else 'one process'}, {gpus} GPU(s),"
            f" seed {args.seed}) in {time.monotonic() - t0:.0f} s"
        )
        ok = s["failed"] == 0 and s["ops"] == s["expected_ops"]
        for f in s["failures"][: args.show]:
            print(f"  FAILED world {f['world']} op {f['op']} rank {f['rank']}: {f['what']}")
            if f.get("desc"):
                print(f"    {f['desc']}")
            if f.get("replay"):
                print(f"    replay: {f['replay']}")
    print(line, flush=True)
    if args.json:
        s.update(
            command=command,
            summary=line,
            seed=args.seed,
            gpus=gpus,
            gpu_name=torch.cuda.get_device_name(0),
            elapsed_s=round(time.monotonic() - t0, 1),
            ok=ok,
        )
        with open(args.json, "w") as fh:
            json.dump(s, fh, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

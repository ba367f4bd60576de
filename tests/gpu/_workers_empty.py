"""Empty calls: zero-element tensors wherever a call means something. A
zero-element torch tensor has a null data pointer (an empty slice of a
registered buffer too, where torch is concerned), and in an MoE step a rank
with no tokens sends or receives nothing. Every collective, variant and signal
kind, eager, prepared and captured into CUDA graphs:

- a zero count everywhere, with tensors of no memory (null) and with empty
  slices of the registered buffer: nothing moves, nothing raises, no byte
  around them changes;
- all_to_allv where some ranks send nothing, receive nothing, or both: every
  byte lands, the poison around each output stays, and the call is ordered in
  the stream (its input is written behind a sleeping kernel on the same stream);
- a null out on a rank that receives nothing but must find its peers' outputs
  is refused with an error that says what to pass (validated before anything
  is enqueued: the communicator goes on).

`python _workers_empty.py WORLD ALGO,ALGO,...` runs every rank in one process
(init_local; ranks on GPU r % N, several per GPU with FERRY_SHARED_GPUS=1);
`one_process_per_gpu` is a harness worker (ferry.init)."""

from __future__ import annotations

import os
import sys
import zlib

from _checks import SAFE_ENV, init, rand_bytes

OPS = ("all_gather", "all_to_all", "all_to_allv", "broadcast", "reduce_scatter", "all_reduce")
POISON = 0xA5
AROUND = 256  # poisoned bytes after each output, checked untouched


def a2av_cases(world: int) -> list:
    """(label, counts[s][d] in elements): ranks that send or receive nothing."""
    full = [[(7 * s + 3 * d) % 5 * 37 + 1 for d in range(world)] for s in range(world)]
    last = world - 1
    cases = []
    c = [row[:] for row in full]
    c[0] = [0] * world
    cases.append(("rank 0 sends nothing", c))
    c = [row[:] for row in full]
    for row in c:
        row[last] = 0
    cases.append((f"rank {last} receives nothing", c))
    c = [row[:] for row in full]
    c[1] = [0] * world
    for row in c:
        row[1] = 0
    cases.append(("rank 1 sends and receives nothing", c))
    c = [[0] * world for _ in range(world)]
    c[0][last] = 4099
    cases.append((f"only rank 0 to rank {last}", c))
    cases.append(
        (
            "every rank only to itself",
            [[full[s][d] if s == d else 0 for d in range(world)] for s in range(world)],
        )
    )
    cases.append(("nothing anywhere", [[0] * world for _ in range(world)]))
    return cases


class EmptyCalls:
    """The checks, for the local ranks of this process (all of them, or one)."""

    def __init__(self, torch, ferry, comm, ranks, devs, world):
        self.torch, self.ferry, self.comm = torch, ferry, comm
        self.ranks, self.devs, self.world = ranks, devs, world
        self.local = len(ranks) > 1
        self.main = [torch.cuda.Stream(device=d) for d in devs]
        self.cap = [torch.cuda.Stream(device=d) for d in devs]
        bufs = comm.alloc((1 << 20,), torch.uint8)
        self.bufs = bufs if self.local else [bufs]
        self.marks = [torch.zeros(1, dtype=torch.uint8, device=d) for d in devs]
        comm.reserve_scratch(world * (1 << 20))  # graphs cannot grow it
        self.fails: list = []

    def one(self, xs):
        return xs if self.local else xs[0]

    def sync(self):
        for d in {d.index for d in self.devs}:
            self.torch.cuda.synchronize(d)

    def run(self, label, name, outs, ins, mode, **kw) -> bool:
        """One call in `mode`, after the work on each rank's main stream."""
        torch, comm = self.torch, self.comm
        print(label, file=sys.stderr, flush=True)  # where a run that hangs got to
        ins_arg = None if all(x is None for x in ins) else self.one(ins)
        try:
            if mode == "eager":
                getattr(comm, name)(self.one(outs), ins_arg, stream=self.one(self.main), **kw)
            elif mode == "prepared":
                h = comm.prepare(name, self.one(outs), ins_arg, **kw)
                h.arm(stream=self.one(self.main))
                h.trigger()
                h.wait(stream=self.one(self.main))
                comm.synchronize()
                h.release()
            else:
                from fuzz import capture_per_rank, replay_per_rank

                call = lambda: getattr(comm, name)(self.one(outs), ins_arg, stream=self.one(self.cap), **kw)  # noqa: E731
                graphs = capture_per_rank(torch, self.devs, self.cap, call, [(m, 1) for m in self.marks])
                replay_per_rank(torch, self.devs, graphs, self.main)
            comm.synchronize()
            self.sync()
        except Exception as exc:  # noqa: BLE001
            self.fails.append(f"{label}: raised {exc!r}")
            return False
        return True

    def poison(self, upto: int) -> None:
        for b, s in zip(self.bufs, self.main):
            with self.torch.cuda.stream(s):
                b[: upto + AROUND].fill_(POISON)

    def untouched(self, label, k, start, end) -> None:
        seg = self.bufs[k][start:end]
        bad = int((seg != POISON).sum())
        if bad:
            self.fails.append(
                f"{label}: rank {self.ranks[k]}: {bad} bytes changed in [{start}, {end}) of its buffer"
            )

    def zero_everywhere(self, algo, signals, mode) -> None:
        """Every collective with nothing to move, null tensors and empty slices."""
        torch, W = self.torch, self.world
        for name in OPS:
            reduction = name in ("reduce_scatter", "all_reduce")
            dtype = torch.float32 if reduction else torch.bfloat16
            for form in ("null", "slice"):
                label = f"{name} zero count, {form} tensors, algo={algo} signals={signals} {mode}"
                self.poison(64)
                outs, ins = [], []
                for k, d in enumerate(self.devs):
                    if form == "null":
                        outs.append(torch.empty(0, dtype=dtype, device=d))
                        ins.append(torch.empty(0, dtype=dtype, device=d))
                    else:
                        outs.append(self.bufs[k][8:8].view(dtype))
                        ins.append(self.bufs[k][16:16].view(dtype))
                kw = dict(algo=algo, signals=signals)
                if name == "all_to_allv":
                    kw["counts"] = [[0] * W for _ in range(W)]
                if name == "broadcast":
                    kw["root"] = W - 1
                if reduction:
                    kw["op"] = "sum"
                if name == "all_reduce" and form == "slice":
                    ins = [None] * len(outs)  # in place
                if self.run(label, name, outs, ins, mode, **kw):
                    for k in range(len(self.ranks)):
                        self.untouched(label, k, 0, 64 + AROUND)

    def a2av(self, algo, signals, mode, local_copy="auto") -> None:
        """all_to_allv with ranks that send or receive nothing, byte-exact,
        ordered behind the work on each rank's stream."""
        torch, W = self.torch, self.world
        for c, (case, counts) in enumerate(a2av_cases(W)):
            for dtype in (torch.uint8, torch.bfloat16):
                es = torch.empty((), dtype=dtype).element_size()
                label = (
                    f"all_to_allv {case} {dtype} algo={algo} signals={signals} {mode} local_copy={local_copy}"
                )
                seed = lambda q: zlib.crc32(f"{label}/{q}".encode())  # noqa: B023, E731
                recv = [sum(counts[s][r] for s in range(W)) for r in range(W)]
                self.poison(max(recv) * es)
                outs, ins, exp = [], [], []
                for k, (r, d) in enumerate(zip(self.ranks, self.devs)):
                    sent = sum(counts[r]) * es
                    if sent == 0:
                        # No memory of its own (null) on some ranks, an empty
                        # slice of a plain tensor on others.
                        x = (
                            torch.empty(0, dtype=dtype, device=d)
                            if (r + c) % 2 == 0
                            else torch.zeros(64, dtype=dtype, device=d)[3:3]
                        )
                    else:
                        with torch.cuda.stream(self.main[k]):
                            # The input is written behind a sleeping kernel on
                            # the call's stream: a call that did not wait for
                            # it would send zeros.
                            x = torch.zeros(sent, dtype=torch.uint8, device=d)
                            torch.cuda._sleep(1_000_000)
                            x.copy_(rand_bytes(torch, seed(r), sent, d))
                        x = x.view(dtype)
                    ins.append(x)
                    outs.append(self.bufs[k][: recv[r] * es].view(dtype))  # empty where nothing arrives
                    pieces = []
                    for q in range(W):
                        src = rand_bytes(torch, seed(q), sum(counts[q]) * es, d)
                        at = sum(counts[q][:r]) * es
                        pieces.append(src[at : at + counts[q][r] * es])
                    exp.append(torch.cat(pieces))
                kw = dict(counts=counts, algo=algo, signals=signals, local_copy=local_copy)
                if not self.run(label, "all_to_allv", outs, ins, mode, **kw):
                    continue
                for k, r in enumerate(self.ranks):
                    n = recv[r] * es
                    got = self.bufs[k][:n]
                    bad = int((got != exp[k]).sum())
                    if bad:
                        self.fails.append(f"{label}: rank {r}: {bad} wrong bytes of {n}")
                    self.untouched(label, k, n, n + AROUND)

    def null_out_that_must_find_its_peers(self) -> None:
        """init_local only: the rank that receives nothing passes a tensor of
        its own (null) while it sends: refused on every rank before anything
        is enqueued, naming what to pass; the same call with an empty slice of
        the registered buffer then runs."""
        torch, W = self.torch, self.world
        last = W - 1
        counts = [[5] * W for _ in range(W)]
        for row in counts:
            row[last] = 0
        outs = [b[: sum(counts[s][r] for s in range(W))] for r, b in enumerate(self.bufs)]
        ins = []
        for r, d in enumerate(self.devs):
            with torch.cuda.stream(self.main[r]):  # the call's stream
                ins.append(torch.ones(sum(counts[r]), dtype=torch.uint8, device=d))
        outs[last] = torch.empty(0, dtype=torch.uint8, device=self.devs[last])
        try:
            self.comm.all_to_allv(outs, ins, counts, stream=self.main)
            self.fails.append("a null out that must locate its peers' outputs was taken")
        except self.ferry.InvalidArgumentError as exc:
            if f"out on rank {last} is empty and has no address" not in str(exc) or "[:0]" not in str(exc):
                self.fails.append(f"null out: unexpected message: {exc}")
        outs[last] = self.bufs[last][:0]
        self.run(
            "all_to_allv after the refusal, empty slice", "all_to_allv", outs, ins, "eager", counts=counts
        )

    def broadcast_other_ranks_send_nothing(self, algo, mode) -> None:
        """A broadcast's other ranks pass a null input (ignored)."""
        torch = self.torch
        n, root = 4099, 0
        self.poison(n)
        outs = [b[:n] for b in self.bufs]
        ins = []
        for k, (r, d) in enumerate(zip(self.ranks, self.devs)):
            with torch.cuda.stream(self.main[k]):  # the call's stream
                ins.append(
                    rand_bytes(torch, 7, n, d) if r == root else torch.empty(0, dtype=torch.uint8, device=d)
                )
        label = f"broadcast, other ranks' input null, algo={algo} {mode}"
        if self.run(label, "broadcast", outs, ins, mode, root=root, algo=algo):
            exp = rand_bytes(torch, 7, n, self.devs[0])
            for k, r in enumerate(self.ranks):
                bad = int((self.bufs[k][:n] != exp.to(self.devs[k])).sum())
                if bad:
                    self.fails.append(f"{label}: rank {r}: {bad} wrong bytes")
                self.untouched(label, k, n, n + AROUND)

    def all(self, algos) -> list:
        for algo in algos:
            for signals in ("copy",) if algo == "sm" else ("copy", "sm"):
                for mode in ("eager", "prepared", "graph"):
                    self.zero_everywhere(algo, signals, mode)
                    self.a2av(algo, signals, mode)
            self.a2av(algo, "auto", "eager", local_copy="peer")  # the own block through the next rank
            self.broadcast_other_ranks_send_nothing(algo, "eager")
        if self.local:
            self.null_out_that_must_find_its_peers()
        return self.fails


def one_process(world: int, algos) -> list:
    os.environ.update(SAFE_ENV)
    import ferry
    import torch

    gpus = torch.cuda.device_count()
    devs = [torch.device("cuda", r % gpus) for r in range(world)]
    comm = ferry.init_local([d.index for d in devs], timeout=30)
    try:
        return EmptyCalls(torch, ferry, comm, list(range(world)), devs, world).all(algos)
    finally:
        comm.close()


def one_process_per_gpu(rank: int, world: int, port: int) -> list:
    """harness worker: the same checks with one rank per process."""
    import ferry
    import torch

    comm = init(rank, world, port, timeout=30)
    try:
        algos = ("auto", "b2b", "pcpy", "seq", "sm")
        return EmptyCalls(torch, ferry, comm, [rank], [torch.device("cuda", rank)], world).all(algos)
    finally:
        comm.close()


if __name__ == "__main__":  # python _workers_empty.py WORLD ALGO,ALGO,...
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ.get("FERRY_TEST_DUMP_S", "240")), exit=True)
    problems = one_process(int(sys.argv[1]), sys.argv[2].split(","))
    print("\n".join(problems[:40]) or "ok")
    sys.exit(1 if problems else 0)

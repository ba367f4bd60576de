"""What each benchmarked collective needs: its buffers, the expected result,
and how ferry and NCCL issue it. One Case per (op, size) on one rank."""

from __future__ import annotations

OPS = ("all_gather", "all_to_all", "all_to_allv", "broadcast", "reduce_scatter", "all_reduce")


def skewed_counts(n: int, world: int) -> list:
    """all_to_allv's bytes from rank s to rank d for `n` bytes per rank, MoE
    style (uneven routing): a third of the pairs get a full block (n / world),
    the rest half one, so ranks send and receive different amounts, at most n
    each."""
    block = n // world
    return [[block if (2 * s + d) % 3 == 0 else block // 2 for d in range(world)] for s in range(world)]


def fits(op: str, n: int, world: int) -> bool:
    """Whether `n` bytes per rank is a valid size for `op` at this world size."""
    if op == "all_to_all":
        return n % world == 0
    if op == "all_to_allv":
        return n % (2 * world) == 0
    if op in ("reduce_scatter", "all_reduce"):
        return n % (4 * world) == 0  # float32 blocks
    return True


def sm_fits(comm, op: str, n: int, world: int) -> bool:
    """Whether the communicator's SM path takes `op` at `n` bytes per rank
    (the benchmark's sizes: an all_to_all(v) or reduce_scatter sends at most
    n / world to a peer; an all_reduce is n bytes in all, which the
    communicator counts itself, in one part per rank where it takes two shots)."""
    return comm.sm_path_takes(op, n // world if op in ("all_to_all", "all_to_allv", "reduce_scatter") else n)


def impl_options(impl: str) -> tuple:
    """(algo, signals) of a ferry impl label: ferry-<algo>, ferry-graph ('auto'
    replayed from a graph), ferry-ksig (the selector's variant with its signal
    rounds sent by a kernel: signals='kernel'), each with an optional -graph."""
    parts = impl.split("-")[1:]
    algo = parts[0] if parts and parts[0] in ("b2b", "pcpy", "seq", "sm") else "auto"
    return algo, "kernel" if "ksig" in parts else "auto"


class Case:
    """Buffers are views of `out_all` (registered, world x max bytes) and
    `inp_all` (max bytes); data is seeded per rank so every rank can build the
    expected output."""

    def __init__(self, torch, dist, comm, op, n, world, rank, out_all, inp_all, in_place=False):
        self.torch, self.dist, self.comm, self.op, self.n = torch, dist, comm, op, n
        self.world, self.rank = world, rank
        dev = out_all.device
        self.dev = dev
        out_n = {"all_gather": world * n, "reduce_scatter": n // world}.get(op, n)
        in_n = n
        if op == "all_to_allv":
            self.counts = skewed_counts(n, world)
            in_n = sum(self.counts[rank])
            out_n = sum(self.counts[q][rank] for q in range(world))
        self.out = out_all[:out_n]
        self.inp = inp_all[:in_n]
        # all_gather in place (FSDP's pattern): the input is this rank's slice
        # of the output, so neither library copies an own block. Broadcast
        # runs in place always; other ops ignore the flag.
        self.in_place = in_place and op == "all_gather"
        if self.in_place:
            self.inp = self.out[rank * n : (rank + 1) * n]
        if op in ("reduce_scatter", "all_reduce"):
            self.out, self.inp = self.out.view(torch.float32), self.inp.view(torch.float32)
        self.expected = self._expected()

    def _seeded(self, r: int):
        torch = self.torch
        g = torch.Generator(device=self.dev)
        g.manual_seed(1000003 * r + self.n)
        if self.op in ("reduce_scatter", "all_reduce"):
            return torch.randint(-8, 9, (self.n // 4,), device=self.dev, generator=g).float()
        return torch.randint(0, 256, (self.n,), dtype=torch.uint8, device=self.dev, generator=g)

    def _expected(self):
        torch, w, r, n = self.torch, self.world, self.rank, self.n
        if self.op == "all_gather":
            return torch.cat([self._seeded(q) for q in range(w)])
        if self.op == "all_to_all":
            b = n // w
            return torch.cat([self._seeded(q)[r * b : (r + 1) * b] for q in range(w)])
        if self.op == "all_to_allv":  # packed by source: what q sends r, in q's input packed by destination
            c = self.counts
            return torch.cat([self._seeded(q)[sum(c[q][:r]) : sum(c[q][: r + 1])] for q in range(w)])
        if self.op == "broadcast":
            return self._seeded(0)
        total = sum(self._seeded(q) for q in range(w))
        if self.op == "reduce_scatter":
            b = n // 4 // w
            return total[r * b : (r + 1) * b]
        return total

    def reset(self) -> None:
        """Poisoned output, fresh input (in that order: in place, the input is
        part of the output)."""
        self.out.view(self.torch.uint8).fill_(0xA5)
        self.inp.copy_(self._seeded(self.rank)[: self.inp.numel()])
        if self.op == "broadcast" and self.rank == 0:
            self.out.copy_(self.inp)

    def issue(self, impl: str, local_copy: str = "auto") -> None:
        dist, op, out, inp = self.dist, self.op, self.out, self.inp
        if impl.startswith("ferry"):
            algo, signals = impl_options(impl)
            kw = dict(algo=algo, signals=signals)
            if op in ("all_gather", "all_to_all"):
                getattr(self.comm, op)(out, inp, local_copy=local_copy, **kw)
            elif op == "all_to_allv":
                self.comm.all_to_allv(out, inp, self.counts, local_copy=local_copy, **kw)
            elif op == "broadcast":
                self.comm.broadcast(out, root=0, **kw)  # in place, like NCCL's
            elif op == "reduce_scatter":
                self.comm.reduce_scatter(out, inp, **kw)
            else:
                self.comm.all_reduce(out, inp, **kw)
        elif op == "all_gather":
            dist.all_gather_into_tensor(out, inp)
        elif op == "all_to_all":
            dist.all_to_all_single(out, inp)
        elif op == "all_to_allv":
            w, r = self.world, self.rank
            recv = [self.counts[q][r] for q in range(w)]
            dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=self.counts[r])
        elif op == "broadcast":
            dist.broadcast(out, src=0)
        elif op == "reduce_scatter":
            dist.reduce_scatter_tensor(out, inp)
        else:
            # NCCL reduces in place; timing runs on garbage that grows, the
            # checked run below starts from the input.
            dist.all_reduce(out)

    def check(self, impl: str) -> int:
        """Wrong bytes after one fresh call of `impl`."""
        self.reset()
        if self.op == "all_reduce" and not impl.startswith("ferry"):
            self.out.copy_(self.inp)
        self.issue(impl)
        return self.wrong_bytes()

    def wrong_bytes(self) -> int:
        """Bytes of the output that differ from the expected result (after a device sync)."""
        self.torch.cuda.synchronize()
        got, exp = self.out.view(self.torch.uint8), self.expected.view(self.torch.uint8)
        return int((got != exp).sum().item())

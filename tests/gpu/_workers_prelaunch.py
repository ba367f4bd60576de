"""Workers for prepared collectives and CUDA graphs (each returns a list of
failure strings; an empty list is a pass)."""

from __future__ import annotations

import os
import sys
import time
import zlib

from _checks import (
    SAFE_ENV,
    checker,
    expecter,
    init,
    rand_bytes,
)

# Every trigger with the gate in host memory, the stream and kernel triggers
# with the gate in GPU memory too.
TRIGGERS_AND_GATES = [
    ("host", "host"),
    ("stream", "host"),
    ("device", "host"),
    ("stream", "device"),
    ("device", "device"),
]


def run_prepared_all_gather(torch, ferry, h, out, inp, side, rank, world, steps, tag, check, after_arm=None):
    """Arms `h` (an all_gather of `inp` into `out`) `steps` times with each
    trigger and gate in turn; the input is written after arming (the
    collective must see it); every step is checked byte for byte.
    `after_arm(step)` runs right after each arm()."""
    n, dev = inp.numel(), inp.device
    for step in range(steps):
        how, gate = TRIGGERS_AND_GATES[step % len(TRIGGERS_AND_GATES)]
        seed = lambda s: zlib.crc32(f"{tag}/{step}/{s}".encode())  # noqa: E731
        out.fill_(0xCC)
        h.arm(gate=gate)
        if after_arm:
            after_arm(step)
        with torch.cuda.stream(side):
            inp.copy_(rand_bytes(torch, seed(rank), n, dev))
            if how == "stream":
                h.trigger(side)
            elif how == "device":
                word, value = h.device_trigger()
                ferry._native.hooks().launch_trigger_kernel(word, value, 20000, side.cuda_stream)
        if how == "host":
            side.synchronize()
            h.trigger()
        h.wait()
        check(
            f"prepared {tag} all_gather step {step} ({how} trigger, gate in {gate} memory)",
            out,
            torch.cat([rand_bytes(torch, seed(s), n, dev) for s in range(world)]),
        )


def _eager_calls_while_armed(torch, comm, out, inp, side, rank, world, check, fails, keys=12, reps=3):
    """Eager calls made between arm() and the trigger queue behind the armed
    run on the GPU. Each repeats (which makes the replay cache capture it),
    and capturing then must not leave the host waiting for that GPU work:
    the trigger comes only after these calls. Then the same calls with
    nothing armed (captured and replayed now); every output byte checked."""
    import time

    dev, n = inp.device, inp.numel()
    sizes = [1000 + 97 * k for k in range(keys)]
    eager_out = comm.alloc((sum(world * m for m in sizes),), torch.uint8)
    outs, at = [], 0
    for m in sizes:
        outs.append(eager_out[at : at + world * m])
        at += world * m

    def seed(tag, q):
        return zlib.crc32(f"armed-eager/{tag}/{q}".encode())

    for phase in ("while a handle is armed", "with nothing armed"):
        srcs = [rand_bytes(torch, seed(f"{phase}/{m}", rank), m, dev) for m in sizes]
        eager_out.fill_(0xCC)
        out.fill_(0xCC)
        torch.cuda.synchronize()
        armed = phase.startswith("while")
        h = comm.prepare("all_gather", out, inp) if armed else None
        try:
            if h:
                h.arm()
            t0 = time.monotonic()
            for o, x in zip(outs, srcs):
                for _ in range(reps):
                    comm.all_gather(o, x)
            took = time.monotonic() - t0
            if took > 5:
                fails.append(f"rank {rank}: {keys * reps} eager calls {phase} took {took:.1f} s")
            if h:
                with torch.cuda.stream(side):
                    inp.copy_(rand_bytes(torch, seed(phase, rank), n, dev))
                side.synchronize()
                h.trigger()
                h.wait()
            comm.synchronize()
        except Exception as exc:  # noqa: BLE001
            fails.append(f"rank {rank}: eager calls {phase}: {exc!r}")
            return
        finally:
            if h:
                h.release()
        if h:
            check(
                "prepared all_gather triggered after eager calls",
                out,
                torch.cat([rand_bytes(torch, seed(phase, q), n, dev) for q in range(world)]),
            )
        for o, m in zip(outs, sizes):
            check(
                f"eager all_gather of {m} B {phase}",
                o,
                torch.cat([rand_bytes(torch, seed(f"{phase}/{m}", q), m, dev) for q in range(world)]),
            )
    comm.free(eager_out)


def prelaunch_and_graphs(rank: int, world: int, port: int) -> list:
    """Prepared collectives (host, stream and device triggers, reused step after
    step), bad uses of handles, and CUDA graphs replayed 10,000 times."""

    # The documented rule for prelaunch (docs/api.md, "Prelaunch"): the input is
    # produced on a side stream after arming, and with the default 8 hardware
    # queues that stream can land behind the armed wait (seen on H200: every
    # rank's first arm timed out untriggered). Set before CUDA starts.
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"

    import ferry
    import torch

    comm = init(rank, world, port, timeout=30)
    dev = torch.device("cuda", rank)
    fails = []
    check = checker(torch, dev, rank, fails)
    expect = expecter(ferry, fails)

    n = 65536 + 3
    out = comm.alloc((world * n,), torch.uint8)
    inp = torch.empty(n, dtype=torch.uint8, device=dev)
    side = torch.cuda.Stream(device=dev)
    try:
        # Every kernel that runs between arm() and its trigger must be loaded
        # before arming (docs/api.md, "Prelaunch"): CUDA's lazy loading may
        # synchronize the context, which waits for the armed stream. Seen on
        # H200: the first arm timed out untriggered without this warm-up.
        with torch.cuda.stream(side):
            inp.copy_(rand_bytes(torch, 0, n, dev))
            word = torch.zeros(1, dtype=torch.int64, device=dev)
            ferry._native.hooks().launch_trigger_kernel(word.data_ptr(), 1, 1, side.cuda_stream)
        side.synchronize()
        h = comm.prepare("all_gather", out, inp)
        expect("not armed", h.trigger)

        spare = comm.alloc((64,), torch.uint8)

        def misuse(step):
            if step == 0:
                expect("armed already", h.arm)
            if step == 1:  # refused at once, not after the timeout
                t0 = time.monotonic()
                expect(r"synchronize: prepared collective \d+ is armed and not triggered", comm.synchronize)
                expect(r"free: prepared collective \d+ is armed and not triggered", lambda: comm.free(spare))
                if time.monotonic() - t0 > 1:
                    fails.append(f"synchronize/free while armed took {time.monotonic() - t0:.1f} s to refuse")
            if step == 3:
                expect("gate in GPU memory, which the host cannot write", h.trigger)

        run_prepared_all_gather(torch, ferry, h, out, inp, side, rank, world, 60, "pre", check, misuse)
        comm.free(spare)  # nothing armed now
        expect("used by prepared collective", lambda: comm.free(out))
        h.release()
        expect("not a prepared collective", h.trigger)
        # Prepared all_reduce (two exchanges and a kernel behind one trigger).
        x = torch.ones(world * 1000, dtype=torch.float32, device=dev) * (rank + 1)
        ar = comm.alloc((world * 1000,), torch.float32)
        with comm.prepare("all_reduce", ar, x) as hr:
            for _ in range(3):
                hr.arm()
                hr.trigger()
                hr.wait()
                check("prepared all_reduce", ar, torch.full_like(ar, world * (world + 1) / 2))

        _eager_calls_while_armed(torch, comm, out, inp, side, rank, world, check, fails)

        # CUDA graphs: all_gather, all_to_all and all_reduce captured, replayed 10,000 times.
        a2a_out = comm.alloc((world * 4096,), torch.uint8)
        a2a_in = torch.empty(world * 4096, dtype=torch.uint8, device=dev)
        g_in = torch.empty(4096, dtype=torch.uint8, device=dev)
        g_out = out[: world * 4096]
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream(device=dev)
        with torch.cuda.stream(s):
            with torch.cuda.graph(graph, stream=s):
                comm.all_gather(g_out, g_in)
                comm.all_to_all(a2a_out, a2a_in)
                comm.all_reduce(ar, x)
        for block in range(10):
            seed = lambda q: zlib.crc32(f"graph/{block}/{q}".encode())
            g_in.copy_(rand_bytes(torch, seed(rank), 4096, dev))
            a2a_in.copy_(rand_bytes(torch, seed(rank) + 1, world * 4096, dev))
            torch.cuda.synchronize()
            t0 = time.monotonic()
            for _ in range(1000):
                graph.replay()
            torch.cuda.synchronize()
            # Progress on stderr: a hang is then placed to a block of replays.
            print(
                f"rank {rank}: graph block {block} done in {time.monotonic() - t0:.3f} s",
                file=sys.stderr,
                flush=True,
            )
            check(
                f"graph all_gather after {(block + 1) * 1000} replays",
                g_out,
                torch.cat([rand_bytes(torch, seed(q), 4096, dev) for q in range(world)]),
            )
            check(
                f"graph all_to_all after {(block + 1) * 1000} replays",
                a2a_out,
                torch.cat(
                    [
                        rand_bytes(torch, seed(q) + 1, world * 4096, dev)[rank * 4096 : (rank + 1) * 4096]
                        for q in range(world)
                    ]
                ),
            )
            check("graph all_reduce", ar, torch.full_like(ar, world * (world + 1) / 2))
        del graph
        comm.synchronize()

        # Eager calls made while the user captures another stream in global
        # mode (torch's default): ferry captures the repeated call into its own
        # graph meanwhile, which must neither fail the calls nor invalidate the
        # user's capture.
        g_in.copy_(rand_bytes(torch, 4242 + rank, 4096, dev))
        torch.cuda.synchronize()
        user_graph = torch.cuda.CUDAGraph()
        cap, other = torch.cuda.Stream(device=dev), torch.cuda.Stream(device=dev)
        counter = torch.zeros(1, dtype=torch.float32, device=dev)
        try:
            with torch.cuda.stream(cap):
                with torch.cuda.graph(user_graph, stream=cap):
                    counter.add_(1)
                    for _ in range(3):
                        comm.all_gather(g_out, g_in, stream=other)
            other.synchronize()
            comm.synchronize()
            check(
                "eager all_gather during a user's global capture",
                g_out,
                torch.cat([rand_bytes(torch, 4242 + q, 4096, dev) for q in range(world)]),
            )
            user_graph.replay()
            torch.cuda.synchronize()
            if counter.item() != 1.0:
                fails.append(
                    f"rank {rank}: the user's graph ran its kernel {counter.item()} times, expected once"
                )
        except Exception as exc:  # noqa: BLE001
            fails.append(f"rank {rank}: eager calls during a user's global capture: {exc!r}")
        del user_graph
        comm.synchronize()
        # Counts that disagree between ranks: named at once, not after the timeout.
        counts = [[1] * world for _ in range(world)]
        if rank == 0:
            counts[0][0] = 2
        t0 = time.monotonic()
        src = torch.zeros(world * 2, dtype=torch.uint8, device=dev)
        expect(
            r"all_to_allv.*must match",
            lambda: (comm.all_to_allv(a2a_out[: world * 2], src, counts), comm.synchronize()),
        )
        if time.monotonic() - t0 > 5:
            fails.append(f"all_to_allv count mismatch took {time.monotonic() - t0:.1f} s to report")
    finally:
        comm.close()
    return fails


def untriggered_is_reported(gate: str, algo: str) -> list:
    """One process driving GPUs 0 and 1 arms a collective and never triggers
    it: the watchdog must report it after the timeout and open the gate (in
    GPU memory: with a stream write), so that the armed run ends and close()
    does not wait forever. algo "sm": the armed kernel spinning on the gate
    lets go too."""
    os.environ.update(SAFE_ENV)
    import ferry
    import torch

    comm = ferry.init_local([0, 1], timeout=2)
    n = 4096
    bufs = comm.alloc((2 * n,), torch.uint8)
    ins = [torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}") for i in range(2)]
    h = comm.prepare("all_gather", bufs, ins, algo=algo)
    h.arm(gate=gate)
    message = None
    deadline = time.monotonic() + 20
    while message is None and time.monotonic() < deadline:
        try:
            comm.check()
        except ferry.FerryError as exc:
            message = str(exc)
        time.sleep(0.05)
    if message is None:
        return ["no error 20 s after arming with a 2 s timeout"]
    if "never triggered" not in message:
        return [f"wrong error: {message}"]
    # A gate left shut would keep these events pending (and close() would only
    # give up on them after its own timeout).
    streams = [torch.cuda.Stream(device=f"cuda:{i}") for i in range(2)]
    h.wait(streams)
    ends = []
    for st in streams:
        ends.append(torch.cuda.Event())
        ends[-1].record(st)
    deadline = time.monotonic() + 10
    while not all(e.query() for e in ends) and time.monotonic() < deadline:
        time.sleep(0.05)
    fails = []
    if not all(e.query() for e in ends):
        fails.append("the armed run did not end after the watchdog opened its gate")
    t0 = time.monotonic()
    comm.close()
    if time.monotonic() - t0 > 10:
        fails.append(f"close() took {time.monotonic() - t0:.1f} s")
    return fails

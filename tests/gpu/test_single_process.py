"""One process driving several GPUs (ferry.init_local)."""

import _workers
import pytest
from conftest import GPU_COUNT, worlds_to_test

pytestmark = pytest.mark.multigpu

WORLDS = worlds_to_test(2, GPU_COUNT)


@pytest.fixture(params=WORLDS, ids=lambda w: f"{w}gpus")
def local_comm(request):
    import ferry
    import torch

    world = request.param
    comm = ferry.init_local(list(range(world)), timeout=60)
    bufs = comm.alloc((world * ((64 << 20) + 8) * 2,), torch.uint8)
    yield torch, comm, world, bufs
    comm.close()


def test_collectives_byte_exact(local_comm):
    torch, comm, world, bufs = local_comm
    devs = [torch.device("cuda", i) for i in range(world)]
    fails = _workers.check_collectives(torch, comm, list(range(world)), devs, world, bufs)
    assert not fails, "\n".join(fails[:20])


def test_repeated_and_multi_stream(local_comm):
    torch, comm, world, bufs = local_comm
    devs = [torch.device("cuda", i) for i in range(world)]
    ranks = list(range(world))
    fails = _workers.check_repeats(torch, comm, ranks, devs, world, bufs)
    streams = [[torch.cuda.Stream(device=d) for _ in range(2)] for d in devs]
    fails += _workers.check_repeats(torch, comm, ranks, devs, world, bufs, reps=200, streams=streams)
    fails += _workers.check_same_buffers(torch, comm, ranks, devs, world, bufs)
    fails += _workers.check_same_buffers(torch, comm, ranks, devs, world, bufs, reps=10, streams=streams)
    assert not fails, "\n".join(fails[:20])


def test_sm_path_single_process(local_comm):
    """algo "sm" with one process driving every GPU: the correctness matrix
    within its size limit and 1,000 back-to-back calls (alternating slots)."""
    torch, comm, world, bufs = local_comm
    devs = [torch.device("cuda", i) for i in range(world)]
    ranks = list(range(world))
    fails = _workers.check_collectives(torch, comm, ranks, devs, world, bufs, algos=("sm",))
    fails += _workers.check_repeats(torch, comm, ranks, devs, world, bufs, algo="sm")
    assert not fails, "\n".join(fails[:20])


def test_local_errors():
    import ferry
    import torch

    with pytest.raises(ferry.InvalidArgumentError, match="twice"):
        ferry.init_local([0, 0])
    with pytest.raises(ferry.InvalidArgumentError, match="expected 0.."):
        ferry.init_local([0, 99])
    comm = ferry.init_local([0, 1])
    t = [torch.empty(16, dtype=torch.uint8, device=f"cuda:{i}") for i in range(2)]
    with pytest.raises(ferry.InvalidArgumentError, match="pass a list"):
        comm.all_gather(t[0], t[0])
    comm.close()
    with pytest.raises(ferry.ClosedError):
        comm.close()


def test_prelaunch_and_reductions_single_process(local_comm):
    """One process, all GPUs: a prepared all_gather triggered from the host and
    from each GPU's stream, and an all_reduce, checked byte for byte."""
    import ferry

    torch, comm, world, bufs = local_comm
    devs = [torch.device("cuda", i) for i in range(world)]
    n = 4099
    outs = [b[: world * n] for b in bufs]
    ins = [torch.empty(n, dtype=torch.uint8, device=d) for d in devs]
    h = comm.prepare("all_gather", outs, ins)
    streams = [torch.cuda.Stream(device=d) for d in devs]
    for step in range(6):
        for r, d in enumerate(devs):
            ins[r].fill_((step * 16 + r) % 256)
            outs[r].fill_(0xEE)
        for d in devs:
            torch.cuda.synchronize(d)
        h.arm(gate="device" if step in (3, 5) else "host")
        if step % 2:
            h.trigger(streams)
        else:
            h.trigger()
        h.wait()
        for r, d in enumerate(devs):
            torch.cuda.synchronize(d)
            exp = torch.cat(
                [torch.full((n,), (step * 16 + q) % 256, dtype=torch.uint8, device=d) for q in range(world)]
            )
            assert torch.equal(outs[r], exp), f"step {step} rank {r}"
    h.release()
    # Each handle owns a gate word in GPU memory: 1024 at a time, and a
    # released handle's comes back.
    handles = [comm.prepare("all_gather", outs, ins) for _ in range(1024)]
    with pytest.raises(ferry.InvalidArgumentError, match="1024 prepared collectives exist already"):
        comm.prepare("all_gather", outs, ins)
    handles.pop().release()
    handles.append(comm.prepare("all_gather", outs, ins))
    for x in handles:
        x.release()
    xs = [torch.full((world * 3 + 1,), float(r + 1), device=d) for r, d in enumerate(devs)]
    ar = [b[: xs[0].numel() * 4].view(torch.float32) for b in bufs]
    comm.all_reduce(ar, xs)
    comm.synchronize()
    for r, d in enumerate(devs):
        assert torch.equal(ar[r], torch.full_like(xs[r], world * (world + 1) / 2))


@pytest.mark.parametrize("algo", ["auto", "sm"])
@pytest.mark.parametrize("gate", ["host", "device"])
def test_untriggered_prepared_collective_is_reported(gate, algo):
    """Armed and never triggered: the watchdog reports it after the timeout
    and opens the gate (in GPU memory: with a stream write), so close() and
    the GPU do not wait forever. algo "sm": the armed kernel spinning on the
    gate lets go too."""
    import time

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
    assert message is not None, "no error 20 s after arming with a 2 s timeout"
    assert "never triggered" in message, message
    # The watchdog opened the gate: the armed run ends on both GPUs (a gate
    # left shut would keep these events pending, and close() would only give
    # up on them after its own timeout).
    streams = [torch.cuda.Stream(device=f"cuda:{i}") for i in range(2)]
    h.wait(streams)
    ends = []
    for st in streams:
        ends.append(torch.cuda.Event())
        ends[-1].record(st)
    deadline = time.monotonic() + 10
    while not all(e.query() for e in ends) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(e.query() for e in ends), "the armed run did not end after the watchdog opened its gate"
    t0 = time.monotonic()
    comm.close()
    assert time.monotonic() - t0 < 10

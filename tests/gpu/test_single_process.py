"""One process driving several GPUs (ferry.init_local)."""

import _workers
import pytest
from conftest import GPU_COUNT

pytestmark = pytest.mark.multigpu

WORLDS = sorted({w for w in (2, GPU_COUNT) if 2 <= w}) or [2]


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

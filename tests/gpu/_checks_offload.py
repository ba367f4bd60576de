"""ferry.offload: a module's weights to pinned host memory and back (sleep and
wake), on one GPU (the default engine relays through peers where there are
some). Random weights, every byte compared, the same Parameter objects.
test_multipath.py runs this file in a bounded process of its own."""

import pytest

try:
    import torch
except ImportError:  # CPU-only machines: the tests are collected, and skipped (and counted) by conftest
    torch = None
import ferry  # noqa: E402
import ferry.multipath as mp  # noqa: E402
import ferry.offload as offload  # noqa: E402


def _net_class():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(4099, 1024)  # 16 MiB + 4 KiB of fp32: multipath
            self.mid = torch.nn.Linear(1024, 333)  # small, odd: one plain copy each
            self.head = torch.nn.Linear(1024, 4099, bias=False)
            self.head.weight = self.emb.weight  # tied: one Parameter
            self.register_buffer("scale", torch.arange(7, dtype=torch.float64))

        def forward(self, ids):
            h = self.emb(ids)
            return self.head(h) + self.mid(h).sum(-1, keepdim=True) * self.scale.sum()

    return Net


@pytest.fixture()
def net():
    torch.manual_seed(0)
    return _net_class()().cuda()


def _snapshot(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def test_sleep_frees_and_wake_restores_every_byte(net):
    ids = torch.randint(0, 4099, (3, 5), device="cuda")
    before = _snapshot(net)
    params = [id(p) for p in net.parameters()]
    with torch.no_grad():  # no autograd graph keeping the weights alive
        out = net(ids)
    torch.cuda.synchronize()
    used = torch.cuda.memory_allocated()
    eng = mp.Engine(devices=[0], loopback=2, chunk_bytes=1 << 20, min_bytes=2 << 20)
    state = offload.sleep(net, engine=eng)
    assert state.asleep and state.tensors == 4  # emb (tied with head), mid.weight, mid.bias, scale
    assert all(p.numel() == 0 for p in net.parameters())
    assert torch.cuda.memory_allocated() <= used - state.nbytes + (1 << 20)
    for rnd in range(3):
        state.wake()
        assert [id(p) for p in net.parameters()] == params
        assert net.head.weight is net.emb.weight
        after = _snapshot(net)
        for k in before:
            assert torch.equal(before[k], after[k]), (rnd, k)
        with torch.no_grad():
            assert torch.equal(net(ids), out)
        state.sleep()
    state.wake()
    eng.close()


def test_sleep_and_wake_errors_are_named(net):
    state = offload.sleep(net)
    with pytest.raises(ferry.InvalidArgumentError, match="asleep already"):
        state.sleep()
    state.wake()
    with pytest.raises(ferry.InvalidArgumentError, match="awake"):
        state.wake()
    with pytest.raises(ferry.InvalidArgumentError, match="no non-empty parameters"):
        offload.sleep(torch.nn.Module())
    with pytest.raises(ferry.InvalidArgumentError, match="expected one CUDA device"):
        offload.sleep(torch.nn.Linear(4, 4))
    shared = torch.nn.Module()
    base = torch.zeros(64, device="cuda")
    shared.a = torch.nn.Parameter(base[:40])
    shared.b = torch.nn.Parameter(base[32:])
    with pytest.raises(ferry.InvalidArgumentError, match="share memory"):
        offload.sleep(shared)

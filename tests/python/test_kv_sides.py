"""ferry.kv's reading of a transfer's two sides (`_sides`, `kv.Pages`), with a
stand-in for torch tensors: the regions it hands the native layer, each
layout checked once however many tensors share it, nothing read again of a
side given as Pages, and every refusal naming the tensor."""

import sys
import types

import ferry.kv as kv
import pytest
from ferry import InvalidArgumentError


class Device:
    def __init__(self, kind: str, index=None):
        self.type, self.index = kind, index

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"


class Tensor:
    """The tensor attributes ferry.kv reads, over a made-up address."""

    def __init__(self, shape, stride=None, *, dtype="bfloat16", item=2, device=("cuda", 0), ptr=1 << 32):
        self.shape, self.dtype, self._item, self._ptr = tuple(shape), dtype, item, ptr
        if stride is None:
            stride, step = [], 1
            for n in reversed(self.shape):
                stride.insert(0, step)
                step *= n
        self._stride = tuple(stride)
        self.device = Device(*device)

    is_cuda = property(lambda self: self.device.type == "cuda")
    is_cpu = property(lambda self: self.device.type == "cpu")

    def get_device(self):
        return self.device.index if self.is_cuda else -1

    reads = 0  # metadata reads of every stand-in tensor, counted

    def stride(self, dim=None):
        Tensor.reads += 1
        return self._stride if dim is None else self._stride[dim]

    def dim(self):
        return len(self.shape)

    def element_size(self):
        return self._item

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def data_ptr(self):
        Tensor.reads += 1
        return self._ptr


@pytest.fixture(autouse=True)
def fake_torch(monkeypatch):
    torch = types.ModuleType("torch")
    torch.Tensor = Tensor
    torch.cuda = types.SimpleNamespace(current_device=lambda: 3)
    monkeypatch.setitem(sys.modules, "torch", torch)


PAGE = (16, 8, 128)  # block_size, heads, head_dim
PAGE_ELEMS = 16 * 8 * 128


def stacked(tensors: int, pages: int, base: int = 1 << 32, device=("cuda", 1)):
    """list(t) of a [tensors, pages, *PAGE] GPU tensor."""
    return [
        Tensor((pages, *PAGE), ptr=base + i * pages * PAGE_ELEMS * 2, device=device) for i in range(tensors)
    ]


def page_first(tensors: int, pages: int, base: int = 1 << 40):
    """[t[:, i] for i in range(tensors)] of a pinned [pages, tensors, *PAGE] tensor."""
    stride = (tensors * PAGE_ELEMS, 8 * 128, 128, 1)
    return [
        Tensor((pages, *PAGE), stride, ptr=base + i * PAGE_ELEMS * 2, device=("cpu", None))
        for i in range(tensors)
    ]


def test_many_tensors_give_one_region_each_and_each_layout_is_checked_once(monkeypatch):
    checked = []
    region = kv._region
    monkeypatch.setattr(kv, "_region", lambda t, name: checked.append(name) or region(t, name))
    gpu, host = stacked(64, 256), page_first(64, 1024)
    device, dr, sr = kv._sides(gpu, host)
    assert device == 1
    for i in range(64):
        assert dr[i] == ((1 << 32) + i * 256 * PAGE_ELEMS * 2, PAGE_ELEMS * 2, PAGE_ELEMS * 2, 256)
        assert sr[i] == ((1 << 40) + i * PAGE_ELEMS * 2, 64 * PAGE_ELEMS * 2, PAGE_ELEMS * 2, 1024)
    # Each region is what the per-tensor reading gives.
    assert dr == [region(t, "t") for t in gpu] and sr == [region(t, "t") for t in host]
    assert checked == ["dst[0]", "src[0]"]  # one layout a side


def test_layouts_that_differ_are_each_checked():
    a = Tensor((4, 64), ptr=100)
    b = Tensor((4, 64), (128, 1), ptr=200)  # pages strided apart
    c = Tensor((1, 64), ptr=300)  # one page: its stride is the page's size
    e = Tensor((0, 64), ptr=400)  # no pages: no address
    device, dr, sr = kv._sides([a, b, c, e], [b, a, c, e])
    assert device == 0
    assert dr == [(100, 128, 128, 4), (200, 256, 128, 4), (300, 128, 128, 1), (0, 128, 128, 0)]
    assert sr == [(200, 256, 128, 4), (100, 128, 128, 4), (300, 128, 128, 1), (0, 128, 128, 0)]
    # No GPU tensor: the current GPU.
    assert kv._sides(Tensor((2, 8), device=("cpu", None)), Tensor((2, 8), device=("cpu", None)))[0] == 3


def test_refusals_name_the_tensor():
    g, h = stacked(4, 8), page_first(4, 8)
    with pytest.raises(InvalidArgumentError, match=r"dst has 4 tensors and src 3; they must pair up"):
        kv._sides(g, h[:3])
    h[2] = Tensor((8, *PAGE), dtype="float16", device=("cpu", None))
    with pytest.raises(InvalidArgumentError, match=r"dst\[2\] is bfloat16 and src\[2\] is float16"):
        kv._sides(g, h)
    h[2] = Tensor((8, 16, 8, 64), device=("cpu", None))
    with pytest.raises(
        InvalidArgumentError,
        match=r"dst\[2\] has pages of shape \(16, 8, 128\) and src\[2\] of \(16, 8, 64\)",
    ):
        kv._sides(g, h)
    h = page_first(4, 8)
    h[3] = Tensor((8, *PAGE), (PAGE_ELEMS, 8, 1024, 1), device=("cpu", None))  # heads and dims swapped
    with pytest.raises(InvalidArgumentError, match=r"src\[3\]: a page \(t\[i\]\) is not contiguous"):
        kv._sides(g, h)
    with pytest.raises(InvalidArgumentError, match=r"dst\[0\]: a 0-d tensor"):
        kv._sides([Tensor(())], [Tensor(())])
    h = page_first(4, 8)
    h[1] = Tensor((8, *PAGE), device=("meta", None))
    with pytest.raises(
        InvalidArgumentError, match=r"src\[1\] is on meta; expected cuda or \(pinned\) cpu memory"
    ):
        kv._sides(g, h)
    with pytest.raises(
        InvalidArgumentError,
        match=r"src\[0\] is on cuda:0 and dst\[0\] on cuda:1; one transfer runs on one GPU",
    ):
        kv._sides(stacked(2, 8, device=("cuda", 1)), stacked(2, 8, device=("cuda", 0)))
    with pytest.raises(TypeError, match=r"src: expected a torch.Tensor or a list of tensors"):
        kv._sides(g, "pages")


def test_pages_are_read_once_and_their_pairing_checked_once(monkeypatch):
    gpu, host = stacked(64, 256), page_first(64, 1024)
    want = kv._sides(gpu, host)
    g, h = kv.Pages(gpu), kv.Pages(host)
    assert (len(g), g.gpu, h.gpu) == (64, 1, None)
    pairs = []
    check = kv._check_pairs
    monkeypatch.setattr(kv, "_check_pairs", lambda a, b: pairs.append(1) or check(a, b))
    Tensor.reads = 0
    for _ in range(5):
        assert kv._sides(g, h) == want
    assert Tensor.reads == 0 and len(pairs) == 1  # no tensor read; the pair checked on first use
    assert kv._sides(h, g) == (1, want[2], want[1])  # the other direction: a pair of its own
    assert len(pairs) == 2
    # One side as Pages, the other a list: the list is read as before.
    assert kv._sides(g, host) == want and kv._sides(gpu, h) == want
    # A Pages made per call does not grow the one it pairs with, and what it
    # remembers keeps nothing alive: two Pages used both ways go with their
    # last reference, not at a later garbage collection.
    for _ in range(40):
        kv._sides(g, kv.Pages(host))
    assert len(g._paired) <= 16
    import gc
    import weakref

    gc.disable()
    try:
        a, b = kv.Pages(stacked(4, 8)), kv.Pages(page_first(4, 8))
        kv._sides(a, b), kv._sides(b, a)
        gone = weakref.ref(a)
        del a, b
        assert gone() is None
    finally:
        gc.enable()


def test_pages_refusals_name_the_tensor():
    with pytest.raises(
        InvalidArgumentError, match=r"pages: pages\[0\] is on cuda:0 and pages\[1\] on cuda:1"
    ):
        kv.Pages([Tensor((4, 8), device=("cuda", 0)), Tensor((4, 8), device=("cuda", 1))])
    with pytest.raises(InvalidArgumentError, match=r"pages\[1\] is on meta"):
        kv.Pages([Tensor((4, 8)), Tensor((4, 8), device=("meta", None))])
    with pytest.raises(InvalidArgumentError, match=r"pages\[0\]: a page \(t\[i\]\) is not contiguous"):
        kv.Pages(Tensor((4, 8, 2), (16, 1, 8)))
    with pytest.raises(TypeError, match=r"pages: expected a torch.Tensor or a list of tensors"):
        kv.Pages("cache")
    g = kv.Pages(stacked(4, 8, device=("cuda", 1)))
    with pytest.raises(InvalidArgumentError, match=r"dst has 4 tensors and src 3"):
        kv._sides(g, kv.Pages(page_first(3, 8)))
    with pytest.raises(InvalidArgumentError, match=r"dst\[0\] is bfloat16 and src\[0\] is float16"):
        kv._sides(g, kv.Pages([Tensor((8, *PAGE), dtype="float16", device=("cpu", None))] * 4))
    with pytest.raises(InvalidArgumentError, match=r"src is on cuda:0 and dst on cuda:1"):
        kv._sides(g, kv.Pages(stacked(4, 8, device=("cuda", 0))))
    with pytest.raises(InvalidArgumentError, match=r"dst is on cuda:0 and src on cuda:1"):
        kv._sides(stacked(4, 8, device=("cuda", 0)), g)

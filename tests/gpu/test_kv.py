"""Paged KV transfers on one GPU: every mode and direction byte-exact against
torch indexing on random data with poisoned destinations; the layouts serving
engines use; odd and zero sizes; unaligned pages; index lists of every kind;
stream order, concurrency and graph replay; prepared transfers; bad input."""

import random
import time
import zlib

import pytest
from _checks import SmHold

MODES = ["per_page", "batched", "streams", "kernel", "auto"]
POISON = 0xA5


def _torch():
    import torch

    return torch


def rand_bytes(shape, device="cpu", gen=None):
    torch = _torch()
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen).to(device)


def pinned(shape, dtype):
    import ferry.kv as kv

    return kv.pinned_empty(shape, dtype)


def fill_random(t):
    torch = _torch()
    b = t.view(torch.uint8) if t.dtype != torch.uint8 else t
    b.copy_(torch.randint(0, 256, b.shape, dtype=torch.uint8))


def reference(dst_before, src, dst_ids, src_ids):
    out = dst_before.clone()
    if len(dst_ids):
        out[list(dst_ids)] = src[list(src_ids)]
    return out


def make_side(kind, where, pages, page_shape, dtype, layers=3):
    """Tensors of one side in a serving engine's layout; returns (side, flat list of page tensors)."""
    torch = _torch()

    def alloc(shape):
        if where == "host":
            t = pinned(shape, dtype)
        else:
            t = torch.empty(shape, dtype=dtype, device="cuda")
        fill_random(t)
        return t

    if kind == "one":  # page-first (SGLang page_first, vLLM cross-layer page)
        t = alloc((pages, *page_shape))
        return t, [t]
    if kind == "layers":  # a list of per-layer tensors (SGLang layer-first as list(t))
        big = alloc((layers, pages, *page_shape))
        ts = list(big)
        return ts, ts
    if kind == "vllm":  # per layer [2, blocks, ...]: K and V views
        ts = []
        for _ in range(layers):
            t = alloc((2, pages, *page_shape))
            ts += [t[0], t[1]]
        return ts, ts
    if kind == "strided":  # page-first with layers inside the page: each layer's pages strided apart
        big = alloc((pages, layers, *page_shape))
        ts = [big[:, i] for i in range(layers)]
        return ts, ts
    raise ValueError(kind)


def as_bytes(t):
    torch = _torch()
    return t.cpu().contiguous().view(torch.uint8).reshape(t.shape[0], -1)


def check_copy(kv, dst_list, src_list, dst_ids, src_ids, sides=None, **kw):
    """Copies with `sides` (dst, src) if given (e.g. kv.Pages of the lists),
    else with the lists, and checks every page of every tensor."""
    torch = _torch()
    for t in dst_list:
        t.fill_(POISON if t.dtype == torch.uint8 else -3.0)
    before = [as_bytes(t) for t in dst_list]
    srcs = [as_bytes(t) for t in src_list]
    dst = dst_list if len(dst_list) > 1 else dst_list[0]
    src = src_list if len(src_list) > 1 else src_list[0]
    if sides is not None:
        dst, src = sides
    rep = kv.copy_blocks(dst, src, dst_ids, src_ids, **kw)
    torch.cuda.synchronize()
    di = [int(x) for x in (dst_ids.tolist() if hasattr(dst_ids, "tolist") else dst_ids)]
    si = [int(x) for x in (src_ids.tolist() if hasattr(src_ids, "tolist") else src_ids)]
    for r, (d, b, s) in enumerate(zip(dst_list, before, srcs)):
        want = reference(b, s, di, si)
        got = as_bytes(d)
        if not torch.equal(got, want):
            bad = (got != want).any(dim=1).nonzero().flatten().tolist()
            raise AssertionError(f"{kw} region {r}: pages differ {bad[:10]}")
    return rep


@pytest.fixture(scope="module")
def kv():
    import ferry.kv as kv

    torch = _torch()
    torch.manual_seed(0)
    return kv


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d"])
@pytest.mark.parametrize("layout", ["one", "layers", "vllm", "strided"])
def test_modes_directions_layouts_byte_exact(kv, mode, direction, layout):
    torch = _torch()
    rng = random.Random(hash((mode, direction, layout)) & 0xFFFF)
    pages = 40
    src_where, dst_where = {"h2d": ("host", "gpu"), "d2h": ("gpu", "host"), "d2d": ("gpu", "gpu")}[direction]
    src, src_list = make_side(layout, src_where, pages, (16, 2, 8), torch.bfloat16)
    dst, dst_list = make_side(layout, dst_where, pages + 7, (16, 2, 8), torch.bfloat16)
    n = 25
    dst_ids = rng.sample(range(pages + 7), n)
    src_ids = [rng.randrange(pages) for _ in range(n)]
    rep = check_copy(kv, dst_list, src_list, dst_ids, src_ids, mode=mode)
    assert rep["direction"] == direction
    if mode != "auto":
        assert rep["strategy"] == mode
    assert (rep["sms"] > 0) == (rep["strategy"] == "kernel")


@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d"])
def test_kernel_many_tasks_per_warp_byte_exact(kv, direction):
    """Requests with more warp tasks than warps, as a long prefix makes:
    four in a row, on two streams in turn, each checked against the
    reference before the next; then odd page bytes with a single warp taking
    every task."""
    torch = _torch()
    rng = random.Random(hash(("many", direction)) & 0xFFFF)
    pages = 700
    src_where, dst_where = {"h2d": ("host", "gpu"), "d2h": ("gpu", "host"), "d2d": ("gpu", "gpu")}[direction]
    src, src_list = make_side("vllm", src_where, pages, (16, 2, 8), torch.bfloat16)
    dst, dst_list = make_side("vllm", dst_where, pages + 50, (16, 2, 8), torch.bfloat16)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for i in range(4):
        n = rng.choice([pages, 333, 513])
        dst_ids = rng.sample(range(pages + 50), n)
        src_ids = [rng.randrange(pages) for _ in range(n)]
        with torch.cuda.stream(streams[i % 2]):
            rep = check_copy(kv, dst_list, src_list, dst_ids, src_ids, mode="kernel")
        assert rep["strategy"] == "kernel" and rep["sms"] > 0
    u8 = {
        "host": lambda n: pinned((n, 4099), torch.uint8),
        "gpu": lambda n: torch.empty((n, 4099), dtype=torch.uint8, device="cuda"),
    }
    s8, d8 = u8[src_where](40), u8[dst_where](45)
    fill_random(s8)
    dst_ids = rng.sample(range(45), 30)
    src_ids = [rng.randrange(40) for _ in range(30)]
    rep = check_copy(kv, [d8], [s8], dst_ids, src_ids, mode="kernel", kernel_blocks=1, kernel_threads=32)
    assert rep["sms"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_odd_sizes_unaligned_pages_and_runs(kv, mode):
    torch = _torch()
    rng = random.Random(7)
    for page_bytes in (1, 3, 105, 4096 + 5, 64 * 1024 + 1):
        pages = 33
        # Unaligned: every page starts at an odd byte offset of the buffer.
        host_buf = pinned((pages * page_bytes + 1,), torch.uint8)
        fill_random(host_buf)
        host = host_buf[1:].view(pages, page_bytes)
        gpu = torch.empty((pages + 3) * page_bytes + 3, dtype=torch.uint8, device="cuda")[3:].view(
            pages + 3, page_bytes
        )
        # Sorted destinations and sources: runs merge.
        dst_ids = sorted(rng.sample(range(pages + 3), 20))
        src_ids = sorted(rng.sample(range(pages), 20))
        check_copy(kv, [gpu], [host], dst_ids, src_ids, mode=mode)
        check_copy(kv, [host], [gpu], src_ids, dst_ids, mode=mode)


@pytest.mark.parametrize("mode", MODES)
def test_index_list_kinds_and_zero_pages(kv, mode):
    torch = _torch()
    import numpy as np

    host = pinned((64, 512), torch.uint8)
    fill_random(host)
    gpu = torch.empty((64, 512), dtype=torch.uint8, device="cuda")
    ids_d, ids_s = [5, 9, 1, 60], [0, 63, 7, 8]
    for d, s in [
        (ids_d, ids_s),
        (np.array(ids_d), np.array(ids_s, dtype=np.int32)),
        (torch.tensor(ids_d, dtype=torch.int32), torch.tensor(ids_s, dtype=torch.int32)),
        (torch.tensor(ids_d), torch.tensor(ids_s)),
        (torch.tensor(ids_d, device="cuda"), torch.tensor(ids_s, device="cuda")),
        (
            torch.tensor(ids_d, dtype=torch.int32, device="cuda"),
            torch.tensor(ids_s, dtype=torch.int32, device="cuda"),
        ),
    ]:
        check_copy(kv, [gpu], [host], d, s, mode=mode)
    for empty in ([], torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64, device="cuda")):
        rep = kv.copy_blocks(gpu, host, empty, empty, mode=mode)
        assert rep["bytes"] == 0
    # Zero pages on one side and zero-sized pages are nothing to do, not an error.
    kv.copy_blocks(torch.empty((0, 512), dtype=torch.uint8, device="cuda"), host[:0], [], [], mode=mode)
    kv.copy_blocks(torch.empty((8, 0), dtype=torch.uint8, device="cuda"), host[:8, :0], [1], [2], mode=mode)
    torch.cuda.synchronize()


ORDER_OPTIONS = {
    "plain": {},
    "urgent": dict(urgent=True),  # on ferry's urgent stream, joined by events
    "sliced": dict(slice_bytes=100_000),  # on ferry's slice streams
}


@pytest.mark.parametrize("options", list(ORDER_OPTIONS))
@pytest.mark.parametrize("where", ["own", "default"])
@pytest.mark.parametrize("mode", ["batched", "streams", "kernel", "per_page", "auto"])
def test_stream_order_save_sees_writes_and_fetch_feeds_next_kernel(kv, mode, where, options):
    """On a stream of the caller's, and on torch's default stream (the legacy
    one, where copy-engine strategies run on ferry's stream joined by events);
    plain, urgent and in slices."""
    kw = ORDER_OPTIONS[options]
    if mode == "kernel" and kw.get("slice_bytes"):
        pytest.skip("a kernel is not sliced")
    torch = _torch()
    s = torch.cuda.Stream() if where == "own" else torch.cuda.default_stream()
    pages, shape = 256, (16, 8, 64)
    gpu = torch.zeros((pages, *shape), dtype=torch.float16, device="cuda")
    host = pinned((pages, *shape), torch.float16)
    host.zero_()
    ids = list(range(0, pages, 2))
    with torch.cuda.stream(s):
        for rep in range(3):
            # A kernel writes the KV; the save right after it in the stream must see every write.
            torch.cuda._sleep(2_000_000)
            gpu.copy_(torch.randn_like(gpu))
            expect = gpu.clone()
            kv.copy_blocks(host, gpu, ids, ids, mode=mode, **kw)
            # The fetch back into other pages, then a kernel that reads them.
            kv.copy_blocks(gpu, host, [i + 1 for i in ids], ids, mode=mode, **kw)
            total = gpu[1::2].float().sum()
            want = expect[0::2].float().sum()
            s.synchronize()
            assert torch.equal(host[0::2], expect[0::2].cpu()), f"save missed writes (rep {rep})"
            assert torch.equal(gpu[1::2].cpu(), expect[0::2].cpu()), f"fetch wrong (rep {rep})"
            assert torch.allclose(total, want)


@pytest.mark.parametrize("mode", ["batched", "streams", "per_page", "auto"])
def test_settled_source_fetch_byte_exact_and_ordered_before_the_reader(kv, mode):
    """settled_source=True lets a fetch read host pages out of stream order
    (nothing queued before writes them here: the host wrote them before the
    call); the pages land whole, merged runs and scattered ones, and the
    kernel after the fetch in the stream reads all of them."""
    torch = _torch()
    rng = random.Random(zlib.crc32(mode.encode()))
    for layout in ("one", "vllm"):
        src, src_list = make_side(layout, "host", 80, (2, 3000), torch.uint8)
        dst, dst_list = make_side(layout, "gpu", 90, (2, 3000), torch.uint8)
        dst_ids = list(range(10, 40)) + rng.sample(range(40, 90), 25)
        src_ids = list(range(30, 60)) + [rng.randrange(80) for _ in range(25)]
        check_copy(kv, dst_list, src_list, dst_ids, src_ids, mode=mode, settled_source=True)
    host = pinned((128, 65536), torch.uint8)
    fill_random(host)
    gpu = torch.full((128, 65536), POISON, dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(2_000_000)
        kv.copy_blocks(gpu, host, list(range(128)), list(range(127, -1, -1)), mode=mode, settled_source=True)
        total = gpu.to(torch.int64).sum()
    s.synchronize()
    assert torch.equal(gpu.cpu(), host.flip(0))
    assert int(total) == int(host.to(torch.int64).sum()), "the reader ran before the fetch landed"


def test_concurrent_calls_on_two_streams_and_urgent(kv):
    torch = _torch()
    pages = 512
    host = pinned((pages, 8192), torch.uint8)
    fill_random(host)
    gpu = torch.empty((pages, 8192), dtype=torch.uint8, device="cuda")
    gpu.fill_(POISON)
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    for i in range(8):
        with torch.cuda.stream(a):
            kv.copy_blocks(gpu, host, list(range(i, pages, 16)), list(range(i, pages, 16)), mode="batched")
        with torch.cuda.stream(b):
            j = i + 8
            kv.copy_blocks(
                gpu,
                host,
                list(range(j, pages, 16)),
                list(range(j, pages, 16)),
                mode="kernel",
                urgent=(i % 2 == 0),
            )
    torch.cuda.synchronize()
    assert torch.equal(gpu.cpu(), host)


@pytest.mark.parametrize("mode", ["batched", "per_page", "streams", "auto"])
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d"])
def test_sliced_submission_byte_exact(kv, mode, direction):
    """Slices cut pages and merged runs at odd byte counts; every byte lands
    once, repeated on two streams at once, and the work after sees it all."""
    torch = _torch()
    rng = random.Random(hash((mode, direction)) & 0xFFFF)
    pages = 96
    src_where, dst_where = {"h2d": ("host", "gpu"), "d2h": ("gpu", "host"), "d2d": ("gpu", "gpu")}[direction]
    for layout in ("one", "vllm", "layers"):
        src, src_list = make_side(layout, src_where, pages, (3, 1000), torch.uint8)
        dst, dst_list = make_side(layout, dst_where, pages + 5, (3, 1000), torch.uint8)
        run = list(range(20, 50))  # a merged run of 30 pages, then scattered ones
        dst_ids = run + rng.sample([i for i in range(pages + 5) if i not in run], 30)
        src_ids = run + [rng.randrange(pages) for _ in range(30)]
        for slice_bytes in (1, 4099, 3000 * 7, 1 << 30):
            check_copy(kv, dst_list, src_list, dst_ids, src_ids, mode=mode, slice_bytes=slice_bytes)
    # Two sliced fetches at once on two streams, each followed by a consumer on its stream.
    host = pinned((256, 65536), torch.uint8)
    fill_random(host)
    outs = [torch.full((256, 65536), POISON, dtype=torch.uint8, device="cuda") for _ in range(2)]
    sums = []
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for k, st in enumerate(streams):
        with torch.cuda.stream(st):
            ids = list(range(k, 256, 2))
            kv.copy_blocks(outs[k], host, ids, ids, mode="batched", slice_bytes=256 * 1024 + 3)
            sums.append(outs[k][ids].to(torch.int64).sum())
    torch.cuda.synchronize()
    for k in range(2):
        ids = list(range(k, 256, 2))
        assert torch.equal(outs[k][ids].cpu(), host[ids])
        assert int(sums[k]) == int(host[ids].to(torch.int64).sum()), "a consumer ran before the slices landed"


def test_bad_slice_size_is_named(kv):
    torch = _torch()
    host = pinned((4, 4096), torch.uint8)
    gpu = torch.empty((4, 4096), dtype=torch.uint8, device="cuda")
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="slice_bytes"):
            kv.copy_blocks(gpu, host, [0], [0], slice_bytes=bad)


@pytest.mark.parametrize(
    "mode,slice_bytes",
    [("batched", 0), ("kernel", 0), ("per_page", 0), ("streams", 0), ("batched", 10000), ("per_page", 10000)],
)
def test_graph_capture_and_replay(kv, mode, slice_bytes):
    torch = _torch()
    pages = 64
    host = pinned((pages, 2048), torch.uint8)
    gpu = torch.empty((pages, 2048), dtype=torch.uint8, device="cuda")
    ids_d, ids_s = list(range(10, 40)), list(range(30, 0, -1))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        kv.copy_blocks(gpu, host, ids_d, ids_s, mode=mode, slice_bytes=slice_bytes)  # warm-up outside capture
        with torch.cuda.graph(g, stream=s):
            kv.copy_blocks(gpu, host, ids_d, ids_s, mode=mode, slice_bytes=slice_bytes)
    torch.cuda.synchronize()
    for _ in range(3):
        fill_random(host)
        gpu.fill_(POISON)
        g.replay()
        torch.cuda.synchronize()
        want = torch.full_like(host, POISON)
        want[ids_d] = host[ids_s]
        assert torch.equal(gpu.cpu(), want)


def stacked(where, regions, pages, page_shape, dtype, offset=0):
    """list(t) of one [regions, pages, ...] tensor (every layer's K and V in
    one allocation), its storage starting `offset` bytes into a buffer."""
    torch = _torch()
    page = 1
    for x in page_shape:
        page *= x
    n = regions * pages * page * torch.empty((), dtype=dtype).element_size()
    if where == "host":
        buf = pinned((n + offset,), torch.uint8)
    else:
        buf = torch.empty(n + offset, dtype=torch.uint8, device="cuda")
    t = buf[offset:].view(dtype).view(regions, pages, *page_shape)
    fill_random(t)
    return list(t)


def page_first(where, regions, pages, page_shape, dtype):
    """The regions of one [pages, regions, ...] tensor (a page's regions end
    to end, as SGLang's page-first host layout keeps them), each a view of
    pages strided apart."""
    torch = _torch()
    if where == "host":
        t = pinned((pages, regions) + tuple(page_shape), dtype)
    else:
        t = torch.empty((pages, regions) + tuple(page_shape), dtype=dtype, device="cuda")
    fill_random(t)
    return [t[:, r] for r in range(regions)]


@pytest.mark.parametrize("mode", ["batched", "streams", "auto", "per_page"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
@pytest.mark.parametrize("first", ["host", "gpu", "both"])
def test_page_first_side_goes_pitched_at_any_width(kv, mode, direction, first):
    """One side page first, the other stacked: a page's rows lie end to end
    on one side, so pages wider than FERRY_KV_PITCHED_ROW_BYTES still go as
    one pitched copy each; byte-exact, with slices, and unpitched on request.
    Both sides page first: each page one span, one plain copy."""
    torch = _torch()
    rng = random.Random(zlib.crc32(f"page-first {mode} {direction} {first}".encode()))
    regions, pages, shape = 6, 40, (8, 2048)  # 32 KB pages of bf16
    host = page_first("host", regions, pages, shape, torch.bfloat16) if first in ("host", "both") else None
    gpu = page_first("gpu", regions, pages + 5, shape, torch.bfloat16) if first in ("gpu", "both") else None
    host = host or stacked("host", regions, pages, shape, torch.bfloat16)
    gpu = gpu or stacked("gpu", regions, pages + 5, shape, torch.bfloat16)
    dst, src = (gpu, host) if direction == "h2d" else (host, gpu)
    n = 25
    dst_ids = rng.sample(range(len(dst[0])), n)
    src_ids = rng.sample(range(len(src[0])), n)
    rep = check_copy(kv, dst, src, dst_ids, src_ids, mode=mode)
    if rep["strategy"] in ("batched", "streams"):
        assert rep["copies"] == n and rep["pitched"] == (0 if first == "both" else n), rep
    else:
        assert rep["pitched"] == 0, rep
    assert check_copy(kv, dst, src, dst_ids, src_ids, mode=mode, pitched=False)["pitched"] == 0
    if mode != "per_page":
        for slice_bytes in (50000, 1 << 20):
            check_copy(kv, dst, src, dst_ids, src_ids, mode=mode, slice_bytes=slice_bytes)


@pytest.mark.parametrize("mode", ["batched", "kernel", "auto"])
def test_pages_made_once_serve_every_call(kv, mode):
    """kv.Pages of each side, made once (every layer's K and V: 16 tensors a
    side): calls in both directions, repeated with new pages, and a prepared
    fetch move the same bytes as the tensor lists, every page checked."""
    torch = _torch()
    rng = random.Random(zlib.crc32(f"pages {mode}".encode()))
    regions, pages, shape = 16, 40, (16, 2, 8)
    gpu = stacked("gpu", regions, pages + 5, shape, torch.bfloat16)
    host = page_first("host", regions, pages, shape, torch.bfloat16)
    g, h = kv.Pages(gpu), kv.Pages(host)
    assert len(g) == regions and g.gpu == torch.cuda.current_device() and h.gpu is None
    for dst, src, sides in ((gpu, host, (g, h)), (host, gpu, (h, g))):
        for _ in range(3):
            dst_ids = rng.sample(range(len(dst[0])), 25)
            src_ids = rng.sample(range(len(src[0])), 25)
            check_copy(kv, dst, src, dst_ids, src_ids, sides=sides, mode=mode)
    dst_ids, src_ids = rng.sample(range(pages + 5), 20), rng.sample(range(pages), 20)
    for t in gpu:
        t.fill_(-3.0)
    before, srcs = [as_bytes(t) for t in gpu], [as_bytes(t) for t in host]
    fetch = kv.prepare(g, h, dst_ids, src_ids)
    fetch.arm()
    fetch.trigger()
    fetch.wait()
    torch.cuda.synchronize()
    for r, (t, b, s) in enumerate(zip(gpu, before, srcs)):
        assert torch.equal(as_bytes(t), reference(b, s, dst_ids, src_ids)), f"prepared: tensor {r} differs"
    import ferry

    with pytest.raises(ferry.InvalidArgumentError, match=r"dst has 16 tensors and src 15"):
        kv.copy_blocks(g, kv.Pages(host[:15]), [0], [0])


def _arm_bounded(t, what):
    """Arms `t` in a thread: a blocked arm() (its stream's queue full behind
    the gate) fails the test instead of hanging it; the trigger lets it go."""
    import threading

    arming = threading.Thread(target=t.arm, daemon=True)
    arming.start()
    arming.join(30)
    blocked = arming.is_alive()
    t.trigger()
    arming.join(30)
    assert not arming.is_alive(), f"{what}: arm() still blocked after the trigger"
    assert not blocked, f"{what}: arm() blocked while enqueueing behind the gate"
    t.wait()


@pytest.mark.parametrize("mode", ["batched", "per_page"])
def test_prepared_transfers_count_host_calls(kv, mode):
    """An armed transfer's host calls wait in a stream's queue behind the gate,
    and 1024 of them blocked the host (batched calls, pitched copies or
    per-page copies alike, whatever their rows). prepare() counts calls
    against FERRY_KV_ARMED_MAX (512): at the limit arming returns and the
    copies land byte-exact once triggered; one call more is refused, naming
    the knob."""
    torch = _torch()
    rng = random.Random(zlib.crc32(mode.encode()))
    # batched: 512 pitched copies of 48 rows (24,576 rows); per_page: 512 copies of one tensor.
    regions, pages = (48, 512) if mode == "batched" else (1, 512)
    space = pages + 10
    if regions > 1:
        host = page_first("host", regions, space, (4096,), torch.uint8)
        gpu = stacked("gpu", regions, space, (4096,), torch.uint8)
    else:
        host = [pinned((space, 4096), torch.uint8)]
        gpu = [torch.empty((space, 4096), dtype=torch.uint8, device="cuda")]
        fill_random(host[0])
    ids_d, ids_s = rng.sample(range(space), pages), rng.sample(range(space), pages)
    for x in gpu:
        x.fill_(POISON)
    side = lambda ts: ts if len(ts) > 1 else ts[0]  # noqa: E731
    t = kv.prepare(side(gpu), side(host), ids_d, ids_s, mode=mode, merge=False)
    assert t.copies == pages
    _arm_bounded(t, f"{mode}: {pages} calls")
    torch.cuda.synchronize()
    for g, h in zip(gpu, host):
        want = torch.full((space, 4096), POISON, dtype=torch.uint8)
        want[ids_d] = h[ids_s]
        assert torch.equal(g.cpu(), want)
    free_d = next(i for i in range(space) if i not in ids_d)
    with pytest.raises(Exception, match="FERRY_KV_ARMED_MAX"):
        kv.prepare(side(gpu), side(host), ids_d + [free_d], ids_s + [0], mode=mode, merge=False)


@pytest.mark.parametrize("mode", ["batched", "streams", "auto", "per_page"])
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d"])
def test_pitched_copies_byte_exact(kv, mode, direction):
    """A page's tensors at one stride on both sides go as one pitched copy
    (rows: the tensors), runs of pages as wider rows; odd page bytes at odd
    offsets; slices cut between rows and inside them; the same request with
    pitched=False and the baseline as plain copies."""
    torch = _torch()
    rng = random.Random(zlib.crc32(f"{mode} {direction}".encode()))
    src_where, dst_where = {"h2d": ("host", "gpu"), "d2h": ("gpu", "host"), "d2d": ("gpu", "gpu")}[direction]
    # The last: pages wider than FERRY_KV_PITCHED_ROW_BYTES (8 KB) go as plain copies.
    cases = (
        (8, (16, 2, 8), torch.bfloat16, 0, 2),
        (5, (3, 333), torch.uint8, 3, 8),
        (4, (3, 4096), torch.uint8, 0, 16),
    )
    for regions, page_shape, dtype, src_off, dst_off in cases:
        pages = 60
        src = stacked(src_where, regions, pages, page_shape, dtype, src_off)
        dst = stacked(dst_where, regions, pages + 9, page_shape, dtype, dst_off)
        # A run of 8 pages on both sides (under 8 KB), then scattered ones;
        # page 18 is left out so that the run cannot grow past 8 KB.
        run = list(range(10, 18))
        dst_ids = run + rng.sample([i for i in range(pages + 9) if i not in run and i != 18], 30)
        src_ids = run + [rng.choice([i for i in range(pages) if i != 18]) for _ in range(30)]
        rep = check_copy(kv, dst, src, dst_ids, src_ids, mode=mode)
        # Within one GPU nothing goes pitched: a 2D copy there may run on SMs.
        if rep["strategy"] in ("batched", "streams") and page_shape[-1] < 4096 and direction != "d2d":
            # One pitched copy per page, the run as one (scattered pages may
            # happen to form short runs too).
            assert rep["pitched"] == rep["copies"] and 20 <= rep["copies"] <= 31, rep
        else:
            assert rep["pitched"] == 0, rep
        assert check_copy(kv, dst, src, dst_ids, src_ids, mode=mode, pitched=False)["pitched"] == 0
        if mode != "per_page":
            for slice_bytes in (1000, 3 * 333 * 2 + 7, 1 << 20):
                check_copy(kv, dst, src, dst_ids, src_ids, mode=mode, slice_bytes=slice_bytes)
    # Regions whose stride breaks halfway: two ladders (and a lone region) in one request.
    a = stacked("host", 4, 20, (512,), torch.uint8)
    b = stacked("host", 3, 20, (512,), torch.uint8)
    ga = stacked("gpu", 4, 25, (512,), torch.uint8)
    gb = stacked("gpu", 3, 25, (512,), torch.uint8)
    extra_h, extra_g = stacked("host", 1, 20, (512,), torch.uint8), stacked("gpu", 1, 25, (512,), torch.uint8)
    ids_d, ids_s = rng.sample(range(25), 15), rng.sample(range(20), 15)
    if direction == "h2d":
        rep = check_copy(kv, ga + extra_g + gb, a + extra_h + b, ids_d, ids_s, mode=mode)
        if rep["strategy"] in ("batched", "streams"):
            # Runs of pages adjacent on both sides merge: 15 pages less the merges, per ladder or region.
            merges = sum(
                ids_d[i + 1] == ids_d[i] + 1 and ids_s[i + 1] == ids_s[i] + 1 for i in range(len(ids_d) - 1)
            )
            runs = len(ids_d) - merges
            assert rep["pitched"] == 2 * runs and rep["copies"] == 3 * runs, rep


def test_pitched_copies_in_a_graph_and_prepared(kv):
    torch = _torch()
    pages = 48
    host = stacked("host", 6, pages, (1024,), torch.uint8)
    gpu = stacked("gpu", 6, pages + 4, (1024,), torch.uint8)
    ids_d, ids_s = list(range(5, 35)), list(range(40, 10, -1))

    def want_of():
        out = []
        for h in host:
            w = torch.full((pages + 4, 1024), POISON, dtype=torch.uint8)
            w[ids_d] = h[ids_s].cpu()
            out.append(w)
        return out

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        assert kv.copy_blocks(gpu, host, ids_d, ids_s, mode="batched")["pitched"] == 30
        with torch.cuda.graph(g, stream=s):
            kv.copy_blocks(gpu, host, ids_d, ids_s, mode="batched")
    torch.cuda.synchronize()

    def run_and_check(run):
        for h in host:
            fill_random(h)
        for x in gpu:
            x.fill_(POISON)
        run()
        torch.cuda.synchronize()
        for got, want in zip(gpu, want_of()):
            assert torch.equal(got.cpu(), want)

    for _ in range(3):
        run_and_check(g.replay)
    t = kv.prepare(gpu, host, ids_d, ids_s)
    assert t.copies == 30

    def armed():
        t.arm()
        t.trigger()
        t.wait()

    for _ in range(2):
        run_and_check(armed)


def test_prepared_transfer_host_stream_and_kernel_triggers(kv):
    import ferry

    torch = _torch()
    pages = 300
    host = pinned((pages, 4096), torch.uint8)
    gpu = torch.empty((pages, 4096), dtype=torch.uint8, device="cuda")
    dst_ids = random.Random(3).sample(range(pages), 200)
    src_ids = random.Random(4).sample(range(pages), 200)
    t = kv.prepare(gpu, host, dst_ids, src_ids)
    assert t.copies == 200 and t.direction == "h2d"
    native = ferry._native.require()
    hooks = ferry._native.hooks()
    # The trigger kernel's module loads now, not while a transfer is armed.
    warm = native.HostPool.create(64, -1, -1, -1)
    hooks.launch_trigger_kernel(warm.data_ptr, 1, 1000, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    del warm
    for trigger in ("host", "stream", "kernel"):
        fill_random(host)
        gpu.fill_(POISON)
        t.arm()
        # Between arming and triggering: no host wait (a stream sharing the
        # armed stream's hardware queue would wait behind its gate) and no
        # kernel's first launch (lazy module loading waits for the device).
        if trigger == "host":
            t.trigger()
        elif trigger == "stream":
            t.trigger_on()
        else:
            word, value = t.device_trigger()
            hooks.launch_trigger_kernel(word, value, 100_000, torch.cuda.current_stream().cuda_stream)
        t.wait()
        got = gpu.cpu()
        want = torch.full_like(host, POISON)
        want[dst_ids] = host[src_ids]
        assert torch.equal(got, want), trigger


def test_arming_again_before_a_handed_trigger_fires_is_bounded(kv, monkeypatch):
    """Armed again while the trigger handed to a kernel last time has not
    fired: that run's calls still wait behind its gate, and with this arming's
    they would pass what a stream's queue takes behind a wait (two runs of
    600 calls; 1,024 blocked an H200's host), where the host would block
    inside CUDA for good (the kernel comes only after arm() returns). arm()
    waits for that trigger instead: at the timeout it raises, naming the
    cause, and nothing more is queued; once the kernel fires, the first run
    lands whole. Armed again while a kernel that fires a little later is
    already launched, it waits for it and goes on. Every page checked."""
    import ferry

    torch = _torch()
    pages = 1024
    host = pinned((pages, 4096), torch.uint8)
    gpu = torch.full((pages, 4096), POISON, dtype=torch.uint8, device="cuda")
    dst_ids = random.Random(5).sample(range(pages), 600)
    src_ids = random.Random(6).sample(range(pages), 600)
    monkeypatch.setenv("FERRY_KV_ARMED_MAX", "600")
    monkeypatch.setenv("FERRY_TIMEOUT_S", "2")
    # One host call per copy (FERRY_BATCH_MAX is read once per process): at most 600 a run.
    t = kv.prepare(gpu, host, dst_ids, src_ids, mode="per_page")
    hooks = ferry._native.hooks()
    native = ferry._native.require()
    warm = native.HostPool.create(64, -1, -1, -1)  # the trigger kernel's module loads now
    stream = torch.cuda.current_stream().cuda_stream
    hooks.launch_trigger_kernel(warm.data_ptr, 1, 1000, stream)
    torch.cuda.synchronize()
    del warm

    def want():
        w = torch.full_like(host, POISON)
        w[dst_ids] = host[src_ids]
        return w

    fill_random(host)
    t.arm()
    word, value = t.device_trigger()
    start = time.monotonic()
    with pytest.raises(ferry.PeerTimeoutError, match="earlier run"):
        t.arm()
    assert time.monotonic() - start < 20
    hooks.launch_trigger_kernel(word, value, 1000, stream)
    t.synchronize(timeout=10)
    assert torch.equal(gpu.cpu(), want())
    # Pipelined: the kernel that fires the first run is launched (it stores
    # after a delay) before the transfer is armed again.
    gpu.fill_(POISON)
    torch.cuda.synchronize()
    t.arm()
    word, value = t.device_trigger()
    hooks.launch_trigger_kernel(word, value, 2_000_000, stream)
    t.arm()
    t.trigger()
    t.synchronize(timeout=10)
    assert torch.equal(gpu.cpu(), want())


def test_a_later_open_does_not_release_an_arming_whose_trigger_is_in_flight(kv):
    """Armed again before the last trigger landed (a stream write behind a
    sleeping kernel), then opened from the host: the first run still waits
    for its own trigger, so its copies never start before it, and the
    second run follows it. Every page checked."""
    import ferry

    torch = _torch()
    host = pinned((8, 4096), torch.uint8)
    fill_random(host)
    gpu = torch.full((8, 4096), POISON, dtype=torch.uint8, device="cuda")
    t = kv.prepare(gpu, host, [0, 1], [2, 3])
    slow = torch.cuda.Stream()
    with torch.cuda.stream(slow):
        torch.cuda._sleep(1)  # the kernel's module loads now, not while a run is armed
    torch.cuda.synchronize()
    with torch.cuda.stream(slow):
        torch.cuda._sleep(1_000_000_000)  # about half a second
    t.arm()
    t.trigger_on(slow)  # lands when the sleep ends
    t.arm()  # before that trigger landed
    t.trigger()  # opens the second run only
    with pytest.raises(ferry.PeerTimeoutError, match="earlier arming's trigger"):
        t.synchronize(timeout=0.1)
    slow.synchronize()
    t.synchronize(timeout=10)
    got = gpu.cpu()
    assert torch.equal(got[0:2], host[2:4]) and (got[2:] == POISON).all()


def test_prepared_transfer_never_triggered_is_named(kv):
    import ferry

    torch = _torch()
    host = pinned((8, 256), torch.uint8)
    gpu = torch.empty((8, 256), dtype=torch.uint8, device="cuda")
    t = kv.prepare(gpu, host, [1, 2], [3, 4])
    t.arm()
    with pytest.raises(ferry.PeerTimeoutError, match="never opened"):
        t.synchronize(timeout=0.2)
    with pytest.raises(ferry.InvalidArgumentError, match="armed already"):
        t.arm()
    t.trigger()
    t.synchronize(timeout=10)
    with pytest.raises(ferry.InvalidArgumentError, match="not armed"):
        t.trigger()
    with pytest.raises(ValueError, match="copy engines"):
        kv.prepare(gpu, host, [1], [1], mode="kernel")


ARMED_MEANWHILE = r"""
import sys, torch, ferry, ferry.kv as kv
host = kv.pinned_empty((64, 4096), torch.uint8)
host.copy_(torch.randint(0, 256, (64, 4096), dtype=torch.uint8))
gpu = torch.full((64, 4096), 0xA5, dtype=torch.uint8, device="cuda")
other = torch.empty((64, 4096), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
armed = kv.prepare(gpu, host, list(range(10)), list(range(20, 30)))
armed.arm()
print("armed", flush=True)
for _ in range(3):
    t = kv.prepare(gpu, host, [40, 41], [1, 2])
    del t
try:
    kv.prepare(other, gpu, [1], [2])
    sys.exit("a prepared transfer within one GPU was not refused")
except ferry.InvalidArgumentError:
    pass
t = kv.prepare(gpu, host, [50], [3])
t.arm()
t.trigger()
t.synchronize(timeout=10)
del t
print("made, refused and dropped", flush=True)
armed.trigger()
armed.synchronize(timeout=10)
got = gpu.cpu()
assert torch.equal(got[0:10], host[20:30]) and torch.equal(got[50], host[3]), "pages differ"
assert (got[40:42] == 0xA5).all(), "a transfer never armed copied"
print("ok", flush=True)
"""


def test_prepared_transfers_made_and_dropped_while_one_is_armed(kv):
    """While a transfer is armed and not triggered, other prepared transfers
    are made, refused, armed, run and dropped: none of that may wait for the
    device, which waits for the trigger (a gate's memory freed would). In a
    process of its own, bounded: a hang holds the GIL in native code, so it
    could not be ended from a thread."""
    import subprocess
    import sys

    import _checks

    env = dict(__import__("os").environ, **_checks.SAFE_ENV)
    try:
        run = subprocess.run(
            [sys.executable, "-c", ARMED_MEANWHILE], env=env, capture_output=True, text=True, timeout=90
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise AssertionError(
            f"making or dropping a prepared transfer waited for an armed one's trigger; got to: {out!r}"
        ) from None
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr[-3000:]


TEARDOWNS_WHILE_ARMED = r"""
import gc, sys, time, torch, ferry, ferry.kv as kv, ferry.symm
case = sys.argv[1]
host = kv.pinned_empty((64, 4096), torch.uint8)
host.copy_(torch.randint(0, 256, (64, 4096), dtype=torch.uint8))
gpu = torch.full((64, 4096), 0xA5, dtype=torch.uint8, device="cuda")
side = torch.cuda.Stream()
comm = heap = coll = None
if case in ("heap", "collective", "released"):
    comm = ferry.init_local([0])
    heap = ferry.symm.Heap(comm, capacity=64 << 20) if case == "heap" else None
if case == "multipath":
    import ferry.multipath as mp
    eng = mp.Engine(devices=[0], loopback=2, chunk_bytes=(1 << 20) + 4097, min_bytes=2 << 20)
    w = kv.pinned_empty(((8 << 20) + 3,), torch.uint8)
    w.copy_(torch.randint(0, 256, w.shape, dtype=torch.uint8))
    g = torch.empty(w.shape, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
if case in ("collective", "released"):  # the holder is a prepared collective, not a transfer
    out = comm.alloc((4096,), torch.uint8)
    inp = [torch.randint(0, 256, (4096,), dtype=torch.uint8, device="cuda")]
    coll = comm.prepare("all_gather", out, inp)
    if case == "released":
        from ferry._native import hooks

        dummy = torch.zeros(1, dtype=torch.int64, device="cuda")
        trig = torch.cuda.Stream()
        hooks().launch_trigger_kernel(dummy.data_ptr(), 1, 0, trig.cuda_stream)  # loaded before arming
        trig.synchronize()
    coll.arm([side])
    if case == "released":  # handed to a kernel not launched yet, and let go
        [(word, value)] = coll.device_trigger()
        coll.release()
else:
    armed = kv.prepare(gpu, host, list(range(8)), list(range(30, 38)))
    armed.arm(side)
print("armed", flush=True)
if case in ("pools", "collective", "released"):
    small = kv.HostPool(1 << 20)
    small.close()  # cudaFreeHost
    big = kv.HostPool(128 << 20)
    t = big.tensor((1024,), torch.uint8)
    del t, big
    gc.collect()  # mmap + cudaHostRegister: unregistered when its last tensor goes
    print("pools closed and dropped", flush=True)
if case == "multipath":
    eng.copy(g, w)
    eng.synchronize()
    assert torch.equal(g.cpu(), w), "multipath bytes differ"
    eng.close()
    print("engine closed", flush=True)
if case == "heap":
    makers = (("communicator", lambda: ferry.init_local([0])), ("heap", lambda: ferry.symm.Heap(comm, capacity=1 << 26)))
    for what, make in makers:
        try:
            make()
            sys.exit(f"a new {what} was not refused while a transfer was armed")
        except ferry.InvalidArgumentError as e:
            assert "setting one up" in str(e) and "trigger it first" in str(e), str(e)
    heap.close()
    comm.close()
    print("new ones refused, the old ones closed", flush=True)
if case == "released":
    hooks().launch_trigger_kernel(word, value, 0, trig.cuda_stream)
    comm.synchronize()  # its run ends, then the kept frees run
    assert torch.equal(out[0].cpu(), inp[0].cpu()), "all_gather bytes differ"
    comm.close()
elif coll is not None:
    coll.trigger()
    coll.wait([side])
    side.synchronize()
    assert torch.equal(out[0].cpu(), inp[0].cpu()), "all_gather bytes differ"
    kv.HostPool(1 << 20).close()  # a free with nothing armed runs the kept ones
    comm.close()
else:
    armed.trigger()
    armed.synchronize(timeout=10)
    assert torch.equal(gpu[0:8].cpu(), host[30:38]), "pages differ"
print("ok", flush=True)
"""


@pytest.mark.parametrize("case", ["pools", "multipath", "heap", "collective", "released"])
def test_teardowns_while_a_transfer_is_armed(kv, case):
    """Freeing GPU or pinned memory waits for every stream of the GPU, and an
    armed gate holds one until its trigger, which this thread has yet to give.
    ferry's teardowns (a host pool, a multipath engine, a heap, a
    communicator) keep such frees for later, and making a heap or
    communicator is refused naming the hold. With a prepared collective as the
    holder too, and one handed to a kernel not yet launched and released
    (its hold stays until the kernel fires it). In a process of its own,
    bounded."""
    import subprocess
    import sys

    import _checks

    env = dict(__import__("os").environ, FERRY_DEBUG="1", **_checks.SAFE_ENV)
    try:
        run = subprocess.run(
            [sys.executable, "-c", TEARDOWNS_WHILE_ARMED, case],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise AssertionError(f"a teardown waited for the armed gate's trigger; got to: {out!r}") from None
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr[-3000:]
    # Every case frees something while the gate is armed, and later frees it.
    assert "is kept, not freed" in run.stderr, run.stderr[-3000:]
    assert "kept teardown(s) now that nothing holds a stream" in run.stderr, run.stderr[-3000:]


REFUSED_ON_ONE_RANK = r"""
import os, sys, time, torch, ferry, ferry.kv as kv, ferry.symm
rank, case = int(sys.argv[1]), sys.argv[2]
comm = ferry.init(rank=rank, world=2, device=0, timeout=40) if case == "heap" else None
armed = None
if rank == 1:  # arms a fetch and, before triggering it, takes part in the setup
    host = kv.pinned_empty((64, 4096), torch.uint8)
    host.copy_(torch.randint(0, 256, (64, 4096), dtype=torch.uint8))
    gpu = torch.zeros((64, 4096), dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    armed = kv.prepare(gpu, host, list(range(8)), list(range(30, 38)))
    armed.arm(side)
t0 = time.monotonic()
try:
    if case == "heap":
        ferry.symm.Heap(comm, capacity=1 << 26)
    else:
        ferry.init(rank=rank, world=2, device=0, timeout=40)
    print("made", flush=True)
except ferry.InvalidArgumentError as e:
    print(f"refused after {time.monotonic() - t0:.1f} s: {e}", flush=True)
if armed is not None:
    armed.trigger()
    armed.synchronize(timeout=10)
    assert torch.equal(gpu[0:8].cpu(), host[30:38]), "pages differ"
print("ok", flush=True)
"""


@pytest.mark.parametrize("case", ["communicator", "heap"])
def test_a_setup_one_rank_refuses_fails_at_once_on_its_peers(kv, case):
    """Two processes make a communicator (or a heap over one) while rank 1
    has a transfer armed: rank 1 refuses, and rank 0 learns it in the
    setup's first exchange, naming rank 1 and its reason, long before the
    bootstrap's timeout (40 s). Both ranks share GPU 0."""
    import _checks
    from harness import free_port, run_scripts

    env = dict(
        __import__("os").environ, FERRY_SHARED_GPUS="1", FERRY_PORT=str(free_port()), **_checks.SAFE_ENV
    )
    ran = run_scripts(REFUSED_ON_ONE_RANK, [(0, case), (1, case)], env=env, timeout=90)
    outs = [out for _, out in ran]
    assert all(rc == 0 and out.strip().endswith("ok") for rc, out in ran), outs
    assert "refused after" in outs[1] and "trigger it first" in outs[1], outs[1]
    line = next((x for x in outs[0].splitlines() if x.startswith("refused after")), "")
    assert "rank 1 refused" in line and "armed on cuda:0" in line, outs[0]
    assert float(line.split()[2]) < 10, line  # well before the 40 s timeout


def test_an_uncaught_error_is_not_followed_by_leak_reports(kv):
    """A program that ends on an uncaught exception keeps its objects alive
    past the native module's teardown (the traceback holds their frames):
    its error is the last thing on stderr, not a list of 'leaked' objects."""
    import subprocess
    import sys

    import _checks

    script = "import ferry.kv as kv\npool = kv.HostPool(1 << 20)\nraise RuntimeError('the program failed')\n"
    env = dict(__import__("os").environ, **_checks.SAFE_ENV)
    env.pop("FERRY_DEBUG", None)
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "the program failed" in run.stderr, run.stderr[-2000:]
    assert "leaked" not in run.stderr, run.stderr[-2000:]


def test_knobs_out_of_range_are_named(kv, monkeypatch):
    """A knob set out of its range is refused naming it, not taken as the
    nearest value in range (a negative row width as no pitched copies, 0 host
    calls as 1), which would run a call the user did not ask for. Nothing
    moves: the destination stays poisoned."""
    import ferry

    torch = _torch()
    host = pinned((16, 1024), torch.uint8)
    gpu = torch.full((16, 1024), POISON, dtype=torch.uint8, device="cuda")
    for knob, value, call in [
        ("FERRY_KV_PITCHED_ROW_BYTES", "-1", lambda: kv.copy_blocks(gpu, host, [1], [1], mode="batched")),
        ("FERRY_KV_ARMED_MAX", "0", lambda: kv.prepare(gpu, host, [1], [1])),
    ]:
        monkeypatch.setenv(knob, value)
        with pytest.raises(ferry.InvalidArgumentError, match=f"{knob}={value}; expected"):
            call()
        monkeypatch.delenv(knob)
    torch.cuda.synchronize()
    assert bool((gpu == POISON).all())


def test_bad_input_is_named(kv):
    import ferry

    torch = _torch()
    host = pinned((16, 1024), torch.uint8)
    gpu = torch.empty((16, 1024), dtype=torch.uint8, device="cuda")
    E = (ferry.InvalidArgumentError, ValueError)
    cases = [
        (lambda: kv.copy_blocks(gpu, host, [16], [0]), "dst_ids\\[0\\] = 16 is out of range"),
        (lambda: kv.copy_blocks(gpu, host, [0], [-1]), "src_ids\\[0\\] = -1"),
        (lambda: kv.copy_blocks(gpu, host, [3, 3], [0, 1]), "page 3 twice"),
        (lambda: kv.copy_blocks(gpu, host, [1, 2], [0]), "same length"),
        (lambda: kv.copy_blocks(gpu, host.view(16, 512, 2), [1], [1]), "page"),
        (lambda: kv.copy_blocks(gpu.view(16, 512, 2), host.view(16, 2, 512), [1], [1]), "layout"),
        (lambda: kv.copy_blocks(gpu.view(torch.float16), host.view(torch.bfloat16), [1], [1]), "dtype"),
        (lambda: kv.copy_blocks(gpu, torch.empty((16, 1024), dtype=torch.uint8), [1], [1]), "pageable"),
        (lambda: kv.copy_blocks([gpu, gpu], [host], [1], [1]), "pair up"),
        (lambda: kv.copy_blocks(gpu, host, [1], [1], mode="kernel", zero_sm=True), "zero_sm"),
        (lambda: kv.copy_blocks(gpu, host, [1], [1], mode="fast"), "not one of"),
        (lambda: kv.copy_blocks(gpu.t(), host, [1], [1]), "contiguous|page"),
        (lambda: kv.copy_blocks(gpu, host, [1.5], [1]), "integer"),
        (lambda: kv.copy_blocks(gpu, gpu, [1, 2], [2, 3]), "also a destination"),
        (lambda: kv.HostPool(0), "positive"),
        (lambda: kv.HostPool(1 << 20).tensor((-1, 4096), torch.uint8), "HostPool.tensor: shape is"),
    ]
    for fn, pattern in cases:
        with pytest.raises(E, match=pattern):
            fn()
    # GPU index lists are read in place by the kernel: a bad entry is skipped
    # and the next call says so.
    gpu.fill_(POISON)
    kv.copy_blocks(
        gpu, host, torch.tensor([1, 99], device="cuda"), torch.tensor([0, 1], device="cuda"), mode="kernel"
    )
    torch.cuda.synchronize()
    with pytest.raises(ferry.InvalidArgumentError, match="skipped entry 1"):
        kv.copy_blocks(gpu, host, [1], [1], mode="kernel")
    assert torch.equal(gpu[1].cpu(), host[0])


@pytest.mark.parametrize("mode", ["kernel", "auto"])
def test_a_destination_named_twice_in_gpu_lists_is_never_torn(kv, mode):
    """GPU index lists are read in place by the kernel, so the host cannot see
    a destination page named twice: a pass before the copy marks such pages,
    the kernel skips every entry naming one (its page keeps its old bytes
    rather than a mix of two sources) and copies the rest, and the next call
    says so. With `auto`, a copy-engine pick reads the lists on the host and
    refuses at once. Eager, then captured in a CUDA graph and replayed (the
    marks are cleared on every replay: a clean list replays cleanly)."""
    import ferry

    torch = _torch()
    pages, page = 64, 16384
    host = pinned((pages, page), torch.uint8)
    host.copy_(torch.randint(0, 256, (pages, page), dtype=torch.uint8))
    gpu = torch.empty((pages, page), dtype=torch.uint8, device="cuda")
    # 40 entries: 3 of them name page 7, 2 name page 30; the other 35 are distinct.
    dst = [7, 30] + [p for p in range(40, 64)] + [p for p in range(8, 19)] + [7, 30, 7]
    src = [(5 * i + 3) % pages for i in range(len(dst))]
    clean = [p for p in dst if p not in (7, 30)]
    d_ids = torch.tensor(dst, device="cuda")
    s_ids = torch.tensor(src, device="cuda")

    def expect(got, label):
        want = torch.full((pages, page), POISON, dtype=torch.uint8)
        for d, s_ in zip(dst, src):
            if d not in (7, 30):
                want[d] = host[s_]
        assert torch.equal(got.cpu(), want), label

    gpu.fill_(POISON)
    try:
        rep = kv.copy_blocks(gpu, host, d_ids, s_ids, mode=mode)
    except ferry.InvalidArgumentError as exc:  # auto chose copy engines: checked on the host
        assert mode == "auto" and "twice" in str(exc), exc
        torch.cuda.synchronize()
        assert bool((gpu == POISON).all())
        return
    assert rep["strategy"] == "kernel"
    torch.cuda.synchronize()
    expect(gpu, f"{mode}: eager")
    with pytest.raises(ferry.InvalidArgumentError, match=r"dst_ids entry \d+ naming a destination page"):
        kv.copy_blocks(gpu, host, [1], [1], mode="kernel")
    # A clean list after it copies every page.
    gpu.fill_(POISON)
    ok_d = torch.tensor(clean, device="cuda")
    ok_s = torch.tensor(src[: len(clean)], device="cuda")
    kv.copy_blocks(gpu, host, ok_d, ok_s, mode="kernel")
    torch.cuda.synchronize()
    assert all(torch.equal(gpu[d].cpu(), host[s_]) for d, s_ in zip(clean, src[: len(clean)]))
    # Captured: the repeated list replays as it ran eagerly, twice; then the
    # same graph with the list rewritten in place to a clean one copies all.
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        kv.copy_blocks(gpu, host, ok_d, ok_s, mode="kernel")  # warm up outside the capture
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            kv.copy_blocks(gpu, host, d_ids, s_ids, mode="kernel")
    for replay in range(2):
        gpu.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        expect(gpu, f"{mode}: replay {replay}")
        with pytest.raises(ferry.InvalidArgumentError, match="naming a destination page"):
            kv.copy_blocks(gpu, host, [1], [1], mode="kernel")
    d_ids.copy_(torch.tensor(clean + list(range(19, 24)), device="cuda"))
    gpu.fill_(POISON)
    graph.replay()
    torch.cuda.synchronize()
    kv.copy_blocks(gpu, host, [], [], mode="kernel")  # no error is left
    for d, s_ in zip(d_ids.tolist(), src):
        assert torch.equal(gpu[d].cpu(), host[s_]), f"{mode}: clean replay, page {d}"


def test_tensors_that_share_memory_race_only_where_a_page_would(kv):
    import ferry

    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(5)
    layers = [
        torch.randint(0, 256, (16, 512), dtype=torch.uint8, device="cuda", generator=g) for _ in range(3)
    ]
    host = pinned((16, 512), torch.uint8)
    E = ferry.InvalidArgumentError
    # One tensor given twice as a destination: both copies write its page 1.
    with pytest.raises(E, match=r"dst\[0\] and dst\[1\] share memory: page 1 of dst\[0\]"):
        kv.copy_blocks([layers[0], layers[0]], [host, host], [1], [2])
    # Read in place by the kernel, the lists are not known: such tensors are refused all the same.
    ids = torch.tensor([1], device="cuda")
    with pytest.raises(E, match=r"dst\[0\] and dst\[1\] share memory"):
        kv.copy_blocks([layers[0], layers[0]], [host, host], ids, ids, mode="kernel")
    # Layers shifted by one: layer 1 is dst[1] and src[0], its page 5 read and written by one call.
    with pytest.raises(E, match=r"src_ids\[0\] = 5 is also a destination page"):
        kv.copy_blocks(layers[:2], layers[1:], [5], [5])
    # The same shift reading page 6 and writing page 5 touches no page twice: copied, every byte.
    for mode in ("kernel", "batched"):
        want = [t.clone() for t in layers]
        want[0][5], want[1][5] = want[1][6], want[2][6]
        kv.copy_blocks(layers[:2], layers[1:], [5], [6], mode=mode)
        torch.cuda.synchronize()
        for got, ref in zip(layers, want):
            assert torch.equal(got, ref), mode
    # Views of one tensor a page apart: t[1:] page 0 is t[1], t[:-1] page 2 is t[2].
    t = layers[2]
    want = t.clone()
    want[1] = want[2]
    kv.copy_blocks(t[1:], t[:-1], [0], [2], mode="kernel")
    torch.cuda.synchronize()
    assert torch.equal(t, want)
    with pytest.raises(E, match=r"page 2 of src\[0\] shares memory with page 1 of dst\[0\]"):
        kv.copy_blocks(t[1:], t[:-1], [1], [2])


@pytest.mark.multigpu
def test_tensors_and_streams_of_another_gpu_are_named(kv):
    import ferry

    torch = _torch()
    host = pinned((8, 4096), torch.uint8)
    g0 = torch.empty((8, 4096), dtype=torch.uint8, device="cuda:0")
    g1 = torch.empty((8, 4096), dtype=torch.uint8, device="cuda:1")
    E = ferry.InvalidArgumentError
    with pytest.raises(E, match=r"dst\[0\] is on cuda:0 and dst\[1\] on cuda:1"):
        kv.copy_blocks([g0, g1], [host, host], [1], [2])
    with pytest.raises(E, match="stream is a stream of cuda:0; expected one of cuda:1"):
        kv.copy_blocks(g1, host, [1], [2], stream=torch.cuda.Stream(device=0))
    with pytest.raises(E, match="dst_ids is on cuda:1; the transfer runs on cuda:0"):
        kv.copy_blocks(
            g0, host, torch.tensor([1], device="cuda:1"), torch.tensor([2], device="cuda:1"), mode="kernel"
        )
    # A raw handle of another GPU's stream gets past Python's check; arming names it too.
    t = kv.prepare(g0, host, [1], [2])
    with pytest.raises(E, match="arm: the stream belongs to cuda:1 but the transfer is on cuda:0"):
        t.arm(torch.cuda.Stream(device=1).cuda_stream)
    assert not t.armed
    g1.fill_(POISON)
    torch.cuda.synchronize(1)  # the poison before the copy's own stream runs
    kv.copy_blocks(g1, host, [1], [2], stream=torch.cuda.Stream(device=1))  # the same on its own GPU works
    torch.cuda.synchronize(1)
    assert torch.equal(g1[1].cpu(), host[2])


def test_zero_sm_never_launches_a_kernel(kv):
    torch = _torch()
    for page in (256, 4096, 1 << 20):
        host = pinned((8, page), torch.uint8)
        gpu = torch.empty((8, page), dtype=torch.uint8, device="cuda")
        for src, dst in ((host, gpu), (gpu, host)):
            rep = kv.copy_blocks(dst, src, list(range(8)), list(range(7, -1, -1)), zero_sm=True)
            assert rep["strategy"] != "kernel" and rep["sms"] == 0
        assert kv.choose("h2d", 1000, 1000 * page, zero_sm=True) != "kernel"
    torch.cuda.synchronize()


ZERO_SM_CASES = [
    ("h2d", dict(mode="auto")),
    ("d2h", dict(mode="auto")),
    ("h2d", dict(mode="batched")),
    ("d2h", dict(mode="batched")),
    ("h2d", dict(mode="per_page")),
    ("d2h", dict(mode="per_page")),
    ("h2d", dict(mode="streams")),
    ("d2h", dict(mode="streams")),
    ("h2d", dict(mode="batched", slice_bytes=64 << 10)),
    ("d2h", dict(mode="auto", urgent=True)),
    ("h2d", dict(mode="auto", settled_source=True)),
]


@pytest.mark.parametrize(
    "direction,kw",
    ZERO_SM_CASES,
    ids=[f"{d}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for d, kw in ZERO_SM_CASES],
)
def test_zero_sm_runs_while_every_sm_is_held(kv, direction, kw):
    """zero_sm=True launches no kernel: with every SM taken by a spinning
    kernel on another stream, the transfer still lands, every byte checked
    after the release; mode='kernel' on the same pages must wait for the SMs,
    which shows the probe can fail."""
    torch = _torch()
    pages, page = 64, 16384
    src_where, dst_where = {"h2d": ("host", "gpu"), "d2h": ("gpu", "host")}[direction]
    src, src_list = make_side("vllm", src_where, pages, (page // 2,), torch.uint8, layers=2)
    dst, dst_list = make_side("vllm", dst_where, pages, (page // 2,), torch.uint8, layers=2)
    rng = random.Random(zlib.crc32(repr((direction, kw)).encode()))
    dst_ids = rng.sample(range(pages), 40)
    src_ids = [rng.randrange(pages) for _ in range(40)]
    work = torch.cuda.Stream()
    # Warm-up outside the hold: first calls may load modules or make streams.
    kv.copy_blocks(dst, src, dst_ids, src_ids, stream=work, zero_sm=True, **kw)
    kv.copy_blocks(dst, src, dst_ids, src_ids, stream=work, mode="kernel")
    torch.cuda.synchronize()
    for t in dst_list:
        t.fill_(POISON)
    before = [as_bytes(t) for t in dst_list]
    srcs = [as_bytes(t) for t in src_list]
    torch.cuda.synchronize()
    reps = []
    finished = SmHold(torch).finishes(
        lambda: reps.append(kv.copy_blocks(dst, src, dst_ids, src_ids, stream=work, zero_sm=True, **kw)), work
    )
    assert finished, f"zero_sm {direction} {kw} ({reps}) did not finish while every SM was held"
    assert reps[0]["sms"] == 0 and reps[0]["strategy"] != "kernel"
    for r, (d, b, s) in enumerate(zip(dst_list, before, srcs)):
        assert torch.equal(as_bytes(d), reference(b, s, dst_ids, src_ids)), f"region {r} differs"
    if direction == "h2d" and kw == {"mode": "auto"}:
        assert not SmHold(torch).finishes(
            lambda: kv.copy_blocks(dst, src, dst_ids, src_ids, stream=work, mode="kernel"), work
        ), "the kernel mode finished while every SM was held: the probe cannot tell"


def test_zero_sm_within_one_gpu_is_refused(kv):
    """CUDA copies within one GPU on SMs, whichever call submits them: a plain
    batched GPU-to-GPU transfer waits for held SMs (if it ever stops doing
    so, CUDA has a copy-engine path and the refusal below should go), so
    zero_sm=True and prepare() refuse such a transfer, naming why."""
    import ferry

    torch = _torch()
    src, _ = make_side("one", "gpu", 32, (8192,), torch.uint8)
    dst, _ = make_side("one", "gpu", 32, (8192,), torch.uint8)
    work = torch.cuda.Stream()
    kv.copy_blocks(dst, src, [1, 2], [3, 4], stream=work, mode="batched")
    torch.cuda.synchronize()
    assert not SmHold(torch).finishes(
        lambda: kv.copy_blocks(
            dst, src, list(range(20)), list(range(31, 11, -1)), stream=work, mode="batched"
        ),
        work,
    ), "a copy within one GPU finished while every SM was held: CUDA has an SM-free path now"
    for mode in ("auto", "batched", "per_page", "streams"):
        with pytest.raises(
            ferry.InvalidArgumentError, match="zero_sm=True: dst and src are both in cuda:.*on SMs"
        ):
            kv.copy_blocks(dst, src, [1], [2], zero_sm=True, mode=mode)
    with pytest.raises(
        ferry.InvalidArgumentError, match="prepare: dst and src are both in cuda:.*copy engines only"
    ):
        kv.prepare(dst, src, [1], [2])


def test_zero_sm_graph_and_prepared_run_while_every_sm_is_held(kv):
    """A zero_sm transfer captured in a CUDA graph, replayed, and a prepared
    transfer armed and triggered from a stream, each while every SM is held."""
    torch = _torch()
    pages = 64
    for direction in ("h2d", "d2h"):
        src_where, dst_where = {"h2d": ("host", "gpu"), "d2h": ("gpu", "host")}[direction]
        src, src_list = make_side("one", src_where, pages, (8192,), torch.uint8)
        dst, dst_list = make_side("one", dst_where, pages, (8192,), torch.uint8)
        dst_ids, src_ids = list(range(5, 45)), list(range(60, 20, -1))
        work = torch.cuda.Stream()
        work.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(work):
            kv.copy_blocks(dst, src, dst_ids, src_ids, zero_sm=True)
            with torch.cuda.graph(g, stream=work):
                kv.copy_blocks(dst, src, dst_ids, src_ids, zero_sm=True)
        torch.cuda.synchronize()
        dst.fill_(POISON)
        want = reference(as_bytes(dst), as_bytes(src), dst_ids, src_ids)
        torch.cuda.synchronize()

        def replay():
            with torch.cuda.stream(work):
                g.replay()

        assert SmHold(torch).finishes(replay, work), f"a captured zero_sm {direction} copy needed an SM"
        assert torch.equal(as_bytes(dst), want), f"graph {direction}: pages differ"
        t = kv.prepare(dst, src, dst_ids, src_ids)
        dst.fill_(POISON)
        torch.cuda.synchronize()

        def prepared():
            t.arm(work)
            t.trigger_on(work)
            t.wait(work)

        assert SmHold(torch).finishes(prepared, work), f"a prepared {direction} transfer needed an SM"
        assert torch.equal(as_bytes(dst), want), f"prepared {direction}: pages differ"


def test_host_pool_backing_huge_pages_and_placement(kv):
    """Pools from 64 MiB are mmap + cudaHostRegister (huge pages asked for
    unless refused), smaller ones cudaHostAlloc, placed by the driver; huge
    pages required either come or are refused naming the reserve; every
    kind of pool carries a fetch and a save byte for byte."""
    import ferry

    torch = _torch()
    big = kv.HostPool(256 << 20)
    assert big.backing == "mmap+cudaHostRegister", big.backing
    try:
        thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        thp = "[never]"
    assert big.huge_pages in (("hugetlb", "thp", "none") if "[never]" in thp else ("hugetlb", "thp")), (
        big.huge_pages
    )
    small = kv.HostPool(1 << 20)
    assert small.backing == "cudaHostAlloc" and small.numa_node == -1 and small.huge_pages == "none"
    plain = kv.HostPool(64 << 20, huge_pages=False, numa_node=-1)
    assert plain.backing == "mmap+cudaHostRegister" and plain.huge_pages == "none" and plain.numa_node == -1
    pools = [big, small, plain]
    try:
        required = kv.HostPool(64 << 20, huge_pages=True)
        assert required.huge_pages == "hugetlb"
        pools.append(required)
    except ferry.SystemCallError as e:  # mmap refused: no huge pages reserved
        assert "huge_pages=1" in str(e) and "nr_hugepages" in str(e), e
    gpu = torch.empty((16, 65536), dtype=torch.uint8, device="cuda")
    for pool in pools:
        host = pool.tensor((16, 65536), torch.uint8)
        fill_random(host)
        gpu.fill_(POISON)
        kv.copy_blocks(gpu, host, list(range(16)), list(range(15, -1, -1)), zero_sm=True)
        torch.cuda.synchronize()
        assert torch.equal(gpu.cpu(), host.flip(0)), pool.backing
        host.fill_(0)
        kv.copy_blocks(host, gpu, list(range(16)), list(range(16)), zero_sm=True)
        torch.cuda.synchronize()
        assert torch.equal(host, gpu.cpu()), pool.backing
        del host


def test_pool_is_not_freed_under_a_transfer(kv):
    import ferry

    torch = _torch()
    pool = kv.HostPool(256 << 20)
    assert pool.backing in ("mmap+cudaHostRegister", "cudaHostAlloc")
    host = pool.tensor((256, 1 << 20), torch.uint8)
    fill_random(host)
    expect = host[:128].clone()
    gpu = torch.empty((256, 1 << 20), dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # keeps the transfer in flight
        kv.copy_blocks(gpu, host, list(range(128)), list(range(128)), mode="batched")
    with pytest.raises(ferry.InvalidArgumentError, match="still alive|in flight"):
        pool.close()
    del host
    with pytest.raises(ferry.InvalidArgumentError, match="in flight"):
        pool.close()
    # Dropping the last reference while the copy runs waits for it instead of freeing.
    del pool
    s.synchronize()
    assert torch.equal(gpu[:128].cpu(), expect)
    small = kv.HostPool(1 << 20)
    t = small.tensor((4, 1024), torch.uint8)
    with pytest.raises(ferry.InvalidArgumentError, match="still alive"):
        small.close()
    del t
    small.close()
    with pytest.raises(ValueError, match="do not fit"):
        kv.HostPool(4096).tensor((2, 4096), torch.uint8)

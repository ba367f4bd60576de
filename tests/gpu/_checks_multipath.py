"""Multipath host<->GPU copies on the GPU (ferry.multipath). On one GPU the
relays go through the same GPU (loopback=), so chunking, staging, both relay
pipelines, reassembly and the gate run for real; with two GPUs or more, real
relays through peers too. test_multipath.py runs this file in a bounded
process of its own. Random data, poisoned destinations, every byte
compared with the source."""

import re
import time

import pytest

try:
    import torch
except ImportError:  # CPU-only machines: the tests are collected, and skipped (and counted) by conftest
    torch = None
import ferry  # noqa: E402
import ferry.multipath as mp  # noqa: E402
from _checks import SmHold, rand_bytes  # noqa: E402
from conftest import GPU_COUNT  # noqa: E402

KiB = 1 << 10
MiB = 1 << 20
POISON = 0xA5


def pinned(n, fill=None):
    t = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    t.fill_(POISON if fill is None else fill)
    return t


def rand(n, device="cpu", seed=0):
    t = rand_bytes(torch, seed, n, "cpu")
    return t.to(device) if device != "cpu" else t


@pytest.fixture(scope="module")
def eng():
    # An odd chunk size: chunk edges fall at unaligned offsets.
    e = mp.Engine(devices=[0], loopback=2, chunk_bytes=MiB + 4097, min_bytes=2 * MiB)
    yield e
    e.close()


SIZES = [(1, 0), (4097, 3), (2 * MiB, 0), (8 * MiB + 13, 5), (64 * MiB + 7, 1)]  # (bytes, offset)


@pytest.mark.parametrize("nbytes,offset", SIZES)
def test_host_to_device_and_back_byte_exact(eng, nbytes, offset):
    src = pinned(nbytes + offset)
    src[offset:] = rand(nbytes, seed=nbytes)
    dev = torch.full((nbytes + offset,), POISON, dtype=torch.uint8, device="cuda:0")
    before = eng.bytes_by_link()
    r = eng.copy(dev[offset:], src[offset:])
    assert r["multipath"] == (nbytes >= 2 * MiB), r
    back = pinned(nbytes + offset)
    r2 = eng.copy(back[offset:], dev[offset:])
    assert r2["multipath"] == r["multipath"]
    torch.cuda.current_stream(0).synchronize()
    eng.check()
    assert torch.equal(back[offset:], src[offset:])
    assert torch.all(dev[:offset].cpu() == POISON) and torch.all(back[:offset] == POISON), (
        "bytes before dst written"
    )
    after = eng.bytes_by_link()
    if r["multipath"]:
        assert sum(after) - sum(before) == 2 * nbytes
        if nbytes >= 8 * MiB:  # enough chunks that the relays take some
            assert after[1] > before[1] and after[2] > before[2], (before, after)
    else:
        assert after == before and "threshold" in r["reason"], r


def heap_staging(e, gpus):
    """Asserts the engine's staging is a symmetric heap over `gpus` GPUs that
    maps its buffers, rounded up to the driver's granularity, and nothing
    more (a heap with its words would map 16.25 MiB more in front of them);
    returns the bytes on each GPU."""
    m = re.fullmatch(r"a symmetric heap over (\d+) GPU\(s\), (\d+) bytes each, (\d+) mapped", e.staging)
    assert m and int(m[1]) == gpus, e.staging
    assert int(m[2]) <= int(m[3]) < int(m[2]) + 4 * MiB, e.staging
    return int(m[2])


def test_zero_bytes(eng):
    r = eng.copy(torch.empty(0, dtype=torch.uint8, device="cuda:0"), pinned(0))
    assert not r["multipath"] and r["reason"] == "zero bytes"


def test_stream_order_start_and_finish(eng):
    """A copy starts when its stream gets there and the work after it sees all of it."""
    n = 32 * MiB + 3
    s = torch.cuda.Stream(0)
    x = rand(n, "cuda:0", seed=1)
    host = pinned(n)
    y = torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0")
    # Every kernel once before a copy holds the stream: under lazy module
    # loading a kernel's first launch waits for the device (docs/multipath.md).
    with torch.cuda.stream(s):
        torch.cuda._sleep(1)
        x.flip(0).clone()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # the stream is busy for a while: an early start would read poison
        host.copy_(x, non_blocking=True)  # produces the source in stream order
        eng.copy(y, host, stream=s)  # host -> GPU, after the producer
        z = y.clone()  # consumes it right after
        back = pinned(n)
        w = x.flip(0)
        eng.copy(back, w, stream=s)  # GPU -> host of data a kernel just made
    s.synchronize()
    eng.check()
    assert torch.equal(z, x), "the consumer after the copy saw data the copy had not landed"
    assert torch.equal(back, w.cpu())


@pytest.mark.multigpu
def test_copies_run_while_every_sm_is_held():
    """Copy engines only: with every SM of GPU 0 taken by a spinning kernel on
    another stream, copies into and out of GPU 0 through its own link and its
    peers', one copy and a batch, start when their stream gets there and let
    it go when they landed; every byte checked after the SMs are released. A
    torch kernel on the same stream must wait for the SMs, which shows the
    probe can fail. (On one GPU the loopback relays' second hops are copies
    within that GPU, which CUDA runs on SMs: that testing mode is not SM-free.)"""
    eng = mp.Engine(devices=list(range(GPU_COUNT)), chunk_bytes=MiB + 4097, min_bytes=2 * MiB)
    try:
        _copies_run_while_every_sm_is_held(eng)
    finally:
        eng.close()


def _copies_run_while_every_sm_is_held(eng):
    n = 24 * MiB + 5
    work = torch.cuda.Stream(0)
    hold = SmHold(torch, range(GPU_COUNT))
    src = pinned(n)
    src.copy_(rand(n, seed=7))
    dev = torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0")
    back = pinned(n)
    parts = [(3 * MiB + 1, 0), (5 * MiB, 3 * MiB + 1), (n - 8 * MiB - 1, 8 * MiB + 1)]
    batch_dev = torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0")
    eng.copy(dev, src, stream=work)  # warm-up: staging and streams in use once
    work.synchronize()
    dev.fill_(POISON)
    torch.cuda.synchronize()

    def copies():
        assert eng.copy(dev, src, stream=work)["multipath"]
        assert eng.copy(back, dev, stream=work)["multipath"]
        r = eng.copy_batch(
            [batch_dev[o : o + b] for b, o in parts], [src[o : o + b] for b, o in parts], stream=work
        )
        assert r["multipath"], r

    assert hold.finishes(copies, work), "multipath copies did not finish while every SM was held"
    eng.check()
    assert torch.equal(dev.cpu(), src) and torch.equal(back, src) and torch.equal(batch_dev.cpu(), src)
    with torch.cuda.stream(work):
        torch.cuda._sleep(1)  # loaded before the hold
    torch.cuda.synchronize()

    def kernel():
        with torch.cuda.stream(work):
            torch.cuda._sleep(1000)

    assert not hold.finishes(kernel, work), "a kernel finished while every SM was held: the probe cannot tell"


def test_idle_relays_keep_off_a_gpu_another_program_runs_on():
    """relays='idle' on one GPU (its relays are loopback links through it):
    while another process holds a context there, a copy runs as one plain
    copy; once it exits, within a look (half a second), the relays carry
    again. Every byte checked."""
    import subprocess
    import sys

    native = ferry._native.require()
    torch.zeros(1, device="cuda:0")
    if native.gpu_compute_processes(0) < 1:
        pytest.skip("NVML lists no process on this GPU, not even this one (another PID namespace)")
    if native.gpu_compute_processes(0) > 1:
        # The test runner itself, once it ran GPU tests in its own process,
        # is another program on the GPU, and relays='idle' rightly keeps off.
        pytest.skip("another process (such as the test runner) already holds a context on GPU 0")
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys, torch; torch.zeros(1, device='cuda:0'); print('up', flush=True); "
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert other.stdout.readline().strip() == "up"
        assert native.gpu_compute_processes(0) >= 2, "NVML does not list the other process"
        e = mp.Engine(devices=[0], loopback=2, relays="idle", chunk_bytes=MiB + 4097, min_bytes=2 * MiB)
        n = 24 * MiB + 7
        src = pinned(n)
        src.copy_(rand(n, seed=11))
        dev = torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0")
        r = e.copy(dev, src)
        torch.cuda.current_stream(0).synchronize()
        e.check()
        assert not r["multipath"] and "relay" in r["reason"], r
        assert torch.equal(dev.cpu(), src)
    finally:
        other.stdin.close()
        other.wait(timeout=60)
    time.sleep(1.0)  # two looks of the engine's thread
    dev.fill_(POISON)
    before = e.bytes_by_link()
    r = e.copy(dev, src)
    torch.cuda.current_stream(0).synchronize()
    e.check()
    assert r["multipath"], r
    after = e.bytes_by_link()
    assert after[1] > before[1] or after[2] > before[2], (before, after)
    assert torch.equal(dev.cpu(), src)
    e.close()


def test_repeated_and_concurrent_streams(eng):
    streams = [torch.cuda.Stream(0) for _ in range(2)]
    n = 6 * MiB + 11
    srcs = [rand(n, seed=10 + i).pin_memory() for i in range(8)]
    outs = [torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0") for _ in range(8)]
    backs = [pinned(n) for _ in range(8)]
    for i in range(8):
        s = streams[i % 2]
        with torch.cuda.stream(s):
            eng.copy(outs[i], srcs[i], stream=s)
            eng.copy(backs[i], outs[i], stream=s)
    eng.synchronize()
    for s in streams:
        s.synchronize()
    for i in range(8):
        assert torch.equal(backs[i], srcs[i]), i


def test_a_copy_waiting_for_its_stream_holds_up_no_other_stream(eng):
    """Copy A's stream is busy for a second; copy B on another stream, made
    after A, lands and lets its stream go at once (neither A's chunks nor its
    gate stand in B's way), and A still lands in full afterwards."""
    n = 16 * MiB + 5
    s0, s1 = torch.cuda.Stream(0), torch.cuda.Stream(0)
    a_src, b_src = rand(n, seed=50).pin_memory(), rand(n, seed=51).pin_memory()
    a_dst = torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0")
    b_dst = torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0")
    with torch.cuda.stream(s0):
        torch.cuda._sleep(1)  # loaded before anything waits
    torch.cuda.synchronize()
    with torch.cuda.stream(s0):
        torch.cuda._sleep(2_000_000_000)  # about a second
        assert eng.copy(a_dst, a_src, stream=s0)["multipath"]
    t = time.monotonic()
    with torch.cuda.stream(s1):
        assert eng.copy(b_dst, b_src, stream=s1)["multipath"]
    s1.synchronize()
    took = time.monotonic() - t
    assert torch.equal(b_dst.cpu(), b_src)
    assert s0.query() is False, "copy A's stream finished early: the test shows nothing"
    assert took < 0.4, f"copy B waited {took:.2f} s for copy A's stream"
    s0.synchronize()
    eng.check()
    assert torch.equal(a_dst.cpu(), a_src)


def test_plain_copy_for_pageable_memory_and_during_capture(eng):
    n = 8 * MiB
    src = rand(n, seed=3)  # pageable
    dst = torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0")
    r = eng.copy(dst, src)
    assert not r["multipath"] and "pageable" in r["reason"], r
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), src)
    # Captured: one plain copy in the graph, correct on every replay.
    host = pinned(n)
    out = torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream(0)
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            r = eng.copy(out, host, stream=s)
    assert not r["multipath"] and "capturing" in r["reason"], r
    for k in range(3):
        host.copy_(rand(n, seed=20 + k))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), host), k


def test_a_range_running_past_its_pinned_memory_is_named(eng):
    """A source whose first half is pinned (cudaHostRegister) and whose
    second half is not: refused naming src (cudaMemcpyAsync itself refuses
    such a range with cudaErrorInvalidValue); nothing is written, and the
    engine goes on with the pinned half alone."""
    n = 8 * MiB
    host = rand(2 * n, seed=5)  # pageable
    cudart = torch.cuda.cudart()
    assert int(cudart.cudaHostRegister(host.data_ptr(), n, 0)) == 0
    try:
        dev = torch.full((2 * n,), POISON, dtype=torch.uint8, device="cuda:0")
        with pytest.raises(
            ferry.InvalidArgumentError,
            match="src starts in pinned host memory and its last byte is in pageable host memory",
        ):
            eng.copy(dev, host)
        torch.cuda.current_stream(0).synchronize()
        assert torch.all(dev.cpu() == POISON)
        eng.check()
        r = eng.copy(dev[:n], host[:n])  # the pinned half alone is one range
        torch.cuda.current_stream(0).synchronize()
        eng.check()
        assert r["multipath"], r
        assert torch.equal(dev[:n].cpu(), host[:n])
    finally:
        cudart.cudaHostUnregister(host.data_ptr())


def test_bad_input_is_named(eng):
    a = torch.zeros(16, dtype=torch.uint8, device="cuda:0")
    with pytest.raises(ferry.InvalidArgumentError, match="both CUDA tensors"):
        eng.copy(a, a.clone())
    with pytest.raises(ferry.InvalidArgumentError, match="dst holds 16 bytes and src 8"):
        eng.copy(a, pinned(8))
    with pytest.raises(ferry.InvalidArgumentError, match="not contiguous"):
        eng.copy(a.view(4, 4).t(), pinned(16))
    with pytest.raises(ferry.InvalidArgumentError, match="expected a torch tensor"):
        eng.copy(a, b"0123456789abcdef")
    with pytest.raises(ferry.InvalidArgumentError, match="lists a GPU twice"):
        mp.Engine(devices=[0, 0])
    with pytest.raises(ferry.InvalidArgumentError, match="not among devices"):
        mp.Engine(devices=[0], relays=[5])
    with pytest.raises(ferry.InvalidArgumentError, match="loopback"):
        mp.Engine(devices=[0], loopback=-1)
    with pytest.raises(ferry.InvalidArgumentError, match="outstanding"):
        mp.Engine(devices=[0], outstanding=0)
    with pytest.raises(ferry.InvalidArgumentError, match="link_devices: 99"):
        mp.Engine(devices=[99])


# Sizes of a batch's copies: odd, tiny, empty, several chunks, one shorter than a chunk.
BATCH = [3 * MiB + 7, 1, 0, 4099, 9 * MiB + 1, 5, MiB - 3, 2 * MiB]


def batch_round_trip(e, device, sizes, seed, stream=None, head_check=True):
    """Host -> GPU and back as two batches into poisoned, unaligned slices of
    one buffer each side; every byte, and the gaps between, compared."""
    gap = 3  # bytes left poisoned between copies, each copy at an odd offset
    offs, at = [], gap
    for n in sizes:
        offs.append(at)
        at += n + gap
    src = pinned(at)
    for i, (o, n) in enumerate(zip(offs, sizes)):
        src[o : o + n] = rand(n, seed=seed + i)
    dev = torch.full((at,), POISON, dtype=torch.uint8, device=f"cuda:{device}")
    back = pinned(at)
    r = e.copy_batch([dev[o : o + n] for o, n in zip(offs, sizes)], [src[o : o + n] for o, n in zip(offs, sizes)],
                     stream=stream)  # fmt: skip
    r2 = e.copy_batch([back[o : o + n] for o, n in zip(offs, sizes)], [dev[o : o + n] for o, n in zip(offs, sizes)],
                      stream=stream)  # fmt: skip
    torch.cuda.synchronize(device)
    e.check()
    expect = src.clone()
    mask = torch.ones(at, dtype=torch.bool)
    for o, n in zip(offs, sizes):
        mask[o : o + n] = False
    expect[mask] = POISON
    assert torch.equal(back, expect), "a batch's bytes differ, or bytes between its copies were written"
    assert torch.equal(dev.cpu(), expect)
    return r, r2


def test_batch_of_copies_byte_exact(eng):
    before = sum(eng.bytes_by_link())
    r, r2 = batch_round_trip(eng, 0, BATCH, seed=50)
    assert r["multipath"] and r2["multipath"], (r, r2)
    assert sum(eng.bytes_by_link()) - before == 2 * sum(BATCH)
    # Below the threshold in total: plain copies, the same bytes.
    r, _ = batch_round_trip(eng, 0, [MiB, 5, 77], seed=60)
    assert not r["multipath"] and "threshold" in r["reason"], r
    # Many small copies in one batch (a model's norms and biases beside its matrices).
    r, _ = batch_round_trip(eng, 0, [4096 + i for i in range(300)] + [6 * MiB], seed=70)
    assert r["multipath"], r
    # Repeated, with a head on the caller's stream taking the first copy's start.
    h = mp.Engine(devices=[0], loopback=2, chunk_bytes=MiB + 4097, min_bytes=2 * MiB, head_bytes=MiB)
    for k in range(3):
        batch_round_trip(h, 0, [2 * MiB + 1, 16 * MiB + 3, 7], seed=80 + k)
    batch_round_trip(h, 0, [5, 16 * MiB], seed=90)  # the head longer than the first copy: capped by it
    h.close()


def test_own_share_on_the_callers_stream_byte_exact():
    """own_share_on_stream: the caller's stream copies the target link's share
    (in 64 KiB steps) before the gate; the relays carry all the rest. The
    share is even until the links are measured, then follows their speeds
    (planned and tested on the CPU), at most twice the even share: the own
    link never takes chunks of the rest."""
    e = mp.Engine(
        devices=[0], loopback=2, chunk_bytes=MiB + 4097, min_bytes=2 * MiB, own_share_on_stream=True
    )
    try:
        for nbytes, offset in [(2 * MiB, 0), (8 * MiB + 13, 5), (64 * MiB + 7, 1)]:
            src = pinned(nbytes + offset)
            src[offset:] = rand(nbytes, seed=200 + nbytes)
            dev = torch.full((nbytes + offset,), POISON, dtype=torch.uint8, device="cuda:0")
            back = pinned(nbytes + offset)
            before = e.bytes_by_link()
            r = e.copy(dev[offset:], src[offset:])
            r2 = e.copy(back[offset:], dev[offset:])
            assert r["multipath"] and r2["multipath"], (r, r2)
            torch.cuda.current_stream(0).synchronize()
            e.check()
            assert torch.equal(back[offset:], src[offset:])
            assert torch.all(dev[:offset].cpu() == POISON) and torch.all(back[:offset] == POISON)
            after = e.bytes_by_link()
            share = nbytes // 3 // (64 << 10) * (64 << 10)  # three links: the own and two relays
            assert after[0] - before[0] <= 2 * (2 * share + (64 << 10)), (nbytes, before, after)
            assert sum(after) - sum(before) == 2 * nbytes
        r, r2 = batch_round_trip(e, 0, BATCH, seed=210)
        assert r["multipath"] and r2["multipath"], (r, r2)
    finally:
        e.close()


def test_batch_keeps_stream_order(eng):
    n = 8 * MiB + 1
    s = torch.cuda.Stream(0)
    x = rand(n, "cuda:0", seed=11)
    hosts = [pinned(n), pinned(n)]
    ys = [torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0") for _ in range(2)]
    with torch.cuda.stream(s):
        torch.cuda._sleep(1)
        x.flip(0).clone()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)
        hosts[0].copy_(x, non_blocking=True)
        hosts[1].copy_(x.flip(0), non_blocking=True)
        assert eng.copy_batch(ys, hosts, stream=s)["multipath"]
        z = [y.clone() for y in ys]  # consumers right after (no kernel loaded for the first time here)
    s.synchronize()
    eng.check()
    assert torch.equal(z[0], x) and torch.equal(z[1], x.flip(0))


def test_batch_bad_input_is_named(eng):
    a = torch.zeros(4 * MiB, dtype=torch.uint8, device="cuda:0")
    h = pinned(4 * MiB)
    with pytest.raises(ferry.InvalidArgumentError, match="dsts has 2 tensors and srcs 1"):
        eng.copy_batch([a, a], [h])
    with pytest.raises(ferry.InvalidArgumentError, match=r"dsts\[1\] holds 16 bytes and srcs\[1\] 8"):
        eng.copy_batch([a, a[:16]], [h, h[:8]])
    with pytest.raises(
        ferry.InvalidArgumentError,
        match=r"srcs\[1\] is on cuda:0; expected every copy of a batch the way of the first \(dsts\[0\] on cuda:0\)",
    ):
        eng.copy_batch([a[: 2 * MiB], h[: 2 * MiB]], [h[: 2 * MiB], a[2 * MiB :]])
    if torch.cuda.device_count() > 1:  # a batch from two GPUs: the GPU side is named
        b = torch.zeros(MiB, dtype=torch.uint8, device="cuda:1")
        with pytest.raises(ferry.InvalidArgumentError, match=r"srcs\[1\] is on cuda:1; expected"):
            eng.copy_batch([h[:MiB], h[MiB : 2 * MiB]], [a[:MiB], b])
    with pytest.raises(ferry.InvalidArgumentError, match="two destinations overlap"):
        eng.copy_batch([a[: 2 * MiB], a[MiB : 3 * MiB]], [h[: 2 * MiB], h[2 * MiB :]])
    assert eng.copy_batch([], [])["reason"] == "zero bytes"
    torch.cuda.synchronize()
    eng.check()


def test_synchronize_is_bounded_and_the_engine_goes_on():
    e = mp.Engine(devices=[0], loopback=1, chunk_bytes=MiB, min_bytes=MiB, timeout=0.5)
    n = 4 * MiB
    s = torch.cuda.Stream(0)
    src = rand(n, seed=5).pin_memory()
    dst = torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(3_000_000_000)  # longer than the timeout, before the copy
        e.copy(dst, src, stream=s)
    with pytest.raises(ferry.PeerTimeoutError, match="still in flight"):
        e.synchronize()
    s.synchronize()
    e.synchronize()  # the copy was only waiting for its stream: it landed, no error
    assert torch.equal(dst.cpu(), src)
    e.close()


def test_close_waits_for_copies_in_flight():
    n = 16 * MiB + 1
    src = rand(n, seed=6).pin_memory()
    dst = torch.full((n,), POISON, dtype=torch.uint8, device="cuda:0")
    e = mp.Engine(devices=[0], loopback=2, chunk_bytes=MiB, min_bytes=MiB)
    assert e.copy(dst, src)["multipath"]
    e.close()
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), src)
    with pytest.raises(ferry.InvalidArgumentError, match="closed"):
        e.copy(dst, src)


def test_eight_links_on_one_gpu_byte_exact():
    """Eight host links as on an eight-GPU node (seven relays through GPU 0
    itself): staging for seven relays, both pipelines of each, reassembly,
    repeated copies each way and a batch, every byte compared."""
    e = mp.Engine(devices=[0], loopback=7, chunk_bytes=MiB + 4097, min_bytes=2 * MiB)
    try:
        assert len(e.links) == 8 and all(e.relays), (e.links, e.relays)
        # Seven relays, 3 buffers (outstanding) of chunk_bytes each at 64 KiB boundaries; the
        # own link carries GPU 0's copies itself and holds none.
        assert heap_staging(e, 1) == 7 * 3 * (MiB + 64 * KiB), e.staging
        n, offset = 48 * MiB + 5, 3
        for k in range(3):
            src = pinned(n + offset)
            src[offset:] = rand(n, seed=200 + k)
            dev = torch.full((n + offset,), POISON, dtype=torch.uint8, device="cuda:0")
            back = pinned(n + offset)
            before = e.bytes_by_link()
            assert e.copy(dev[offset:], src[offset:])["multipath"]
            assert e.copy(back[offset:], dev[offset:])["multipath"]
            torch.cuda.current_stream(0).synchronize()
            e.check()
            assert torch.equal(back[offset:], src[offset:]), k
            assert torch.all(dev[:offset].cpu() == POISON) and torch.all(back[:offset] == POISON)
            after = e.bytes_by_link()
            assert sum(after) - sum(before) == 2 * n
            assert sum(a > b for a, b in zip(after[1:], before[1:])) >= 1, (before, after)  # relays carried
        batch_round_trip(e, 0, [4097, 20 * MiB + 1, 7, 9 * MiB], seed=210)
    finally:
        e.close()


def test_default_engine_on_every_gpu():
    n = 24 * MiB + 5
    for d in range(GPU_COUNT):
        src = rand(n, seed=7 + d).pin_memory()
        dst = torch.full((n,), POISON, dtype=torch.uint8, device=f"cuda:{d}")
        ferry.multipath_copy(dst, src)
        back = pinned(n)
        ferry.multipath_copy(back, dst)
        torch.cuda.current_stream(d).synchronize()
        assert torch.equal(back, src), d
    mp.default_engine().check()


@pytest.mark.multigpu
@pytest.mark.parametrize("own_link_first", [True, False])
def test_relays_through_peer_gpus(own_link_first):
    devices = list(range(GPU_COUNT))
    e = mp.Engine(devices=devices, chunk_bytes=2 * MiB + 1, min_bytes=MiB, own_link_first=own_link_first)
    assert e.relays == [True] * len(devices)
    heap_staging(e, len(devices))
    n = 96 * MiB + 9
    for target in devices:
        before = e.bytes_by_link()
        src = rand(n, seed=30 + target).pin_memory()
        dst = torch.full((n,), POISON, dtype=torch.uint8, device=f"cuda:{target}")
        back = pinned(n)
        assert e.copy(dst, src)["links"] == len(devices)
        e.copy(back, dst)
        torch.cuda.current_stream(target).synchronize()
        e.check()
        assert torch.equal(back, src), target
        after = e.bytes_by_link()
        others = [d for d in devices if d != target]
        assert any(after[d] > before[d] for d in others), (target, before, after)
    # Only GPU 0 may relay: the others carry their own copies only.
    e2 = mp.Engine(devices=devices, relays=[0], chunk_bytes=2 * MiB, min_bytes=MiB, timeout=10)
    heap_staging(e2, 1)  # only the relay's
    src = rand(n, seed=40).pin_memory()
    dst = torch.full((n,), POISON, dtype=torch.uint8, device=f"cuda:{devices[-1]}")
    assert e2.copy(dst, src)["multipath"]
    e2.synchronize()  # bounded: raises where a chunk is stuck
    torch.cuda.synchronize(devices[-1])
    assert torch.equal(dst.cpu(), src)
    used = e2.bytes_by_link()
    assert all(used[d] == 0 for d in devices[1:-1]), used
    # A batch into each GPU over every link.
    for target in devices:
        r, _ = batch_round_trip(e, target, [33 * MiB + 1, 7, 12 * MiB, 4097], seed=100 + target)
        assert r["multipath"] and r["links"] == len(devices), r
    e.close()
    e2.close()


LAZY_LAUNCH = r"""
import sys, time, torch, ferry, ferry.multipath as mp
e = mp.Engine(devices=[0], loopback=2, chunk_bytes=8 << 20, min_bytes=1 << 20, timeout=2)
n = 1 << 30
src = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)).pin_memory()
dst = torch.full((n,), 0xA5, dtype=torch.uint8, device="cuda:0")  # poisoned
x = torch.zeros(1 << 20, device="cuda:0")  # every kernel used below, except cumsum, loaded now
torch.cuda.synchronize()
t = time.monotonic()
e.copy(dst, src)  # holds the current stream for ~20 ms
x.cumsum(0)  # a kernel's first launch, while the copy holds the stream
torch.cuda.synchronize()
took = time.monotonic() - t
try:
    e.check()
    landed = torch.equal(dst.cpu(), src)
    print(f"landed={landed} took={took:.2f}s")
    sys.exit(0 if landed else 3)
except ferry.BrokenError as err:
    print(f"broken took={took:.2f}s: {err}")
    sys.exit(0 if "CUDA_MODULE_LOADING=EAGER" in str(err) else 4)
"""


def test_a_first_kernel_launch_while_a_copy_holds_the_stream_never_hangs():
    """Lazy module loading: the launch blocks every CUDA call, the engine's too,
    until the held stream goes on. The copy either lands or, a second past its
    2 s timeout, the watchdog lets the stream go and the engine says why."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, CUDA_MODULE_LOADING="LAZY")
    run = subprocess.run(
        [sys.executable, "-c", LAZY_LAUNCH], env=env, capture_output=True, text=True, timeout=90
    )
    print(run.stdout.strip())
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]


TWO_PROGRAMS = r"""
import os, sys, time, torch, ferry.multipath as mp
rank, folder = int(sys.argv[1]), sys.argv[2]
n_gpu = torch.cuda.device_count()
target = rank % n_gpu
devices = list(range(n_gpu))
e = mp.Engine(devices=devices, loopback=2 if n_gpu == 1 else 0, chunk_bytes=(1 << 20) + 4097,
              min_bytes=1 << 20, timeout=20)
open(os.path.join(folder, f"ready-{rank}"), "w").close()
t = time.monotonic()
while len([f for f in os.listdir(folder) if f.startswith("ready-")]) < 2:  # both copy at once
    if time.monotonic() - t > 60:
        sys.exit("the other program never got ready")
    time.sleep(0.001)
g = torch.Generator().manual_seed(70 + rank)
stream = torch.cuda.Stream(target)
for i, n in enumerate([(37 << 20) + rank, 3 << 20, (64 << 20) + 5, (9 << 20) + 4097] * 3):
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).pin_memory()
    dst = torch.full((n,), 0xA5, dtype=torch.uint8, device=f"cuda:{target}")
    back = torch.full((n,), 0x5A, dtype=torch.uint8).pin_memory()
    assert e.copy(dst, src, stream=stream)["multipath"]
    assert e.copy(back, dst, stream=stream)["multipath"]
    stream.synchronize()
    e.check()
    if not torch.equal(back, src):
        sys.exit(f"program {rank}: copy {i} of {n} bytes came back wrong")
print(f"program {rank} ok, bytes by link {e.bytes_by_link()}")
e.close()
"""


def test_two_programs_copying_at_once_byte_exact(tmp_path):
    """Two processes, each with its own engine over every GPU (loopback relays
    on one GPU), copying into and out of their own GPU at the same time: each
    other's chunks are foreign copies on the shared links."""
    from harness import run_scripts

    for rc, out in run_scripts(TWO_PROGRAMS, [(0, tmp_path), (1, tmp_path)], timeout=150):
        print(out.strip().splitlines()[-1] if out.strip() else "")
        assert rc == 0, out[-3000:]

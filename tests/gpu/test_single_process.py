"""One process driving several GPUs (ferry.init_local)."""

import time

import _checks
import _workers_prelaunch
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
    fails = _checks.check_collectives(torch, comm, list(range(world)), devs, world, bufs)
    assert not fails, "\n".join(fails[:20])


def test_repeated_and_multi_stream(local_comm):
    torch, comm, world, bufs = local_comm
    devs = [torch.device("cuda", i) for i in range(world)]
    ranks = list(range(world))
    fails = _checks.check_repeats(torch, comm, ranks, devs, world, bufs)
    streams = [[torch.cuda.Stream(device=d) for _ in range(2)] for d in devs]
    fails += _checks.check_repeats(torch, comm, ranks, devs, world, bufs, reps=200, streams=streams)
    fails += _checks.check_same_buffers(torch, comm, ranks, devs, world, bufs)
    fails += _checks.check_same_buffers(torch, comm, ranks, devs, world, bufs, reps=10, streams=streams)
    assert not fails, "\n".join(fails[:20])


def test_sm_path_single_process(local_comm):
    """algo "sm" with one process driving every GPU: the correctness matrix
    within its size limit and 1,000 back-to-back calls (alternating slots)."""
    torch, comm, world, bufs = local_comm
    devs = [torch.device("cuda", i) for i in range(world)]
    ranks = list(range(world))
    fails = _checks.check_collectives(torch, comm, ranks, devs, world, bufs, algos=("sm",))
    fails += _checks.check_repeats(torch, comm, ranks, devs, world, bufs, algo="sm")
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
    # One local rank's stream capturing and the other's not: refused before
    # any rank's part is captured or enqueued, and the call then runs eagerly.
    outs = comm.alloc((2 * 16,), torch.uint8)
    ins = [torch.full((16,), 7 + i, dtype=torch.uint8, device=f"cuda:{i}") for i in range(2)]
    streams = [torch.cuda.Stream(device=i) for i in range(2)]
    for captured, pattern in (
        (0, r"streams\[0\] is capturing a CUDA graph and streams\[1\] is not;"),
        (1, r"streams\[0\] is not capturing a CUDA graph and streams\[1\] is;"),
    ):
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(captured), pytest.raises(ferry.InvalidArgumentError, match=pattern):
            with torch.cuda.graph(graph, stream=streams[captured], capture_error_mode="relaxed"):
                comm.all_gather(outs, ins, stream=streams)
    for o in outs:
        o.fill_(0xA5)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    comm.all_gather(outs, ins, stream=streams)
    for i in range(2):
        streams[i].synchronize()
        assert outs[i].tolist() == [7] * 16 + [8] * 16
    comm.close()
    with pytest.raises(ferry.ClosedError):
        comm.close()


def test_repeated_calls_after_their_buffers_changed():
    """A repeated call reuses its plan (coll/call_memo.hpp); what would make
    it wrong must not: its out buffer freed or deregistered, then the same
    pointers again, is refused; the same call with other data runs again,
    byte-exact; another size of the same op is planned anew."""
    import ferry
    import torch

    comm = ferry.init_local([0, 1], timeout=20)
    n = 4096
    for algo in ("auto", "sm"):
        bufs = comm.alloc((2 * n,), torch.uint8)
        for step in range(3):
            ins = [torch.full((n,), 16 * step + i, dtype=torch.uint8, device=f"cuda:{i}") for i in range(2)]
            comm.all_gather(bufs, ins, algo=algo)
            comm.synchronize()
            for i in range(2):
                want = torch.cat([torch.full((n,), 16 * step + j, dtype=torch.uint8) for j in range(2)])
                assert torch.equal(bufs[i].cpu(), want), (algo, step, i)
        half = [b[: n // 2 * 2] for b in bufs]
        comm.all_gather(half, [x[: n // 2] for x in ins], algo=algo)
        comm.synchronize()
        for i in range(2):
            assert torch.equal(half[i][: n // 2].cpu(), ins[0][: n // 2].cpu()), (algo, i)
            assert torch.equal(half[i][n // 2 :].cpu(), ins[1][: n // 2].cpu()), (algo, i)
        comm.free(bufs)
        # Caught here, not by pytest.raises: a failure report would print the
        # freed tensors, and reading them is itself an illegal address.
        message = _error_of(ferry, lambda b=bufs, a=algo: comm.all_gather(b, ins, algo=a))
        assert "expected device memory" in message, message
        del bufs, half
    own = [torch.empty(2 * n, dtype=torch.uint8, device=f"cuda:{i}") for i in range(2)]
    comm.register(own)
    ins = [torch.full((n,), 7 + i, dtype=torch.uint8, device=f"cuda:{i}") for i in range(2)]
    for _ in range(3):
        comm.all_gather(own, ins)
    comm.synchronize()
    comm.deregister(own)
    message = _error_of(ferry, lambda: comm.all_gather(own, ins))
    assert "not inside a buffer registered" in message, message
    comm.close()


def _error_of(ferry, call) -> str:
    """The message of the ferry error `call` raises (a failure message if none)."""
    try:
        call()
    except ferry.FerryError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


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


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
def test_calls_longer_than_a_stream_queue(local_comm, captured):
    """Calls longer than a stream's queue takes while the first wait holds.
    One thread enqueueing the ranks' parts in turn would block in rank 0's
    full queue behind a wait that only rank 1's commands release, and the
    call would fail at the timeout; each rank's part goes on a thread of its
    own instead. Eager: 4,096 rounds, repeats replayed from ferry's own graphs
    (captured and launched on those threads). Captured into the user's graphs,
    replayed one launch after another from one thread: 48 rounds (up to about
    1,700 operations a rank at world 8, where an in-place all_to_all's round
    is 36), which such a launch takes without blocking."""
    torch, comm, world, bufs = local_comm
    devs = [torch.device("cuda", i) for i in range(world)]
    streams = [torch.cuda.Stream(device=d) for d in devs]
    rounds = 48 if captured else 4096
    fails = _checks.check_long_calls(
        torch, comm, devs, world, bufs, streams=streams, captured=captured, rounds=rounds
    )
    assert not fails, "\n".join(fails)


def test_captured_calls_longer_than_a_graph_launch_takes_are_refused(local_comm, monkeypatch):
    """A call captured for several GPUs in one process is replayed by
    launching one graph per GPU from one thread; the first launch of a graph
    of 512 rounds blocked the host until the timeout (behind a wait that only
    the next graph releases). Such a capture is refused before anything is
    captured, naming the remedies; the same call then runs eagerly."""
    import ferry
    from fuzz import capture_per_rank

    torch, comm, world, bufs = local_comm
    devs = [torch.device("cuda", i) for i in range(world)]
    streams = [torch.cuda.Stream(device=d) for d in devs]
    monkeypatch.setenv("FERRY_REDUCE_ROUND_BYTES", "4096")
    count = 512 * 1024
    ins = [torch.ones(world * count, dtype=torch.int32, device=d) for d in devs]
    outs = [torch.full((count,), -7, dtype=torch.int32, device=d) for d in devs]
    call = lambda: comm.reduce_scatter(outs, ins, stream=streams)  # noqa: E731
    call()  # the scratch grows outside the capture
    comm.synchronize()
    with pytest.raises(ferry.InvalidArgumentError, match="one launch after another") as e:
        capture_per_rank(torch, devs, streams, call)
    assert "FERRY_REDUCE_ROUND_BYTES" in str(e.value) and "run it as a plain call" in str(e.value), str(
        e.value
    )
    for o in outs:
        o.fill_(-7)
    call()
    comm.synchronize()
    for r in range(world):
        assert torch.equal(outs[r], torch.full_like(outs[r], world)), f"rank {r} after the refusal"


def test_a_graph_of_many_calls_replayed_from_a_thread_per_gpu(local_comm, monkeypatch):
    """A graph holding many calls, each one short enough to capture, and
    together far longer than one GPU's launch takes without blocking (48
    reduce_scatters of 64 rounds: about 40,000 operations per GPU at world 2,
    whose first launch from one thread blocked until the timeout in
    bench/probes/captured_long_calls.py). Launched from a thread per GPU
    (torch's replay releases the GIL), every launch goes through. Two
    replays, random data, every byte compared."""
    import threading

    from fuzz import capture_per_rank

    torch, comm, world, bufs = local_comm
    devs = [torch.device("cuda", i) for i in range(world)]
    streams = [torch.cuda.Stream(device=d) for d in devs]
    monkeypatch.setenv("FERRY_REDUCE_ROUND_BYTES", "4096")
    count, calls = 64 * 1024, 48
    gen = torch.Generator().manual_seed(60)
    ins = [torch.empty(world * count, dtype=torch.int32, device=d) for d in devs]
    outs = [[torch.empty(count, dtype=torch.int32, device=d) for d in devs] for _ in range(calls)]

    def every_call():
        for k in range(calls):
            comm.reduce_scatter(outs[k], ins, stream=streams)

    comm.reduce_scatter(outs[0], ins, stream=streams)  # the scratch grows outside the capture
    comm.synchronize()
    graphs = capture_per_rank(torch, devs, streams, every_call)
    for replay in range(2):
        full = [
            torch.randint(-(1 << 20), 1 << 20, (world * count,), generator=gen, dtype=torch.int32)
            for _ in devs
        ]
        for i, f in zip(ins, full):
            i.copy_(f)
        for per_call in outs:
            for o in per_call:
                o.fill_(-7)
        for d in devs:
            torch.cuda.synchronize(d)
        errors = []

        def launch(d, g, s):
            try:
                with torch.cuda.device(d), torch.cuda.stream(s):
                    g.replay()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=launch, args=x) for x in zip(devs, graphs, streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for d in devs:
            torch.cuda.synchronize(d)
        comm.synchronize()
        for r in range(world):
            exp = sum(f[r * count : (r + 1) * count] for f in full)
            for k in range(calls):
                assert torch.equal(outs[k][r].cpu(), exp), f"replay {replay}, call {k}, rank {r}"


def test_arming_behind_runs_handed_to_kernels(local_comm, monkeypatch):
    """Runs whose triggers went to kernels may still wait behind their gates
    on the armed stream when another handle is armed; where they and the new
    one would pass what that stream's queue takes behind a wait, arm() first
    waits for the oldest of them (their kernels, launched already, fire them
    after 50 ms) instead of blocking inside CUDA, then arms. Three
    reduce_scatters of close to 480 stream operations a rank each (rounds of
    4 KiB), each armed while the ones before still wait: the third waits for
    the first. Every byte compared. (A kernel launched already would release
    a host blocked inside CUDA too: what only the wait does, raising instead
    of blocking for good, test_kv.py shows for page transfers.)"""
    import ferry

    torch, comm, world, bufs = local_comm
    devs = [torch.device("cuda", i) for i in range(world)]
    hooks = ferry._native.hooks()
    for d in devs:  # the trigger kernel's module loads now, not while a run is armed
        with torch.cuda.device(d):
            w = torch.zeros(1, dtype=torch.int64, device=d)
            hooks.launch_trigger_kernel(w.data_ptr(), 1, 1000, torch.cuda.current_stream(d).cuda_stream)
            torch.cuda.synchronize(d)
    monkeypatch.setenv("FERRY_REDUCE_ROUND_BYTES", "4096")
    count = (480 // (3 * world + 7)) * 1024  # a round: about 3 x world + 7 operations
    gen = torch.Generator().manual_seed(61)
    fulls, handles, outs, inputs = [], [], [], []  # kept alive: a handle holds pointers, not tensors
    for _ in range(3):
        full = [
            torch.randint(-(1 << 20), 1 << 20, (world * count,), generator=gen, dtype=torch.int32)
            for _ in devs
        ]
        ins = [f.to(d) for f, d in zip(full, devs)]
        out = [torch.full((count,), -7, dtype=torch.int32, device=d) for d in devs]
        fulls.append(full)
        outs.append(out)
        inputs.append(ins)
        handles.append(comm.prepare("reduce_scatter", out, ins))
    for d in devs:
        torch.cuda.synchronize(d)
    for h in handles:
        h.arm()
        for (word, value), d in zip(h.device_trigger(), devs):
            with torch.cuda.device(d):
                # 50 ms: the first run still waits when the third handle is armed.
                hooks.launch_trigger_kernel(word, value, 50_000_000, torch.cuda.current_stream(d).cuda_stream)
    for h in handles:
        h.wait()
    comm.synchronize()
    for k, (full, out) in enumerate(zip(fulls, outs)):
        for r in range(world):
            exp = sum(f[r * count : (r + 1) * count] for f in full)
            assert torch.equal(out[r].cpu(), exp), f"handle {k}, rank {r}"
    for h in handles:
        h.release()


def test_prepared_calls_longer_than_a_stream_queue_are_refused(local_comm, monkeypatch):
    """An armed call queues all its operations behind its gate, which opens at
    the trigger, after arm() returns: prepare() refuses one that would fill the
    queue (arm() would block), the longest it takes arms at once and reduces
    every byte right, and arm() refuses a second such handle while the first
    waits for its trigger."""
    import ferry

    torch, comm, world, bufs = local_comm
    devs = [torch.device("cuda", i) for i in range(world)]
    gen = torch.Generator().manual_seed(59)
    monkeypatch.setenv("FERRY_REDUCE_ROUND_BYTES", "4096")
    refused = 0
    for rounds in (64, 48, 32, 16, 8):
        count = rounds * 1024  # int32: rounds of 4 KiB
        full = [
            torch.randint(-(1 << 20), 1 << 20, (world * count,), generator=gen, dtype=torch.int32)
            for _ in devs
        ]
        ins = [f.to(d) for f, d in zip(full, devs)]
        outs = [torch.full((count,), -7, dtype=torch.int32, device=d) for d in devs]
        try:
            h = comm.prepare("reduce_scatter", outs, ins)
        except ferry.InvalidArgumentError as e:
            assert "operations on rank" in str(e) and "FERRY_REDUCE_ROUND_BYTES" in str(e), str(e)
            refused += 1
            continue
        start = time.monotonic()
        h.arm()
        armed_s = time.monotonic() - start
        h.trigger()
        h.wait()
        comm.synchronize()
        for r in range(world):
            exp = full[0][r * count : (r + 1) * count].clone()
            for q in range(1, world):
                exp += full[q][r * count : (r + 1) * count]
            assert torch.equal(outs[r].cpu(), exp), f"prepared reduce_scatter of {rounds} rounds, rank {r}"
        assert armed_s < 5, f"arming {rounds} rounds took {armed_s:.1f} s"
        h.release()
        # Every handle waits on one armed stream: a second such handle armed
        # before the first is triggered is refused, then taken once it is.
        first, second = comm.prepare("reduce_scatter", outs, ins), comm.prepare("reduce_scatter", outs, ins)
        first.arm()
        with pytest.raises(ferry.InvalidArgumentError, match="trigger those handles first"):
            second.arm()
        first.trigger()
        first.wait()
        second.arm()
        second.trigger()
        second.wait()
        comm.synchronize()
        for x in (first, second):
            x.release()
        break
    else:
        pytest.fail("every prepared reduce_scatter down to 8 rounds was refused")
    assert refused > 0, "a prepared reduce_scatter of 64 rounds of 4 KiB was not refused"


@pytest.mark.parametrize("algo", ["auto", "sm"])
@pytest.mark.parametrize("gate", ["host", "device"])
def test_untriggered_prepared_collective_is_reported(gate, algo):
    fails = _workers_prelaunch.untriggered_is_reported(gate, algo)
    assert not fails, "\n".join(fails)


def test_sm_path_on_a_large_grid():
    """FERRY_SM_MAX_BLOCKS=128 and a 16 MiB window, in a fresh process: the
    grid bounded by the GPU's occupancy (all 128 on an H200), every byte of
    the SM path's collectives and reductions up to the window's 16 MiB per
    peer checked, and a bound past 128 and a negative
    FERRY_SM_TWO_SHOT_BYTES refused naming the knob. (The grid a call got is
    not visible from Python; a hang or a wrong byte is what this can catch.)"""
    import os
    import subprocess
    import sys

    env = dict(os.environ, FERRY_SM_MAX_BLOCKS="128", FERRY_SM_BYTES=str(16 << 20), **_checks.SAFE_ENV)
    here = os.path.dirname(os.path.abspath(_checks.__file__))
    try:
        run = subprocess.run(
            [sys.executable, os.path.join(here, "_workers.py"), "sm-grid", str(min(GPU_COUNT, 4))],
            env=dict(env, FERRY_TEST_DUMP_S="270"),
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired as exc:  # the stacks faulthandler printed say where it hung
        pytest.fail(f"sm-grid hung:\n{exc.stdout!s:.3000}\n{exc.stderr!s:.3000}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.mark.parametrize("algo", ["auto", "sm"])
@pytest.mark.parametrize("connections", [1, 4])
def test_untriggered_with_few_hardware_queues(connections, algo):
    """The same with 1 or 4 CUDA hardware queues, in a fresh process: the
    watchdog's rescue stream, on which it opens a gate in GPU memory, must not
    wait behind the stream blocked by that gate."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, CUDA_DEVICE_MAX_CONNECTIONS=str(connections), **_checks.SAFE_ENV)
    here = os.path.dirname(os.path.abspath(_checks.__file__))
    run = subprocess.run(
        [sys.executable, os.path.join(here, "_workers.py"), "untriggered", "device", algo],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]

"""How long a collective captured into CUDA graphs in one process (init_local,
one graph per GPU) can be before the first GPU's graph launch blocks the host.

A graph of a call's part waits on flags that the other GPUs' parts set. Its
launch puts the graph's work on the GPU's queues; when they are full behind a
wait, cudaGraphLaunch blocks until that wait is released, which only the next
GPU's graph, not yet launched from this thread, would do (ferry's watchdog
releases it at FERRY_TIMEOUT_S and the call fails). For reduce_scatters of
growing numbers of 4 KiB rounds (FERRY_REDUCE_ROUND_BYTES) this times the
host's launch of GPU 0's graph alone, then launches the others and checks
every byte. A fresh communicator per size (a timed-out one is broken).
CALLS=n captures n such calls into each graph (a graph of many calls adds
up the same way); THREADS=1 launches each GPU's graph from a thread of its
own instead, timing GPU 0's.

    FERRY_TIMEOUT_S=5 [CALLS=1] [THREADS=0] python bench/probes/captured_long_calls.py [ROUNDS ...]
"""

import os
import sys
import threading
import time

os.environ.setdefault("FERRY_TIMEOUT_S", "5")
os.environ["FERRY_REDUCE_ROUND_BYTES"] = "4096"
for k, v in {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}.items():
    os.environ[k] = v

import ferry  # noqa: E402
import torch  # noqa: E402


def one(rounds: int, world: int) -> str:
    devs = [torch.device("cuda", i) for i in range(world)]
    comm = ferry.init_local(list(range(world)), timeout=float(os.environ["FERRY_TIMEOUT_S"]))
    streams = [torch.cuda.Stream(device=d) for d in devs]
    count = rounds * 1024
    g = torch.Generator().manual_seed(rounds)
    full = [
        torch.randint(-(1 << 20), 1 << 20, (world * count,), generator=g, dtype=torch.int32) for _ in devs
    ]
    ins = [f.to(d) for f, d in zip(full, devs)]
    outs = [torch.full((count,), -7, dtype=torch.int32, device=d) for d in devs]
    comm.reduce_scatter(outs, ins, stream=streams)  # warm-up: scratch and plan outside the graphs
    comm.synchronize()
    graphs = [torch.cuda.CUDAGraph() for _ in devs]
    for k, (d, s) in enumerate(zip(devs, streams)):
        with torch.cuda.device(d), torch.cuda.stream(s):
            graphs[k].capture_begin(capture_error_mode="relaxed")
    for _ in range(int(os.environ.get("CALLS", "1"))):
        comm.reduce_scatter(outs, ins, stream=streams)
    for k, (d, s) in enumerate(zip(devs, streams)):
        with torch.cuda.device(d), torch.cuda.stream(s):
            graphs[k].capture_end()
    for o in outs:
        o.fill_(-7)
    for d in devs:
        torch.cuda.synchronize(d)
    took = {}

    def launch(k):
        start = time.perf_counter()
        with torch.cuda.device(devs[k]), torch.cuda.stream(streams[k]):
            graphs[k].replay()
        took[k] = (time.perf_counter() - start) * 1e3

    if os.environ.get("THREADS", "0") == "1":
        threads = [threading.Thread(target=launch, args=(k,)) for k in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for k in range(world):
            launch(k)
    first_ms = took[0]
    for d in devs:
        torch.cuda.synchronize(d)
    right = all(
        torch.equal(outs[r].cpu(), sum(f[r * count : (r + 1) * count] for f in full)) for r in range(world)
    )
    try:
        comm.synchronize()
        state = "ok"
    except ferry.FerryError as exc:
        state = type(exc).__name__
    try:
        comm.close()
    except ferry.FerryError:
        pass
    return f"rounds {rounds:5d}: GPU 0's graph launch {first_ms:9.2f} ms on the host; bytes {'right' if right else 'WRONG'}; {state}"


def main():
    world = min(torch.cuda.device_count(), 2)
    if world < 2:
        print("needs 2 GPUs")
        return 0
    sizes = [int(a) for a in sys.argv[1:]] or [16, 32, 64, 128, 256, 512, 1024, 2048]
    for rounds in sizes:
        print(one(rounds, world), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

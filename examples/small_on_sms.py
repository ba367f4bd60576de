"""All-gathers on the critical path, four ways, each captured in a CUDA graph
of 20 calls, checked and timed:
  the default       copy engines and copy-engine signals: no SM at all;
  signals="kernel"  copy engines for the data, a one-block kernel per signal round;
  algo="sm"         one SM kernel (up to 32 blocks) moves everything (up to 1 MiB);
  "latency" preset  comm.set_tuning("latency"): "auto" picks among these per size
                    from a table shipped for the GPU model (H200).

torchrun --nproc-per-node 2 examples/small_on_sms.py
"""

import ferry
import torch

comm = ferry.init()  # rank, world and device from torchrun
rank, world = comm.rank, comm.world
WAYS = (
    ("default", dict()),
    ('signals="kernel"', dict(signals="kernel")),
    ('algo="sm"', dict(algo="sm")),
    ('"latency" preset', dict()),
)

for name, kw in WAYS:
    if name == '"latency" preset':
        try:
            comm.set_tuning("latency")  # the rest of this communicator's "auto" calls
        except ferry.InvalidArgumentError as exc:  # no table shipped for this GPU
            if rank == 0:
                print(f"skipping the preset: {exc}")
            break
    for n in (4096, 4 << 20):
        if kw.get("algo") == "sm" and not comm.sm_path_takes("all_gather", n):
            continue  # past the SM path's window (FERRY_SM_BYTES, 1 MiB)
        out = comm.alloc((world * n,), torch.uint8)
        shard = torch.full((n,), rank, dtype=torch.uint8, device=comm.device)
        expected = torch.arange(world, dtype=torch.uint8, device=comm.device).repeat_interleave(n)
        comm.all_gather(out, shard, **kw)  # warm-up outside the capture
        comm.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                comm.all_gather(out, shard, **kw)
        graph.replay()  # the first replay also uploads the graph: not timed
        out.fill_(0xFF)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        assert torch.equal(out, expected), f"rank {rank}: {name} gave wrong bytes"
        if rank == 0:
            us = start.elapsed_time(end) * 50
            how = f" ({comm.choose_algo('all_gather', n)}, signals {comm.choose_signals('all_gather', n)})"
            print(
                f"all_gather {n:>8} B per rank on {world} GPUs, {name:<16}: {us:6.1f} us per call"
                + (how if not kw else "")
            )
        del graph
        comm.free(out)
comm.close()

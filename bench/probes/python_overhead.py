"""Probe: host time of ferry's Python layer alone for one all_gather call, with
a stand-in native layer that does nothing (no GPU work is enqueued).

    python bench/probes/python_overhead.py           # __cuda_array_interface__ arrays, no torch, no GPU
    python bench/probes/python_overhead.py --torch   # torch CUDA tensors, the current torch stream

The second form needs a GPU (torch tensors on it) and adds what a torch user
pays: tensor accessors and the current-stream lookup. What is left of an eager
call's host time beyond this and FERRY_HOST_TRACE's native stages is the call
into the extension and the caller's own loop.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))

from ferry.comm import Communicator  # noqa: E402
from test_args import Cai, FakeNative  # noqa: E402


class Idle(FakeNative):
    def run(self, **kw):
        pass


def per_call_us(call, calls: int) -> float:
    for _ in range(1000):
        call()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch", action="store_true", help="torch CUDA tensors and the current stream")
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    comm = Communicator(Idle(world=4), local=False)
    if args.torch:
        import torch

        out = torch.empty(4 * 4096, dtype=torch.uint8, device="cuda:0")
        inp = torch.empty(4096, dtype=torch.uint8, device="cuda:0")
        us = per_call_us(lambda: comm.all_gather(out, inp), args.calls)
        print(f"ferry Python layer, torch tensors, current stream: {us:.2f} us per all_gather call")
        from ferry.comm import _stream_handle

        us = per_call_us(lambda: _stream_handle(None, 0), args.calls)
        print(f"  of which ferry's current-stream lookup: {us:.2f} us")
        us = per_call_us(lambda: torch.cuda.current_stream(0).cuda_stream, args.calls)
        print(f"  (torch.cuda.current_stream(0).cuda_stream: {us:.2f} us)")
    else:
        out, inp = Cai(4 * 4096), Cai(4096)
        us = per_call_us(lambda: comm.all_gather(out, inp, stream=5), args.calls)
        print(f"ferry Python layer: {us:.2f} us per all_gather call")


if __name__ == "__main__":
    main()

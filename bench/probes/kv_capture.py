"""Which capture settings let a page transfer be captured into a CUDA graph:
each mode captured under torch's default (global) error mode with the garbage
collector on and off, and under thread_local, then replayed and checked.

    python bench/probes/kv_capture.py
"""

import gc
import sys

import ferry.kv as kv
import torch


def attempt(mode: str, error_mode: str, collect: bool) -> str:
    host = kv.pinned_empty((64, 2048), torch.uint8)
    host.copy_(torch.randint(0, 256, host.shape, dtype=torch.uint8))
    gpu = torch.zeros((64, 2048), dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    if not collect:
        gc.disable()
    try:
        with torch.cuda.stream(s):
            kv.copy_blocks(gpu, host, [1, 5, 9], [2, 3, 4], mode=mode)
            with torch.cuda.graph(g, stream=s, capture_error_mode=error_mode):
                kv.copy_blocks(gpu, host, [1, 5, 9], [2, 3, 4], mode=mode)
        gpu.zero_()
        g.replay()
        torch.cuda.synchronize()
        ok = torch.equal(gpu[[1, 5, 9]].cpu(), host[[2, 3, 4]])
        return "ok" if ok else "WRONG"
    except Exception as exc:  # the probe reports, it does not stop
        torch.cuda.synchronize()
        return f"{type(exc).__name__}: {str(exc)[:160]}"
    finally:
        gc.enable()


def main() -> int:
    for mode in ("per_page", "batched", "kernel"):
        for error_mode, collect in (("global", True), ("global", False), ("thread_local", True)):
            print(
                f"{mode:<9} {error_mode:<12} gc={'on ' if collect else 'off'}: {attempt(mode, error_mode, collect)}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

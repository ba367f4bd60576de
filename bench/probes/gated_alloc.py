"""What, done by the program while a multipath copy holds its stream, stalls
the target GPU's own host-to-GPU copies (the engine's own-link chunks)?

Each case is a fresh process (20 s bound, FERRY_TIMEOUT_S=4) on two GPUs or
more: a 1 GiB pinned host -> GPU 0 copy through ferry.multipath on a stream
of its own (about 10 ms over every link), then, at once, one action on the
host; every byte checked. Every kernel the cases use runs once before the
copy, so that lazy module loading is not the cause; each case also runs
under CUDA_MODULE_LOADING=EAGER, and on the legacy default stream.

    python bench/probes/gated_alloc.py [part of a case's name]
"""

import os
import subprocess
import sys

HEAD = r"""
import ctypes, time, torch, ferry, ferry.multipath as mp
n = 1 << 30
src = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)).pin_memory()
dst = torch.full((n,), 0xA5, dtype=torch.uint8, device="cuda:0")
w = torch.ones(1 << 20, dtype=torch.uint8, device="cuda:0")
(w.to(torch.int16) + 1).to(torch.uint8)  # every kernel below, once
torch.empty(1, device="cuda:0").fill_(1)
keep = torch.empty(256 << 20, dtype=torch.uint8, device="cuda:0")
del keep  # a cached 256 MiB block
eng = mp.Engine()
s = STREAM
torch.cuda.synchronize()
from ferry.bench.multipath import Runtime
rt = Runtime().rt
t = time.monotonic()
eng.copy(dst, src, stream=s)
"""
ACTIONS = {
    "nothing": "",
    "a warmed kernel on another stream": "(w.to(torch.int16) + 1).to(torch.uint8)\n",
    "a warmed kernel on the copy's stream": "with torch.cuda.stream(s):\n    (w.to(torch.int16) + 1).to(torch.uint8)\n",
    "torch alloc from the cache": "x = torch.empty(256 << 20, dtype=torch.uint8, device='cuda:0')\n",
    "torch alloc of a new segment": "x = torch.empty(3 << 30, dtype=torch.uint8, device='cuda:0')\n",
    "cudaMalloc 1 GiB on GPU 0": "p = ctypes.c_void_p()\nassert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 30)) == 0\n",
    "cudaMalloc 1 GiB on GPU 1": "rt.cudaSetDevice(1)\np = ctypes.c_void_p()\n"
    "assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 30)) == 0\nrt.cudaSetDevice(0)\n",
    "cudaFree of a block": "p = ctypes.c_void_p()\n"
    "rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20))\nrt.cudaFree(p)\n",
    "pinned host alloc": "x = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()\n",
    "a kernel launched for the first time": "torch.arange(10, device='cuda:0').cumsum(0)\n",
    # The preload test's program after its copy: new allocations and kernels on the copy's stream.
    "casts and an add on new memory": "with torch.cuda.stream(s):\n    c = (dst.to(torch.int16) + 1).to(torch.uint8)\n",
}
# The copy's stream: one of its own, or the legacy default stream (torch's
# default), with which every blocking stream, the driver's too, synchronizes.
STREAMS = {"own": "torch.cuda.Stream(0)", "legacy": "torch.cuda.default_stream(0)"}
TAIL = r"""
s.synchronize()
took = time.monotonic() - t
try:
    eng.check()
    ok = torch.equal(dst, src.to("cuda:0", non_blocking=False))
    print(f"landed={ok} took={took * 1e3:.1f} ms bytes_by_link={eng.bytes_by_link()}")
except ferry.BrokenError as e:
    print(f"broken after {took:.1f} s: {str(e)[:160]}")
"""


def main():
    only = sys.argv[1] if len(sys.argv) > 1 else ""  # the cases whose label holds it
    for name, body in ACTIONS.items():
        for loading in ("LAZY", "EAGER"):
            for stream, make in STREAMS.items():
                label = f"{loading:5s} {stream:6s} {name}"
                if only not in label:
                    continue
                env = dict(os.environ, CUDA_MODULE_LOADING=loading, FERRY_TIMEOUT_S="4")
                program = HEAD.replace("STREAM", make) + body + TAIL
                try:
                    r = subprocess.run(
                        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=20
                    )
                    last = " | ".join(
                        x.strip()[:200] for x in (r.stdout + r.stderr).strip().splitlines()[-2:]
                    )
                    print(f"{label:52s} rc={r.returncode}  {last}", flush=True)
                except subprocess.TimeoutExpired:
                    print(f"{label:52s} TIMEOUT", flush=True)


if __name__ == "__main__":
    main()

"""Which condition makes the first 64 MB copy under LD_PRELOAD hang?

Each case is a fresh process (15 s bound) making one 64 MB pinned host ->
GPU 0 copy and checking every byte; one line per case with its exit status
and its last words. Cases vary one thing at a time: preload or the Python
API, EAGER or lazy module loading, the legacy default stream or a stream of
its own, and a warm-up copy first.

    python bench/probes/preload_cases.py [part of a case's name[|another part...]]
"""

import os
import subprocess
import sys

import ferry.multipath as mp

HEAD = r"""
import torch
n = 64 * (1 << 20) + 3
src = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)).pin_memory()
dst = torch.empty(n, dtype=torch.uint8, device="cuda:0")  # no kernel before the copy
torch.cuda.synchronize()
"""
COPIES = {
    "legacy stream, to()": "dst = src.to('cuda')\n",
    "legacy stream, copy_": "dst.copy_(src, non_blocking=True)\n",
    "own stream, copy_": "s = torch.cuda.Stream(0)\nwith torch.cuda.stream(s):\n    dst.copy_(src, non_blocking=True)\n",
    "python API, legacy stream": "import ferry.multipath as mp\nmp.copy(dst, src)\n",
    "python API, own stream": "import ferry.multipath as mp\ns = torch.cuda.Stream(0)\nmp.copy(dst, src, stream=s)\n",
    "warm copy first, then to()": "torch.empty(8 << 20, dtype=torch.uint8, pin_memory=True).to('cuda')\n"
    "torch.cuda.synchronize()\ndst = src.to('cuda')\n",
    # A kernel queued behind the copy while it holds its stream (the test's program does this).
    "legacy stream, copy_, kernel after": "dst.copy_(src, non_blocking=True)\nk = dst + 0\n",
    "own stream, copy_, kernel after": "s = torch.cuda.Stream(0)\nwith torch.cuda.stream(s):\n"
    "    dst.copy_(src, non_blocking=True)\n    k = dst + 0\n",
    "legacy stream, copy_, kernel on another stream": "dst.copy_(src, non_blocking=True)\n"
    "s = torch.cuda.Stream(0)\nwith torch.cuda.stream(s):\n    k = dst + 0\n",
    "python API, legacy stream, kernel after": "import ferry.multipath as mp\nmp.copy(dst, src)\nk = dst + 0\n",
    "python API, own stream, kernel after": "import ferry.multipath as mp\ns = torch.cuda.Stream(0)\n"
    "mp.copy(dst, src, stream=s)\nwith torch.cuda.stream(s):\n    k = dst + 0\n",
    # Pinned host memory allocated while the copy holds its stream.
    "legacy stream, copy_, pinned alloc after": "dst.copy_(src, non_blocking=True)\n"
    "x = torch.empty(n, dtype=torch.uint8).pin_memory()\n",
    "own stream, copy_, pinned alloc after": "s = torch.cuda.Stream(0)\nwith torch.cuda.stream(s):\n"
    "    dst.copy_(src, non_blocking=True)\nx = torch.empty(n, dtype=torch.uint8).pin_memory()\n",
    "python API, own stream, pinned alloc after": "import ferry.multipath as mp\ns = torch.cuda.Stream(0)\n"
    "mp.copy(dst, src, stream=s)\nx = torch.empty(n, dtype=torch.uint8).pin_memory()\n",
    "legacy stream, a kernel first, copy_, kernel after": "torch.ones(1, device='cuda')\ntorch.cuda.synchronize()\n"
    "dst.copy_(src, non_blocking=True)\nk = dst + 0\n",
    # libferry's own kernel (its runtime, the same context) first: is the stall the context's first launch?
    "legacy stream, a ferry kernel first, copy_, kernel after": "import ferry.kv as kv\n"
    "pa = torch.empty(4, 256, dtype=torch.uint8, device='cuda')\npb = torch.empty_like(pa)\n"
    "kv.copy_blocks(pb, pa, [0, 1], [1, 2], mode='kernel')\ntorch.cuda.synchronize()\n"
    "dst.copy_(src, non_blocking=True)\nk = dst + 0\n",
    "legacy stream, copy_, kernel, copy back": "back = torch.empty(n, dtype=torch.uint8).pin_memory()\n"
    "dst.copy_(src, non_blocking=True)\nk = dst + 1\nback.copy_(k, non_blocking=True)\n",
}
# test_preload.py's program, whole and with one thing changed each: which of
# its steps after the second copy holds that copy's own-link chunks (it failed
# with and without a kernel launched first, on four H200s).
PROGRAM = r"""
torch.ones(1, device="cuda"); torch.cuda.synchronize()
a = src.to("cuda")
b = torch.empty(n, dtype=torch.uint8, device="cuda")
b.copy_(src, non_blocking=True)
c = (b.to(torch.int16) + 1).to(torch.uint8)
back = PINNED
back.copy_(c, non_blocking=True)
SYNC
assert torch.equal(a.cpu(), src) and torch.equal(back, (src.to(torch.int16) + 1).to(torch.uint8))
"""
VARIANTS = {
    "program as tested": {},
    "program, back pinned before the copies": {"PINNED": "back_early", "SYNC": "torch.cuda.synchronize()"},
    "program, no copy back": {"back.copy_(c, non_blocking=True)": "back.copy_(c.cpu())"},
    "program, stream sync instead of device sync": {"SYNC": "torch.cuda.current_stream().synchronize()"},
    "program, no kernels after the copy": {
        "c = (b.to(torch.int16) + 1).to(torch.uint8)": "c = b",
        "(src.to(torch.int16) + 1).to(torch.uint8)": "src",
    },
}
for name, edits in VARIANTS.items():
    body = PROGRAM
    defaults = {
        "PINNED": "torch.empty(n, dtype=torch.uint8).pin_memory()",
        "SYNC": "torch.cuda.synchronize()",
    }
    for old_text, new_text in {**defaults, **edits}.items():
        body = body.replace(old_text, new_text)
    if "back_early" in body:
        body = "back_early = torch.empty(n, dtype=torch.uint8).pin_memory()\n" + body
    COPIES[name] = body + "dst.copy_(src)\n"  # the common tail's check: the program asserts its own

# The Python API's engine reports a copy that timed out (its stream let go) only
# on its next call: ask it, or such a case would pass once the late chunks land.
TAIL = (
    "torch.cuda.synchronize()\n"
    "import ferry.multipath as _mp\n"
    "_mp._default is None or _mp._default.check()\n"
    "assert torch.equal(dst.cpu(), src), 'bytes differ'\nprint('ok')\n"
    "import sys\nsys.stderr.flush()\n"
)


def main():
    only = (sys.argv[1] if len(sys.argv) > 1 else "").split(
        "|"
    )  # run the cases whose name holds one of these
    lib = mp.preload_library()
    base = dict(os.environ, FERRY_DEBUG="1", FERRY_TIMEOUT_S="5")
    cases = []
    for name, body in COPIES.items():
        python_api = name.startswith("python API")
        for loading in ("EAGER", "LAZY"):
            if not python_api and loading == "LAZY":
                continue  # the preload library turns itself off under lazy loading
            env = dict(base, CUDA_MODULE_LOADING=loading)
            if not python_api:
                env["LD_PRELOAD"] = lib
            cases.append((f"{'preload' if not python_api else 'api'} {loading:5s} {name}", env, body))
    # PRELOAD_CONNECTIONS="1,32": each case also under those CUDA_DEVICE_MAX_CONNECTIONS (hardware queues
    # that streams share: a stream waiting at the head of one holds the work of the others behind it).
    conns = [c for c in os.environ.get("PRELOAD_CONNECTIONS", "").split(",") if c]
    cases += [
        (f"{label} conn={c}", dict(env, CUDA_DEVICE_MAX_CONNECTIONS=c), body)
        for c in conns
        for label, env, body in list(cases)
    ]
    # PRELOAD_OWN_SHARE=1: each case also with FERRY_MULTIPATH_OWN_SHARE_ON_STREAM=1 (the target link's share
    # copied by the caller's stream before the gate; nothing reaches that GPU after the copy returns).
    if os.environ.get("PRELOAD_OWN_SHARE") == "1":
        cases += [
            (f"{label} own-share", dict(env, FERRY_MULTIPATH_OWN_SHARE_ON_STREAM="1"), body)
            for label, env, body in list(cases)
        ]
    for label, env, body in cases:
        if not any(part in label for part in only):
            continue
        try:
            r = subprocess.run(
                [sys.executable, "-c", HEAD + body + TAIL],
                env=env,
                capture_output=True,
                text=True,
                timeout=20,
            )
            out = (r.stdout + r.stderr).strip().splitlines()
            keep = [line for line in out if "pageable" not in line and "routing" not in line]
            # The error's own line first (torch's advice about CUDA_LAUNCH_BLOCKING comes after it).
            errors = [line for line in keep if "Error" in line or "error:" in line or "failed" in line][-3:]
            last = " | ".join(line.strip()[:200] for line in errors + keep[-3:])
            # A chunk that "did not land" is a failure even where the process ended well.
            stuck = any("did not land" in line for line in out)
            verdict = "FAIL" if r.returncode != 0 or stuck else "pass"
            print(f"{verdict} {label:50s} rc={r.returncode}{' stuck' if stuck else ''}  {last}")
        except subprocess.TimeoutExpired:
            print(f"FAIL {label:50s} TIMEOUT")


if __name__ == "__main__":
    main()

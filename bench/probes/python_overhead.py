"""Probe: host time of ferry's Python layer alone for one all_gather call, with
a stand-in native layer that does nothing and __cuda_array_interface__ arrays
(no torch, no GPU). What is left of an eager call's host time beyond this and
FERRY_HOST_TRACE's native stages is torch tensor access, the stream lookup and
the call into the extension.

    python bench/probes/python_overhead.py
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))

from ferry.comm import Communicator  # noqa: E402
from test_args import Cai, FakeNative  # noqa: E402


class Idle(FakeNative):
    def run(self, **kw):
        pass


def main(calls: int = 20000) -> None:
    comm = Communicator(Idle(world=4), local=False)
    out, inp = Cai(4 * 4096), Cai(4096)
    for _ in range(1000):
        comm.all_gather(out, inp, stream=5)
    t0 = time.perf_counter()
    for _ in range(calls):
        comm.all_gather(out, inp, stream=5)
    print(f"ferry Python layer: {(time.perf_counter() - t0) / calls * 1e6:.2f} us per all_gather call")


if __name__ == "__main__":
    main()

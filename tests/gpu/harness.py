"""Runs a worker in one process per GPU and collects their failures (bounded)."""

import multiprocessing as mp
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(target, world: int, timeout: float = 600.0) -> dict:
    import _workers

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_workers.run, args=(target, r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results, deadline = {}, time.monotonic() + timeout
    while len(results) < world and time.monotonic() < deadline:
        try:
            rank, fails = queue.get(timeout=1)
            results[rank] = fails
        except Exception:  # noqa: BLE001
            # A rank may exit without reporting (the dying peer): stop once all have exited.
            if all(p.exitcode is not None for p in procs):
                break
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    return results


def run_on_every_rank(worker, world: int, timeout: float = 600.0) -> None:
    """Spawns `worker` on `world` GPUs; every rank must report and pass."""
    results = spawn(worker, world, timeout=timeout)
    assert len(results) == world, f"only ranks {sorted(results)} reported"
    fails = [f for r in results.values() for f in r]
    assert not fails, "\n".join(fails[:20])


def run_scripts(script: str, argvs, env=None, timeout: float = 90.0) -> list:
    """`python -c script *argv` for each argv at once; each process's
    (returncode, stdout and stderr). All are killed, and the test fails
    naming what came back, when one has not finished within `timeout`."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *[str(a) for a in argv]],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for argv in argvs
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(
                f"a process did not finish within {timeout:.0f} s; output so far: {outs}"
            ) from None
    return [(p.returncode, out) for p, out in zip(procs, outs)]

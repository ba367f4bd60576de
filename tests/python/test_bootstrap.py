import socket
import threading
import time

import pytest
from ferry import InvalidArgumentError, PeerTimeoutError
from ferry.bootstrap import TcpStore, read_launch_env, store_allgather


def test_torchrun_env():
    info = read_launch_env(
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "123"}
    )
    assert (info.rank, info.world, info.local_rank, info.master_addr, info.master_port, info.launcher) == (
        3,
        4,
        1,
        "h",
        123,
        "torchrun",
    )


def test_mpirun_env_and_defaults():
    info = read_launch_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"})
    assert info.launcher == "openmpi" and info.local_rank == 1 and info.master_port == 29500


def test_no_launcher():
    assert read_launch_env({}) is None


def test_bad_env_is_named():
    with pytest.raises(InvalidArgumentError, match="WORLD_SIZE=.x. is not an integer"):
        read_launch_env({"RANK": "0", "WORLD_SIZE": "x"})
    with pytest.raises(InvalidArgumentError, match="inconsistent"):
        read_launch_env({"RANK": "4", "WORLD_SIZE": "4"})


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_store_allgather_across_threads():
    world, port = 4, _free_port()
    stores = {0: TcpStore("127.0.0.1", port, is_server=True, timeout=10)}
    results = {}

    def rank(r):
        st = stores[0] if r == 0 else TcpStore("127.0.0.1", port, is_server=False, timeout=10)
        ag = store_allgather(st, r, world, timeout=10)
        results[r] = (ag(f"a{r}".encode()), ag(f"b{r}".encode()))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in range(world):
        assert results[r][0] == [f"a{i}".encode() for i in range(world)]
        assert results[r][1] == [f"b{i}".encode() for i in range(world)]
    stores[0].close()


def test_missing_rank_is_named_within_the_bound():
    port = _free_port()
    store = TcpStore("127.0.0.1", port, is_server=True, timeout=5)
    other = TcpStore("127.0.0.1", port, is_server=False, timeout=5)
    store_allgather(other, 2, 4, timeout=5)  # rank 2 only builds; rank 2 will set below
    other.set("ferry/1/2", b"x")
    t0 = time.monotonic()
    with pytest.raises(PeerTimeoutError, match=r"rank\(s\) 1, 3 never arrived within 0.3 s"):
        store_allgather(store, 0, 4, timeout=0.3)(b"me")
    assert time.monotonic() - t0 < 3
    store.close()
    other.close()


def test_unreachable_store_times_out():
    t0 = time.monotonic()
    with pytest.raises(PeerTimeoutError, match="is rank 0 running"):
        TcpStore("127.0.0.1", _free_port(), is_server=False, timeout=0.3)
    assert time.monotonic() - t0 < 5

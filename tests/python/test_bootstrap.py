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
    with pytest.raises(InvalidArgumentError, match="torchrun: LOCAL_RANK=-1; expected a GPU ordinal"):
        read_launch_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"})


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(port=70000, is_server=False), "port is 70000; expected 1..65535"),
        (dict(port=0, is_server=False), "port is 0; expected 1..65535"),
        (dict(port="29500", is_server=True), r"port is '29500'; expected 1..65535 \(0: any free port\)"),
        (dict(port=True, is_server=True), "port is True"),
        (dict(port=29500, is_server=False, timeout=-1), "timeout is -1; expected seconds, more than 0"),
        (dict(port=29500, is_server=False, timeout=float("nan")), "timeout is nan"),
        (dict(port=29500, is_server=False, timeout="5"), "timeout is '5'"),
    ],
)
def test_a_store_port_or_timeout_that_is_none_is_named(kw, message):
    # Named here, not as an OverflowError or TypeError of the socket layer, nor a nan deadline never passed.
    with pytest.raises(InvalidArgumentError, match=message):
        TcpStore("127.0.0.1", **kw)


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
    other.set("ferry/1/1/2", b"x")  # the store's first all-gather, its round 1, rank 2
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


def test_a_second_allgather_over_one_store_reads_its_own_records():
    """Two communicators made one after the other over one store: the second's
    rounds never return the first's records (keys were once per round only)."""
    world, port = 2, _free_port()
    server = TcpStore("127.0.0.1", port, is_server=True, timeout=10)
    client = TcpStore("127.0.0.1", port, is_server=False, timeout=10)
    stores = [server, client]
    first = [store_allgather(stores[r], r, world, timeout=5) for r in range(world)]
    out = {}
    threads = [
        threading.Thread(target=lambda r=r: out.__setitem__(r, first[r](b"A%d" % r))) for r in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {0: [b"A0", b"A1"], 1: [b"A0", b"A1"]}
    # The second: rank 0 alone arrives; it must wait for rank 1, not read its old record.
    second = store_allgather(server, 0, world, timeout=0.3)
    with pytest.raises(PeerTimeoutError, match=r"rank\(s\) 1 never arrived"):
        second(b"B0")
    server.close()
    client.close()


def _listener(reply: bytes):
    """A program on a port that accepts and sends `reply` (or nothing) to each connection."""
    srv = socket.create_server(("127.0.0.1", 0))
    conns = []

    def run():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            conns.append(c)
            if reply:
                c.sendall(reply)

    threading.Thread(target=run, daemon=True).start()
    return srv, conns


def test_a_store_that_never_answers_is_named(monkeypatch):
    srv, _ = _listener(b"")
    monkeypatch.setattr(TcpStore, "_REPLY_GRACE_S", 0.2)
    store = TcpStore("127.0.0.1", srv.getsockname()[1], is_server=False, timeout=5)
    t0 = time.monotonic()
    with pytest.raises(PeerTimeoutError, match=r"did not answer within 0.5 s; is rank 0 stopped"):
        store.get_many(["k"], 0.3)
    assert time.monotonic() - t0 < 3
    store.close()
    srv.close()


def test_another_program_on_the_port_is_named():
    """Its bytes are not taken for a length (b"HTTP" read as one asked for 1.2 GB) nor unpickled."""
    srv, _ = _listener(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    store = TcpStore("127.0.0.1", srv.getsockname()[1], is_server=False, timeout=5)
    with pytest.raises(InvalidArgumentError, match=r"is not ferry's bootstrap store: .*set FERRY_PORT"):
        store.set("k", b"v")
    store.close()
    srv.close()


def test_a_port_in_use_is_named():
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    with pytest.raises(
        InvalidArgumentError, match=rf"cannot serve the bootstrap store at 127.0.0.1:{port}.*FERRY_PORT"
    ):
        TcpStore("127.0.0.1", port, is_server=True, timeout=1)
    holder.close()


def test_store_messages_round_trip_without_pickle():
    from ferry.bootstrap import _pack, _unpack

    msg = ("get", ["a", "b"], 1.5)
    assert _unpack(_pack(msg)[8:]) == ["get", ["a", "b"], 1.5]
    assert _unpack(_pack(("ok", {"k": b"\x00\xff"}))[8:]) == ["ok", {"k": b"\x00\xff"}]

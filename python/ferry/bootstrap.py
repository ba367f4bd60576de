"""How ranks find each other before any GPU work: the launcher's environment,
and an out-of-band all-gather over a TCP store, a torch.distributed store, or a
torch process group. Every wait is bounded; a timeout names the missing ranks."""

from __future__ import annotations

import base64
import json
import math
import numbers
import os
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Callable, Optional

from .errors import InvalidArgumentError, PeerTimeoutError

AllGather = Callable[[bytes], Sequence[bytes]]


@dataclass(frozen=True)
class LaunchInfo:
    rank: int
    world: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str


def env_int(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise InvalidArgumentError(f"environment variable {name}={value!r} is not an integer") from None


# (launcher, rank, world, local rank) variables, first match wins.
_LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)


def read_launch_env(env: Optional[Mapping[str, str]] = None) -> Optional[LaunchInfo]:
    """Rank, world and rendezvous address from torchrun, mpirun or srun; None if
    the process was not started by one of them."""
    env = os.environ if env is None else env
    for launcher, rank_var, world_var, local_var in _LAUNCHERS:
        if rank_var in env and world_var in env:
            rank, world = env_int(env, rank_var), env_int(env, world_var)
            local = env_int(env, local_var) if local_var in env else rank
            if world < 1 or not 0 <= rank < world:
                raise InvalidArgumentError(
                    f"{launcher}: {rank_var}={rank} and {world_var}={world} are inconsistent; "
                    "expected 0 <= rank < world"
                )
            if local < 0:
                raise InvalidArgumentError(
                    f"{launcher}: {local_var}={local}; expected a GPU ordinal, 0 or more"
                )
            addr = env.get("MASTER_ADDR", "127.0.0.1")
            port = env_int(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500
            return LaunchInfo(rank, world, local, addr, port, launcher)
    return None


# ---------------------------------------------------------------- TCP store

# Every message: this magic, a length, then JSON (bytes as base64). Nothing
# from the port is unpickled: anyone on the machine (or, with an empty
# MASTER_ADDR, the network) can connect to it. A record the bootstrap
# exchanges is at most a few MB; longer is not this protocol.
_MAGIC = b"FRY1"
_MAX_MESSAGE = 256 << 20


class _Foreign(ConnectionError):
    """The other end does not speak the store's protocol."""


def _pack(obj) -> bytes:
    def enc(v):
        if isinstance(v, (bytes, bytearray)):
            return {"b": base64.b64encode(bytes(v)).decode("ascii")}
        if isinstance(v, dict):
            return {"d": {k: enc(x) for k, x in v.items()}}
        if isinstance(v, (list, tuple)):
            return {"l": [enc(x) for x in v]}
        return {"v": v}

    data = json.dumps(enc(obj)).encode()
    return _MAGIC + struct.pack("!I", len(data)) + data


def _unpack(data: bytes):
    def dec(v):
        if not isinstance(v, dict) or len(v) != 1:
            raise _Foreign("a malformed store message")
        ((kind, x),) = v.items()
        if kind == "b":
            return base64.b64decode(x)
        if kind == "d":
            return {k: dec(y) for k, y in x.items()}
        if kind == "l":
            return [dec(y) for y in x]
        if kind == "v" and isinstance(x, (str, int, float)):
            return x
        raise _Foreign("a malformed store message")

    try:
        return dec(json.loads(data))
    except (ValueError, TypeError, AttributeError) as exc:
        raise _Foreign(f"a malformed store message ({exc})") from None


def _send(sock: socket.socket, obj) -> None:
    sock.sendall(_pack(obj))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("store connection closed")
        buf += chunk
    return buf


def _recv(sock: socket.socket):
    head = _recv_exact(sock, 8)
    if head[:4] != _MAGIC:
        raise _Foreign(f"a message that does not start with ferry's store header ({head[:4]!r})")
    (n,) = struct.unpack("!I", head[4:])
    if n > _MAX_MESSAGE:
        raise _Foreign(f"a message of {n} bytes (at most {_MAX_MESSAGE})")
    return _unpack(_recv_exact(sock, n))


class _StoreServer:
    """Key-value server run by rank 0: SET key value, GET keys timeout."""

    def __init__(self, host: str, port: int):
        self._data: dict = {}
        self._cv = threading.Condition()
        try:
            self._sock = socket.create_server((host, port), reuse_port=False)
        except OSError as exc:
            raise InvalidArgumentError(
                f"rank 0 cannot serve the bootstrap store at {host or '*'}:{port} ({exc.strerror or exc}); "
                "another ferry communicator or job on this machine may hold that port: set FERRY_PORT "
                "(default MASTER_PORT + 1) to a free one, the same on every rank"
            ) from None
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.port = self._sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="ferry-store").start()

    def _accept(self):
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket):
        with conn:
            try:
                while True:
                    op, *args = _recv(conn)
                    if op == "set":
                        key, value = args
                        with self._cv:
                            self._data[key] = value
                            self._cv.notify_all()
                        _send(conn, ("ok",))
                    elif op == "get":
                        keys, timeout = args
                        deadline = time.monotonic() + float(timeout)
                        with self._cv:
                            while not all(k in self._data for k in keys):
                                left = deadline - time.monotonic()
                                if left <= 0:
                                    break
                                self._cv.wait(left)
                            found = {k: self._data[k] for k in keys if k in self._data}
                        _send(conn, ("ok", found))
                    else:
                        return
            except (ConnectionError, OSError, EOFError, ValueError, TypeError):
                return  # a client gone, or one that does not speak the protocol

    def close(self):
        self._closed = True
        self._sock.close()


class TcpStore:
    """A small key-value store over TCP: rank 0 serves, everyone (rank 0 too)
    is a client. Used by ferry.init() when no torch store is given. Every
    request is bounded: a store that does not answer (rank 0 stopped, or
    another program on the port) is an error naming it."""

    # What a reply may take beyond the wait it was asked for.
    _REPLY_GRACE_S = 10.0

    def __init__(self, host: str, port: int, is_server: bool, timeout: float = 300.0):
        # (a nan or negative timeout would make every wait below unbounded or an error of the socket layer)
        if (
            isinstance(port, bool)
            or not isinstance(port, int)
            or not (0 if is_server else 1) <= port <= 65535
        ):
            raise InvalidArgumentError(
                f"TcpStore: port is {port!r}; expected 1..65535{' (0: any free port)' if is_server else ''}"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not 0 < timeout < math.inf:
            raise InvalidArgumentError(f"TcpStore: timeout is {timeout!r}; expected seconds, more than 0")
        timeout = float(timeout)  # (numpy's floats, fractions: the socket layer takes floats)
        self.timeout = timeout
        self._server = _StoreServer(host if host else "0.0.0.0", port) if is_server else None
        if self._server is not None:
            port = self._server.port
        self.host, self.port = host, port
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._sock = socket.create_connection((host, port), timeout=min(5.0, timeout))
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise PeerTimeoutError(
                        f"could not reach the bootstrap store of rank 0 at {host}:{port} within "
                        f"{timeout:g} s ({exc}); is rank 0 running?"
                    ) from None
                time.sleep(0.05)
        self._lock = threading.Lock()

    def _request(self, msg, wait_s: float):
        bound = wait_s + self._REPLY_GRACE_S
        with self._lock:
            self._sock.settimeout(bound)
            try:
                _send(self._sock, msg)
                return _recv(self._sock)
            except socket.timeout:
                raise PeerTimeoutError(
                    f"the bootstrap store of rank 0 at {self.host}:{self.port} did not answer within "
                    f"{bound:g} s; is rank 0 stopped, or another program on that port (FERRY_PORT)?"
                ) from None
            except _Foreign as exc:
                raise InvalidArgumentError(
                    f"the program at {self.host}:{self.port} is not ferry's bootstrap store: it sent {exc}; "
                    "another program holds that port: set FERRY_PORT (default MASTER_PORT + 1) on every rank"
                ) from None

    def set(self, key: str, value: bytes) -> None:
        self._request(("set", key, bytes(value)), 0.0)

    def peek(self, key: str) -> Optional[bytes]:
        """The key's value now, or None: no wait."""
        return self.get_many([key], 0.0).get(key)

    def get_many(self, keys: Sequence[str], timeout: float) -> dict:
        """Whatever of `keys` is set within `timeout` seconds."""
        reply = self._request(("get", list(keys), float(timeout)), float(timeout))
        if not (isinstance(reply, list) and len(reply) == 2 and isinstance(reply[1], dict)):
            raise InvalidArgumentError(
                f"the program at {self.host}:{self.port} is not ferry's bootstrap store (a malformed reply)"
            )
        return reply[1]

    def close(self) -> None:
        try:
            self._sock.close()
        finally:
            if self._server is not None:
                self._server.close()


class TorchStore:
    """Adapts a torch.distributed Store (TCPStore, FileStore, ...) to get_many."""

    def __init__(self, store):
        self._store = store

    def set(self, key: str, value: bytes) -> None:
        self._store.set(key, bytes(value))

    def peek(self, key: str) -> Optional[bytes]:
        """The key's value now, or None: no wait (check, not a zero-length wait)."""
        return bytes(self._store.get(key)) if self._store.check([key]) else None

    def get_many(self, keys: Sequence[str], timeout: float) -> dict:
        from datetime import timedelta

        try:
            self._store.wait(list(keys), timedelta(seconds=timeout))
        except Exception:  # torch raises on timeout; report what did arrive
            pass
        return {k: bytes(self._store.get(k)) for k in keys if self._store.check([k])}


def store_allgather(store, rank: int, world: int, timeout: float, prefix: str = "ferry") -> AllGather:
    """An all-gather over a store with set/get_many; each call is one round.
    Each all-gather made over one store gets keys of its own: every rank
    counts, in a key of its own, how many it has made there, and ranks make
    them in the same order (a communicator's setup is collective), so a
    second communicator over the store never reads the first one's records."""
    own = f"{prefix}/made/{rank}"
    before = store.peek(own) if hasattr(store, "peek") else store.get_many([own], 0.0).get(own)
    made = int(before or b"0") + 1
    store.set(own, str(made).encode())
    counter = [0]

    def allgather(mine: bytes) -> list:
        counter[0] += 1
        base = f"{prefix}/{made}/{counter[0]}"
        store.set(f"{base}/{rank}", mine)
        keys = [f"{base}/{r}" for r in range(world)]
        found = store.get_many(keys, timeout)
        missing = [r for r, k in enumerate(keys) if k not in found]
        if missing:
            raise PeerTimeoutError(
                f"rank {rank}: bootstrap round {counter[0]}: rank(s) {', '.join(map(str, missing))} "
                f"never arrived within {timeout:g} s"
            )
        return [found[k] for k in keys]

    return allgather


def group_on_host(group=None) -> bool:
    """Whether `group`'s all-gather moves its bytes on the host alone (gloo),
    so that it cannot wait for a GPU; an NCCL group's goes through the GPU
    (a mixed backend counts as not host-only)."""
    import torch.distributed as dist

    return dist.get_backend(group) == "gloo"


def group_allgather(group=None, device: Optional[int] = None) -> AllGather:
    """An all-gather over a torch.distributed process group (bounded by the
    group's own timeout). With `device`, it runs with that GPU current: an NCCL
    group moves the objects through the current GPU, and ranks that all left
    GPU 0 current fail there ("Duplicate GPU detected")."""
    import contextlib

    import torch
    import torch.distributed as dist

    def allgather(mine: bytes) -> list:
        out = [None] * dist.get_world_size(group)
        with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
            dist.all_gather_object(out, bytes(mine), group=group)
        return out

    return allgather

"""Argument checks of the Python layer, against a stand-in native communicator:
no GPU needed."""

import warnings

import pytest
from ferry import ClosedError, InvalidArgumentError
from ferry.comm import Communicator, _describe


class FakeNative:
    def __init__(self, world=4, local_count=1, gpu_name="NVIDIA H200"):
        self.world, self.local_count, self.closed, self.calls = world, local_count, False, []
        self.gpu_name = gpu_name

    def device(self, i):
        return i

    def rank(self, i):
        return i

    def run(self, **kw):
        self.calls.append(kw)

    def set_selector_table(self, rules):
        self.rules = rules

    def set_selector_preset(self, preset):
        # The native communicator's answer for a GPU with no such table
        # (coll/tuning.hpp, tested in tests/cpu/test_tuning.cpp).
        if preset == "fastest":
            raise InvalidArgumentError("preset is 'fastest'; expected one of sm-free, latency")
        self.preset = preset

    def close(self):
        self.closed = True


class Cai:
    def __init__(self, n, typestr="<u1", strides=None, shape=None):
        self.__cuda_array_interface__ = dict(
            shape=shape or (n,), typestr=typestr, data=(0x7000, False), version=3, strides=strides
        )


def test_describe_rejects_non_arrays_and_strided():
    with pytest.raises(InvalidArgumentError, match="out is a list"):
        _describe([1, 2], "out")
    with pytest.raises(InvalidArgumentError, match="in is not contiguous"):
        _describe(Cai(0, shape=(4, 4), strides=(1, 4)), "in")
    assert _describe(Cai(16, "<f4"), "in").nbytes == 64


class TensorLike:
    """The torch.Tensor surface _describe reads (torch is not needed here)."""

    def __init__(self, n, device=0, contiguous=True, dtype="torch.float16", itemsize=2, ptr=0x9000):
        self._n, self._dev, self._contig, self.dtype, self.itemsize, self._ptr = (
            n,
            device,
            contiguous,
            dtype,
            itemsize,
            ptr,
        )
        self.device = f"cuda:{device}" if device >= 0 else "cpu"

    def get_device(self):
        return self._dev

    def is_contiguous(self):
        return self._contig

    def data_ptr(self):
        return self._ptr

    @property
    def nbytes(self):
        return self._n * self.itemsize


def test_describe_torch_tensors():
    b = _describe(TensorLike(10, device=1), "out")
    assert (b.ptr, b.nbytes, b.device, b.dtype, b.itemsize) == (0x9000, 20, 1, "torch.float16", 2)
    with pytest.raises(InvalidArgumentError, match="in is on cpu; expected a CUDA tensor"):
        _describe(TensorLike(10, device=-1), "in")
    with pytest.raises(InvalidArgumentError, match=r"out is not contiguous; pass out.contiguous\(\)"):
        _describe(TensorLike(10, contiguous=False), "out")
    # A torch tensor and a raw array of the same element type go together.
    c = Communicator(FakeNative(world=2), local=False)
    c.all_gather(TensorLike(8, device=0), Cai(4, "<f2"), stream=3)
    with pytest.raises(InvalidArgumentError, match="out is torch.float16 and in is <f4"):
        c.all_gather(TensorLike(8, device=0), Cai(4, "<f4"), stream=3)
    with pytest.raises(InvalidArgumentError, match="in is on GPU 1; expected GPU 0"):
        c.all_gather(Cai(16), TensorLike(4, device=1, dtype="torch.uint8", itemsize=1), stream=3)


def test_sizes_and_dtypes_are_checked():
    c = Communicator(FakeNative(world=4), local=False)
    with pytest.raises(InvalidArgumentError, match="out has 100 bytes; expected world x in = 4 x 16"):
        c.all_gather(Cai(100), Cai(16))
    with pytest.raises(InvalidArgumentError, match="out is <f4 and in is <u1"):
        c.all_gather(Cai(16, "<f4"), Cai(16))
    with pytest.raises(InvalidArgumentError, match="not a multiple of the world size 4"):
        c.all_to_all(Cai(10), Cai(10))
    # 6 float32 values over 4 ranks: 24 bytes divide, but each block would be 1.5 elements.
    with pytest.raises(InvalidArgumentError, match="in has 6 elements, not a multiple of the world size 4"):
        c.all_to_all(Cai(6, "<f4"), Cai(6, "<f4"))
    c.all_to_all(Cai(16), Cai(16), stream=5)
    call = c._c.calls[-1]
    assert (call["op"], call["outs"], call["ins"], call["bytes"], call["streams"]) == (
        "all_to_all",
        [0x7000],
        [0x7000],
        4,
        [5],
    )


def test_new_collectives_are_checked():
    c = Communicator(FakeNative(world=2), local=False)
    with pytest.raises(InvalidArgumentError, match="expected a 2 x 2 matrix"):
        c.all_to_allv(Cai(16), Cai(16), [1, 2, 3])
    with pytest.raises(InvalidArgumentError, match="counts send 20 from rank 0"):
        c.all_to_allv(Cai(16), Cai(16), [[10, 10], [1, 1]])
    c.all_to_allv(Cai(16, "<f4"), Cai(16, "<f4"), [[1, 2], [3, 4]])
    assert c._c.calls[-1]["counts"] == [4, 8, 12, 16]  # bytes
    c.broadcast(Cai(16), root=1)
    assert c._c.calls[-1]["root"] == 1  # root's range: the native layer's (tests/cpu/test_planner.cpp)
    with pytest.raises(InvalidArgumentError, match="cannot be reduced"):
        c.all_reduce(Cai(16))
    with pytest.raises(InvalidArgumentError, match="expected world x out"):
        c.reduce_scatter(Cai(4, "<f4"), Cai(4, "<f4"))
    c.reduce_scatter(Cai(4, "<f4"), Cai(8, "<f4"), op="max")
    call = c._c.calls[-1]
    assert (call["count"], call["dtype"], call["red_op"]) == (4, "float32", "max")
    c.all_reduce(Cai(8, "<f2"))
    assert c._c.calls[-1]["ins"] == c._c.calls[-1]["outs"]  # in place
    with pytest.raises(InvalidArgumentError, match="prepare: collective is 'gather'"):
        c.prepare("gather", Cai(16))


def test_all_to_allv_counts_are_a_matrix_of_byte_counts():
    c = Communicator(FakeNative(world=2), local=False)
    for counts, message in [
        (None, "counts is None; expected a 2 x 2 matrix"),
        (5, "counts is 5; expected a 2 x 2 matrix"),
        ([[1, 2, 3], [4]], r"rows of \[3, 1\] entries"),  # flattened, these read as other ranks' counts
        ([[1, 2], 3, 4], "rows of"),
        ([[True, False], [1, 1]], "not bools"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            c.all_to_allv(Cai(16), Cai(16), counts)
    c.all_to_allv(Cai(16), Cai(16), [1, 2, 3, 4])  # flat, [src * world + dst]
    assert c._c.calls[-1]["counts"] == [1, 2, 3, 4]


def test_prepare_takes_op_only_for_reductions():
    c = Communicator(FakeNative(world=2), local=False)
    with pytest.raises(
        InvalidArgumentError, match="prepare: op is a reduction's operator; all_gather takes none"
    ):
        c.prepare("all_gather", Cai(64), Cai(16), op="max")


def test_init_names_the_one_of_rank_and_world_missing(monkeypatch):
    import ferry.comm as comm

    monkeypatch.setattr(comm, "require", lambda: object())
    with pytest.raises(InvalidArgumentError, match="rank was given and world was not"):
        comm.init(rank=3)
    with pytest.raises(InvalidArgumentError, match="world was given and rank was not"):
        comm.init(world=4)
    with pytest.raises(InvalidArgumentError, match="init_local: devices is 4; expected a list"):
        comm.init_local(4)
    # Refused before the store is reached (its peers would wait a whole timeout for such a rank).
    with pytest.raises(InvalidArgumentError, match=r"rank is 2 and world 2; expected 0 <= rank < world"):
        comm.init(rank=2, world=2)
    with pytest.raises(InvalidArgumentError, match=r"rank is -1 and world 2"):
        comm.init(rank=-1, world=2)
    with pytest.raises(InvalidArgumentError, match=r"rank is '0' and world 2; expected integers"):
        comm.init(rank="0", world=2)


def test_init_refuses_a_bad_device_timeout_or_port_before_the_store(monkeypatch):
    # The native module without a GPU: its knob checks need none. Each is
    # refused before the store: a rank whose deadline is nan would retry its
    # connection to an unreachable store for good.
    import ferry.comm as comm

    for var in ("MASTER_PORT", "FERRY_PORT", "FERRY_TIMEOUT_S", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    for kw, message in [
        (dict(rank=True, world=2), "rank is True and world 2; expected integers"),
        (
            dict(rank=1, world=2, device=-1),
            r"device is -1 \(LOCAL_RANK under a launcher\); expected a GPU ordinal",
        ),
        (dict(rank=1, world=2, device="cuda:1"), "device is 'cuda:1'; expected an integer"),
        (dict(rank=1, world=2, device=True), "device is True; expected an integer"),
        (dict(rank=1, world=2, timeout="5"), "timeout is '5'; expected seconds"),
        (dict(rank=1, world=2, timeout=float("nan")), "timeout is nan; expected seconds"),
        (dict(rank=1, world=2, timeout=1e9), "timeout is .* s; expected at most"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            comm.init(**kw)
    monkeypatch.setenv("FERRY_TIMEOUT_S", "nan")
    with pytest.raises(InvalidArgumentError, match="FERRY_TIMEOUT_S=nan; expected seconds"):
        comm.init(rank=1, world=2)
    monkeypatch.delenv("FERRY_TIMEOUT_S")
    for port, message in [("abc", "FERRY_PORT=abc"), ("70000", "FERRY_PORT=70000; expected .*0..65535")]:
        monkeypatch.setenv("FERRY_PORT", port)
        with pytest.raises(InvalidArgumentError, match=message):
            comm.init(rank=1, world=2)
    monkeypatch.setenv("FERRY_PORT", "0")
    monkeypatch.setenv("LOCAL_RANK", "-3")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(InvalidArgumentError, match="LOCAL_RANK=-3; expected a GPU ordinal"):
        comm.init()


def test_options_pass_through_to_the_native_layer():
    # The native layer checks the option strings for Python and C alike
    # (tests/cpu/test_selector.cpp, test_plan.cpp).
    c = Communicator(FakeNative(), local=False)
    c.all_gather(Cai(64), Cai(16), algo="sm", local_copy="peer")
    assert (c._c.calls[-1]["algo"], c._c.calls[-1]["local_copy"]) == ("sm", "peer")
    with pytest.raises(InvalidArgumentError, match="stream is a str"):
        c.all_gather(Cai(64), Cai(16), stream="s")
    assert c._c.calls[-1]["signals"] == "auto"  # the communicator's FERRY_SIGNALS
    c.all_to_all(Cai(64), Cai(64), signals="kernel")
    assert c._c.calls[-1]["signals"] == "kernel"
    c.reduce_scatter(Cai(16, "<f4"), Cai(64, "<f4"), signals="copy")
    assert c._c.calls[-1]["signals"] == "copy"


def test_local_communicator_wants_lists():
    c = Communicator(FakeNative(world=2, local_count=2), local=True)
    with pytest.raises(InvalidArgumentError, match="drives 2 GPUs; pass a list"):
        c.all_gather(Cai(32), Cai(16))
    with pytest.raises(InvalidArgumentError, match="differ in size"):
        c.all_gather([Cai(32), Cai(64)], [Cai(16), Cai(32)], stream=[1, 2])


def test_streams_pass_through_by_rank():
    # Whether ranks sharing a GPU have streams of their own is the native
    # layer's check (tests/cpu/test_collective_args.cpp).
    class SharedGpus(FakeNative):
        def device(self, i):
            return i % 2  # FERRY_SHARED_GPUS: ranks 0 and 2 on GPU 0, 1 and 3 on GPU 1

    c = Communicator(SharedGpus(world=4, local_count=4), local=True)
    c.all_gather([Cai(64)] * 4, [Cai(16)] * 4, stream=[5, 6, 7, 8])
    assert c._c.calls[-1]["streams"] == [5, 6, 7, 8]


def test_closed_communicator():
    c = Communicator(FakeNative(), local=False)
    c.close()
    with pytest.raises(ClosedError, match="all_gather: the communicator is closed"):
        c.all_gather(Cai(64), Cai(16))


class FakePreparing(FakeNative):
    """Records the prelaunch calls the Python layer makes."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.armed_handles = set()

    def prepare(self, **kw):
        self.calls.append(("prepare", kw))
        return 7

    def arm(self, h, after, gate_on_device=False):
        self.calls.append(("arm", h, after) + (("device gate",) if gate_on_device else ()))
        self.armed_handles.add(h)

    def trigger(self, h):
        self.calls.append(("trigger", h))

    def trigger_on(self, h, streams):
        self.calls.append(("trigger_on", h, streams))

    def device_trigger(self, h, local):
        return (0x1000 + local, 3)

    def wait(self, h, streams):
        self.calls.append(("wait", h, streams))

    def armed(self, h):
        return h in self.armed_handles

    def release(self, h):
        self.calls.append(("release", h))


def test_prepared_collective_maps_to_native_calls():
    c = Communicator(FakePreparing(world=2), local=False)
    h = c.prepare("all_reduce", Cai(8, "<f4"), op="max")
    kind, kw = c._c.calls[-1]
    assert kind == "prepare" and kw["op"] == "all_reduce" and kw["red_op"] == "max"
    assert kw["ins"] == kw["outs"]  # in place by default
    h.arm(stream=11)
    assert c._c.calls[-1] == ("arm", 7, [11]) and h.armed
    h.trigger()
    assert c._c.calls[-1] == ("trigger", 7)
    h.trigger(stream=12)
    assert c._c.calls[-1] == ("trigger_on", 7, [12])
    assert h.device_trigger() == (0x1000, 3)
    h.wait(stream=13)
    assert c._c.calls[-1] == ("wait", 7, [13])
    h.arm(stream=11, gate="device")
    assert c._c.calls[-1] == ("arm", 7, [11], "device gate")
    with pytest.raises(ValueError, match="gate is 'gpu'; expected 'host' or 'device'"):
        h.arm(gate="gpu")
    with h:
        pass
    assert c._c.calls[-1] == ("release", 7)


def test_prepare_checks_like_the_call():
    c = Communicator(FakePreparing(world=4), local=False)
    with pytest.raises(InvalidArgumentError, match="all_gather: out has 100 bytes"):
        c.prepare("all_gather", Cai(100), Cai(16))
    c.prepare("all_gather", Cai(64), Cai(16), signals="sm")
    assert c._c.calls[-1][1]["signals"] == "sm"


def test_torch_and_raw_arrays_of_one_element_type_match():
    from ferry.comm import _element_type

    # Found on the GPU tier: a torch.uint8 output and a raw "|u1" input were
    # refused as different dtypes, hiding the host-memory error behind them.
    assert _element_type("torch.uint8") == _element_type("|u1") == _element_type("<u1")
    assert _element_type("torch.float32") == _element_type("<f4")
    assert _element_type("torch.float32") != _element_type("<f2")
    assert _element_type("torch.bfloat16") != _element_type("<f2")


def test_set_tuning_checks_rules_and_passes_signals():
    c = Communicator(FakeNative(), local=False)
    c.set_tuning(
        [
            ("all_gather", 0, 1 << 20, "sm"),
            dict(op="all_gather", max_bytes=None, algo="pcpy", signals="sm"),  # the first name of "kernel"
            ("all_to_all", 0, 1 << 20, "b2b", "kernel"),
        ]
    )
    assert c._c.rules == [
        ("all_gather", 0, 1 << 20, "sm", "auto"),
        ("all_gather", 0, (1 << 63) - 1, "pcpy", "kernel"),
        ("all_to_all", 0, 1 << 20, "b2b", "kernel"),
    ]
    with pytest.raises(InvalidArgumentError, match="set_tuning: rule 1: signals is 'fast'"):
        c.set_tuning([("all_gather", 0, 1, "b2b"), ("all_gather", 0, 2, "b2b", "fast")])


def test_set_tuning_takes_a_shipped_preset():
    c = Communicator(FakeNative(world=2), local=False)
    c.set_tuning("latency")
    assert c._c.preset == "latency"  # the native layer holds the shipped tables
    with pytest.raises(InvalidArgumentError, match="set_tuning: preset is 'fastest'; expected one of"):
        c.set_tuning("fastest")


def test_a_preset_not_shipped_for_this_gpu_is_named_when_the_communicator_is_made(monkeypatch):
    # A bad FERRY_TUNING is refused by the native layer before the
    # communicator exists (tests/cpu/test_tuning.cpp); a preset that this GPU
    # model has no table of leaves the built-in default, with a warning.
    monkeypatch.setenv("FERRY_TUNING", "latency")
    with pytest.warns(
        UserWarning, match="FERRY_TUNING=latency: ferry ships no such table for Some Other GPU"
    ):
        Communicator(FakeNative(world=2, gpu_name="Some Other GPU"), local=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # shipped for H200: no warning
        Communicator(FakeNative(world=2), local=False)

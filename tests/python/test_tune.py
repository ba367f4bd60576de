"""The tuner's pure parts: rules from measurements, the shipped tables, and
the native selector reading the same rules."""

import pytest
from ferry import tune
from ferry._native import require


def rec(op, n, algo, t, **kw):
    return {"op": op, "bytes_per_rank": n, "impl": f"ferry-{algo}", "time_us": t, "wrong": 0, **kw}


def test_fastest_variant_per_size_becomes_threshold_rules():
    records = []
    for n, times in (
        (1024, (10, 20, 30)),
        (4096, (11, 25, 30)),
        (1 << 20, (90, 60, 70)),
        (1 << 26, (900, 500, 400)),
    ):
        for algo, t in zip(("b2b", "seq", "pcpy"), times):
            records.append(rec("all_gather", n, algo, t))
    rules = tune.rules_from_measurements(records, 4)
    ag = [r for r in rules if r[0] == "all_gather"]
    assert ag == [
        ("all_gather", 4, 4096, "b2b", "auto"),
        ("all_gather", 4, 1 << 20, "seq", "auto"),
        ("all_gather", 4, tune.ANY, "pcpy", "auto"),
    ]
    # Ops not measured borrow their data-movement twin's rules.
    assert [r[3] for r in rules if r[0] == "broadcast"] == ["b2b", "seq", "pcpy"]


def test_ties_keep_the_previous_choice():
    records = [rec("all_gather", 1024, "b2b", 10), rec("all_gather", 1024, "seq", 12)]
    records += [rec("all_gather", 4096, "b2b", 10.3), rec("all_gather", 4096, "seq", 10.0)]  # 3%: a tie
    rules = tune.rules_from_measurements(records, 2)
    assert [r for r in rules if r[0] == "all_gather"] == [("all_gather", 2, tune.ANY, "b2b", "auto")]


def test_wrong_results_and_graph_runs_are_ignored():
    records = [rec("all_gather", 1024, "b2b", 10), rec("all_gather", 1024, "seq", 1, wrong=5)]
    records.append(dict(rec("all_gather", 1024, "pcpy", 1), graph=True))
    assert tune.rules_from_measurements(records, 2)[0][3] == "b2b"


def test_selection_sizes_match_the_native_selector():
    assert tune.selection_bytes("all_to_all", 4096, 4) == 1024
    assert tune.selection_bytes("all_gather", 4096, 4) == 4096


def test_validate_names_the_bad_rule():
    with pytest.raises(ValueError, match="rule 1: algo is 'ring'"):
        tune.validate([("all_gather", 0, 10, "b2b"), ("all_gather", 0, 10, "ring")])
    assert tune.validate([dict(op="all_reduce", world=0, max_bytes=None, algo="seq")]) == [
        ("all_reduce", 0, tune.ANY, "seq", "auto")
    ]
    assert tune.validate([("all_gather", 0, 10, "b2b", "kernel")]) == [("all_gather", 0, 10, "b2b", "kernel")]
    with pytest.raises(ValueError, match="rule 0: signals is 'rounds'"):
        tune.validate([dict(op="all_gather", max_bytes=1, algo="b2b", signals="rounds")])
    # "sm", the first name of "kernel", is read as "kernel".
    assert tune.validate([dict(op="all_gather", max_bytes=1, algo="b2b", signals="sm")])[0][4] == "kernel"
    with pytest.raises(ValueError, match=r"rule 0: .*expected \(op, world, max_bytes, algo\[, signals\]\)"):
        tune.validate([("all_gather", 0, 10)])


@pytest.mark.parametrize("world", [2, 4, 8])
def test_shipped_h200_table_covers_every_op_and_size(world):
    rules = tune.default_rules("NVIDIA H200", world)
    assert rules is not None
    for op in tune.OPS:
        for n in (1, 1 << 10, 1 << 20, 1 << 30, 1 << 40):
            assert tune.select(rules, op, world, n) in [(v, "auto") for v in tune.VARIANTS], (op, n)


def test_native_selector_agrees_with_the_table():
    rules = tune.default_rules("NVIDIA H200", 4)
    native = require()
    for op in tune.OPS:
        for n in (1, 4096, 1 << 20, 1 << 28):
            assert native.select_variant(op, 4, n, "auto", rules) == tune.select(rules, op, 4, n)
    assert native.select_variant("all_gather", 4, 1, "pcpy", rules) == ("pcpy", "auto")  # forcing wins
    # A rule's signals reach the native selector; forcing a variant drops them.
    mixed = tune.validate([("all_gather", 0, 1 << 20, "b2b"), ("all_gather", 0, tune.ANY, "pcpy", "sm")])
    assert native.select_variant("all_gather", 2, 4 << 20, "auto", mixed) == ("pcpy", "kernel")
    assert native.select_variant("all_gather", 2, 4 << 20, "auto", mixed) == tune.select(
        mixed, "all_gather", 2, 4 << 20
    )
    assert native.select_variant("all_gather", 2, 4 << 20, "seq", mixed) == ("seq", "auto")


def test_tuning_file_overrides(tmp_path, monkeypatch):
    p = tmp_path / "t.json"
    p.write_text('{"rules": [{"op": "all_gather", "world": 0, "max_bytes": null, "algo": "pcpy"}]}')
    monkeypatch.setenv("FERRY_TUNING", str(p))
    assert tune.default_rules("anything", 4) == [("all_gather", 0, tune.ANY, "pcpy", "auto")]


@pytest.mark.parametrize("world", [2, 4, 8])
def test_latency_preset_uses_sms_only_where_measured_faster(world, monkeypatch):
    monkeypatch.setenv("FERRY_TUNING", "latency")
    rules = tune.default_rules("NVIDIA H200", world)
    assert rules == tune.preset_rules("NVIDIA H200", world, "latency")
    for op in tune.OPS:
        for n in (1, 1 << 10, 1 << 20, 1 << 30, 1 << 40):
            algo, signals = tune.select(rules, op, world, n)
            assert algo in tune.RULE_ALGOS, (op, n)
            # The SM path only for the ops it runs; rules past its 1 MiB default window only for the
            # reductions on 4 or more GPUs (reduce_scatter's result, all_reduce's part in two shots).
            limit = 4 << 20 if world >= 4 and op in ("reduce_scatter", "all_reduce") else 1 << 20
            assert algo != "sm" or (op in tune.SM_OPS and n <= limit), (op, n)
    # Small all_gathers take the SM path on every world size.
    assert tune.select(rules, "all_gather", world, 4096) == ("sm", "auto")
    big = tune.select(rules, "all_gather", world, 64 << 20)
    # Kernel signals above the SM path (measured on 2 and 4 GPUs; 8 GPUs take the 4-GPU rules).
    assert big[1] == "kernel"
    # The reductions take the SM path for small blocks on every world size (measured on 2 and 4 GPUs).
    assert tune.select(rules, "reduce_scatter", world, 1 << 19)[0] == "sm"
    assert tune.select(rules, "all_reduce", world, 1 << 18)[0] == "sm"


def test_latency_preset_on_four_gpus_follows_its_measurements(monkeypatch):
    """The 4-GPU rules as measured on four H200s (docs/performance-log.md): the SM path up to its 1 MiB
    window for every collective, up to 4 MiB of result or part for the reductions (all_reduce in two shots; the
    window decides), kernel signals above for all but broadcast."""
    monkeypatch.setenv("FERRY_TUNING", "latency")
    rules = tune.default_rules("NVIDIA H200", 4)
    for op in ("all_gather", "all_to_all", "all_to_allv", "broadcast", "reduce_scatter", "all_reduce"):
        assert tune.select(rules, op, 4, 1 << 20) == ("sm", "auto"), op
    assert tune.select(rules, "all_gather", 4, 4 << 20) == ("seq", "kernel")
    assert tune.select(rules, "all_to_all", 4, 4 << 20) == ("b2b", "kernel")
    assert tune.select(rules, "reduce_scatter", 4, 4 << 20) == ("sm", "auto")
    assert tune.select(rules, "all_reduce", 4, 4 << 20) == ("sm", "auto")
    assert tune.select(rules, "reduce_scatter", 4, 8 << 20) == ("b2b", "kernel")
    assert tune.select(rules, "all_reduce", 4, 8 << 20) == ("b2b", "kernel")
    assert tune.select(rules, "broadcast", 4, 64 << 20) == ("seq", "auto")


def test_sm_free_preset_is_the_default(monkeypatch):
    monkeypatch.delenv("FERRY_TUNING", raising=False)
    default = tune.default_rules("NVIDIA H200", 2)
    assert default == tune.preset_rules("NVIDIA H200", 2, "sm-free")
    monkeypatch.setenv("FERRY_TUNING", "sm-free")
    assert tune.default_rules("NVIDIA H200", 2) == default
    assert all(algo != "sm" and signals == "auto" for _, _, _, algo, signals in default)


def test_bad_preset_or_tuning_file_is_named(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="preset is 'fast'; expected one of sm-free, latency"):
        tune.preset_rules("NVIDIA H200", 2, "fast")
    monkeypatch.setenv("FERRY_TUNING", "fast")
    with pytest.raises(ValueError, match="FERRY_TUNING='fast' is neither a preset .* nor a file"):
        tune.default_rules("NVIDIA H200", 2)
    p = tmp_path / "t.json"
    p.write_text('{"rules": [{"op": "all_gather", "max_bytes": 1, "algo": "ring"}]}')
    monkeypatch.setenv("FERRY_TUNING", str(p))
    with pytest.raises(ValueError, match="not a `ferry tune` table .*expected one of b2b"):
        tune.default_rules("NVIDIA H200", 2)
    assert tune.preset_rules("Some Other GPU", 2, "latency") is None


def test_unknown_gpu_has_no_shipped_table(monkeypatch):
    monkeypatch.delenv("FERRY_TUNING", raising=False)
    assert tune.default_rules("Some Other GPU", 4) is None


def test_rules_may_name_the_sm_path_but_not_unknown_variants():
    rules = tune.validate(
        [("all_gather", 0, 1 << 20, "sm"), {"op": "all_gather", "max_bytes": None, "algo": "seq"}]
    )
    assert rules[0] == ("all_gather", 0, 1 << 20, "sm", "auto")
    assert tune.select(rules, "all_gather", 2, 4096) == ("sm", "auto")
    assert tune.select(rules, "all_gather", 2, 2 << 20) == ("seq", "auto")
    with pytest.raises(ValueError, match="expected one of b2b, seq, pcpy, sm"):
        tune.validate([("all_gather", 0, 1, "nvls")])


def test_sm_path_competes_only_when_asked():
    records = []
    for n, times in ((1024, (30, 32, 40, 8)), (1 << 20, (40, 38, 45, 12)), (4 << 20, (60, 55, 70, None))):
        for algo, t in zip(("b2b", "seq", "pcpy", "sm"), times):
            if t is not None:  # the SM path has no record past its window
                records.append(rec("all_to_all", n * 2, algo, t))
    ce = tune.rules_from_measurements(records, 2)
    assert all(a != "sm" for _, _, _, a, _ in ce)
    rules = tune.rules_from_measurements(records, 2, allow_sm=True)
    assert [r for r in rules if r[0] == "all_to_all"] == [
        ("all_to_all", 2, 1 << 20, "sm", "auto"),
        ("all_to_all", 2, tune.ANY, "seq", "auto"),
    ]
    # all_to_allv borrows the SM path's rules (it runs there); reductions do not.
    assert [r[3] for r in rules if r[0] == "all_to_allv"] == ["sm", "seq"]
    assert [r for r in rules if r[0] == "reduce_scatter"] == [r for r in ce if r[0] == "reduce_scatter"]
    assert [r[3] for r in ce if r[0] == "reduce_scatter"] == ["b2b", "seq"]


def test_sm_path_needs_a_clear_win():
    # 4% faster than the best copy-engine variant: a tie, the copy engines keep the size.
    records = [rec("all_gather", 1024, "b2b", 10.0), rec("all_gather", 1024, "sm", 9.6)]
    assert tune.rules_from_measurements(records, 2, allow_sm=True)[0][3] == "b2b"
    records.append(rec("all_gather", 4096, "b2b", 10.0))
    records.append(rec("all_gather", 4096, "sm", 5.0))
    rules = tune.rules_from_measurements(records, 2, allow_sm=True)
    assert [r for r in rules if r[0] == "all_gather"] == [
        ("all_gather", 2, 1024, "b2b", "auto"),
        ("all_gather", 2, tune.ANY, "sm", "auto"),
    ]


def test_the_tuners_sm_ops_are_the_ones_the_native_sm_path_runs():
    native = require()
    for op in tune.OPS:
        runs = native.sm_path_refuses(op, 2, 1, 1 << 20) == ""
        assert runs == (op in tune.SM_OPS), op
    assert "FERRY_SM_BYTES" in native.sm_path_refuses("all_gather", 2, (1 << 20) + 1, 1 << 20)


def test_kernel_signals_compete_only_when_asked_and_become_a_rules_signals():
    records = []
    # 1 KB: the SM path wins; 4 MB: pcpy with kernel signals beats every
    # SM-free variant by more than 5%; 64 MB: slower than pcpy, which takes over
    # (a tie would have kept the previous size's choice, as for every variant).
    for n, times in (
        (1024, dict(b2b=30, seq=31, pcpy=32, sm=6, **{"pcpy-ksig": 24})),
        (4 << 20, dict(b2b=40, seq=41, pcpy=36, **{"pcpy-ksig": 27, "seq-ksig": 33})),
        (64 << 20, dict(b2b=230, seq=225, pcpy=200, **{"pcpy-ksig": 215})),
    ):
        for cand, t in times.items():
            records.append(rec("all_gather", n, cand, t))
    assert all(s == "auto" for *_, s in tune.rules_from_measurements(records, 2))
    rules = tune.rules_from_measurements(records, 2, allow_sm=True)
    assert [r for r in rules if r[0] == "all_gather"] == [
        ("all_gather", 2, 1024, "sm", "auto"),
        ("all_gather", 2, 4 << 20, "pcpy", "kernel"),
        ("all_gather", 2, tune.ANY, "pcpy", "auto"),
    ]
    # broadcast runs on the SM path and borrows all of it; reductions (no SM
    # path) borrow the table chosen without it, kernel signals included.
    assert [r[3:] for r in rules if r[0] == "broadcast"] == [
        ("sm", "auto"),
        ("pcpy", "kernel"),
        ("pcpy", "auto"),
    ]
    assert tune.to_json_rules(rules)[1] == dict(
        op="all_gather", world=2, max_bytes=4 << 20, algo="pcpy", signals="kernel"
    )
    assert "signals" not in tune.to_json_rules(rules)[0]
    assert tune.candidates(False) == tune.VARIANTS
    assert tune.candidates(True)[:4] == tune.VARIANTS + ("sm",)  # SM-free first: ties go to them


def test_doctor_says_which_table_applies(tmp_path):
    assert tune.describe("NVIDIA H200", 2, {}) == (
        "ok",
        "tuning: the shipped 'sm-free' table (copy engines only); FERRY_TUNING=latency switches",
    )
    assert tune.describe("NVIDIA H200", 4, {"FERRY_TUNING": "latency"})[1].startswith(
        "tuning: the shipped 'latency' table (SMs where they are faster)"
    )
    status, msg = tune.describe("NVIDIA H200", 2, {"FERRY_TUNING": "/nonexistent.json"})
    assert status == "fail" and "neither a preset" in msg
    assert tune.describe("Some Other GPU", 2, {})[0] == "warn"
    p = tmp_path / "t.json"
    p.write_text('{"rules": [{"op": "all_gather", "world": 0, "max_bytes": null, "algo": "pcpy"}]}')
    assert tune.describe("X", 2, {"FERRY_TUNING": str(p)}) == ("ok", f"tuning: FERRY_TUNING={p} (1 rule)")


@pytest.mark.parametrize(
    "rules,message",
    [
        (None, "rules is None; expected a list of rules"),
        ({"op": "all_gather", "max_bytes": 1, "algo": "b2b"}, "rules is .*; expected a list of rules"),
        ([5], r"rule 0: 5; expected \(op, world"),
        (["all_gather"], r"rule 0: 'all_gather'; expected \(op, world"),
        ([("all_gather", True, 10, "b2b")], "rule 0: world is True"),
        ([("all_gather", 0, False, "b2b")], "rule 0: max_bytes is False"),
        ([("all_gather", 0, 1 << 64, "b2b")], "rule 0: max_bytes is 18446744073709551616"),
        ([("all_gather", 1 << 70, 10, "b2b")], "rule 0: world is"),
    ],
)
def test_validate_names_what_is_no_rule_list_or_no_number(rules, message):
    # A dict would be read key by key, a bool taken as a count, and a size past
    # 64 bits would fail only in the native table.
    with pytest.raises(ValueError, match=message):
        tune.validate(rules)

"""The variant selector's table: derived from measurements (`ferry tune`),
shipped per GPU model (ferry/tuning/*.json, compiled into the native
library, which loads the right one into each communicator: coll/tuning.hpp).

A table is a list of rules (op, world, max_bytes, algo, signals), tried in
order; the first whose op and world (0: any) match and whose max_bytes is at
least the call's bytes per rank (the size the selector sees: an all_to_all's
block, a reduce_scatter's output) wins. `signals` says who sends the copy-engine
variants' two signal rounds: "auto" (the communicator's FERRY_SIGNALS; what
the default "sm-free" table says), "copy" or "kernel" (a one-block kernel per
round, which `ferry tune --sm` may choose and the "latency" preset names;
"sm", its first name, is still read).
Everything here is pure and CPU-tested except `run`, which measures."""

from __future__ import annotations

import datetime
import os
from typing import Dict, Iterable, List, Optional, Tuple

Rule = Tuple[str, int, int, str, str]
ANY = (1 << 63) - 1  # "no upper bound" (JSON: null)
VARIANTS = ("b2b", "seq", "pcpy")  # copy-engine variants: what `ferry tune` measures
# What a rule may name: also "sm", ferry's SM path (not copy engines), which
# `ferry tune` measures only when asked (--sm), and only the "latency" preset names.
RULE_ALGOS = VARIANTS + ("sm",)
RULE_SIGNALS = ("auto", "copy", "kernel", "sm")  # "sm": the first name of "kernel"


def candidates(allow_sm: bool) -> Tuple[str, ...]:
    """What `ferry tune` measures, as ferry bench impl labels without "ferry-":
    the copy-engine variants; with allow_sm also the SM path and each
    copy-engine variant with its signal rounds sent by a kernel
    ("<variant>-ksig", which becomes a rule (variant, "kernel")). Ties go to the
    earlier one, so the SM-free variants come first."""
    return VARIANTS + (("sm",) + tuple(f"{v}-ksig" for v in VARIANTS) if allow_sm else ())


OPS = ("all_gather", "all_to_all", "all_to_allv", "broadcast", "reduce_scatter", "all_reduce")


def selection_bytes(op: str, n: int, world: int) -> int:
    """The selector's size for a benchmark size `n` (see ferry bench)."""
    return n // world if op in ("all_to_all", "all_to_allv", "reduce_scatter", "all_reduce") else n


# Ops the SM path runs (coll/sm_path.hpp); the others never take an "sm" rule.
SM_OPS = ("all_gather", "all_to_all", "all_to_allv", "broadcast", "reduce_scatter", "all_reduce")


def rules_from_measurements(
    records: Iterable[dict], world: int, tolerance: float = 0.05, allow_sm: bool = False
) -> List[Rule]:
    """The fastest ferry variant per op and size, as threshold rules: sizes up
    to and including the last size a variant won take that variant. A variant
    within `tolerance` of the fastest counts as a tie, and a tie keeps the
    previous size's choice (else the first of b2b, seq, pcpy, sm), so run-to-run
    noise does not flip the table. Ops that were not measured borrow
    all_to_all's rules (all_to_allv, reduce_scatter, all_reduce: pushes of
    one block per peer) or all_gather's (broadcast).

    allow_sm: records of ferry's SM path ("ferry-sm", not copy engines) and
    of the copy-engine variants with kernel signals ("ferry-<variant>-ksig")
    compete too, where they exist (the SM path takes blocks up to
    FERRY_SM_BYTES); each wins a size only by more than `tolerance` over every
    SM-free variant or where it won the size before. An op that was not
    measured borrows its donor's SM-path rules only where the SM path does the
    same work for both (all_to_allv, broadcast); reductions add arithmetic
    (and all_reduce's SM path sends every peer the whole buffer, or in two
    shots a part per rank), so they
    borrow the rules chosen without it."""
    from ferry.bench.cases import impl_options  # the impl label's (algo, signals)

    measured = candidates(allow_sm)
    times: Dict[str, Dict[int, Dict[str, float]]] = {}
    for r in records:
        if not str(r.get("impl", "")).startswith("ferry-") or r.get("graph") or r.get("wrong", 0):
            continue
        candidate = r["impl"].split("-", 1)[1]
        if candidate not in measured:
            continue
        size = selection_bytes(r["op"], r["bytes_per_rank"], world)
        slot = times.setdefault(r["op"], {}).setdefault(size, {})
        slot[candidate] = min(slot.get(candidate, float("inf")), r["time_us"])

    def table(allowed) -> Dict[str, List[Rule]]:
        by_op: Dict[str, List[Rule]] = {}
        for op, by_size in times.items():
            prev, best = None, {}
            for size in sorted(by_size):
                t = {a: v for a, v in by_size[size].items() if a in allowed}
                if not t:
                    continue
                fastest = min(t.values())
                ties = [a for a in allowed if a in t and t[a] <= fastest * (1 + tolerance)]
                prev = prev if prev in ties else ties[0]
                best[size] = prev
            sizes = sorted(best)
            for i, s in enumerate(sizes):
                last = i + 1 == len(sizes)
                if last or best[sizes[i + 1]] != best[s]:
                    by_op.setdefault(op, []).append(
                        (op, world, ANY if last else s) + impl_options("ferry-" + best[s])
                    )
        return by_op

    chosen = table(measured)
    without_sm_path = table([c for c in measured if c != "sm"]) if allow_sm else chosen
    rules: List[Rule] = [r for op_rules in chosen.values() for r in op_rules]
    for op, donor, same_sm_work in (
        ("all_to_allv", "all_to_all", True),
        ("broadcast", "all_gather", True),
        ("reduce_scatter", "all_to_all", False),
        ("all_reduce", "all_to_all", False),
    ):
        source = chosen if same_sm_work else without_sm_path
        if op not in chosen and donor in source:
            rules += [(op,) + rule[1:] for rule in source[donor]]
    return rules


def validate(rules) -> List[Rule]:
    """Rules as tuples of 4 (signals 'auto') or 5, or dicts with those keys
    (a JSON table), checked and made 5-tuples (signals "sm", the first name
    of "kernel", read as "kernel"); a bad one is named."""
    # A single rule or a dict is no list of rules (a dict would be read key
    # by key, its keys as rules).
    if isinstance(rules, (str, bytes, dict)) or not hasattr(rules, "__iter__"):
        raise ValueError(f"rules is {rules!r}; expected a list of rules")
    out = []
    for i, r in enumerate(rules):
        if isinstance(r, dict):
            r = (r.get("op"), r.get("world", 0), r.get("max_bytes"), r.get("algo"), r.get("signals", "auto"))
        if isinstance(r, (str, bytes)) or not hasattr(r, "__iter__"):
            raise ValueError(f"rule {i}: {r!r}; expected (op, world, max_bytes, algo[, signals])")
        r = tuple(r)
        if len(r) not in (4, 5):
            raise ValueError(f"rule {i}: {r!r}; expected (op, world, max_bytes, algo[, signals])")
        op, world, max_bytes, algo = r[:4]
        signals = r[4] if len(r) == 5 else "auto"
        if op not in OPS:
            raise ValueError(f"rule {i}: op is {op!r}; expected one of {', '.join(OPS)}")
        if algo not in RULE_ALGOS:
            raise ValueError(f"rule {i}: algo is {algo!r}; expected one of {', '.join(RULE_ALGOS)}")
        if signals not in RULE_SIGNALS:
            raise ValueError(f"rule {i}: signals is {signals!r}; expected one of {', '.join(RULE_SIGNALS)}")
        # (bools are ints to Python, not rank counts; the native table holds 64 bits)
        if isinstance(world, bool) or not isinstance(world, int) or not 0 <= world <= ANY:
            raise ValueError(f"rule {i}: world is {world!r}; expected 0 (any) or a rank count")
        max_bytes = ANY if max_bytes is None else max_bytes
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 0 <= max_bytes <= ANY:
            raise ValueError(f"rule {i}: max_bytes is {max_bytes!r}; expected bytes or null (no bound)")
        out.append((op, world, max_bytes, algo, "kernel" if signals == "sm" else signals))
    return out


def to_json_rules(rules: Iterable[Rule]) -> List[dict]:
    """JSON rules; "signals" only where a rule names them."""
    out = []
    for o, w, b, a, s in rules:
        out.append(dict(op=o, world=w, max_bytes=None if b >= ANY else b, algo=a))
        if s != "auto":
            out[-1]["signals"] = s
    return out


def select(rules: Iterable[Rule], op: str, world: int, nbytes: int) -> Optional[Tuple[str, str]]:
    """The rule table's (algo, signals) (the native selector does the same)."""
    for o, w, b, a, s in rules:
        if o == op and w in (0, world) and nbytes <= b:
            return a, s
    return None


# The shipped tables per GPU model (ferry/tuning/*.json), one per preset:
# "sm-free" (the default: copy engines only, so collectives beside compute
# take no SM) and "latency" (the SM path and kernel signals where they are
# faster: for collectives on the critical path, docs/api.md "Tuning").
PRESETS = ("sm-free", "latency")
DEFAULT_PRESET = "sm-free"


def _native():
    """The native library: it holds the shipped tables and reads FERRY_TUNING
    files (its InvalidArgumentError is a ValueError)."""
    from ferry._native import require

    return require()


def _as_rules(rules) -> Optional[List[Rule]]:
    return None if rules is None else [tuple(r) for r in rules]


def preset_rules(gpu_name: str, world: int, preset: str) -> Optional[List[Rule]]:
    """The shipped table of `preset` for this GPU model, for this world size
    or the nearest smaller one measured (the nearest larger below the
    smallest); None where ferry ships none for this GPU. An unknown preset
    raises ValueError."""
    return _as_rules(_native().preset_rules(gpu_name, world, preset))


def default_rules(gpu_name: str, world: int, env: Optional[Dict[str, str]] = None) -> Optional[List[Rule]]:
    """The table a communicator starts with: FERRY_TUNING if set in `env`
    (default: the process's; a preset's name, or the path of a `ferry tune`
    file), else the shipped "sm-free" table. None: the native built-in
    default applies."""
    setting = (os.environ if env is None else env).get("FERRY_TUNING", "")
    return _as_rules(_native().startup_rules(gpu_name, world, setting))


def describe(gpu_name: str, world: int, env: Dict[str, str]) -> Tuple[str, str]:
    """`ferry doctor`'s line on the selector's table: (status, message)."""
    setting = env.get("FERRY_TUNING", "")
    try:
        rules = default_rules(gpu_name, world, env)
    except (ValueError, OSError) as exc:
        return "fail", f"tuning: {exc}"
    if rules is None:
        return "warn", (
            f"tuning: ferry ships no table for {gpu_name}; the built-in default applies "
            "(`ferry tune` measures one, FERRY_TUNING=<file> loads it)"
        )
    if setting and setting not in PRESETS:
        n = len(rules)
        return "ok", f"tuning: FERRY_TUNING={setting} ({n} rule{'' if n == 1 else 's'})"
    preset = setting or DEFAULT_PRESET
    what = "copy engines only" if preset == "sm-free" else "SMs where they are faster"
    other = "latency" if preset == "sm-free" else "sm-free"
    return "ok", f"tuning: the shipped {preset!r} table ({what}); FERRY_TUNING={other} switches"


def run(
    world: int, ops: List[str], sizes: List[int], runs: int, timeout: float, sm: bool = False, repeat: int = 1
) -> dict:
    """Measures every candidate on the local GPUs (ferry bench, ferry impls
    only); sm: ferry's SM path and the variants with kernel signals too,
    which then may win sizes. repeat: the measurement in that many sets of
    fresh processes, each point's median repeat deciding (one process can
    sit 5-10 us slower than the next at small sizes, enough to flip a
    choice)."""
    from ferry.bench import collectives

    opts = dict(
        sizes=sizes,
        ops=ops,
        impls=[f"ferry-{c}" for c in candidates(sm)],
        warmup=3,
        runs=runs,
        timeout=timeout,
        local_copy="auto",
        overlap=False,
        overlap_sizes=[],
        local_copy_probe=False,
        tuning=None,
    )
    result = collectives.run_repeated(world, opts, repeat)
    rules = rules_from_measurements(result["records"], world, allow_sm=sm)
    return dict(
        gpu=result["gpu"],
        world=world,
        date=datetime.date.today().isoformat(),
        repeats=repeat,
        rules=to_json_rules(rules),
        records=result["records"],
    )

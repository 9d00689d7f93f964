"""The rules of the step's parts and which part holds it: one gives the verdict, where findings apply side by side."""

from __future__ import annotations

from analysis.rules import savings
from analysis.rules.advice_compute import _compute_advice, _compute_fix, _compute_words
from analysis.rules.advice_loop import (
    _copy_advice,
    _copy_fix,
    _copy_split,
    _eager_fix,
    _host_fix,
    _host_more,
    _input_fix,
    _input_headline,
    _input_more,
    _steps_per_call,
    _wait_advice,
    _wait_only_fix,
    _wait_pct,
)
from analysis.rules.devices import facts_for
from analysis.rules.facts import Facts
from analysis.rules.rule import Rule

BOUND_PARTS = ("compute", "input", "host", "collective", "idle", "eager")  # a tie goes to the first
HIGH_BOUND_PCT = 50.0  # a bound part holding at least this share of the step holds most of it: level high

BOUND_RULES: list[Rule] = [
    Rule(
        "input_bound_high",
        "input",
        lambda f: _bound_rule_applies(f, "input", "high"),
        _input_headline,
        _input_fix,
        _input_more,
        bound="input",
        level="high",
        severity="critical",
        description=f"input (the host's wait for its batch, and batch copies no kernel hides) is the largest part "
        f"of the step and >= {HIGH_BOUND_PCT:g} % of it",
    ),
    Rule(
        "input_bound",
        "input",
        lambda f: _bound_rule_applies(f, "input", "moderate"),
        _input_headline,
        _input_fix,
        _input_more,
        bound="input",
        level="moderate",
        description=f"input is the largest part of the step, under {HIGH_BOUND_PCT:g} % of it",
    ),
    Rule(
        "collective_bound",
        "collective",
        lambda f: _bound_rule_applies(f, "collective"),
        lambda f: (
            f"Collective-bound: {f.collective_pct:.0f} % of the step, its largest part, waits in all-reduce "
            "for the other workers or devices."
        ),
        lambda f: (
            "find the worker or device the others wait for (in the workers or devices table, the one whose "
            "step minus its collective wait stands out) and fix its cause; otherwise a larger per-worker "
            "batch spreads each all-reduce over more images"
        ),
        bound="collective",
        description="the collective wait is the largest part of the step",
    ),
    Rule(
        "host_bound",
        "host",
        lambda f: _bound_rule_applies(f, "host"),
        lambda f: (
            f"Host-bound: host overhead is {part_shares(f)['host']:.0f} % of the step, its largest part: time "
            f"goes to Python and dispatch between {'jitted' if f.producer == 'jax' else 'TensorFlow'} calls, "
            "not to waiting for input; look at the training loop."
        ),
        _host_fix,
        _host_more,
        bound="host",
        description="host overhead (Python, dispatch, launches, the device idle waiting for the host) is the "
        "largest part of the step",
    ),
    Rule(
        "eager_bound",
        "host",
        lambda f: _bound_rule_applies(f, "eager"),
        lambda f: (
            f"Eager-bound: every op runs eagerly, one Python call each, and that is "
            f"{part_shares(f)['eager']:.0f} % of the step, its largest part."
        ),
        _eager_fix,
        _host_more,
        bound="eager",
        description="the whole step runs eagerly (no compiled step) and that is the largest part of it",
    ),
    Rule(
        "idle_bound",
        "idle",
        lambda f: _bound_rule_applies(f, "idle"),
        lambda f: (
            f"Idle-bound: the device sits idle {part_shares(f)['idle']:.0f} % of the step, its largest part, "
            "and the trace records no host activity to tell what it waits for."
        ),
        lambda f: (
            "trace the host as well (host_tracer_level 2 or more), so the device's idle time can be told "
            "apart: waiting for input, for the host's Python and launches, or for another device"
        ),
        bound="idle",
        description="device idle whose cause the trace cannot tell (no host activity recorded) is "
        "the largest part of the step",
    ),
    Rule(
        "compute_bound",
        "compute",
        lambda f: _bound_rule_applies(f, "compute"),
        lambda f: (
            f"Compute-bound: {_compute_words(f)} take {part_shares(f)['compute']:.0f} % of the step, its largest part."
        ),
        _compute_fix,
        _compute_advice,
        bound="compute",
        severity="info",
        description="the step's math (device kernels; on a CPU, TensorFlow's ops) is the largest part of the step",
    ),
    # The two halves of input as fixes of their own: their cures differ (FIXES, `verdict.fixes`).
    Rule(
        "input_copy",
        "input",
        lambda f: savings.input_copy(f).pct > 0,
        lambda f: f"Each step waits for its batch's copy to the device ({_copy_split(f)}).",
        _copy_fix,
        _copy_advice,
        description="a batch's host-to-device copy that no kernel overlaps: hidden by prefetching to the device",
    ),
    Rule(
        "input_wait",
        "input",
        lambda f: _wait_pct(f) > 0,
        lambda f: f"The loop waits {_wait_pct(f):.1f} % of the step for its next batch from the input pipeline.",
        _wait_only_fix,
        _wait_advice,
        description="the host's wait for the iterator: hidden by prefetching, up to the rate the pipeline makes a "
        "batch",
    ),
    Rule(
        "epoch_level_work",
        "epoch_level",
        lambda f: False,
        lambda f: "Time outside the training steps dominates the gap.",
        lambda f: (
            "time outside the training steps (validation, iterator set-up): validate less often or on fewer images"
        ),
        severity="info",
        description="compare only: validation and iterator set-up between steps",
    ),
]


def part_savings(facts: Facts) -> dict[str, savings.Saving]:
    """What fixing each part of the step would save."""
    return {
        "input": savings.input_part(facts),
        "host": savings.host_part(facts, _steps_per_call(facts)[1]),
        "collective": savings.collective_part(facts),
        "compute": savings.compute_part(facts),
    }


def part_shares(facts: Facts) -> dict[str, float]:
    """Each part's share of the step, the parts `verdict.bound` is chosen from: device idle whose cause
    the trace cannot tell is `idle` (not host overhead), and a step that runs wholly eagerly is `eager`
    (its host overhead, and on a CPU its ops, are the eager runtime's)."""
    shares = {
        "compute": facts.compute_pct,
        "input": facts.input_pct,
        "host": facts.host_pct,
        "collective": facts.collective_pct,
    }
    idle = facts.idle_pct
    if idle == idle and idle > 0 and shares["host"] == shares["host"]:
        shares["idle"] = min(idle, shares["host"])
        shares["host"] -= shares["idle"]
    if savings.all_eager(facts) and shares["host"] == shares["host"]:
        on_cpu = facts_for(facts.device).kind == "cpu"
        shares["eager"] = shares.pop("host") + (shares.pop("compute") if on_cpu else 0.0)
    return {part: float(pct) for part, pct in shares.items() if pct == pct}


def bound_of(facts: Facts) -> tuple[str, float] | None:
    """(the part with the largest share of the step, its share); None where no share is known. A part
    without a known fix holds the step all the same."""
    shares = part_shares(facts)
    if not shares:
        return None
    part = max(shares, key=lambda name: (shares[name], -BOUND_PARTS.index(name)))
    return part, shares[part]


def _bound_level(pct: float) -> str:
    return "high" if pct >= HIGH_BOUND_PCT else "moderate"


def _bound_rule_applies(facts: Facts, part: str, level: str | None = None) -> bool:
    bound = bound_of(facts)
    return bound is not None and bound[0] == part and (level is None or _bound_level(bound[1]) == level)


def _bound_rule_id(part: str, pct: float) -> str:
    if part == "input":
        return "input_bound_high" if _bound_level(pct) == "high" else "input_bound"
    return f"{part}_bound"

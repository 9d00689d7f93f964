"""The one table of rules that gives every verdict, advice line and "why" sentence.

A rule is a named check on the facts of a breakdown (shares of step or epoch time, the
device, the run's settings) with a headline, one fix and, for `analyze`, further advice.
`compare` explains a gap with the fix of the rule for the component that explains it. A new
rule is one entry: in `bound_rules` for a part of the step, in `finding_rules` for a finding.

The verdict names the part whose fix would save the most step time (`savings`): each part of
the step (input, host overhead, collective wait, compute) and each finding that applies carries
an estimate, and the largest wins; its level is that saving's share of the step (>= 20 % high).
Where no fix saves 5 % of the step, the step's math holds it: compute-bound. XProf's Overview
cut-offs (input >= 20 % highly, >= 5 % moderately input-bound) are a ladder, not a measure of
what holds the step; where they read the step differently, `xprof_reading` says so.

The rules' sentences and fixes are `advice_loop`'s (input and host) and `advice_compute`'s (the
step's math); the rows in `bound_rules` and `finding_rules` say which goes with which rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from analysis.rules import savings
from analysis.rules.bound_rules import BOUND_RULES, _bound_level, _bound_rule_id, bound_of, part_savings
from analysis.rules.devices import facts_for
from analysis.rules.facts import Facts
from analysis.rules.finding_rules import FINDING_RULES, finding_saving
from analysis.rules.rule import Rule

MIN_STEADY_STEPS = 3  # fewer steady steps than this give no verdict

RULES: list[Rule] = [*BOUND_RULES, *FINDING_RULES]  # in this order: rules that tie keep it
RULES_BY_ID = {rule.id: rule for rule in RULES}


def _finding_part(rule: Rule, facts: Facts) -> str:
    if rule.id == "cpu_contention" and facts_for(facts.device).kind == "cpu":
        return "compute"  # on a CPU the other processes slow the math itself
    return rule.component


@dataclass(frozen=True)
class Fix:
    """One change and what it would save per step: of a part of the step, or of a finding."""

    rule: str  # the rule whose fix it is
    part: str  # the part of the step it shortens
    saving: savings.Saving


# What each fix does, as the headline names it beside the bound ("hiding the batch copy").
FIX_NAMES: dict[str, Callable[[Facts], str]] = {
    "input_copy": lambda f: "hiding the batch copy under the previous step's kernels (prefetch to the device)",
    "input_wait": lambda f: "hiding the wait for the input pipeline",
    "host_bound": lambda f: "compiling the step" if savings.all_eager(f) else "running several steps per call",
    "collective_bound": lambda f: "fixing the worker or device the others wait for",
    "compute_bound": lambda f: "speeding up the step's math",
    "eager_execution": lambda f: "compiling the eagerly run ops into the step",
    "cpu_contention": lambda f: "giving the job the cores other processes took",
    "retracing": lambda f: "stopping the step from being traced again",
    "host_sync": lambda f: "taking the host-device synchronisation out of every step",
    "launch_bound": lambda f: "giving each kernel launch more work",
    "fp32_on_matrix_units": lambda f: "a reduced precision on the matrix units",
    "bf16_without_matrix_units": lambda f: "going back to float32",
    "cpu_without_onednn": lambda f: "turning on oneDNN's kernels",
    "no_prefetch": lambda f: "a prefetch at the end of the input pipeline",
    "below_roofline": lambda f: "bringing the ops far below their roofline up",
}
COMPUTE_FINDINGS = ("below_roofline", "fp32_on_matrix_units", "bf16_without_matrix_units", "float64_math")


def candidate_fixes(facts: Facts) -> list[Fix]:
    """Every fix devprof can estimate, largest saving first (unknown last): the exposed copy's and the
    host's wait's apart (their cures differ), host overhead's, the collective wait's, and each finding's
    that saves step time; compute's own only where no finding already carries it."""
    fixes = [
        Fix("input_copy", "input", savings.input_copy(facts)),
        Fix("input_wait", "input", savings.input_wait(facts)),
        Fix("host_bound", "host", part_savings(facts)["host"]),
        Fix("collective_bound", "collective", savings.collective_part(facts)),
    ]
    found = [rule for rule in RULES if rule.finding and rule.component != "epoch_level" and rule.applies(facts)]
    fixes += [Fix(rule.id, _finding_part(rule, facts), finding_saving(rule, facts)) for rule in found]
    if not any(rule.id in COMPUTE_FINDINGS for rule in found):
        fixes.append(Fix("compute_bound", "compute", savings.compute_part(facts)))
    known = [fix for fix in fixes if fix.saving.known and fix.saving.pct > 0]
    # A finding that saves just what its part's own fix saves is that fix said again (no prefetch and the
    # wait's fix; an all-eager step and compiling it): the part's, whose advice holds the finding's change.
    parts = {(fix.part, round(fix.saving.pct, 9)) for fix in known if not RULES_BY_ID[fix.rule].finding}
    distinct = [
        fix for fix in known if not (RULES_BY_ID[fix.rule].finding and (fix.part, round(fix.saving.pct, 9)) in parts)
    ]
    return ranked_fixes(distinct, facts.step_ms)


# Savings this close are one within the noise of two identical runs: max(10 % of the larger, 1 ms).
TIE_SHARE, TIE_MS = 0.10, 1.0
# Fixes whose savings tie go in this order: the cheaper, surer change first (a pipeline or loop setting
# whose saving is measured time, then a change to the program, then a change of precision or kernels
# whose saving is modelled from ceilings); fixes not listed follow, larger saving first.
TIE_ORDER = (
    "no_prefetch",
    "input_copy",
    "input_wait",
    "retracing",
    "host_sync",
    "host_bound",
    "launch_bound",
    "eager_execution",
    "cpu_contention",
    "memory_one_holder",
    "collective_bound",
    "cpu_without_onednn",
    "float64_math",
    "below_roofline",
    "fp32_on_matrix_units",
    "bf16_without_matrix_units",
    "compute_bound",
)


def _tie_rank(rule: str) -> int:
    return TIE_ORDER.index(rule) if rule in TIE_ORDER else len(TIE_ORDER)


def ranked_fixes(fixes: list[Fix], step_ms: float) -> list[Fix]:
    """Largest saving first; fixes within max(`TIE_SHARE` of the largest, `TIE_MS`) of the largest left
    tie and go in `TIE_ORDER`, so that two identical runs whose savings differ by noise give the same
    first fix."""
    ms_pct = 100.0 * TIE_MS / step_ms if step_ms == step_ms and step_ms > 0 else 0.0
    left = sorted(fixes, key=lambda fix: -fix.saving.pct)
    out: list[Fix] = []
    while left:
        lead = left[0].saving.pct
        tied = [fix for fix in left if fix.saving.pct >= lead - max(TIE_SHARE * lead, ms_pct)]
        out += sorted(tied, key=lambda fix: (_tie_rank(fix.rule), -fix.saving.pct))
        left = [fix for fix in left if fix not in tied]
    return out


def verdict_fixes(candidates: list[Fix]) -> list[Fix]:
    """The fixes that would save at least `MIN_VERDICT_SAVING_PCT` % of the step, largest first."""
    return [fix for fix in candidates if fix.saving.pct >= savings.MIN_VERDICT_SAVING_PCT]


def _fix_fields(fix: Fix, facts: Facts) -> dict:
    clause = RULES_BY_ID[fix.rule].fix(facts)
    return {"rule": fix.rule, "advice": f"{clause[0].upper()}{clause[1:]}.", **savings.as_fields(fix.saving, facts)}


def verdict_rule(facts: Facts) -> Rule:
    """The verdict rule of the part that holds the step."""
    bound = bound_of(facts)
    return RULES_BY_ID[_bound_rule_id(*bound) if bound is not None else "compute_bound"]


def classify(facts: Facts) -> tuple[str | None, str | None]:
    """(bound, level) of a breakdown: the largest part and whether it holds most of the step."""
    bound = bound_of(facts)
    return (bound[0], _bound_level(bound[1])) if bound is not None else (None, None)


def xprof_reading(facts: Facts, bound: str | None) -> str | None:
    """XProf's Overview reading of the step, from XProf's own definitions (`analysis.rules.xprof`); None
    where devprof cannot reproduce it or where XProf reads the step as the verdict does."""
    return facts.xprof.sentence(bound) if facts.xprof is not None else None


def fix_for(component: str, facts: Facts) -> str:
    """The one change that fits a component (compare's "why")."""
    return next(rule for rule in RULES if rule.component == component and not rule.finding).fix(facts)


def _rule_name(facts: Facts) -> str:
    return "its fix"


def _saving_words(saving: savings.Saving, facts: Facts) -> str:
    ms = saving.ms(facts)
    return f"{ms:.2f} ms, {saving.pct:.0f} % of the step" if ms == ms else f"{saving.pct:.0f} % of the step"


def _own_saving(part: str, facts: Facts) -> savings.Saving:
    """A bound part's own estimate where no fix saves enough (for its basis)."""
    if part in ("idle", "eager"):
        return (
            part_savings(facts)["host"]
            if part == "eager"
            else savings.Saving(math.nan, "unknown: the trace does not tell what the device waits for")
        )
    return part_savings(facts)[part]


def _verdict_advice(facts: Facts, rule: Rule, fixes: list[Fix]) -> list[str]:
    """Each fix's change, largest saving first (the first, and the bound's own part, in their detailed
    lines), then the bound's own advice."""
    lines: list[str] = []
    for i, fix in enumerate(fixes):
        fix_rule = RULES_BY_ID[fix.rule]
        detailed = i == 0 or fix.part == rule.bound or (rule.bound == "eager" and fix.part == "host")
        more = fix_rule.more(facts) if detailed else []
        lines += more or [_fix_fields(fix, facts)["advice"]]
    lines += advice(facts, rule)
    unique = list(dict.fromkeys(lines))
    return [
        line
        for line in unique
        if not any(line != other and line.lower().rstrip(".") in other.lower() for other in unique)
    ]


def advice(facts: Facts, rule: Rule) -> list[str]:
    """A verdict's advice: the rule's detailed lines, or its one fix when it has none (compare's
    "why" uses the fix, which sums up the same changes)."""
    more = rule.more(facts)
    if more:
        return more
    fix = rule.fix(facts)
    return [f"{fix[0].upper()}{fix[1:]}."]


def make_verdict(
    mean: dict[str, float],
    facts: Facts,
    *,
    steps_used: int,
    compile_steps: pd.DataFrame | None = None,
    utilization: dict[str, float] | None = None,
    min_steps: int = MIN_STEADY_STEPS,
) -> dict:
    """The verdict: `bound`, `level`, `rule`, `evidence` (a sentence with numbers), `advice` (list).

    With fewer than `min_steps` steady steps there is no verdict: `bound` and `level` are None
    and `reason` says why (compilation and warm-up are never its basis). A verdict over one step
    (a one-step capture, which `min_steps=1` allows) is marked `single_step`: it has no spread.
    """
    steps_per_call = facts.steps_per_call
    unit = "call" if steps_per_call > 1 else "step"
    split = ""
    if mean.get("input_copy_ms", 0.0) > 0:
        split = (
            f": {mean['input_wait_ms']:.2f} ms waiting for the iterator, {mean['input_copy_ms']:.2f} ms copying "
            "to the device"
        )
    over = (
        f"Over {steps_used} {unit}{'s' if steps_used != 1 else ''} of {mean['step_ms']:.2f} ms"
        if steps_used
        else f"No steady {unit} traced; the traced {unit}s, which trace or compile, take {mean['step_ms']:.2f} ms"
    )
    evidence = (
        f"{over}: "
        f"input {mean['input_pct']:.1f} % ({mean['input_ms']:.2f} ms{split}), "
        f"compute {mean['compute_pct']:.1f} % ({mean['compute_ms']:.2f} ms), "
        f"host overhead {mean['host_pct']:.1f} % ({mean['host_ms']:.2f} ms)"
    )
    if mean.get("collective_ms", 0.0) > 0:
        evidence += f", collective wait {mean['collective_pct']:.1f} % ({mean['collective_ms']:.2f} ms)"
    if steps_per_call > 1:
        evidence += f"; each call runs {steps_per_call} steps ({mean['step_ms'] / steps_per_call:.2f} ms per step)"
    if compile_steps is not None and not compile_steps.empty:
        listed = ", ".join(str(s) for s in compile_steps["step"].tolist()[:5])
        evidence += (
            f"; step {listed} spent {compile_steps['compile_ms'].sum():.1f} ms tracing/compiling,"
            " left out of the averages"
        )
    if utilization:
        evidence += "; " + ", ".join(f"{name} {value:.0f} %" for name, value in utilization.items())
    if steps_used == 0:
        reason = (
            f"no steady {unit}: every traced {unit} traces or compiles the training function; trace the "
            f"{unit}s after the first call (profile steps from its end)"
        )
        return {"bound": None, "level": None, "rule": None, "reason": reason, "evidence": f"{evidence}.", "advice": []}
    if steps_used < min_steps:
        reason = (
            f"only {steps_used} steady {unit}{'s' if steps_used != 1 else ''} (at least {min_steps} "
            f"needed; {unit}s that trace or compile are left out): trace more steps, e.g. a longer run "
            "or --profile-steps"
        )
        return {"bound": None, "level": None, "rule": None, "reason": reason, "evidence": f"{evidence}.", "advice": []}
    bound = bound_of(facts)
    if bound is None:
        return {
            "bound": None,
            "level": None,
            "rule": None,
            "evidence": f"{evidence}.",
            "advice": [],
            "reason": "no part of the step was measured",
        }
    part, share = bound
    rule = RULES_BY_ID[_bound_rule_id(part, share)]
    if facts.device_recorded is False and part != "input":
        return {
            "bound": None,
            "level": None,
            "rule": None,
            "evidence": f"{evidence}.",
            "advice": [],
            "reason": (
                "the device's activity was not recorded (its trace planes are empty), so compute and "
                "host overhead cannot be told apart; only input could be judged, and it is not the "
                "largest part"
            ),
        }
    candidates = candidate_fixes(facts)
    fixes = verdict_fixes(candidates)
    first = fixes[0] if fixes else None
    headline = rule.headline(facts)
    largest = max(fixes, key=lambda fix: fix.saving.pct) if fixes else None
    if first is not None and largest is not None and largest is not first:
        headline += (
            f" The fix to make first is {FIX_NAMES.get(first.rule, _rule_name)(facts)}: "
            f"{_saving_words(first.saving, facts)}, within noise of the largest "
            f"({FIX_NAMES.get(largest.rule, _rule_name)(facts)}, {_saving_words(largest.saving, facts)}) "
            "and the surer change."
        )
    elif first is not None and first.part != part:
        headline += (
            f" The largest fix we can estimate is {FIX_NAMES.get(first.rule, _rule_name)(facts)}: "
            f"{_saving_words(first.saving, facts)}."
        )
    elif first is None:
        best = max(candidates, key=lambda fix: fix.saving.pct) if candidates else None
        best_words = (
            f" (the largest, {FIX_NAMES.get(best.rule, _rule_name)(facts)}, about {best.saving.pct:.1f} %)"
            if best is not None
            else ""
        )
        headline += f" No fix we can estimate would save {savings.MIN_VERDICT_SAVING_PCT:g} % of the step{best_words}."
    if first is not None and RULES_BY_ID[first.rule].finding:
        headline += f" {RULES_BY_ID[first.rule].headline(facts)}"
    verdict: dict = {
        "bound": part,
        "bound_pct": round(share, 4),
        "level": _bound_level(share),
        "rule": rule.id,
        "cause": first.rule if first is not None else rule.id,
        "evidence": f"{headline} {evidence}.",
        "advice": _verdict_advice(facts, rule, fixes),
        **savings.as_fields(first.saving if first is not None else _own_saving(part, facts), facts),
        "fixes": [_fix_fields(fix, facts) for fix in fixes],
        "first_fix": _fix_fields(first, facts) if first is not None else None,
        "xprof_reading": xprof_reading(facts, part),
    }
    if steps_used == 1:
        verdict["single_step"] = True
        verdict["evidence"] += (
            f" Based on a single {unit}: there is no {unit}-to-{unit} spread to tell a typical "
            f"{unit} from an unusual one; trace a few more to confirm."
        )
    return verdict

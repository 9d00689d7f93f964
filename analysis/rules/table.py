"""The one table of rules that gives every verdict, advice line and "why" sentence.

A rule is a named check on the facts of a breakdown (shares of step or epoch time, the
device, the run's settings) with a headline, one fix and, for `analyze`, further advice.
`compare` explains a gap with the fix of the rule for the component that explains it. A new
rule is one entry.

The verdict names the part whose fix would save the most step time (`savings`): each part of
the step (input, host overhead, collective wait, compute) and each finding that applies carries
an estimate, and the largest wins; its level is that saving's share of the step (>= 20 % high).
Where no fix saves 5 % of the step, the step's math holds it: compute-bound. XProf's Overview
cut-offs (input >= 20 % highly, >= 5 % moderately input-bound) are a ladder, not a measure of
what holds the step; where they read the step differently, `xprof_reading` says so.

The rules' sentences and fixes are `advice_loop`'s (input and host) and `advice_compute`'s (the
step's math); this table says which goes with which rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd

from analysis.breakdown.idle import IDLE_CPU_PCT, MIN_IDLE_S
from analysis.breakdown.roofline import BELOW_ROOFLINE_MIN_SHARE, BELOW_ROOFLINE_PCT
from analysis.rules import memory as memory_rules
from analysis.rules import programs as program_facts
from analysis.rules import savings
from analysis.rules.advice_compute import (
    _compute_advice,
    _compute_fix,
    _compute_words,
    _matrix_units_fix,
    _precision_change,
    _roofline_fix,
    _roofline_headline,
    _slower_dtype,
    _slower_dtype_reason,
)
from analysis.rules.advice_loop import (
    MODERATE_INPUT_PCT,
    _contention_fix,
    _copy_advice,
    _copy_fix,
    _copy_split,
    _eager_fix,
    _eager_headline,
    _host_fix,
    _host_more,
    _idle_headline,
    _input_fix,
    _input_headline,
    _input_more,
    _steps_per_call,
    _wait_advice,
    _wait_material,
    _wait_only_fix,
    _wait_pct,
)
from analysis.rules.devices import facts_for
from analysis.rules.facts import Facts

BOUND_PARTS = ("compute", "input", "host", "collective", "idle", "eager")  # a tie goes to the first
HIGH_BOUND_PCT = 50.0  # a bound part holding at least this share of the step holds most of it: level high
MIN_STEADY_STEPS = 3  # fewer steady steps than this give no verdict
SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Rule:
    id: str
    component: str  # the part of the step it is about: input, host, compute, epoch_level
    applies: Callable[[Facts], bool]
    headline: Callable[[Facts], str]
    fix: Callable[[Facts], str]  # one change, as a clause: compare's "why" and analyze's first advice
    more: Callable[[Facts], list[str]] = field(default=lambda facts: [])
    bound: str | None = None  # the verdict it gives (None: not a verdict rule)
    level: str | None = None
    severity: str = "warning"
    description: str = ""
    finding: bool = False  # reported among `findings` wherever it applies


CONTENTION_PCT = 20.0  # other processes' share of the machine's CPU that makes timings suspect
LAUNCH_BOUND_KERNEL_US = 20.0  # kernels shorter than this on average cost about what launching them costs
LAUNCH_BOUND_IDLE_PCT = 30.0
MEMORY_NEAR_LIMIT = 0.90
EIGEN_DENSE_MIN_PCT = 25.0  # of a CPU step's op time: the dense math is a real part of the step
EAGER_MIN_STEP_PCT = 5.0  # eager ops' share of step time that makes running them eagerly worth changing


RULES: list[Rule] = [
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
    Rule(
        "cpu_contention",
        "host",
        lambda f: f.other_cpu_pct >= CONTENTION_PCT,
        lambda f: (
            f"Other processes took {f.other_cpu_pct:.0f} % of the machine's CPU "
            f"(about {f.other_cpu_pct * f.cpu_cores / 100:.1f} of {f.cpu_cores:.0f} cores) while training "
            f"used {f.proc_cpu_pct / 100:.1f} cores: the timings include waiting for CPU."
            + (
                f" This machine runs {f.job_workers_here} other worker{'s' if f.job_workers_here > 1 else ''} "
                f"of the same job, which {'are' if f.job_workers_here > 1 else 'is'} among them."
                if f.job_workers_here
                else ""
            )
        ),
        _contention_fix,
        severity="warning",
        finding=True,
        description=f"other processes use >= {CONTENTION_PCT:g} % of the machine's CPU during the run",
    ),
    Rule(
        "retracing",
        "host",
        lambda f: f.retrace_steps > 0,
        lambda f: (
            f"Graphs were built or compiled again in {f.retrace_steps} step{'s' if f.retrace_steps > 1 else ''} "
            f"after the first ({f.retrace_ms:.1f} ms): "
            + ("jax.jit compiles the step again." if f.producer == "jax" else "the tf.function retraces.")
        ),
        lambda f: (
            "keep the step's input shapes and static arguments fixed: pad batches to one shape and pass "
            "configuration through `static_argnums` only when it really changes"
            if f.producer == "jax"
            else "keep the step's input shapes and Python arguments fixed: pass tensors, not Python numbers, and "
            "give the tf.function an input_signature (or reduce_retracing=True)"
        ),
        finding=True,
        description="graph building or compilation inside the profiled window after the first step",
    ),
    Rule(
        "host_sync",
        "host",
        lambda f: f.sync_name is not None,
        lambda f: f"Every step synchronises the host with the device ({f.sync_name} in each step).",
        lambda f: (
            (
                "take jax.device_get, .block_until_ready() and printing of arrays out of the step"
                if f.producer == "jax"
                else "take .numpy(), tf.print and Python-side metrics out of the step"
            )
            + ", or do them every N steps, so the host can queue the next step while the device works"
        ),
        finding=True,
        description="a host-device synchronisation (device-to-host copy, tf.print) in every step",
    ),
    Rule(
        "launch_bound",
        "host",
        lambda f: f.mean_kernel_us < LAUNCH_BOUND_KERNEL_US and f.idle_host_pct >= LAUNCH_BOUND_IDLE_PCT,
        lambda f: (
            f"{f.kernels_per_step:.0f} kernels per step averaging {f.mean_kernel_us:.1f} µs, and the device is "
            f"idle waiting for the host {f.idle_host_pct:.0f} % of the step: launching costs more than running."
        ),
        lambda f: (
            "give each launch more work: a larger --batch-size, XLA (--jit-compile) to fuse small ops, "
            "and several steps per call (--steps-per-execution)"
            if f.producer == "devprof"
            else f"give each launch more work: {program_facts.program(f.producer).batch_size}, "
            + (
                f"XLA ({program_facts.program(f.producer).xla}) to fuse small ops, "
                if program_facts.program(f.producer).xla
                else ""
            )
            + f"and {program_facts.steps_per_call(f.producer, 8)}"
        ),
        finding=True,
        description=f"kernels under {LAUNCH_BOUND_KERNEL_US:g} µs on average and the device idle for the "
        f"host >= {LAUNCH_BOUND_IDLE_PCT:g} % of the step",
    ),
    Rule(
        "fp32_on_matrix_units",
        "compute",
        lambda f: f.precision in (None, "float32") and bool(f.matrix_units) and not _measured_slower(f),
        lambda f: (
            f"The run computes in float32 on a device with {' and '.join(f.matrix_units or ())} matrix units, "
            "which float32 does not use."
        ),
        lambda f: _matrix_units_fix(f),
        severity="info",
        finding=True,
        description="float32 training on a device with bfloat16/float16 matrix units",
    ),
    Rule(
        "bf16_without_matrix_units",
        "compute",
        _slower_dtype,
        lambda f: (
            f"The run computes in {savings.precision_dtypes(f)[0]}, which is slower than float32 here: "
            f"{_slower_dtype_reason(f)}."
        ),
        lambda f: f"train in float32 ({_precision_change(f, 'float32')})",
        severity="warning",
        finding=True,
        description="a reduced precision whose measured matrix ceiling is below float32's, or bfloat16 on a CPU "
        "that emulates it",
    ),
    Rule(
        "float64_math",
        "compute",
        lambda f: f.precision == "float64",
        lambda f: (
            "The matrix ops compute in float64: no oneDNN, cuDNN or tensor-core kernel takes it, and a float64 "
            "vector holds half the numbers a float32 one does."
        ),
        lambda f: f"compute in float32: {program_facts.float32(f.producer)}",
        severity="warning",
        finding=True,
        description="the dtype most of the costed ops' FLOPs run in is float64 (a model made float64 by mistake)",
    ),
    Rule(
        "cpu_without_onednn",
        "compute",
        lambda f: f.device == "cpu" and f.eigen_dense_pct >= EIGEN_DENSE_MIN_PCT and f.precision != "float64",
        lambda f: (
            f"{f.eigen_dense_pct:.0f} % of the step's op time is in TensorFlow's Eigen convolution and "
            "matmul kernels: its oneDNN kernels were off (TensorFlow turns them on itself only on CPUs "
            "with AVX-512 VNNI, bfloat16 or AMX units)."
        ),
        lambda f: (
            "set TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow is imported (devprof run does unless it is set; "
            "on a 2-core AVX2 CPU the seed CNN trained 1.4 to 2.4 times faster)"
        ),
        severity="warning",
        finding=True,
        description=f"on a CPU, >= {EIGEN_DENSE_MIN_PCT:g} % of op time in Eigen conv/matmul kernels and no oneDNN kernel",
    ),
    Rule(
        "eager_execution",
        "host",
        lambda f: f.eager is not None and f.eager.step_pct >= EAGER_MIN_STEP_PCT,
        _eager_headline,
        _eager_fix,
        finding=True,
        description=f"ops executed eagerly (one at a time from Python) take >= {EAGER_MIN_STEP_PCT:g} % of step time",
    ),
    Rule(
        "no_prefetch",
        "input",
        lambda f: f.prefetches is False and _wait_material(f),
        lambda f: (
            "The input pipeline does not end with a prefetch: the step waits while each batch is prepared "
            "(a stage after a prefetch is not prefetched)."
        ),
        lambda f: "end the tf.data pipeline with .prefetch(tf.data.AUTOTUNE)",
        finding=True,
        description=f"a traced tf.data pipeline without a Prefetch stage, and the host waits for "
        f"it >= {MODERATE_INPUT_PCT:g} % of step time",
    ),
    Rule(
        "idle_stretch",
        "epoch_level",
        lambda f: f.idle_stretch is not None,
        _idle_headline,
        lambda f: (
            "find what the program waits for there (a thread or iterator winding down, a file, another "
            "process): `py-spy dump --pid PID` during the stretch shows it"
        ),
        finding=True,
        description=f"the process's CPU under {IDLE_CPU_PCT:g} % for more than {MIN_IDLE_S:g} s outside "
        "every step (host sampler)",
    ),
    Rule(
        "below_roofline",
        "compute",
        lambda f: bool(f.below_roofline),
        _roofline_headline,
        _roofline_fix,
        severity="info",
        finding=True,
        description=f"ops holding >= {BELOW_ROOFLINE_MIN_SHARE:g} % of op time at under {BELOW_ROOFLINE_PCT:g} % of "
        "their roofline ceiling (their dtype's matrix or vector ceiling, or bandwidth x intensity)",
    ),
    Rule(
        "memory_near_limit",
        "compute",
        lambda f: (
            f.device_mem_total_bytes > 0 and f.device_mem_peak_bytes >= MEMORY_NEAR_LIMIT * f.device_mem_total_bytes
        ),
        lambda f: (
            f"Device memory peaked at {f.device_mem_peak_bytes / 2**30:.2f} of {f.device_mem_total_bytes / 2**30:.2f}"
            f" GiB ({100 * f.device_mem_peak_bytes / f.device_mem_total_bytes:.0f} %): one larger batch or "
            "model from an out-of-memory error."
        ),
        lambda f: "leave headroom: a smaller --batch-size or mixed precision",
        severity="critical",
        finding=True,
        description=f"device memory peak within {100 * (1 - MEMORY_NEAR_LIMIT):.0f} % of the device's limit",
    ),
    # The allocators' own events (trace) and the samplers' memory; none saves step time (saving_ms null).
    Rule(
        "memory_oom",
        "compute",
        lambda f: memory_rules.oom(f) is not None,
        memory_rules.oom_headline,
        memory_rules.oom_fix,
        severity="critical",
        finding=True,
        description="the run ended with an out-of-memory error (run.json `oom`): the allocation that failed and "
        "what held the memory then (trace, else samplers)",
    ),
    Rule(
        "memory_near_capacity",
        "compute",
        lambda f: memory_rules.near_capacity(f) is not None,
        memory_rules.near_capacity_headline,
        memory_rules.near_capacity_fix,
        severity="critical",
        finding=True,
        description=f"an allocator's peak bytes in use >= {100 * memory_rules.NEAR_CAPACITY_SHARE:.0f} % of the "
        "capacity it states (or the device's memory)",
    ),
    Rule(
        "memory_fragmentation",
        "compute",
        lambda f: memory_rules.fragmented(f) is not None,
        memory_rules.fragmentation_headline,
        memory_rules.fragmentation_fix,
        finding=True,
        description=f"an allocator >= {100 * memory_rules.FRAGMENTED:.0f} % fragmented at a peak holding >= "
        f"{100 * memory_rules.FRAGMENTATION_FULL_SHARE:.0f} % of its capacity",
    ),
    Rule(
        "memory_growth",
        "host",
        lambda f: memory_rules.growing(f) is not None,
        memory_rules.growth_headline,
        memory_rules.growth_fix,
        finding=True,
        description="bytes held at step end growing step after step (trace), or the sampled memory at epoch end "
        "growing epoch after epoch",
    ),
    Rule(
        "memory_one_holder",
        "compute",
        lambda f: memory_rules.one_holder(f) is not None,
        memory_rules.one_holder_headline,
        memory_rules.one_holder_fix,
        severity="info",
        finding=True,
        description=f"one op's tensors hold >= {100 * memory_rules.ONE_HOLDER_SHARE:.0f} % of an allocator's peak",
    ),
    Rule(
        "host_memory_pressure",
        "host",
        lambda f: memory_rules.host_pressure(f) is not None,
        memory_rules.host_pressure_headline,
        memory_rules.host_pressure_fix,
        finding=True,
        description=f"the machine's available memory under {100 * memory_rules.LOW_AVAILABLE_SHARE:.0f} % of it "
        "(host sampler)",
    ),
]
RULES_BY_ID = {rule.id: rule for rule in RULES}


def _measured_slower(facts: Facts) -> bool:
    """Whether the device's reduced dtype measures slower than float32 (mixed precision would not help)."""
    ratio = savings.precision_ratio(facts)
    return savings.precision_dtypes(facts)[0] == "float32" and ratio == ratio and ratio <= 1.0


FINDING_SAVINGS: dict[str, Callable[[Facts], savings.Saving]] = {
    "cpu_contention": savings.contention,
    "retracing": savings.retracing,
    "host_sync": savings.idle_for_host,
    "launch_bound": savings.idle_for_host,
    "fp32_on_matrix_units": savings.precision_saving,
    "bf16_without_matrix_units": savings.precision_saving,
    "float64_math": savings.float64_saving,
    "memory_one_holder": memory_rules.one_holder_saving,
    "cpu_without_onednn": savings.onednn,
    "eager_execution": lambda f: savings.eager(f, _steps_per_call(f)[1]),
    "no_prefetch": savings.prefetch_only,
    "below_roofline": savings.roofline_saving,
}


def finding_saving(rule: Rule, facts: Facts) -> savings.Saving:
    """What fixing a finding would save per step (unknown for those that save no step time)."""
    estimate = FINDING_SAVINGS.get(rule.id)
    if estimate is None:
        return savings.Saving(
            math.nan,
            "saves no step time"
            if rule.id != "idle_stretch"
            else "time outside the steps, not per step: the stretch itself is what it would save",
        )
    return estimate(facts)


def _rank(item: dict) -> float:
    pct = item.get("saving_pct")
    return -pct if pct is not None else math.inf


def findings(facts: Facts) -> list[dict]:
    """`[{rule, severity, evidence, advice, saving_ms, saving_pct, saving_basis}]` for every finding
    rule that applies, the largest saving first (unknown savings last)."""
    found = [
        {
            "rule": rule.id,
            "severity": rule.severity,
            "evidence": rule.headline(facts),
            "advice": rule.fix(facts),
            **savings.as_fields(finding_saving(rule, facts), facts),
        }
        for rule in RULES
        if rule.finding and rule.applies(facts)
    ]
    return sorted(found, key=_rank)


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

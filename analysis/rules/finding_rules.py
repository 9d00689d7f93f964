"""The findings' rules and what fixing each saves: any number apply side by side, beside the one verdict rule."""

from __future__ import annotations

import math
from typing import Callable

from analysis.breakdown.idle import IDLE_CPU_PCT, MIN_IDLE_S
from analysis.breakdown.roofline import BELOW_ROOFLINE_MIN_SHARE, BELOW_ROOFLINE_PCT
from analysis.rules import memory as memory_rules
from analysis.rules import programs as program_facts
from analysis.rules import savings
from analysis.rules.advice_compute import (
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
    _eager_fix,
    _eager_headline,
    _idle_headline,
    _steps_per_call,
    _wait_material,
)
from analysis.rules.facts import Facts
from analysis.rules.rule import Rule

CONTENTION_PCT = 20.0  # other processes' share of the machine's CPU that makes timings suspect
LAUNCH_BOUND_KERNEL_US = 20.0  # kernels shorter than this on average cost about what launching them costs
LAUNCH_BOUND_IDLE_PCT = 30.0
MEMORY_NEAR_LIMIT = 0.90
EIGEN_DENSE_MIN_PCT = 25.0  # of a CPU step's op time: the dense math is a real part of the step
EAGER_MIN_STEP_PCT = 5.0  # eager ops' share of step time that makes running them eagerly worth changing


FINDING_RULES: list[Rule] = [
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
        for rule in FINDING_RULES
        if rule.applies(facts)
    ]
    return sorted(found, key=_rank)

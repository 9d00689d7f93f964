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
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd

from analysis.breakdown.idle import IDLE_CPU_PCT, MIN_IDLE_S
from analysis.breakdown.input_stages import STAGE_FAMILIES, SlowestStage, has_stage
from analysis.breakdown.roofline import BELOW_ROOFLINE_MIN_SHARE, BELOW_ROOFLINE_PCT, BelowRoofline
from analysis.rules import memory as memory_rules
from analysis.rules import programs as program_facts
from analysis.rules import savings
from analysis.rules.devices import facts_for
from analysis.rules.facts import Facts, make_facts

MODERATE_INPUT_PCT = 5.0  # a wait this share of the step is worth the tf.data advice
BOUND_PARTS = ("compute", "input", "host", "collective", "idle", "eager")  # a tie goes to the first
HIGH_BOUND_PCT = 50.0  # a bound part holding at least this share of the step holds most of it: level high
MIN_STEADY_STEPS = 3  # fewer steady steps than this give no verdict
NICE_STEPS_PER_EXECUTION = (2, 4, 8, 16, 32, 50, 100, 200, 500, 1000)
SEVERITIES = ("info", "warning", "critical")

# tf.data advice by the change it asks for (`_pipeline_changes` keeps those that fit the traced
# pipeline; with its stages unknown, the generic ones, phrased as what to add).
INPUT_ADVICE = {
    "prefetch": "Add `.prefetch(tf.data.AUTOTUNE)` as the last stage of the tf.data pipeline so the next batch "
                "is prepared while the current step runs.",
    "parallel_work": "Run the pipeline's work in parallel: add `num_parallel_calls=tf.data.AUTOTUNE, "
                     "deterministic=False` to its `.map` calls, and where it reads files, read several at once with "
                     "`.interleave(..., num_parallel_calls=tf.data.AUTOTUNE)`.",
    "parallel_map": "Parallelize its map: `.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)`.",
    "vectorize": "Its map already runs in parallel: make each call cheaper, vectorized over a batch (`.batch()` "
                 "before the `.map`).",
    "add_map": "Add a parallel map for per-element work (the pipeline has none): "
               "`.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)`.",
    "interleave": "Read several files at once: `.interleave(reader, num_parallel_calls=tf.data.AUTOTUNE)` over the "
                  "file names.",
    "cache": "Add `.cache()` for what does not change between epochs: after decoding and before random augmentation "
             "(in memory, or `.cache(path)` on local disk).",
    "batch_first": "Batch before expensive per-element work (`.batch()` then a vectorized `.map`), and move Python "
                   "functions (`tf.py_function`, `tf.numpy_function`) out of the pipeline: they hold the GIL.",
}
INPUT_FIX = {  # the same changes as clauses of a verdict's fix
    "prefetch": "add .prefetch(tf.data.AUTOTUNE) at its end",
    "parallel_work": "add num_parallel_calls=tf.data.AUTOTUNE where it maps or interleaves",
    "parallel_map": "parallelise its map (num_parallel_calls=tf.data.AUTOTUNE)",
    "vectorize": "vectorize its map's function (map after .batch())",
    "add_map": "add a parallel .map(num_parallel_calls=tf.data.AUTOTUNE) for per-element work",
    "interleave": "read files in parallel with .interleave(num_parallel_calls=tf.data.AUTOTUNE)",
    "cache": "add .cache() for what does not change between epochs",
}
HOST_ADVICE = [
    "Use a larger batch (`--batch-size`) so fixed per-step host overhead is spread over more images.",
]
LARGER_BATCH_ADVICE = (
    "A larger batch (`--batch-size`) uses the device better if memory allows; otherwise a faster device "
    "or a smaller model is what helps."
)


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
MIXED_FOR_DTYPE = {"bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


def suggest_steps_per_execution(host_pct: float, compute_pct: float, steps_per_call: int,
                                steps_per_epoch: float = math.nan, target_pct: float = 5.0) -> int:
    """Steps per call that would bring per-call host overhead to about `target_pct` of step time.

    With host overhead h paid once per call and compute c per step, k steps per call leave
    h / (h + k c); k >= h (100 - target) / (target c), rounded up to a usual value.
    """
    if not (compute_pct > 0) or not (host_pct > 0):
        return NICE_STEPS_PER_EXECUTION[2]
    per_call_host = host_pct * steps_per_call  # host overhead is paid once per call
    needed = per_call_host * (100.0 - target_pct) / (target_pct * compute_pct)
    choice = next((k for k in NICE_STEPS_PER_EXECUTION if k >= needed), NICE_STEPS_PER_EXECUTION[-1])
    if steps_per_epoch == steps_per_epoch and steps_per_epoch >= 1:
        choice = min(choice, int(steps_per_epoch))
    return max(choice, steps_per_call + 1)


def compute_advice(device: str = "", precision: str | None = None, jit_compile: bool | None = None,
                   producer: str = "devprof", bfloat16_units: tuple[str, ...] | None = None) -> list[str]:
    """What to try on a compute-bound step, leaving out what the run already does, in the
    words of the program that wrote the trace."""
    return _compute_advice(make_facts(input_pct=None, host_pct=None, device=device, precision=precision,
                                      jit_compile=jit_compile, producer=producer, bfloat16_units=bfloat16_units))


def precision_advice(facts: Facts) -> str | None:
    """Mixed precision only where the measured ceiling of that dtype beats the run's; back to float32
    where the run's reduced dtype measures slower; a measurement to take where neither is known."""
    device = facts_for(facts.device)
    now, other = savings.precision_dtypes(facts)
    ratio = savings.precision_ratio(facts)
    if now != "float32":
        if ratio == ratio and ratio > 1.0:
            return (f"Go back to float32 ({_precision_change(facts, 'float32')}): its measured ceiling is higher here, "
                    f"{savings.ceilings_text(facts)}.")
        if ratio != ratio and _bfloat16_emulated(facts.precision or "", facts.bfloat16_units):
            return f"Go back to float32 ({_precision_change(facts, 'float32')}): this CPU has no bfloat16 units."
        return None
    if ratio == ratio:
        if ratio > 1.0:
            return (f"Use mixed precision: {program_facts.precision(facts.producer, device.mixed_precision)}; "
                    f"{savings.ceilings_text(facts)}.")
        return f"Keep float32: {savings.ceilings_text(facts)}, so {device.mixed_precision} would be slower here."
    if _bfloat16_emulated(device.mixed_precision, facts.bfloat16_units):
        return ("Keep float32: this CPU has no bfloat16 units (no AVX512-BF16, no AMX), so mixed_bfloat16 "
                "would be emulated and slower.")
    note = f" ({device.precision_note})" if device.precision_note else ""
    return (f"Whether {device.mixed_precision} would be faster is a guess until measured{note}: `devprof peak` "
            f"measures {other}'s and float32's ceilings on this device; switch "
            f"({program_facts.precision(facts.producer, device.mixed_precision)}) only if {other}'s is higher.")


def _precision_change(facts: Facts, dtype: str) -> str:
    if facts.producer == "devprof":
        return f"`--precision {dtype}`"
    if dtype == "float32":
        return "no mixed-precision policy" if facts.producer != "jax" else "float32 parameters and activations"
    return program_facts.precision(facts.producer, f"mixed_{dtype}")


def _compute_advice(facts: Facts) -> list[str]:
    device = facts_for(facts.device)
    program = program_facts.program(facts.producer)
    jit_compile = facts.jit_compile
    advice = [line for line in [precision_advice(facts)] if line]
    if device.xla_helps and not jit_compile and program.xla:
        how = "`--jit-compile` (`tf.function(jit_compile=True)`)" if program.name == "devprof" else program.xla
        advice.append(f"Compile the step with XLA: {how}.")
    if program.name == "devprof":
        return advice + [LARGER_BATCH_ADVICE]
    how = "" if program.batch_size == "a larger batch" else f" ({program.batch_size})"
    return advice + [f"A larger batch{how} uses the device better if memory allows; otherwise a "
                     "faster device or a smaller model is what helps."]


def _bfloat16_emulated(policy: str, bfloat16_units: tuple[str, ...] | None) -> bool:
    """Whether the suggested policy is bfloat16 on a CPU known to lack bfloat16 units."""
    return policy == "mixed_bfloat16" and bfloat16_units == ()


STAGE_EXPLAINS_SHARE = 0.5  # a tf.data stage whose own time per step is at least half the wait explains it


def _wait_pct(facts: Facts) -> float:
    """The host's wait for the iterator, % of step time; all of input where the split is unknown."""
    return facts.input_wait_pct if facts.input_wait_pct == facts.input_wait_pct else facts.input_pct


def _copy_dominates(facts: Facts) -> bool:
    """Whether the batch's exposed host-to-device copy is more of the input than the host's wait."""
    return facts.input_copy_pct == facts.input_copy_pct and facts.input_copy_pct > _wait_pct(facts)


def _wait_material(facts: Facts) -> bool:
    """Whether the host's wait alone reaches the input-bound cut-off (the tf.data advice's condition)."""
    return _wait_pct(facts) >= MODERATE_INPUT_PCT


def _stage_explains(facts: Facts) -> bool:
    """Whether the slowest tf.data stage's own time explains the wait (unknown times: assumed so)."""
    stage = facts.slowest_input_stage
    if stage is None:
        return False
    if not (stage.ms_per_step == stage.ms_per_step and facts.input_wait_ms == facts.input_wait_ms):
        return True
    return stage.ms_per_step >= STAGE_EXPLAINS_SHARE * facts.input_wait_ms


def pipeline_is_the_cause(facts: Facts) -> bool:
    """Whether the slowest tf.data stage is what the steps wait for: the host's wait is material
    and that stage's own time explains it (an exposed copy is not the pipeline's doing)."""
    return _wait_material(facts) and _stage_explains(facts)


def _copy_split(facts: Facts) -> str:
    return (f"the copy is {facts.input_copy_pct:.1f} % of the step, the host's wait for the iterator "
            f"{_wait_pct(facts):.1f} %")


def _copy_fix(facts: Facts) -> str:
    if facts.producer == "jax":
        ahead = "put the next batches on the device ahead of the step (`jax.device_put`, a prefetch-to-device iterator)"
    else:
        ahead = "prefetch batches to the device (`tf.data.experimental.prefetch_to_device`)"
    return (f"the step waits for its batch's host-to-device copy, not for the input pipeline ({_copy_split(facts)}): "
            f"{ahead} so the copy runs under the previous step, and copy fewer bytes (uint8 images, cast on the "
            "device)")


def _copy_advice(facts: Facts) -> list[str]:
    if facts.producer == "jax":
        ahead = ("Put the next batches on the device while the current step runs: `jax.device_put` them ahead of the "
                 "step (a prefetch-to-device iterator of two or more batches).")
    else:
        ahead = ("Prefetch batches to the device so the next batch's copy runs under the current step: end the "
                 "pipeline with `.apply(tf.data.experimental.prefetch_to_device(\"/gpu:0\"))`, or, with tf.distribute, "
                 "`strategy.experimental_distribute_dataset(ds, tf.distribute.InputOptions("
                 "experimental_fetch_to_device=True, experimental_per_replica_buffer_size=2))`.")
    return [ahead,
            "Copy fewer bytes: keep images uint8 on the host and cast and normalise them on the device inside the "
            "step (a quarter of float32's bytes).",
            "Copy from pinned (page-locked) host memory: a copy from pageable memory is staged through a bounce "
            "buffer first, and is slower."]


def _input_fix(facts: Facts) -> str:
    return _copy_fix(facts) if _copy_dominates(facts) else _wait_only_fix(facts)


def stage_advice(stage: SlowestStage) -> str:
    """One change for the slowest tf.data stage, by what kind of stage it is: it names no other stage."""
    kind = stage.kind
    if stage.runs_python:
        return ("it runs Python (`tf.py_function`/`tf.numpy_function`), which holds the GIL and runs one call at a "
                "time: rewrite it with TensorFlow ops, or move it out of the pipeline (precompute, then `.cache()`)")
    if kind in ("Map", "MapAndBatch"):
        return "parallelise this map: `.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)`"
    if kind == "Interleave":
        return "parallelise this interleave: `num_parallel_calls=tf.data.AUTOTUNE`, `deterministic=False`"
    if kind == "FlatMap":
        return "a flat_map makes one input's elements at a time: `.interleave(fn, num_parallel_calls=tf.data.AUTOTUNE)`"
    if kind in ("ParallelMap", "ParallelMapV2"):
        return "it is already parallel: vectorize its function (`.batch()` before this map), or `.cache()` its output"
    if kind in STAGE_FAMILIES["parallel_interleave"]:
        return "it is already parallel: `.cache()` its output, or make the work of each input cheaper"
    if kind in STAGE_FAMILIES["read_files"]:
        return ("reading files is the cost: `.cache()` right after this stage, or read several files at once with "
                "`.interleave(..., num_parallel_calls=tf.data.AUTOTUNE)`")
    if kind == "Generator" and re.search(r"FlatMap\[\d+\]::Generator$", stage.name):
        return ("it makes elements in Python (`from_generator`), one at a time under the GIL: build the dataset from "
                "arrays (`from_tensor_slices`) or files, or `.cache()` right after it")
    if kind in ("TensorSlice", "Range", "FromTensor", "Tensor"):
        return "it hands out in-memory elements one at a time: `.batch()` right after it so what follows runs per batch"
    if kind in ("Shuffle", "ShuffleAndRepeat"):
        return "a smaller shuffle buffer"
    if kind in ("Batch", "BatchV2", "PaddedBatch"):
        return "batch before expensive per-element work so it runs once per batch"
    if kind in STAGE_FAMILIES["pass_through"] or kind == "Generator":
        return (f"a {kind} stage only hands on what its input makes, and the trace shows no input working meanwhile "
                "(its calls began before the trace, or it is another pipeline): speed up the stages that feed it")
    return f"`.cache()` after this {kind} stage if its output does not change between epochs"


def _uses_tf_data(facts: Facts) -> bool:
    """Whether tf.data advice fits: a TensorFlow program, or a trace with tf.data stages in it."""
    return facts.prefetches is not None or facts.input_stage_kinds is not None \
        or bool(program_facts.program(facts.producer).input_pipeline)


def _pipeline_changes(facts: Facts) -> list[str]:
    """The keys of the tf.data changes that fit the pipeline: only stages it has, or lacks, are named."""
    kinds = facts.input_stage_kinds
    changes = [] if facts.prefetches else ["prefetch"]
    if kinds is None:
        return changes + ["parallel_work", "cache", "batch_first"]
    changes.append("parallel_map" if has_stage(kinds, "serial_map") else "vectorize" if has_stage(kinds, "map")
                   else "add_map")
    if has_stage(kinds, "read_files") and not has_stage(kinds, "parallel_interleave"):
        changes.append("interleave")
    if not has_stage(kinds, "cache") and (has_stage(kinds, "map") or has_stage(kinds, "read_files")):
        changes.append("cache")
    return changes


def _input_more(facts: Facts) -> list[str]:
    """Advice for the part of input that dominates, the exposed copy or the host's wait; the wait's
    (tf.data) advice also where the wait alone is material, and a stage's only where it explains it."""
    copy = _copy_advice(facts) if _copy_dominates(facts) else []
    if copy and not _wait_material(facts):
        return copy
    return copy + _wait_advice(facts)


def _wait_advice(facts: Facts) -> list[str]:
    if facts.python_iterator:
        fix = _wait_only_fix(facts)
        return [f"{fix[0].upper()}{fix[1:]}.",
                "Python work per batch holds the GIL and runs on one core: vectorize it over the whole data set "
                "once, or express it in TensorFlow ops inside `.map`, where tf.data runs it in parallel."]
    if not _uses_tf_data(facts):
        fix = _wait_fix(facts)
        return [f"{fix[0].upper()}{fix[1:]}.",
                "Make the host side of each batch cheaper: decode and augment once and cache the result, or do the "
                "augmentation on the device inside the step."]
    stage = [f"The slowest tf.data stage is `{facts.slowest_input_stage}`: "
             f"{stage_advice(facts.slowest_input_stage)}."] \
        if facts.slowest_input_stage and pipeline_is_the_cause(facts) else []
    slowest = facts.slowest_input_stage
    said = ("parallel_map", "vectorize") if stage and slowest is not None and slowest.kind in STAGE_FAMILIES["map"] \
        else ()
    return stage + [INPUT_ADVICE[key] for key in _pipeline_changes(facts) if key not in said]


def _wait_fix(facts: Facts) -> str:
    return ("the loop waits for batches: prepare the next batch while the step runs (a background thread or "
            "prefetching to the device) and move preprocessing out of the training loop")


def _steps_per_call(facts: Facts) -> tuple[int, int]:
    """(steps per call now, the suggested --steps-per-execution)."""
    k = int(facts.steps_per_call or 1)
    return k, suggest_steps_per_execution(facts.per_call_host_pct(), facts.compute_pct, k, facts.steps_per_epoch)


def _host_fix(facts: Facts) -> str:
    if savings.all_eager(facts):  # steps per call need a compiled step: that comes first
        return _eager_fix(facts)
    k, suggestion = _steps_per_call(facts)
    if facts.producer != "devprof":
        change = program_facts.steps_per_call(facts.producer, suggestion)
        return f"at {k} step{'s' if k > 1 else ''} per call; run {change}, or cut per-step Python work"
    if k <= 1:
        return f"at 1 step per call; try --steps-per-execution {suggestion}"
    return f"already {k} steps per call; try --steps-per-execution {suggestion} or cut per-step Python work"


def _host_steps_per_call(facts: Facts) -> str:
    k, suggestion = _steps_per_call(facts)
    if facts.producer != "devprof":
        return ("Run several steps per call so Python and dispatch cost is paid once per call: "
                f"{program_facts.steps_per_call(facts.producer, suggestion)}.")
    if k <= 1:
        return (f"Run several steps per call so Python and dispatch cost is paid once per call: "
                f"`--steps-per-execution {suggestion}`.")
    return (f"Already {k} steps per call: raise `--steps-per-execution` to {suggestion}, or look for per-call "
            "Python work.")


def _compute_fix(facts: Facts) -> str:
    device = facts_for(facts.device)
    at_peak = (f"{facts.mfu_scope} at {facts.mfu_pct:.0f} % of the device's {facts.peak_dtype} ceiling; "
               if facts.mfu_pct == facts.mfu_pct else "")
    now, _ = savings.precision_dtypes(facts)
    ratio = savings.precision_ratio(facts)
    slower_now = now != "float32" and (ratio > 1.0 if ratio == ratio
                                       else _bfloat16_emulated(facts.precision or "", facts.bfloat16_units))
    if slower_now:
        return f"{at_peak}go back to float32 ({_precision_change(facts, 'float32')}): {_slower_dtype_reason(facts)}"
    # Mixed precision only where its measured ceiling is higher.
    faster = now == "float32" and ratio == ratio and ratio > 1.0
    program = program_facts.program(facts.producer)
    if facts.producer != "devprof":
        tries = [program_facts.precision(facts.producer, device.mixed_precision)] if faster else []
        if device.xla_helps and not facts.jit_compile and program.xla:
            tries.append(program.xla)
        return f"{at_peak}try {', '.join(tries + [program.batch_size])}, or a faster device"
    tries = [f"--precision {device.mixed_precision}"] if faster else []
    if device.xla_helps and not facts.jit_compile:
        tries.append("--jit-compile")
    already = f"already {facts.precision}; " if now != "float32" else ""
    return f"{at_peak}{already}try {' and '.join(tries + ['a larger --batch-size'])}, or a faster device"


def _slower_dtype_reason(facts: Facts) -> str:
    ratio = savings.precision_ratio(facts)
    if ratio == ratio:
        return f"{savings.ceilings_text(facts)}"
    return "this CPU has no bfloat16 units (no AVX512-BF16, no AMX), so bfloat16 is emulated"


def _host_advice(facts: Facts) -> list[str]:
    if facts.producer == "devprof":
        return HOST_ADVICE  # devprof's own loop has no per-step Python work of the user's to take out
    program = program_facts.program(facts.producer)
    syncs = "`jax.device_get`, `.block_until_ready()`" if program.name == "jax" else "`.numpy()`/`float()`"
    where = "callbacks" if program.name == "keras" else "the loop"
    return [f"Take per-step Python work out of {where}: no {syncs} on metrics, logging or printing every step; "
            "do it every N steps.",
            f"Use {program.batch_size} so fixed per-step host overhead is spread over more examples."]


def _host_more(facts: Facts) -> list[str]:
    if savings.all_eager(facts):
        fix = _eager_fix(facts)
        return [f"{fix[0].upper()}{fix[1:]}.", *(line for line in _host_advice(facts) if "batch" in line)]
    return [_host_steps_per_call(facts), *_host_advice(facts)]


def _input_headline(facts: Facts) -> str:
    share = f"Input-bound: input is {facts.input_pct:.0f} % of the step, its largest part"
    if _copy_dominates(facts):
        return f"{share}: each step waits for its batch's copy to the device ({_copy_split(facts)})."
    return f"{share}: the loop waits for the next batch."


def _contention_fix(facts: Facts) -> str:
    if facts.job_workers_here:
        workers = "`--workers`" if facts.producer == "devprof" else "workers"
        return (f"the job's own workers share this machine's cores: run fewer {workers} per machine (one per machine, "
                "or each with its own cores), or analyse the whole job, which counts its workers as the job's")
    return ("another job competes for the CPU: measure on an otherwise idle machine, or give the training "
            "job its own cores (taskset, container CPU limits)")


def _wait_only_fix(facts: Facts) -> str:
    """The host's wait's own fix (the copy's is `_copy_fix`)."""
    if facts.python_iterator:
        return ("the loop waits for batches from a Python iterator (a generator or numpy batches, not tf.data): build "
                "them in tf.data (`tf.data.Dataset.from_tensor_slices(...)`, `.map(fn, num_parallel_calls="
                "tf.data.AUTOTUNE)`, `.prefetch(tf.data.AUTOTUNE)`), or precompute them once")
    if not _uses_tf_data(facts):
        return _wait_fix(facts)
    clauses = [INPUT_FIX[key] for key in _pipeline_changes(facts) if key in INPUT_FIX] or ["speed up its slowest stage"]
    what = ", ".join(clauses[:-1]) + " and " + clauses[-1] if len(clauses) > 1 else clauses[0]
    if facts.prefetches:
        return f"the loop waits for batches although the pipeline prefetches: the pipeline itself is too slow; {what}"
    return f"the loop waits for batches from the input pipeline: {what}"


def _compute_words(facts: Facts) -> str:
    kind = facts_for(facts.device).kind
    return "the device's kernels" if kind in ("gpu", "tpu") else "TensorFlow's ops" if kind == "cpu" else \
        "the step's ops"


EAGER_MIN_STEP_PCT = 5.0  # eager ops' share of step time that makes running them eagerly worth changing
ALL_EAGER_PCT = savings.ALL_EAGER_PCT


def _eager_headline(facts: Facts) -> str:
    eager = facts.eager
    assert eager is not None
    heaviest = ", ".join(f"`{op}` {ms:.2f} ms" for op, ms in eager.ops)
    # TensorFlow's overview page's shares, to one decimal as it shows them; absent where it recorded no op.
    sides = (("host", eager.host_op_time_eager_pct), ("device", eager.device_op_time_eager_pct))
    shares = " and ".join(f"{pct:.1f} % of {side}" for side, pct in sides if pct == pct)
    missing = [side for side, pct in sides if pct != pct]
    host = eager.host_op_time_eager_pct
    if not shares:
        tensorflow = " TensorFlow's definition (its overview page's) has no op recorded here to weigh."
    else:
        tensorflow = (f" On TensorFlow's definition (its overview page's), {shares} op time ran eagerly"
                      + (f" (no {missing[0]} op recorded)" if missing else "")
                      + ("" if host == host and abs(host - eager.op_time_pct) < 1.0 else
                         ": it weighs only the op events TensorFlow records, by their own time over the whole "
                         "trace (tf.data's stages too, a tf.function's GPU ops on the device, no host event per eager "
                         "op in newer TensorFlow), not each call's dispatch") + ".")
    return (f"{eager.op_time_pct:.0f} % of the host's op time runs eagerly, one op at a time from Python: "
            f"{eager.ms_per_step:.2f} ms per step ({eager.step_pct:.0f} % of the step); heaviest per step: {heaviest}."
            + tensorflow)


def _eager_fix(facts: Facts) -> str:
    eager = facts.eager
    every_op = eager is not None and eager.op_time_pct >= ALL_EAGER_PCT
    if facts.producer == "keras":
        if every_op:
            return ("compile the model without `run_eagerly=True` (`model.compile(..., run_eagerly=False)`, the "
                    "default) so `fit` runs each step as one tf.function")
        return ("move this work into the model's compiled step (metrics and conditions in `train_step`, not in "
                "callbacks), and run several steps per call (`model.compile(..., steps_per_execution=8)`) so what "
                "stays eager between calls is paid once per call")
    if facts.producer == "jax":
        return "move these operations inside the jitted step (`jax.jit`), so they run as one compiled program"
    if every_op:
        # Keras 3's fit with run_eagerly=True leaves no Keras name in the trace: a trace of unknown origin says it too.
        keras = "; Keras: `model.compile(..., run_eagerly=False)`" if facts.producer == "unknown" else ""
        return ("wrap the training step in `tf.function` (and leave `tf.config.run_functions_eagerly` off"
                f"{keras}) so its ops run as one graph instead of one Python call each")
    return ("move these ops into the compiled step: compute them inside the `tf.function` (return what the loop "
            "needs) instead of on its results in Python, or do them every N steps")


def _si_rate(value: float) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= factor:
            return f"{value / factor:.3g} {prefix}FLOP/s"
    return f"{value:.3g} FLOP/s"


# oneDNN's brgemm-based implementations (brg_conv_fwd:avx2, brg_conv_bwd_w:avx512_core, brg:avx512_core_amx,
# brgemm_matmul:...): its fastest convolution and matmul kernels.
BRGEMM_RE = re.compile(r"^brg")
KERNEL_NAME_SHOWN = 60  # generated kernel names run to hundreds of characters; the op table has them whole


def _roofline_headline(facts: Facts) -> str:
    ops = facts.below_roofline
    first = ops[0]
    roof = "compute" if first.bound == "compute" else "memory-bandwidth"
    kernel = first.kernel if len(first.kernel) <= KERNEL_NAME_SHOWN else f"{first.kernel[:KERNEL_NAME_SHOWN - 1]}…"
    kernel = f", {kernel}" if kernel else ""
    lead = (f"{first.name} ({first.type}, {first.dtype}{kernel}) runs at {first.ceiling_pct:.0f} % of its {roof} "
            f"ceiling ({_si_rate(first.flops_per_second)}) and holds {first.share_pct:.0f} % of op time "
            f"({first.ms_per_step:.2f} ms per step)")
    more = "; ".join(f"{op.name} {op.ceiling_pct:.0f} % of its ceiling, {op.share_pct:.0f} % of op time" for op in ops[1:])
    return f"{lead}{'; also ' + more if more else ''}."


def _roofline_fix(facts: Facts) -> str:
    """The change that fits why the op is far under its ceiling."""
    op: BelowRoofline = facts.below_roofline[0]
    program = program_facts.program(facts.producer)
    if op.kind == "vector" or op.bound == "memory":
        xla = "--jit-compile" if facts.producer == "devprof" else (program.xla or "XLA")
        return (f"fuse the memory-bound elementwise work with XLA ({xla}): one pass over memory instead of one "
                "per op")
    if facts.device == "cpu":
        if op.kernel == "Eigen":
            return "set TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow is imported: oneDNN's kernels are faster"
        ratio = savings.precision_ratio(facts)
        measured_faster = (savings.precision_dtypes(facts)[0] == "float32" and op.dtype in ("", "float32")
                           and ratio == ratio and ratio > 1.0)
        wide = bool(facts.bfloat16_units) or bool(facts.matrix_units)  # AVX-512 BF16 or AMX: brgemm kernels exist
        faster = (f"bfloat16 ({_precision_change(facts, 'bfloat16')}: {savings.ceilings_text(facts)})"
                  if measured_faster else "a faster device" if wide else
                  "a CPU with AVX-512 or AMX, where oneDNN has faster (brgemm) kernels for it")
        op_type = re.sub(r"^_(Mkl)?(Native)?", "", op.type)
        implementation = op.kernel.removeprefix("oneDNN").strip()  # "oneDNN jit:avx2": named by its log
        if not implementation:
            log = ("`devprof run --onednn-kernels`" if facts.producer == "devprof"
                   else "`ONEDNN_VERBOSE=1` in the environment")
            return (f"which oneDNN kernel ran this {op_type} was not recorded ({log} logs it; brgemm kernels are the "
                    f"fast kind): try a larger batch, or {faster}")
        if BRGEMM_RE.search(implementation):
            return (f"oneDNN ran this {op_type} with {implementation}, a brgemm kernel, its fastest kind on this CPU: "
                    f"try a larger batch, or {faster}")
        if wide:
            return (f"oneDNN ran this {op_type} with {implementation}, not one of the brgemm kernels (brg_conv_*, "
                    "brg:*) this CPU has: its shapes may not fit them; try channels in multiples of 16 and a larger "
                    f"batch, or {faster}")
        return (f"oneDNN ran this {op_type} with {implementation}, not one of its brgemm kernels (brg_conv_*, "
                f"brg:*), which are the fast ones: this CPU has none for it (an AVX2 CPU falls back to jit:avx2 for "
                f"backward weights; AVX-512 and AMX CPUs have brgemm ones); try a larger batch, or {faster}")
    if op.dtype == "float32" and facts.matrix_units:
        return (f"{op.dtype} does not use the device's {'/'.join(facts.matrix_units)} matrix units: train with "
                f"{MIXED_FOR_DTYPE.get(facts.matrix_units[-1], 'mixed precision')}")
    return ("give each kernel more work: a larger batch, and matrix dimensions (channels, features) that are "
            "multiples of 64 so the matrix units' tiles are full; for convolutions, channels-last layout so no "
            "transposes run around them")


def _slower_dtype(facts: Facts) -> bool:
    now, _ = savings.precision_dtypes(facts)
    if now == "float32":
        return False
    ratio = savings.precision_ratio(facts)
    return ratio > 1.0 if ratio == ratio else _bfloat16_emulated(facts.precision or "", facts.bfloat16_units)


def _matrix_units_fix(facts: Facts) -> str:
    policy = MIXED_FOR_DTYPE[(facts.matrix_units or ("",))[-1]]
    how = f"--precision {policy}" if facts.producer == "devprof" else program_facts.precision(facts.producer, policy)
    dtype = policy.removeprefix("mixed_")
    ratio = facts.matrix_ceiling(dtype) / facts.matrix_ceiling("float32")
    if ratio == ratio:
        return f"train with {how} ({dtype} {ratio:.1f}x float32's measured matrix ceiling)"
    return (f"measure {dtype}'s ceiling against float32's (`devprof peak`); where it is higher, train with {how} "
            "(from the device's datasheet alone this is a guess)")


def _idle_headline(facts: Facts) -> str:
    stretch = facts.idle_stretch
    if stretch is None:
        return ""
    return (f"The process sat idle for {stretch.seconds:.1f} s {stretch.place}: its CPU stayed under "
            f"{IDLE_CPU_PCT:g} % ({stretch.cpu_column}), outside every training step, where no step or epoch "
            "figure shows the wait.")


RULES: list[Rule] = [
    Rule("input_bound_high", "input", lambda f: _bound_rule_applies(f, "input", "high"),
         _input_headline, _input_fix, _input_more, bound="input", level="high", severity="critical",
         description=f"input (the host's wait for its batch, and batch copies no kernel hides) is the largest part "
                     f"of the step and >= {HIGH_BOUND_PCT:g} % of it"),
    Rule("input_bound", "input", lambda f: _bound_rule_applies(f, "input", "moderate"),
         _input_headline, _input_fix, _input_more, bound="input", level="moderate",
         description=f"input is the largest part of the step, under {HIGH_BOUND_PCT:g} % of it"),
    Rule("collective_bound", "collective", lambda f: _bound_rule_applies(f, "collective"),
         lambda f: (f"Collective-bound: {f.collective_pct:.0f} % of the step, its largest part, waits in all-reduce "
                    "for the other workers or devices."),
         lambda f: ("find the worker or device the others wait for (in the workers or devices table, the one whose "
                    "step minus its collective wait stands out) and fix its cause; otherwise a larger per-worker "
                    "batch spreads each all-reduce over more images"),
         bound="collective", description="the collective wait is the largest part of the step"),
    Rule("host_bound", "host", lambda f: _bound_rule_applies(f, "host"),
         lambda f: (f"Host-bound: host overhead is {part_shares(f)['host']:.0f} % of the step, its largest part: time "
                    f"goes to Python and dispatch between {'jitted' if f.producer == 'jax' else 'TensorFlow'} calls, "
                    "not to waiting for input; look at the training loop."),
         _host_fix, _host_more, bound="host",
         description="host overhead (Python, dispatch, launches, the device idle waiting for the host) is the "
                     "largest part of the step"),
    Rule("eager_bound", "host", lambda f: _bound_rule_applies(f, "eager"),
         lambda f: (f"Eager-bound: every op runs eagerly, one Python call each, and that is "
                    f"{part_shares(f)['eager']:.0f} % of the step, its largest part."),
         _eager_fix, _host_more, bound="eager",
         description="the whole step runs eagerly (no compiled step) and that is the largest part of it"),
    Rule("idle_bound", "idle", lambda f: _bound_rule_applies(f, "idle"),
         lambda f: (f"Idle-bound: the device sits idle {part_shares(f)['idle']:.0f} % of the step, its largest part, "
                    "and the trace records no host activity to tell what it waits for."),
         lambda f: ("trace the host as well (host_tracer_level 2 or more), so the device's idle time can be told "
                    "apart: waiting for input, for the host's Python and launches, or for another device"),
         bound="idle", description="device idle whose cause the trace cannot tell (no host activity recorded) is "
                                   "the largest part of the step"),
    Rule("compute_bound", "compute", lambda f: _bound_rule_applies(f, "compute"),
         lambda f: f"Compute-bound: {_compute_words(f)} take {part_shares(f)['compute']:.0f} % of the step, its "
                   "largest part.",
         _compute_fix, _compute_advice, bound="compute",
         severity="info", description="the step's math (device kernels; on a CPU, TensorFlow's ops) is the largest "
                                      "part of the step"),
    # The two halves of input as fixes of their own: their cures differ (FIXES, `verdict.fixes`).
    Rule("input_copy", "input", lambda f: savings.input_copy(f).pct > 0,
         lambda f: f"Each step waits for its batch's copy to the device ({_copy_split(f)}).",
         _copy_fix, _copy_advice,
         description="a batch's host-to-device copy that no kernel overlaps: hidden by prefetching to the device"),
    Rule("input_wait", "input", lambda f: _wait_pct(f) > 0,
         lambda f: f"The loop waits {_wait_pct(f):.1f} % of the step for its next batch from the input pipeline.",
         _wait_only_fix, _wait_advice,
         description="the host's wait for the iterator: hidden by prefetching, up to the rate the pipeline makes a "
                     "batch"),
    Rule("epoch_level_work", "epoch_level", lambda f: False,
         lambda f: "Time outside the training steps dominates the gap.",
         lambda f: "time outside the training steps (validation, iterator set-up): validate less often or on "
                   "fewer images",
         severity="info", description="compare only: validation and iterator set-up between steps"),
    Rule("cpu_contention", "host",
         lambda f: f.other_cpu_pct >= CONTENTION_PCT,
         lambda f: (f"Other processes took {f.other_cpu_pct:.0f} % of the machine's CPU "
                    f"(about {f.other_cpu_pct * f.cpu_cores / 100:.1f} of {f.cpu_cores:.0f} cores) while training "
                    f"used {f.proc_cpu_pct / 100:.1f} cores: the timings include waiting for CPU."
                    + (f" This machine runs {f.job_workers_here} other worker{'s' if f.job_workers_here > 1 else ''} "
                       f"of the same job, which {'are' if f.job_workers_here > 1 else 'is'} among them."
                       if f.job_workers_here else "")),
         _contention_fix,
         severity="warning", finding=True,
         description=f"other processes use >= {CONTENTION_PCT:g} % of the machine's CPU during the run"),
    Rule("retracing", "host", lambda f: f.retrace_steps > 0,
         lambda f: (f"Graphs were built or compiled again in {f.retrace_steps} step{'s' if f.retrace_steps > 1 else ''} "
                    f"after the first ({f.retrace_ms:.1f} ms): "
                    + ("jax.jit compiles the step again." if f.producer == "jax" else "the tf.function retraces.")),
         lambda f: ("keep the step's input shapes and static arguments fixed: pad batches to one shape and pass "
                    "configuration through `static_argnums` only when it really changes" if f.producer == "jax" else
                    "keep the step's input shapes and Python arguments fixed: pass tensors, not Python numbers, and "
                    "give the tf.function an input_signature (or reduce_retracing=True)"),
         finding=True, description="graph building or compilation inside the profiled window after the first step"),
    Rule("host_sync", "host", lambda f: f.sync_name is not None,
         lambda f: f"Every step synchronises the host with the device ({f.sync_name} in each step).",
         lambda f: (("take jax.device_get, .block_until_ready() and printing of arrays out of the step"
                     if f.producer == "jax" else "take .numpy(), tf.print and Python-side metrics out of the step")
                    + ", or do them every N steps, so the host can queue the next step while the device works"),
         finding=True, description="a host-device synchronisation (device-to-host copy, tf.print) in every step"),
    Rule("launch_bound", "host",
         lambda f: (f.mean_kernel_us < LAUNCH_BOUND_KERNEL_US and f.idle_host_pct >= LAUNCH_BOUND_IDLE_PCT),
         lambda f: (f"{f.kernels_per_step:.0f} kernels per step averaging {f.mean_kernel_us:.1f} µs, and the device is "
                    f"idle waiting for the host {f.idle_host_pct:.0f} % of the step: launching costs more than running."),
         lambda f: ("give each launch more work: a larger --batch-size, XLA (--jit-compile) to fuse small ops, "
                    "and several steps per call (--steps-per-execution)" if f.producer == "devprof" else
                    f"give each launch more work: {program_facts.program(f.producer).batch_size}, "
                    + (f"XLA ({program_facts.program(f.producer).xla}) to fuse small ops, "
                       if program_facts.program(f.producer).xla else "")
                    + f"and {program_facts.steps_per_call(f.producer, 8)}"),
         finding=True, description=f"kernels under {LAUNCH_BOUND_KERNEL_US:g} µs on average and the device idle for the "
                                   f"host >= {LAUNCH_BOUND_IDLE_PCT:g} % of the step"),
    Rule("fp32_on_matrix_units", "compute",
         lambda f: f.precision in (None, "float32") and bool(f.matrix_units) and not _measured_slower(f),
         lambda f: (f"The run computes in float32 on a device with {' and '.join(f.matrix_units or ())} matrix units, "
                    "which float32 does not use."),
         lambda f: _matrix_units_fix(f),
         severity="info", finding=True, description="float32 training on a device with bfloat16/float16 matrix units"),
    Rule("bf16_without_matrix_units", "compute", _slower_dtype,
         lambda f: (f"The run computes in {savings.precision_dtypes(f)[0]}, which is slower than float32 here: "
                    f"{_slower_dtype_reason(f)}."),
         lambda f: f"train in float32 ({_precision_change(f, 'float32')})",
         severity="warning", finding=True,
         description="a reduced precision whose measured matrix ceiling is below float32's, or bfloat16 on a CPU "
                     "that emulates it"),
    Rule("float64_math", "compute", lambda f: f.precision == "float64",
         lambda f: ("The matrix ops compute in float64: no oneDNN, cuDNN or tensor-core kernel takes it, and a float64 "
                    "vector holds half the numbers a float32 one does."),
         lambda f: f"compute in float32: {program_facts.float32(f.producer)}",
         severity="warning", finding=True,
         description="the dtype most of the costed ops' FLOPs run in is float64 (a model made float64 by mistake)"),
    Rule("cpu_without_onednn", "compute",
         lambda f: f.device == "cpu" and f.eigen_dense_pct >= EIGEN_DENSE_MIN_PCT and f.precision != "float64",
         lambda f: (f"{f.eigen_dense_pct:.0f} % of the step's op time is in TensorFlow's Eigen convolution and "
                    "matmul kernels: its oneDNN kernels were off (TensorFlow turns them on itself only on CPUs "
                    "with AVX-512 VNNI, bfloat16 or AMX units)."),
         lambda f: ("set TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow is imported (devprof run does unless it is set; "
                    "on a 2-core AVX2 CPU the seed CNN trained 1.4 to 2.4 times faster)"),
         severity="warning", finding=True,
         description=f"on a CPU, >= {EIGEN_DENSE_MIN_PCT:g} % of op time in Eigen conv/matmul kernels and no oneDNN kernel"),
    Rule("eager_execution", "host",
         lambda f: f.eager is not None and f.eager.step_pct >= EAGER_MIN_STEP_PCT, _eager_headline, _eager_fix,
         finding=True, description=f"ops executed eagerly (one at a time from Python) take >= {EAGER_MIN_STEP_PCT:g} % "
                                   "of step time"),
    Rule("no_prefetch", "input", lambda f: f.prefetches is False and _wait_material(f),
         lambda f: ("The input pipeline does not end with a prefetch: the step waits while each batch is prepared "
                    "(a stage after a prefetch is not prefetched)."),
         lambda f: "end the tf.data pipeline with .prefetch(tf.data.AUTOTUNE)",
         finding=True, description=f"a traced tf.data pipeline without a Prefetch stage, and the host waits for "
                                   f"it >= {MODERATE_INPUT_PCT:g} % of step time"),
    Rule("idle_stretch", "epoch_level", lambda f: f.idle_stretch is not None, _idle_headline,
         lambda f: ("find what the program waits for there (a thread or iterator winding down, a file, another "
                    "process): `py-spy dump --pid PID` during the stretch shows it"),
         finding=True, description=f"the process's CPU under {IDLE_CPU_PCT:g} % for more than {MIN_IDLE_S:g} s outside "
                                   "every step (host sampler)"),
    Rule("below_roofline", "compute", lambda f: bool(f.below_roofline), _roofline_headline, _roofline_fix,
         severity="info", finding=True,
         description=f"ops holding >= {BELOW_ROOFLINE_MIN_SHARE:g} % of op time at under {BELOW_ROOFLINE_PCT:g} % of "
                     "their roofline ceiling (their dtype's matrix or vector ceiling, or bandwidth x intensity)"),
    Rule("memory_near_limit", "compute",
         lambda f: f.device_mem_total_bytes > 0 and f.device_mem_peak_bytes >= MEMORY_NEAR_LIMIT * f.device_mem_total_bytes,
         lambda f: (f"Device memory peaked at {f.device_mem_peak_bytes / 2**30:.2f} of {f.device_mem_total_bytes / 2**30:.2f}"
                    f" GiB ({100 * f.device_mem_peak_bytes / f.device_mem_total_bytes:.0f} %): one larger batch or "
                    "model from an out-of-memory error."),
         lambda f: "leave headroom: a smaller --batch-size or mixed precision",
         severity="critical", finding=True,
         description=f"device memory peak within {100 * (1 - MEMORY_NEAR_LIMIT):.0f} % of the device's limit"),
    # The allocators' own events (trace) and the samplers' memory; none saves step time (saving_ms null).
    Rule("memory_oom", "compute", lambda f: memory_rules.oom(f) is not None,
         memory_rules.oom_headline, memory_rules.oom_fix, severity="critical", finding=True,
         description="the run ended with an out-of-memory error (run.json `oom`): the allocation that failed and "
                     "what held the memory then (trace, else samplers)"),
    Rule("memory_near_capacity", "compute", lambda f: memory_rules.near_capacity(f) is not None,
         memory_rules.near_capacity_headline, memory_rules.near_capacity_fix, severity="critical", finding=True,
         description=f"an allocator's peak bytes in use >= {100 * memory_rules.NEAR_CAPACITY_SHARE:.0f} % of the "
                     "capacity it states (or the device's memory)"),
    Rule("memory_fragmentation", "compute", lambda f: memory_rules.fragmented(f) is not None,
         memory_rules.fragmentation_headline, memory_rules.fragmentation_fix, finding=True,
         description=f"an allocator >= {100 * memory_rules.FRAGMENTED:.0f} % fragmented at a peak holding >= "
                     f"{100 * memory_rules.FRAGMENTATION_FULL_SHARE:.0f} % of its capacity"),
    Rule("memory_growth", "host", lambda f: memory_rules.growing(f) is not None,
         memory_rules.growth_headline, memory_rules.growth_fix, finding=True,
         description="bytes held at step end growing step after step (trace), or the sampled memory at epoch end "
                     "growing epoch after epoch"),
    Rule("memory_one_holder", "compute", lambda f: memory_rules.one_holder(f) is not None,
         memory_rules.one_holder_headline, memory_rules.one_holder_fix, severity="info", finding=True,
         description=f"one op's tensors hold >= {100 * memory_rules.ONE_HOLDER_SHARE:.0f} % of an allocator's peak"),
    Rule("host_memory_pressure", "host", lambda f: memory_rules.host_pressure(f) is not None,
         memory_rules.host_pressure_headline, memory_rules.host_pressure_fix, finding=True,
         description=f"the machine's available memory under {100 * memory_rules.LOW_AVAILABLE_SHARE:.0f} % of it "
                     "(host sampler)"),
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
        return savings.Saving(math.nan, "saves no step time" if rule.id != "idle_stretch" else
                              "time outside the steps, not per step: the stretch itself is what it would save")
    return estimate(facts)


def _rank(item: dict) -> float:
    pct = item.get("saving_pct")
    return -pct if pct is not None else math.inf


def findings(facts: Facts) -> list[dict]:
    """`[{rule, severity, evidence, advice, saving_ms, saving_pct, saving_basis}]` for every finding
    rule that applies, the largest saving first (unknown savings last)."""
    found = [{"rule": rule.id, "severity": rule.severity, "evidence": rule.headline(facts), "advice": rule.fix(facts),
              **savings.as_fields(finding_saving(rule, facts), facts)}
             for rule in RULES if rule.finding and rule.applies(facts)]
    return sorted(found, key=_rank)


def part_savings(facts: Facts) -> dict[str, savings.Saving]:
    """What fixing each part of the step would save."""
    return {"input": savings.input_part(facts), "host": savings.host_part(facts, _steps_per_call(facts)[1]),
            "collective": savings.collective_part(facts), "compute": savings.compute_part(facts)}




def part_shares(facts: Facts) -> dict[str, float]:
    """Each part's share of the step, the parts `verdict.bound` is chosen from: device idle whose cause
    the trace cannot tell is `idle` (not host overhead), and a step that runs wholly eagerly is `eager`
    (its host overhead, and on a CPU its ops, are the eager runtime's)."""
    shares = {"compute": facts.compute_pct, "input": facts.input_pct, "host": facts.host_pct,
              "collective": facts.collective_pct}
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
    "host_bound": lambda f: ("compiling the step" if savings.all_eager(f) else "running several steps per call"),
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
    fixes = [Fix("input_copy", "input", savings.input_copy(facts)),
             Fix("input_wait", "input", savings.input_wait(facts)),
             Fix("host_bound", "host", part_savings(facts)["host"]),
             Fix("collective_bound", "collective", savings.collective_part(facts))]
    found = [rule for rule in RULES if rule.finding and rule.component != "epoch_level" and rule.applies(facts)]
    fixes += [Fix(rule.id, _finding_part(rule, facts), finding_saving(rule, facts)) for rule in found]
    if not any(rule.id in COMPUTE_FINDINGS for rule in found):
        fixes.append(Fix("compute_bound", "compute", savings.compute_part(facts)))
    known = [fix for fix in fixes if fix.saving.known and fix.saving.pct > 0]
    # A finding that saves just what its part's own fix saves is that fix said again (no prefetch and the
    # wait's fix; an all-eager step and compiling it): the part's, whose advice holds the finding's change.
    parts = {(fix.part, round(fix.saving.pct, 9)) for fix in known if not RULES_BY_ID[fix.rule].finding}
    distinct = [fix for fix in known if not (RULES_BY_ID[fix.rule].finding
                                             and (fix.part, round(fix.saving.pct, 9)) in parts)]
    return ranked_fixes(distinct, facts.step_ms)


# Savings this close are one within the noise of two identical runs: max(10 % of the larger, 1 ms).
TIE_SHARE, TIE_MS = 0.10, 1.0
# Fixes whose savings tie go in this order: the cheaper, surer change first (a pipeline or loop setting
# whose saving is measured time, then a change to the program, then a change of precision or kernels
# whose saving is modelled from ceilings); fixes not listed follow, larger saving first.
TIE_ORDER = ("no_prefetch", "input_copy", "input_wait", "retracing", "host_sync", "host_bound", "launch_bound",
             "eager_execution", "cpu_contention", "memory_one_holder", "collective_bound", "cpu_without_onednn",
             "float64_math", "below_roofline", "fp32_on_matrix_units", "bf16_without_matrix_units", "compute_bound")


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
        return part_savings(facts)["host"] if part == "eager" else savings.Saving(
            math.nan, "unknown: the trace does not tell what the device waits for")
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
    return [line for line in unique if not any(line != other and line.lower().rstrip(".") in other.lower()
                                               for other in unique)]


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
        split = (f": {mean['input_wait_ms']:.2f} ms waiting for the iterator, {mean['input_copy_ms']:.2f} ms copying "
                 "to the device")
    over = (f"Over {steps_used} {unit}{'s' if steps_used != 1 else ''} of {mean['step_ms']:.2f} ms" if steps_used
            else f"No steady {unit} traced; the traced {unit}s, which trace or compile, take {mean['step_ms']:.2f} ms")
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
        reason = (f"no steady {unit}: every traced {unit} traces or compiles the training function; trace the "
                  f"{unit}s after the first call (profile steps from its end)")
        return {"bound": None, "level": None, "rule": None, "reason": reason, "evidence": f"{evidence}.",
                "advice": []}
    if steps_used < min_steps:
        reason = (f"only {steps_used} steady {unit}{'s' if steps_used != 1 else ''} (at least {min_steps} "
                  f"needed; {unit}s that trace or compile are left out): trace more steps, e.g. a longer run "
                  "or --profile-steps")
        return {"bound": None, "level": None, "rule": None, "reason": reason, "evidence": f"{evidence}.",
                "advice": []}
    bound = bound_of(facts)
    if bound is None:
        return {"bound": None, "level": None, "rule": None, "evidence": f"{evidence}.", "advice": [],
                "reason": "no part of the step was measured"}
    part, share = bound
    rule = RULES_BY_ID[_bound_rule_id(part, share)]
    if facts.device_recorded is False and part != "input":
        return {"bound": None, "level": None, "rule": None, "evidence": f"{evidence}.", "advice": [],
                "reason": ("the device's activity was not recorded (its trace planes are empty), so compute and "
                           "host overhead cannot be told apart; only input could be judged, and it is not the "
                           "largest part")}
    candidates = candidate_fixes(facts)
    fixes = verdict_fixes(candidates)
    first = fixes[0] if fixes else None
    headline = rule.headline(facts)
    largest = max(fixes, key=lambda fix: fix.saving.pct) if fixes else None
    if first is not None and largest is not None and largest is not first:
        headline += (f" The fix to make first is {FIX_NAMES.get(first.rule, _rule_name)(facts)}: "
                     f"{_saving_words(first.saving, facts)}, within noise of the largest "
                     f"({FIX_NAMES.get(largest.rule, _rule_name)(facts)}, {_saving_words(largest.saving, facts)}) "
                     "and the surer change.")
    elif first is not None and first.part != part:
        headline += (f" The largest fix we can estimate is {FIX_NAMES.get(first.rule, _rule_name)(facts)}: "
                     f"{_saving_words(first.saving, facts)}.")
    elif first is None:
        best = max(candidates, key=lambda fix: fix.saving.pct) if candidates else None
        best_words = (f" (the largest, {FIX_NAMES.get(best.rule, _rule_name)(facts)}, about {best.saving.pct:.1f} %)"
                      if best is not None else "")
        headline += f" No fix we can estimate would save {savings.MIN_VERDICT_SAVING_PCT:g} % of the step{best_words}."
    if first is not None and RULES_BY_ID[first.rule].finding:
        headline += f" {RULES_BY_ID[first.rule].headline(facts)}"
    verdict: dict = {"bound": part, "bound_pct": round(share, 4), "level": _bound_level(share), "rule": rule.id,
                     "cause": first.rule if first is not None else rule.id,
                     "evidence": f"{headline} {evidence}.", "advice": _verdict_advice(facts, rule, fixes),
                     **savings.as_fields(first.saving if first is not None else _own_saving(part, facts), facts),
                     "fixes": [_fix_fields(fix, facts) for fix in fixes],
                     "first_fix": _fix_fields(first, facts) if first is not None else None,
                     "xprof_reading": xprof_reading(facts, part)}
    if steps_used == 1:
        verdict["single_step"] = True
        verdict["evidence"] += (f" Based on a single {unit}: there is no {unit}-to-{unit} spread to tell a typical "
                                f"{unit} from an unusual one; trace a few more to confirm.")
    return verdict

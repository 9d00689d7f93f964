"""The rules' sentences about the training loop: what input waits for (the batch's copy to the
device, or the pipeline, down to its slowest tf.data stage) and what the host spends between steps
(Python and dispatch, eager ops, other processes), each fix in the words of the program that wrote the
trace. Only the rows (`bound_rules`, `finding_rules`) say which sentence goes with which rule.
"""

from __future__ import annotations

import math
import re

from analysis.breakdown.idle import IDLE_CPU_PCT
from analysis.breakdown.input_stages import STAGE_FAMILIES, SlowestStage, has_stage
from analysis.rules import programs as program_facts
from analysis.rules import savings
from analysis.rules.facts import Facts

MODERATE_INPUT_PCT = 5.0  # a wait this share of the step is worth the tf.data advice
NICE_STEPS_PER_EXECUTION = (2, 4, 8, 16, 32, 50, 100, 200, 500, 1000)

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


def suggest_steps_per_execution(
    host_pct: float, compute_pct: float, steps_per_call: int, steps_per_epoch: float = math.nan, target_pct: float = 5.0
) -> int:
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
    return (
        f"the copy is {facts.input_copy_pct:.1f} % of the step, the host's wait for the iterator "
        f"{_wait_pct(facts):.1f} %"
    )


def _copy_fix(facts: Facts) -> str:
    if facts.producer == "jax":
        ahead = "put the next batches on the device ahead of the step (`jax.device_put`, a prefetch-to-device iterator)"
    else:
        ahead = "prefetch batches to the device (`tf.data.experimental.prefetch_to_device`)"
    return (
        f"the step waits for its batch's host-to-device copy, not for the input pipeline ({_copy_split(facts)}): "
        f"{ahead} so the copy runs under the previous step, and copy fewer bytes (uint8 images, cast on the "
        "device)"
    )


def _copy_advice(facts: Facts) -> list[str]:
    if facts.producer == "jax":
        ahead = (
            "Put the next batches on the device while the current step runs: `jax.device_put` them ahead of the "
            "step (a prefetch-to-device iterator of two or more batches)."
        )
    else:
        ahead = (
            "Prefetch batches to the device so the next batch's copy runs under the current step: end the "
            'pipeline with `.apply(tf.data.experimental.prefetch_to_device("/gpu:0"))`, or, with tf.distribute, '
            "`strategy.experimental_distribute_dataset(ds, tf.distribute.InputOptions("
            "experimental_fetch_to_device=True, experimental_per_replica_buffer_size=2))`."
        )
    return [
        ahead,
        "Copy fewer bytes: keep images uint8 on the host and cast and normalise them on the device inside the "
        "step (a quarter of float32's bytes).",
        "Copy from pinned (page-locked) host memory: a copy from pageable memory is staged through a bounce "
        "buffer first, and is slower.",
    ]


def _input_fix(facts: Facts) -> str:
    return _copy_fix(facts) if _copy_dominates(facts) else _wait_only_fix(facts)


def stage_advice(stage: SlowestStage) -> str:
    """One change for the slowest tf.data stage, by what kind of stage it is: it names no other stage."""
    kind = stage.kind
    if stage.runs_python:
        return (
            "it runs Python (`tf.py_function`/`tf.numpy_function`), which holds the GIL and runs one call at a "
            "time: rewrite it with TensorFlow ops, or move it out of the pipeline (precompute, then `.cache()`)"
        )
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
        return (
            "reading files is the cost: `.cache()` right after this stage, or read several files at once with "
            "`.interleave(..., num_parallel_calls=tf.data.AUTOTUNE)`"
        )
    if kind == "Generator" and re.search(r"FlatMap\[\d+\]::Generator$", stage.name):
        return (
            "it makes elements in Python (`from_generator`), one at a time under the GIL: build the dataset from "
            "arrays (`from_tensor_slices`) or files, or `.cache()` right after it"
        )
    if kind in ("TensorSlice", "Range", "FromTensor", "Tensor"):
        return "it hands out in-memory elements one at a time: `.batch()` right after it so what follows runs per batch"
    if kind in ("Shuffle", "ShuffleAndRepeat"):
        return "a smaller shuffle buffer"
    if kind in ("Batch", "BatchV2", "PaddedBatch"):
        return "batch before expensive per-element work so it runs once per batch"
    if kind in STAGE_FAMILIES["pass_through"] or kind == "Generator":
        return (
            f"a {kind} stage only hands on what its input makes, and the trace shows no input working meanwhile "
            "(its calls began before the trace, or it is another pipeline): speed up the stages that feed it"
        )
    return f"`.cache()` after this {kind} stage if its output does not change between epochs"


def _uses_tf_data(facts: Facts) -> bool:
    """Whether tf.data advice fits: a TensorFlow program, or a trace with tf.data stages in it."""
    return (
        facts.prefetches is not None
        or facts.input_stage_kinds is not None
        or bool(program_facts.program(facts.producer).input_pipeline)
    )


def _pipeline_changes(facts: Facts) -> list[str]:
    """The keys of the tf.data changes that fit the pipeline: only stages it has, or lacks, are named."""
    kinds = facts.input_stage_kinds
    changes = [] if facts.prefetches else ["prefetch"]
    if kinds is None:
        return changes + ["parallel_work", "cache", "batch_first"]
    changes.append(
        "parallel_map" if has_stage(kinds, "serial_map") else "vectorize" if has_stage(kinds, "map") else "add_map"
    )
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
        return [
            f"{fix[0].upper()}{fix[1:]}.",
            "Python work per batch holds the GIL and runs on one core: vectorize it over the whole data set "
            "once, or express it in TensorFlow ops inside `.map`, where tf.data runs it in parallel.",
        ]
    if not _uses_tf_data(facts):
        fix = _wait_fix(facts)
        return [
            f"{fix[0].upper()}{fix[1:]}.",
            "Make the host side of each batch cheaper: decode and augment once and cache the result, or do the "
            "augmentation on the device inside the step.",
        ]
    stage = (
        [f"The slowest tf.data stage is `{facts.slowest_input_stage}`: {stage_advice(facts.slowest_input_stage)}."]
        if facts.slowest_input_stage and pipeline_is_the_cause(facts)
        else []
    )
    slowest = facts.slowest_input_stage
    said = (
        ("parallel_map", "vectorize") if stage and slowest is not None and slowest.kind in STAGE_FAMILIES["map"] else ()
    )
    return stage + [INPUT_ADVICE[key] for key in _pipeline_changes(facts) if key not in said]


def _wait_fix(facts: Facts) -> str:
    return (
        "the loop waits for batches: prepare the next batch while the step runs (a background thread or "
        "prefetching to the device) and move preprocessing out of the training loop"
    )


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
        return (
            "Run several steps per call so Python and dispatch cost is paid once per call: "
            f"{program_facts.steps_per_call(facts.producer, suggestion)}."
        )
    if k <= 1:
        return (
            f"Run several steps per call so Python and dispatch cost is paid once per call: "
            f"`--steps-per-execution {suggestion}`."
        )
    return (
        f"Already {k} steps per call: raise `--steps-per-execution` to {suggestion}, or look for per-call Python work."
    )


def _host_advice(facts: Facts) -> list[str]:
    if facts.producer == "devprof":
        return HOST_ADVICE  # devprof's own loop has no per-step Python work of the user's to take out
    program = program_facts.program(facts.producer)
    syncs = "`jax.device_get`, `.block_until_ready()`" if program.name == "jax" else "`.numpy()`/`float()`"
    where = "callbacks" if program.name == "keras" else "the loop"
    return [
        f"Take per-step Python work out of {where}: no {syncs} on metrics, logging or printing every step; "
        "do it every N steps.",
        f"Use {program.batch_size} so fixed per-step host overhead is spread over more examples.",
    ]


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
        return (
            f"the job's own workers share this machine's cores: run fewer {workers} per machine (one per machine, "
            "or each with its own cores), or analyse the whole job, which counts its workers as the job's"
        )
    return (
        "another job competes for the CPU: measure on an otherwise idle machine, or give the training "
        "job its own cores (taskset, container CPU limits)"
    )


def _wait_only_fix(facts: Facts) -> str:
    """The host's wait's own fix (the copy's is `_copy_fix`)."""
    if facts.python_iterator:
        return (
            "the loop waits for batches from a Python iterator (a generator or numpy batches, not tf.data): build "
            "them in tf.data (`tf.data.Dataset.from_tensor_slices(...)`, `.map(fn, num_parallel_calls="
            "tf.data.AUTOTUNE)`, `.prefetch(tf.data.AUTOTUNE)`), or precompute them once"
        )
    if not _uses_tf_data(facts):
        return _wait_fix(facts)
    clauses = [INPUT_FIX[key] for key in _pipeline_changes(facts) if key in INPUT_FIX] or ["speed up its slowest stage"]
    what = ", ".join(clauses[:-1]) + " and " + clauses[-1] if len(clauses) > 1 else clauses[0]
    if facts.prefetches:
        return f"the loop waits for batches although the pipeline prefetches: the pipeline itself is too slow; {what}"
    return f"the loop waits for batches from the input pipeline: {what}"


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
        tensorflow = (
            f" On TensorFlow's definition (its overview page's), {shares} op time ran eagerly"
            + (f" (no {missing[0]} op recorded)" if missing else "")
            + (
                ""
                if host == host and abs(host - eager.op_time_pct) < 1.0
                else ": it weighs only the op events TensorFlow records, by their own time over the whole "
                "trace (tf.data's stages too, a tf.function's GPU ops on the device, no host event per eager "
                "op in newer TensorFlow), not each call's dispatch"
            )
            + "."
        )
    return (
        f"{eager.op_time_pct:.0f} % of the host's op time runs eagerly, one op at a time from Python: "
        f"{eager.ms_per_step:.2f} ms per step ({eager.step_pct:.0f} % of the step); heaviest per step: {heaviest}."
        + tensorflow
    )


def _eager_fix(facts: Facts) -> str:
    eager = facts.eager
    every_op = eager is not None and eager.op_time_pct >= ALL_EAGER_PCT
    if facts.producer == "keras":
        if every_op:
            return (
                "compile the model without `run_eagerly=True` (`model.compile(..., run_eagerly=False)`, the "
                "default) so `fit` runs each step as one tf.function"
            )
        return (
            "move this work into the model's compiled step (metrics and conditions in `train_step`, not in "
            "callbacks), and run several steps per call (`model.compile(..., steps_per_execution=8)`) so what "
            "stays eager between calls is paid once per call"
        )
    if facts.producer == "jax":
        return "move these operations inside the jitted step (`jax.jit`), so they run as one compiled program"
    if every_op:
        # Keras 3's fit with run_eagerly=True leaves no Keras name in the trace: a trace of unknown origin says it too.
        keras = "; Keras: `model.compile(..., run_eagerly=False)`" if facts.producer == "unknown" else ""
        return (
            "wrap the training step in `tf.function` (and leave `tf.config.run_functions_eagerly` off"
            f"{keras}) so its ops run as one graph instead of one Python call each"
        )
    return (
        "move these ops into the compiled step: compute them inside the `tf.function` (return what the loop "
        "needs) instead of on its results in Python, or do them every N steps"
    )


def _idle_headline(facts: Facts) -> str:
    stretch = facts.idle_stretch
    if stretch is None:
        return ""
    return (
        f"The process sat idle for {stretch.seconds:.1f} s {stretch.place}: its CPU stayed under "
        f"{IDLE_CPU_PCT:g} % ({stretch.cpu_column}), outside every training step, where no step or epoch "
        "figure shows the wait."
    )

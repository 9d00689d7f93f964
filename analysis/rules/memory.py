"""The memory findings' conditions, evidence and fixes (their entries are in `rules/finding_rules.py`).

Each reads `Facts.memory` (`breakdown/memory.py`): the allocators' peaks from the trace and the
sampled memory of the run. An allocator or sampler that recorded nothing keeps its rule silent.
They are about fitting in memory, not speed: only a fixed tensor made in every step (`memory_one_holder`)
saves step time, its op's, once made once.
"""

from __future__ import annotations

import math

from analysis.breakdown import memory_holders as holders
from analysis.breakdown.memory import OomAtFailure, SampledMemory
from analysis.breakdown.memory_allocators import AllocatorPeak
from analysis.rules.facts import Facts
from analysis.rules.savings import Saving

NEAR_CAPACITY_SHARE = 0.90  # a peak within 10 % of the capacity: one larger batch from an out-of-memory error
FRAGMENTED = 0.30  # the allocator's fragmentation at the peak (1 - largest free chunk / free bytes)
FRAGMENTATION_FULL_SHARE = 0.50  # ... where the peak holds at least half the capacity: the pieces matter
ONE_HOLDER_SHARE = 0.50  # one op's tensors hold at least half of the peak
ONE_HOLDER_MIN_BYTES = 2**20  # of a peak of at least this much (a pinned pool of a few KiB is no story)
ONE_HOLDER_MIN_CAPACITY_SHARE = 0.01  # and at least this share of the capacity, where stated
LOW_AVAILABLE_SHARE = 0.10  # the machine's available memory under 10 % of it


def _gib(value: float) -> str:
    if value >= 2**30:
        return f"{value / 2**30:.2f} GiB"
    return f"{value / 2**20:.1f} MiB" if value >= 2**20 else f"{value / 2**10:.1f} KiB"


def _allocators(facts: Facts) -> tuple[AllocatorPeak, ...]:
    return facts.memory.allocators if facts.memory is not None else ()


def _sampled(facts: Facts) -> tuple[SampledMemory, ...]:
    return facts.memory.sampled if facts.memory is not None else ()


def _at(peak: AllocatorPeak) -> str:
    step = f"step {peak.peak_step}" if peak.peak_step is not None else "between steps"
    return f"{step}, {peak.peak_time_ms:.1f} ms into the window" + (f", in {peak.peak_op}" if peak.peak_op else "")


# -- memory_near_capacity


def _lifetime_share(peak: AllocatorPeak) -> float:
    return peak.lifetime_peak_bytes / peak.capacity_bytes if peak.capacity_bytes > 0 else math.nan


def near_capacity(facts: Facts) -> AllocatorPeak | None:
    """The first allocator whose peak in the window, or its own lifetime peak before it, came within
    10 % of its capacity."""
    return next(
        (
            p
            for p in _allocators(facts)
            if p.capacity_share >= NEAR_CAPACITY_SHARE or _lifetime_share(p) >= NEAR_CAPACITY_SHARE
        ),
        None,
    )


def lifetime_words(peak: AllocatorPeak) -> str:
    """The allocator's own peak since it started, where it is above the window's ('' where not)."""
    if not peak.lifetime_above_window:
        return ""
    share = f" ({100 * _lifetime_share(peak):.1f} % of its capacity)" if peak.capacity_bytes > 0 else ""
    return (
        f"before the traced window it had held {_gib(peak.lifetime_peak_bytes)}{share}, its own lifetime peak "
        "(`peak_bytes_in_use`), more than at any time in the window"
    )


def near_capacity_headline(facts: Facts) -> str:
    peak = near_capacity(facts)
    assert peak is not None
    lifetime = lifetime_words(peak)
    return (
        f"{peak.name} peaked at {_gib(peak.peak_bytes)} of its {_gib(peak.capacity_bytes)} "
        f"({100 * peak.capacity_share:.0f} %) at {_at(peak)}"
        + (f"; {lifetime}" if lifetime else "")
        + ": a slightly larger batch or model runs out of memory."
    )


def _batch_words(facts: Facts, batch: str) -> str:
    return {
        "devprof": f"`--batch-size {batch}`",
        "keras": f"`batch_size={batch}` in `fit` (or `.batch({batch})` on its dataset)",
        "tensorflow": f"`.batch({batch})` in the tf.data pipeline",
        "jax": f"a batch of {batch}",
    }.get(facts.producer, f"a batch of {batch}")


def _recompute(facts: Facts) -> str:
    if facts.producer == "jax":
        return "recompute activations in the backward pass (`jax.checkpoint` on the large blocks)"
    return "recompute activations in the backward pass (`tf.recompute_grad` on the large blocks)"


def _precision(facts: Facts) -> str:
    if facts.producer == "devprof":
        return "`--precision mixed_float16` (`mixed_bfloat16` on TPUs and CPUs with bfloat16 units)"
    if facts.producer == "jax":
        return "bfloat16 activations"
    return '`keras.mixed_precision.set_global_policy("mixed_float16")`'


SAFE_SHARE = 0.80  # the batch advised keeps the peak at this share of the capacity


def near_capacity_fix(facts: Facts) -> str:
    peak = near_capacity(facts)
    assert peak is not None
    batch = facts.memory.batch_size if facts.memory is not None else math.nan
    smaller = "a smaller batch"
    if peak.batch_bytes > 0 and batch == batch:
        safe = math.floor(batch * (SAFE_SHARE * peak.capacity_bytes - peak.fixed_bytes) / peak.batch_bytes)
        if 1 <= safe < batch:
            smaller = (
                f"a batch of {safe} ({_batch_words(facts, str(safe))}) keeps the peak near {100 * SAFE_SHARE:.0f} %"
            )
    return (
        f"leave headroom: {smaller}, mixed precision to halve the activations ({_precision(facts)}), or "
        f"{_recompute(facts)}"
    )


# -- memory_fragmentation


def fragmented(facts: Facts) -> AllocatorPeak | None:
    return next(
        (
            p
            for p in _allocators(facts)
            if p.fragmentation >= FRAGMENTED and p.capacity_share >= FRAGMENTATION_FULL_SHARE
        ),
        None,
    )


def fragmentation_headline(facts: Facts) -> str:
    peak = fragmented(facts)
    assert peak is not None
    free = peak.capacity_bytes - peak.peak_bytes
    return (
        f"{peak.name} was {100 * peak.fragmentation:.0f} % fragmented at its peak ({_gib(peak.peak_bytes)} of "
        f"{_gib(peak.capacity_bytes)}): of its {_gib(free)} free, only about {_gib(free * (1 - peak.fragmentation))}"
        " is one piece, so a large tensor can fail to allocate although the total is free."
    )


def fragmentation_fix(facts: Facts) -> str:
    peak = fragmented(facts)
    gpu = peak is not None and peak.name.startswith("GPU_")
    shapes = (
        "keep tensor shapes the same from step to step (`drop_remainder=True` in `.batch`, padded "
        "sequence lengths), so freed blocks fit the next step's tensors"
    )
    if gpu:
        return (
            f"{shapes}; on a GPU, set `TF_GPU_ALLOCATOR=cuda_malloc_async` before TensorFlow starts (CUDA's "
            "stream-ordered allocator returns freed memory to one pool)"
        )
    return shapes


# -- memory_growth


def growing(facts: Facts) -> tuple[str, float, str] | None:
    """(what grows, bytes per unit, the unit) for the first allocator or sampler that grows."""
    for peak in _allocators(facts):
        if peak.growth_bytes_per_step == peak.growth_bytes_per_step:
            return (
                f"{peak.name}'s bytes held at the end of each of {peak.growth_steps} steps (the first left out)",
                peak.growth_bytes_per_step,
                "step",
            )
    for sampled in _sampled(facts):
        if sampled.growth_bytes_per_epoch == sampled.growth_bytes_per_epoch:
            return (
                f"The {sampled.what} ({sampled.sampler}) at the end of each epoch",
                sampled.growth_bytes_per_epoch,
                "epoch",
            )
    return None


def growth_headline(facts: Facts) -> str:
    found = growing(facts)
    assert found is not None
    what, per, unit = found
    return (
        f"{what[0].upper()}{what[1:]} grow{'s' if unit == 'epoch' else ''} {unit} after {unit}, by {_gib(per)} a "
        f"{unit}: something keeps tensors or objects from every {unit} (a leak candidate)."
    )


def growth_fix(facts: Facts) -> str:
    if facts.producer == "jax":
        return (
            "keep no arrays from one step to the next: append `float(loss)` (or `jax.device_get` every N steps), "
            "not the device arrays, to Python lists"
        )
    keras = " and no callback that stores every batch's outputs" if facts.producer == "keras" else ""
    return (
        "keep no tensors from one step to the next: append `float(loss)` or update a `keras.metrics.Mean`, "
        f"not the loss or output tensors, to Python lists{keras}; create tensors and variables once, "
        "outside the step"
    )


# -- memory_one_holder


def one_holder(facts: Facts) -> tuple[AllocatorPeak, holders.Holder] | None:
    """(the allocator, its holder) where one op's live tensors hold most of a peak, or are a fixed tensor
    made in every step whose op takes 5 % of the step or more, and enough of the allocator's capacity to
    matter."""
    for peak in _allocators(facts):
        holder = peak.holder
        if holder is None or peak.peak_bytes < ONE_HOLDER_MIN_BYTES:
            continue
        if peak.capacity_bytes > 0 and holder.bytes < ONE_HOLDER_MIN_CAPACITY_SHARE * peak.capacity_bytes:
            continue
        # most of the peak; or a fixed tensor made in every step whose making costs time worth saving
        if (
            holder.bytes >= ONE_HOLDER_SHARE * peak.peak_bytes
            or _made_every_step_pct(holder, facts) >= MADE_EVERY_STEP_MIN_PCT
        ):
            return peak, holder
    return None


MADE_EVERY_STEP_MIN_PCT = 5.0  # of the step: a fixed tensor's making worth a finding whatever its share of the peak


def _made_every_step_pct(holder: holders.Holder, facts: Facts) -> float:
    """The share of the step a fixed tensor made in every step costs to make (0: not one, or not timed)."""
    if holder.kind != holders.FIXED or not holder.made_every_step or not facts.step_ms > 0:
        return 0.0
    return 100.0 * min(facts.holder_op_ms, facts.step_ms) / facts.step_ms if facts.holder_op_ms > 0 else 0.0


HOLDER_WORDS = {
    holders.WORKSPACE: "as scratch workspace (temporary flat bytes: the algorithm's working memory)",
    holders.BATCH_SIZED: "in tensors that grow with the batch",
    holders.FIXED: "in tensors of a fixed size, the same whatever the batch",
    holders.OP_TYPE: "summed over every op of that type: the trace ran it eagerly, where an op's name is "
    "its type, so several layers' tensors share one name",
    holders.UNSCALED: "in its tensors",
}


def one_holder_saving(facts: Facts) -> Saving:
    """A tensor of fixed size made in every step, made once: the producing op's time per step."""
    found = one_holder(facts)
    if found is None:
        return Saving(math.nan, "no holder")
    _, holder = found
    if holder.kind != holders.FIXED or not holder.made_every_step:
        return Saving(math.nan, "saves no step time: it is about fitting in memory")
    pct = _made_every_step_pct(holder, facts)
    if not pct > 0:
        return Saving(math.nan, f"unknown: the trace times no op named {holder.op}")
    return Saving(
        pct,
        (
            f"{holder.op}'s {facts.holder_op_ms:.2f} ms a step, paid once instead (it made the tensor in "
            f"all {holder.steps} traced steps); what reads the tensor still runs"
        ),
    )


def one_holder_headline(facts: Facts) -> str:
    found = one_holder(facts)
    assert found is not None
    peak, holder = found
    tensors = ", ".join(holder.tensors)
    return (
        f"{holder.op} holds {_gib(holder.bytes)} of {peak.name}'s {_gib(peak.peak_bytes)} peak "
        f"({100 * holder.bytes / peak.peak_bytes:.0f} %) {HOLDER_WORDS[holder.kind]}"
        + (f": {tensors}" if tensors else "")
        + "."
    )


def _workspace_fix(facts: Facts, peak: AllocatorPeak, op: str) -> str:
    if peak.name.startswith("GPU_") and facts.producer != "jax":
        return (
            f"{op}'s workspace is the scratch memory of the convolution algorithm cuDNN's autotuner chose, the "
            "fastest that fit; where memory is short, cap it before TensorFlow starts "
            "(`TF_CUDNN_WORKSPACE_LIMIT_IN_MB=<MiB>`, 4096 by default) or turn autotuning off "
            "(`TF_CUDNN_USE_AUTOTUNE=0`), and measure the step: a slower algorithm may be chosen"
        )
    if facts.producer == "jax" or peak.name.startswith(("TPU_", "GPU_")):
        return (
            f"{op}'s workspace is scratch memory that XLA's autotuner or the op's library chose; where memory is "
            "short, lower XLA's GPU autotuning (`XLA_FLAGS=--xla_gpu_autotune_level=0`) and measure the step"
        )
    return (
        f"{op}'s workspace is freed when the op ends: it matters only at the peak, and shrinks with the batch "
        f"({_batch_words(facts, 'N')})"
    )


def one_holder_fix(facts: Facts) -> str:
    found = one_holder(facts)
    assert found is not None
    peak, holder = found
    op = holder.op
    if holder.kind == holders.BATCH_SIZED:
        return (
            f"{op}'s tensors grow with the batch: a smaller batch ({_batch_words(facts, 'N')}) or "
            f"{_recompute(facts)} shrinks them; mixed precision halves them ({_precision(facts)})"
        )
    if holder.kind == holders.WORKSPACE:
        return _workspace_fix(facts, peak, op)
    if holder.kind == holders.OP_TYPE:
        return (
            f"to see which layer's {op} holds it, run the step as a graph (`tf.function`; in Keras, no "
            "`run_eagerly=True`), where each op is named by its layer"
        )
    if holder.kind == holders.UNSCALED:
        return (
            f"look at {op}: where its first dimension is the batch, a smaller batch or mixed precision shrinks it; "
            "where it is a tensor of fixed size made in every step, make it once outside the step (devprof could "
            "not tell: no batch size is known; `devprof run --batch-size`, or `session.step(images=N)`)"
        )
    return (
        f"look at {op}: a tensor of fixed size made in every step (a `tf.fill`, `tf.zeros` or a lookup table) can "
        "be made once outside the step, smaller, or in a lower precision"
    )


# -- host_memory_pressure


def host_pressure(facts: Facts) -> SampledMemory | None:
    return next(
        (
            s
            for s in _sampled(facts)
            if s.sampler == "host" and s.total_bytes > 0 and s.min_available_bytes < LOW_AVAILABLE_SHARE * s.total_bytes
        ),
        None,
    )


def host_pressure_headline(facts: Facts) -> str:
    host = host_pressure(facts)
    assert host is not None
    return (
        f"The machine's available memory fell to {_gib(host.min_available_bytes)} of {_gib(host.total_bytes)} "
        f"({100 * host.min_available_bytes / host.total_bytes:.0f} %) while the training process's RSS peaked at "
        f"{_gib(host.peak_bytes)}: the system swaps or kills processes."
    )


def host_pressure_fix(facts: Facts) -> str:
    if facts.producer == "jax":
        return "hold less on the host: load the data set in pieces instead of whole, and fewer batches prefetched"
    return (
        "hold less on the host: `.cache(filename)` on disk instead of `.cache()` in memory, a smaller `.shuffle()` "
        "buffer, fewer prefetched batches and parallel calls in the tf.data pipeline; or a machine with more memory"
    )


# -- memory_oom


def oom(facts: Facts) -> OomAtFailure | None:
    return facts.memory.oom if facts.memory is not None else None


def _live_words(top) -> str:
    parts = []
    for live in top[:3]:
        if not live.in_window:
            parts.append(f"{_gib(live.bytes)} {live.unnamed}")
        else:
            tensor = " ".join(v for v in (live.shape, live.dtype) if v)
            parts.append(f"{_gib(live.bytes)} {live.op or '(no op named)'}" + (f" {tensor}" if tensor else ""))
    return "; ".join(parts)


def oom_headline(facts: Facts) -> str:
    failure = oom(facts)
    assert failure is not None
    size = f"{_gib(failure.bytes)} ({failure.bytes:,} bytes)" if failure.bytes is not None else "memory"
    tensor = " ".join(
        v
        for v in ((f"[{','.join(map(str, failure.shape))}]" if failure.shape is not None else None), failure.dtype)
        if v
    )
    what = f"The run ran out of memory allocating {size}" + (f" for a {tensor} tensor" if tensor else "")
    what += (f" in {failure.op}" if failure.op else "") + (f" on {failure.allocator}" if failure.allocator else "")
    if failure.source == "trace":
        of = f" of its {_gib(failure.capacity_bytes)}" if failure.capacity_bytes > 0 else ""
        held = (
            f"{failure.held_allocator} held {_gib(failure.held_bytes)}{of} then (the trace's last event, "
            f"{failure.before_failure_ms:.1f} ms before the failure)"
        )
        top = _live_words(failure.top)
        return f"{what}. {held}" + (f": {top}." if top else ".")
    if failure.source == "samplers":
        values = "; ".join(
            f"{what_} ({sampler}) {_gib(last)}" + (f" of {_gib(total)}" if total > 0 else "")
            for sampler, what_, last, total in failure.sampled
        )
        return f"{what}. No allocator events were traced at the failure; the samplers' last values before it: {values}."
    return f"{what}. Neither a trace nor a sampler recorded the memory when it happened."


def oom_fix(facts: Facts) -> str:
    failure = oom(facts)
    assert failure is not None
    gpu = (failure.allocator or "").startswith("GPU_") or "GPU" in (failure.device or "")
    allocator = (
        (
            "; on a GPU, `TF_GPU_ALLOCATOR=cuda_malloc_async` before TensorFlow starts where fragmentation "
            "leaves no piece large enough"
        )
        if gpu
        else ""
    )
    return (
        f"make the step fit: a smaller batch ({_batch_words(facts, 'N')}), mixed precision to halve the "
        f"activations ({_precision(facts)}), or {_recompute(facts)}{allocator}"
    )

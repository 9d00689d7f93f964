"""What each fix would save: an estimate per part of the step and per finding, with its basis.

Shares are of the step as the facts give it (a step, or a call of several steps); `Saving.pct`
is NaN where the trace cannot tell (the rules then say so, and rank it last). Each estimate
models what the fix changes and nothing else:

- prefetching overlaps the pipeline's work with the rest of the step, so the step becomes the
  longer of the two; on a CPU the pipeline's work also takes cores from compute, and no fix that
  moves work between threads goes below the process's measured CPU work spread over the cores;
- several steps per call pay per-call Python and dispatch once per call, down to the launch
  floor of the step's kernels (on a CPU, with the call's own set-up and tear-down, which the
  breakdown counts as compute);
- compiling an all-eager step leaves, on a CPU, only the ops' own time less the eager runtime's
  floor per call, run side by side (the Python between ops and the dispatch around each go);
- mixed precision changes the matrix ops' time by the ratio of the *measured* ceilings;
- an op below its roofline is taken to half its ceiling (what tuned kernels reach), not all of it.

`bench/bench_savings.py` applies each fix to a real program and measures what it saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.rules.devices import facts_for
from analysis.rules.facts import Facts

SERIAL_MAP_KINDS = ("Map", "MapAndBatch")  # maps that run one element at a time until given num_parallel_calls
ATTAINABLE_CEILING_PCT = 50.0  # what an op below its roofline is taken to reach once fixed
ONEDNN_SPEEDUP = 1.4  # the seed CNN's dense ops with oneDNN, measured on a 2-core AVX2 CPU (BENCHMARKS.md)
MIN_VERDICT_SAVING_PCT = 5.0  # a fix that saves less than this names no bound: the step's math holds it


@dataclass(frozen=True)
class Saving:
    pct: float  # of step time (NaN: unknown)
    basis: str

    @property
    def known(self) -> bool:
        return self.pct == self.pct

    def ms(self, facts: Facts) -> float:
        return self.pct * facts.step_ms / 100.0 if self.known and facts.step_ms == facts.step_ms else math.nan


UNKNOWN = Saving(math.nan, "unknown")


def _known(value: float) -> bool:
    return value == value


def _ms(facts: Facts, pct: float) -> str:
    if _known(facts.step_ms):
        return f"{pct * facts.step_ms / 100.0:.2f} ms"
    return f"{pct:.1f} % of the step"


def _clip(pct: float, most: float) -> float:
    return max(0.0, min(pct, most)) if _known(pct) else pct


def _wait_pct(facts: Facts) -> float:
    return facts.input_wait_pct if _known(facts.input_wait_pct) else facts.input_pct


def _copy_pct(facts: Facts) -> float:
    return facts.input_copy_pct if _known(facts.input_copy_pct) else 0.0


def _cores(facts: Facts) -> float:
    return facts.cpu_cores if _known(facts.cpu_cores) and facts.cpu_cores >= 1 else math.nan


def input_copy(facts: Facts) -> Saving:
    """Prefetching to the device runs the batch's copy under the previous step's kernels."""
    copy = _copy_pct(facts)
    if copy <= 0:
        return Saving(0.0, "no exposed host-to-device copy")
    return Saving(
        copy, f"prefetching to the device runs the batch's {_ms(facts, copy)} copy under the previous step's kernels"
    )


def prefetch_only(facts: Facts) -> Saving:
    """What a prefetch alone hides (the `no_prefetch` finding's fix), the pipeline's stages as they are."""
    return input_wait(facts, fix_stage=False)


def input_wait(facts: Facts, fix_stage: bool = True) -> Saving:
    """What the pipeline fix hides of the host's wait, limited by how fast the pipeline can produce a
    batch and, on a CPU, by the cores it shares with compute."""
    wait = _wait_pct(facts)
    if not _known(wait) or wait <= 0:
        return Saving(0.0 if _known(wait) else math.nan, "the loop does not wait for its batches")
    if facts.python_iterator:  # its Python, under the GIL, goes once the batches are precomputed or made by tf.data
        return Saving(
            wait,
            f"the {_ms(facts, wait)} the loop waits for its Python iterator, gone once the batches "
            "are precomputed (or made by tf.data's parallel ops instead of Python)",
        )
    rest = 100.0 - facts.input_pct  # compute, host overhead and collectives: what prefetching hides it under
    cores = _cores(facts)
    on_cpu = facts_for(facts.device).kind == "cpu"
    stage = facts.slowest_input_stage
    stage_pct = (
        100.0 * stage.ms_per_step * max(1, facts.steps_per_call) / facts.step_ms
        if stage is not None and _known(stage.ms_per_step) and _known(facts.step_ms) and facts.step_ms > 0
        else math.nan
    )
    if facts.prefetches:
        # It prefetches and still keeps the step waiting: it makes a batch in the step's time. Only a faster
        # slowest stage helps: parallel over the cores, or gone where it runs Python under the GIL.
        if stage is not None and _known(stage.ms_per_batch) and _known(facts.step_ms) and facts.step_ms > 0:
            stage_pct = max(stage_pct if _known(stage_pct) else 0.0, 100.0 * stage.ms_per_batch / facts.step_ms)
        if not _known(stage_pct):
            return Saving(
                wait,
                f"at most the {_ms(facts, wait)} wait: the pipeline already prefetches, so only a "
                "faster pipeline helps, and its stages' times were not traced",
            )
        assert stage is not None  # a known stage_pct has a stage
        stage_pct = min(stage_pct, 100.0)
        produce = 100.0  # a batch per step now
        kept = 0.0 if stage.runs_python or not _known(cores) else stage_pct / cores
        after = produce - stage_pct + kept
        # Spreading the stage over the cores moves work, it does not remove it (Python taken out does).
        floor = _cpu_floor_pct(facts) if on_cpu and not stage.runs_python else 0.0
        saving = _clip(100.0 - max(rest, after, floor), wait)
        how = (
            "rewriting it without Python"
            if stage.runs_python
            else f"running it on the {cores:.0f} cores"
            if _known(cores)
            else "parallelising it"
        )
        return Saving(
            saving,
            f"the pipeline already prefetches and makes one batch per step; its slowest stage "
            f"takes {_ms(facts, stage_pct)} per batch, and {how} leaves the pipeline "
            f"{_ms(facts, after)} per batch against {_ms(facts, rest)} for the rest of the step"
            f"{_cpu_floor_text(facts, floor, max(rest, after))}",
        )
    # No prefetch: the pipeline makes each batch while the loop waits, `wait` per batch. The advice also
    # fixes the stage that holds the wait: Python taken out of the pipeline, a serial map run on the cores.
    produce, how = wait, ""
    if fix_stage and _known(stage_pct) and stage is not None:
        held = min(stage_pct, wait)
        if stage.runs_python:
            produce, how = wait - held, f"; without the {_ms(facts, held)} of Python its slowest stage runs"
        elif stage.kind in SERIAL_MAP_KINDS and _known(cores) and cores > 1:
            produce = wait - held + held / cores
            how = f"; with its serial {stage.kind} ({_ms(facts, held)}) on the {cores:.0f} cores"
    shared = _pipeline_cpu_pct(facts, produce) / cores if on_cpu and _known(cores) else 0.0
    removes_python = produce < wait and stage is not None and stage.runs_python
    floor = _cpu_floor_pct(facts) if on_cpu and not removes_python else 0.0
    saving = _clip(100.0 - max(rest + shared, produce, floor), wait)
    cpu = (
        f"; on the CPU its work takes {_ms(facts, shared)} of the {cores:.0f} cores' time from compute"
        if shared > 0
        else "; its work takes no CPU time from compute (the process's CPU shows none)"
        if on_cpu and _known(cores)
        else ""
    )
    made = f"the pipeline makes a batch in {_ms(facts, wait)}{how}, {_ms(facts, produce)}; " if how else ""
    return Saving(
        saving,
        f"{made}prefetching overlaps the pipeline's {_ms(facts, produce)} per batch with the rest "
        f"of the step ({_ms(facts, rest)}){cpu}{_cpu_floor_text(facts, floor, max(rest + shared, produce))}",
    )


def _cpu_floor_pct(facts: Facts) -> float:
    """On a CPU, the shortest step the process's measured CPU work allows on all the cores: a fix that moves
    work between threads cannot go below it (0 where unknown). Not the cores other processes leave: a process
    with more threads ready to run gets a larger share of a busy machine (that loss is `cpu_contention`'s)."""
    used, cores = facts.proc_cpu_pct, _cores(facts)
    if not (_known(used) and _known(cores)) or used <= 0:
        return 0.0
    return used / cores


def _cpu_floor_text(facts: Facts, floor: float, otherwise: float) -> str:
    if floor <= otherwise:
        return ""
    return (
        f"; but the process already keeps {facts.proc_cpu_pct / 100.0:.1f} of the {_cores(facts):.0f} cores "
        f"busy, and spreading work over them does not shrink it: the step stays at least {_ms(facts, floor)}"
    )


def _pipeline_cpu_pct(facts: Facts, wait: float) -> float:
    """The pipeline's CPU time per step, in core-% of the step: the process's measured CPU less what
    compute (its ops' own time summed over threads, else its time on every core) and the host's one
    thread use; all of the wait on one core where the process's CPU is unknown. A pipeline that waits
    (sleeps, reads) takes none."""
    cores, used = _cores(facts), facts.proc_cpu_pct
    if not (_known(used) and _known(cores) and _known(facts.compute_pct)):
        return wait
    compute = cores * facts.compute_pct
    if _known(facts.op_ms) and _known(facts.step_ms) and facts.step_ms > 0:
        compute = min(compute, 100.0 * facts.op_ms / facts.step_ms)
    host = facts.host_pct if _known(facts.host_pct) else 0.0
    return max(0.0, min(used - compute - host, wait * cores))


def input_part(facts: Facts) -> Saving:
    """The exposed input's fix: the copy's and the wait's savings together."""
    copy, wait = input_copy(facts), input_wait(facts)
    if not wait.known:
        return copy if copy.pct > 0 else UNKNOWN
    if copy.pct <= 0:
        return wait
    if wait.pct <= 0:
        return copy
    return Saving(copy.pct + wait.pct, f"{copy.basis}; {wait.basis}")


def _launch_floor_pct(facts: Facts) -> float:
    if _known(facts.launch_ms) and _known(facts.step_ms) and facts.step_ms > 0:
        return min(facts.per_call_host_pct(), 100.0 * facts.launch_ms / facts.step_ms)
    return 0.0


ALL_EAGER_PCT = 99.0  # of host op time: no compiled step at all (Keras' run_eagerly=True, a loop without tf.function)


def all_eager(facts: Facts) -> bool:
    return facts.eager is not None and facts.eager.op_time_pct >= ALL_EAGER_PCT


def _compiled_ops_pct(facts: Facts) -> float:
    """On a CPU, what an all-eager step's ops would take compiled (NaN where unknown or not a CPU): their own
    time less the eager runtime's floor per call, then run side by side. A compiled step runs independent ops
    at once on the inter-op threads, which an eager trace cannot show: between no overlap (one core) and all
    the cores busy, taken halfway (an MLP on 2 cores overlapped its ops 1.46x, halfway is 1.33x)."""
    eager = facts.eager
    if eager is None or not _known(eager.step_pct) or facts_for(facts.device).kind != "cpu":
        return math.nan
    ops = eager.step_pct
    if _known(eager.calls_per_step) and _known(eager.call_floor_ms) and _known(facts.step_ms) and facts.step_ms > 0:
        per_step = eager.calls_per_step * eager.call_floor_ms * max(1, facts.steps_per_call)
        ops = max(0.0, ops - 100.0 * per_step / facts.step_ms)
    cores = _cores(facts)
    overlap = (1.0 + 1.0 / cores) / 2.0 if _known(cores) else 1.0
    return ops * overlap


def _outside_compiled_ops_pct(facts: Facts) -> float:
    """On a CPU, the step less its input and its ops' compiled time: compute there is the host's op events,
    which hold the eager runtime's per-op dispatch as well (0 where unknown or not a CPU)."""
    compiled = _compiled_ops_pct(facts)
    if not _known(compiled):
        return 0.0
    waits = [v for v in (facts.input_pct, facts.collective_pct) if _known(v)]
    return max(0.0, 100.0 - sum(waits) - compiled)


def host_part(facts: Facts, suggested_steps_per_call: int) -> Saving:
    """Several steps per call: the host's per-call overhead paid once per `suggested` steps instead
    of once per `now`, down to the launch floor; where every op runs eagerly, compiling the step
    removes the Python between ops instead."""
    host = facts.host_pct
    if not _known(host) or host <= 0:
        return Saving(0.0, "no host overhead")
    floor = _launch_floor_pct(facts)
    floor_text = f", leaving the kernels' launch floor ({_ms(facts, floor)})" if floor > 0 else ""
    if all_eager(facts):
        outside = _outside_compiled_ops_pct(facts)
        if outside > host:
            assert facts.eager is not None  # all_eager
            return Saving(
                outside - floor,
                f"compiling the step removes the Python between its ops and the eager "
                f"runtime's dispatch around each, and runs independent ops side by side: "
                f"its ops' {_ms(facts, facts.eager.step_pct)} would take about "
                f"{_ms(facts, _compiled_ops_pct(facts))}{floor_text}",
            )
        return Saving(
            host - floor,
            f"compiling the step removes the Python dispatch between its ops, "
            f"{_ms(facts, host - floor)} of host overhead{floor_text}",
        )
    host = facts.per_call_host_pct()
    now = max(1, facts.steps_per_call)
    later = max(now, suggested_steps_per_call)
    entry = _call_entry_exit_pct(facts)
    saving = (host - floor + entry) * (1.0 - now / later)
    inside = f" and the call's own {_ms(facts, entry)} of dispatch around its ops" if entry > 0 else ""
    return Saving(
        saving,
        f"{later} steps per call pay the {_ms(facts, host - floor)} of per-call Python and "
        f"dispatch{inside} once per {later} steps instead of once per {now}{floor_text}",
    )


def _call_entry_exit_pct(facts: Facts) -> float:
    """On a CPU, the call's compute before its first op and after its last, in % of the step (0: unknown)."""
    if not (_known(facts.call_entry_exit_ms) and _known(facts.step_ms)) or facts.step_ms <= 0:
        return 0.0
    return 100.0 * facts.call_entry_exit_ms / facts.step_ms


def collective_part(facts: Facts) -> Saving:
    wait = facts.collective_pct
    if not _known(wait) or wait <= 0:
        return Saving(0.0, "no collective wait")
    return Saving(wait, f"the {_ms(facts, wait)} the workers wait in all-reduce goes if the slowest one keeps pace")


def roofline_saving(facts: Facts) -> Saving:
    """The ops far below their roofline taken to half their ceiling."""
    if not facts.below_roofline or not (_known(facts.step_ms) and facts.step_ms > 0):
        return UNKNOWN
    k = max(1, facts.steps_per_call)
    lost = sum(
        op.ms_per_step * k * max(0.0, 1.0 - op.ceiling_pct / ATTAINABLE_CEILING_PCT) for op in facts.below_roofline
    )
    pct = 100.0 * lost / facts.step_ms
    names = ", ".join(op.name for op in facts.below_roofline)
    return Saving(pct, f"{names} brought to {ATTAINABLE_CEILING_PCT:.0f} % of their ceilings, what tuned kernels reach")


def precision_dtypes(facts: Facts) -> tuple[str, str]:
    """(the dtype the run computes in, the other one a precision change would move to)."""
    mixed = facts_for(facts.device).mixed_precision.removeprefix("mixed_")
    now = (facts.precision or "float32").removeprefix("mixed_")
    return (now, "float32") if now != "float32" else ("float32", mixed)


def precision_ratio(facts: Facts) -> float:
    """The measured matrix ceiling of the other dtype over the run's (NaN: either not measured)."""
    now, other = precision_dtypes(facts)
    return facts.matrix_ceiling(other) / facts.matrix_ceiling(now)


def _rate(value: float) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G")):
        if value >= factor:
            return f"{value / factor:.3g} {prefix}FLOP/s"
    return f"{value / 1e6:.3g} MFLOP/s"


def ceilings_text(facts: Facts) -> str:
    """ "bfloat16 185 GFLOP/s against float32 325 GFLOP/s (run.json peak)": the two measured ceilings."""
    now, other = precision_dtypes(facts)
    source = f" ({facts.ceilings_source})" if facts.ceilings_source else ""
    return (
        f"{other} {_rate(facts.matrix_ceiling(other))} against {now} {_rate(facts.matrix_ceiling(now))} "
        f"measured{source}"
    )


def precision_saving(facts: Facts) -> Saving:
    """Moving the matrix ops to the other dtype (negative: slower). The measured ceilings' ratio is what
    the largest shapes reach, an upper bound for a model's own smaller ops; where `devprof peak` timed
    small ones in both dtypes, the lower of the two ratios is the estimate, and the bound is said."""
    ratio = precision_ratio(facts)
    now, other = precision_dtypes(facts)
    if not _known(ratio):
        return Saving(
            math.nan, f"a guess: no measured {other} and {now} ceilings for this device (`devprof peak` measures both)"
        )
    matrix = facts.matrix_pct
    if not _known(matrix) or matrix <= 0:
        return Saving(math.nan, f"{ceilings_text(facts)}; the trace shows no matrix op time to apply them to")
    small, kind = facts.small_ratio(now, other)
    at_ceilings = matrix * (1.0 - 1.0 / ratio)
    if _known(small) and abs(1.0 - 1.0 / small) < abs(1.0 - 1.0 / ratio):
        bound = "a gain" if ratio > 1.0 else "a loss"
        return Saving(
            matrix * (1.0 - 1.0 / small),
            (
                f"the matrix ops ({_ms(facts, matrix)}) in {other} at the ratio `devprof peak` measured on its smallest "
                f"{'convolutions' if kind == 'conv' else 'matmuls'}, {small:.2f}x; at the ceilings' ratio, {ratio:.2f}x, "
                f"{bound} of up to {_ms(facts, abs(at_ceilings))}, which only large shapes reach ({ceilings_text(facts)})"
            ),
        )
    return Saving(
        at_ceilings,
        f"the matrix ops ({_ms(facts, matrix)}) in {other} at the measured ceilings' ratio, "
        f"{ratio:.2f}x, an upper bound that only large shapes reach: {ceilings_text(facts)}",
    )


FLOAT64_SPEEDUP = 2.0  # at least: a float64 vector holds half the numbers a float32 one does


def float64_saving(facts: Facts) -> Saving:
    """The matrix ops moved from float64 to float32: by the measured ceilings where both are, else at
    least half their time (half the numbers per vector, and float64 has no oneDNN, cuDNN or tensor-core
    kernels, so the real gain is larger: a floor, not an estimate)."""
    measured = precision_saving(facts)
    if measured.known:
        return measured
    matrix = facts.matrix_pct
    if not _known(matrix) or matrix <= 0:
        return Saving(math.nan, "the trace shows no matrix op time to apply it to")
    return Saving(
        matrix * (1.0 - 1.0 / FLOAT64_SPEEDUP),
        f"a floor: half the matrix ops' {_ms(facts, matrix)} (a float64 vector holds half the numbers a "
        "float32 one does; float64 has no oneDNN, cuDNN or tensor-core kernels, so the gain is usually more)",
    )


def compute_part(facts: Facts) -> Saving:
    """The larger of the roofline's and the precision change's savings (those that are known)."""
    roofline, precision = roofline_saving(facts), precision_saving(facts)
    options = [s for s in (roofline, precision) if s.known and s.pct > 0]
    if options:
        return max(options, key=lambda s: s.pct)
    why = (
        "no op far below its roofline"
        if facts.below_roofline == () and roofline.known
        else "no op costs held against a ceiling"
    )
    return Saving(math.nan, f"unknown: {why}, and for a change of precision {precision.basis}")


def contention(facts: Facts) -> Saving:
    """The cores other processes took, given back to the step's CPU work."""
    others, used, cores = facts.other_cpu_pct, facts.proc_cpu_pct, _cores(facts)
    if not (_known(others) and _known(used) and _known(cores)) or used <= 0:
        return UNKNOWN
    used_cores = used / 100.0
    alone = min(cores, used_cores + others * cores / 100.0)
    cpu_work = facts.compute_pct + facts.host_pct if facts_for(facts.device).kind == "cpu" else facts.host_pct
    pct = cpu_work * (1.0 - used_cores / alone) if alone > 0 else 0.0
    return Saving(
        max(0.0, pct),
        f"the step's CPU work ({_ms(facts, cpu_work)}) on the {alone:.1f} cores it would "
        f"have alone instead of the {used_cores:.1f} it got",
    )


def retracing(facts: Facts) -> Saving:
    if facts.retrace_steps <= 0 or facts.traced_steps <= 0 or not _known(facts.step_ms) or facts.step_ms <= 0:
        return UNKNOWN
    pct = 100.0 * facts.retrace_ms / facts.traced_steps / facts.step_ms
    return Saving(pct, f"{facts.retrace_ms:.1f} ms of graph building over {facts.traced_steps} traced steps")


def idle_for_host(facts: Facts) -> Saving:
    """The device's idle time waiting for the host, which a host that queues ahead would hide."""
    if not _known(facts.idle_host_pct):
        return UNKNOWN
    pct = min(facts.idle_host_pct, facts.host_pct) if _known(facts.host_pct) else facts.idle_host_pct
    return Saving(
        pct,
        f"the device idles {_ms(facts, facts.idle_host_pct)} per step waiting for the host; at most "
        "that much, if the host queued the next step ahead",
    )


def eager(facts: Facts, suggested_steps_per_call: int) -> Saving:
    if facts.eager is None:
        return UNKNOWN
    if all_eager(facts):
        return host_part(facts, suggested_steps_per_call)
    pct = min(facts.eager.step_pct, facts.host_pct) if _known(facts.host_pct) else facts.eager.step_pct
    return Saving(pct, f"at most the eager ops' {_ms(facts, pct)} of host time per step, once compiled into the step")


def onednn(facts: Facts) -> Saving:
    if not _known(facts.eigen_dense_pct) or not _known(facts.compute_pct):
        return UNKNOWN
    dense = facts.eigen_dense_pct * facts.compute_pct / 100.0
    return Saving(
        dense * (1.0 - 1.0 / ONEDNN_SPEEDUP),
        f"the Eigen convolutions and matmuls ({_ms(facts, dense)}) {ONEDNN_SPEEDUP:g}x faster with oneDNN, "
        "the least devprof measured on a 2-core AVX2 CPU",
    )


def as_fields(saving: Saving, facts: Facts) -> dict:
    """`saving_ms`, `saving_pct`, `saving_basis` of a verdict or finding (null where unknown)."""
    return {"saving_ms": _json(saving.ms(facts)), "saving_pct": _json(saving.pct), "saving_basis": saving.basis}


def _json(value: float) -> float | None:
    return round(float(value), 4) if value == value else None


def sentence(fields: dict, facts: Facts) -> str:
    """ "fixing this would save about 3.10 ms of 8.50 per step (36 %)", or its share where the step's
    length is unknown; empty where the saving is unknown."""
    ms, pct = fields.get("saving_ms"), fields.get("saving_pct")
    if pct is None:
        return ""
    unit = "call" if facts.steps_per_call > 1 else "step"
    if ms is not None and _known(facts.step_ms):
        return f"fixing this would save about {ms:.2f} ms of {facts.step_ms:.2f} per {unit} ({pct:.0f} %)"
    return f"fixing this would save about {pct:.0f} % of the {unit}"

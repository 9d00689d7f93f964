"""The facts the rules read: one typed `Facts` per breakdown, and what a trace shows beyond it.

`make_facts` is the one constructor: `analyze` calls it with a worker's mean step, its run's
settings, its utilization and `trace_facts` of its trace; `compare` with each row's shares of
the epoch. Both name each fact the same, so a rule reads the same field in both.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis import producers
from analysis.breakdown.devices import DeviceTable
from analysis.breakdown.eager import EagerOps
from analysis.breakdown.idle import IdleStretch
from analysis.breakdown.input_stages import SlowestStage, stage_kinds
from analysis.breakdown.memory import MemoryReport
from analysis.breakdown.ops import eigen_dense_pct
from analysis.breakdown.roofline import BelowRoofline, below_roofline
from analysis.read.run_files import RunRecord
from analysis.read.view import TraceView, matches
from analysis.rules.devices import facts_for
from analysis.steps.host import call_entry_exit_ms, steady_steps
from analysis.steps.sources import StepSource

if TYPE_CHECKING:
    from analysis.rules.xprof import XProfReading


@dataclass(frozen=True)
class Facts:
    """What the rules look at. Shares are of step time (`analyze`) or epoch time (`compare`).

    Built only by `make_facts`, from typed arguments named as `analyze`'s JSON and `compare`'s
    rows name them, so a rule sees the same field in both."""

    input_pct: float
    compute_pct: float
    host_pct: float
    # input split by cause (NaN: unknown, e.g. compare's rows): the host's wait for the iterator, and
    # host-to-device copies no kernel hides; they add up to input_pct
    input_wait_pct: float = math.nan
    input_copy_pct: float = math.nan
    input_wait_ms: float = math.nan  # per step
    device: str = ""
    producer: str = "unknown"  # who wrote the trace: devprof, tensorflow, keras, jax (see analysis.producers)
    device_recorded: bool | None = None  # False: the trace has device planes but none recorded activity
    collective_pct: float = 0.0
    idle_pct: float = math.nan  # device idle whose cause the trace cannot tell (no host activity): part of host_pct
    xprof: XProfReading | None = None  # XProf's Overview reading, from its own definitions (None: not reproducible)
    precision: str | None = None
    jit_compile: bool | None = None
    steps_per_call: int = 1
    steps_per_epoch: float = math.nan
    slowest_input_stage: SlowestStage | None = None
    prefetches: bool | None = None  # whether the input pipeline already prefetches (None: unknown)
    input_stage_kinds: tuple[str, ...] | None = (
        None  # the kinds of tf.data stage it has ("ParallelMapV2"; None: unknown)
    )
    mfu_pct: float = math.nan
    peak_dtype: str | None = None
    other_cpu_pct: float = math.nan  # other processes' CPU, % of the whole machine
    proc_cpu_pct: float = math.nan  # the training process tree's CPU, 100 = one core
    cpu_cores: float = math.nan
    retrace_steps: int = 0  # steps after the first that built or compiled graphs
    retrace_ms: float = 0.0
    sync_name: str | None = None  # a host-device synchronisation found in every step
    kernels_per_step: float = math.nan
    mean_kernel_us: float = math.nan
    idle_host_pct: float = math.nan  # the busiest device's step idle for the host (launch, Python, sync)
    matrix_units: tuple[str, ...] | None = None  # reduced-precision dtypes the device has matrix units for
    bfloat16_units: tuple[str, ...] | None = None  # CPU features that run bfloat16 in hardware (): emulated
    device_mem_peak_bytes: float = math.nan
    device_mem_total_bytes: float = math.nan
    eigen_dense_pct: float = math.nan  # CPU: op time in TensorFlow's Eigen conv/matmul kernels (oneDNN's off)
    eager: EagerOps | None = None  # ops executed eagerly in the steady steps (None: none, or no trace)
    idle_stretch: IdleStretch | None = None  # the longest stretch outside steps where the process sat idle
    below_roofline: tuple[BelowRoofline, ...] = ()  # ops holding much of the step far under their ceiling
    memory: MemoryReport | None = None  # the allocators' peaks and the sampled memory (None: not recorded)
    # What the savings need beyond shares (NaN, (): unknown): the mean step (per call), how many steps
    # the window traced, the host's kernel-launch time per call (the floor host overhead cannot go
    # below), the matrix ops' share of the step and the measured matrix ceilings per dtype.
    step_ms: float = math.nan
    traced_steps: int = 0
    launch_ms: float = math.nan
    call_entry_exit_ms: float = math.nan  # on a CPU, compute per call before its first op and after its last
    host_per_call_pct: float = math.nan  # host overhead every call pays, without calls stalled once
    op_ms: float = math.nan  # on a CPU, the ops' own time per call summed over threads: compute's CPU time
    matrix_pct: float = math.nan
    matrix_ceilings: tuple[tuple[str, float], ...] = ()
    holder_op_ms: float = math.nan  # the op holding most of an allocator's peak: its time per step (ops table)
    python_iterator: bool = False  # the input is the loop's wait for a Python iterator (steps.csv), no tf.data
    job_workers_here: int = 0  # the other workers of this worker's job on its machine (run.json `worker`)
    # (kind, dtype, FLOP/s) at the smallest convolution and matmul `devprof peak` timed (empty: unknown)
    small_matrix_rates: tuple[tuple[str, str, float], ...] = ()
    ceilings_source: str | None = None
    mfu_scope: str = "the epoch runs"  # what `mfu_pct` covers: analyze's is over the costed ops only

    def per_call_host_pct(self) -> float:
        """Host overhead every call pays, in % of the mean step, where known (a call stalled once by
        preemption or a GC pause is no cost that fewer calls remove)."""
        typical = self.host_per_call_pct
        return min(self.host_pct, typical) if typical == typical and self.host_pct == self.host_pct else self.host_pct

    def matrix_ceiling(self, dtype: str) -> float:
        """The measured matrix FLOP/s of `dtype` (NaN: not measured)."""
        return next((rate for name, rate in self.matrix_ceilings if name == dtype), math.nan)

    def small_ratio(self, now: str, other: str) -> tuple[float, str]:
        """`other`'s rate over `now`'s on the smallest matrix ops `devprof peak` timed, the lower of the
        kinds measured in both, and that kind (NaN, "": not measured)."""
        rates = {(kind, dtype): rate for kind, dtype, rate in self.small_matrix_rates}
        ratios = [
            (rates[(kind, other)] / rates[(kind, now)], kind)
            for kind in ("conv", "matmul")
            if (kind, now) in rates and (kind, other) in rates
        ]
        return min(ratios) if ratios else (math.nan, "")


@dataclass(frozen=True)
class TraceFacts:
    """What the finding rules need from a trace that the breakdown itself does not carry."""

    retrace_steps: int = 0  # steps after the first that built or compiled graphs
    retrace_ms: float = 0.0
    sync_name: str | None = None  # a host-device synchronisation found in every step
    kernels_per_step: float = math.nan
    mean_kernel_us: float = math.nan
    idle_host_pct: float = math.nan  # the busiest device's step idle for the host
    prefetches: bool | None = None  # whether the traced tf.data pipeline prefetches (None: no stages)
    input_stage_kinds: tuple[str, ...] | None = None  # the kinds of tf.data stage traced (None: no stages)
    call_entry_exit_ms: float = math.nan  # on a CPU, compute per call before its first op and after its last
    host_recorded: bool = True  # whether the trace holds any host activity (threads' events) at all


# Host work that makes the host wait for the device, or for its output, inside a step.
HOST_SYNC_RE = producers.pattern("host_sync")
DEVICE_TO_HOST_RE = producers.pattern("device_to_host")
RETRACE_SHARE = 0.01  # compile time above 1 % of a later step counts as graph building in that step


def retracing(steps: pd.DataFrame) -> tuple[int, float]:
    """(steps after the first that built or compiled graphs, their compile ms)."""
    later = steps.iloc[1:]
    building = later[later["compile_ms"] > RETRACE_SHARE * later["step_ms"]]
    return int(len(building)), float(building["compile_ms"].sum())


def syncs_in_every_step(view: TraceView, steps: pd.DataFrame) -> str | None:
    """The name of a host-device synchronisation found in every step (None if some step has none)."""
    if len(steps) < 2:
        return None
    host = view.host
    device = view.device
    candidates = pd.concat(
        [
            host[matches(host["name"], HOST_SYNC_RE, search=True)],
            device[matches(device["name"], DEVICE_TO_HOST_RE, search=True)],
        ]
    )
    if candidates.empty:
        return None
    starts = steps["start_ns"].to_numpy(dtype=np.int64)
    ends = steps["end_ns"].to_numpy(dtype=np.int64)
    for name, group in candidates.groupby(candidates["name"].astype(str)):
        at = group["start_ns"].to_numpy(dtype=np.int64)
        index = np.searchsorted(starts, at, side="right") - 1
        valid = (index >= 0) & (at < ends[np.clip(index, 0, None)])
        if np.unique(index[valid]).size == len(steps):
            return str(name)
    return None


def kernels(view: TraceView, steps: pd.DataFrame) -> tuple[float, float]:
    """(compute kernels per step, their mean duration in µs) on all devices, NaN without devices."""
    device = view.device
    if device.empty or not len(steps):
        return math.nan, math.nan
    is_copy = matches(device["name"], producers.pattern("device_copy"), search=True) | matches(
        device["name"], producers.pattern("device_input"), search=True
    )
    compute = device[~is_copy]
    inside = compute[(compute["start_ns"] >= steps["start_ns"].min()) & (compute["start_ns"] < steps["end_ns"].max())]
    if inside.empty:
        return 0.0, math.nan
    return len(inside) / len(steps), float(inside["duration_ns"].mean()) / 1000.0


def idle_waiting_for_host_pct(devices: pd.DataFrame) -> float:
    """Share of the busiest device's step spent idle for reasons other than input (launch, Python, sync)."""
    active = devices[(devices["step_count"] > 0) & (devices["step_ms"] > 0)] if len(devices) else devices
    if active.empty:
        return math.nan
    busiest = active.loc[active["compute_ms"].astype(float).idxmax()]
    return 100.0 * float(busiest["idle_host_ms"]) / float(busiest["step_ms"])


def matrix_unit_dtypes(device: dict) -> tuple[str, ...] | None:
    """The reduced-precision dtypes with matrix units on the run's device (None: not known).

    From run.json's `device`: `matrix_units` when recorded; GPUs from their compute
    capability (tensor cores: float16 from 7.0, bfloat16 from 8.0); TPUs always bfloat16.
    """
    recorded = device.get("matrix_units")
    if isinstance(recorded, list):
        return tuple(str(d) for d in recorded)
    kind = facts_for(device.get("kind")).kind
    if kind == "tpu":
        return ("bfloat16",)
    if kind == "gpu":
        capabilities = [g.get("compute_capability") for g in device.get("gpus") or [] if isinstance(g, dict)]
        numbers = [float(str(c)) for c in capabilities if _is_number(c)]
        if numbers:
            lowest = min(numbers)
            return tuple(d for d, needed in (("float16", 7.0), ("bfloat16", 8.0)) if lowest >= needed)
    return None


def _is_number(value) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False


def trace_facts(
    view: TraceView | None, steps: pd.DataFrame, devices: pd.DataFrame, prefetching: bool | None
) -> TraceFacts:
    """The facts of one trace's steps and device rows (all unknown without a trace)."""
    if view is None:
        return TraceFacts()
    retrace_steps, retrace_ms = retracing(steps)
    per_step, mean_us = kernels(view, steps)
    return TraceFacts(
        retrace_steps,
        retrace_ms,
        syncs_in_every_step(view, steps),
        per_step,
        mean_us,
        idle_waiting_for_host_pct(devices),
        prefetching,
        stage_kinds(view),
        call_entry_exit_ms(view, steady_steps(steps)),
        not view.host.empty,
    )


def _float(value, default: float = math.nan) -> float:
    try:
        return float(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def make_facts(
    *,
    input_pct,
    host_pct,
    compute_pct=None,
    collective_pct=None,
    idle_pct=None,
    xprof: XProfReading | None = None,
    device: str | None = "",
    producer: str | None = "devprof",
    device_recorded: bool | None = None,
    precision: str | None = None,
    jit_compile: bool | None = None,
    steps_per_call=1,
    steps_per_epoch=None,
    slowest_input_stage: SlowestStage | None = None,
    trace: TraceFacts = TraceFacts(),
    prefetches: bool | None = None,
    input_stage_kinds=None,
    mfu_pct=None,
    peak_dtype: str | None = None,
    other_cpu_pct=None,
    proc_cpu_pct=None,
    cpu_cores=None,
    matrix_units=None,
    bfloat16_units=None,
    device_mem_peak_bytes=None,
    device_mem_total_bytes=None,
    eigen_dense_pct=None,
    input_wait_pct=None,
    input_copy_pct=None,
    input_wait_ms=None,
    eager: EagerOps | None = None,
    idle_stretch: IdleStretch | None = None,
    below_roofline: tuple[BelowRoofline, ...] = (),
    step_ms=None,
    traced_steps=0,
    launch_ms=None,
    host_per_call_pct=None,
    op_ms=None,
    matrix_pct=None,
    matrix_ceilings=None,
    small_matrix_rates=None,
    holder_op_ms=None,
    python_iterator=False,
    job_workers_here=0,
    ceilings_source: str | None = None,
    mfu_scope: str | None = None,
    memory: MemoryReport | None = None,
) -> Facts:
    """The rules' view of one breakdown. Numbers may be missing (None, NaN: unknown); compute
    defaults to what input and host leave; `trace` holds what a trace shows (its `prefetches`
    wins over `prefetches`)."""
    input_ = _float(input_pct)
    host = _float(host_pct)
    prefetching = trace.prefetches if trace.prefetches is not None else prefetches
    kinds = trace.input_stage_kinds if trace.input_stage_kinds is not None else input_stage_kinds
    return Facts(
        input_,
        _float(compute_pct, 100.0 - input_ - host),
        host,
        input_wait_pct=_float(input_wait_pct),
        input_copy_pct=_float(input_copy_pct),
        input_wait_ms=_float(input_wait_ms),
        device=str(device or ""),
        producer=str(producer or "devprof"),
        device_recorded=device_recorded if isinstance(device_recorded, bool) else None,
        collective_pct=_float(collective_pct, 0.0),
        idle_pct=_float(idle_pct),
        xprof=xprof,
        precision=precision,
        jit_compile=jit_compile,
        steps_per_call=int(steps_per_call) if _float(steps_per_call) == _float(steps_per_call) else 1,
        steps_per_epoch=_float(steps_per_epoch),
        slowest_input_stage=slowest_input_stage,
        prefetches=prefetching if isinstance(prefetching, bool) else None,
        input_stage_kinds=tuple(map(str, kinds)) if kinds is not None else None,
        mfu_pct=_float(mfu_pct),
        peak_dtype=peak_dtype,
        other_cpu_pct=_float(other_cpu_pct),
        proc_cpu_pct=_float(proc_cpu_pct),
        cpu_cores=_float(cpu_cores),
        retrace_steps=int(trace.retrace_steps or 0),
        retrace_ms=_float(trace.retrace_ms, 0.0),
        sync_name=trace.sync_name,
        kernels_per_step=_float(trace.kernels_per_step),
        mean_kernel_us=_float(trace.mean_kernel_us),
        idle_host_pct=_float(trace.idle_host_pct),
        matrix_units=tuple(matrix_units) if matrix_units is not None else None,
        bfloat16_units=tuple(map(str, bfloat16_units)) if isinstance(bfloat16_units, (list, tuple)) else None,
        device_mem_peak_bytes=_float(device_mem_peak_bytes),
        device_mem_total_bytes=_float(device_mem_total_bytes),
        eigen_dense_pct=_float(eigen_dense_pct),
        eager=eager,
        idle_stretch=idle_stretch,
        below_roofline=tuple(below_roofline),
        step_ms=_float(step_ms),
        traced_steps=int(traced_steps or 0),
        launch_ms=_float(launch_ms),
        call_entry_exit_ms=_float(trace.call_entry_exit_ms),
        host_per_call_pct=_float(host_per_call_pct),
        op_ms=_float(op_ms),
        matrix_pct=_float(matrix_pct),
        matrix_ceilings=_measured_rates(matrix_ceilings),
        small_matrix_rates=tuple(small_matrix_rates or ()),
        holder_op_ms=_float(holder_op_ms),
        python_iterator=bool(python_iterator),
        job_workers_here=int(job_workers_here or 0),
        ceilings_source=ceilings_source,
        mfu_scope=mfu_scope or "the epoch runs",
        memory=memory,
    )


def _measured_rates(rates) -> tuple[tuple[str, float], ...]:
    """`{dtype: FLOP/s}` (or pairs) as sorted pairs, keeping only finite positive rates."""
    if not rates:
        return ()
    items = rates.items() if isinstance(rates, dict) else rates
    kept = [
        (str(dtype), float(rate))
        for dtype, rate in items
        if isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0
    ]
    return tuple(sorted(kept))


# Kernels and op types of matrix work (convolutions, matmuls, GEMMs): what a lower precision speeds up.
MATRIX_OP_RE = re.compile(r"conv|matmul|gemm|einsum|dot|cijk|winograd|xmma|wgrad|dgrad", re.IGNORECASE)


def cpu_op_ms(ops: pd.DataFrame, steps_per_call: int) -> float:
    """The host ops' own time per call, summed over the threads they ran on (NaN: no ops): on a CPU, the
    CPU time compute takes, which its wall time times the cores overstates where threads wait."""
    if ops.empty or "ms_per_step" not in ops:
        return math.nan
    host = ops[ops["device"].astype(str).str.contains("CPU", case=False)] if "device" in ops else ops
    total = float(host["ms_per_step"].sum())
    return total * max(1, int(steps_per_call or 1)) if total > 0 else math.nan


def matrix_share_pct(ops: pd.DataFrame, compute_pct: float) -> float:
    """The matrix ops' share of the step: their share of op time times compute's share of the step
    (NaN: no ops)."""
    if ops.empty or not ops["ms_per_step"].sum() > 0 or not compute_pct == compute_pct:
        return math.nan
    text = ops["type"].astype(str) + " " + ops["op"].astype(str)
    matrix = ops["kind"].astype(str).eq("matrix") if "kind" in ops else pd.Series(False, index=ops.index)
    matrix = matrix | text.str.contains(MATRIX_OP_RE)
    return float(compute_pct * ops.loc[matrix, "ms_per_step"].sum() / ops["ms_per_step"].sum())


# The policy a run computes in, from the dtype most of its costed ops' FLOPs run in (a program of the
# user's own states no policy): the dtype the trace shows decides, so the run is never told to use it.
POLICY_OF_DTYPE = {
    "bfloat16": "mixed_bfloat16",
    "float16": "mixed_float16",
    "half": "mixed_float16",
    "float64": "float64",
    "double": "float64",
}


def holder_op_ms(memory: MemoryReport | None, ops: pd.DataFrame) -> float:
    """The time per step of the op that holds the most of the first allocator's peak that names one."""
    holder = next((peak.holder for peak in (memory.allocators if memory is not None else ()) if peak.holder), None)
    if holder is None or ops.empty or "op" not in ops:
        return math.nan
    mine = ops.loc[ops["op"].astype(str) == holder.op, "ms_per_step"]
    return float(mine.sum()) if not mine.empty else math.nan


def job_workers_here(run: RunRecord | None) -> int:
    """The other workers of this worker's job that run on its machine: those whose address (run.json
    `worker.addresses`) has this worker's host."""
    worker = run.raw.get("worker") if run is not None else None
    if not isinstance(worker, dict) or not isinstance(worker.get("addresses"), list):
        return 0
    mine = str(worker.get("address") or "").rsplit(":", 1)[0]
    hosts = [str(address).rsplit(":", 1)[0] for address in worker["addresses"]]
    return max(0, hosts.count(mine) - 1) if mine else 0


def run_precision(config: dict, trace_dtype: str | None) -> str | None:
    """The run's precision: run.json's policy, else what the trace's ops compute in; float64 in the
    trace whatever the policy says (a model made float64 by mistake computes in it)."""
    traced = POLICY_OF_DTYPE.get(trace_dtype or "")
    if traced == "float64":
        return traced
    stated = config.get("precision")
    return stated if isinstance(stated, str) and stated else traced


def worker_facts(
    mean: dict[str, float],
    source: StepSource,
    run: RunRecord | None,
    machine: dict[str, float],
    trace: TraceFacts,
    devices: DeviceTable,
    stage: SlowestStage | None,
    ops: pd.DataFrame,
    eager: EagerOps | None = None,
    idle_stretch: IdleStretch | None = None,
    roofline: dict | None = None,
    measured: dict[str, float] | None = None,
    measured_source: str | None = None,
    small_measured: tuple = (),
    traced_steps: int = 0,
    memory: MemoryReport | None = None,
    host_per_call_ms: float = math.nan,
    xprof: XProfReading | None = None,
) -> Facts:
    """The facts of one worker's analysis: its steady mean, its run's settings, its utilization
    headline, what its trace shows and where its process sat idle."""
    config = run.config if run is not None else {}
    device = run.device if run is not None else {}
    step_ms = _float(mean.get("step_ms"))
    share = (lambda key: 100.0 * _float(mean.get(key)) / step_ms) if step_ms > 0 else (lambda key: math.nan)
    return make_facts(
        input_pct=mean.get("input_pct"),
        host_pct=mean.get("host_pct"),
        compute_pct=mean.get("compute_pct"),
        input_wait_pct=share("input_wait_ms"),
        input_copy_pct=share("input_copy_ms"),
        input_wait_ms=mean.get("input_wait_ms"),
        eager=eager,
        idle_stretch=idle_stretch,
        collective_pct=mean.get("collective_pct"),
        device=source.device,
        producer=source.producer,
        # Device steps with no host activity traced: the device's idle has no cause the trace can tell.
        idle_pct=mean.get("host_pct") if source.basis == "device" and not trace.host_recorded else None,
        device_recorded=devices.recorded,
        precision=run_precision(config, (roofline or {}).get("dtype")),
        jit_compile=config.get("jit_compile"),
        steps_per_call=source.steps_per_call,
        steps_per_epoch=run.steps_per_epoch if run is not None else None,
        slowest_input_stage=stage,
        trace=trace,
        other_cpu_pct=machine.get("other_cpu_mean_pct"),
        proc_cpu_pct=machine.get("proc_cpu_mean_pct"),
        cpu_cores=machine.get("cpu_cores"),
        matrix_units=matrix_unit_dtypes(device),
        bfloat16_units=device.get("bfloat16_units"),
        device_mem_peak_bytes=machine.get("device_mem_peak_bytes"),
        device_mem_total_bytes=machine.get("device_mem_total_bytes"),
        eigen_dense_pct=eigen_dense_pct(ops) if source.device == "cpu" else math.nan,
        mfu_pct=(roofline or {}).get("mfu_pct"),
        peak_dtype=(roofline or {}).get("dtype") or None,
        below_roofline=below_roofline(ops),
        step_ms=step_ms,
        traced_steps=traced_steps,
        launch_ms=(devices.kernel_launch or {}).get("ms_per_step", math.nan),  # per row of steps: per call
        host_per_call_pct=100.0 * host_per_call_ms / step_ms if step_ms > 0 else math.nan,
        op_ms=cpu_op_ms(ops, source.steps_per_call) if source.device == "cpu" else math.nan,
        matrix_pct=matrix_share_pct(ops, _float(mean.get("compute_pct"))),
        matrix_ceilings=measured,
        ceilings_source=measured_source,
        small_matrix_rates=small_measured,
        holder_op_ms=holder_op_ms(memory, ops),
        python_iterator=source.python_iterator,
        job_workers_here=job_workers_here(run),
        mfu_scope=f"the costed ops ({(roofline or {}).get('achieved_over') or 'some of op time'}) run",
        memory=memory,
        xprof=xprof,
    )

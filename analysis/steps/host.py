"""Find training steps in a trace and break each into input, compute and host overhead.

Definitions (docs/architecture.md): a step runs from its marker's start to the next
marker's start (the loop asking for the next batch); without a next consecutive
marker it ends where its own marker ends.

- input: host time blocked in `IteratorGetNext*` (eager op or in-graph op, any host
  thread) plus host-to-device copies on GPU/TPU planes;
- compute: on GPU/TPU the union of device events; on a CPU-only trace the union of
  the step's TensorFlow work on the host (the `tf.function` call, kernel execution,
  executor spans of the step's function linked by the `_p`/`_c` context stats),
  which is what XProf reports as "host compute";
- host overhead: step - input - compute (Python, dispatch, launch, idle gaps);
- compile: `tf.function` tracing, graph instantiation and XLA compilation, a part of
  host overhead reported on its own.

Where categories overlap, input wins over compile, and compile over compute.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis import producers
from analysis.producers import tensorflow as tf_producer
from analysis.read.view import NS_PER_MS, TraceView, intervals, matches, on_lines, present
from analysis.steps.recorded import DetectedSteps

TF_OP_RE = re.compile(tf_producer.TF_OP)
PARTS = ("input", "compute", "collective", "host")


@dataclass
class StepAnalysis:
    """The per-step breakdown of one trace and how its steps were found."""

    device: str
    method: str  # markers | trace_groups | program_executions | window
    step_name: str
    steps: pd.DataFrame
    detected: object = None  # analysis.steps.recorded.DetectedSteps
    notes: list[str] = field(default_factory=list)


def compile_intervals(view: TraceView) -> iv.Intervals:
    """Tracing and compilation: named compile events, and the head of each traced call.

    A `tf.function` call whose `tf_function_call` stat starts with "traced" spends
    the time before its first execution event building, instantiating and (for XLA)
    compiling the graph; that head is compile time.
    """
    host = view.host
    named = view.host_named("compile")
    parts = [intervals(named)]
    traced = host[_traced_calls(host["tf_function_call"])]
    if not traced.empty:
        execution = view.host_named("host_execution")
        execution = execution.sort_values("start_ns")
        exec_starts = execution["start_ns"].to_numpy()
        heads_start, heads_end = [], []
        named_ends = named.sort_values("start_ns")
        for call in traced.itertuples():
            building_end = named_ends.loc[
                (named_ends["start_ns"] >= call.start_ns) & (named_ends["start_ns"] < call.end_ns), "end_ns"
            ]
            after = building_end.max() if not building_end.empty else call.start_ns
            first = np.searchsorted(exec_starts, after, side="left")
            exec_start = exec_starts[first] if first < exec_starts.size else call.end_ns
            heads_start.append(call.start_ns)
            heads_end.append(min(exec_start, call.end_ns))
        parts.append(iv.union(heads_start, heads_end))
    return iv.union_of(*parts)


def _traced_calls(tf_function_call: pd.Series) -> np.ndarray:
    """Whether each event's `tf_function_call` stat says the call was traced ("traced..."): a mask by
    row (a reindex by label would build and keep an array of the whole table's index)."""
    present = tf_function_call.notna().to_numpy()
    traced = np.zeros(len(tf_function_call), dtype=bool)
    traced[present] = tf_function_call[present].astype("string").str.startswith("traced").to_numpy(dtype=bool)
    return traced


def host_compute_intervals(view: TraceView, markers: pd.DataFrame) -> iv.Intervals:
    """The steps' TensorFlow work on host threads: CPU-only compute, as XProf counts it.

    On the marker threads, everything TensorFlow records inside a marker counts (the
    `tf.function` call, C API calls, kernel execution), except the eager wrappers
    XProf also leaves out (`EagerExecute`, `EagerLocalExecute`, `EagerKernelExecute`,
    `FunctionRun`), whose own time is dispatch. On other threads only executor spans
    whose `_c` context links them to a producer (`_p`, e.g. `FunctionRun`) inside a
    marker count (their ops run nested inside), so tf.data functions and unrelated
    pool work stay out. Like XProf's event grouping, a linked span belongs to the step
    of its producer and is clipped to that step's marker: under CPU contention an
    executor thread can close the previous step's `ExecutorState::Process` or
    `ExecutorDoneCallback` span well after the caller has resumed, and that tail
    (overlapping the next step's Python and iterator call) is not the next step's
    compute. Python code between TensorFlow calls records no events and stays host
    time. Traces without context stats fall back to all execution events on every thread.
    """
    # Only the columns used here: a full-width copy of a multi-million-event table costs memory and time.
    host = view.host[["plane", "line", "name", "plane_name", "start_ns", "end_ns", "step_num", "_p", "_c"]]
    on_marker_line = on_lines(host, markers)
    callers = np.zeros(len(host), dtype=bool)
    callers[on_marker_line.to_numpy()] = _callers(host[on_marker_line], markers)
    wrappers = matches(host["name"], producers.pattern("eager_wrapper")) | present(host["step_num"]) | callers
    inside_markers = iv.union(markers["start_ns"].to_numpy(), markers["marker_end_ns"].to_numpy())
    marker_thread_work = iv.intersect(intervals(host[on_marker_line & ~wrappers]), inside_markers)

    linked_producers = _producer_markers(host[on_marker_line & host["_p"].notna()], markers)
    # Masks over the whole table, and only the rows each branch uses taken: the other threads' events
    # are most of a trace (a copy of them was a third of this function).
    consumers = ~on_marker_line & host["_c"].notna()
    if not linked_producers.empty and consumers.any():
        return iv.union_of(marker_thread_work, _linked_to_own_step(host, consumers.to_numpy(), linked_producers))
    is_execution = matches(host["name"], producers.pattern("host_execution")) | matches(host["name"], TF_OP_RE)
    return iv.union_of(marker_thread_work, intervals(host[~on_marker_line & is_execution]))


def _callers(events: pd.DataFrame, markers: pd.DataFrame) -> np.ndarray:
    """Which of `events` (a mask over its rows) start before a step on its thread and reach into it: the
    step's caller (Keras' `train_function` call around the step group TensorFlow recorded in it), whose
    own time is dispatch. By row, not by index label: a reindex of a million labels hashed them all."""
    threads = {"plane": "int64", "line": "int64"}
    caller = np.zeros(len(events), dtype=bool)
    if events.empty or markers.empty:
        return caller
    left = events[["plane", "line", "start_ns", "end_ns"]].astype(threads).assign(row=np.arange(len(events)))
    found = pd.merge_asof(
        left.sort_values("start_ns", kind="stable"),
        markers[["plane", "line", "start_ns"]]
        .astype(threads)
        .rename(columns={"start_ns": "step_ns"})
        .sort_values("step_ns", kind="stable"),
        left_on="start_ns",
        right_on="step_ns",
        by=["plane", "line"],
        direction="forward",
        allow_exact_matches=False,
    )
    caller[found["row"].to_numpy()] = (found["step_ns"].notna() & (found["step_ns"] < found["end_ns"])).to_numpy()
    return caller


def _producer_markers(producing: pd.DataFrame, markers: pd.DataFrame) -> pd.DataFrame:
    """`_p` of marker-thread events inside a marker, with that marker's span.

    Columns `_p`, `marker_start_ns`, `marker_end_ns`; producers outside every marker
    (before the first, between markers) belong to no step and are left out.
    """
    threads = {"plane": "int64", "line": "int64"}
    spans = markers[["plane", "line", "start_ns", "marker_end_ns"]].rename(columns={"start_ns": "marker_start_ns"})
    spans = spans.astype(threads)
    found = pd.merge_asof(
        producing[["plane", "line", "start_ns", "_p"]].astype(threads).sort_values("start_ns", kind="stable"),
        spans.sort_values("marker_start_ns", kind="stable"),
        left_on="start_ns",
        right_on="marker_start_ns",
        by=["plane", "line"],
        direction="backward",
    )
    inside = found["marker_start_ns"].notna() & (found["start_ns"] < found["marker_end_ns"])
    found = found[inside].drop_duplicates("_p", keep="first")
    return found[["_p", "marker_start_ns", "marker_end_ns"]].astype(
        {"marker_start_ns": "int64", "marker_end_ns": "int64"}
    )


def _linked_to_own_step(events: pd.DataFrame, consumers: np.ndarray, producers: pd.DataFrame) -> iv.Intervals:
    """Spans of the `consumers` rows of `events` (`start_ns`, `end_ns`, `_c`) whose `_c` names a producer
    in `producers` (each `_p` once), clipped to the producer's marker. Found by binary search over the
    producers, not by a join: the consumers are most of a trace's events."""
    rows = np.flatnonzero(consumers)
    context = events["_c"].to_numpy(dtype=np.uint64, na_value=0)[rows]
    keys = producers["_p"].to_numpy(dtype=np.uint64)
    order = np.argsort(keys, kind="stable")
    at = order[np.minimum(np.searchsorted(keys[order], context), keys.size - 1)]
    linked = keys[at] == context
    rows, at = rows[linked], at[linked]
    starts = np.maximum(events["start_ns"].to_numpy(dtype=np.int64)[rows], producers["marker_start_ns"].to_numpy()[at])
    ends = np.minimum(events["end_ns"].to_numpy(dtype=np.int64)[rows], producers["marker_end_ns"].to_numpy()[at])
    return iv.union(starts, ends)


def call_entry_exit_ms(view: TraceView, steps: pd.DataFrame) -> float:
    """On a CPU, the time per row of `steps` (a call; `mean_without_stalls`) that compute spends before the
    call's first op and after its last: the call's own dispatch (argument checks, the executor's set-up and
    tear-down, the wake-up of its threads after the host's gap), which the breakdown counts as compute (as
    XProf does) and a call of several steps pays once. NaN on devices, or where no op is traced."""
    if not view.device.empty or view.host.empty or steps.empty or "compute_ms" not in steps:
        return float("nan")
    ops = view.host[matches(view.host["name"], TF_OP_RE)]
    if ops.empty:
        return float("nan")
    order = np.argsort(ops["start_ns"].to_numpy(dtype=np.int64), kind="stable")
    op_starts = ops["start_ns"].to_numpy(dtype=np.int64)[order]
    op_ends = ops["end_ns"].to_numpy(dtype=np.int64)[order]
    starts = steps["start_ns"].to_numpy(dtype=np.int64)
    ends = (
        steps["marker_end_ns"].to_numpy(dtype=np.int64)
        if "marker_end_ns" in steps
        else steps["end_ns"].to_numpy(dtype=np.int64)
    )
    first = np.searchsorted(op_starts, starts, side="left")
    last = np.searchsorted(op_starts, ends, side="left")
    spans = []
    for low, high, compute_ms, end in zip(first, last, steps["compute_ms"].to_numpy(dtype=float), ends):
        if high <= low:
            continue
        span_ns = min(int(op_ends[low:high].max()), int(end)) - int(op_starts[low])
        spans.append(max(0.0, compute_ms - span_ns / NS_PER_MS))
    return mean_without_stalls(spans)


def step_breakdown(
    markers: pd.DataFrame,
    input_: iv.Intervals,
    compute: iv.Intervals,
    compile_: iv.Intervals,
    collective: iv.Intervals | None = None,
    overlapped: iv.Intervals | None = None,
) -> pd.DataFrame:
    """Per-step input/compute/collective/host/compile in ms from category intervals.

    Input has priority over compile, compile over compute, compute over collective
    (collective time hidden under compute costs nothing); host is the remainder, so
    `input_ms + compute_ms + collective_ms + host_ms == step_ms` holds exactly (and
    `compile_ms` is the part of `host_ms` spent tracing and compiling). `overlapped` is input
    work that ran while the step computed (`input_overlapped_ms`, outside the sum).
    """
    starts = markers["start_ns"].to_numpy(dtype=np.int64)
    ends = markers["end_ns"].to_numpy(dtype=np.int64)
    collective = collective if collective is not None else iv.empty()
    compile_only = iv.subtract(compile_, input_)
    compute_only = iv.subtract(iv.subtract(compute, input_), compile_only)
    collective_only = iv.subtract(iv.subtract(iv.subtract(collective, input_), compile_only), compute_only)
    step_ns = ends - starts
    input_ns = iv.overlap(input_, starts, ends)
    compile_ns = iv.overlap(compile_only, starts, ends)
    compute_ns = iv.overlap(compute_only, starts, ends)
    collective_ns = iv.overlap(collective_only, starts, ends)
    host_ns = step_ns - input_ns - compute_ns - collective_ns
    frame = pd.DataFrame(
        {
            "step": markers["step"].to_numpy(),
            "steps": markers["steps"].to_numpy(),
            "start_ns": starts,
            "end_ns": ends,
            # where the step's own call (marker, program execution) ends: the work it launched is inside
            "marker_end_ns": markers["marker_end_ns"].to_numpy(dtype=np.int64) if "marker_end_ns" in markers else ends,
            "step_ms": step_ns / NS_PER_MS,
            "input_ms": input_ns / NS_PER_MS,
            "compute_ms": compute_ns / NS_PER_MS,
            "collective_ms": collective_ns / NS_PER_MS,
            "host_ms": host_ns / NS_PER_MS,
            "compile_ms": compile_ns / NS_PER_MS,
            "input_overlapped_ms": iv.overlap(overlapped if overlapped is not None else iv.empty(), starts, ends)
            / NS_PER_MS,
            "partial": markers["partial"].to_numpy() if "partial" in markers else np.zeros(len(markers), bool),
        }
    )
    for part in ("input", "compute", "collective", "host", "compile"):
        frame[f"{part}_pct"] = np.where(
            step_ns > 0, 100.0 * frame[f"{part}_ms"] / frame["step_ms"].where(step_ns > 0, 1), 0.0
        )
    assert (host_ns >= 0).all(), "categories exceed the step: intervals were not made disjoint"
    assert (compile_ns <= host_ns).all()
    assert np.array_equal(input_ns + compute_ns + collective_ns + host_ns, step_ns)
    return frame


def analyze_steps(view: TraceView, detected: DetectedSteps) -> StepAnalysis:
    """The per-step breakdown of the steps `detected` in a trace."""
    input_ = view.input_intervals
    overlapped = iv.empty()
    if view.device.empty:  # a CPU run, or devices whose activity was not recorded
        collective = intervals(view.host_named("collective", search=True))
        compute = iv.subtract(host_compute_intervals(view, detected.spans), collective)
    else:
        parts = view.device_parts
        compute, collective = parts["compute"], parts["collective"]
        # Input the devices computed through (a copy stream beside the kernels, the next batch
        # fetched while the last step runs) is not waited for.
        overlapped = iv.intersect(input_, compute)
        input_ = iv.subtract(input_, compute)
    steps = step_breakdown(detected.steps, input_, compute, compile_intervals(view), collective, overlapped)
    steps["between_steps_ms"] = between_steps_ms(detected.steps)
    # Markers number steps from the program's first call (step 0), which traces and compiles the
    # training function, however little of that the trace shows: never a steady step.
    steps["first_call"] = (steps["step"] == 0).to_numpy() if detected.method == "markers" else False
    notes = [detected.note] if detected.note else []
    if only_first_call(steps):
        notes.append(first_call_note(int(steps["steps"].max())))
    if (steps["between_steps_ms"] > 0).any():
        notes.append(between_steps_note(view, detected.steps, steps["between_steps_ms"]))
    if view.host.empty:
        notes.append(
            "no host threads recorded: input waits and host overhead are unknown; what is not device work "
            "is counted as host overhead"
        )
    elif view.producer in ("tensorflow", "keras") and view.input_waits.empty:
        notes.append("no input-pipeline events recorded (IteratorGetNext): input counts only host-to-device copies")
    return StepAnalysis(view.kind, detected.method, detected.name, steps, detected, notes)


BETWEEN_OPS_NAMED = 3


def between_steps_ms(steps: pd.DataFrame) -> np.ndarray:
    """Per step, the host's time after it that belongs to no step: to the next step's start, the last
    one to where its step group ran on (`run_on_end_ns`: Keras' callbacks after train_function)."""
    starts = steps["start_ns"].to_numpy(dtype=np.int64)
    ends = steps["end_ns"].to_numpy(dtype=np.int64)
    after = np.zeros(len(steps), dtype=np.int64)
    if len(steps) > 1:
        after[:-1] = np.maximum(starts[1:] - ends[:-1], 0)
    if len(steps) and "run_on_end_ns" in steps:
        after[-1] = max(int(steps["run_on_end_ns"].iloc[-1]) - int(ends[-1]), 0)
    return after / NS_PER_MS


def between_steps_note(view: TraceView, steps: pd.DataFrame, between_ms: pd.Series) -> str:
    """What runs between the steps (the heaviest host ops there), said once."""
    ends = steps["end_ns"].to_numpy(dtype=np.int64)
    stops = ends + np.round(between_ms.to_numpy() * NS_PER_MS).astype(np.int64)
    gaps = iv.union(ends, stops)
    host = view.host
    at = host["start_ns"].to_numpy(dtype=np.int64)
    last = np.maximum(host["end_ns"].to_numpy(dtype=np.int64) - 1, at)
    # Events wholly between steps: a call that runs on into the next step (its dispatch) is the step's.
    inside = (
        (iv.covered_before(gaps, at + 1) - iv.covered_before(gaps, at) > 0)
        & (iv.covered_before(gaps, last + 1) - iv.covered_before(gaps, last) > 0)
        & (iv.overlap(gaps, at, last + 1) == last + 1 - at)
    )
    events = host[inside]
    heaviest = events.groupby(events["name"].astype(str))["duration_ns"].sum().nlargest(BETWEEN_OPS_NAMED)
    named = ", ".join(f"{name} {ns / NS_PER_MS / len(steps):.2f} ms" for name, ns in heaviest.items())
    return (
        f"between the steps, outside them: {float(between_ms.mean()):.2f} ms per step (`steps[].between_steps_ms`)"
        f" of host work that is not the step's, such as Keras' callbacks and summary writing after train_function"
        + (f"; heaviest, per step: {named}" if named else "")
    )


def complete_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Steps the trace holds whole (a step cut by the window's edge, or a round some thread or
    device did not run, is partial); all of them if every one is partial."""
    if "partial" not in steps:
        return steps
    whole = steps[~steps["partial"].astype(bool)]
    return whole if not whole.empty else steps


def only_first_call(steps: pd.DataFrame) -> bool:
    """Whether the first call (step 0, `first_call`) is the only complete step."""
    whole = complete_steps(steps)
    return "first_call" in whole and len(whole) > 0 and bool(whole["first_call"].astype(bool).all())


def first_call_note(steps_per_call: int = 1) -> str:
    first = "step 0" if steps_per_call <= 1 else f"the first call (steps 0-{steps_per_call - 1})"
    later = f"{steps_per_call}:{steps_per_call * 11}" if steps_per_call > 1 else "5:15"
    return (
        f"the only traced step is the compile step: {first}, the first call, which traces and compiles the "
        f"training function, so no steady step was traced and its time is no mean step's; trace later steps "
        f'(--profile-steps {later}, profile_steps="{later}")'
    )


def steady_steps(steps: pd.DataFrame, compile_share: float = 0.05) -> pd.DataFrame:
    """Complete steps without significant compile time (all complete steps if every one compiles),
    never the first call (`first_call`): none when it is the only complete step."""
    steps = complete_steps(steps)
    if "first_call" in steps:
        steps = steps[~steps["first_call"].astype(bool)]
    steady = steps[steps["compile_ms"] <= compile_share * steps["step_ms"]]
    return steady if not steady.empty else steps


def mean_breakdown(steps: pd.DataFrame) -> dict[str, float]:
    """Mean ms per step and each part's share of total step time."""
    if steps.empty:
        raise ValueError("no steps to average")
    total_ms = float(steps["step_ms"].sum())
    parts = [part for part in ("step", "input", "compute", "collective", "host") if f"{part}_ms" in steps]
    mean = {f"{part}_ms": float(steps[f"{part}_ms"].mean()) for part in parts}
    for part in ("input", "compute", "collective", "host"):
        if f"{part}_ms" in steps:
            mean[f"{part}_pct"] = 100.0 * float(steps[f"{part}_ms"].sum()) / total_ms if total_ms > 0 else 0.0
    mean["input_overlapped_ms"] = float(steps["input_overlapped_ms"].mean()) if "input_overlapped_ms" in steps else 0.0
    return mean


STALL_FENCE_IQR = 3.0  # Tukey's far-out fence: Q3 + 3 IQR
STALLS_PER_CALL = 0.2  # more calls than this beyond the fence recur: they are the calls' cost, not stalls


def mean_without_stalls(values) -> float:
    """The mean per call of a cost without the calls stalled once (preempted, a GC pause): those beyond
    Tukey's far-out fence, where they are at most one call in five. A cost fewer calls would remove is
    what the calls pay each time, not what one of them waited."""
    values = np.sort(np.asarray(values, dtype=float))
    if values.size == 0:
        return float("nan")
    q1, q3 = np.percentile(values, [25, 75])
    stalled = int((values > q3 + STALL_FENCE_IQR * (q3 - q1)).sum())
    if stalled > int(STALLS_PER_CALL * values.size):
        stalled = 0
    return float(values[: values.size - stalled].mean())


def per_call_host_ms(steps: pd.DataFrame) -> float:
    """The host overhead every call pays (`mean_without_stalls`)."""
    return mean_without_stalls(steps["host_ms"]) if "host_ms" in steps else float("nan")


def one_step_capture(steps: pd.DataFrame, compile_share: float = 0.05) -> bool:
    """Whether the trace holds exactly one complete step, and it does not trace or compile: a
    one-step capture (Keras' default profiles one batch). Its figures are all the trace has, so
    it gets a verdict, marked as based on a single step, on every device."""
    complete = complete_steps(steps)
    if len(complete) != 1 or ("partial" in steps and bool(complete["partial"].astype(bool).all())):
        return False
    step = complete.iloc[0]
    if bool(step.get("first_call", False)):
        return False  # the compile step: no steady step at all
    return bool(step["compile_ms"] <= compile_share * step["step_ms"])


@dataclass(frozen=True)
class ChosenSteps:
    """Which steps the means and the verdict use: the steady complete ones (`used`), and the
    complete ones left out for compiling."""

    used: pd.DataFrame
    steady: pd.DataFrame
    compile_steps: pd.DataFrame
    mean: dict[str, float]


def choose_steps(steps: pd.DataFrame) -> ChosenSteps:
    steady = steady_steps(steps)
    complete = complete_steps(steps)
    used = steps.loc[steady.index] if not steady.empty else steps
    return ChosenSteps(
        used,
        steady,
        complete[~complete.index.isin(steady.index)],
        mean_breakdown(steady if not steady.empty else steps),
    )

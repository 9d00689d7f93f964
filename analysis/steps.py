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
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.trace import Trace, TraceError

NS_PER_MS = 1e6

HOST_PLANE_RE = re.compile(r"^/host:")
DEVICE_PLANE_RE = re.compile(r"^/device:(GPU|TPU)(?::|_)", re.IGNORECASE)
DERIVED_LINE_MIN_ID = 0xDEADBEEF
DERIVED_LINE_NAMES = {
    "Steps", "XLA Modules", "XLA Ops", "TensorFlow Ops", "TensorFlow Name Scope", "Launch Stats",
    "Framework Ops", "Framework Name Scope", "Source code", "XLA TraceMe", "Async XLA Ops", "Sparse Core Steps",
}

# A TF op event is named "scope/op_name:OpType" (XProf's ParseTfOpFullname).
TF_OP_RE = re.compile(r"^[^\s:][^:]*:[A-Za-z_][A-Za-z0-9_]*$")
HOST_EXECUTION_RE = re.compile(
    r"^(KernelAndDevice\w*::Run|ExecutorState::Process|ExecutorDoneCallback|\w*Executable::Execute\w*|ThunkExecutor::Execute)$"
)
HOST_INPUT_RE = re.compile(r"^(?:IteratorGetNext|InfeedEnqueue)|:(?:IteratorGetNext\w*|InfeedEnqueue\w*)$", re.IGNORECASE)
DEVICE_INPUT_RE = re.compile(r"^(?:MemcpyHtoD|Memcpy H2D|MemcpyH2D)|infeed", re.IGNORECASE)
EAGER_WRAPPER_RE = re.compile(r"^(EagerExecute|EagerLocalExecute|EagerKernelExecute|FunctionRun)")
COMPILE_RE = re.compile(
    r"^(tf\.function-graph_building|XlaCompile\w*|TfrtCompile\w*|\w*CompilationCache\w*|\w*Compiler::\w+|HLO passes.*)$"
)
INPUT_STAGE_RE = re.compile(r"^Iterator::")
# Markers seen in TF 2.x traces: tf.profiler.experimental.Trace("train", step_num=N, _r=1)
# in custom loops and Keras' TensorBoard callback's Trace("Profiled batch", step_num=batch).
KERAS_MARKER = "Profiled batch"



@dataclass
class StepAnalysis:
    """The per-step breakdown of one trace and what it was derived from."""

    device: str
    marker_name: str
    markers: pd.DataFrame
    steps: pd.DataFrame


def matches(names: pd.Series, pattern: re.Pattern, *, search: bool = False) -> pd.Series:
    """Whether each name matches `pattern` (`re.match`; `re.search` with `search=True`).

    The pattern (with its flags) is tried once per distinct name, not once per row:
    the trace's name columns are categorical, and a trace repeats a few hundred names
    over hundreds of thousands of events.
    """
    names = names if isinstance(names.dtype, pd.CategoricalDtype) else names.astype("category")
    test = pattern.search if search else pattern.match
    categories = names.cat.categories
    hit = np.fromiter((test(name) is not None for name in categories), dtype=bool, count=len(categories))
    codes = names.cat.codes.to_numpy()
    return pd.Series(hit[codes] & (codes >= 0), index=names.index)


def host_events(events: pd.DataFrame) -> pd.DataFrame:
    return events[matches(events["plane_name"], HOST_PLANE_RE)]


def device_events(events: pd.DataFrame) -> pd.DataFrame:
    """Events on GPU/TPU planes, leaving out lines the converter derives (Steps, XLA Ops, ...)."""
    on_device = events[matches(events["plane_name"], DEVICE_PLANE_RE)]
    derived = (on_device["line_id"].astype("int64") >= DERIVED_LINE_MIN_ID) | on_device["line_name"].isin(
        DERIVED_LINE_NAMES
    )
    return on_device[~derived]


def device_kind(events: pd.DataFrame) -> str:
    """`cpu`, or `gpu`/`tpu` (with a count) when device planes hold events."""
    on_device = device_events(events)
    if on_device.empty:
        return "cpu"
    names = on_device["plane_name"].unique()
    kind = DEVICE_PLANE_RE.match(names[0]).group(1).lower()
    return kind if len(names) == 1 else f"{kind} x{len(names)}"


def find_step_markers(events: pd.DataFrame) -> pd.DataFrame:
    """One row per step marker: `step`, `steps` (per call), `name`, `start_ns`, `end_ns`.

    Host events carrying a `step_num` stat are candidates; one marker name is chosen,
    preferring XProf's root markers (`_r=1`), then names starting with "train", then
    Keras' "Profiled batch". `end_ns` is the next consecutive marker's start.
    """
    host = host_events(events)
    candidates = host[host["step_num"].notna()]
    if candidates.empty:
        raise TraceError(_no_marker_message(events))
    ranking = []
    for name, group in candidates.groupby("name", sort=False, observed=True):
        is_root = bool((group["_r"] == 1).any())
        ranking.append((is_root, name.startswith("train"), name == KERAS_MARKER, len(group), name))
    ranking.sort(reverse=True)
    marker_name = ranking[0][-1]
    markers = candidates[candidates["name"] == marker_name].sort_values("start_ns", kind="stable")
    markers = markers.rename(columns={"end_ns": "marker_end_ns"})
    markers["step"] = markers["step_num"].astype("int64")
    markers["steps"] = _steps_per_call(markers)
    markers["end_ns"] = _step_ends(markers)
    keep = ["step", "steps", "name", "plane", "line", "start_ns", "marker_end_ns", "end_ns"]
    return markers[keep].reset_index(drop=True)


def _steps_per_call(markers: pd.DataFrame) -> pd.Series:
    """From a `steps` stat when present, else from a constant step-number stride."""
    if markers["steps"].notna().any():
        return markers["steps"].fillna(1).astype("int64")
    strides = np.diff(markers["step"].to_numpy())
    positive = strides[strides > 0]
    stride = 1
    if positive.size and (positive == positive[0]).all() and positive[0] > 1:
        stride = int(positive[0])
    return pd.Series(stride, index=markers.index, dtype="int64")


def _step_ends(markers: pd.DataFrame) -> np.ndarray:
    """A step ends when the next consecutive step starts on the same thread."""
    ends = markers["marker_end_ns"].to_numpy().copy()
    for _, group in markers.groupby(["plane", "line"], sort=False):
        index = group.index.to_numpy()
        positions = markers.index.get_indexer(index)
        steps = group["step"].to_numpy()
        per_call = group["steps"].to_numpy()
        starts = group["start_ns"].to_numpy()
        own_ends = group["marker_end_ns"].to_numpy()
        consecutive = (steps[1:] == steps[:-1] + per_call[:-1]) & (starts[1:] >= own_ends[:-1])
        follow = positions[:-1][consecutive]
        ends[follow] = starts[1:][consecutive]
    return ends


def _no_marker_message(events: pd.DataFrame) -> str:
    host = host_events(events)
    functions = sorted(host.loc[host["tf_function_call"].notna(), "name"].unique())[:5]
    found = f"{len(events)} events on {events['plane_name'].nunique()} planes"
    if functions:
        found += f", tf.function calls {', '.join(functions)}"
    return (
        "no step markers in the trace: looked for host events with a step_num stat "
        "(tf.profiler.experimental.Trace('train', step_num=N, _r=1) or Keras' 'Profiled batch'); "
        f"found {found}. Wrap each training step in a step marker."
    )


def _intervals(frame: pd.DataFrame) -> iv.Intervals:
    return iv.union(frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy())


def input_intervals(events: pd.DataFrame) -> iv.Intervals:
    """Host time blocked on the iterator, plus host-to-device input copies on devices."""
    host = host_events(events)
    waiting = host[matches(host["name"], HOST_INPUT_RE, search=True)]
    device = device_events(events)
    copies = device[matches(device["name"], DEVICE_INPUT_RE, search=True)]
    return iv.union_of(_intervals(waiting), _intervals(copies))


def compile_intervals(events: pd.DataFrame) -> iv.Intervals:
    """Tracing and compilation: named compile events, and the head of each traced call.

    A `tf.function` call whose `tf_function_call` stat starts with "traced" spends
    the time before its first execution event building, instantiating and (for XLA)
    compiling the graph; that head is compile time.
    """
    host = host_events(events)
    named = host[matches(host["name"], COMPILE_RE)]
    parts = [_intervals(named)]
    traced = host[_traced_calls(host["tf_function_call"])]
    if not traced.empty:
        execution = host[matches(host["name"], HOST_EXECUTION_RE)]
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


def _traced_calls(tf_function_call: pd.Series) -> pd.Series:
    """Whether each event's `tf_function_call` stat says the call was traced ("traced...")."""
    present = tf_function_call[tf_function_call.notna()]
    traced = present.astype("string").str.startswith("traced").astype(bool)
    return traced.reindex(tf_function_call.index, fill_value=False)


def _on_lines(events: pd.DataFrame, lines: pd.DataFrame) -> pd.Series:
    """Whether each event lies on one of the (`plane`, `line`) pairs of `lines`."""
    width = int(max(events["line"].max(), lines["line"].max())) + 1 if len(events) and len(lines) else 1
    key = events["plane"].to_numpy(dtype=np.int64) * width + events["line"].to_numpy(dtype=np.int64)
    wanted = lines["plane"].to_numpy(dtype=np.int64) * width + lines["line"].to_numpy(dtype=np.int64)
    return pd.Series(np.isin(key, wanted), index=events.index)


def host_compute_intervals(events: pd.DataFrame, markers: pd.DataFrame) -> iv.Intervals:
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
    host = host_events(events)
    on_marker_line = _on_lines(host, markers)
    wrappers = matches(host["name"], EAGER_WRAPPER_RE) | host["step_num"].notna()
    inside_markers = iv.union(markers["start_ns"].to_numpy(), markers["marker_end_ns"].to_numpy())
    marker_thread_work = iv.intersect(_intervals(host[on_marker_line & ~wrappers]), inside_markers)

    producers = _producer_markers(host[on_marker_line & host["_p"].notna()], markers)
    other = host[~on_marker_line]
    if not producers.empty and other["_c"].notna().any():
        return iv.union_of(marker_thread_work, _linked_to_own_step(other, producers))
    is_execution = matches(other["name"], HOST_EXECUTION_RE) | matches(other["name"], TF_OP_RE)
    return iv.union_of(marker_thread_work, _intervals(other[is_execution]))


def _producer_markers(producing: pd.DataFrame, markers: pd.DataFrame) -> pd.DataFrame:
    """`_p` of marker-thread events inside a marker, with that marker's span.

    Columns `_p`, `marker_start_ns`, `marker_end_ns`; producers outside every marker
    (before the first, between markers) belong to no step and are left out.
    """
    spans = markers[["plane", "line", "start_ns", "marker_end_ns"]].rename(columns={"start_ns": "marker_start_ns"})
    found = pd.merge_asof(
        producing[["plane", "line", "start_ns", "_p"]].sort_values("start_ns", kind="stable"),
        spans.sort_values("marker_start_ns", kind="stable"),
        left_on="start_ns",
        right_on="marker_start_ns",
        by=["plane", "line"],
        direction="backward",
    )
    inside = found["marker_start_ns"].notna() & (found["start_ns"] < found["marker_end_ns"])
    found = found[inside].drop_duplicates("_p", keep="first")
    return found[["_p", "marker_start_ns", "marker_end_ns"]].astype({"marker_start_ns": "int64", "marker_end_ns": "int64"})


def _linked_to_own_step(other: pd.DataFrame, producers: pd.DataFrame) -> iv.Intervals:
    """Spans whose `_c` names a producer in `producers`, clipped to the producer's marker."""
    linked = other.loc[other["_c"].notna(), ["start_ns", "end_ns", "_c"]].merge(
        producers, left_on="_c", right_on="_p", how="inner"
    )
    starts = np.maximum(linked["start_ns"].to_numpy(dtype=np.int64), linked["marker_start_ns"].to_numpy())
    ends = np.minimum(linked["end_ns"].to_numpy(dtype=np.int64), linked["marker_end_ns"].to_numpy())
    return iv.union(starts, ends)


def device_compute_intervals(events: pd.DataFrame) -> iv.Intervals:
    device = device_events(events)
    kernels = device[~matches(device["name"], DEVICE_INPUT_RE, search=True)]
    return _intervals(kernels)


def step_breakdown(markers: pd.DataFrame, input_: iv.Intervals, compute: iv.Intervals, compile_: iv.Intervals) -> pd.DataFrame:
    """Per-step input/compute/host/compile in ms from category intervals.

    Input has priority over compile, compile over compute; host is the remainder, so
    `input_ms + compute_ms + host_ms == step_ms` holds exactly (and `compile_ms` is
    the part of `host_ms` spent tracing and compiling).
    """
    starts = markers["start_ns"].to_numpy(dtype=np.int64)
    ends = markers["end_ns"].to_numpy(dtype=np.int64)
    compile_only = iv.subtract(compile_, input_)
    compute_only = iv.subtract(iv.subtract(compute, input_), compile_only)
    step_ns = ends - starts
    input_ns = iv.overlap(input_, starts, ends)
    compile_ns = iv.overlap(compile_only, starts, ends)
    compute_ns = iv.overlap(compute_only, starts, ends)
    host_ns = step_ns - input_ns - compute_ns
    frame = pd.DataFrame(
        {
            "step": markers["step"].to_numpy(),
            "steps": markers["steps"].to_numpy(),
            "start_ns": starts,
            "end_ns": ends,
            "step_ms": step_ns / NS_PER_MS,
            "input_ms": input_ns / NS_PER_MS,
            "compute_ms": compute_ns / NS_PER_MS,
            "host_ms": host_ns / NS_PER_MS,
            "compile_ms": compile_ns / NS_PER_MS,
        }
    )
    for part in ("input", "compute", "host", "compile"):
        frame[f"{part}_pct"] = np.where(step_ns > 0, 100.0 * frame[f"{part}_ms"] / frame["step_ms"].where(step_ns > 0, 1), 0.0)
    assert (host_ns >= 0).all(), "categories exceed the step: intervals were not made disjoint"
    assert (compile_ns <= host_ns).all()
    assert np.array_equal(input_ns + compute_ns + host_ns, step_ns)
    return frame


def analyze_steps(trace: Trace) -> StepAnalysis:
    """Markers, categories and the per-step breakdown of a parsed trace."""
    events = trace.events
    markers = find_step_markers(events)
    device = device_kind(events)
    if device == "cpu":
        compute = host_compute_intervals(events, markers)
    else:
        compute = device_compute_intervals(events)
    steps = step_breakdown(markers, input_intervals(events), compute, compile_intervals(events))
    return StepAnalysis(device, str(markers["name"].iloc[0]), markers, steps)


def steady_steps(steps: pd.DataFrame, compile_share: float = 0.05) -> pd.DataFrame:
    """Steps without significant compile time (all steps if every one compiles)."""
    steady = steps[steps["compile_ms"] <= compile_share * steps["step_ms"]]
    return steady if not steady.empty else steps


def mean_breakdown(steps: pd.DataFrame) -> dict[str, float]:
    """Mean ms per step and each part's share of total step time."""
    if steps.empty:
        raise ValueError("no steps to average")
    total_ms = float(steps["step_ms"].sum())
    mean = {f"{part}_ms": float(steps[f"{part}_ms"].mean()) for part in ("step", "input", "compute", "host")}
    for part in ("input", "compute", "host"):
        mean[f"{part}_pct"] = 100.0 * float(steps[f"{part}_ms"].sum()) / total_ms if total_ms > 0 else 0.0
    return mean

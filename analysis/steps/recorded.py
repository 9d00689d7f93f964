"""The frames every step method gives, and the steps a trace records itself: step markers and step groups."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import producers
from analysis.producers import keras as keras_producer
from analysis.producers import planes
from analysis.producers import tensorflow as tf_producer
from analysis.read.view import TraceView, matches

STEP_COLUMNS = ["step", "steps", "name", "plane", "line", "start_ns", "marker_end_ns", "end_ns", "partial"]
SPAN_COLUMNS = ["step", "plane", "line", "start_ns", "marker_end_ns"]


@dataclass
class DetectedSteps:
    method: str
    name: str  # the marker, group source or program taken as the step
    steps: pd.DataFrame
    spans: pd.DataFrame
    note: str = ""
    candidates: pd.DataFrame | None = None  # program executions: every program's, with its `key`


def _ends(
    starts: np.ndarray, own_ends: np.ndarray, consecutive: np.ndarray | None = None, partition: bool = False
) -> np.ndarray:
    """A step lasts until the next one starts (when that is after its own end), else to its own end.

    With `partition`, every step but the last ends where the next starts, so that steps never
    overlap: the k-th executions on staggered threads can outlast the start of round k+1."""
    ends = own_ends.copy()
    if starts.size > 1:
        follows = starts[1:] >= own_ends[:-1] if not partition else np.ones(starts.size - 1, dtype=bool)
        if consecutive is not None:
            follows &= consecutive
        ends[:-1][follows] = starts[1:][follows]
    return ends


def _frame(
    step,
    steps,
    name,
    plane,
    line,
    start,
    marker_end,
    partition: bool = False,
    partial=False,
    keep_own_ends: bool = False,
) -> pd.DataFrame:
    count = len(np.atleast_1d(np.asarray(step)))

    def column(values, dtype=np.int64):
        return np.broadcast_to(np.asarray(values, dtype=dtype), (count,)).copy()

    frame = pd.DataFrame(
        {
            "step": column(step),
            "steps": column(steps),
            "name": name,
            "plane": column(plane),
            "line": column(line),
            "start_ns": column(start),
            "marker_end_ns": column(marker_end),
            "partial": column(partial, bool),
        }
    )
    frame = frame.sort_values("start_ns", kind="stable").reset_index(drop=True)
    own_ends = frame["marker_end_ns"].to_numpy()
    frame["end_ns"] = (
        own_ends.copy() if keep_own_ends else _ends(frame["start_ns"].to_numpy(), own_ends, partition=partition)
    )
    return frame[STEP_COLUMNS]


# ---------------------------------------------------------------- 1. markers


def find_markers(view: TraceView, wanted: re.Pattern | None = None) -> DetectedSteps | None:
    """Host events with a `step_num` stat; one name is chosen by `producers.marker_rank`."""
    host = view.host
    candidates = host[host["step_num"].notna()]
    if wanted is not None:
        candidates = candidates[matches(candidates["name"], wanted, search=True)]
    if candidates.empty:
        return None
    ranking = [
        (producers.marker_rank(str(name), bool((group["_r"] == 1).any()), len(group)), str(name))
        for name, group in candidates.groupby("name", sort=False, observed=True)
    ]
    marker_name = min(ranking)[1]
    markers = candidates[candidates["name"].astype(str) == marker_name].sort_values("start_ns", kind="stable")
    markers = markers.rename(columns={"end_ns": "marker_end_ns"})
    markers["step"] = markers["step_num"].astype("int64")
    markers["steps"] = _steps_per_call(markers)
    markers["end_ns"] = _marker_ends(markers)
    # A marker of no duration (`with Trace(...): pass` before the step) holds no step of its own: the step
    # runs to the next marker, and after the last one the trace does not say where it ends.
    markers["partial"] = (markers["end_ns"] <= markers["start_ns"]).to_numpy()
    # A step that did not run (the data ran out, the loop broke out, the call raised): devprof's
    # recorder ends its marker with `steps=0`. Its start ends the step before it; it is no step.
    markers = markers[markers["steps"] > 0]
    if markers.empty:
        return None
    steps = markers[STEP_COLUMNS].assign(name=marker_name).reset_index(drop=True)
    return DetectedSteps("markers", marker_name, steps, steps[SPAN_COLUMNS].copy())


def _steps_per_call(markers: pd.DataFrame) -> pd.Series:
    """From a `steps` stat when present, else from a constant step-number stride; 0 for a step
    that did not run (`steps=0`)."""
    aborted = (markers["steps"] == 0).fillna(False).to_numpy(dtype=bool)
    if markers["steps"][~aborted].notna().any():
        return markers["steps"].fillna(1).astype("int64")
    strides = np.diff(markers["step"].to_numpy()[~aborted])
    positive = strides[strides > 0]
    stride = 1
    if positive.size and (positive == positive[0]).all() and positive[0] > 1:
        stride = int(positive[0])
    return pd.Series(np.where(aborted, 0, stride), index=markers.index, dtype="int64")


def _marker_ends(markers: pd.DataFrame) -> np.ndarray:
    """A marked step ends when the next consecutive step starts on the same thread."""
    ends = markers["marker_end_ns"].to_numpy().copy()
    for _, group in markers.groupby(["plane", "line"], sort=False):
        positions = markers.index.get_indexer(group.index.to_numpy())
        steps = group["step"].to_numpy()
        per_call = group["steps"].to_numpy()
        consecutive = steps[1:] == steps[:-1] + per_call[:-1]
        ends[positions] = _ends(group["start_ns"].to_numpy(), group["marker_end_ns"].to_numpy(), consecutive)
    return ends


# ---------------------------------------------------------------- 2. grouping stored in the trace


def find_trace_groups(view: TraceView) -> DetectedSteps | None:
    """The trace's own step grouping: a device `Steps` line (XProf's steps, even one), else
    `group_id` stats on host events. A group cut by the window's edge is partial.

    Groups inside Keras' training function (`train_function`) are Keras' own steps, and one
    is enough (Keras profiles one step by default); when the trace has such groups, only they
    are steps. Groups of evaluation and prediction (`test_function`, `predict_function`),
    summary writing or a callback are never training steps."""
    found = _device_steps_line(view)
    if found is not None:
        return found
    host = view.host
    grouped = host[host["group_id"].notna()]
    if grouped.empty:
        return None
    # Each group's longest host event is its root, on the thread that ran the step.
    roots = grouped.sort_values("duration_ns", ascending=False, kind="stable").drop_duplicates("group_id")
    enclosing = _keras_function_of(host, roots)
    other = matches(roots["name"], re.compile(tf_producer.NOT_A_TRAINING_STEP, re.IGNORECASE), search=True) | matches(
        enclosing, keras_producer.OTHER_FUNCTION, search=True
    )
    in_training = (
        matches(enclosing, keras_producer.TRAIN_FUNCTION, search=True)
        | matches(roots["name"], keras_producer.TRAIN_FUNCTION, search=True)
    ) & ~other
    keep = roots["group_id"][in_training] if in_training.any() else roots["group_id"][~other]
    grouped = grouped[grouped["group_id"].isin(keep)]
    roots = roots[roots["group_id"].isin(keep)]
    if grouped["group_id"].nunique() < (1 if in_training.any() else 2):
        return None
    spans = grouped.groupby("group_id").agg(start_ns=("start_ns", "min"), marker_end_ns=("end_ns", "max"))
    group_ends = spans["marker_end_ns"].copy()
    # A group with a root marker (`_r`, the function TensorFlow ran) spans the event around it, as
    # XProf's step does: the eager ops TensorFlow adds to the group after the function (a summary
    # write, a metric's reduction) are the host's work between steps.
    marked = _marked_roots(grouped)
    spans.loc[marked.index, ["start_ns", "marker_end_ns"]] = marked[["start_ns", "end_ns"]].to_numpy()
    roots = roots.set_index("group_id").loc[spans.index]
    keras = bool(in_training.any())
    if keras:
        # Keras' step is its train_function: a group that runs on past the call (callbacks, summaries)
        # ends with the call, and what follows is between steps.
        calls = _enclosing_calls(
            host, roots.assign(start_ns=spans["start_ns"]).reset_index(), keras_producer.TRAIN_FUNCTION
        )
        call_end = pd.Series(calls["call_end_ns"].to_numpy(), index=spans.index)
        inside = call_end.notna() & (call_end > spans["start_ns"])
        spans.loc[inside, "marker_end_ns"] = np.minimum(
            spans.loc[inside, "marker_end_ns"], call_end[inside].astype(np.int64)
        )
    partial = _cut_by_window(view, spans["start_ns"].to_numpy(), spans["marker_end_ns"].to_numpy())
    steps = _frame(
        spans.index.to_numpy(),
        1,
        "group_id",
        roots["plane"],
        roots["line"],
        spans["start_ns"],
        spans["marker_end_ns"],
        partial=partial,
        keep_own_ends=keras,
    )
    if keras:
        steps["run_on_end_ns"] = np.maximum(
            group_ends.reindex(steps["step"]).to_numpy(dtype=np.int64), steps["end_ns"].to_numpy(dtype=np.int64)
        )
    note = "steps are the trace's own step groups (group_id stats)"
    if in_training.any():
        note = (
            "steps are Keras' own: the step groups TensorFlow recorded inside its train_function (group_id "
            "stats; the function's Python-level dispatch before the group is host overhead between steps)"
        )
    return DetectedSteps("trace_groups", "group_id", steps, steps[SPAN_COLUMNS].copy(), note)


def _marked_roots(grouped: pd.DataFrame) -> pd.DataFrame:
    """Per group holding a root marker (`_r` = 1): the longest event of the group on the marker's
    thread that holds it (`start_ns`, `end_ns`, indexed by group)."""
    marker = grouped[grouped["_r"].notna() & (grouped["_r"] == 1)].drop_duplicates("group_id")
    if marker.empty:
        return pd.DataFrame(columns=["start_ns", "end_ns"])
    candidates = grouped[["group_id", "plane", "line", "start_ns", "end_ns", "duration_ns"]].merge(
        marker[["group_id", "plane", "line", "start_ns", "end_ns"]].rename(
            columns={"start_ns": "marker_ns", "end_ns": "marker_end_ns"}
        ),
        on=["group_id", "plane", "line"],
    )
    holds = candidates[
        (candidates["start_ns"] <= candidates["marker_ns"]) & (candidates["end_ns"] >= candidates["marker_end_ns"])
    ]
    holds = holds.sort_values("duration_ns", ascending=False, kind="stable").drop_duplicates("group_id")
    return holds.set_index("group_id")[["start_ns", "end_ns"]]


def _keras_function_of(host: pd.DataFrame, events: pd.DataFrame) -> pd.Series:
    """The name of the Keras step function call (`train_function`, `test_function`, ...) that holds
    each event's start on its thread ('' where none does)."""
    pattern = re.compile(f"{keras_producer.TRAIN_FUNCTION.pattern}|{keras_producer.OTHER_FUNCTION.pattern}")
    return _enclosing_calls(host, events, pattern)["call"]


def _enclosing_calls(host: pd.DataFrame, events: pd.DataFrame, pattern: re.Pattern) -> pd.DataFrame:
    """Per event (same index), the call named by `pattern` that holds its start on its thread:
    `call` ('' where none does) and `call_end_ns` (NaN there)."""
    calls = host[matches(host["name"], pattern, search=True)]
    if calls.empty or events.empty:
        return pd.DataFrame(
            {
                "call": pd.Series("", index=events.index, dtype=object),
                "call_end_ns": pd.Series(np.nan, index=events.index),
            }
        )
    threads = {"plane": "int64", "line": "int64"}
    found = pd.merge_asof(
        events[["plane", "line", "start_ns"]].astype(threads).reset_index().sort_values("start_ns", kind="stable"),
        calls[["plane", "line", "start_ns", "end_ns", "name"]]
        .astype(threads)
        .rename(columns={"start_ns": "call_ns", "end_ns": "call_end_ns", "name": "call"})
        .sort_values("call_ns", kind="stable"),
        left_on="start_ns",
        right_on="call_ns",
        by=["plane", "line"],
        direction="backward",
    )
    inside = found["call_ns"].notna() & (found["start_ns"] < found["call_end_ns"])
    names = found["call"].astype(object).where(inside, "")
    ends = found["call_end_ns"].astype(float).where(inside)
    return pd.DataFrame(
        {
            "call": pd.Series(names.to_numpy(), index=found["index"].to_numpy()).reindex(events.index).fillna(""),
            "call_end_ns": pd.Series(ends.to_numpy(), index=found["index"].to_numpy()).reindex(events.index),
        }
    )


def _device_steps_line(view: TraceView) -> DetectedSteps | None:
    """Steps from the device plane with the most events on its `Steps` line."""
    on_device = view.on_device[lambda e: e["line_name"] == planes.STEPS_LINE]
    if on_device.empty:
        return None
    plane = on_device["plane"].value_counts().index[0]
    line = on_device[on_device["plane"] == plane].sort_values("start_ns", kind="stable")
    numbers = pd.to_numeric(line["name"].astype(str), errors="coerce")
    step_numbers = numbers.fillna(pd.Series(np.arange(len(line)), index=line.index)).astype("int64")
    steps = _frame(step_numbers, 1, "Steps", line["plane"], line["line"], line["start_ns"], line["end_ns"])
    return DetectedSteps(
        "trace_groups",
        f"Steps ({line['plane_name'].iloc[0]})",
        steps,
        steps[SPAN_COLUMNS].iloc[0:0].copy(),
        "steps are the device's own Steps line",
    )


def _cut_by_window(view: TraceView, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each span touches the traced window's first or last nanosecond: the profiler
    started or stopped inside it, so part of it is missing."""
    if len(starts) < 2:
        return np.zeros(len(starts), dtype=bool)
    first, last = view.window
    return (np.asarray(starts) <= first) | (np.asarray(ends) >= last)

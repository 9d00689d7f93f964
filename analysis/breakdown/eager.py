"""Ops executed eagerly: one at a time from Python, instead of inside a compiled `tf.function`.

TensorFlow's eager runtime records every call it runs from Python as `EagerLocalExecute: <name>`
(in every version from 2.4 on; newer ones add `EagerExecute` stats `eager_op` and `is_func`):
an op (`MatMul`, `LogicalAnd`) is eager work; a tf.function call names its concrete function
(`__inference_train_step_842`). The iterator's own ops (`IteratorGetNext`, `Optional...`) are
input, and left out of both.

Over the steady steps (from the first one's start to the last one's end, the gaps between them
included), `op_time_pct` is the eager ops' share of the host's op-execution time (eager ops plus
tf.function calls, each call whole: dispatch and the wait for its result included); `step_pct`
their share of that time, which is what the finding weighs.

`host_op_time_eager_pct` and `device_op_time_eager_pct` are the same shares on TensorFlow's
definition, as its overview page computes them from the trace (XProf's
`op_stats_to_overview_page.cc`, `ComputeAnalysisResult`): over the whole trace, the eager ops'
share of the self time of the host's op events (those its `ParseTfOpFullname` names an op:
"name:Type", tf.data's `Iterator::` stages, host memcpys; self time without the op events nested
in them on their thread), and of the time of the device's events that name an op (`tf_op`,
`level 0` in older traces). An op is eager where the event's `is_eager` stat says so, in a trace
grouped at capture (TensorFlow up to about 2.5, which wrote no `is_func`; with or without a step
found); else, as XProf's grouping decides it
(`EventNode::IsEager`), where the nearest `EagerExecute` above the op on its thread (above a
kernel's launch, for a kernel) has `is_func` 0. XProf keeps one flag per host op name (eager
where one of its events was) and per device op (the flag of its last kernel to appear, each
kernel's from its first event). NaN where no such op was recorded.

They differ from devprof's share: they weigh only the ops' own time, not the eager runtime's
Python-side dispatch around each call, and a tf.function's GPU ops count on the device, not on
the host; newer TensorFlow (2.21, for one) records no host op event for an eager op at all, so
its host share is then mostly tf.data's stages, and not eager.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis import producers
from analysis.producers import tensorflow as tf_producer
from analysis.read.view import NS_PER_MS, TraceView, matches, present, thread_nesting

EAGER_RE = re.compile(tf_producer.EAGER_EXECUTION)
FUNCTION_RE = re.compile(tf_producer.CONCRETE_FUNCTION)
ITERATOR_RE = re.compile(tf_producer.ITERATOR_OP)
HOST_OP_RE = re.compile(tf_producer.XPROF_HOST_OP)
TF_OP_RE = re.compile(tf_producer.XPROF_TF_OP)
EAGER_CALL_RE = re.compile(tf_producer.EAGER_CALL)
TOP_OPS = 3
CALL_FLOOR_PERCENTILE = 10


@dataclass(frozen=True)
class EagerOps:
    """Eager execution in the steady steps: shares, time per training step and the heaviest ops."""

    op_time_pct: float  # eager ops' share of host op-execution time (eager ops + tf.function calls)
    ms_per_step: float  # eager ops' time per training step
    step_pct: float  # of step time
    ops: tuple[tuple[str, float], ...]  # (op, ms per training step), heaviest first, at most TOP_OPS
    # TensorFlow's overview page's shares (module docstring); NaN where no such op was recorded.
    host_op_time_eager_pct: float = math.nan
    device_op_time_eager_pct: float = math.nan
    calls_per_step: float = math.nan  # eager op calls per training step
    # The eager runtime's cost of a call that does next to nothing (the 10th percentile of the calls'
    # durations): what each call pays that the op inside a compiled step does not.
    call_floor_ms: float = math.nan

    def as_dict(self) -> dict:
        return {
            "op_time_pct": self.op_time_pct,
            "ms_per_step": self.ms_per_step,
            "step_pct": self.step_pct,
            "calls_per_step": self.calls_per_step,
            "call_floor_ms": self.call_floor_ms,
            "ops": [{"op": op, "ms_per_step": ms} for op, ms in self.ops],
            "host_op_time_eager_pct": self.host_op_time_eager_pct,
            "device_op_time_eager_pct": self.device_op_time_eager_pct,
        }


def _op_names(names: pd.Series) -> pd.Series:
    """The op or function each `EagerLocalExecute: <name>` event ran (parsed once per distinct name)."""
    names = names.astype(str).astype("category")
    parsed = {name: found.group(1) for name in names.cat.categories if (found := EAGER_RE.match(str(name))) is not None}
    return names.map(parsed).astype(str)


def _stat(frame: pd.DataFrame, column: str) -> np.ndarray:
    """A numeric stat as floats, NaN where an event has none (all NaN where the table has no such column)."""
    if column not in frame:
        return np.full(len(frame), np.nan)
    return frame[column].astype("Float64").to_numpy(dtype=float, na_value=np.nan)


def _nearest(parent: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Each event's nearest ancestor among the `wanted` ones (-1: none): one step up per round."""
    found = np.full(parent.size, -1, dtype=np.int64)
    at = parent.copy()
    pending = np.flatnonzero(at >= 0)
    while pending.size:
        hit = wanted[at[pending]]
        found[pending[hit]] = at[pending[hit]]
        pending = pending[~hit]
        at[pending] = parent[at[pending]]
        pending = pending[at[pending] >= 0]
    return found


def _xprof_op_names(full: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """The op name XProf keys its op database on ("name" of "name:Type", else the whole event name) of
    each event, as a code into the distinct names, and those names; worked out per category, not per event."""
    if not isinstance(full.dtype, pd.CategoricalDtype):
        full = full.astype(str).astype("category")
    # A missing name reads "nan", as str() of it.
    by_category = [name.split(":", 1)[0] if TF_OP_RE.match(name) else name for name in map(str, full.cat.categories)]
    names, code = np.unique(np.array(by_category + ["nan"], dtype=object), return_inverse=True)
    return code.reshape(-1)[full.cat.codes.to_numpy()], names


def _host_share(self_ns: np.ndarray, eager: np.ndarray, name_codes: np.ndarray) -> float:
    """The share of `self_ns` in op names (`name_codes`, of `_xprof_op_names`) of which some event ran eagerly
    (XProf's host op database keeps one flag per name); NaN without any time."""
    total = int(self_ns.sum())
    if total <= 0:
        return math.nan
    eager_name = (np.bincount(name_codes, weights=eager.astype(np.float64)) > 0)[name_codes]
    return 100.0 * int(self_ns[eager_name].sum()) / total


def _device_share(ns: np.ndarray, eager: np.ndarray, names: np.ndarray, kernels: np.ndarray) -> float:
    """The share of `ns` in eager ops, flagged as XProf's device databases do: a (op, kernel) pair
    keeps its first event's flag, an op the flag of its last pair to appear. NaN without any time."""
    total = int(ns.sum())
    if total <= 0:
        return math.nan
    events = pd.DataFrame({"op": names, "kernel": kernels, "eager": eager, "at": np.arange(ns.size)})
    pairs = events.groupby(["op", "kernel"], sort=False).agg(eager=("eager", "first"), at=("at", "min"))
    last = pairs.sort_values("at", kind="stable").groupby(level="op", sort=False)["eager"].last()
    eager_op = last.reindex(names).to_numpy(dtype=bool)
    return 100.0 * int(ns[eager_op].sum()) / total


def tf_eager_shares(view: TraceView) -> tuple[float, float]:
    """TensorFlow's `host_op_time_eager_percent` and `device_op_time_eager_percent`, from the trace
    (module docstring); NaN where no host (device) op was recorded. Worked out once per view."""
    return view.query(_tf_eager_shares)


def _tf_eager_shares(view: TraceView) -> tuple[float, float]:
    host = view.host
    device = view.device.sort_values(["plane", "line"], kind="stable")  # XProf's order: planes, lines, events
    op_stat = (
        device["tf_op"].astype(object) if "tf_op" in device else pd.Series(pd.NA, index=device.index, dtype=object)
    )
    if "level 0" in device:
        op_stat = op_stat.where(present(op_stat), device["level 0"].astype(object))
    named = (op_stat.fillna("").astype(str) != "").to_numpy(dtype=bool)  # XProf skips an event whose op is ""
    kernels, op_stat = device[named], op_stat[named]
    # A trace grouped at capture keeps its `is_eager` stats; else XProf's grouping decides for the
    # "name:Type" ops and the kernels with a launch id, whatever their stat says.
    # TensorFlow up to about 2.5 grouped at capture and wrote `is_eager` whether or not it found a step
    # (no `group_id` then); it wrote no `is_func`, which XProf's own grouping needs.
    grouped = ("group_id" in view.events and bool(present(view.events["group_id"]).any())) or not (
        "is_func" in host and bool(present(host["is_func"]).any())
    )
    has_id = "correlation_id" in host
    wanted = (matches(host["name"], HOST_OP_RE) | matches(host["name"], EAGER_CALL_RE)).to_numpy()
    if has_id and not kernels.empty:
        wanted = wanted | present(host["correlation_id"])
    # The host's ops, the eager calls above them and the kernels' launches, nested per thread.
    used = [
        column
        for column in ("plane", "line", "name", "start_ns", "end_ns", "correlation_id", "is_func", "is_eager")
        if column in host
    ]  # not the copy of every column of most of the trace
    events, parent = thread_nesting(host.loc[wanted, used], enclosing=True)
    is_op, is_call = matches(events["name"], HOST_OP_RE).to_numpy(), matches(events["name"], EAGER_CALL_RE).to_numpy()
    is_launch = (present(events["correlation_id"]) if has_id else np.zeros(len(events), dtype=bool)) & ~is_op & ~is_call
    starts, ends = events["start_ns"].to_numpy(dtype=np.int64), events["end_ns"].to_numpy(dtype=np.int64)
    call = _nearest(parent, is_call)
    # Under an eager call that ran one op (a missing `is_func` reads as a tf.function, as in XProf).
    under_eager_op = np.zeros(len(events), dtype=bool)
    under_eager_op[call >= 0] = _stat(events, "is_func")[call[call >= 0]] == 0
    regrouped = ~grouped & matches(events["name"], TF_OP_RE).to_numpy()
    eager = np.where(regrouped, under_eager_op, np.nan_to_num(_stat(events, "is_eager")) != 0)
    within = _nearest(parent, is_op)
    duration = ends - starts
    children = np.zeros(len(events), dtype=np.int64)
    nested = is_op & (within >= 0)
    np.add.at(children, within[nested], duration[nested])
    self_ns = np.maximum(duration - children, 0)[is_op]
    host_pct = _host_share(self_ns, eager[is_op], _xprof_op_names(events["name"][is_op])[0])

    kernel_eager = np.nan_to_num(_stat(kernels, "is_eager")) != 0
    if not grouped and "correlation_id" in kernels:
        ids = kernels["correlation_id"].astype(object)
        with_id = present(ids)
        launch_ids = pd.Index(events.loc[is_launch, "correlation_id"].to_numpy(dtype=object))
        first = ~launch_ids.duplicated()
        at = launch_ids[first].get_indexer(ids[with_id].to_numpy(dtype=object))
        launched = (at >= 0) & under_eager_op[is_launch][first][np.clip(at, 0, None)]
        kernel_eager[with_id] = launched
    device_ns = kernels["end_ns"].to_numpy(dtype=np.int64) - kernels["start_ns"].to_numpy(dtype=np.int64)
    op_codes, op_names = _xprof_op_names(op_stat)
    device_pct = _device_share(device_ns, kernel_eager, op_names[op_codes], kernels["name"].astype(str).to_numpy())
    return host_pct, device_pct


def eager_ops(view: TraceView | None, steps: pd.DataFrame) -> EagerOps | None:
    """Eager execution inside `steps` (their `start_ns`, `end_ns`, `steps`); None without a trace,
    steps, or any eager call in them."""
    if view is None or steps.empty or view.host.empty:
        return None
    calls = view.host[matches(view.host["name"], EAGER_RE)]
    if calls.empty:
        return None
    op = _op_names(calls["name"])
    is_input = matches(op, ITERATOR_RE, search=True) | matches(op, producers.pattern("host_input"))
    is_function = matches(op, FUNCTION_RE, search=True)
    # The steady steps' stretch of the loop, gaps between steps included: an eager op the loop runs
    # after each compiled call (Keras' checks between `train_function` calls) lies between the
    # trace's step groups.
    starts = np.array([steps["start_ns"].min()], dtype=np.int64)
    ends = np.array([steps["end_ns"].max()], dtype=np.int64)
    eager = calls[~is_input & ~is_function]
    eager_spans = iv.union(eager["start_ns"].to_numpy(), eager["end_ns"].to_numpy())
    functions = calls[is_function]
    function_spans = iv.subtract(
        iv.union(functions["start_ns"].to_numpy(), functions["end_ns"].to_numpy()), eager_spans
    )
    eager_ns = int(iv.overlap(eager_spans, starts, ends).sum())
    if eager_ns <= 0:
        return None
    function_ns = int(iv.overlap(function_spans, starts, ends).sum())
    training_steps = float(steps["steps"].sum()) if "steps" in steps else float(len(steps))
    step_ns = int((ends - starts).sum())
    # The heaviest ops: each call that starts inside the stretch, whole.
    at = eager["start_ns"].to_numpy(dtype=np.int64)
    inside = (at >= starts[0]) & (at < ends[0])
    per_op = (
        eager[inside]
        .groupby(op[~is_input & ~is_function][inside].to_numpy())["duration_ns"]
        .sum()
        .sort_values(ascending=False, kind="stable")
    )
    top = tuple((str(name), float(ns) / NS_PER_MS / training_steps) for name, ns in per_op.head(TOP_OPS).items())
    durations = eager["duration_ns"].to_numpy(dtype=np.int64)[inside]
    floor_ms = float(np.percentile(durations, CALL_FLOOR_PERCENTILE)) / NS_PER_MS if durations.size else math.nan
    host_pct, device_pct = tf_eager_shares(view)
    return EagerOps(
        op_time_pct=100.0 * eager_ns / (eager_ns + function_ns),
        ms_per_step=eager_ns / NS_PER_MS / training_steps,
        step_pct=100.0 * eager_ns / step_ns if step_ns > 0 else 0.0,
        ops=top,
        host_op_time_eager_pct=host_pct,
        device_op_time_eager_pct=device_pct,
        calls_per_step=durations.size / training_steps,
        call_floor_ms=floor_ms,
    )

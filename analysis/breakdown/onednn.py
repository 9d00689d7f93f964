"""Which of oneDNN's implementations ran each CPU op: its primitive executions (oneDNN's own log,
`analysis.read.onednn_log`) laid on the trace's TensorFlow op events by time.

oneDNN stamps each execution with its start and duration but not the op or thread that ran it.
A thread runs one thing at a time, so on each thread the op running at an instant is the
innermost op event that holds it; an execution goes to the op, over all threads, that holds it
whole (its start and its end, within `END_SLACK_NS`), the innermost first, else to one that
holds its start. An execution no op holds (oneDNN work outside the traced ops, or outside the
capture) is left out. Per op, the primitive with the most time is its main one, and the
implementation that ran that primitive names the op's kernel.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.producers import matches
from analysis.read.view import TraceView, thread_nesting
from analysis.steps.host import TF_OP_RE

IMPLEMENTATION_COLUMNS = ["op", "type", "primitive", "implementation", "primitive_ms_per_step", "onednn_ms_per_step"]
# The trace's clock and oneDNN's stamps (microseconds) are read apart: an execution may seem to end
# this much after the op that ran it.
END_SLACK_NS = 50_000


def _empty() -> pd.DataFrame:
    return pd.DataFrame(
        {c: pd.Series(dtype=float if c.endswith("_per_step") else object) for c in IMPLEMENTATION_COLUMNS}
    )


def _op_events(view: TraceView) -> pd.DataFrame:
    """TensorFlow op events on host threads ("scope/name:Type"), sorted by thread, start, longest
    first, with `parent`: the row of the op event that holds it on its thread (-1: none)."""
    host = view.host
    ops, parent = thread_nesting(host[matches(host["name"], TF_OP_RE)])
    threads = (ops["plane"].to_numpy(dtype=np.int64) << 32) + ops["line"].to_numpy(dtype=np.int64)
    return pd.DataFrame(
        {
            "name": ops["name"].astype(str).to_numpy(dtype=object),
            "thread": threads,
            "start_ns": ops["start_ns"].to_numpy(dtype=np.int64),
            "end_ns": ops["end_ns"].to_numpy(dtype=np.int64),
            "parent": parent,
        }
    )


def _innermost(events: pd.DataFrame, at: np.ndarray) -> np.ndarray:
    """Per thread (rows of the result) and instant in `at` (columns), the row of `events` of the
    innermost op event on that thread holding the instant; -1 where none does."""
    threads = np.unique(events["thread"].to_numpy())
    out = np.full((threads.size, at.size), -1, dtype=np.int64)
    starts, ends = events["start_ns"].to_numpy(), events["end_ns"].to_numpy()
    parent, thread_of = events["parent"].to_numpy(), events["thread"].to_numpy()
    for k, thread in enumerate(threads):
        rows = np.flatnonzero(thread_of == thread)  # sorted by start: events are sorted by thread, start
        found = np.searchsorted(starts[rows], at, side="right") - 1
        row = np.where(found >= 0, rows[np.clip(found, 0, None)], -1)
        # The last op to start before the instant may have ended: the one holding the instant, if
        # any, holds that op too (a thread's events nest), so walk up its parents.
        while True:
            ended = (row >= 0) & (ends[np.clip(row, 0, None)] <= at)
            if not ended.any():
                break
            row = np.where(ended, parent[np.clip(row, 0, None)], row)
        out[k] = row
    return out


def op_implementations(view: TraceView, steps: pd.DataFrame, executions: pd.DataFrame | None) -> pd.DataFrame:
    """One row per op (name and type) that ran oneDNN primitives inside `steps`: its main primitive
    (the one with the most time), the implementation that ran it, that primitive's and all
    primitives' oneDNN time per training step. `executions` are on the trace's clock
    (`start_ns`, `end_ns`, `ms`, `primitive`, `implementation`)."""
    if executions is None or executions.empty or steps.empty:
        return _empty()
    events = _op_events(view)
    if events.empty:
        return _empty()
    order = np.argsort(executions["start_ns"].to_numpy(dtype=np.int64), kind="stable")
    executions = executions.iloc[order].reset_index(drop=True)
    start = executions["start_ns"].to_numpy(dtype=np.int64)
    end = executions["end_ns"].to_numpy(dtype=np.int64)
    held = _innermost(events, start)  # threads x executions
    safe = np.clip(held, 0, None)
    ev_start, ev_end = events["start_ns"].to_numpy(), events["end_ns"].to_numpy()
    whole = (held >= 0) & (ev_end[safe] + END_SLACK_NS >= end)
    length = np.where(held >= 0, ev_end[safe] - ev_start[safe], np.iinfo(np.int64).max)
    # the op that holds the execution whole, the shortest (innermost) first; else any that holds its start
    rank = np.where(
        whole, length, np.where(held >= 0, np.iinfo(np.int64).max // 2 + length // 2, np.iinfo(np.int64).max)
    )
    best = np.argmin(rank, axis=0) if held.size else np.zeros(0, dtype=np.int64)
    chosen = held[best, np.arange(start.size)] if start.size else np.zeros(0, dtype=np.int64)
    ran = chosen >= 0
    # only the ops of the steps asked for (their events start inside one)
    step_starts = np.sort(steps["start_ns"].to_numpy(dtype=np.int64))
    step_ends = steps["end_ns"].to_numpy(dtype=np.int64)[np.argsort(steps["start_ns"].to_numpy(dtype=np.int64))]
    op_start = ev_start[np.clip(chosen, 0, None)]
    index = np.searchsorted(step_starts, op_start, side="right") - 1
    ran &= (index >= 0) & (op_start < step_ends[np.clip(index, 0, None)])
    if not ran.any():
        return _empty()
    names = events["name"].to_numpy(dtype=object)[chosen[ran]]
    split = [str(name).rpartition(":") for name in names]
    table = pd.DataFrame(
        {
            "op": [s[0] for s in split],
            "type": [s[2] for s in split],
            "primitive": executions.loc[ran, "primitive"].astype(str).to_numpy(dtype=object),
            "implementation": executions.loc[ran, "implementation"].astype(str).to_numpy(dtype=object),
            "ms": executions.loc[ran, "ms"].to_numpy(dtype=float),
        }
    )
    training_steps = float(steps["steps"].sum()) if "steps" in steps else float(len(steps))
    per = table.groupby(["op", "type", "primitive", "implementation"], sort=False)["ms"].sum().reset_index()
    by_primitive = per.groupby(["op", "type", "primitive"], sort=False)["ms"].sum().rename("primitive_ms").reset_index()
    total = per.groupby(["op", "type"], sort=False)["ms"].sum().rename("onednn_ms").reset_index()
    main = by_primitive.sort_values("primitive_ms", ascending=False, kind="stable").drop_duplicates(["op", "type"])
    # the implementation that ran most of the main primitive's time
    impl = (
        per.merge(main[["op", "type", "primitive"]], on=["op", "type", "primitive"])
        .sort_values("ms", ascending=False, kind="stable")
        .drop_duplicates(["op", "type"])
    )
    out = main.merge(impl[["op", "type", "implementation"]], on=["op", "type"]).merge(total, on=["op", "type"])
    out["primitive_ms_per_step"] = out["primitive_ms"] / training_steps
    out["onednn_ms_per_step"] = out["onednn_ms"] / training_steps
    return out[IMPLEMENTATION_COLUMNS].reset_index(drop=True)

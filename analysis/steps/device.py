"""Each device's own steps: its work grouped by the trace's grouping, never cut by host intervals.

A device runs asynchronously: its k-th program can run while the host is in step k+1 or
later, so the host's step intervals say nothing about which device work belongs to which
step. Each device event is given to exactly one step by the first grouping the trace has
for that device:

1. `group_id` stats on device events (XProf's event grouping), matched to the host step
   whose events carry the same group;
2. the device's own `Steps` line (an event per step on the device's clock);
3. the device's `XLA Modules` line: the k-th execution of the step's program is step k;
4. launches: a kernel's `correlation_id` names the host API call that launched it, and the
   host step that made that call owns the kernel;
5. else the host step in which the event starts (said so in `grouping`).

A device step then spans its own events, first start to last end (as XProf's device `Steps`
line does), and is cut exactly into compute + collective + copy + input + idle, in that
priority (a copy or collective hidden under compute costs nothing). Host-to-device copies
that compute hides are `input_overlapped_ms`: prefetching that worked, not time waited for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.producers import planes as plane_names
from analysis.producers import tpu as tpu_producer
from analysis.read.view import TraceView

GROUPINGS = ("group_id", "steps_line", "programs", "launches", "host_intervals")
PART_ORDER = ("compute", "collective", "copy", "input")


@dataclass(frozen=True)
class Grouping:
    """A device's work in its own steps: `labels` names each event's device step (-1: none);
    `position_of` maps a device step to the position in the analysis' steps it belongs to (-1:
    none; several device steps can belong to one host step); `spans` holds the device's own
    step events (`Steps`, `XLA Modules`) by label where it has them."""

    name: str
    labels: np.ndarray
    position_of: pd.Series
    spans: pd.DataFrame | None = None


def assign_steps(device: pd.DataFrame, view: TraceView, steps: pd.DataFrame) -> Grouping:
    """How one device plane's events fall into its own steps. `steps` has `step`, `start_ns`,
    `end_ns`, `marker_end_ns` and `name`."""
    if device.empty or steps.empty:
        return Grouping("none", np.full(len(device), -1, dtype=np.int64), pd.Series(dtype="int64"))
    for assign in (_by_group_id, _by_steps_line, _by_programs, _by_launches):
        found = assign(device, view, steps)
        if found is not None:
            return found
    positions = _containing_step(steps, device["start_ns"].to_numpy(dtype=np.int64))
    return Grouping("host_intervals", positions, _identity(steps))


def _identity(steps: pd.DataFrame) -> pd.Series:
    return pd.Series(np.arange(len(steps)), index=np.arange(len(steps)))


def _spans(line: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {"start_ns": line["start_ns"].to_numpy(dtype=np.int64), "end_ns": line["end_ns"].to_numpy(dtype=np.int64)},
        index=np.arange(len(line)),
    )


def _containing_step(steps: pd.DataFrame, at: np.ndarray, end: str = "end_ns") -> np.ndarray:
    """Position of the step whose [start, `end`) holds each time, -1 where none does."""
    order = np.argsort(steps["start_ns"].to_numpy(dtype=np.int64), kind="stable")
    starts = steps["start_ns"].to_numpy(dtype=np.int64)[order]
    ends = np.maximum.accumulate(steps[end].to_numpy(dtype=np.int64)[order])
    index = np.searchsorted(starts, at, side="right") - 1
    valid = index >= 0
    valid[valid] = at[valid] < ends[index[valid]]
    return np.where(valid, order[np.clip(index, 0, None)], -1)


def _by_number(steps: pd.DataFrame, numbers: np.ndarray) -> np.ndarray:
    """Position of the step numbered `numbers` (-1 where no step has that number)."""
    lookup = pd.Series(np.arange(len(steps)), index=steps["step"].to_numpy()).groupby(level=0).first()
    return lookup.reindex(numbers).fillna(-1).to_numpy(dtype=np.int64)


def _by_group_id(device, view, steps):
    groups = pd.to_numeric(device["group_id"], errors="coerce")
    if groups.notna().mean() < 0.5:
        return None
    labels = groups.fillna(-1).to_numpy(dtype=np.int64)
    known = np.unique(labels[labels >= 0])
    if str(steps["name"].iloc[0]) == "group_id":  # the steps are the groups themselves
        position_of = pd.Series(_by_number(steps, known), index=known)
    else:
        host = view.host
        host = host[host["group_id"].notna()]
        if host.empty:
            return None
        first = host.groupby("group_id")["start_ns"].min()
        first.index = first.index.astype(np.int64)
        group_step = pd.Series(_containing_step(steps, first.to_numpy(dtype=np.int64)), index=first.index)
        position_of = group_step.reindex(known).fillna(-1).astype(np.int64)
    return Grouping("group_id", labels, position_of) if (position_of >= 0).any() else None


def _own_line(device, view, line_name):
    return view.device_line(device["plane"].iloc[0], line_name)


def _inside(spans: pd.DataFrame, at: np.ndarray) -> np.ndarray:
    """Index (0..len(spans)-1) of the span of `spans` holding each time, -1 for none."""
    starts = spans["start_ns"].to_numpy(dtype=np.int64)
    ends = spans["end_ns"].to_numpy(dtype=np.int64)
    index = np.searchsorted(starts, at, side="right") - 1
    valid = index >= 0
    valid[valid] = at[valid] < ends[index[valid]]
    return np.where(valid, index, -1)


def _by_steps_line(device, view, steps):
    line = _own_line(device, view, plane_names.STEPS_LINE)
    if line.empty:
        return None
    which = _inside(line, device["start_ns"].to_numpy(dtype=np.int64))
    numbers = pd.to_numeric(line["name"].astype(str), errors="coerce")
    if numbers.notna().all() and set(numbers.astype("int64")) & set(steps["step"]):
        positions = _by_number(steps, numbers.astype("int64").to_numpy())
    else:  # unnumbered: the k-th Steps event is the step whose span holds its start
        positions = _containing_step(steps, line["start_ns"].to_numpy(dtype=np.int64))
    position_of = pd.Series(positions, index=np.arange(len(line)))
    return (
        Grouping("steps_line", which, position_of, _spans(line))
        if (positions[np.unique(which[which >= 0])] >= 0).any()
        else None
    )


def _by_programs(device, view, steps):
    """The device's `XLA Modules` line: the k-th execution of the step's program (by its name, with
    or without XProf's "(program id)" suffix; else the program the device ran most often) is the
    k-th step, in order on the device's own clock. Executions that ended before the first step
    began belong to none; with one step (the window), every execution is in it."""
    modules = _own_line(device, view, tpu_producer.PROGRAM_LINE)
    if modules.empty:
        return None
    names = modules["name"].astype(str)
    step_name = str(steps["name"].iloc[0])
    order = np.argsort(steps["start_ns"].to_numpy(dtype=np.int64), kind="stable")
    if len(steps) == 1:
        program, positions = modules, np.zeros(len(modules), dtype=np.int64)
    else:
        program = modules[(names == step_name) | (names.str.replace(r"\(\d+\)$", "", regex=True) == step_name)]
        if program.empty:
            program = modules[names == names.value_counts().index[0]]
        program = program[program["end_ns"].to_numpy(dtype=np.int64) > int(steps["start_ns"].min())]
        positions = np.full(len(program), -1, dtype=np.int64)
        count = min(len(program), len(steps))
        positions[:count] = order[:count]
    if program.empty:
        return None
    which = _inside(program, device["start_ns"].to_numpy(dtype=np.int64))
    position_of = pd.Series(positions, index=np.arange(len(program)))
    return Grouping("programs", which, position_of, _spans(program)) if (which >= 0).any() else None


def _by_launches(device, view, steps):
    if "correlation_id" not in device or device["correlation_id"].isna().all():
        return None
    host = view.host
    calls = host[host["correlation_id"].notna()]  # the runtime and driver API calls that enqueued device work
    if calls.empty:
        return None
    launched_at = calls.groupby(calls["correlation_id"].astype(str))["start_ns"].min()
    at = launched_at.reindex(device["correlation_id"].astype(str).to_numpy())
    found = np.full(len(device), -1, dtype=np.int64)
    known = at.notna().to_numpy()
    if known.mean() < 0.5:
        return None
    # Launched inside the step's own call (its marker, its program execution), not merely between
    # two steps: other programs run between the executions of a microbenchmark's step.
    end = "marker_end_ns" if "marker_end_ns" in steps else "end_ns"
    found[known] = _containing_step(steps, at.to_numpy()[known].astype(np.int64), end)
    return Grouping("launches", found, _identity(steps))


def disjoint_parts(parts: dict[str, iv.Intervals]) -> dict[str, iv.Intervals]:
    """compute > collective > copy > input: each part keeps only what no earlier part covers."""
    taken = iv.empty()
    out = {}
    for name in PART_ORDER:
        out[name] = iv.subtract(parts[name], taken)
        taken = iv.union_of(taken, out[name])
    out["busy"] = taken
    return out


def per_step_parts(
    device: pd.DataFrame, labels: np.ndarray, parts_of, host_input: iv.Intervals, own_spans: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per step position the device ran in: its own span (its `Steps` or program event
    where `own_spans` has one, widened to hold all its events) and exact parts, in ns.

    Steps are laid end to end on a shifted clock (each step's events moved into its own slot)
    so the interval arithmetic of every step runs at once, in integers."""
    mine = labels >= 0
    device, labels = device[mine], labels[mine]
    # Dense slot numbers for the arithmetic below (labels can be large group ids).
    slots, position = np.unique(labels, return_inverse=True)
    position = position.astype(np.int64)
    if own_spans is not None:
        own_spans = own_spans.reindex(slots).set_axis(np.arange(len(slots)))
    if device.empty:
        return pd.DataFrame(
            columns=[
                "position",
                "start_ns",
                "end_ns",
                "span_ns",
                *[f"{p}_ns" for p in PART_ORDER],
                "input_overlapped_ns",
                "idle_ns",
                "idle_input_ns",
                "label",
            ]
        )
    starts = device["start_ns"].to_numpy(dtype=np.int64)
    ends = device["end_ns"].to_numpy(dtype=np.int64)
    origin = int(starts.min())
    slot = int(ends.max() - origin) + 1
    shift = position.astype(np.int64) * slot - origin
    frame = pd.DataFrame({"position": position, "start_ns": starts, "end_ns": ends})
    spans = frame.groupby("position").agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    if own_spans is not None:
        declared = own_spans.reindex(spans.index)
        spans["start_ns"] = np.minimum(spans["start_ns"], declared["start_ns"].fillna(spans["start_ns"])).astype(
            np.int64
        )
        spans["end_ns"] = np.maximum(spans["end_ns"], declared["end_ns"].fillna(spans["end_ns"])).astype(np.int64)
        origin = min(origin, int(spans["start_ns"].min()))
        slot = int(max(int(ends.max()), int(spans["end_ns"].max())) - origin) + 1
        shift = position.astype(np.int64) * slot - origin
    window_starts = spans["start_ns"].to_numpy(dtype=np.int64) + spans.index.to_numpy(dtype=np.int64) * slot - origin
    window_ends = spans["end_ns"].to_numpy(dtype=np.int64) + spans.index.to_numpy(dtype=np.int64) * slot - origin
    shifted = device.assign(start_ns=starts + shift, end_ns=ends + shift)
    raw = parts_of(shifted)
    disjoint = disjoint_parts(raw)
    out = spans.reset_index()
    out["span_ns"] = out["end_ns"] - out["start_ns"]
    for name in PART_ORDER:
        out[f"{name}_ns"] = iv.overlap(disjoint[name], window_starts, window_ends)
    out["input_overlapped_ns"] = iv.overlap(raw["input"], window_starts, window_ends) - out["input_ns"]
    busy = iv.overlap(disjoint["busy"], window_starts, window_ends)
    out["idle_ns"] = out["span_ns"] - busy
    # Idle while the host waited for its batch: each idle piece back on the trace's own clock.
    idle = iv.subtract(iv.union(window_starts, window_ends), disjoint["busy"])
    slot_of = idle[0] // slot
    back = slot_of * slot - origin
    waited = iv.overlap(host_input, idle[0] - back, idle[1] - back)
    by_position = pd.Series(waited).groupby(slot_of).sum()
    idle_input = by_position.reindex(out["position"].to_numpy()).fillna(0).to_numpy(dtype=np.int64)
    out["idle_input_ns"] = idle_input
    assert (out["idle_ns"] >= 0).all()
    assert (out[[f"{p}_ns" for p in PART_ORDER]].sum(axis=1) + out["idle_ns"] == out["span_ns"]).all()
    out["label"] = slots[out["position"].to_numpy(dtype=np.int64)]
    return out

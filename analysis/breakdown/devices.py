"""One row per device plane: each step from the device's own side, and the host's launch cost.

Device work is grouped into the device's own steps (`analysis.device_steps`: the trace's
grouping, never the host's step intervals); a row holds the means over the analysis' steady
steps in which the device ran: its own step span, cut exactly into compute + input + copy +
collective + idle. Idle is split by cause where the trace can tell: `idle_input_ms` while the
host waits for its batch, `idle_host_ms` the rest (launch, Python, synchronisation). A device
plane with no events, or whose events stop while the host still launches work, is not
recorded: `recorded` false, its parts null, never "idle".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis.read.view import NS_PER_MS, TraceView, device_parts, is_device_plane
from analysis.steps.device import assign_steps, per_step_parts

DEVICE_PARTS = ("compute", "input", "copy", "collective", "idle")
MEAN_KEYS = (
    "step_ms",
    "compute_ms",
    "input_ms",
    "input_wait_ms",
    "input_copy_ms",
    "copy_ms",
    "collective_ms",
    "idle_ms",
    "idle_input_ms",
    "idle_host_ms",
    "input_overlapped_ms",
)
ROW_KEYS = [
    "device",
    "host",
    "recorded",
    "grouping",
    "step_count",
    "step_ms",
    "compute_ms",
    "input_ms",
    "idle_ms",
    "copy_ms",
    "collective_ms",
    "idle_input_ms",
    "idle_host_ms",
    "input_overlapped_ms",
    "outside_steps_ms",
    "idle",
    "input_wait_ms",
    "input_copy_ms",
]


def device_rows(
    view: TraceView, steps: pd.DataFrame, used: pd.DataFrame, host: str = "", step_name: str = ""
) -> tuple[list[dict], list[str]]:
    """(one dict per GPU/TPU plane, notes on devices whose activity was not recorded)."""
    rows, notes, _ = _device_rows(view, steps, used, host, step_name)
    return rows, notes


def _device_rows(
    view: TraceView, steps: pd.DataFrame, used: pd.DataFrame, host: str = "", step_name: str = ""
) -> tuple[list[dict], list[str], list[pd.Series]]:
    """(one dict per GPU/TPU plane, notes on devices whose activity was not recorded, each recorded
    plane's compute ns per step position of `steps`).

    `steps` are all the analysis' steps (device work is assigned among them), `used` the
    steady complete ones its means are over; the rest of the device's busy time is
    `outside_steps_ms` (in ms over the whole window)."""
    activity = view.device
    host_input = view.input_intervals
    steps = steps.reset_index(drop=True).assign(name=step_name)
    used_positions = np.flatnonzero(
        steps["start_ns"].isin(used["start_ns"]).to_numpy() & steps["step"].isin(used["step"]).to_numpy()
    )
    complete = (
        np.flatnonzero(~steps["partial"].astype(bool).to_numpy()) if "partial" in steps else np.arange(len(steps))
    )
    launches = view.launches["start_ns"].to_numpy(dtype=np.int64)
    rows, notes, empty, computed = [], [], [], []
    for plane_id, plane_name in _device_planes(view.planes):
        own = activity[activity["plane"] == plane_id].reset_index(drop=True)
        row = {"device": plane_name, "host": host, "recorded": False, "grouping": None, "step_count": 0, "idle": None}
        row.update({key: math.nan for key in (*MEAN_KEYS, "outside_steps_ms")})
        if own.empty:
            empty.append(plane_name)
            rows.append({key: row[key] for key in ROW_KEYS})
            continue
        stop = int(own["end_ns"].max())
        if len(used_positions) and stop < int(steps["start_ns"].iloc[used_positions[-1]]) and (launches > stop).any():
            notes.append(
                f"{plane_name}: device activity not recorded after {(stop - int(steps['start_ns'].min())) / NS_PER_MS:.1f}"
                " ms into the window while the host kept launching work (the tracer stopped or dropped events): "
                "its parts are left out; " + NOT_RECORDED_FIX
            )
            rows.append({key: row[key] for key in ROW_KEYS})
            continue
        grouping = assign_steps(own, view, steps)
        per_step = per_step_parts(own, grouping.labels, device_parts, host_input, grouping.spans)
        # Several device steps may belong to one host step (a device Steps line finer than the markers).
        host_position = grouping.position_of.reindex(per_step["label"].to_numpy()).fillna(-1).to_numpy()
        mine = per_step[np.isin(host_position, used_positions)]
        computed.append(
            pd.Series(per_step["compute_ns"].to_numpy(dtype=float), index=host_position.astype(np.int64))
            .groupby(level=0)
            .sum()
            .reindex(np.arange(len(steps)), fill_value=0.0)
        )
        row.update(recorded=True, grouping=grouping.name, step_count=int(len(mine)), idle=False)
        if len(mine):
            ms = lambda column: float(mine[column].mean()) / NS_PER_MS  # noqa: E731
            # A device's input is its host-to-device copies (and infeed) that compute does not hide: all copy.
            row.update(
                step_ms=ms("span_ns"),
                compute_ms=ms("compute_ns"),
                input_ms=ms("input_ns"),
                input_wait_ms=0.0,
                input_copy_ms=ms("input_ns"),
                copy_ms=ms("copy_ns"),
                collective_ms=ms("collective_ns"),
                idle_ms=ms("idle_ns"),
                idle_input_ms=ms("idle_input_ns"),
                idle_host_ms=ms("idle_ns") - ms("idle_input_ns"),
                input_overlapped_ms=ms("input_overlapped_ns"),
            )
        event_position = grouping.position_of.reindex(grouping.labels).fillna(-1).to_numpy()
        outside = own[~np.isin(event_position, complete)]
        row["outside_steps_ms"] = (
            iv.total(iv.union(outside["start_ns"].to_numpy(), outside["end_ns"].to_numpy())) / NS_PER_MS
        )
        rows.append({key: row[key] for key in ROW_KEYS})
    if empty:
        named = ", ".join(empty) if len(empty) <= 3 else f"{empty[0]} ... {empty[-1]}"
        if len(empty) == len(rows):
            notes.insert(
                0,
                f"device activity not recorded: {named} ha{'s' if len(empty) == 1 else 've'} no events, so "
                "the device side of the steps is unknown (not idle) and stays out of the verdict; " + NOT_RECORDED_FIX,
            )
        else:
            notes.append(
                f"{len(empty)} device plane{'s' if len(empty) > 1 else ''} without events ({named}): not "
                "recorded, shown as unknown (a device this program did not use, or one the tracer missed)"
            )
    return rows, notes, computed


NOT_RECORDED_FIX = (
    "the GPU tracer needs CUPTI access (run as root, or allow profiling by non-admin users: "
    "NVreg_RestrictProfilingToAdminUsers=0) and a CUPTI that matches the driver; check that "
    "--device-tracer-level is 1 and the trace window holds the training steps"
)


def _device_planes(planes: pd.DataFrame) -> list[tuple[int, str]]:
    """(plane index, name) of every GPU/TPU plane in the trace, with or without events, in device order."""
    names = planes["plane_name"].astype(str)
    planes = planes[names.map(is_device_plane)]
    found = ((int(p), str(n)) for p, n in zip(planes["plane"], planes["plane_name"]))
    return sorted(found, key=lambda plane: _device_order(plane[1]))


def _device_order(name: str):
    digits = "".join(ch if ch.isdigit() else " " for ch in name).split()
    return (name.rstrip("0123456789"), int(digits[-1]) if digits else 0)


def kernel_launch(view: TraceView, steps: pd.DataFrame) -> dict:
    """Host launch API calls (CUDA/HIP) in the steps: how many, and their time per step."""
    launches = view.launches
    if launches.empty or not len(steps):
        return {"calls": 0, "calls_per_step": 0.0, "ms_per_step": 0.0}
    starts = steps["start_ns"].to_numpy(dtype=np.int64)
    ends = steps["end_ns"].to_numpy(dtype=np.int64)
    inside = launches[(launches["start_ns"] >= starts.min()) & (launches["start_ns"] < ends.max())]
    busy = iv.union(inside["start_ns"].to_numpy(), inside["end_ns"].to_numpy())
    per_step_ns = iv.overlap(busy, starts, ends)
    return {
        "calls": int(len(inside)),
        "calls_per_step": len(inside) / len(steps),
        "ms_per_step": float(per_step_ns.mean()) / NS_PER_MS,
    }


@dataclass(frozen=True)
class DeviceTable:
    """The device rows of one trace (`ROW_KEYS`), notes on devices not recorded, the host's launch
    cost, the busiest recorded device's mean step (the device step beside the host's), and `work`:
    each step's device work, the most any recorded device computed in its own step (ms, indexed as
    the steps; None without a recorded device)."""

    rows: pd.DataFrame
    notes: tuple[str, ...] = ()
    kernel_launch: dict | None = None
    busiest_step_ms: float = math.nan
    work: pd.Series | None = None

    @property
    def recorded(self) -> bool | None:
        """Whether any device plane recorded activity (None: the trace has no device plane)."""
        return bool(self.rows["recorded"].any()) if len(self.rows) else None


def device_table(view: TraceView | None, steps: pd.DataFrame, used: pd.DataFrame, step_name: str) -> DeviceTable:
    """`device_rows` and the launch cost over the `used` steps (empty without a trace)."""
    if view is None:
        return DeviceTable(pd.DataFrame([], columns=ROW_KEYS))
    rows, notes, computed = _device_rows(view, steps, used, view.hostnames[0] if view.hostnames else "", step_name)
    recorded = [row for row in rows if row["recorded"] and row["step_count"]]
    busiest = max(recorded, key=lambda row: row["compute_ms"])["step_ms"] if recorded else math.nan
    # A step waits for its slowest device: its device work is the most any device did in it.
    work = pd.Series(np.max(computed, axis=0) / NS_PER_MS, index=steps.index) if computed else None
    return DeviceTable(
        pd.DataFrame(rows, columns=ROW_KEYS), tuple(notes), kernel_launch(view, used) if rows else None, busiest, work
    )

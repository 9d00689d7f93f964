"""One row per device plane: each step cut from the device's side, and the host's launch cost.

On a device a step is compute + input + copy + collective + idle, exactly: its own
activity (`events.device_events`) split by `steps.device_parts`, made disjoint in the
order compute > collective > copy > input (a copy or collective hidden under compute
costs nothing), and the rest is idle. Idle is split by cause where the trace can tell:
`idle_input_ms` while the host waits for its batch, `idle_host_ms` the rest (launch,
Python, synchronisation). Device planes without events are listed as idle.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import intervals as iv
from analysis import producers
from analysis.events import NS_PER_MS, device_events, host_events, is_device_plane, matches
from analysis.steps import device_parts, input_intervals

DEVICE_PARTS = ("compute", "input", "copy", "collective", "idle")
ROW_KEYS = ["device", "host", "step_count", "step_ms", "compute_ms", "input_ms", "idle_ms", "copy_ms",
            "collective_ms", "idle_input_ms", "idle_host_ms", "idle"]


def disjoint_parts(parts: dict[str, iv.Intervals]) -> dict[str, iv.Intervals]:
    """compute > collective > copy > input: each part keeps only what no earlier part covers."""
    taken = iv.empty()
    out = {}
    for name in ("compute", "collective", "copy", "input"):
        out[name] = iv.subtract(parts[name], taken)
        taken = iv.union_of(taken, out[name])
    out["busy"] = taken
    return out


def device_steps(device: pd.DataFrame, steps: pd.DataFrame, host_input: iv.Intervals) -> pd.DataFrame:
    """Per step of `steps` (global `start_ns`/`end_ns`), this device's parts in ms."""
    parts = disjoint_parts(device_parts(device))
    starts = steps["start_ns"].to_numpy(dtype=np.int64)
    ends = steps["end_ns"].to_numpy(dtype=np.int64)
    frame = pd.DataFrame({"step": steps["step"].to_numpy(), "step_ms": (ends - starts) / NS_PER_MS})
    busy_ns = iv.overlap(parts["busy"], starts, ends)
    for name in ("compute", "collective", "copy", "input"):
        frame[f"{name}_ms"] = iv.overlap(parts[name], starts, ends) / NS_PER_MS
    idle = iv.subtract(iv.union(starts, ends), parts["busy"])
    idle_ns = (ends - starts) - busy_ns
    idle_input_ns = iv.overlap(iv.intersect(idle, host_input), starts, ends)
    frame["idle_ms"] = idle_ns / NS_PER_MS
    frame["idle_input_ms"] = idle_input_ns / NS_PER_MS
    frame["idle_host_ms"] = (idle_ns - idle_input_ns) / NS_PER_MS
    frame["active"] = busy_ns > 0
    assert (idle_ns >= 0).all()
    return frame


def device_rows(events: pd.DataFrame, planes: pd.DataFrame, steps: pd.DataFrame, host: str = "") -> list[dict]:
    """One dict per GPU/TPU plane (planes without events: `step_count` 0 and `idle` true).

    Means are over the steps in which the device did anything (`step_count`)."""
    activity = device_events(events)
    host_input = input_intervals(events)
    rows = []
    for plane_id, plane_name in _device_planes(planes):
        own = activity[activity["plane"] == plane_id]
        row = {"device": plane_name, "host": host, "step_count": 0, "idle": True}
        row.update({f"{part}_ms": 0.0 for part in ("step", *DEVICE_PARTS)})
        row.update(idle_input_ms=0.0, idle_host_ms=0.0)
        if not own.empty and len(steps):
            per_step = device_steps(own, steps, host_input)
            active = per_step[per_step["active"]]
            if not active.empty:
                row.update({key: float(active[key].mean()) for key in
                            ("step_ms", "compute_ms", "input_ms", "copy_ms", "collective_ms", "idle_ms",
                             "idle_input_ms", "idle_host_ms")})
                row.update(step_count=int(len(active)), idle=False)
        rows.append({key: row[key] for key in ROW_KEYS})
    return rows


def _device_planes(planes: pd.DataFrame) -> list[tuple[int, str]]:
    """(plane index, name) of every GPU/TPU plane in the trace, with or without events, in device order."""
    names = planes["plane_name"].astype(str)
    planes = planes[names.map(is_device_plane)]
    found = ((int(p), str(n)) for p, n in zip(planes["plane"], planes["plane_name"]))
    return sorted(found, key=lambda plane: _device_order(plane[1]))


def _device_order(name: str):
    digits = "".join(ch if ch.isdigit() else " " for ch in name).split()
    return (name.rstrip("0123456789"), int(digits[-1]) if digits else 0)


def kernel_launch(events: pd.DataFrame, steps: pd.DataFrame) -> dict:
    """Host launch API calls (CUDA/HIP) in the steps: how many, and their time per step."""
    host = host_events(events)
    launches = host[matches(host["name"], producers.pattern("launch"))]
    if launches.empty or not len(steps):
        return {"calls": 0, "calls_per_step": 0.0, "ms_per_step": 0.0}
    starts = steps["start_ns"].to_numpy(dtype=np.int64)
    ends = steps["end_ns"].to_numpy(dtype=np.int64)
    inside = launches[(launches["start_ns"] >= starts.min()) & (launches["start_ns"] < ends.max())]
    busy = iv.union(inside["start_ns"].to_numpy(), inside["end_ns"].to_numpy())
    per_step_ns = iv.overlap(busy, starts, ends)
    return {"calls": int(len(inside)), "calls_per_step": len(inside) / len(steps),
            "ms_per_step": float(per_step_ns.mean()) / NS_PER_MS}

"""Facts the finding rules read from a trace's steps and device rows (pure: frames in, dict out)."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from analysis import producers
from analysis.rules.devices import facts_for
from analysis.breakdown.input_stages import prefetches
from analysis.read.view import device_events, host_events, matches

# Host work that makes the host wait for the device, or for its output, inside a step.
HOST_SYNC_RE = producers.pattern("host_sync")
DEVICE_TO_HOST_RE = producers.pattern("device_to_host")
RETRACE_SHARE = 0.01  # compile time above 1 % of a later step counts as graph building in that step


def retracing(steps: pd.DataFrame) -> tuple[int, float]:
    """(steps after the first that built or compiled graphs, their compile ms)."""
    later = steps.iloc[1:]
    building = later[later["compile_ms"] > RETRACE_SHARE * later["step_ms"]]
    return int(len(building)), float(building["compile_ms"].sum())


def syncs_in_every_step(events: pd.DataFrame, steps: pd.DataFrame) -> str | None:
    """The name of a host-device synchronisation found in every step (None if some step has none)."""
    if len(steps) < 2:
        return None
    host = host_events(events)
    device = device_events(events)
    candidates = pd.concat([host[matches(host["name"], HOST_SYNC_RE, search=True)],
                            device[matches(device["name"], DEVICE_TO_HOST_RE, search=True)]])
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


def kernels(events: pd.DataFrame, steps: pd.DataFrame) -> tuple[float, float]:
    """(compute kernels per step, their mean duration in µs) on all devices, NaN without devices."""
    device = device_events(events)
    if device.empty or not len(steps):
        return math.nan, math.nan
    is_copy = matches(device["name"], producers.pattern("device_copy"), search=True) | matches(
        device["name"], producers.pattern("device_input"), search=True)
    compute = device[~is_copy]
    inside = compute[(compute["start_ns"] >= steps["start_ns"].min()) & (compute["start_ns"] < steps["end_ns"].max())]
    if inside.empty:
        return 0.0, math.nan
    return len(inside) / len(steps), float(inside["duration_ns"].mean()) / 1000.0


def idle_waiting_for_host_pct(devices: list[dict]) -> float:
    """Share of the busiest device's step spent idle for reasons other than input (launch, Python, sync)."""
    active = [d for d in devices if d["step_count"] > 0 and d["step_ms"] > 0]
    if not active:
        return math.nan
    busiest = max(active, key=lambda d: d["compute_ms"])
    return 100.0 * busiest["idle_host_ms"] / busiest["step_ms"]


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
        numbers = [float(c) for c in capabilities if _is_number(c)]
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


def collect(events: pd.DataFrame | None, steps: pd.DataFrame, devices: list[dict], device_info: dict) -> dict:
    """Everything the finding rules need that the breakdown itself does not carry."""
    facts = {"retrace_steps": 0, "retrace_ms": 0.0, "sync_name": None, "kernels_per_step": math.nan,
             "mean_kernel_us": math.nan, "idle_host_pct": math.nan, "prefetches": None,
             "matrix_units": matrix_unit_dtypes(device_info)}
    if events is None:
        return facts
    facts["retrace_steps"], facts["retrace_ms"] = retracing(steps)
    facts["sync_name"] = syncs_in_every_step(events, steps)
    facts["kernels_per_step"], facts["mean_kernel_us"] = kernels(events, steps)
    facts["idle_host_pct"] = idle_waiting_for_host_pct(devices)
    facts["prefetches"] = prefetches(events)
    return facts

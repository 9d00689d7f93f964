"""The run's utilization in a few numbers (the headline of `analyze` and `compare`), and the
samplers' time-weighted means over each step (per-step utilization)."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from analysis.read.run_files import DEVICE_UTILIZATION_COLUMNS, TIME_COLUMN, UTILIZATION_COLUMNS


def _stat(summary: dict | None, column: str, key: str) -> float:
    metrics = (summary or {}).get("metrics") if isinstance(summary, dict) else None
    value = ((metrics or {}).get(column) or {}).get(key) if isinstance(metrics, dict) else None
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def headline(summaries: dict) -> dict[str, float]:
    """The run's utilization in a few numbers (NaN when not measured).

    `cpu_util_*` is the whole machine (all cores, 0-100); `proc_cpu_*` the training
    process tree (100 = one core); `other_cpu_mean_pct` what other processes took, in %
    of the whole machine; device utilization is the mean over devices of each
    one's main metric (GPU-Util, TPU matrix units), its p95 the highest device's p95;
    memory peaks are the process RSS and the largest device's TensorFlow peak (else its
    used memory).
    """
    host = summaries.get("host")
    metrics = (host or {}).get("metrics") or {}
    cores = sum(1 for name in metrics if re.fullmatch(r"cpu\d+_pct", name))
    system, process = _stat(host, "cpu_pct", "mean"), _stat(host, "proc_cpu_pct", "mean")
    out = {
        "cpu_util_mean_pct": system,
        "cpu_util_p95_pct": _stat(host, "cpu_pct", "p95"),
        "proc_cpu_mean_pct": process,
        "cpu_cores": float(cores) if cores else math.nan,
        # what other processes took, in % of the whole machine (the mean of a difference is the difference of means)
        "other_cpu_mean_pct": max(0.0, system - process / cores) if cores else math.nan,
        "host_mem_peak_bytes": _stat(host, "proc_rss_bytes", "max"),
        "device_util_mean_pct": math.nan,
        "device_util_p95_pct": math.nan,
        "device_mem_peak_bytes": math.nan,
        "device_mem_total_bytes": math.nan,
    }
    means, p95s, memory, totals = [], [], [], []
    for name, summary in summaries.items():
        if name == "host":
            continue
        for column in DEVICE_UTILIZATION_COLUMNS:
            if not math.isnan(_stat(summary, column, "mean")):
                means.append(_stat(summary, column, "mean"))
                p95s.append(_stat(summary, column, "p95"))
                break
        for column in ("tf_mem_peak_bytes", "mem_used_bytes"):
            if not math.isnan(_stat(summary, column, "max")):
                memory.append(_stat(summary, column, "max"))
                totals.append(_stat(summary, "mem_total_bytes", "max"))
                break
    if means:
        out["device_util_mean_pct"] = float(np.mean(means))
        out["device_util_p95_pct"] = float(np.nanmax(p95s))
    if memory:
        fullest = int(np.argmax(memory))
        out["device_mem_peak_bytes"] = float(memory[fullest])
        out["device_mem_total_bytes"] = float(totals[fullest])
    return out


# Per-step columns: the host's CPU and memory under the names host.csv uses, and each kind of
# device sampler's main figures (several GPUs: the mean utilization, the largest memory).
STEP_HOST_COLUMNS = ("cpu_pct", "proc_cpu_pct", "proc_rss_bytes", "mem_used_bytes")
STEP_DEVICE_COLUMNS = {
    "gpu_util_pct": ("gpu_util_pct", "mean"),
    "gpu_mem_used_bytes": ("mem_used_bytes", "max"),
    "mxu_util_pct": ("mxu_util_pct", "mean"),
}


def window_means(frame: pd.DataFrame, column: str, starts_s: np.ndarray, ends_s: np.ndarray) -> np.ndarray:
    """Time-weighted mean of `column` in each window [start, end): each sample holds its value over
    the interval since the previous sample, as in the run summaries. A window shorter than the
    sampling period takes the sample whose interval holds it; NaN where no sample covers it."""
    times = frame[TIME_COLUMN].to_numpy(dtype=float)
    values = frame[column].to_numpy(dtype=float)
    keep = ~np.isnan(values) & ~np.isnan(times)
    times, values = times[keep], values[keep]
    if times.size < 2:
        return np.full(len(starts_s), np.nan)
    # Sample i covers (times[i-1], times[i]]; integrate the step function it draws.
    begins, ends = times[:-1], times[1:]
    held = values[1:]
    area = np.concatenate([[0.0], np.cumsum(held * (ends - begins))])

    def integral(at):
        at = np.clip(at, begins[0], ends[-1])
        index = np.clip(np.searchsorted(ends, at, side="left"), 0, ends.size - 1)
        return area[index] + held[index] * (at - begins[index])

    lo = np.clip(starts_s, begins[0], ends[-1])
    hi = np.clip(ends_s, begins[0], ends[-1])
    covered = hi - lo
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (integral(hi) - integral(lo)) / covered
    inside = np.clip(np.searchsorted(ends, lo, side="left"), 0, ends.size - 1)
    means = np.where(
        covered > 0, means, np.where((starts_s >= begins[0]) & (starts_s <= ends[-1]), held[inside], np.nan)
    )
    return means


def per_window(samplers: dict[str, pd.DataFrame], starts_s, ends_s) -> tuple[pd.DataFrame, float]:
    """(per-window utilization columns, the sampling period in ms: the resolution of those figures)."""
    starts_s, ends_s = np.asarray(starts_s, dtype=float), np.asarray(ends_s, dtype=float)
    out = pd.DataFrame(index=range(len(starts_s)))
    periods = []
    for name, frame in samplers.items():
        if TIME_COLUMN not in frame or len(frame) < 2:
            continue
        periods.append(float(np.median(np.diff(frame[TIME_COLUMN].to_numpy(dtype=float)))) * 1000.0)
        if name == "host":
            for column in STEP_HOST_COLUMNS:
                if column in frame:
                    out[column] = window_means(frame, column, starts_s, ends_s)
    for target, (column, combine) in STEP_DEVICE_COLUMNS.items():
        per_device = [
            window_means(frame, column, starts_s, ends_s)
            for name, frame in samplers.items()
            if name != "host" and column in frame and TIME_COLUMN in frame and len(frame) >= 2
        ]
        if per_device:
            stacked = np.vstack(per_device)
            with np.errstate(all="ignore"):
                out[target] = np.nanmean(stacked, axis=0) if combine == "mean" else np.nanmax(stacked, axis=0)
    return out, (float(np.median(periods)) if periods else math.nan)


def trace_clock_offset_s(steps: pd.DataFrame, table: pd.DataFrame) -> float | None:
    """The samplers' wall clock minus the trace's clock, in s: the mean gap between the starts of the
    steps both the trace (`steps`) and steps.csv (`table`, indexed by step) hold; None where none is in both."""
    if "start_ns" not in steps:
        return None
    common = steps["step"].isin(table.index)
    if not common.any():
        return None
    return float(
        (
            table.loc[steps.loc[common, "step"], "start_time_s"].to_numpy()
            - steps.loc[common, "start_ns"].to_numpy() / 1e9
        ).mean()
    )


def steps_with_utilization(
    steps: pd.DataFrame, steps_table: pd.DataFrame | None, samplers: dict[str, pd.DataFrame], from_csv: bool
) -> tuple[pd.DataFrame, str | None]:
    """(the steps with the samplers' time-weighted means over each step, a note on their resolution).
    A trace's clock is put on the samplers' wall clock by the steps both it and steps.csv hold."""
    if not samplers or steps_table is None:
        return steps, None
    table = steps_table.drop_duplicates("step").set_index("step")
    if from_csv:
        starts_s = steps_table["start_time_s"].to_numpy(dtype=float)
    else:
        offset = trace_clock_offset_s(steps, table)
        if offset is None:
            return steps, None
        starts_s = steps["start_ns"].to_numpy(dtype=float) / 1e9 + offset
    if len(starts_s) != len(steps):
        return steps, None
    ends_s = starts_s + steps["step_ms"].to_numpy(dtype=float) / 1000.0
    columns, resolution_ms = per_window(samplers, starts_s, ends_s)
    if columns.empty or not len(columns.columns):
        return steps, None
    steps = pd.concat([steps.reset_index(drop=True), columns.reset_index(drop=True)], axis=1)
    if not len(steps) or resolution_ms != resolution_ms:
        return steps, None
    shorter = float(steps["step_ms"].median()) < resolution_ms
    return steps, (
        f"utilization per step from samples every {resolution_ms:.0f} ms"
        + (": steps are shorter, so each takes the sample around it" if shorter else "")
    )


def evidence(summaries: dict) -> dict[str, float]:
    """`{"mean host cpu": 42.0, ...}`: each sampler's main utilization, time-weighted as in compare,
    and the training process's own share of the machine beside the machine's."""
    found = {}
    machine = headline(summaries)
    if machine["cpu_cores"] == machine["cpu_cores"] and machine["proc_cpu_mean_pct"] == machine["proc_cpu_mean_pct"]:
        found["training process cpu (of all cores)"] = machine["proc_cpu_mean_pct"] / machine["cpu_cores"]
    for name, summary in summaries.items():
        metrics = summary.get("metrics") or {}
        for column in UTILIZATION_COLUMNS:
            mean = (metrics.get(column) or {}).get("mean")
            if mean is not None and not math.isnan(mean):
                found[f"mean {name} {column.removesuffix('_pct').replace('_', ' ')}"] = float(mean)
                break
    return found

"""Summaries of sampler CSVs: time-weighted mean, p50, p95 and max per metric, per run and per epoch.

The samplers write these into run.json when a run ends; `analyze` and `compare` compute
them again from the CSVs with the same functions, so every command prints the same CPU %
for the same run.

A sample describes the interval since the previous sample: that is how CPU %, GPU
utilization and the I/O rates are measured (for gauges such as memory it makes a
difference of one interval). Each sample weighs the time since the previous one, which
keeps a stretch of slow or skipped ticks from counting less than it lasted. The first
sample has no previous one and weighs nothing (it still counts for the max), and in an
epoch window each sample weighs only the part of its interval inside the window,
including the first sample after the window's end.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from analysis.read.run_files import (
    DEVICE_UTILIZATION_COLUMNS,
    TIME_COLUMN,
    RunFileError,
    read_utilization,
    section,
)

STATS = ("mean", "p50", "p95", "max")


def hold_weights(times: pd.Series | np.ndarray, start_s: float = -math.inf, end_s: float = math.inf) -> np.ndarray:
    """Seconds of each sample's interval (since the previous sample) inside ``[start_s, end_s)``."""
    t = np.asarray(times, dtype=float)
    if t.size == 0:
        return t
    covers_from = np.insert(t[:-1], 0, t[0])
    return np.clip(np.minimum(t, end_s) - np.maximum(covers_from, start_s), 0.0, None)


def weighted_stats(values: Iterable[float], weights: Iterable[float]) -> dict[str, float | None]:
    """Time-weighted mean, p50 and p95, and the max of all samples given; None when empty.

    Percentiles are the smallest value whose cumulative weight reaches the fraction. When
    every weight is zero (a single sample) the samples count equally.
    """
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    keep = ~np.isnan(v) & (w >= 0)
    v, w = v[keep], w[keep]
    if v.size == 0:
        return dict.fromkeys(STATS)
    peak = float(v.max())
    if w.sum() > 0:
        v, w = v[w > 0], w[w > 0]
    else:
        w = np.ones_like(v)
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cumulative = np.cumsum(w) / w.sum()

    def quantile(q: float) -> float:
        index = int(np.searchsorted(cumulative, q - 1e-12, side="left"))
        return float(v[min(index, v.size - 1)])

    return {
        "mean": float(np.average(v, weights=w)),
        "p50": quantile(0.50),
        "p95": quantile(0.95),
        "max": peak,
    }


def _window_summary(frame: pd.DataFrame, metrics: list[str], start_s: float, end_s: float) -> dict:
    times = frame[TIME_COLUMN].to_numpy(dtype=float) if len(frame) else np.array([])
    weights = hold_weights(times, start_s, end_s)
    in_window = (times >= start_s) & (times < end_s)
    return {
        "samples": int(in_window.sum()),
        "seconds": float(weights.sum()) if weights.size else 0.0,
        "metrics": {m: _stats_in_window(frame[m], weights, in_window) for m in metrics},
    }


def _stats_in_window(values: pd.Series, weights: np.ndarray, in_window: np.ndarray) -> dict:
    v = values.to_numpy(dtype=float)
    take = (weights > 0) | in_window
    return weighted_stats(v[take], weights[take])


def summarize(frame: pd.DataFrame, epochs: list[tuple] | None = None) -> dict:
    """Per-metric time-weighted ``mean``, ``p50``, ``p95`` and ``max``, for the run and each epoch.

    `frame` has `time_s` and one column per metric (`read_sampler_csv`); `epochs` is a list
    of ``(epoch, start_s, end_s)`` windows on the same clock. Returns JSON-ready
    ``{"samples", "seconds", "metrics": {metric: {stat: value}}, "epochs": [{"epoch",
    "start_s", "end_s", "samples", "seconds", "metrics"}]}``; a metric never measured in a
    window has None stats.
    """
    if TIME_COLUMN not in frame:
        if len(frame.columns):
            raise ValueError(f"sampler frame needs a {TIME_COLUMN!r} column, got {list(frame.columns)}")
        frame = pd.DataFrame({TIME_COLUMN: []})
    frame = frame.sort_values(TIME_COLUMN, kind="stable").reset_index(drop=True)
    metrics = [c for c in frame.columns if c != TIME_COLUMN]
    result = _window_summary(frame, metrics, -math.inf, math.inf)
    result["epochs"] = []
    for epoch, start_s, end_s in epochs or []:
        if end_s < start_s:
            raise ValueError(f"epoch {epoch} ends before it starts ({start_s} > {end_s})")
        window = _window_summary(frame, metrics, float(start_s), float(end_s))
        result["epochs"].append({"epoch": epoch, "start_s": float(start_s), "end_s": float(end_s), **window})
    return result


def summary_table(summary: dict) -> pd.DataFrame:
    """The run-level part of `summarize` as a frame: one row per metric, one column per stat."""
    rows = {metric: stats for metric, stats in summary.get("metrics", {}).items()}
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(STATS)).astype(float)


def run_summaries(run_dir: str | Path, meta: dict | None = None) -> dict:
    """`{sampler: summarize(...)}` for a run: from its CSVs, else from run.json's `samplers.summaries`
    (a run copied without its utilization folder)."""
    try:
        frames = read_utilization(run_dir)
    except RunFileError:
        frames = {}
    if frames:
        return {name: summarize(frame) for name, frame in frames.items()}
    summaries = section(section(meta or {}, "samplers"), "summaries")
    return {name: value for name, value in summaries.items() if isinstance(value, dict)}


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
STEP_DEVICE_COLUMNS = {"gpu_util_pct": ("gpu_util_pct", "mean"), "gpu_mem_used_bytes": ("mem_used_bytes", "max"),
                       "mxu_util_pct": ("mxu_util_pct", "mean")}


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
    means = np.where(covered > 0, means, np.where((starts_s >= begins[0]) & (starts_s <= ends[-1]), held[inside],
                                                  np.nan))
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
        per_device = [window_means(frame, column, starts_s, ends_s) for name, frame in samplers.items()
                      if name != "host" and column in frame and TIME_COLUMN in frame and len(frame) >= 2]
        if per_device:
            stacked = np.vstack(per_device)
            with np.errstate(all="ignore"):
                out[target] = np.nanmean(stacked, axis=0) if combine == "mean" else np.nanmax(stacked, axis=0)
    return out, (float(np.median(periods)) if periods else math.nan)
